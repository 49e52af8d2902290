"""The Interventions tab: drop or mask patches (click them on the image), ablate heads, and see the prediction
change (definitions: docs/spec/analyses.md, "Why this prediction"). Each intervention's forward pass is cached per
(model, image, intervention) in `dashboard.caches`.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import interventions as intervention_figures
from dashboard.literal import markdown_literal as md  # class names come from uploaded label files
from dashboard.views.context import TARGET_CHOICES, ViewContext, cached_figure, column_px, no_head, show_picture, target_ui
from dashboard.views.registry import view
from vit_core import analyses


def percent(p: float) -> str:
    """A probability in percent: two decimals, or three significant digits below 1 % (an untrained model's
    probabilities are all small, and an intervention moves them in the third digit)."""
    return f"{p:.2%}" if p >= 0.01 else f"{p * 100:.3g}%"


def _ranked(predictions: list[analyses.Prediction]) -> str:
    """A numbered Markdown list of predictions, best first: `1. cat (42.0%)`."""
    return "\n".join(f"{i + 1}. {md(p.label)} ({p.prob:.1%})" for i, p in enumerate(predictions))


def _removed_patches_image(ctx: ViewContext, patches: tuple[int, ...], mode: str, encoding: str) -> bytes:
    g = ctx.loaded.geometry
    removed = intervention_figures.removed_patches_image(ctx.cap.input_image, g.grid, g.patch_size, patches, mode)
    return figures.encode(removed, encoding)


def _prediction_change_png(ctx: ViewContext, patches: tuple[int, ...], mode: str, heads: tuple[tuple[int, int], ...],
                           ablation: str, target: int) -> bytes:
    before = ctx.cap.probs  # (C,)
    after = analyses.softmax(_intervened_logits(ctx, patches, mode, heads, ablation))  # (C,)
    classes = _compared_classes(before, after, target)
    return intervention_figures.prediction_change_png([ctx.loaded.label(c) for c in classes], before[classes].tolist(),
                                                      after[classes].tolist(),
                                                      width_px=column_px(INTERVENTION_COLUMNS, 1) - 20)


def _intervened_logits(ctx: ViewContext, patches: tuple[int, ...], mode: str, heads: tuple[tuple[int, int], ...],
                       ablation: str) -> np.ndarray:
    """The logits (C,) after the intervention; the capture's own when nothing is changed."""
    if not patches and not heads:
        return ctx.cap.logits
    return caches.intervened_logits(ctx.request, ctx.loaded, ctx.image, ctx.cap, drop=patches if mode == "drop" else (),
                                    mask=patches if mode == "mask" else (), ablate=heads, ablation=ablation)


def _compared_classes(before: np.ndarray, after: np.ndarray, target: int, k: int = TARGET_CHOICES) -> list[int]:
    """The target, then the top k before, then any new classes in the top k after (in that order, no repeats)."""
    ranked = [target] + [int(i) for i in np.argsort(-before, kind="stable")[:k]] + \
             [int(i) for i in np.argsort(-after, kind="stable")[:k]]
    return list(dict.fromkeys(ranked))


def _intervention_name(patches: tuple[int, ...], mode: str, heads: tuple[tuple[int, int], ...], ablation: str) -> str:
    parts = []
    if patches:
        parts.append(f"{len(patches)} patch(es) {'dropped' if mode == 'drop' else 'masked'}")
    if heads:
        parts.append(f"{len(heads)} head(s) {ablation}-ablated")
    return ", ".join(parts) or "no intervention"


