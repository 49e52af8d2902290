"""Figures of the Filters and Positions tabs: the patch-embedding filters and the position-embedding similarity."""

from __future__ import annotations

from typing import Sequence

import matplotlib
import matplotlib.patches
import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from dashboard.figures.base import (
    DPI,
    SIMILARITY_CMAP,
    TEXT_PT,
    TEXT_PX,
    TITLE_PT,
    TITLE_PX,
    enlarge,
    figure_png,
    font,
    mosaic,
    png_bytes,
)
from vit_core import analyses


def filters_grid_png(images: np.ndarray, titles: Sequence[str], cols: int, title: str, tile_side: int = 64) -> bytes:
    """(k, ph, pw, 3) filter images, min-max scaled each on its own for display, in one sheet; tiles about
    `tile_side` pixels (a whole number of pixels per filter pixel, at least 1)."""
    scaled = analyses.minmax_scale(images, axis=(1, 2, 3))  # (k, ph, pw, 3) in [0, 1]
    s = max(1, tile_side // images.shape[2])
    tiles = [enlarge((im * 255).round().astype(np.uint8), s) for im in scaled]
    sheet = mosaic(tiles, titles, cols)
    head = Image.new("RGB", (sheet.shape[1], TITLE_PX + 10), (255, 255, 255))
    ImageDraw.Draw(head).text((6, 4), title, fill=(0, 0, 0), font=font(TITLE_PX))
    return png_bytes(np.concatenate([np.asarray(head), sheet], axis=0), text_px=TEXT_PX)


def explained_variance_png(ratio: np.ndarray, width_px: int = 360, height_px: int = 250) -> bytes:
    fig = Figure(figsize=(width_px / DPI, height_px / DPI))
    ax = fig.add_subplot()
    k = np.arange(1, len(ratio) + 1)
    ax.bar(k, ratio * 100, color="#4c72b0")
    ax.plot(k, np.cumsum(ratio) * 100, "o-", ms=3, color="#dd8452", label="cumulative")
    ax.set_xlabel("principal component", fontsize=TEXT_PT)
    ax.set_ylabel("% of variance", fontsize=TEXT_PT)
    ax.legend(fontsize=TEXT_PT, loc="lower right", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.1, frameon=False)  # off the bars
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=TEXT_PT)
    return figure_png(fig, width_px=width_px)


def similarity_tiles_png(similarity: np.ndarray, grid: tuple[int, int], highlight: int | None = None,
                         title: str = "", side_px: int = 500) -> bytes:
    """The paper's Fig. 7 (center): tile (r, c) is patch (r, c)'s cosine similarity map, (N, gh, gw); about
    `side_px` pixels wide.

    Drawn as one image (tiles separated by a blank line) so even 28 x 28 tiles stay one cheap PNG.
    """
    gh, gw = grid
    sheet = np.full((gh * (gh + 1), gw * (gw + 1)), np.nan, dtype=np.float32)
    for k in range(gh * gw):
        r, c = divmod(k, gw)
        sheet[r * (gh + 1):r * (gh + 1) + gh, c * (gw + 1):c * (gw + 1) + gw] = similarity[k]
    side = side_px / DPI
    fig = Figure(figsize=(side, side * gh / gw * 0.92))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps[SIMILARITY_CMAP].with_extremes(bad="white")
    im = ax.imshow(sheet, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    if highlight is not None:
        r, c = divmod(highlight, gw)
        ax.add_patch(matplotlib.patches.Rectangle((c * (gw + 1) - 0.8, r * (gh + 1) - 0.8), gw + 0.6, gh + 0.6,
                                                  fill=False, edgecolor="red", lw=1.5))
    step = max(1, gw // 7)
    ax.set_xticks([c * (gw + 1) + gw / 2 - 0.5 for c in range(0, gw, step)], [str(c) for c in range(0, gw, step)])
    ax.set_yticks([r * (gh + 1) + gh / 2 - 0.5 for r in range(0, gh, step)], [str(r) for r in range(0, gh, step)])
    ax.set_xlabel("input patch column", fontsize=TEXT_PT)
    ax.set_ylabel("input patch row", fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    if title:
        ax.set_title(title, fontsize=TITLE_PT)
    bar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("cosine similarity", fontsize=TEXT_PT)
    bar.ax.tick_params(labelsize=TEXT_PT)
    return figure_png(fig)
