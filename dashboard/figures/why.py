"""Figures of the Why? tab: the deletion and insertion curves of each method and of the random baseline."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from dashboard.figures.base import DPI, TEXT_PT, TITLE_PT, figure_png
from dashboard.literal import mathtext_literal
from vit_core import explain

METHOD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


RANDOM_COLOUR = "#7f7f7f"
WIDTH_PX = 690  # the figures' axes: with the legend on the right, about the main area's 932 px at 1280 px
MAX_WIDTH_PX = 920  # and no wider, whatever the legend's names


def faithfulness_curves_png(deletion: dict[str, np.ndarray], insertion: dict[str, np.ndarray],
                            random_deletion_std: np.ndarray, random_insertion_std: np.ndarray, title: str = "") -> bytes:
    """Deletion (left) and insertion (right) curves: p_c against the share of patches dropped / kept.

    deletion, insertion: name -> (S,) probabilities, one entry per method plus "random" (the mean of the
    random orders, drawn grey with a band of +- one standard deviation `random_*_std` (S,)). The x positions
    are the spec's (explain.deletion_x, insertion_x): deletion k / S for k = 0..S-1, insertion k / S for k = 1..S.
    """
    fig = Figure(figsize=(WIDTH_PX / DPI, 3.6))
    axes = fig.subplots(1, 2, sharey=True)
    panels = ((axes[0], deletion, random_deletion_std, explain.deletion_x, "dropped (most relevant first)"),
              (axes[1], insertion, random_insertion_std, explain.insertion_x, "kept (most relevant first)"))
    for ax, curves, std, x_of, what in panels:
        methods = [name for name in curves if name != explain.RANDOM]
        for i, name in enumerate(methods):
            y = curves[name]
            x = x_of(len(y))  # (S,)
            ax.plot(x, y, "o-", ms=3, lw=1.4, color=METHOD_COLOURS[i % len(METHOD_COLOURS)], label=mathtext_literal(name))
        if explain.RANDOM in curves:
            y = curves[explain.RANDOM]
            x = x_of(len(y))  # (S,)
            ax.fill_between(x, y - std, y + std, color=RANDOM_COLOUR, alpha=0.25, lw=0)
            ax.plot(x, y, "--", lw=1.4, color=RANDOM_COLOUR, label="random (mean ± std)")
        ax.set_xlabel(f"share of patches {what}", fontsize=TEXT_PT)
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=TEXT_PT)
    axes[0].set_ylabel("p(target class)", fontsize=TEXT_PT)
    axes[0].set_title("deletion: lower is more faithful", fontsize=TITLE_PT)
    axes[1].set_title("insertion: higher is more faithful", fontsize=TITLE_PT)
    axes[1].legend(fontsize=TEXT_PT, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(mathtext_literal(title), fontsize=TITLE_PT)
    return figure_png(fig, width_px=MAX_WIDTH_PX)


def sanity_png(stages: tuple[str, ...], cascading: dict[str, np.ndarray], other_class: dict[str, float],
               titles: dict[str, str], title: str = "") -> bytes:
    """Adebayo et al.'s cascading randomisation: each method's Spearman rho with its own map (y) as the model is
    re-initialised from the top, one stage more at each x (`stages`, "head" first); each method's rho with another
    class's map drawn as a marker at the right. A map that explains the model falls towards 0 as the model goes."""
    fig = Figure(figsize=(WIDTH_PX / DPI, 3.6))
    ax = fig.subplots()
    x = np.arange(len(stages))
    for i, (method, rho) in enumerate(cascading.items()):
        colour = METHOD_COLOURS[i % len(METHOD_COLOURS)]
        ax.plot(x, rho, "o-", ms=3, lw=1.4, color=colour, label=mathtext_literal(titles.get(method, method)))
        if method in other_class:
            ax.plot([len(stages) + 0.6], [other_class[method]], marker="D", ms=6, color=colour, ls="none")
    ax.axhline(0, color=RANDOM_COLOUR, lw=0.8)
    ax.set_xticks([*x, len(stages) + 0.6], [*(f"+{s}" if i else s for i, s in enumerate(stages)), "other\nclass"],
                  fontsize=TEXT_PT, rotation=45, ha="right")
    ax.set_ylim(-1.05, 1.05)
    ax.tick_params(labelsize=TEXT_PT)
    ax.set_ylabel("Spearman rho with the map\nof the trained model", fontsize=TEXT_PT)
    ax.set_xlabel("re-initialised so far (from the top), and a random other class's map", fontsize=TEXT_PT)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=TEXT_PT, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        ax.set_title(mathtext_literal(title), fontsize=TITLE_PT)
    return figure_png(fig, width_px=MAX_WIDTH_PX)