def _head_name(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


INTERVENTION_COLUMNS = [2, 3]  # the clickable crop, then the controls and the prediction's change


@view("Interventions", family="research", order=10)
@st.fragment
def interventions_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    if no_head(ctx):
        st.markdown(text.INTERVENE)
        return
    session.keep_interventions_for(ctx.request.key, ctx.image.sha)  # another image: no patches; another model: no heads
    left, right = st.columns(INTERVENTION_COLUMNS)
    with right:  # the controls first, in two rows, then what they change: both in the first screen at 1280 x 720
        c1, c2, c3 = st.columns([3, 2, 2])
        target = target_ui(ctx, c1)
        mode = c2.radio("Chosen patches are", ["drop", "mask"], key=session.K_INT_MODE, bind="query-params",
                        horizontal=True,
                        help="drop: the token is removed from the sequence; mask: its pixels become the normalisation mean")
        ablation = c3.radio("Ablation", ["zero", "mean"], key=session.K_INT_ABLATION, bind="query-params", horizontal=True,
                            help="the ablated heads' output set to 0, or to its mean over this image's tokens")
        c4, c5, c6 = st.columns([3, 2.6, 1.4], vertical_alignment="bottom")
        patches = c4.multiselect("Patches (or click the image)", list(range(g.num_patches)),
                                 key=session.K_INT_PATCHES, format_func=lambda k: f"patch {k}", persist_state="session",
                                 help="dropped or masked, as chosen above")
        heads = c5.multiselect("Heads to ablate",
                               [(layer, head) for layer in range(g.num_layers) for head in range(g.num_heads)],
                               key=session.K_INT_HEADS, format_func=_head_name, persist_state="session",
                               help="L = layer (0 = first block), H = head")
        patches, heads = tuple(sorted(patches)), tuple(sorted(heads))
        c6.button("Reset", key="int_reset", on_click=session.reset_intervention, icon=":material/restart_alt:",
                  disabled=not patches and not heads)
        result_area = st.container()
    logits = _intervened_logits(ctx, patches, mode, heads, ablation)  # (C,)
    with left:
        shown = cached_figure(_removed_patches_image, ctx, patches, mode, "jpeg")
        chart_key = f"int_click_{session.patch_clicks()}"  # a new chart after each click: see session.patch_clicks
        st.plotly_chart(figures.clickable_image_figure(shown, g.grid, g.patch_size, grid_lines=True,
                                                       height=column_px(INTERVENTION_COLUMNS, 0)),
                        key=chart_key, on_select=partial(session.patch_toggle_callback, chart_key),
                        selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", partial(_removed_patches_image, ctx, patches, mode, "png"),
                           file_name=f"{ctx.stem}_{mode}_{len(patches)}_patches.png", mime="image/png", key="dl_int_image",
                           icon=":material/download:", on_click="ignore", type="tertiary")
        st.caption(f"{len(patches)} of {g.num_patches} patches {'dropped' if mode == 'drop' else 'masked'}"
                   + (f"; the blocks see {g.num_tokens - len(patches)} tokens ({g.num_patches - len(patches)} patches"
                      f"{f' + {g.num_prefix_tokens} prefix' if g.num_prefix_tokens else ''})"
                      if mode == "drop" and patches else ""))
    with result_area:
        _prediction_change(ctx, logits, target, patches, mode, heads, ablation)
    st.markdown(text.INTERVENE)


def _prediction_change(ctx: ViewContext, logits: np.ndarray, target: int, patches: tuple[int, ...], mode: str,
                       heads: tuple[tuple[int, int], ...], ablation: str) -> None:
    """The prediction after the intervention beside the original: p_c with its change, both top-5 lists, one figure."""
    before, after = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, TARGET_CHOICES), analyses.top_k(
        logits, ctx.loaded.labels, TARGET_CHOICES)
    p_before, p_after = float(ctx.cap.probs[target]), float(analyses.softmax(logits)[target])
    change = (p_after - p_before) * 100  # percentage points
    m, a, b = st.columns([1.1, 1, 1])  # side by side: the figure below them still starts in the first screen
    m.metric(f"p(target) for {md(ctx.loaded.label(target))}", percent(p_after),
             delta=f"{change:+.3g} points" if change else "no change", delta_arrow="auto" if change else "off",
             help="the target class's probability after the intervention; the change is against the original image")
    a.markdown("**Original**\n\n" + _ranked(before))
    b.markdown(f"**After: {_intervention_name(patches, mode, heads, ablation)}**\n\n" + _ranked(after))
    show_picture(cached_figure(_prediction_change_png, ctx, patches, mode, heads, ablation, target), "int_change",
                 f"{ctx.stem}_intervention")
