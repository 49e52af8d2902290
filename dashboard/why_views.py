"""The "why this prediction" tabs: explanations tested by their faithfulness curves, live interventions,
and the logit lens (definitions: shared/spec/analyses.md, "Why this prediction").

Like the other views, these never call the model themselves: explanations, interventions and the
logit lens come from `dashboard.state` (cached per model, image and setting, computed by
`vit_core.explain`); the deletion / insertion curves only when the user asks for them (a button), as
they cost many forwards. Figures come from `dashboard.figures` through the small builders beside
each view, keyed by `cached_figure` on exactly their arguments.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from dashboard import figures, process, state, text
from dashboard.image_choice import markdown_literal as md  # class names come from uploaded label files
from dashboard.view_context import ViewContext, cached_figure, shape, show_picture
from vit_core import analyses, explain, export

TARGET_CHOICES = 5  # the target class is picked from the top 5
STEP_CHOICES = (5, 10, 20)  # S: points per deletion / insertion curve (the spec's default: 10)
LENS_CLASSES = 5  # the logit lens strip shows every class that is in the top 5 after some layer...
MAX_LENS_COLUMNS = 16  # ...up to this many, the final prediction's first


def percent(p: float) -> str:
    """A probability in percent: two decimals, or three significant digits below 1 % (an untrained model's
    probabilities are all small, and an intervention moves them in the third digit)."""
    return f"{p:.2%}" if p >= 0.01 else f"{p * 100:.3g}%"


def _method_title(method: str) -> str:
    """A method's name as the tabs show it (its key where text.py has no title)."""
    return text.METHOD_TITLES.get(method, method)


def _ranked(predictions: list[analyses.Prediction]) -> str:
    """A numbered Markdown list of predictions, best first: `1. cat (42.0%)`."""
    return "\n".join(f"{i + 1}. {md(p.label)} ({p.prob:.1%})" for i, p in enumerate(predictions))


def _no_head(ctx: ViewContext) -> bool:
    """True (with a note) for a model without a classifier head: no class to explain."""
    if ctx.loaded.geometry.num_classes:
        return False
    st.info("This model has no classifier head, so there is no class to explain. Load weights with a head "
            "(or a fine-tuned checkpoint) to use this tab.")
    return True


def _target_ui(ctx: ViewContext, container) -> int:
    """The target class, chosen from the top 5 (bound to `?target=`); the top-1 by default."""
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, TARGET_CHOICES)
    probs = {p.index: p.prob for p in preds}
    return container.selectbox(
        "Target class (from the top 5)", [p.index for p in preds], key=state.K_TARGET, bind="query-params",
        format_func=lambda i: f"{i}: {ctx.loaded.label(i)}",
        help="The class whose prediction is explained. " + ", ".join(f"{md(ctx.loaded.label(i))} {p:.1%}"
                                                                   for i, p in probs.items()))


# ----------------------------------------------------------------------------------------------
# 8. Why? Relevance maps of every method, and their deletion / insertion curves


def _relevance_overlay(ctx: ViewContext, target: int, method: str, encoding: str) -> bytes:
    """One method's relevance map for `target` over the crop (min-max scaled for display), enlarged."""
    g, cap = ctx.loaded.geometry, ctx.cap
    amap = state.relevance(ctx.request, ctx.loaded, ctx.image, cap, target).maps[method]  # (gh, gw)
    scale = figures.display_scale(cap.input_image.shape[1], 256)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, amap, g.patch_size), scale), encoding)


def _curves_png(ctx: ViewContext, target: int, steps: int, methods: tuple[str, ...]) -> bytes:
    return _curves_figure(ctx, state.faithfulness_result(ctx.request, ctx.image, target, steps), steps, methods)


