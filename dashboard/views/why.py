"""The Why? tab: every method's relevance map for a target class, tested by its deletion and insertion curves
against random patch orders (definitions: docs/spec/analyses.md, "Why this prediction").

Like the other views it never calls the model itself: the relevance maps come from `dashboard.caches` (cached per
model, image and target, computed by `vit_core.explain`); the deletion / insertion curves only when the user asks
for them (a button), as they cost many forwards.
"""

from __future__ import annotations

from functools import partial

import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import why as why_figures
from dashboard.image_choice import markdown_literal as md  # class names come from uploaded label files
from dashboard.views.context import ViewContext, cached_figure, no_head, shape, show_picture, target_ui
from vit_core import explain

STEP_CHOICES = (5, 10, 20)  # S: points per deletion / insertion curve (the spec's default: 10)


def _method_title(method: str) -> str:
    """A method's name as the tabs show it (its key where text.py has no title)."""
    return text.METHOD_TITLES.get(method, method)


def _relevance_overlay(ctx: ViewContext, target: int, method: str, encoding: str) -> bytes:
    """One method's relevance map for `target` over the crop (min-max scaled for display), enlarged."""
    g, cap = ctx.loaded.geometry, ctx.cap
    amap = caches.relevance(ctx.request, ctx.loaded, ctx.image, cap, target).maps[method]  # (gh, gw)
    scale = figures.display_scale(cap.input_image.shape[1], 256)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, amap, g.patch_size), scale), encoding)


def _curves_png(ctx: ViewContext, target: int, steps: int, methods: tuple[str, ...]) -> bytes:
    return _curves_figure(ctx, caches.faithfulness_result(ctx.request, ctx.image, target, steps), steps, methods)


def _curves_figure(ctx: ViewContext, result: explain.Faithfulness, steps: int, methods: tuple[str, ...]) -> bytes:
    """The curves of `methods` that `result` holds (all, or those finished so far) and the random baseline's."""
    shown = [m for m in methods if m in result.deletion] + [explain.RANDOM]
    title = {m: _method_title(m) for m in methods} | {explain.RANDOM: explain.RANDOM}
    return why_figures.faithfulness_curves_png(
        {title[m]: result.deletion[m] for m in shown}, {title[m]: result.insertion[m] for m in shown},
        result.random_deletion_std, result.random_insertion_std,
        title=f"target {ctx.loaded.label(result.target)}: {steps} steps over {ctx.loaded.geometry.num_patches} patches")


def why_view(ctx: ViewContext) -> None:
    st.markdown(text.WHY)
    if no_head(ctx):
        return
    _explanations(ctx)
    st.markdown(text.WHY_DISAGREE)


@st.fragment
def _explanations(ctx: ViewContext) -> None:
    c1, c2, c3 = st.columns([2, 3, 1])
    target = target_ui(ctx, c1)
    methods = c2.pills("Methods", list(explain.METHODS), selection_mode="multi", default=list(explain.METHODS),
                       key=session.K_METHODS, bind="query-params", format_func=_method_title)
    steps = c3.selectbox("Curve steps S", STEP_CHOICES, index=STEP_CHOICES.index(10), key=session.K_STEPS,
                         bind="query-params", help=text.FAITHFULNESS_HOW)
    methods = [m for m in explain.METHODS if m in methods]  # display order, whatever order they were picked in
    if not methods:
        st.info("Pick at least one method.")
        return
    relevance = caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)
    result = caches.faithfulness_result(ctx.request, ctx.image, target, steps)
    maps_area = st.container()  # filled last: the button below may have just computed the curves' areas
    st.divider()
    if result is None:
        result = _curves_button(ctx, relevance, steps)
    if result is not None:
        _curves(ctx, result, target, steps, methods)
    with maps_area:
        _method_columns(ctx, relevance, result, methods)


