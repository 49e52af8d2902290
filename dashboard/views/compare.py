"""The Compare tab: the model on screen (A) beside a second model (B) - a checkpoint, another model, or A's own random
init in one click - on the image on screen and over a set (definitions: docs/spec/analyses.md, "Two models").

For the image: both predictions and their KL, A | B | B - A of one attention row (block, head, query) and of the
rollout, and the logit lens of both. For a set of drawn Shapes: the CKA of every pair of residual rows, the heads
whose attention changed most, both models' mean attention distance in one chart, the images whose answer changed.
The offline story is the first choice: the Shapes ViT against its own random init shows what training made of it.
Model B and the attention row's controls are bound to the URL beside the sidebar's model and the tab, so the page's
link keeps both models and the view; a changed image of the set clicked is shown above instead of the sidebar's image.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import streamlit as st

import vit_core
from dashboard import caches, compare_models, models, session
from dashboard.figures import compare as compare_figures
from dashboard.literal import markdown_literal as md  # class names come from uploaded label files
from dashboard.views.context import ViewContext, column_px, show_picture
from dashboard.views.registry import view
from vit_core import analyses
from vit_core.compare import Comparable, comparable
from vit_core.compare.files import compare_arrays, heads_most_changed
from vit_core.loading.weights import WEIGHT_SUFFIXES

# The URL's parameters of a link to this tab (with the sidebar's `model` and the tab's `view`).
K_MODEL_B, K_LAYER, K_HEAD, K_QUERY = "model_b", "compare_layer", "compare_head", "compare_query"
K_SET = "compare_set"  # the set's Compare button (its key's prefix)
B_WEIGHTS_FILE = "A weights file of A's architecture..."
K_OPEN, K_BACK = "compare_open", "compare_back"  # a changed image's Open button (its key's prefix), Back to the sidebar's
CHANGED_SHOWN = 8  # changed images shown with a button each
CLASS_TOKEN = "class token"
TOP = 3  # predictions listed per model
MOST_CHANGED_SHOWN = 5

INTRO = ("**Two models side by side.** A is the model chosen in the sidebar; pick B below. *Random init of A* is A's "
         "architecture with random weights: what training changed inside it. Red in a B - A map: B attends there more.")


@view("Compare", family="research", order=60)
def compare_view(ctx: ViewContext) -> None:
    labels = models.model_choices() | {models.UPLOAD_WEIGHTS: B_WEIGHTS_FILE}  # the file choice only where uploads are on
    options = [compare_models.RANDOM_INIT_OF_A, *(n for n in labels if n != models.UPLOAD_WEIGHTS),
               *([models.UPLOAD_WEIGHTS] if models.weights_uploads_allowed() else [])]
    picker, *predicted = st.columns(3)
    choice = picker.selectbox("Model B", options, key=K_MODEL_B, format_func=lambda n: labels.get(n, n), bind="query-params",
                              help="Random init of A: A's architecture with random weights (what training changed). "
                                   "A weights file: a checkpoint of A's architecture (what fine-tuning changed).")
    uploaded = picker.file_uploader(
        f"B's weights file (A's architecture; up to {models.MAX_WEIGHTS_MB} MB)", key=session.K_WEIGHTS_B,
        type=[s.lstrip(".") for s in WEIGHT_SUFFIXES], max_upload_size=models.MAX_WEIGHTS_MB,
        help="safetensors preferred; .pth/.pt/.bin are loaded with weights_only (no code runs)",
    ) if choice == models.UPLOAD_WEIGHTS else None
    if choice == models.UPLOAD_WEIGHTS and uploaded is None:
        st.info("Upload B's weights file: a checkpoint of A's architecture, such as A after fine-tuning.")
        return
    try:
        ctx = _opened(ctx)
    except vit_core.ViTLensError as e:
        st.error(str(e))
        return
    upload_b = (compare_models.uploaded_b(ctx.request, ctx.loaded, *session.save_upload(uploaded), uploaded.name)
                if uploaded is not None else None)
    try:
        with st.spinner("Loading model B and running it on this image..."):
            request_b, loaded_b = compare_models.model_b(choice, ctx.request, ctx.loaded, upload_b)
            cap_b = caches.shared_capture(request_b, loaded_b, ctx.image)
    except vit_core.ViTLensError as e:
        st.error(upload_b.for_user(str(e)) if upload_b else str(e))  # the user's file name, not the server's copy
        return
    which = comparable(ctx.loaded.geometry, loaded_b.geometry)
    _predictions(ctx, loaded_b, cap_b, predicted)
    _attention(ctx, loaded_b, cap_b, which)
    st.markdown(INTRO)
    st.caption(f"A: {md(ctx.loaded.name)} ({md(ctx.loaded.weights)}) - B: {md(loaded_b.name)} ({md(loaded_b.weights)})")
    _agreement(ctx, cap_b, which)
    _rollout_and_lens(ctx, request_b, loaded_b, cap_b, which)
    st.divider()
    _over_a_set(ctx, request_b, loaded_b, which)


def _opened(ctx: ViewContext) -> ViewContext:
    """The page's context on the set image opened from the changed ones (A's capture of it), said above with a button
    back to the sidebar's image; `ctx` itself when none is open."""
    opened = session.compare_opened()
    if opened is None:
        return ctx
    name, data = opened
    image = caches.decode(name, data)
    said, back = st.columns([4, 1])
    said.info(f"Showing **{md(name)}**, an image of the set below whose answer changed, instead of the sidebar's "
              f"{md(ctx.image.name)}.", icon=":material/compare:")
    back.button("Back to the sidebar's image", key=K_BACK, on_click=session.open_compare_image, args=(None,))
    return dataclasses.replace(ctx, cap=caches.shared_capture(ctx.request, ctx.loaded, image), image=image)