def _curves_figure(ctx: ViewContext, result: explain.Faithfulness, steps: int, methods: tuple[str, ...]) -> bytes:
    """The curves of `methods` that `result` holds (all, or those finished so far) and the random baseline's."""
    shown = [m for m in methods if m in result.deletion] + [explain.RANDOM]
    title = {m: _method_title(m) for m in methods} | {explain.RANDOM: explain.RANDOM}
    return figures.faithfulness_curves_png(
        {title[m]: result.deletion[m] for m in shown}, {title[m]: result.insertion[m] for m in shown},
        result.random_deletion_std, result.random_insertion_std,
        title=f"target {ctx.loaded.label(result.target)}: {steps} steps over {ctx.loaded.geometry.num_patches} patches")


def why_view(ctx: ViewContext) -> None:
    st.markdown(text.WHY)
    if _no_head(ctx):
        return
    _explanations(ctx)
    st.markdown(text.WHY_DISAGREE)


@st.fragment
def _explanations(ctx: ViewContext) -> None:
    c1, c2, c3 = st.columns([2, 3, 1])
    target = _target_ui(ctx, c1)
    methods = c2.pills("Methods", list(explain.METHODS), selection_mode="multi", default=list(explain.METHODS),
                       key=state.K_METHODS, bind="query-params", format_func=_method_title)
    steps = c3.selectbox("Curve steps S", STEP_CHOICES, index=STEP_CHOICES.index(10), key=state.K_STEPS,
                         bind="query-params", help=text.FAITHFULNESS_HOW)
    methods = [m for m in explain.METHODS if m in methods]  # display order, whatever order they were picked in
    if not methods:
        st.info("Pick at least one method.")
        return
    relevance = state.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)
    result = state.faithfulness_result(ctx.request, ctx.image, target, steps)
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

    result = state.compute_faithfulness(ctx.request, ctx.loaded, ctx.image, ctx.cap, relevance, steps, progress, show_partial)
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


# ----------------------------------------------------------------------------------------------
# 9. Interventions: drop or mask patches, ablate heads


def _removed_patches_image(ctx: ViewContext, patches: tuple[int, ...], mode: str, encoding: str) -> bytes:
    g = ctx.loaded.geometry
    return figures.encode(figures.removed_patches_image(ctx.cap.input_image, g.grid, g.patch_size, patches, mode), encoding)


def _prediction_change_png(ctx: ViewContext, patches: tuple[int, ...], mode: str, heads: tuple[tuple[int, int], ...],
                           ablation: str, target: int) -> bytes:
    before = ctx.cap.probs  # (C,)
    after = analyses.softmax(_intervened_logits(ctx, patches, mode, heads, ablation))  # (C,)
    classes = _compared_classes(before, after, target)
    return figures.prediction_change_png([ctx.loaded.label(c) for c in classes], before[classes].tolist(),
                                         after[classes].tolist(), title=_intervention_name(patches, mode, heads, ablation))


