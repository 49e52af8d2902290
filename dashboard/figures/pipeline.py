"""Figures of the Pipeline and Patches tabs: the crop with its patch grid, a patch, a vector, the token matrix."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from dashboard.figures.base import (
    DPI,
    TEXT_PT,
    TEXT_PX,
    TITLE_PT,
    colorize,
    enlarge,
    enlarged_with_grid,
    figure_png,
    font,
    heatmap_png,
    patch_box,
    png_bytes,
)


def numbers_fit(grid: tuple[int, int], side: int) -> bool:
    """Whether every patch number (TEXT_PX, up to the grid's largest) fits in its patch of a `side`-pixel-wide crop."""
    gh, gw = grid
    return side / gw >= font(TEXT_PX).getlength(str(gh * gw - 1)) + 4 and side / gw >= TEXT_PX + 4


def patch_grid_image(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                     highlight: int | None = None, show_indices: bool = True, side: int | None = None) -> np.ndarray:
    """The crop enlarged (by its display scale, or to `side` pixels wide: the size it is shown at, so that every
    grid line stays), with grid lines, patch indices (TEXT_PX, where they fit: `numbers_fit`) and an optional
    highlighted patch: uint8."""
    gh, gw = grid
    ph, pw = patch_size
    im, draw, s = enlarged_with_grid(crop, grid, patch_size, side)
    if show_indices and numbers_fit(grid, im.width):
        f = font(TEXT_PX)
        for k in range(gh * gw):
            r, c = divmod(k, gw)
            x, y = (c + 0.5) * pw * s, (r + 0.5) * ph * s
            draw.text((x, y), str(k), fill=(255, 255, 255), font=f, anchor="mm", stroke_width=2, stroke_fill=(0, 0, 0))
    if highlight is not None:
        draw.rectangle(patch_box(highlight, gw, patch_size, s), outline=(0, 255, 255), width=3)
    return np.asarray(im)


def patch_grid_png(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int], side: int,
                   highlight: int | None = None, show_indices: bool = True) -> bytes:
    """`patch_grid_image` at `side` pixels wide as PNG bytes, its text size recorded (see base.png_bytes)."""
    picture = patch_grid_image(crop, grid, patch_size, highlight, show_indices, side)
    written = show_indices and numbers_fit(grid, picture.shape[1])
    return png_bytes(picture, text_px=TEXT_PX if written else None)


def patch_pixels_image(patch: np.ndarray, side: int = 192) -> np.ndarray:
    """One (ph, pw, 3) uint8 patch enlarged so its pixels are visible."""
    return enlarge(patch, max(1, side // patch.shape[1]))


def vector_png(vector: np.ndarray, title: str, channels: int | None = 3, width_px: int = 440,
               height_px: int = 200) -> bytes:
    """A long vector as a line plot, about `width_px` x `height_px` pixels; with `channels`, entries are coloured
    R, G, B in turn. `title` "": none (the caller's caption says what it is)."""
    fig = Figure(figsize=(width_px / DPI, height_px / DPI))
    ax = fig.add_subplot()
    idx = np.arange(vector.shape[0])
    if channels == 3:
        for ch, colour in enumerate(("#d62728", "#2ca02c", "#1f77b4")):
            ax.plot(idx[ch::3], vector[ch::3], ".", ms=2.5, color=colour, label="RGB"[ch])
        # above the axes, right: inside them it hid the points under it (a colour's values span the whole height)
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=TEXT_PT, ncols=3, markerscale=3,
                  handletextpad=0.1, columnspacing=0.6, borderpad=0.2, borderaxespad=0.1, frameon=False)
    else:
        ax.plot(idx, vector, lw=0.8, color="#444")
    if title:
        ax.set_title(title, fontsize=TITLE_PT, loc="left" if channels == 3 else "center")  # left: clear of the legend
    ax.set_xlim(0, len(vector))
    ax.tick_params(labelsize=TEXT_PT)
    ax.grid(alpha=0.3)
    return figure_png(fig, width_px=width_px)


TOKEN_MATRIX_SIDES = (384, 240)  # pixels: the (T, D) matrix is shown at most this wide and tall (box-averaged down)


def token_matrix_png(tokens: np.ndarray, title: str, num_prefix_tokens: int,
                     sides: tuple[int, int] = TOKEN_MATRIX_SIDES) -> bytes:
    """A (T, D) token matrix as a heat strip: one row per token (prefix tokens on top, marked off beside it),
    symmetric colour scale at the 99th percentile of |values|, with its colour bar. Drawn with PIL (a
    matplotlib figure cost ~100 ms on every new image); wider or taller than `sides` (width, height),
    neighbouring entries' colours are averaged (a box filter), not skipped. `title` "": none."""
    t, d = tokens.shape
    lim = float(np.percentile(np.abs(tokens), 99)) or 1.0
    colours = Image.fromarray(colorize(tokens, "RdBu_r", -lim, lim))  # (T, D, 3)
    size = (min(d, sides[0]), min(t, sides[1]))
    if size != (d, t):
        colours = colours.resize(size, Image.Resampling.BOX)
    return heatmap_png(np.asarray(colours), (t, d), title, f"{d} features", f"{t} tokens",
                       colorbar=("RdBu_r", -lim, lim, "value"), line_above_row=num_prefix_tokens or None)
