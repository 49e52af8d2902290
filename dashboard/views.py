"""One function per tab: arrange the widgets and figures of that view.

Views get a `ViewContext` (model, capture, image) and never run the model themselves: everything
comes from the one cached capture. Controls that only change what is shown live in `@st.fragment`s,
so moving them reruns that fragment alone. Figures come from `dashboard.figures` (pure builders),
through the small functions beside each view (`_tokens_png`, `_attention_overlay`, ...): each takes
its source (the `ViewContext`, or the `ModelSource` for figures of the model alone) and the settings
it is drawn with, and `cached_figure` keys the shared cache on exactly those (dashboard/figure_keys.py).

`VIEWS` maps each tab's label to its view function, in the order of the tabs. The "why this
prediction" views (explanations, interventions, logit lens) live in `dashboard.why_views`; what
every view shares (`ViewContext`, `show_picture`, `cached_figure`) in `dashboard.view_context`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import streamlit as st

from dashboard import figures, register_views, state, text, why_views
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, markdown_literal
from dashboard.view_context import ModelSource, ViewContext, cached_figure, shape, show_picture
from vit_core import TEACHING_MODEL, Geometry, ImageError, analyses, export


def default_query_token(g: Geometry) -> int:
    """Default query token of the Attention tab: the first prefix token (the class token), else the centre patch."""
    return 0 if g.num_prefix_tokens else g.center_patch


def geometry_at(g: Geometry, grid: tuple[int, int]) -> Geometry:
    """The model's geometry at another input resolution: `grid` patches of the same size."""
    return replace(g, grid=grid, img_size=(grid[0] * g.patch_size[0], grid[1] * g.patch_size[1]))


UNSURE_BELOW = 0.5  # the teaching model's top probability under which its answer is called a guess

# ----------------------------------------------------------------------------------------------
# Header


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


# ----------------------------------------------------------------------------------------------
# 1. Pipeline


def pipeline_view(ctx: ViewContext) -> None:
    g, cap, dc = ctx.loaded.geometry, ctx.cap, ctx.loaded.data_config
    st.markdown(text.PIPELINE)
    ph, pw = g.patch_size
    w, h = ctx.image.size
    prefix = ", ".join(g.prefix_names) or "none"
    rows = [
        ("1. Your image", f"{w} x {h} pixels, RGB", shape((h, w, 3), batch=False)),
        ("2. Resize and crop", f"{dc.get('interpolation')} resize, crop_pct {dc.get('crop_pct')}, normalise with "
                               f"mean {tuple(round(m, 3) for m in dc['mean'])}, std {tuple(round(s, 3) for s in dc['std'])}",
         shape(cap.input_tensor)),
        ("3. Cut into patches", f"{g.grid[0]} x {g.grid[1]} patches of {ph} x {pw} pixels, each flattened",
         shape((g.num_patches, ph * pw * 3))),
        ("4. Patch embedding", f"one linear map E: {ph * pw * 3} -> {g.embed_dim} numbers per patch",
         shape(cap.patch_embeddings)),
        ("5. Prefix tokens + positions", f"prefix tokens: {prefix}; learned position embedding "
                                         f"{'added' if g.has_pos_embed else 'absent'}", shape(cap.tokens[0])),
        (f"6. {g.num_layers} transformer blocks", f"each: attention with {g.num_heads} heads "
                                                  f"{shape(cap.pattern[0])}, then an MLP; the shape never changes",
         shape(cap.tokens[-1])),
        ("7. Final norm and pooling", "the class token" if g.has_class_token else "mean of the patch tokens (or a pooling head)",
         f"{shape(cap.final_tokens)} -> {shape(cap.pre_logits)}"),
        ("8. Classifier head", f"{g.num_classes} class scores (logits)" if g.num_classes else "no head: the pooled features",
         shape(cap.logits)),
    ]
    table = "| Stage | What happens | Shape |\n| --- | --- | --- |\n" + "\n".join(
        f"| {a} | {b} | `{c}` |" for a, b, c in rows)
    st.markdown(table)
    _pipeline_figures(ctx)


def _image_picture(ctx: ViewContext, encoding: str) -> bytes:
    """The preview as "png" or "jpeg" bytes. Shown as JPEG when the file was a photo (a JPEG), which encodes
    in a tenth of a PNG's time (a 1024 px preview: ~8 ms against ~70 ms, on every new image); drawings and
    other files as lossless PNG, whose sharp edges JPEG would blur. The download is always the PNG."""
    return figures.encode(np.asarray(ctx.image.preview), encoding)


def _crop_grid_png(ctx: ViewContext) -> bytes:
    g = ctx.loaded.geometry
    return figures.png_bytes(figures.patch_grid_image(ctx.cap.input_image, g.grid, g.patch_size, show_indices=False))


def _tokens_png(ctx: ViewContext, block: int) -> bytes:
    tokens = ctx.cap.tokens[block]  # (T, D)
    where = "entering block 0" if block == 0 else f"after block {block - 1}"
    return figures.token_matrix_png(tokens, f"tokens {where} {shape(tokens)}", ctx.loaded.geometry.num_prefix_tokens)


@st.fragment
def _pipeline_figures(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    cols = st.columns(4)
    with cols[0]:
        w, h = ctx.image.size
        photo = figures.is_jpeg(ctx.image.data)
        show_picture(cached_figure(_image_picture, ctx, "jpeg" if photo else "png"), "pipe_image", f"{ctx.stem}_image",
                     caption=f"1. your image {shape((h, w, 3), batch=False)}",
                     png=partial(_image_picture, ctx, "png") if photo else None)  # else the shown PNG itself
    with cols[1]:
        show_picture(cached_figure(_crop_grid_png, ctx),
                     "pipe_grid", f"{ctx.stem}_patches", caption=f"2-3. the crop and its {g.num_patches} patches")
    block = cols[2].slider("Blocks applied", 0, g.num_layers, g.num_layers, key="pipe_block",
                           help="0 = the tokens entering block 0 (the first); n = the tokens after n blocks, i.e. "
                                "after block n - 1 (blocks are numbered from 0, as in the Attention tab)")
    with cols[2]:
        show_picture(cached_figure(_tokens_png, ctx, block), "pipe_tokens", f"{ctx.stem}_tokens_{block}")
    with cols[3]:
        if g.num_classes:
            st.markdown(f"**8. Top 5 of {g.num_classes} classes**")
            st.markdown("\n".join(f"{i + 1}. {markdown_literal(p.label)} ({p.prob:.1%})"
                                   for i, p in enumerate(analyses.top_k(cap.logits, ctx.loaded.labels, 5))))
            st.caption("details in the Prediction tab")
        else:
            st.info("This model has no classifier head.")


# ----------------------------------------------------------------------------------------------
# 2. Patches


def _indexed_grid_png(ctx: ViewContext, k: int) -> bytes:
    g = ctx.loaded.geometry
    return figures.png_bytes(figures.patch_grid_image(ctx.cap.input_image, g.grid, g.patch_size, highlight=k))


def _patch_pixels_png(ctx: ViewContext, k: int) -> bytes:
    pixels = analyses.split_patches(ctx.cap.input_image, ctx.loaded.geometry.patch_size)  # (N, ph, pw, 3) uint8
    return figures.png_bytes(figures.patch_pixels_image(pixels[k]))


def _patch_vector_png(ctx: ViewContext, k: int) -> bytes:
    flat, _ = state.patches_as_linear(ctx.request.key, ctx.image.sha, ctx.loaded, ctx.cap)  # (N, ph*pw*3)
    return figures.vector_png(flat[k], f"flattened patch {k}: {flat.shape[1]} numbers (pixel by pixel, R G B)")


def _patch_embedding_png(ctx: ViewContext, k: int) -> bytes:
    return figures.vector_png(ctx.cap.patch_embeddings[k],
                              f"its embedding z_{k} (Conv2d output): {ctx.loaded.geometry.embed_dim} numbers", channels=None)


@st.fragment
def patches_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    ph, pw = g.patch_size
    st.markdown(text.PATCHES)
    left, right = st.columns([1, 1])
    with left:
        k = st.number_input("Patch number (or click a patch)", 0, g.num_patches - 1, g.center_patch,
                            key=state.K_PATCH, bind="query-params")
        grid_png = cached_figure(_indexed_grid_png, ctx, k)
        fig = figures.clickable_image_figure(grid_png, g.grid, g.patch_size, selected=k)
        st.plotly_chart(fig, key="patch_click", on_select=partial(state.patch_click_callback, "patch_click", state.K_PATCH, 0),
                        selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", grid_png, file_name=f"{ctx.stem}_patch_grid.png", mime="image/png",
                           key="dl_patch_grid", icon=":material/download:", on_click="ignore", type="tertiary")
    flat, linear = state.patches_as_linear(ctx.request.key, ctx.image.sha, ctx.loaded, cap)  # (N, ph*pw*3), (N, D)
    weight = export.patch_embed_weight(ctx.loaded)
    diff_k = float(np.abs(linear[k] - cap.patch_embeddings[k]).max())
    diff_all = float(np.abs(linear - cap.patch_embeddings).max())
    with right:
        r, c = divmod(k, g.grid[1])
        st.markdown(f"**Patch {k}** (row {r}, column {c}): {ph} x {pw} pixels x 3 colours = {ph * pw * 3} numbers")
        a, b = st.columns([1, 2])
        with a:
            show_picture(cached_figure(_patch_pixels_png, ctx, k), "patch_pixels", f"{ctx.stem}_patch{k}",
                         caption=f"pixels {shape((ph, pw, 3), batch=False)}")
        with b:
            st.markdown(
                f"- flattened patch $x_k$: `{shape(flat[k].shape, batch=False)}` (normalised values)\n"
                f"- $E$ (the Conv2d weight `{shape(weight.shape, batch=False)}` reshaped): "
                f"`{shape((weight.shape[0], flat.shape[1]), batch=False)}`\n"
                f"- $z_k = E x_k + b$: `{shape(linear[k].shape, batch=False)}`"
            )
            st.metric("max |E x_k + b - Conv2d output|, this patch", f"{diff_k:.2e}",
                      help="float32 rounding only: the convolution IS this matrix product")
            st.caption(f"over all {g.num_patches} patches: {diff_all:.2e}")
        show_picture(cached_figure(_patch_vector_png, ctx, k), "patch_vector", f"{ctx.stem}_patch{k}_vector")
        show_picture(cached_figure(_patch_embedding_png, ctx, k), "patch_embedding", f"{ctx.stem}_patch{k}_embedding")


# ----------------------------------------------------------------------------------------------
# 3. Embedding filters

RAW_FILTERS_PER_PAGE = 32


def _filters_pca_png(model: ModelSource) -> bytes:
    pca = state.filters_pca(model.request.key, model.loaded)
    titles = [f"PC{i + 1} {r:.1%}" for i, r in enumerate(pca.explained_variance_ratio)]
    return figures.filters_grid_png(pca.components, titles, cols=7,
                                    title=f"Top {pca.components.shape[0]} principal components of the filters")


def _filters_variance_png(model: ModelSource) -> bytes:
    return figures.explained_variance_png(state.filters_pca(model.request.key, model.loaded).explained_variance_ratio)


def _raw_filters_png(model: ModelSource, start: int) -> bytes:
    weight = export.patch_embed_weight(model.loaded)  # (D, 3, ph, pw)
    images = analyses.filter_images(weight[start:start + RAW_FILTERS_PER_PAGE])  # (n, ph, pw, 3)
    return figures.filters_grid_png(images, [f"#{start + i}" for i in range(len(images))], cols=16,
                                    title=f"filters {start}-{start + len(images) - 1} of {weight.shape[0]}", tile_side=48)


def filters_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    st.markdown(text.FILTERS)
    weight = export.patch_embed_weight(ctx.loaded)  # (D, 3, ph, pw)
    pca = state.filters_pca(ctx.request.key, ctx.loaded)
    k = pca.components.shape[0]
    st.caption(f"patch-embedding weight `{shape(weight.shape, batch=False)}`: {weight.shape[0]} filters of "
               f"{g.patch_size[0]} x {g.patch_size[1]} x 3; top {k} components explain "
               f"{pca.explained_variance_ratio.sum():.0%} of their variance")
    left, right = st.columns([3, 2])
    with left:
        show_picture(cached_figure(_filters_pca_png, ctx.model), "filters_pca", f"{ctx.stem}_filters_pca")
    with right:
        show_picture(cached_figure(_filters_variance_png, ctx.model), "filters_var", f"{ctx.stem}_filters_variance")
    _raw_filters(ctx, weight.shape[0])


@st.fragment
def _raw_filters(ctx: ViewContext, num_filters: int) -> None:
    st.markdown("**Raw filters** (each min-max scaled on its own)")
    start = st.number_input("First filter", 0, max(0, num_filters - 1), 0, step=RAW_FILTERS_PER_PAGE,
                            key=state.K_FILTER_START)
    show_picture(cached_figure(_raw_filters_png, ctx.model, start), "filters_raw", f"{ctx.stem}_filters_{start}")


# ----------------------------------------------------------------------------------------------
# 4. Position embeddings


def _resolution_options(grid: tuple[int, int]) -> list[int]:
    gh = grid[0]
    return sorted({max(2, round(gh * f)) for f in (0.5, 0.75, 1.0, 1.5, 2.0)})


def _pos_tiles_png(model: ModelSource, grid: tuple[int, int], k: int) -> bytes:
    similarity = state.pos_similarity(model.request.key, grid, model.loaded)  # (n, gh', gw')
    return figures.similarity_tiles_png(similarity, grid, highlight=k,
                                        title=f"Position embedding similarity, {grid[0]} x {grid[1]} grid")


def _pos_tile_png(model: ModelSource, grid: tuple[int, int], k: int) -> bytes:
    similarity = state.pos_similarity(model.request.key, grid, model.loaded)  # (n, gh', gw')
    r, c = divmod(k, grid[1])
    return figures.map_png(similarity[k], f"patch {k} (row {r}, col {c}) vs all patches", vmin=-1, vmax=1, highlight=k,
                           label="cosine similarity")


@st.fragment
def positions_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    st.markdown(text.POSITIONS)
    rows = export.pos_embed_rows(ctx.loaded)
    if rows is None or not g.has_pos_embed:
        st.info(text.NO_POS_EMBED)
        return
    c1, c2 = st.columns(2)
    options = _resolution_options(g.grid)
    ph = g.patch_size[0]
    side = c1.select_slider("Input resolution (grid side)", options, value=g.grid[0], key=state.K_POS_RES,
                            format_func=lambda n: f"{n} x {n} patches ({n * ph} px)", bind="query-params")
    shown = geometry_at(g, (side, round(side * g.grid[1] / g.grid[0])))
    grid, n = shown.grid, shown.num_patches
    state.reset_if_out_of_range(state.K_POS_PATCH, n, shown.center_patch)  # the grid may have shrunk
    k = c2.number_input("Patch", 0, n - 1, shown.center_patch, key=state.K_POS_PATCH)
    similarity = state.pos_similarity(ctx.request.key, grid, ctx.loaded)  # (n, gh', gw')
    note = "learned" if grid == tuple(g.grid) else f"resampled in 2D from {g.grid[0]} x {g.grid[1]}"
    prefix_rows = "no rows for prefix tokens" if g.no_embed_class else f"{g.num_prefix_tokens} prefix row(s) first"
    st.caption(f"position embedding `{shape(rows.shape)}` ({prefix_rows}); "
               f"patch rows on a {grid[0]} x {grid[1]} grid: {note}; similarity tiles `{shape(similarity.shape, batch=False)}`")
    if grid != tuple(g.grid):
        st.caption(text.POSITIONS_RESAMPLE)
    left, right = st.columns([3, 2])
    with left:
        show_picture(cached_figure(_pos_tiles_png, ctx.model, grid, k),
                     "pos_tiles", f"{ctx.stem}_pos_similarity_{grid[0]}x{grid[1]}")
    with right:
        show_picture(cached_figure(_pos_tile_png, ctx.model, grid, k), "pos_tile", f"{ctx.stem}_pos_similarity_patch{k}")


# ----------------------------------------------------------------------------------------------
# 5. Attention


def attention_view(ctx: ViewContext) -> None:
    st.markdown(text.ATTENTION)
    _attention_maps(ctx)
    st.divider()
    st.markdown(text.ROLLOUT)
    _rollout(ctx)


def _head_or_none(head: int) -> int | None:
    """The head selector's value (-1: the mean of all heads) as the analyses take it (None: the mean)."""
    return None if head == -1 else head


def _attention_overlay(ctx: ViewContext, layer: int, head: int, query: int, encoding: str) -> bytes:
    """The query's attention map over the crop, enlarged for display."""
    g, cap = ctx.loaded.geometry, ctx.cap
    amap = analyses.attention_map(cap.pattern, layer, _head_or_none(head), query, g.num_prefix_tokens, g.grid)
    scale = figures.display_scale(cap.input_image.shape[1])
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, amap.map, g.patch_size), scale), encoding)


def _head_maps_sheet(ctx: ViewContext, layer: int, query: int, encoding: str) -> bytes:
    """Every head's map of one layer for the query, and their mean, over the crop: one sheet."""
    g, cap = ctx.loaded.geometry, ctx.cap
    p = g.num_prefix_tokens
    maps = analyses.layer_attention_maps(cap.pattern, layer, query, p, g.grid)  # (H, gh, gw)
    maps = np.concatenate([maps, maps.mean(axis=0, keepdims=True)])  # (H+1, gh, gw)
    titles = [f"head {h}" for h in range(g.num_heads)] + ["mean"]
    cols = 6 if g.num_heads + 1 > 8 else min(4, g.num_heads + 1)
    query_patch = query - p if query >= p else None
    return figures.encode(figures.head_maps_mosaic(cap.input_image, maps, g.patch_size, titles, query_patch, g.grid,
                                                   cols=cols), encoding)


@st.fragment
def _attention_maps(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    p = g.num_prefix_tokens
    c1, c2, c3 = st.columns(3)
    layer = c1.slider("Layer (0 = first block)", 0, g.num_layers - 1, g.num_layers - 1, key=state.K_LAYER, bind="query-params")
    head = c2.selectbox("Head", [-1] + list(range(g.num_heads)), key=state.K_HEAD, bind="query-params",
                        format_func=lambda h: "mean of all heads" if h == -1 else f"head {h}")
    query = c3.selectbox("Query token (or click a patch)", list(range(g.num_tokens)), index=default_query_token(g),
                         key=state.K_QUERY, format_func=g.token_name, bind="query-params")
    amap = analyses.attention_map(cap.pattern, layer, _head_or_none(head), query, p, g.grid)
    query_patch = query - p if query >= p else None
    which = "mean of heads" if head == -1 else f"head {head}"
    left, right = st.columns([2, 3])
    with left:
        st.markdown(f"**{g.token_name(query)}**, layer {layer}, {which}")
        # shown as JPEG (it travels inside the plotly JSON on every change); the PNG is made on download
        shown = cached_figure(_attention_overlay, ctx, layer, head, query, "jpeg")
        fig = figures.clickable_image_figure(shown, g.grid, g.patch_size, selected=query_patch, hover_values=amap.map)
        st.plotly_chart(fig, key="attn_click", on_select=partial(state.patch_click_callback, "attn_click", state.K_QUERY, p),
                        selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", partial(_attention_overlay, ctx, layer, head, query, "png"),
                           file_name=f"{ctx.stem}_attention_L{layer}_{which.replace(' ', '_')}_q{query}.png",
                           mime="image/png", key="dl_attn_one", icon=":material/download:", on_click="ignore", type="tertiary")
        if p:
            st.metric("Share of this row that goes to prefix tokens", f"{amap.prefix_share:.1%}",
                      help="the map shows only the attention to patches; it is not renormalised")
            if p > 1:
                shares = analyses.prefix_token_shares(cap.pattern, layer, _head_or_none(head), query, p)  # (P,)
                st.caption(" · ".join(f"{name}: {v:.1%}" for name, v in zip(g.prefix_names, shares, strict=True)))
        st.caption(f"attention of layer {layer}: `{shape(cap.pattern[layer].shape)}` (heads, queries, keys); "
                   f"the query's row restricted to patches: `{shape(amap.map.shape, batch=False)}`")
    with right:
        show_picture(cached_figure(_head_maps_sheet, ctx, layer, query, "jpeg"),
                     "attn_heads", f"{ctx.stem}_attention_L{layer}_q{query}_all_heads",
                     caption=f"all {g.num_heads} heads of layer {layer} for {g.token_name(query)} (each scaled on its own)",
                     png=partial(_head_maps_sheet, ctx, layer, query, "png"))


ROLLOUT_DISPLAY_SIDE = 384  # pixels: the rollout overlay is shown smaller than the attention map


def _rollout_overlay(ctx: ViewContext, fusion: str, last: int, encoding: str) -> bytes:
    g, cap = ctx.loaded.geometry, ctx.cap
    rollout = state.rollout(ctx.request.key, ctx.image.sha, fusion, last, cap)  # (gh, gw)
    scale = figures.display_scale(cap.input_image.shape[1], ROLLOUT_DISPLAY_SIDE)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, rollout, g.patch_size), scale), encoding)