def _intervened_logits(ctx: ViewContext, patches: tuple[int, ...], mode: str, heads: tuple[tuple[int, int], ...],
                       ablation: str) -> np.ndarray:
    """The logits (C,) after the intervention; the capture's own when nothing is changed."""
    if not patches and not heads:
        return ctx.cap.logits
    return state.intervened_logits(ctx.request, ctx.loaded, ctx.image, ctx.cap, drop=patches if mode == "drop" else (),
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


@st.fragment
def interventions_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    st.markdown(text.INTERVENE)
    if _no_head(ctx):
        return
    state.keep_interventions_for(ctx.request.key, ctx.image.sha)  # another image: no patches; another model: no heads
    c1, c2, c3, c4 = st.columns([2, 1, 3, 1])
    target = _target_ui(ctx, c1)
    mode = c2.radio("Chosen patches are", ["drop", "mask"], key=state.K_INT_MODE, bind="query-params",
                    help="drop: the token is removed from the sequence; mask: its pixels become the normalisation mean")
    heads = c3.multiselect("Heads to ablate", [(layer, head) for layer in range(g.num_layers) for head in range(g.num_heads)],
                           key=state.K_INT_HEADS, format_func=_head_name, persist_state="session",
                           help="L = layer (0 = first block), H = head")
    ablation = c4.radio("Ablation", ["zero", "mean"], key=state.K_INT_ABLATION, bind="query-params",
                        help="the head's output set to 0, or to its mean over this image's tokens")
    patches = st.multiselect("Patches to drop or mask (or click them on the image)", list(range(g.num_patches)),
                             key=state.K_INT_PATCHES, format_func=lambda k: f"patch {k}", persist_state="session")
    patches, heads = tuple(sorted(patches)), tuple(sorted(heads))
    st.button("Reset", key="int_reset", on_click=state.reset_intervention, icon=":material/restart_alt:",
              disabled=not patches and not heads)
    logits = _intervened_logits(ctx, patches, mode, heads, ablation)  # (C,)
    left, right = st.columns([2, 3])
    with left:
        shown = cached_figure(_removed_patches_image, ctx, patches, mode, "jpeg")
        chart_key = f"int_click_{state.patch_clicks()}"  # a new chart after each click: see state.patch_clicks
        st.plotly_chart(figures.clickable_image_figure(shown, g.grid, g.patch_size), key=chart_key,
                        on_select=partial(state.patch_toggle_callback, chart_key), selection_mode="points",
                        config={"displayModeBar": False})
        st.download_button("PNG", partial(_removed_patches_image, ctx, patches, mode, "png"),
                           file_name=f"{ctx.stem}_{mode}_{len(patches)}_patches.png", mime="image/png", key="dl_int_image",
                           icon=":material/download:", on_click="ignore", type="tertiary")
        st.caption(f"{len(patches)} of {g.num_patches} patches {'dropped' if mode == 'drop' else 'masked'}"
                   + (f"; the blocks see {g.num_tokens - len(patches)} tokens ({g.num_patches - len(patches)} patches"
                      f"{f' + {g.num_prefix_tokens} prefix' if g.num_prefix_tokens else ''})"
                      if mode == "drop" and patches else ""))
    with right:
        _prediction_change(ctx, logits, target, patches, mode, heads, ablation)


def _prediction_change(ctx: ViewContext, logits: np.ndarray, target: int, patches: tuple[int, ...], mode: str,
                       heads: tuple[tuple[int, int], ...], ablation: str) -> None:
    """The prediction after the intervention beside the original: p_c with its change, both top-5 lists, one figure."""
    before, after = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, TARGET_CHOICES), analyses.top_k(
        logits, ctx.loaded.labels, TARGET_CHOICES)
    p_before, p_after = float(ctx.cap.probs[target]), float(analyses.softmax(logits)[target])
    change = (p_after - p_before) * 100  # percentage points
    st.metric(f"p(target) for {md(ctx.loaded.label(target))}", percent(p_after),
              delta=f"{change:+.3g} points" if change else "no change", delta_arrow="auto" if change else "off",
              help="the target class's probability after the intervention; the change is against the original image")
    a, b = st.columns(2)
    a.markdown("**Original**\n\n" + _ranked(before))
    b.markdown(f"**After: {_intervention_name(patches, mode, heads, ablation)}**\n\n" + _ranked(after))
    show_picture(cached_figure(_prediction_change_png, ctx, patches, mode, heads, ablation, target), "int_change",
                 f"{ctx.stem}_intervention")


# ----------------------------------------------------------------------------------------------
# 10. Logit lens


def lens_classes(probs: np.ndarray, k: int = LENS_CLASSES, limit: int = MAX_LENS_COLUMNS) -> list[int]:
    """The classes in the top k of some row of `probs` (L+1, C): the final row's top k first (best first),
    then the others by their best probability over the layers; at most `limit`."""
    final = [int(i) for i in np.argsort(-probs[-1], kind="stable")[:k]]
    anywhere = {int(i) for row in probs for i in np.argsort(-row, kind="stable")[:k]} - set(final)
    others = sorted(anywhere, key=lambda c: (-float(probs[:, c].max()), c))
    return (final + others)[:limit]


