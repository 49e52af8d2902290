"""Figures of the paper's analyses that are drawn the same way everywhere: the dashboard's tabs and pages, and the
files of the `dataset` command. Pure builders: arrays in, PNG bytes out. numpy and matplotlib's object-oriented API
only (no pyplot: it keeps global state and is not thread-safe), no Streamlit.

matplotlib is imported when a figure is drawn, not with this module: the analyses need no plotting library.
"""

from __future__ import annotations

import io

import numpy as np

HEAD_COLOURS = "tab20"  # one colour per head (repeating after 20)
DPI = 110


def attention_distance_png(mad: np.ndarray, uniform: float, *, spread: np.ndarray | None = None,
                           average: np.ndarray | None = None, num_images: int = 1, title: str = "") -> bytes:
    """`attention_distance_figure` as PNG bytes."""
    fig = attention_distance_figure(mad, uniform, spread=spread, average=average, num_images=num_images, title=title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


def attention_distance_figure(mad: np.ndarray, uniform: float, *, spread: np.ndarray | None = None,
                              average: np.ndarray | None = None, num_images: int = 1, title: str = ""):
    """The paper's Fig. 7 (right): the mean attention distance of every head (a dot each) against depth, the heads of
    a layer side by side, with the level of uniform attention over all patches as a dashed line.

    mad: (L, H) in pixels, the dots (one image's values, or the mean over a set of images);
    spread: (L, H), optional: an error bar of +- spread on each dot (the std over a set of images);
    average: (L, H), optional: crosses at the same places, the average over `num_images` images (drawn only when
    num_images > 1; the dashboard's distance tab: this image's dots beside the session's average);
    uniform: the distance of uniform attention over all patches (analyses.uniform_attention_distance).
    Heads are named in a legend up to 16 heads. A matplotlib Figure (the dashboard sets its text sizes for the
    screen before saving it)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    num_layers, num_heads = mad.shape  # (L, H)
    layers = np.arange(num_layers)  # (L,)
    offsets = (np.arange(num_heads) - (num_heads - 1) / 2) * min(0.6 / max(num_heads, 1), 0.08)  # (H,): side by side
    colours = colormaps[HEAD_COLOURS](np.arange(num_heads) % 20)  # (H, 4) RGBA
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for h in range(num_heads):
        label = f"head {h}" if num_heads <= 16 else None
        if spread is None:
            ax.plot(layers + offsets[h], mad[:, h], "o", ms=4, color=colours[h], label=label)
        else:
            ax.errorbar(layers + offsets[h], mad[:, h], yerr=spread[:, h], fmt="o", ms=3.5, lw=0.8, capsize=1.5,
                        color=colours[h], label=label)
    top = float(np.nanmax(mad if spread is None else mad + spread))
    if average is not None and num_images > 1:
        ax.scatter((layers[:, None] + offsets[None, :]).ravel(), average.ravel(), marker="x", s=16, color="black",
                   alpha=0.6, label=f"average of {num_images} images", zorder=3)
        top = max(top, float(np.nanmax(average)))
    ax.axhline(uniform, color="grey", ls="--", lw=1)
    # at the axes' right edge (x in axes fractions): placed in data units it started outside the x range of a few
    # layers and ran over the border into the legend
    ax.text(0.99, uniform, "uniform attention", va="bottom", ha="right", fontsize=8, color="grey",
            transform=ax.get_yaxis_transform())
    ax.set_xlabel("block (network depth; 0 = the first)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(layers)
    ax.set_ylim(bottom=0, top=max(top, uniform) * 1.15)
    ax.grid(alpha=0.3)
    ax.set_title(title.replace("$", r"\$"), fontsize=10)  # a `$` would start mathtext: shown as written
    if num_heads <= 16 or (average is not None and num_images > 1):
        ax.legend(fontsize=7, ncols=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig
