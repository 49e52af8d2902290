"""Figures of the Concepts tab: a feature's activation over the image's patches, its top patches from the folder, and
an image's circuit across blocks (patches -> features at each block -> the prediction)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from dashboard.figures.base import colorize, map_to_pixels, tint

GAP_PX = 4


def feature_map_image(crop: np.ndarray, activation: np.ndarray, patch_size: tuple[int, int], side: int,
                      top: float | None = None) -> np.ndarray:
    """The crop (H, W, 3) tinted by a feature's activation per patch (gh, gw), from 0 (no tint's low end) to `top`
    (default: the image's largest activation of that feature), `side` pixels wide: uint8 (side * H / W, side, 3)."""
    if top is None or top <= 0:
        top = float(activation.max()) if activation.size and activation.max() > 0 else 1.0
    colours = map_to_pixels(colorize(activation, vmin=0.0, vmax=top), patch_size)  # (H, W, 3)
    tinted = tint(crop.astype(np.float32), colours)
    height = max(1, round(side * crop.shape[0] / crop.shape[1]))
    return np.asarray(Image.fromarray(tinted).resize((side, height), Image.Resampling.NEAREST))


def crops_row_image(crops: Sequence[np.ndarray], gap: int = GAP_PX) -> np.ndarray:
    """Crops of one size (s, s, 3) side by side on white, `gap` pixels apart: uint8 (s, n s + (n - 1) gap, 3)."""
    if not crops:
        return np.full((8, 8, 3), 255, dtype=np.uint8)
    side = crops[0].shape[0]
    row = np.full((side, len(crops) * (side + gap) - gap, 3), 255, dtype=np.uint8)
    for i, crop in enumerate(crops):
        row[:, i * (side + gap):i * (side + gap) + side] = crop
    return row


POSITIVE, NEGATIVE, PATCHES_COLOUR = "#1f77b4", "#d62728", "#9e9e9e"
EDGE_WIDTH = 8.0  # the largest |attribution| between two columns is drawn this many pixels wide


def _node_rows(count: int) -> np.ndarray:
    """The heights of `count` nodes in a column, centred on 0, largest first from the top: float (count,)."""
    return (count - 1) / 2 - np.arange(count, dtype=float)


def circuit_figure(layers: Sequence[int], strongest: Sequence[np.ndarray], totals: Sequence[np.ndarray],
                   attribution: Sequence[np.ndarray], to_prediction: np.ndarray, prediction: str,
                   height: int = 420) -> go.Figure:
    """The circuit of one image as columns: its patches, the shown features of each block (strongest[i] (S_i,), their
    total activations totals[i]), the prediction; edges from the patches by total activation, between blocks by
    attribution[i] (S_{i+1}, S_i) on the image, to the prediction by to_prediction (S_last,), each edge's width by its
    size within its gap, blue for a positive value and red for a negative one. Every edge between two blocks has a
    clickable marker at its middle whose customdata is [i, row, col] (its pair and place in attribution[i])."""
    fig = go.Figure()
    columns = len(layers) + 2
    heights = [np.zeros(1), *[_node_rows(len(s)) for s in strongest], np.zeros(1)]

    def edges(x0: int, x1: int, values: np.ndarray, pairs: list[tuple[int, int]], colour: str | None) -> None:
        top = float(np.abs(values).max()) if values.size and np.abs(values).max() > 0 else 1.0
        for value, (a, b) in zip(values.tolist(), pairs, strict=True):
            fig.add_trace(go.Scatter(x=[x0, x1], y=[heights[x0][a], heights[x1][b]], mode="lines", hoverinfo="skip",
                                     line={"width": 0.5 + EDGE_WIDTH * abs(value) / top,
                                           "color": colour or (POSITIVE if value >= 0 else NEGATIVE)},
                                     opacity=0.7, showlegend=False))

    if strongest and len(strongest[0]):
        edges(0, 1, np.asarray(totals[0]), [(0, r) for r in range(len(strongest[0]))], PATCHES_COLOUR)
    middles: list[tuple[float, float, list[int], str]] = []
    for i, values in enumerate(attribution):
        pairs = [(c, r) for r in range(values.shape[0]) for c in range(values.shape[1])]
        edges(i + 1, i + 2, values.reshape(-1), pairs, None)
        for (c, r), value in zip(pairs, values.reshape(-1).tolist(), strict=True):
            middles.append(((2 * i + 3) / 2, (heights[i + 1][c] + heights[i + 2][r]) / 2, [i, r, c],
                            f"#{strongest[i][c]} (block {layers[i]}) -> #{strongest[i + 1][r]} (block {layers[i + 1]}): "
                            f"attribution {value:.3g}"))
    if len(strongest[-1]):
        edges(columns - 2, columns - 1, np.asarray(to_prediction), [(r, 0) for r in range(len(strongest[-1]))], None)
    if middles:
        fig.add_trace(go.Scatter(x=[m[0] for m in middles], y=[m[1] for m in middles], mode="markers",
                                 customdata=[m[2] for m in middles], hovertext=[m[3] for m in middles],
                                 hoverinfo="text", marker={"size": 9, "color": "rgba(0,0,0,0.25)"}, showlegend=False))
    labels = [["patches"], *[[f"#{f}" for f in s.tolist()] for s in strongest], [prediction]]
    for x, (rows, names) in enumerate(zip(heights, labels, strict=True)):
        fig.add_trace(go.Scatter(x=[x] * len(rows), y=rows.tolist(), mode="markers+text", text=names,
                                 textposition="top center", textfont={"size": 14, "color": "#111"}, hoverinfo="text",
                                 marker={"size": 14, "color": "#444"}, showlegend=False))
    fig.update_xaxes(tickvals=list(range(columns)), showgrid=False, zeroline=False,
                     ticktext=["the image's patches", *[f"block {layer}" for layer in layers], "prediction"])
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": 10, "b": 30}, clickmode="event+select",
                      plot_bgcolor="white")
    return fig
