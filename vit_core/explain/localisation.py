"""Ground truth: does a relevance map point at the object? (docs/spec/analyses.md, "Localisation against a mask")

A binary mask of the object, the size of the image, goes through the model's own resize and crop; a patch is in
the object when at least half of its pixels are. Three metrics compare a map (gh, gw) with those object patches
(the pointing game, relevance mass and relevance rank accuracy, as Quantus defines them for pixels), each beside
its value for a uniformly random map. The metrics are pure functions of arrays, each tested against loops.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
from PIL import Image

from ..errors import ImageError
from ..images import load_image
from ..loading.model import LoadedModel
from .perturbation import patch_order

LOCALISATION_METRICS = ("pointing_game", "relevance_mass", "relevance_rank")
GREY = (32, 223)  # a mask pixel in this range (inclusive) is neither black nor white
MAX_GREY_SHARE = 0.01  # a mask may have this share of grey pixels (anti-aliased or JPEG edges), no more
JPEG_REDUCTIONS = (2, 4, 8)  # a large JPEG may be decoded at 1/r of its size (images.draft_size): its mask is reduced alike
RANDOM_MAPS = 1000  # seeded uniform random maps for the spread of the random map's relevance mass


class MaskError(ImageError):
    """A mask that can't be used: not black and white, not the image's size, or no patch of the crop in the object."""


# ----------------------------------------------------------------------------------------------
# The mask, through the model's resize and crop


def binary_mask(gray: np.ndarray) -> np.ndarray:
    """The object (True) of a grey-level mask (H, W) uint8: pixels >= 128. Raises MaskError when more than
    MAX_GREY_SHARE of the pixels are grey (GREY: neither clearly black nor clearly white)."""
    gray = np.asarray(gray)
    grey = (gray >= GREY[0]) & (gray <= GREY[1])
    share = float(grey.mean()) if gray.size else 0.0
    if share > MAX_GREY_SHARE:
        raise MaskError(f"{share:.0%} of the mask's pixels are grey: a mask is black (0) where the object is not "
                        "and white (255) where it is.")
    return gray >= 128


def mask_from_file(source: str | Path | bytes) -> np.ndarray:
    """The object mask (H, W) bool of an image file: decoded at full size as images are (EXIF orientation applied,
    transparency on white), in grey levels (Pillow's "L"), then `binary_mask`. Raises ImageError (MaskError for a
    mask that is not black and white)."""
    return binary_mask(np.asarray(load_image(source, min_side=0).convert("L")))


def mask_image(mask: np.ndarray, image_size: tuple[int, int]) -> Image.Image:
    """The mask (H, W) bool as an "L" image of 0 / 255 the size of the picture the model was given, `image_size`
    (width, height). The mask must have the picture's size, or be reducible to it as a large JPEG is decoded
    (width and height both ceil(side / r), r in JPEG_REDUCTIONS: then reduced by Pillow's box filter); else MaskError."""
    mask = np.asarray(mask, dtype=bool)
    height, width = mask.shape
    picture = Image.fromarray(mask.astype(np.uint8) * 255, mode="L")
    if (width, height) == tuple(image_size):
        return picture
    if any(tuple(image_size) == (math.ceil(width / r), math.ceil(height / r)) for r in JPEG_REDUCTIONS):
        return picture.resize(tuple(image_size), Image.Resampling.BOX)
    raise MaskError(f"The mask is {width} x {height} pixels but the image is {image_size[0]} x {image_size[1]}: "
                    "a mask must have its image's size.")


def crop_mask(loaded: LoadedModel, mask: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """The mask through the model's own resize and crop (`loaded.crop_transform`, as the image): the "L" image of
    0 / 255 (`mask_image`) resized and cropped, then >= 128. -> (H, W) bool at the model's input size."""
    return np.asarray(loaded.crop_transform(mask_image(mask, image_size))) >= 128


def patch_fraction(crop: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """The share of each patch's pixels that are in the object: (gh*ph, gw*pw) bool -> (gh, gw) float64."""
    ph, pw = patch_size
    gh, gw = crop.shape[0] // ph, crop.shape[1] // pw
    return crop[:gh * ph, :gw * pw].reshape(gh, ph, gw, pw).mean(axis=(1, 3), dtype=np.float64)


def object_patches(loaded: LoadedModel, mask: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """The object patches (gh, gw) bool: at least half of the patch's pixels in the object after the model's resize
    and crop (`crop_mask`). `image_size`: (width, height) of the picture given to the model. Raises MaskError when
    no patch is in the object (an object outside the crop, or smaller than half a patch)."""
    objects = patch_fraction(crop_mask(loaded, mask, image_size), loaded.geometry.patch_size) >= 0.5
    if not objects.any():
        raise MaskError("No patch of the model's crop is in the mask's object: it lies outside the crop, or covers "
                        "less than half of every patch.")
    return objects


# ----------------------------------------------------------------------------------------------
# The metrics (pure)


def _checked(relevance: np.ndarray, objects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both flattened: (N,) float64 and (N,) bool. Raises ValueError for other shapes or an empty object."""
    relevance, objects = np.asarray(relevance), np.asarray(objects, dtype=bool)
    if relevance.shape != objects.shape:
        raise ValueError(f"a map {relevance.shape} and object patches {objects.shape} of different shapes")
    if not objects.any():
        raise ValueError("no object patch: the localisation metrics are undefined for an empty object")
    return relevance.reshape(-1).astype(np.float64), objects.reshape(-1)


def pointing_game(relevance: np.ndarray, objects: np.ndarray) -> float:
    """1.0 when the map's highest patch (the first in row-major order on ties) is an object patch, else 0.0."""
    r, o = _checked(relevance, objects)
    return float(o[int(np.argmax(r))])


def relevance_mass(relevance: np.ndarray, objects: np.ndarray) -> float:
    """The share of the map's positive relevance on object patches: sum of max(R, 0) over the object / over all
    patches; 0.0 for a map without a positive value."""
    r, o = _checked(relevance, objects)
    positive = np.maximum(r, 0.0)
    total = positive.sum()
    return float(positive[o].sum() / total) if total > 0 else 0.0


def relevance_rank(relevance: np.ndarray, objects: np.ndarray) -> float:
    """The share of object patches among the map's top K patches, K = the number of object patches; the order is
    `patch_order`'s (relevance descending, ties by index ascending)."""
    r, o = _checked(relevance, objects)
    k = int(o.sum())
    return float(o[patch_order(r)[:k]].mean())


METRICS = {"pointing_game": pointing_game, "relevance_mass": relevance_mass, "relevance_rank": relevance_rank}


def localisation(maps: Mapping[str, np.ndarray], objects: np.ndarray) -> dict[str, dict[str, float]]:
    """Every metric of every map: method -> {"pointing_game", "relevance_mass", "relevance_rank"} -> value."""
    return {m: {name: METRICS[name](relevance, objects) for name in LOCALISATION_METRICS} for m, relevance in maps.items()}


def random_localisation(objects: np.ndarray, samples: int = RANDOM_MAPS, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Each metric of a uniformly random map (independent uniform values on [0, 1): every order equally likely, no
    ties) as (mean, standard deviation). With q = |O| / N, K = |O|: the mean of all three is q exactly (by symmetry);
    the pointing game's std is sqrt(q (1 - q)) (a hit with probability q); rank accuracy's is the hypergeometric
    sqrt(q (1 - q) (N - K) / ((N - 1) K)); relevance mass's is the std (ddof 1) over `samples` seeded maps."""
    o = np.asarray(objects, dtype=bool).reshape(-1)
    n, k = o.size, int(o.sum())
    if k == 0:
        raise ValueError("no object patch: the localisation metrics are undefined for an empty object")
    q = k / n
    rank_std = math.sqrt(q * (1 - q) * (n - k) / ((n - 1) * k)) if n > 1 else 0.0
    values = np.random.default_rng(seed).random((samples, n))  # (M, N)
    masses = values[:, o].sum(axis=1) / values.sum(axis=1)  # (M,)
    mass_std = float(masses.std(ddof=1)) if samples > 1 else math.nan
    return {"pointing_game": (q, math.sqrt(q * (1 - q))), "relevance_mass": (q, mass_std), "relevance_rank": (q, rank_std)}
