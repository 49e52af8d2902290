"""Figures of the Pipeline and Patches tabs: the crop with its patch grid, a patch, a vector, the token matrix."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from dashboard.figures.base import colorize, enlarge, enlarged_with_grid, figure_png, font, heatmap_png, patch_box


def patch_grid_image(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                     highlight: int | None = None, show_indices: bool = True) -> np.ndarray:
    """The crop enlarged, with grid lines, patch indices and an optional highlighted patch: uint8."""
    gh, gw = grid
    ph, pw = patch_size
    im, draw, s = enlarged_with_grid(crop, grid, patch_size)
    if show_indices:
        size = max(7, min(12, int(pw * s * 0.3)))
        f = font(size)
        for k in range(gh * gw):
            r, c = divmod(k, gw)
            x, y = c * pw * s + 2, r * ph * s + 1
            draw.text((x, y), str(k), fill=(255, 255, 255), font=f, stroke_width=1, stroke_fill=(0, 0, 0))
    if highlight is not None:
        draw.rectangle(patch_box(highlight, gw, patch_size, s), outline=(0, 255, 255), width=3)
    return np.asarray(im)


def patch_pixels_image(patch: np.ndarray, side: int = 192) -> np.ndarray:
    """One (ph, pw, 3) uint8 patch enlarged so its pixels are visible."""
    return enlarge(patch, max(1, side // patch.shape[1]))


def vector_png(vector: np.ndarray, title: str, channels: int | None = 3, height: float = 2.2) -> bytes:
    """A long vector as a line plot; with `channels`, entries are coloured R, G, B in turn."""
    fig = Figure(figsize=(9, height))
    ax = fig.add_subplot()
    idx = np.arange(vector.shape[0])
    if channels == 3:
        for ch, colour in enumerate(("#d62728", "#2ca02c", "#1f77b4")):
            ax.plot(idx[ch::3], vector[ch::3], ".", ms=2.5, color=colour, label="RGB"[ch])
        ax.legend(loc="upper right", fontsize=8, ncols=3, markerscale=3)
    else:
        ax.plot(idx, vector, lw=0.8, color="#444")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, len(vector))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return figure_png(fig)


TOKEN_MATRIX_SIDES = (384, 240)  # pixels: the (T, D) matrix is shown at most this wide and tall (box-averaged down)


def token_matrix_png(tokens: np.ndarray, title: str, num_prefix_tokens: int) -> bytes:
    """A (T, D) token matrix as a heat strip: one row per token (prefix tokens on top, marked off beside it),
    symmetric colour scale at the 99th percentile of |values|, with its colour bar. Drawn with PIL (a
    matplotlib figure cost ~100 ms on every new image); wider or taller than TOKEN_MATRIX_SIDES, neighbouring
    entries' colours are averaged (a box filter), not skipped."""
    t, d = tokens.shape
    lim = float(np.percentile(np.abs(tokens), 99)) or 1.0
    colours = Image.fromarray(colorize(tokens, "RdBu_r", -lim, lim))  # (T, D, 3)
    size = (min(d, TOKEN_MATRIX_SIDES[0]), min(t, TOKEN_MATRIX_SIDES[1]))
    if size != (d, t):
        colours = colours.resize(size, Image.Resampling.BOX)
    return heatmap_png(np.asarray(colours), (t, d), title, f"{d} features", f"{t} tokens",
                       colorbar=("RdBu_r", -lim, lim, "value"), line_above_row=num_prefix_tokens or None)
