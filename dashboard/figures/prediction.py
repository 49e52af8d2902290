"""Figures of the Prediction tab: the top classes and every logit."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from dashboard.figures.base import figure_png, shown_label
from dashboard.image_choice import mathtext_literal


def top_k_png(labels: Sequence[str], probs: Sequence[float]) -> bytes:
    """Horizontal bars, best on top."""
    fig = Figure(figsize=(6, 0.45 * len(labels) + 0.8))
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1]
    ax.barh(y, np.asarray(probs) * 100, color="#4c72b0")
    ax.set_yticks(y, [shown_label(label, 40) for label in labels], fontsize=9)
    for yi, p in zip(y, probs, strict=True):
        ax.text(p * 100 + 1, yi, f"{p * 100:.1f}%", va="center", fontsize=8)
    ax.set_xlim(0, 110)
    ax.set_xlabel("probability (%)")
    ax.grid(axis="x", alpha=0.3)
    return figure_png(fig)


def logits_png(logits: np.ndarray, marked: Sequence[int], marked_labels: Sequence[str]) -> bytes:
    """Every logit against its class index, the top classes marked."""
    fig = Figure(figsize=(9, 2.8))
    ax = fig.add_subplot()
    idx = np.arange(len(logits))
    if len(logits) > 50:
        ax.plot(idx, logits, lw=0.6, color="#555")
    else:
        ax.bar(idx, logits, color="#888")
    for i, label in zip(marked, marked_labels, strict=True):
        ax.plot([i], [logits[i]], "o", color="#d62728", ms=4)
        ax.annotate(mathtext_literal(label[:20]), (i, logits[i]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("class index")
    ax.set_ylabel("logit")
    ax.set_xlim(-0.5, len(logits) - 0.5)
    ax.grid(alpha=0.3)
    return figure_png(fig)
