"""Figures of the Logit lens tab: the layer x class strip and the per-patch top-1 class over the crop."""

from __future__ import annotations

from typing import Sequence

import matplotlib
import matplotlib.patches
import numpy as np
from matplotlib.figure import Figure

from dashboard.figures.base import DPI, TEXT_PT, TITLE_PT, figure_png, map_to_pixels, shown_label
from dashboard.literal import mathtext_literal


def lens_row_name(row: int) -> str:
    """Row l of the logit lens (0..L): the embeddings entering block 0, then the tokens after block l - 1."""
    return "the embeddings" if row == 0 else f"after block {row - 1}"


STRIP_CELL_PX = (46, 22)  # a cell of the strip: room for "100%" at TEXT_PX


def logit_lens_strip_png(probs: np.ndarray, labels: Sequence[str], title: str = "", max_width_px: int = 900) -> bytes:
    """The logit lens as a layer x class strip: probs (L+1, K), row l = the probabilities if the model
    stopped after block l (row 0: the embeddings), for K chosen classes; every cell is written out. At most about
    `max_width_px` wide with its labels and colour bar."""
    rows, cols = probs.shape
    cell_w, cell_h = STRIP_CELL_PX
    width = min(max_width_px - 260, cell_w * cols)  # the cells; class names, row names and the colour bar around
    fig = Figure(figsize=((width + 260) / DPI, (cell_h * rows + 130) / DPI))
    ax = fig.add_subplot()
    im = ax.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for r in range(rows):
        for c in range(cols):
            p = probs[r, c]
            ax.text(c, r, f"{p:.0%}" if p >= 0.005 else "", ha="center", va="center", fontsize=TEXT_PT,
                    color="white" if p > 0.6 else "black")
    ax.set_xticks(np.arange(cols), [shown_label(label, 18) for label in labels],
                  rotation=30, ha="right", fontsize=TEXT_PT)
    ax.set_yticks(np.arange(rows), [lens_row_name(row).removeprefix("the ") for row in range(rows)], fontsize=TEXT_PT)
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT)
    bar = fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02)
    bar.set_label("probability", fontsize=TEXT_PT)
    bar.ax.tick_params(labelsize=TEXT_PT)
    return figure_png(fig, width_px=max_width_px)


PATCH_NUMBER_PX = 31  # a patch shows its probability's number where it is at least this wide ("100" at TEXT_PX)


def patch_lens_png(crop: np.ndarray, classes: np.ndarray, probs: np.ndarray, labels: dict[int, str],
                   patch_size: tuple[int, int], title: str = "", max_legend: int = 8, side_px: int = 440) -> bytes:
    """The per-patch logit lens over the crop, `side_px` wide: each patch coloured by its top-1 class, the colour's
    strength its probability (pale: unsure); the number in each patch is that probability in percent (where a
    patch is PATCH_NUMBER_PX wide or more).

    classes: int (gh, gw) top-1 class per patch; probs: float (gh, gw) its probability; labels: class -> name
    for the legend. The `max_legend` most frequent classes get their own colour, the rest are grey.
    """
    gh, gw = classes.shape
    counts = np.bincount(classes.reshape(-1))
    frequent = [int(c) for c in np.argsort(-counts, kind="stable")[:max_legend] if counts[c] > 0]
    palette = matplotlib.colormaps["tab10"](np.arange(10))[:, :3]
    colours = np.full((gh, gw, 3), 0.6)
    for i, c in enumerate(frequent):
        colours[classes == c] = palette[i % 10]
    strength = (0.3 + 0.7 * np.clip(probs, 0, 1))[..., None]  # (gh, gw, 1): unsure patches stay pale
    shade = 1 - strength * (1 - colours)  # blend towards white
    base = crop.astype(np.float32).mean(axis=-1, keepdims=True) / 255.0  # (H, W, 1): the crop in grey, under the colours
    tinted = 0.2 * base + 0.8 * map_to_pixels(shade, patch_size)  # (H, W, 3)
    height_px = side_px * crop.shape[0] / crop.shape[1]
    fig = Figure(figsize=(side_px / DPI, height_px / DPI))
    ax = fig.add_axes((0, 0, 1, 1))  # the axes are the figure: the crop is exactly side_px wide
    ax.imshow(tinted, interpolation="nearest")
    ph, pw = patch_size
    if side_px / gw >= PATCH_NUMBER_PX:
        for r in range(gh):
            for c in range(gw):
                ax.text((c + 0.5) * pw - 0.5, (r + 0.5) * ph - 0.5, f"{probs[r, c] * 100:.0f}", ha="center", va="center",
                        fontsize=TEXT_PT, color="black")
    ax.set_xticks([])
    ax.set_yticks([])
    handles = [matplotlib.patches.Patch(color=palette[i % 10],
                                        label=f"{shown_label(labels.get(c, f'class {c}'), 24)} ({counts[c]})")
               for i, c in enumerate(frequent)]
    if int(counts.sum()) > sum(int(counts[c]) for c in frequent):
        handles.append(matplotlib.patches.Patch(color=(0.6, 0.6, 0.6), label="rarer classes"))
    ax.legend(handles=handles, fontsize=TEXT_PT, loc="center left", bbox_to_anchor=(1.02, 0.5), title="top-1 (patches)",
              title_fontsize=TEXT_PT)
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT)
    return figure_png(fig)
