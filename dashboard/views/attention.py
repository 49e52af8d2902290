"""The Attention tab (every head's map for a query token, and attention rollout) and the Distance tab (mean
attention distance per head, paper Fig. 7 right, with the session's average over images).
"""

from __future__ import annotations

import hashlib
from functools import partial

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import attention as attention_figures
from dashboard.figures import base as figures
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, check_file_size
from dashboard.literal import markdown_literal
from dashboard.views.context import ViewContext, cached_figure, column_px, shape, show_picture
from dashboard.views.registry import view
from vit_core import Geometry, ImageError, analyses, plots


def default_query_token(g: Geometry) -> int:
    """Default query token of the Attention tab: the first prefix token (the class token), else the centre patch."""
    return 0 if g.num_prefix_tokens else g.center_patch


# ----------------------------------------------------------------------------------------------
# 5. Attention


ATTENTION_COLUMNS = [2, 3]  # the clickable map of the query, every head's map
HEAD_SHEET_BOX = (column_px(ATTENTION_COLUMNS, 1), 430)  # pixels: every head's map within a projector's first screen


@view("Attention", family="lesson", order=5)
def attention_view(ctx: ViewContext) -> None:
    _attention_maps(ctx)
    st.markdown(text.ATTENTION)
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
    aspect = cap.input_image.shape[0] / cap.input_image.shape[1]
    cols, tile = figures.fit_tiles(len(titles), HEAD_SHEET_BOX, aspect=aspect)
    query_patch = query - p if query >= p else None
    sheet = attention_figures.head_maps_mosaic(cap.input_image, maps, g.patch_size, titles, query_patch, g.grid,
                                               cols=cols, tile_side=tile)
    return figures.encode(sheet, encoding, text_px=figures.TEXT_PX)


def head_label(head: int) -> str:
    """The Head selectbox's label of `head` (-1: the mean), which a link's `&head=` names."""
    return "mean of all heads" if head == -1 else f"head {head}"


@st.fragment
def _attention_maps(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    p = g.num_prefix_tokens
    c1, c2, c3 = st.columns(3)
    layer = c1.slider("Layer (0 = first block)", 0, g.num_layers - 1, g.num_layers - 1, key=session.K_LAYER, bind="query-params")
    head = c2.selectbox("Head", [-1] + list(range(g.num_heads)), key=session.K_HEAD, bind="query-params",
                        format_func=head_label)
    query = c3.selectbox("Query token (or click a patch)", list(range(g.num_tokens)), index=default_query_token(g),
                         key=session.K_QUERY, format_func=g.token_name, bind="query-params")
    amap = analyses.attention_map(cap.pattern, layer, _head_or_none(head), query, p, g.grid)
    query_patch = query - p if query >= p else None
    which = "mean of heads" if head == -1 else f"head {head}"
    left, right = st.columns(ATTENTION_COLUMNS)
    with left:
        # shown as JPEG (it travels inside the plotly JSON on every change); the PNG is made on download
        shown = cached_figure(_attention_overlay, ctx, layer, head, query, "jpeg")
        fig = figures.clickable_image_figure(shown, g.grid, g.patch_size, selected=query_patch, hover_values=amap.map,
                                             height=column_px(ATTENTION_COLUMNS, 0))
        st.plotly_chart(fig, key="attn_click", on_select=partial(session.patch_click_callback, "attn_click", session.K_QUERY, p),
                        selection_mode="points", config={"displayModeBar": False})
        st.markdown(f"**{g.token_name(query)}**, layer {layer}, {which}")
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


def rollout_map(ctx: ViewContext, fusion: str, last: int) -> np.ndarray:
    """The rollout map (gh, gw) of layers 0..`last` with `fusion`: the catalog's rollout lens, whose default is every
    layer (last_layer None), so that this tab's default, the lesson's and the export share one cached entry."""
    last_layer = None if last == ctx.loaded.geometry.num_layers - 1 else int(last)
    return caches.lens_arrays(ctx.request, ctx.loaded, ctx.image, ctx.cap, "rollout", fusion=fusion,
                              last_layer=last_layer)["rollout"]


def _rollout_overlay(ctx: ViewContext, fusion: str, last: int, encoding: str) -> bytes:
    g, cap = ctx.loaded.geometry, ctx.cap
    rollout = rollout_map(ctx, fusion, last)  # (gh, gw)
    scale = figures.display_scale(cap.input_image.shape[1], ROLLOUT_DISPLAY_SIDE)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, rollout, g.patch_size), scale), encoding)


def _rollout_map_png(ctx: ViewContext, fusion: str, last: int) -> bytes:
    rollout = rollout_map(ctx, fusion, last)  # (gh, gw)
    return figures.map_png(rollout, f"rollout map {shape(rollout.shape, batch=False)}, unscaled",
                           cmap=figures.ATTENTION_CMAP, label="share of the token")


