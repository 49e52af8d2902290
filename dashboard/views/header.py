"""The page's header above the tabs: the model, the image, the token counts and the prediction, and for the
bundled teaching model a plain sentence when an image is outside what it knows.
"""

from __future__ import annotations

import streamlit as st

from dashboard import text
from dashboard.image_choice import markdown_literal
from dashboard.views.context import ViewContext
from vit_core import TEACHING_MODEL, analyses

UNSURE_BELOW = 0.5  # the teaching model's top probability under which its answer is called a guess


def header(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.INTRO)
    top = analyses.top_k(cap.logits, ctx.loaded.labels, 1)[0]
    prediction = f"**{markdown_literal(top.label)}** ({top.prob:.1%})" if g.num_classes else "no classifier head"
    st.markdown(
        f"Model **{ctx.loaded.name}** ({ctx.loaded.weights}) · image **{markdown_literal(ctx.image.name)}** · "
        f"{len(g.prefix_names)} prefix + {g.num_patches} patch tokens of width {g.embed_dim}, "
        f"{g.num_layers} layers x {g.num_heads} heads · prediction {prediction}"
    )
    notice = outside_its_world(ctx.loaded.name, ctx.loaded.labels, top)
    if notice:
        st.info(notice, icon=":material/category:")


def outside_its_world(model_name: str, labels: tuple[str, ...] | None, top: analyses.Prediction) -> str | None:
    """For the bundled teaching model: a plain sentence when an image is outside what it knows (its `other`
    class wins, or no class is likely), so a selfie is never just called "cross (48 %)". None otherwise."""
    if model_name != TEACHING_MODEL or not labels:
        return None
    shapes = [label for label in labels if label != text.OTHER_CLASS]
    known = {"count": len(shapes), "shapes": ", ".join(shapes)}
    if top.label == text.OTHER_CLASS:
        return text.OUTSIDE_SHAPES_OTHER.format(**known, prob=top.prob)
    if top.prob < UNSURE_BELOW:
        return text.OUTSIDE_SHAPES_UNSURE.format(**known, label=top.label, prob=top.prob)
    return None