def _lens_strip_png(ctx: ViewContext) -> bytes:
    lens = state.logit_lens(ctx.request.key, ctx.image.sha, ctx.loaded, ctx.cap)  # (L+1, C)
    probs = analyses.softmax(lens)  # (L+1, C)
    classes = lens_classes(probs)
    return figures.logit_lens_strip_png(probs[:, classes], [ctx.loaded.label(c) for c in classes],
                                        title=f"logit lens {shape(lens.shape, batch=False)}: the top classes after each block")


def _patch_lens_png(ctx: ViewContext, layer: int) -> bytes:
    g = ctx.loaded.geometry
    probs = analyses.softmax(state.patch_logit_lens(ctx.request.key, ctx.image.sha, layer, ctx.loaded, ctx.cap))  # (N, C)
    top = probs.argmax(axis=1)  # (N,)
    classes, best = top.reshape(g.grid), probs[np.arange(len(top)), top].reshape(g.grid)  # (gh, gw) each
    where = "the embeddings entering block 0" if layer == 0 else figures.lens_row_name(layer)
    return figures.patch_lens_png(ctx.cap.input_image, classes, best, {int(c): ctx.loaded.label(int(c)) for c in set(top)},
                                  g.patch_size, title=f"each patch's top-1 class, {where}")


def logit_lens_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    st.markdown(text.LOGIT_LENS)
    if _no_head(ctx):
        return
    lens = state.logit_lens(ctx.request.key, ctx.image.sha, ctx.loaded, ctx.cap)  # (L+1, C)
    show_picture(cached_figure(_lens_strip_png, ctx), "lens_strip", f"{ctx.stem}_logit_lens")
    tops = lens.argmax(axis=1)  # (L+1,)
    final = int(tops[-1])
    settled = next(layer for layer in range(len(tops)) if (tops[layer:] == final).all())
    st.caption(f"logit lens `{shape(lens.shape, batch=False)}` ({g.num_layers} blocks + the embeddings, {lens.shape[1]} "
               f"classes), each row through softmax; max |last row - logits| = {np.abs(lens[-1] - ctx.cap.logits).max():.1e}. "
               f"The top-1 class is **{md(ctx.loaded.label(final))}** from "
               + ("the embeddings on." if settled == 0 else f"block {settled - 1} on."))
    _patch_lens(ctx)


@st.fragment
def _patch_lens(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    layer = st.select_slider("Patch tokens of", list(range(g.num_layers + 1)), value=g.num_layers, key=state.K_LENS_LAYER,
                             format_func=figures.lens_row_name, bind="query-params",
                             help="the logit lens's rows: the embeddings entering block 0, then the tokens after each block")
    show_picture(cached_figure(_patch_lens_png, ctx, layer), "lens_patches", f"{ctx.stem}_patch_lens_{layer}", width=640)
    st.caption(f"patch tokens {figures.lens_row_name(layer)} `{shape((g.num_patches, g.embed_dim))}` -> norm, fc_norm, head, one "
               "at a time: the colour is each patch's top-1 class, pale when it is unsure; the number its probability in %.")


# ----------------------------------------------------------------------------------------------
# Sidebar: the export with the explanations


def export_ui(ctx: ViewContext) -> None:
    """The sidebar's download of every array of this image plus the explanation keys (interface.md), built on click
    from what the views computed: the deletion / insertion curves are in it once computed in the Why? tab."""
    if not ctx.loaded.geometry.num_classes:
        return
    request, loaded, image, cap = ctx.request, ctx.loaded, ctx.image, ctx.cap

    def npz() -> bytes:  # made on click, on a download lane
        return export.npz_bytes(export.analysis_arrays(loaded, cap) | state.explanation_arrays(request, loaded, image, cap))

    st.download_button("All arrays + explanations (.npz)", data=process.made_at_low_priority(npz),
                       file_name=f"{ctx.stem}_explained.npz", mime="application/zip", key="dl_npz_explained",
                       on_click="ignore", icon=":material/download:",
                       help="the arrays above plus the target class, every relevance map, the logit lens and the token "
                            "norms; the deletion and insertion curves once computed in the Why? tab")