def _rollout_map_png(ctx: ViewContext, fusion: str, last: int) -> bytes:
    rollout = state.rollout(ctx.request.key, ctx.image.sha, fusion, last, ctx.cap)  # (gh, gw)
    return figures.map_png(rollout, f"rollout map {shape(rollout.shape, batch=False)}, unscaled",
                           cmap=figures.ATTENTION_CMAP, label="share of the token")


@st.fragment
def _rollout(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    c1, c2 = st.columns(2)
    fusion = c1.radio("Head fusion", ["mean", "max", "min"], horizontal=True, key=state.K_FUSION, bind="query-params")
    last = c2.slider("Roll out up to layer", 0, g.num_layers - 1, g.num_layers - 1, key=state.K_ROLLOUT_LAYER,
                     bind="query-params")
    whose = "class token" if g.has_class_token else "mean of the patch rows"
    left, right = st.columns(2)
    with left:
        show_picture(cached_figure(_rollout_overlay, ctx, fusion, last, "jpeg"),
                     "rollout_overlay", f"{ctx.stem}_rollout_{fusion}_L{last}", width=420,
                     caption=f"rollout ({fusion} fusion, layers 0-{last}), {whose}, over the crop",
                     png=partial(_rollout_overlay, ctx, fusion, last, "png"))
    with right:
        show_picture(cached_figure(_rollout_map_png, ctx, fusion, last),
                     "rollout_map", f"{ctx.stem}_rollout_map_{fusion}_L{last}", width=420)


# ----------------------------------------------------------------------------------------------
# 6. Attention distance


def _distance_png(ctx: ViewContext, renormalized: bool, history_shas: tuple[str, ...]) -> bytes:
    """This image's mean attention distance per head, the average over the images `history_shas`
    (analysed with this model in this session) and the uniform-attention line."""
    g, index = ctx.loaded.geometry, int(renormalized)
    history = state.distance_history(ctx.request)
    current = state.attention_distances(ctx.request, ctx.image, ctx.cap)[index]  # (L, H)
    average = analyses.average_over_images([history[sha][index] for sha in history_shas])  # (L, H)
    convention = "renormalised over patches" if renormalized else "prefix attention left out"
    return figures.attention_distance_png(current, analyses.uniform_attention_distance(g.grid, g.patch_size), average,
                                          len(history_shas),
                                          title=f"{ctx.loaded.name}: mean attention distance ({convention})")


@st.fragment
def distance_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.DISTANCE)
    c1, c2 = st.columns([1, 2])
    renorm = c1.toggle("Renormalise rows over patches", key=state.K_MAD_RENORM, help=text.DISTANCE_CONVENTION)
    batch = c2.file_uploader(f"Add images to the average (up to {state.MAX_BATCH_IMAGES})", type=list(IMAGE_TYPES),
                             accept_multiple_files=True, key=state.K_MAD_BATCH, max_upload_size=MAX_IMAGE_MB,
                             help=text.UPLOAD_HELP.format(mb=MAX_IMAGE_MB) + " Each file is limited, not the batch.")
    state.record_attention_distances(ctx.request, ctx.image, cap)
    if batch:
        with st.spinner(f"Running the model on {len(batch[:state.MAX_BATCH_IMAGES])} images..."):
            for upload in batch[:state.MAX_BATCH_IMAGES]:
                try:  # each forward once, not on every rerun; reduced to (L, H), kept out of the shared caches
                    state.add_to_distance_average(ctx.request, ctx.loaded, upload.getvalue())
                except ImageError as e:
                    st.warning(f"{markdown_literal(upload.name)}: {markdown_literal(str(e))}")
    history = state.distance_history(ctx.request)
    current = state.attention_distances(ctx.request, ctx.image, cap)[int(renorm)]  # (L, H)
    uniform = analyses.uniform_attention_distance(g.grid, g.patch_size)
    png = cached_figure(_distance_png, ctx, renorm, tuple(history))  # the images averaged, in the order they came
    show_picture(png, "mad", f"{ctx.stem}_attention_distance{'_renorm' if renorm else ''}", width=900)
    st.caption(f"dots: this image; crosses: the average over the {len(history)} image(s) analysed with this model in "
               f"this session. Distances in input pixels; per-head values `{shape(current.shape, batch=False)}` "
               f"(layers, heads) from attention `{shape(cap.pattern.shape, batch=False)}`. "
               f"Uniform attention over the {g.grid[0]} x {g.grid[1]} grid: {uniform:.1f} px.")
    st.markdown(f"First layer: heads from **{current[0].min():.0f}** to **{current[0].max():.0f} px**; "
                f"last layer: **{current[-1].min():.0f}** to **{current[-1].max():.0f} px**.")


