"""Figures of the Interventions tab: the crop with the chosen patches removed, and the prediction before and after."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from dashboard.figures.base import DPI, TEXT_PT, TITLE_PT, enlarged_with_grid, figure_png, patch_box, shown_label
from dashboard.literal import mathtext_literal


def removed_patches_image(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                          patches: Sequence[int], mode: str) -> np.ndarray:
    """The crop enlarged for display with the chosen patches shown removed: "drop" blacks them out with a red
    cross (the token is gone), "mask" paints them the normalisation mean (grey: the model sees the mean input).
    uint8 (H*s, W*s, 3)."""
    im, draw, s = enlarged_with_grid(crop, grid, patch_size)
    for k in patches:
        box = patch_box(k, grid[1], patch_size, s)
        if mode == "mask":
            draw.rectangle(box, fill=(124, 116, 104), outline=(255, 255, 0), width=2)  # about ImageNet's mean colour
        else:
            draw.rectangle(box, fill=(0, 0, 0))
            draw.line([box[0], box[1], box[2], box[3]], fill=(220, 40, 40), width=2)
            draw.line([box[0], box[3], box[2], box[1]], fill=(220, 40, 40), width=2)
    return np.asarray(im)


def prediction_change_png(labels: Sequence[str], before: Sequence[float], after: Sequence[float], title: str = "",
                          width_px: int = 540) -> bytes:
    """Horizontal bars of each class's probability before (grey) and after (blue) an intervention, first on top;
    about `width_px` wide."""
    n = len(labels)
    fig = Figure(figsize=(width_px / DPI, (38 * n + 90) / DPI))
    ax = fig.add_subplot()
    y = np.arange(n)[::-1]
    ax.barh(y + 0.2, np.asarray(before) * 100, height=0.38, color="#bbbbbb", label="original")
    ax.barh(y - 0.2, np.asarray(after) * 100, height=0.38, color="#4c72b0", label="after the intervention")
    for yi, b, a in zip(y, before, after, strict=True):
        ax.text(b * 100 + 1, yi + 0.2, f"{b * 100:.1f}%", va="center", fontsize=TEXT_PT, color="#555")
        ax.text(a * 100 + 1, yi - 0.2, f"{a * 100:.1f}%", va="center", fontsize=TEXT_PT)
    ax.set_yticks(y, [shown_label(label, 20) for label in labels], fontsize=TEXT_PT)
    ax.set_xlim(0, 125)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("probability (%)", fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    # above the axes: inside, it covered the lowest classes' bars and their numbers
    ax.legend(fontsize=TEXT_PT, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, borderaxespad=0.1, frameon=False,
              handlelength=1.2, columnspacing=1.0)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT, pad=2.2 * TEXT_PT)  # above the legend
    return figure_png(fig, width_px=width_px)