@st.fragment
def _rollout(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    c1, c2 = st.columns(2)
    fusion = c1.radio("Head fusion", ["mean", "max", "min"], horizontal=True, key=session.K_FUSION, bind="query-params")
    last = c2.slider("Roll out up to layer", 0, g.num_layers - 1, g.num_layers - 1, key=session.K_ROLLOUT_LAYER,
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
                     "rollout_map", f"{ctx.stem}_rollout_map_{fusion}_L{last}")


# ----------------------------------------------------------------------------------------------
# 6. Attention distance


MAX_BATCH_IMAGES = 32  # the distance tab's batch uploader: images added to the average in one go


def attention_distances(ctx: ViewContext) -> tuple[np.ndarray, np.ndarray]:
    """This image's mean attention distances (L, H), as defined (prefix attention left out) and with each patch row
    renormalised over the patches: the catalog's mean_attention_distance lens, cached (`caches.lens_arrays`)."""
    arrays = caches.lens_arrays(ctx.request, ctx.loaded, ctx.image, ctx.cap, "mean_attention_distance")
    return arrays["mean_attention_distance"], arrays["mean_attention_distance_renorm"]


def record_attention_distances(ctx: ViewContext) -> tuple[np.ndarray, np.ndarray]:
    """This image's mean attention distances (L, H) (`attention_distances`), also recorded in the session's
    history (the latest image of the latest model last)."""
    result = attention_distances(ctx)
    session.remember_distances(ctx.request.key, ctx.image.sha, result)
    return result


def add_to_distance_average(ctx: ViewContext, data: bytes) -> None:
    """One image of the distance tab's batch uploader: its mean attention distances (L, H) join this session's
    history (once per image), kept out of the shared caches (caches.uncached_attention_distances). Raises
    vit_core.ImageError with a message for the user."""
    check_file_size(data)
    sha = hashlib.sha256(data).hexdigest()
    if sha in session.distance_history(ctx.request.key):
        return
    session.remember_distances(ctx.request.key, sha, caches.uncached_attention_distances(ctx.loaded, data))


def _distance_png(ctx: ViewContext, renormalized: bool, history_shas: tuple[str, ...]) -> bytes:
    """This image's mean attention distance per head, the average over the images `history_shas`
    (analysed with this model in this session) and the uniform-attention line."""
    g, index = ctx.loaded.geometry, int(renormalized)
    history = session.distance_history(ctx.request.key)
    current = attention_distances(ctx)[index]  # (L, H)
    average = analyses.average_over_images([history[sha][index] for sha in history_shas])  # (L, H)
    fig = plots.attention_distance_figure(current, analyses.uniform_attention_distance(g.grid, g.patch_size),
                                          average=average, num_images=len(history_shas))
    return figures.figure_png(figures.legible(fig, *DISTANCE_PX), width_px=column_px(DISTANCE_COLUMNS, 0) - 4)


DISTANCE_COLUMNS = [3, 2]  # the figure, then the text and controls
DISTANCE_PX = (column_px(DISTANCE_COLUMNS, 0) - 180, 400)  # the figure's axes; its legend (head names) on the right


@view("Distance", family="lesson", order=6)
@st.fragment
def distance_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    left, right = st.columns(DISTANCE_COLUMNS)
    with right:
        st.markdown(text.DISTANCE)
        renorm = st.toggle("Renormalise rows over patches", key=session.K_MAD_RENORM, help=text.DISTANCE_CONVENTION)
        batch = st.file_uploader(f"Add images to the average (up to {MAX_BATCH_IMAGES})", type=list(IMAGE_TYPES),
                                 accept_multiple_files=True, key=session.K_MAD_BATCH, max_upload_size=MAX_IMAGE_MB,
                                 help=text.UPLOAD_HELP.format(mb=MAX_IMAGE_MB) + " Each file is limited, not the batch.")
    record_attention_distances(ctx)
    if batch:
        with st.spinner(f"Running the model on {len(batch[:MAX_BATCH_IMAGES])} images..."):
            for upload in batch[:MAX_BATCH_IMAGES]:
                try:  # each forward once, not on every rerun; reduced to (L, H), kept out of the shared caches
                    add_to_distance_average(ctx, upload.getvalue())
                except ImageError as e:
                    st.warning(f"{markdown_literal(upload.name)}: {markdown_literal(str(e))}")
    history = session.distance_history(ctx.request.key)
    current = attention_distances(ctx)[int(renorm)]  # (L, H)
    uniform = analyses.uniform_attention_distance(g.grid, g.patch_size)
    png = cached_figure(_distance_png, ctx, renorm, tuple(history))  # the images averaged, in the order they came
    convention = "renormalised over patches" if renorm else "prefix attention left out"
    with left:
        show_picture(png, "mad", f"{ctx.stem}_attention_distance{'_renorm' if renorm else ''}",
                     caption=f"{ctx.loaded.name}: mean attention distance ({convention})")
    with right:
        st.markdown(f"First layer: heads from **{current[0].min():.0f}** to **{current[0].max():.0f} px**; "
                    f"last layer: **{current[-1].min():.0f}** to **{current[-1].max():.0f} px**.")
    st.caption(f"dots: this image; crosses: the average over the {len(history)} image(s) analysed with this model in "
               f"this session. Distances in input pixels; per-head values `{shape(current.shape, batch=False)}` "
               f"(layers, heads) from attention `{shape(cap.pattern.shape, batch=False)}`. "
               f"Uniform attention over the {g.grid[0]} x {g.grid[1]} grid: {uniform:.1f} px.")


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def attention_figure(ctx: ViewContext, layer: int, head: int, query: int) -> bytes:
    """The Attention tab's map of one query token over the crop (head -1: the mean of the heads): JPEG bytes."""
    return cached_figure(_attention_overlay, ctx, layer, head, query, "jpeg")


def head_maps_figure(ctx: ViewContext, layer: int, query: int) -> bytes:
    """The Attention tab's sheet of every head's map of one layer for the query, and their mean: JPEG bytes."""
    return cached_figure(_head_maps_sheet, ctx, layer, query, "jpeg")


def rollout_figure(ctx: ViewContext, last: int) -> bytes:
    """The Attention tab's rollout (mean fusion, layers 0 to `last`) over the crop: JPEG bytes."""
    return cached_figure(_rollout_overlay, ctx, "mean", last, "jpeg")


def distance_figure(ctx: ViewContext) -> bytes:
    """The Distance tab's mean attention distance per head (prefix attention left out), with the session's average
    over the images it analysed with this model: PNG bytes."""
    return cached_figure(_distance_png, ctx, False, tuple(session.distance_history(ctx.request.key)))