# ----------------------------------------------------------------------------------------------
# 7. Prediction


def _features_png(ctx: ViewContext) -> bytes:
    return figures.vector_png(ctx.cap.logits, "pooled features", channels=None)


def _top_k_png(ctx: ViewContext, k: int) -> bytes:
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, k)
    return figures.top_k_png([p.label for p in preds], [p.prob for p in preds])


def _logits_png(ctx: ViewContext, k: int) -> bytes:
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, k)
    return figures.logits_png(ctx.cap.logits, [p.index for p in preds], [p.label for p in preds])


@st.fragment
def prediction_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.PREDICTION)
    if not g.num_classes:
        st.info(f"This model has no classifier head: its output is the pooled feature vector `{shape(cap.logits.shape)}`. "
                "Load weights with a head (or a fine-tuned checkpoint) to see predictions.")
        show_picture(cached_figure(_features_png, ctx), "features", f"{ctx.stem}_features")
        return
    k = st.slider("How many classes to list", 1, min(20, g.num_classes), min(5, g.num_classes), key=state.K_TOPK)
    preds = analyses.top_k(cap.logits, ctx.loaded.labels, k)
    left, right = st.columns([2, 3])
    with left:
        show_picture(cached_figure(_top_k_png, ctx, k), "topk", f"{ctx.stem}_top{k}")
    with right:
        st.markdown("| # | class | index | probability | logit |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
            f"| {i + 1} | {markdown_literal(p.label)} | {p.index} | {p.prob:.2%} | {p.logit:.2f} |" for i, p in enumerate(preds)))
        if ctx.loaded.labels is None:
            st.caption("No label names for this head: class indices are shown. Upload a label file with your weights.")
    show_picture(cached_figure(_logits_png, ctx, k), "logits", f"{ctx.stem}_logits",
                 caption=f"all {g.num_classes} logits `{shape(cap.logits.shape)}`")


VIEWS: dict[str, Callable[[ViewContext], None]] = {
    "Pipeline": pipeline_view,
    "Patches": patches_view,
    "Filters": filters_view,
    "Positions": positions_view,
    "Attention": attention_view,
    "Distance": distance_view,
    "Prediction": prediction_view,
    "Why?": why_views.why_view,
    "Interventions": why_views.interventions_view,
    "Logit lens": why_views.logit_lens_view,
    "Registers & norms": register_views.registers_view,
}
