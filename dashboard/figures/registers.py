"""Figures of the Registers & norms tab: token norms over the crop, their histogram, the high-norm rate per layer
(Darcet et al., ICLR 2024).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from dashboard.figures.base import DPI, TEXT_PT, TITLE_PT, display_scale, enlarge, figure_png, overlay, patch_box
from dashboard.literal import mathtext_literal

HIGH_NORM_FRAME = (60, 255, 60)  # bright green: stands out on every colour of the inferno map (cyan means "selected")


PREFIX_COLOURS = {"CLS": "#1f77b4", "DIST": "#9467bd"}  # registers: REGISTER_COLOUR


REGISTER_COLOUR = "#2ca02c"


HIGH_NORM_COLOUR = "#d62728"


def norm_map_image(crop: np.ndarray, norm_map: np.ndarray, high_norm: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """The patch tokens' norms over the crop (min-max scaled for display), each high-norm patch framed:
    crop uint8 (H, W, 3), norm_map float (gh, gw), high_norm bool (gh, gw) -> uint8 (H*s, W*s, 3), enlarged."""
    s = display_scale(crop.shape[1])
    im = Image.fromarray(enlarge(overlay(crop, norm_map, patch_size), s))
    draw = ImageDraw.Draw(im)
    width = max(2, s + 1)
    for k in np.flatnonzero(high_norm):  # (gh, gw) -> patch indices, row-major
        draw.rectangle(patch_box(k, high_norm.shape[1], patch_size, s), outline=HIGH_NORM_FRAME, width=width)
    return np.asarray(im)


def _prefix_colour(name: str) -> str:
    return REGISTER_COLOUR if name.startswith("REG") else PREFIX_COLOURS.get(name, "#555555")


def token_norms_png(patch_norms: np.ndarray, fence: float, prefix_norms: np.ndarray, prefix_names: Sequence[str],
                    title: str = "", width_px: int = 440) -> bytes:
    """Why a patch is marked: the histogram of one layer's patch-token norms (N,), those above the fence
    (Q3 + 3 IQR) in red, the fence as a dashed line, and each prefix token's norm (P,) as a labelled line; about
    `width_px` wide, the legend below."""
    fig = Figure(figsize=(width_px / DPI, 2.6))
    ax = fig.add_subplot()
    values = [*patch_norms.tolist(), *prefix_norms.tolist(), float(fence)]
    bins = np.linspace(min(values), max(values), 41) if max(values) > min(values) else 41
    high = patch_norms > fence
    ax.hist(patch_norms[~high], bins=bins, color="#888888", label=f"patches ({int((~high).sum())})")
    if high.any():
        ax.hist(patch_norms[high], bins=bins, color=HIGH_NORM_COLOUR, label=f"high-norm patches ({int(high.sum())})")
    ax.axvline(fence, color="black", ls="--", lw=1.2, label=f"fence Q3 + 3 IQR = {fence:.3g}")
    for i, (name, norm) in enumerate(zip(prefix_names, prefix_norms.tolist(), strict=True)):
        colour = _prefix_colour(name)
        ax.axvline(norm, color=colour, lw=1.6)
        ax.annotate(name, (norm, 1), xycoords=("data", "axes fraction"), xytext=(2, -12 - 14 * (i % 8)),
                    textcoords="offset points", fontsize=TEXT_PT, color=colour)
    ax.set_xlabel("token norm ||x||", fontsize=TEXT_PT)
    ax.set_ylabel("number of patches", fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=TEXT_PT, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncols=1, frameon=False)
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT)
    return figure_png(fig, width_px=width_px)


def high_norm_rate_png(rate: np.ndarray, title: str = "", width_px: int = 440) -> bytes:
    """The share of high-norm patch tokens per row of the residual stream, rate (L+1,): row 0 = the
    embeddings entering block 0, row l = after block l - 1 (as `lens_row_name`); about `width_px` wide."""
    rows = np.arange(len(rate))
    fig = Figure(figsize=(width_px / DPI, 2.6))
    ax = fig.add_subplot()
    ax.plot(rows, rate * 100, "o-", ms=4, color=HIGH_NORM_COLOUR)
    step = max(1, len(rows) // 13)
    ax.set_xticks(rows[::step], ["emb" if r == 0 else str(r - 1) for r in rows[::step]])
    ax.set_xlabel("tokens after block (emb: the embeddings)", fontsize=TEXT_PT)
    ax.set_ylabel("high-norm (%)", fontsize=TEXT_PT)
    ax.set_ylim(bottom=0, top=max(1.0, float(rate.max()) * 100 * 1.2))
    ax.tick_params(labelsize=TEXT_PT)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT)
    return figure_png(fig, width_px=width_px)