def _method_columns(ctx: ViewContext, relevance: explain.Relevance, result: explain.Faithfulness | None,
                    methods: list[str]) -> None:
    """One column per method: its map over the crop (or why it has none), its curves' areas, what it computes."""
    g, target = ctx.loaded.geometry, relevance.target
    for method, col in zip(methods, st.columns(len(methods)), strict=True):
        with col:
            st.markdown(f"**{_method_title(method)}**")
            if method in relevance.maps:
                show_picture(cached_figure(_relevance_overlay, ctx, target, method, "jpeg"), f"why_{method}",
                             f"{ctx.stem}_{method}_class{target}", png=partial(_relevance_overlay, ctx, target, method, "png"))
                if result is not None and method in result.deletion_auc:
                    verdict = "beats random" if result.beats_random[method] else "does not beat random"
                    st.markdown(f"deletion AUC **{result.deletion_auc[method]:.3g}** · insertion AUC "
                                f"**{result.insertion_auc[method]:.3g}** · {verdict}")
            else:
                st.info(relevance.unsupported.get(method, "Not computed for this model."))
            st.caption(text.METHOD_TEXTS.get(method, ""))
    st.caption(f"maps `{shape(g.grid, batch=False)}` over the {g.num_patches} patches, for class "
               f"**{md(ctx.loaded.label(target))}** ({target}); each min-max scaled for display, exported unscaled.")


def _curves_button(ctx: ViewContext, relevance: explain.Relevance, steps: int) -> explain.Faithfulness | None:
    """The button that computes the curves: once clicked, a progress bar advanced as each unit finishes (the random
    baseline first, then method by method), and each finished method's AUCs and curves shown at once. -> the curves."""
    n = len(relevance.maps)
    slot = st.empty()  # the heading and button: gone once the curves are there (they are drawn in this same run)
    with slot.container():
        st.markdown(f"**Faithfulness.** {text.FAITHFULNESS_HOW}")
        clicked = st.button(f"Compute the deletion and insertion curves ({n} maps + {explain.RANDOM_ORDERS} random orders, "
                            f"{steps} steps)",
                            key="why_curves", icon=":material/query_stats:", type="primary")
    if not clicked:
        return None
    bar = st.progress(0.0, text=f"random baseline ({explain.RANDOM_ORDERS} orders), then {n} maps one by one...")
    live = st.empty()  # the finished methods so far: replaced by the full table and figure (with downloads) at the end
    methods = tuple(m for m in explain.METHODS if m in relevance.maps)

    def progress(fraction: float, message: str) -> None:  # after each unit: the random baseline, then each method
        bar.progress(min(1.0, max(0.0, float(fraction))), text=message)

    def show_partial(partial: explain.Faithfulness) -> None:
        with live.container():
            st.image(_curves_figure(ctx, partial, steps, methods), width=1100)
            pending = [_method_title(m) for m in methods if m not in partial.deletion]
            st.markdown(_auc_table(partial, [m for m in methods if m in partial.deletion]))
            if pending:
                st.caption("still running: " + ", ".join(pending))

    result = caches.compute_faithfulness(ctx.request, ctx.loaded, ctx.image, ctx.cap, relevance, steps, progress, show_partial)
    bar.empty()
    live.empty()
    slot.empty()
    return result


def _auc_table(result: explain.Faithfulness, names: list[str]) -> str:
    """The AUCs of the methods `names` (all finished) and of the random baseline, as a Markdown table."""
    rows = [f"| {_method_title(m)} | {result.deletion_auc[m]:.3g} | {result.insertion_auc[m]:.3g} | "
            f"{'yes' if result.beats_random[m] else 'no'} |" for m in names]
    rows.append(f"| random (mean of {explain.RANDOM_ORDERS} orders) | {result.deletion_auc[explain.RANDOM]:.3g} | "
                f"{result.insertion_auc[explain.RANDOM]:.3g} | |")
    return ("| method | deletion AUC (lower is better) | insertion AUC (higher is better) | beats random |\n"
            "| --- | --- | --- | --- |\n" + "\n".join(rows))


def _curves(ctx: ViewContext, result: explain.Faithfulness, target: int, steps: int, methods: list[str]) -> None:
    st.markdown(f"**Faithfulness.** {text.FAITHFULNESS_HOW}")
    names = [m for m in methods if m in result.deletion_auc]
    show_picture(cached_figure(_curves_png, ctx, target, steps, tuple(names)), "why_curves_png",
                 f"{ctx.stem}_faithfulness_class{target}_S{steps}", width=1100)
    left, _ = st.columns([3, 1])
    with left:
        st.markdown(_auc_table(result, names))
        st.caption(f"curves of `{shape((steps,), batch=False)}` points each; the random band is the mean +- one standard "
                   f"deviation of the {explain.RANDOM_ORDERS} orders.")
