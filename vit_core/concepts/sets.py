"""A set of images through the concepts (the Many images page): the features that fire most over the set's patch
tokens with their top patches in the set, the set's reconstruction error, and "remove this concept" over the set.
Definitions: docs/spec/analyses.md, "Concepts" ("A set of images"). Shapes: n images, N patches, D width, F features,
K features shown, m top patches, C classes.

    tokens = set_tokens(loaded, images, concepts.layer)      # forwards of blocks 0..L only
    seen = set_concepts(concepts, tokens)
    plain, removed = set_logits_with_concept_removed(loaded, images, concepts, int(seen.strongest[0]))
    agreement, kl = removal_agreement(plain, removed)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from ..explain.passes import batch_boundary, model_input
from ..loading.model import LoadedModel
from .collect import check_layer, patch_tokens
from .sae import Concepts, ConceptsError
from .splice import concept_removed, spliced_logits

SET_FEATURES = 6  # the Many images page's strongest features of a set
SET_CROPS = 8  # top patches in the set shown per feature

Progress = Callable[[int, int], None]  # (images done, images in all)


@dataclass(frozen=True)
class SetConcepts:
    """What the concepts see over a set of n images (n N patch tokens)."""

    strongest: np.ndarray  # int64 (K,): the features of largest mean activation over the set's tokens, largest first
    mean_activation: np.ndarray  # float64 (F,): mean z_f over all n N patch tokens of the set (0 where it is silent)
    firing_rate: np.ndarray  # float64 (F,): share of the set's patch tokens with z_f > 0
    top_activation: np.ndarray  # float32 (K, m): each shown feature's m largest z_f in the set, largest first (> 0 only:
    #                             a feature that fires on fewer tokens has its remaining entries 0)
    top_image: np.ndarray  # int64 (K, m): their images (index into the set)
    top_patch: np.ndarray  # int64 (K, m): their patches (row-major index into the grid)
    error: float  # the set's FVU: sum ||x - x^||^2 / sum ||x - mean_set x||^2 over its n N patch tokens


def set_tokens(loaded: LoadedModel, images: Sequence[Image.Image], layer: int,
               progress: Progress | None = None) -> np.ndarray:
    """The patch tokens after block `layer` of each image: float32 (n, N, D), forwards of blocks 0..layer only (one
    image's forward as `collect` runs it: the same bits as `vit-lens concepts` collects). Calls the `between_batches`
    hook (explain.passes) before each image."""
    check_layer(loaded, layer)
    g = loaded.geometry
    tokens = np.empty((len(images), g.num_patches, g.embed_dim), dtype=np.float32)  # (n, N, D)
    for i, image in enumerate(images):
        batch_boundary()
        tokens[i] = patch_tokens(loaded, model_input(loaded, image), layer)[0]  # (1, N, D) -> (N, D)
        if progress:
            progress(i + 1, len(images))
    return tokens


def set_concepts(concepts: Concepts, tokens: np.ndarray, count: int = SET_FEATURES, top: int = SET_CROPS) -> SetConcepts:
    """The set's `count` strongest features (by their mean activation over every patch token of the set; > 0 only,
    ties by index) with each one's `top` largest activations in the set (ties by token order: image, then patch),
    and the set's reconstruction error. `tokens`: float32 (n, N, D). Encoded one image at a time: only each token's
    k active features are kept, never the (n N, F) codes."""
    n, num_patches, d = tokens.shape
    if concepts.sae.d_model != d:
        raise ConceptsError(f"These concepts were learned for width {concepts.sae.d_model}, not this model's {d}.")
    if n == 0:
        raise ConceptsError("The set has no image.")
    num_features, k = concepts.sae.num_features, concepts.sae.k
    total = np.zeros(num_features, dtype=np.float64)  # (F,): sum of z_f
    fired = np.zeros(num_features, dtype=np.int64)  # (F,): tokens with z_f > 0
    values = np.zeros((n, num_patches, k), dtype=np.float32)  # each token's k largest z (some may be 0)
    indices = np.zeros((n, num_patches, k), dtype=np.int64)  # and their features
    squared_error, sums, squares = 0.0, np.zeros(d, dtype=np.float64), 0.0
    for i in range(n):
        z = concepts.codes(tokens[i])  # (N, F)
        total += z.sum(dim=0).double().numpy()
        fired += (z > 0).sum(dim=0).numpy()
        v, f = z.topk(k, dim=-1)  # (N, k), (N, k): every non-zero entry of z
        values[i], indices[i] = v.numpy(), f.numpy()
        x = tokens[i].astype(np.float64)  # (N, D)
        squared_error += float(((x - concepts.reconstruction(z).numpy().astype(np.float64)) ** 2).sum())
        sums += x.sum(axis=0)
        squares += float((x ** 2).sum())
    count_tokens = n * num_patches
    spread = squares - float((sums ** 2).sum()) / count_tokens  # sum ||x - mean_set x||^2
    mean_activation = total / count_tokens
    order = np.lexsort((np.arange(num_features), -mean_activation))  # largest first, ties by index
    strongest = np.array([f for f in order[:count] if mean_activation[f] > 0], dtype=np.int64)
    top = min(top, count_tokens)
    top_activation = np.zeros((len(strongest), top), dtype=np.float32)
    top_row = np.zeros((len(strongest), top), dtype=np.int64)
    flat_values, flat_indices = values.reshape(count_tokens, k), indices.reshape(count_tokens, k)  # (n N, k)
    for j, f in enumerate(strongest.tolist()):
        activation = (flat_values * (flat_indices == f)).sum(axis=1)  # (n N,): z_f of each token
        rows = np.lexsort((np.arange(count_tokens), -activation))[:top]
        top_activation[j], top_row[j] = activation[rows], rows
    return SetConcepts(strongest, mean_activation, fired / count_tokens, top_activation, top_row // num_patches,
                       top_row % num_patches, squared_error / spread if spread > 0 else float("nan"))


def set_logits_with_concept_removed(loaded: LoadedModel, images: Sequence[Image.Image], concepts: Concepts, feature: int,
                                    progress: Progress | None = None, plain: np.ndarray | None = None
                                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each image's logits from the plain model and with feature `feature`'s share of the reconstruction subtracted at
    the concepts' layer (as `logits_with_concept_removed`, one image per forward): float32 (n, C) twice. `plain`: the
    plain logits (n, C) of an earlier call on the same images, returned as they are (one forward per image instead of
    two). Calls the `between_batches` hook (explain.passes) before each image."""
    if not 0 <= feature < concepts.sae.num_features:
        raise ConceptsError(f"There is no feature {feature}: these concepts have {concepts.sae.num_features}.")
    assert plain is None or len(plain) == len(images)
    replace = concept_removed(concepts, feature)
    plains, removed = [], []
    for i, image in enumerate(images):
        batch_boundary()
        x = model_input(loaded, image)  # (1, 3, H, W)
        if plain is None:
            plains.append(spliced_logits(loaded, x, concepts.layer, None)[0])  # (C,)
        removed.append(spliced_logits(loaded, x, concepts.layer, replace)[0])
        if progress:
            progress(i + 1, len(images))
    removed_logits = torch.stack(removed).numpy()  # n x (C,) -> (n, C)
    return (torch.stack(plains).numpy() if plain is None else plain), removed_logits


def removal_agreement(plain: np.ndarray, removed: np.ndarray) -> tuple[float, float]:
    """Over the set: the share of images whose top-1 class is unchanged, and the mean KL(p || p_removed) in nats, from
    the plain and the removed logits (n, C) each."""
    p_log = torch.from_numpy(np.asarray(plain, dtype=np.float64)).log_softmax(-1)  # (n, C)
    q_log = torch.from_numpy(np.asarray(removed, dtype=np.float64)).log_softmax(-1)
    agree = (p_log.argmax(-1) == q_log.argmax(-1)).double().mean()
    kl = (p_log.exp() * (p_log - q_log)).sum(-1).mean()  # (n,) -> ()
    return float(agree), float(kl)
