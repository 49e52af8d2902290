"""The Compare tab's figures: two models side by side. Pure builders, arrays in, PNG bytes out, no Streamlit.

A | B | B - A of one per-patch map (an attention row, a rollout) as three tiles; the CKA heatmap; both models' mean
attention distance in one Fig. 7 (right) chart; the logit lens of both. Shapes: (gh, gw) maps, L blocks, H heads.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from dashboard.figures import base

DIFF_CMAP = "RdBu_r"  # B - A: red where B gives more, blue where it gives less, white where they agree
A_COLOUR, B_COLOUR = "tab:blue", "tab:orange"


def map_tile(crop: np.ndarray, amap: np.ndarray, patch_size: tuple[int, int], side: int) -> np.ndarray:
    """One model's per-patch map over its crop (base.overlay: min-max scaled), `side` pixels square: uint8 (side, side, 3)."""
    shown = base.overlay(crop, amap, patch_size)  # (H, W, 3)
    return np.asarray(Image.fromarray(shown).resize((side, side), Image.Resampling.NEAREST))


def diff_tile(diff: np.ndarray, side: int) -> np.ndarray:
    """B - A of a map (gh, gw), coloured on a scale symmetric about 0 (white: equal), `side` pixels square."""
    bound = float(np.nanmax(np.abs(diff))) or 1.0
    colours = base.colorize(diff, DIFF_CMAP, -bound, bound)  # (gh, gw, 3)
    return np.asarray(Image.fromarray(colours).resize((side, side), Image.Resampling.NEAREST))


def blank_tile(side: int) -> np.ndarray:
    return np.full((side, side, 3), 235, dtype=np.uint8)


def triplet_png(crop_a: np.ndarray, map_a: np.ndarray, patch_a: tuple[int, int], crop_b: np.ndarray, map_b: np.ndarray,
                patch_b: tuple[int, int], titles: tuple[str, str, str], side: int = 260) -> bytes:
    """A | B | B - A of one per-patch map: each model's map over its own crop, then the difference of the two maps
    (each summing to its own total; shown only when the grids match: a grey tile otherwise)."""
    tiles = [map_tile(crop_a, map_a, patch_a, side), map_tile(crop_b, map_b, patch_b, side),
             diff_tile(map_b - map_a, side) if map_a.shape == map_b.shape else blank_tile(side)]
    return base.png_bytes(base.mosaic(tiles, list(titles), cols=3), text_px=base.TEXT_PX)


def cka_png(cka: np.ndarray, title: str, width_px: int = 420) -> bytes:
    """The linear CKA of every pair of residual rows: A's rows down, B's across (emb, 0, 1, ...), 0 to 1."""
    fig = Figure(figsize=(width_px / base.DPI, width_px / base.DPI * 0.85))
    ax = fig.add_subplot()
    image = ax.imshow(cka, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    bar = fig.colorbar(image, ax=ax, fraction=0.046)
    bar.set_label("linear CKA", fontsize=base.TEXT_PT)
    bar.ax.tick_params(labelsize=base.TEXT_PT)
    rows = [_row_name(i) for i in range(cka.shape[0])]
    cols = [_row_name(j) for j in range(cka.shape[1])]
    ax.set_yticks(range(len(rows)), rows, fontsize=base.TEXT_PT)
    ax.set_xticks(range(len(cols)), cols, fontsize=base.TEXT_PT)
    ax.set_ylabel("A: tokens after block", fontsize=base.TEXT_PT)
    ax.set_xlabel("B: tokens after block", fontsize=base.TEXT_PT)
    ax.set_title(title, fontsize=base.TITLE_PT)
    return base.figure_png(fig, width_px=width_px)


def _row_name(row: int) -> str:
    return "emb" if row == 0 else str(row - 1)


def distance_both_png(mad_a: np.ndarray, mad_b: np.ndarray, uniform: float, width_px: int = 520) -> bytes:
    """Fig. 7 (right) of both models in one chart: every head's mean attention distance against its block, A's as
    dots and B's as crosses, side by side within a block; the distance of uniform attention dashed."""
    fig = Figure(figsize=(width_px / base.DPI, width_px / base.DPI * 0.62))
    ax = fig.add_subplot()
    for mad, marker, colour, name, shift in ((mad_a, "o", A_COLOUR, "A", -0.15), (mad_b, "x", B_COLOUR, "B", 0.15)):
        layers, heads = mad.shape  # (L, H)
        ax.plot(np.repeat(np.arange(layers), heads) + shift, mad.ravel(), marker, color=colour, ms=4, label=name,
                alpha=0.85)
    ax.axhline(uniform, color="grey", ls="--", lw=1)
    ax.set_xlabel("block", fontsize=base.TEXT_PT)
    ax.set_ylabel("mean attention distance (px)", fontsize=base.TEXT_PT)
    ax.tick_params(labelsize=base.TEXT_PT)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=base.TEXT_PT)
    return base.figure_png(fig, width_px=width_px)


def lens_both_png(prob_a: np.ndarray, prob_b: np.ndarray, class_name: str, width_px: int = 520) -> bytes:
    """The logit lens of both models for one class: its probability read off each residual row (emb, 0, 1, ...)."""
    fig = Figure(figsize=(width_px / base.DPI, width_px / base.DPI * 0.55))
    ax = fig.add_subplot()
    for prob, colour, name in ((prob_a, A_COLOUR, "A"), (prob_b, B_COLOUR, "B")):
        ax.plot(np.arange(len(prob)), prob, "o-", color=colour, label=name, ms=4)
    ax.set_xticks(range(max(len(prob_a), len(prob_b))), [_row_name(i) for i in range(max(len(prob_a), len(prob_b)))],
                  fontsize=base.TEXT_PT)
    ax.set_ylim(0, 1)
    ax.set_xlabel("tokens after block", fontsize=base.TEXT_PT)
    ax.set_ylabel(f"p({class_name[:24]})", fontsize=base.TEXT_PT)
    ax.tick_params(labelsize=base.TEXT_PT)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=base.TEXT_PT)
    return base.figure_png(fig, width_px=width_px)