def _predictions(ctx: ViewContext, loaded_b, cap_b, columns) -> None:
    """Each model's top classes, one line each, beside the picker."""
    for column, name, loaded, cap in ((columns[0], "A", ctx.loaded, ctx.cap), (columns[1], "B", loaded_b, cap_b)):
        top = analyses.top_k(cap.logits, loaded.labels, TOP)
        column.markdown(f"**{name} predicts**  \n" + ", ".join(f"{md(p.label)} {p.prob:.0%}" for p in top))


def _agreement(ctx: ViewContext, cap_b, which: Comparable) -> None:
    if not which.classes:
        st.info(dict(which.skipped)["kl"])
        return
    from vit_core.compare import prediction_kl

    same = int(np.argmax(ctx.cap.logits)) == int(np.argmax(cap_b.logits))
    st.metric("KL(A || B)", f"{float(prediction_kl(ctx.cap.logits, cap_b.logits)):.3g} nats",
              "same top-1" if same else "top-1 changed", delta_color="off", delta_arrow="off")


@st.fragment
def _attention(ctx: ViewContext, loaded_b, cap_b, which: Comparable) -> None:
    ga, gb = ctx.loaded.geometry, loaded_b.geometry
    left, middle, right = st.columns(3)
    layer = left.slider("Block", 0, min(ga.num_layers, gb.num_layers) - 1, key=K_LAYER, bind="query-params")
    head = middle.slider("Head", 0, min(ga.num_heads, gb.num_heads) - 1, key=K_HEAD, bind="query-params")
    queries = ([CLASS_TOKEN] if ga.has_class_token and gb.has_class_token else []) + \
        ([f"patch {k}" for k in range(ga.num_patches)] if ga.grid == gb.grid else [])
    if not queries:
        st.info("A and B share no query token (their grids differ and one has no class token): no attention row to compare.")
        return
    query = right.selectbox("Query", queries, key=K_QUERY, bind="query-params")
    rows = []
    for cap, g in ((ctx.cap, ga), (cap_b, gb)):
        q = 0 if query == CLASS_TOKEN else g.num_prefix_tokens + int(query.split()[1])
        rows.append(cap.pattern[layer, head, q, g.num_prefix_tokens:].reshape(g.grid))  # (T,) -> (N,) -> (gh, gw)
    titles = (f"A: block {layer}, head {head}", f"B: block {layer}, head {head}",
              "B - A" if which.grid else "B - A: grids differ")
    png = compare_figures.triplet_png(ctx.cap.input_image, rows[0], ga.patch_size, cap_b.input_image, rows[1],
                                      gb.patch_size, titles, side=_tile_side())
    show_picture(png, "compare_attention", f"compare_attention_{layer}_{head}", caption=f"Attention of the {query}")


