"""Figures of the Concepts tab: a feature's activation over the image's patches, and its top patches from the folder."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image

from dashboard.figures.base import colorize, map_to_pixels, tint

GAP_PX = 4


def feature_map_image(crop: np.ndarray, activation: np.ndarray, patch_size: tuple[int, int], side: int) -> np.ndarray:
    """The crop (H, W, 3) tinted by a feature's activation per patch (gh, gw), from 0 (no tint's low end) to the
    image's largest activation of that feature, `side` pixels wide: uint8 (side * H / W, side, 3)."""
    top = float(activation.max()) if activation.size and activation.max() > 0 else 1.0
    colours = map_to_pixels(colorize(activation, vmin=0.0, vmax=top), patch_size)  # (H, W, 3)
    tinted = tint(crop.astype(np.float32), colours)
    height = max(1, round(side * crop.shape[0] / crop.shape[1]))
    return np.asarray(Image.fromarray(tinted).resize((side, height), Image.Resampling.NEAREST))


def crops_row_image(crops: Sequence[np.ndarray], gap: int = GAP_PX) -> np.ndarray:
    """Crops of one size (s, s, 3) side by side on white, `gap` pixels apart: uint8 (s, n s + (n - 1) gap, 3)."""
    if not crops:
        return np.full((8, 8, 3), 255, dtype=np.uint8)
    side = crops[0].shape[0]
    row = np.full((side, len(crops) * (side + gap) - gap, 3), 255, dtype=np.uint8)
    for i, crop in enumerate(crops):
        row[:, i * (side + gap):i * (side + gap) + side] = crop
    return row
