"""Figures of the Many images page: a value per layer over a set of images. (Fig. 7 right for the set is the
`dataset` command's own file, drawn by `vit_core.plots`.)"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from dashboard.figures.lens import lens_row_name


def per_layer_figure(values: np.ndarray, title: str, y_title: str, full_range: bool = True) -> go.Figure:
    """A value per logit-lens row / residual layer, values (L+1,) in [0, 1] -> a line over the rows
    (row 0: the embeddings, row l: after block l - 1), shown in percent: from 0 to 100 % (`full_range`,
    for accuracies), else from 0 to a little above the largest value (rates of a few percent)."""
    top = 100.0 if full_range else max(1.0, 120 * float(np.max(values)))
    rows = [lens_row_name(r) for r in range(len(values))]
    fig = go.Figure(go.Scatter(x=list(range(len(values))), y=(100 * np.asarray(values, dtype=np.float64)).round(2),
                               mode="lines+markers", customdata=rows,
                               hovertemplate="%{customdata}: %{y:.1f}%<extra></extra>"))
    fig.update_layout(title=title, height=320, margin=dict(l=60, r=20, t=50, b=50), showlegend=False,
                      xaxis=dict(title="layer (0 = the embeddings, l = after block l - 1)", dtick=1),
                      yaxis=dict(title=y_title, range=[0, top], ticksuffix="%"))
    return fig
