"""The Prediction tab: the top classes with their probabilities and logits, and every logit."""

from __future__ import annotations

import streamlit as st

from dashboard import session, text
from dashboard.figures import pipeline as pipeline_figures
from dashboard.figures import prediction as prediction_figures
from dashboard.literal import markdown_literal
from dashboard.views.context import PAGE_PX, ViewContext, cached_figure, column_px, shape, show_picture
from dashboard.views.registry import view
from vit_core import analyses

# ----------------------------------------------------------------------------------------------
# 7. Prediction


PREDICTION_COLUMNS = [2, 3]  # the top classes' bars, then the text, the slider and the table


def _features_png(ctx: ViewContext) -> bytes:
    return pipeline_figures.vector_png(ctx.cap.logits, "pooled features", channels=None, width_px=PAGE_PX - 40)


def _top_k_png(ctx: ViewContext, k: int) -> bytes:
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, k)
    return prediction_figures.top_k_png([p.label for p in preds], [p.prob for p in preds],
                                        width_px=column_px(PREDICTION_COLUMNS, 0) - 10)


def _logits_png(ctx: ViewContext, k: int) -> bytes:
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, k)
    return prediction_figures.logits_png(ctx.cap.logits, [p.index for p in preds], [p.label for p in preds],
                                         width_px=PAGE_PX - 60)


@view("Prediction", family="lesson", order=7)
@st.fragment
def prediction_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    if not g.num_classes:
        st.markdown(text.PREDICTION)
        st.info(f"This model has no classifier head: its output is the pooled feature vector `{shape(cap.logits.shape)}`. "
                "Load weights with a head (or a fine-tuned checkpoint) to see predictions.")
        show_picture(cached_figure(_features_png, ctx), "features", f"{ctx.stem}_features")
        return
    left, right = st.columns(PREDICTION_COLUMNS)
    with right:
        st.markdown(text.PREDICTION)
        k = st.slider("How many classes to list", 1, min(20, g.num_classes), min(5, g.num_classes), key=session.K_TOPK)
    preds = analyses.top_k(cap.logits, ctx.loaded.labels, k)
    with left:
        show_picture(cached_figure(_top_k_png, ctx, k), "topk", f"{ctx.stem}_top{k}")
    with right:
        st.markdown("| # | class | index | probability | logit |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
            f"| {i + 1} | {markdown_literal(p.label)} | {p.index} | {p.prob:.2%} | {p.logit:.2f} |" for i, p in enumerate(preds)))
        if ctx.loaded.labels is None:
            st.caption("No label names for this head: class indices are shown. Upload a label file with your weights.")
    show_picture(cached_figure(_logits_png, ctx, k), "logits", f"{ctx.stem}_logits",
                 caption=f"all {g.num_classes} logits `{shape(cap.logits.shape)}`")


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def top_classes_figure(ctx: ViewContext, k: int) -> bytes:
    """The Prediction tab's top k classes with their probabilities: PNG bytes."""
    return cached_figure(_top_k_png, ctx, k)
