"""Figures of the Attention tab: every head's map of one layer in one sheet. (The overlays are
`base.overlay`, the rollout map `base.map_png`, the distance figure `vit_core.plots`.)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from dashboard.figures.base import colorize_each, mosaic, tint


def head_maps_mosaic(crop: np.ndarray, maps: np.ndarray, patch_size: tuple[int, int], titles: Sequence[str],
                     query_patch: int | None = None, grid: tuple[int, int] | None = None, cols: int | None = None,
                     tile_side: int = 160) -> np.ndarray:
    """Each map (n, gh, gw) overlaid on the crop, in one sheet (one PNG, not n charts).

    Each tile is min-max scaled on its own (display only); the query patch gets a cyan frame.
    """
    n = maps.shape[0]
    cols = cols or min(n, 6)
    height, width = crop.shape[:2]
    ph, pw = patch_size
    side = (tile_side, round(tile_side * height / width))  # (width, height) of a tile
    factor = side[0] / width
    # Work at tile size: shrink the crop once, and look up each tile pixel's patch, instead of
    # overlaying every map at full size and shrinking n images (same picture, a third of the time).
    resample = Image.Resampling.BILINEAR if factor < 1 else Image.Resampling.NEAREST
    base = np.asarray(Image.fromarray(crop).resize(side, resample), dtype=np.float32)  # (th, tw, 3)
    patch_row = ((np.arange(side[1]) + 0.5) / factor // ph).astype(int)  # (th,) patch row of each tile row
    patch_col = ((np.arange(side[0]) + 0.5) / factor // pw).astype(int)  # (tw,)
    # every map coloured in one pass, spread to tile pixels by whole rows and columns, tinted at once
    colours = colorize_each(maps).take(patch_row, axis=1).take(patch_col, axis=2)  # (n, gh, gw, 3) -> (n, th, tw, 3)
    tiles = list(tint(base, colours))  # n x (th, tw, 3)
    if query_patch is not None and grid is not None:
        r, c = divmod(query_patch, grid[1])
        frame = [c * pw * factor, r * ph * factor, (c + 1) * pw * factor - 1, (r + 1) * ph * factor - 1]
        for i, tile in enumerate(tiles):
            im = Image.fromarray(tile)
            ImageDraw.Draw(im).rectangle(frame, outline=(0, 255, 255), width=2)
            tiles[i] = np.asarray(im)
    return mosaic(tiles, titles, cols)
