"""The page's header above the tabs: one line with the model (marked when its weights are random), the image (and
which input it came from) and the prediction, the introduction behind an "About" button, and for the bundled
teaching model a plain sentence when an image is outside what it knows. With Draw on, the drawing's result beside
the canvas: the crop the model sees and its top classes. And the page's CSS (`compact_page`): less empty space, the
research tabs set apart.
"""

from __future__ import annotations

import streamlit as st

from dashboard import draw, text
from dashboard.figures import pipeline as pipeline_figures
from dashboard.inputs import SOURCE_WORDS
from dashboard.literal import markdown_literal
from dashboard.views import LESSON_VIEWS
from dashboard.views.context import ViewContext, cached_figure
from vit_core import TEACHING_MODEL, analyses

UNSURE_BELOW = 0.5  # the teaching model's top probability under which its answer is called a guess
DRAWING_CROP_SIDE = 232  # pixels: the crop beside the canvas, as tall as the canvas (draw.CANVAS_PX)
DRAWING_TOP = 5  # classes listed beside the canvas

# Streamlit leaves 6rem of empty space above the main area's content (its toolbar is 3.75rem high) and 5rem at its
# sides in the wide layout: with less of both, each tab's main figure fits in a projector's 720 px. The research
# tools after the lesson's tabs are set apart by a rule and a word: the tab row's ::before (its ::after is the row's
# underline), a flex item ordered between the lesson's tabs and the others, so part of no tab's name; with a little
# less space between the tabs (0.3rem: with five research tools, 0.45rem overflowed by 15 px) and the labels at 13 px
# (14 px overflowed by 43 px with the sixth, Compare), the row fits 1280 px with the sidebar open. On a phone (under
# 640 px) a line says where the inputs are.
PAGE_CSS = f"""
[data-testid="stMainBlockContainer"] {{ padding-top: 3.75rem; padding-bottom: 4rem; }}
@media (min-width: 736px) {{
  [data-testid="stMainBlockContainer"] {{ padding-left: 1.5rem; padding-right: 1.5rem; }}
}}
.st-key-view [role="tablist"] {{ gap: 0.3rem; }}
.st-key-view [role="tablist"] [data-testid="stTab"] p {{ font-size: 0.8125rem; }}
.st-key-view [role="tablist"] > [data-testid="stTab"]:nth-child(n+{len(LESSON_VIEWS) + 1}) {{ order: 2; }}
.st-key-view [role="tablist"]::before {{
  content: "Research:"; order: 1; align-self: center; white-space: nowrap;
  padding-left: 0.6rem; border-left: 2px solid rgba(49, 51, 63, 0.3); color: rgba(49, 51, 63, 0.7);
  font-size: 0.8rem;
}}
@media (min-width: 640px) {{ .st-key-phone_hint {{ display: none; }} }}
"""


def compact_page() -> None:
    """The page's CSS (PAGE_CSS): style tags only, so it takes no room on the page."""
    st.html(f"<style>{PAGE_CSS}</style>")


def header(ctx: ViewContext, source: str) -> None:
    """One line: the model, the image and the input it came from (`source`: a key of inputs.SOURCE_WORDS), the
    prediction; the introduction and the model's shapes behind "About"."""
    g, cap = ctx.loaded.geometry, ctx.cap
    top = analyses.top_k(cap.logits, ctx.loaded.labels, 1)[0]
    prediction = f"**{markdown_literal(top.label)}** ({top.prob:.1%})" if g.num_classes else "no classifier head"
    untrained = ctx.loaded.weights.startswith("random init")
    # random weights: a badge on the line (the sentence on hover and under About), not a box above every tab
    badge = " :orange-badge[:material/warning: RANDOM weights (untrained)]" if untrained else ""
    # no wrapping: a long model or file name wraps the line, never pushes "About" onto a row of its own
    with st.container(horizontal=True, vertical_alignment="center", wrap=False, key="page_header"):
        own = f" ({markdown_literal(ctx.loaded.weights)})" if ctx.loaded.weights.startswith("file: ") else ""  # a checkpoint
        st.markdown(f"Model **{ctx.loaded.name}**{own}{badge} · image **{markdown_literal(ctx.image.name)}** "
                    f"({SOURCE_WORDS.get(source, source)}) · prediction {prediction}", width="stretch",
                    help=text.UNTRAINED if untrained else None)
        with st.popover("About", icon=":material/info:"):
            if untrained:
                st.warning(text.UNTRAINED, icon=":material/warning:")
            st.markdown(text.INTRO)
            st.markdown(f"Model **{ctx.loaded.name}** ({ctx.loaded.weights}): {len(g.prefix_names)} prefix + "
                        f"{g.num_patches} patch tokens of width {g.embed_dim}, {g.num_layers} layers x "
                        f"{g.num_heads} heads.")
    with st.container(key="phone_hint"):
        st.caption(text.PHONE_HINT)
    notice = outside_its_world(ctx.loaded.name, ctx.loaded.labels, top)
    if notice:
        st.info(notice, icon=":material/category:")


def _drawing_crop_png(ctx: ViewContext) -> bytes:
    g = ctx.loaded.geometry
    return pipeline_figures.patch_grid_png(ctx.cap.input_image, g.grid, g.patch_size, DRAWING_CROP_SIDE,
                                           show_indices=False)


def drawing_result(ctx: ViewContext, area) -> None:
    """In `area` (beside the canvas): the crop the model sees, cut into its patches, and the top classes."""
    g = ctx.loaded.geometry
    crop_col, classes_col = area.columns(2)
    with crop_col:
        st.markdown("**What the model sees**")
        st.image(cached_figure(_drawing_crop_png, ctx), output_format="PNG",
                 caption=f"the crop, {g.grid[0]} x {g.grid[1]} patches")
    with classes_col:
        if not g.num_classes:
            st.info("This model has no classifier head.")
            return
        preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, min(DRAWING_TOP, g.num_classes))
        st.markdown(f"**Prediction: {markdown_literal(preds[0].label)}** ({preds[0].prob:.0%})")
        for p in preds:
            st.progress(min(1.0, max(0.0, p.prob)), text=f"{markdown_literal(p.label)} {p.prob:.1%}")
        note = draw.thickness_note(ctx.loaded.name, [p.label for p in preds])  # "ring", "circle" second: why
        if note:
            st.info(note, icon=":material/line_weight:")


def outside_its_world(model_name: str, labels: tuple[str, ...] | None, top: analyses.Prediction) -> str | None:
    """For the bundled teaching model: a plain sentence when an image is outside what it knows (its `other`
    class wins, or no class is likely), so a selfie is never just called "cross (48 %)". None otherwise."""
    if model_name != TEACHING_MODEL or not labels:
        return None
    shapes = [label for label in labels if label != text.OTHER_CLASS]
    known = {"count": len(shapes), "shapes": ", ".join(shapes)}
    if top.label == text.OTHER_CLASS:
        return f"{text.OUTSIDE_SHAPES_OTHER.format(**known, prob=top.prob)} {text.PHOTOS_OF_THE_WORLD}"
    if top.prob < UNSURE_BELOW:
        return text.OUTSIDE_SHAPES_UNSURE.format(**known, label=top.label, prob=top.prob)
    return None