def _tile_side() -> int:
    """Three tiles in a row, small enough that the first one's whole figure is in a projector's first 720 px."""
    return min(column_px([1], 0) // 3 - 12, 210)


def _rollout_and_lens(ctx: ViewContext, request_b, loaded_b, cap_b, which: Comparable) -> None:
    ga, gb = ctx.loaded.geometry, loaded_b.geometry
    rollout_a = caches.lens_arrays(ctx.request, ctx.loaded, ctx.image, ctx.cap, "rollout")["rollout"]  # (gh, gw)
    rollout_b = caches.lens_arrays(request_b, loaded_b, ctx.image, cap_b, "rollout")["rollout"]  # mean, all blocks
    png = compare_figures.triplet_png(ctx.cap.input_image, rollout_a, ga.patch_size, cap_b.input_image, rollout_b,
                                      gb.patch_size, ("A: rollout", "B: rollout", "B - A" if which.grid else "grids differ"),
                                      side=_tile_side())
    show_picture(png, "compare_rollout", "compare_rollout", caption="Attention rollout (mean over heads, all blocks)")
    if not which.classes:
        st.info(dict(which.skipped)["kl"])
        return
    top = int(np.argmax(ctx.cap.logits))
    lens_a = caches.lens_arrays(ctx.request, ctx.loaded, ctx.image, ctx.cap, "logit_lens")["logit_lens"]  # (La+1, C)
    lens_b = caches.lens_arrays(request_b, loaded_b, ctx.image, cap_b, "logit_lens")["logit_lens"]  # (Lb+1, C)
    prob_a, prob_b = analyses.softmax(lens_a)[:, top], analyses.softmax(lens_b)[:, top]  # (La+1,), (Lb+1,)
    show_picture(compare_figures.lens_both_png(prob_a, prob_b, ctx.loaded.label(top), width_px=column_px([1, 1], 0)),
                 "compare_lens", "compare_logit_lens",
                 caption=f"Logit lens: the probability of A's answer ({ctx.loaded.label(top)}) after each block")


def _over_a_set(ctx: ViewContext, request_b, loaded_b, which: Comparable) -> None:
    st.markdown(f"**Over a set:** {compare_models.SET_SIZE} drawn Shapes (the same images for every pair of models).")
    asked = session.compare_set_asked() == (ctx.request.key, request_b.key)
    if not asked:
        if st.button(f"Compare A and B on {compare_models.SET_SIZE} drawn Shapes", key=f"{K_SET}_run",
                     icon=":material/compare:"):
            session.ask_compare_set((ctx.request.key, request_b.key))
            asked = True
        else:
            return
    try:
        with st.spinner("Running both models over the set..."):
            a, b, totals, sources = compare_models.set_comparison(ctx.request.key, request_b.key, ctx.loaded, loaded_b)
    except vit_core.ViTLensError as e:
        st.error(str(e))
        return
    arrays = compare_arrays(a, b, totals, which)
    left, right = st.columns([1, 1])
    with left:
        show_picture(compare_figures.cka_png(arrays["cka"], f"linear CKA over {len(totals.file)} images' patch tokens"
                                             if which.grid else "linear CKA over mean patch tokens",
                                             width_px=column_px([1, 1], 0)), "compare_cka", "compare_cka")
    with right:
        if "mean_attention_distance_diff" in arrays:
            uniform = analyses.uniform_attention_distance(ctx.loaded.geometry.grid, ctx.loaded.geometry.patch_size)
            show_picture(compare_figures.distance_both_png(a.mean_attention_distance, b.mean_attention_distance, uniform,
                                                           width_px=column_px([1, 1], 1)),
                         "compare_distance", "compare_distance", caption="Mean attention distance: A (dots), B (crosses)")
        if "attention_js" in arrays:
            heads = heads_most_changed(arrays["attention_js"], MOST_CHANGED_SHOWN)
            st.markdown("**Heads that changed most** (attention JS, nats)  \n" + "  \n".join(
                f"block {h['block']}, head {h['head']}: {h['js']:.3f}" for h in heads))
    for name, reason in which.skipped:
        st.caption(f"{name}: {reason}")
    _changed_images(a, b, totals, which, dict(sources))


def _changed_images(a, b, totals, which: Comparable, images: dict[str, bytes]) -> None:
    """The set's agreement in a line, and the first CHANGED_SHOWN images whose answer changed, each with a button that
    opens it above (`_opened`)."""
    if not which.classes:
        return
    rows_a = dict(zip(a.totals.rows.file, a.totals.rows.predicted, strict=True))
    rows_b = dict(zip(b.totals.rows.file, b.totals.rows.predicted, strict=True))
    changed = [f for f in totals.file if rows_a[f] != rows_b[f]]
    kl = totals.kl_mean()
    st.markdown(f"**Answers:** the same top-1 on {len(totals.file) - len(changed)} of {len(totals.file)} images; mean "
                f"KL {kl:.3g} nats. Changed: " + (", ".join(f"{md(f)} ({md(a.class_name(rows_a[f]))} -> "
                                                             f"{md(b.class_name(rows_b[f]))})" for f in changed[:8])
                                                  + (" ..." if len(changed) > 8 else "") if changed else "none."))
    if not changed:
        return
    for column, name in zip(st.columns(CHANGED_SHOWN), changed[:CHANGED_SHOWN], strict=False):
        with column:
            st.image(images[name], caption=name, width="stretch")
            st.button("Open above", key=f"{K_OPEN}_{name}", help=f"Show {name} at the top of this tab", width="stretch",
                      on_click=session.open_compare_image, args=(name, images[name]))
