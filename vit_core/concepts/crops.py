"""The top patches of a feature as pictures: a crop around each patch (the crop the model saw, the patch outlined),
and the contact sheet of the strongest features (one row each) that `vit-lens concepts` writes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageDraw

from ..errors import ImageError
from ..images import MAX_FILE_BYTES, load_image
from ..images.files import read_input
from ..loading.model import LoadedModel

CROP_PX = 64  # each crop's side in the sheet and the tab
MARGIN_PATCHES = 1  # patches of context on each side of the top patch
SHEET_FEATURES = 16
SHEET_CROPS = 8


def model_crop(loaded: LoadedModel, path: str | Path) -> np.ndarray:
    """The crop the model sees of the image file at `path`: uint8 (H, W, 3). Raises ImageError."""
    return image_crop(loaded, load_image(read_input(path, MAX_FILE_BYTES), loaded.decode_min_side))


def image_crop(loaded: LoadedModel, image: Image.Image) -> np.ndarray:
    """The crop the model sees of a decoded image: uint8 (H, W, 3)."""
    return np.asarray(loaded.crop_transform(image), dtype=np.uint8)


def patch_crop(crop: np.ndarray, patch_size: tuple[int, int], row: int, col: int, margin: int = MARGIN_PATCHES,
               side: int = CROP_PX) -> np.ndarray:
    """The patch (row, col) of `crop` (H, W, 3) with `margin` patches around it (white beyond the crop's edges, so
    every crop shows the same scale), the patch outlined in yellow, resized to side x side: uint8 (side, side, 3)."""
    (ph, pw) = patch_size
    padded = np.pad(crop, ((margin * ph, margin * ph), (margin * pw, margin * pw), (0, 0)), constant_values=255)
    window = padded[row * ph:(row + 1 + 2 * margin) * ph, col * pw:(col + 1 + 2 * margin) * pw]  # patch (row, col) centred
    im = Image.fromarray(window).resize((side, side), Image.Resampling.NEAREST)
    scale = side / window.shape[0]
    box = [round(margin * pw * scale), round(margin * ph * scale), round((margin + 1) * pw * scale) - 1,
           round((margin + 1) * ph * scale) - 1]
    ImageDraw.Draw(im).rectangle(box, outline=(255, 220, 0), width=2)
    return np.asarray(im)


def top_crops(loaded: LoadedModel, folder: str | Path | None, top: Sequence[dict[str, Any]], count: int,
              cache: dict[str, np.ndarray | None] | None = None) -> list[tuple[np.ndarray, float]]:
    """The first `count` of a feature's top activations ({file, row, col, activation}) as (crop, activation) from the
    images under `folder`; files that are gone, unreadable or outside `folder` (folders.image_path) are left out.
    `cache`: file -> model crop, shared between features."""
    from .folders import image_path

    cache = {} if cache is None else cache
    crops = []
    for entry in top:
        if len(crops) == count:
            break
        name = entry["file"]
        if name not in cache:
            path = image_path(Path(folder) if folder else None, name)
            try:
                cache[name] = model_crop(loaded, path) if path is not None else None
            except (ImageError, OSError):
                cache[name] = None
        if cache[name] is not None:
            crops.append((patch_crop(cache[name], loaded.geometry.patch_size, entry["row"], entry["col"]),
                          float(entry["activation"])))
    return crops


def contact_sheet_png(rows: Sequence[tuple[int, Sequence[np.ndarray]]], side: int = CROP_PX) -> bytes:
    """One row per feature: its number, then its crops (uint8 (side, side, 3) each) left to right. PNG bytes."""
    label_px, gap = 64, 4
    columns = max((len(crops) for _, crops in rows), default=1)
    width = label_px + columns * (side + gap)
    sheet = Image.new("RGB", (width, max(1, len(rows)) * (side + gap) + gap), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for r, (feature, crops) in enumerate(rows):
        y = gap + r * (side + gap)
        draw.text((4, y + side // 2 - 6), f"#{feature}", fill=(0, 0, 0))
        for c, crop in enumerate(crops):
            sheet.paste(Image.fromarray(crop), (label_px + c * (side + gap), y))
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG")
    return buffer.getvalue()
