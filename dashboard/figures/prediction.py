"""Figures of the Prediction tab: the top classes and every logit."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from dashboard.figures.base import DPI, TEXT_PT, figure_png, shown_label
from dashboard.literal import mathtext_literal


def top_k_png(labels: Sequence[str], probs: Sequence[float], width_px: int = 360, label_chars: int = 20) -> bytes:
    """Horizontal bars, best on top, about `width_px` wide; class names cut to `label_chars` characters."""
    fig = Figure(figsize=(width_px / DPI, (28 * len(labels) + 70) / DPI))
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1]
    ax.barh(y, np.asarray(probs) * 100, color="#4c72b0")
    ax.set_yticks(y, [shown_label(label, label_chars) for label in labels], fontsize=TEXT_PT)
    for yi, p in zip(y, probs, strict=True):
        ax.text(p * 100 + 1, yi, f"{p * 100:.1f}%", va="center", fontsize=TEXT_PT)
    ax.set_xlim(0, 130)
    ax.set_xticks([0, 50, 100])
    ax.set_xlabel("probability (%)", fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    ax.grid(axis="x", alpha=0.3)
    return figure_png(fig, width_px=width_px)


def logits_png(logits: np.ndarray, marked: Sequence[int], marked_labels: Sequence[str], width_px: int = 900) -> bytes:
    """Every logit against its class index, the top classes marked."""
    fig = Figure(figsize=(width_px / DPI, 2.8))
    ax = fig.add_subplot()
    idx = np.arange(len(logits))
    if len(logits) > 50:
        ax.plot(idx, logits, lw=0.6, color="#555")
    else:
        ax.bar(idx, logits, color="#888")
    for i, label in zip(marked, marked_labels, strict=True):
        ax.plot([i], [logits[i]], "o", color="#d62728", ms=4)
        ax.annotate(mathtext_literal(label[:20]), (i, logits[i]), fontsize=TEXT_PT, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("class index", fontsize=TEXT_PT)
    ax.set_ylabel("logit", fontsize=TEXT_PT)
    ax.tick_params(labelsize=TEXT_PT)
    ax.set_xlim(-0.5, len(logits) - 0.5)
    ax.grid(alpha=0.3)
    return figure_png(fig, width_px=width_px)
