"""One function per tab: arrange the widgets and figures of that view.

Views get a `ViewContext` (model, capture, image) and never run the model themselves: everything
comes from the one cached capture. Controls that only change what is shown live in `@st.fragment`s,
so moving them reruns that fragment alone. Figures come from `dashboard.figures` (pure builders).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import streamlit as st

from dashboard import figures, state, text
from vit_core import Capture, LoadedModel, analyses, export

VIEW_LABELS = ("Pipeline", "Patches", "Filters", "Positions", "Attention", "Distance", "Prediction")


@dataclass(frozen=True)
class ViewContext:
    request: state.ModelRequest
    loaded: LoadedModel
    cap: Capture
    image: state.ImageChoice

    @property
    def stem(self) -> str:
        """A file-name stem for downloads: model and image."""
        model = self.loaded.name.replace("/", "-")
        image = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(self.image.name).stem)[:40]
        return f"{model}_{image}"

    def png(self, build, *settings) -> bytes:
        """A figure of this model and image, built once per setting (see state.cached_png)."""
        return state.cached_png(build, self.request.key, self.image.sha, *settings)

    def model_png(self, build, *settings) -> bytes:
        """A figure of the model alone (filters, position embedding): built once per model."""
        return state.cached_png(build, self.request.key, *settings)


def shape(array_or_shape, batch: bool = True) -> str:
    """A shape as PyTorch prints it inside the model, with the batch axis: `[1, 197, 768]`."""
    dims = tuple(getattr(array_or_shape, "shape", array_or_shape))
    return "[" + ", ".join(str(d) for d in ((1,) + dims if batch else dims)) + "]"


def show_picture(shown: bytes, key: str, file_name: str | None = None, caption: str | None = None,
                 width: int | str = "stretch", png: Callable[[], bytes] | None = None) -> None:
    """Show PNG or JPEG bytes and offer a PNG for download: the shown bytes, or, for a photo-like
    picture shown as JPEG (a fraction of the bytes and encoding time on every control change), the
    lossless PNG that ``png`` makes only when the button is clicked."""
    if isinstance(width, int):  # st.image re-encodes (slowly) any picture wider than an int width: never shrink
        width = max(width, figures.image_size(shown)[0])
    st.image(shown, caption=caption, width=width, output_format="JPEG" if figures.is_jpeg(shown) else "PNG")
    st.download_button("PNG", png if png is not None else shown, file_name=f"{file_name}.png", mime="image/png",
                       key=f"dl_{key}", icon=":material/download:", on_click="ignore", type="tertiary")


def _patch_query_default(cap: Capture) -> int:
    """Default query token: the class token, else the centre patch."""
    g = cap.geometry
    if g.num_prefix_tokens:
        return 0
    return g.num_prefix_tokens + (g.grid[0] // 2) * g.grid[1] + g.grid[1] // 2


# ----------------------------------------------------------------------------------------------
# Header


def header(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.INTRO)
    top = analyses.top_k(cap.logits, ctx.loaded.labels, 1)[0]
    prediction = f"**{top.label}** ({top.prob:.1%})" if g.num_classes else "no classifier head"
    st.markdown(
        f"Model **{ctx.loaded.name}** ({ctx.loaded.weights}) · image **{ctx.image.name}** · "
        f"{len(g.prefix_names)} prefix + {g.num_patches} patch tokens of width {g.embed_dim}, "
        f"{g.num_layers} layers x {g.num_heads} heads · prediction {prediction}"
    )


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
        ("2. Resize and crop", f"{dc.get('interpolation')} resize, crop_pct {dc.get('crop_pct')}, "
                               f"normalise with mean {tuple(round(m, 3) for m in dc['mean'])}, std {tuple(round(s, 3) for s in dc['std'])}",
         shape(cap.input_tensor)),
        ("3. Cut into patches", f"{g.grid[0]} x {g.grid[1]} patches of {ph} x {pw} pixels, each flattened",
         shape((g.num_patches, ph * pw * 3))),
        ("4. Patch embedding", f"one linear map E: {ph * pw * 3} -> {g.embed_dim} numbers per patch", shape(cap.patch_embeddings)),
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


@st.fragment
def _pipeline_figures(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    cols = st.columns(4)
    with cols[0]:
        w, h = ctx.image.size
        show_picture(ctx.png(lambda: figures.png_bytes(np.asarray(ctx.image.display)), "image"),
                     "pipe_image", f"{ctx.stem}_image", caption=f"1. your image {shape((h, w, 3), batch=False)}")
    with cols[1]:
        show_picture(ctx.png(lambda: figures.png_bytes(figures.patch_grid_image(cap.input_image, g.grid, g.patch_size, show_indices=False)), "grid"),
                     "pipe_grid", f"{ctx.stem}_patches", caption=f"2-3. the crop and its {g.num_patches} patches")
    block = cols[2].slider("Tokens after block", 0, g.num_layers, g.num_layers, key="pipe_block",
                           help="0 = the tokens entering the first block")
    with cols[2]:
        show_picture(ctx.png(lambda: figures.token_matrix_png(
                         cap.tokens[block], f"tokens {'entering block 0' if block == 0 else f'after block {block - 1}'} "
                         f"{shape(cap.tokens[block])}", g.num_prefix_tokens), "tokens", block),
                     "pipe_tokens", f"{ctx.stem}_tokens_{block}")
    with cols[3]:
        if g.num_classes:
            st.markdown(f"**8. Top 5 of {g.num_classes} classes**")
            st.markdown("\n".join(f"{i + 1}. {p.label} ({p.prob:.1%})"
                                   for i, p in enumerate(analyses.top_k(cap.logits, ctx.loaded.labels, 5))))
            st.caption("details in the Prediction tab")
        else:
            st.info("This model has no classifier head.")


# ----------------------------------------------------------------------------------------------
# 2. Patches


@st.fragment
def patches_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    ph, pw = g.patch_size
    st.markdown(text.PATCHES)
    left, right = st.columns([1, 1])
    with left:
        k = st.number_input("Patch number (or click a patch)", 0, g.num_patches - 1, g.num_patches // 2 + g.grid[1] // 2,
                            key=state.K_PATCH, bind="query-params")
        grid_png = ctx.png(lambda: figures.png_bytes(figures.patch_grid_image(cap.input_image, g.grid, g.patch_size,
                                                                              highlight=k)), "grid_indexed", k)
        fig = figures.clickable_image_figure(grid_png, g.grid, g.patch_size, selected=k)
        st.plotly_chart(fig, key="patch_click", on_select=partial(state.patch_click_callback, "patch_click", state.K_PATCH, 0),
                        selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", grid_png, file_name=f"{ctx.stem}_patch_grid.png", mime="image/png",
                           key="dl_patch_grid", icon=":material/download:", on_click="ignore", type="tertiary")
    pixels = analyses.split_patches(cap.input_image, g.patch_size)  # (N, ph, pw, 3) uint8
    flat, linear = state.patches_as_linear(ctx.request.key, ctx.image.sha, ctx.loaded, cap)  # (N, ph*pw*3), (N, D)
    weight = export.patch_embed_weight(ctx.loaded)
    diff_k = float(np.abs(linear[k] - cap.patch_embeddings[k]).max())
    diff_all = float(np.abs(linear - cap.patch_embeddings).max())
    with right:
        r, c = divmod(k, g.grid[1])
        st.markdown(f"**Patch {k}** (row {r}, column {c}): {ph} x {pw} pixels x 3 colours = {ph * pw * 3} numbers")
        a, b = st.columns([1, 2])
        with a:
            show_picture(ctx.png(lambda: figures.png_bytes(figures.patch_pixels_image(pixels[k])), "pixels", k), "patch_pixels", f"{ctx.stem}_patch{k}",
                         caption=f"pixels {shape(pixels[k].shape, batch=False)}")
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
        show_picture(ctx.png(lambda: figures.vector_png(flat[k], f"flattened patch {k}: {flat.shape[1]} numbers (pixel by pixel, R G B)"),
                             "patch_vector", k),
                     "patch_vector", f"{ctx.stem}_patch{k}_vector")
        show_picture(ctx.png(lambda: figures.vector_png(cap.patch_embeddings[k], f"its embedding z_{k} (Conv2d output): {g.embed_dim} numbers",
                                                        channels=None), "patch_embedding", k), "patch_embedding", f"{ctx.stem}_patch{k}_embedding")


# ----------------------------------------------------------------------------------------------
# 3. Embedding filters


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
        titles = [f"PC{i + 1} {r:.1%}" for i, r in enumerate(pca.explained_variance_ratio)]
        show_picture(ctx.model_png(lambda: figures.filters_grid_png(pca.components, titles, cols=7,
                                                                    title=f"Top {k} principal components of the filters"), "pca"),
                     "filters_pca", f"{ctx.stem}_filters_pca")
    with right:
        show_picture(ctx.model_png(lambda: figures.explained_variance_png(pca.explained_variance_ratio), "pca_var"), "filters_var", f"{ctx.stem}_filters_variance")
    _raw_filters(ctx, weight)


@st.fragment
def _raw_filters(ctx: ViewContext, weight: np.ndarray) -> None:
    st.markdown("**Raw filters** (each min-max scaled on its own)")
    count = 32
    start = st.number_input("First filter", 0, max(0, weight.shape[0] - 1), 0, step=count, key=state.K_FILTER_START)
    images = analyses.filter_images(weight[start:start + count])  # (n, ph, pw, 3)
    show_picture(ctx.model_png(lambda: figures.filters_grid_png(images, [f"#{start + i}" for i in range(len(images))], cols=16,
                                                                title=f"filters {start}-{start + len(images) - 1} of {weight.shape[0]}",
                                                                tile_side=48), "raw_filters", start),
                 "filters_raw", f"{ctx.stem}_filters_{start}")


# ----------------------------------------------------------------------------------------------
# 4. Position embeddings


def _resolution_options(grid: tuple[int, int]) -> list[int]:
    gh = grid[0]
    return sorted({max(2, round(gh * f)) for f in (0.5, 0.75, 1.0, 1.5, 2.0)})


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
    grid = (side, round(side * g.grid[1] / g.grid[0]))
    n = grid[0] * grid[1]
    default = (grid[0] // 2) * grid[1] + grid[1] // 2
    if state.K_POS_PATCH in st.session_state and st.session_state[state.K_POS_PATCH] >= n:
        st.session_state[state.K_POS_PATCH] = default
    k = c2.number_input("Patch", 0, n - 1, default, key=state.K_POS_PATCH)
    similarity = state.pos_similarity(ctx.request.key, grid, ctx.loaded)  # (n, gh', gw')
    note = "learned" if grid == tuple(g.grid) else f"resampled in 2D from {g.grid[0]} x {g.grid[1]}"
    st.caption(f"position embedding `{shape(rows.shape)}` ({'no rows for prefix tokens' if g.no_embed_class else f'{g.num_prefix_tokens} prefix row(s) first'}); "
               f"patch rows on a {grid[0]} x {grid[1]} grid: {note}; similarity tiles `{shape(similarity.shape, batch=False)}`")
    if grid != tuple(g.grid):
        st.caption(text.POSITIONS_RESAMPLE)
    left, right = st.columns([3, 2])
    with left:
        show_picture(ctx.model_png(lambda: figures.similarity_tiles_png(similarity, grid, highlight=k,
                                                                        title=f"Position embedding similarity, {grid[0]} x {grid[1]} grid"),
                                   "pos_tiles", grid, k),
                     "pos_tiles", f"{ctx.stem}_pos_similarity_{grid[0]}x{grid[1]}")
    with right:
        r, c = divmod(k, grid[1])
        show_picture(ctx.model_png(lambda: figures.map_png(similarity[k], f"patch {k} (row {r}, col {c}) vs all patches", vmin=-1,
                                                           vmax=1, highlight=k, label="cosine similarity"), "pos_tile", grid, k),
                     "pos_tile", f"{ctx.stem}_pos_similarity_patch{k}")


# ----------------------------------------------------------------------------------------------
# 5. Attention


def attention_view(ctx: ViewContext) -> None:
    st.markdown(text.ATTENTION)
    _attention_maps(ctx)
    st.divider()
    st.markdown(text.ROLLOUT)
    _rollout(ctx)


@st.fragment
def _attention_maps(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    p = g.num_prefix_tokens
    c1, c2, c3 = st.columns(3)
    layer = c1.slider("Layer (0 = first block)", 0, g.num_layers - 1, g.num_layers - 1, key=state.K_LAYER, bind="query-params")
    head = c2.selectbox("Head", [-1] + list(range(g.num_heads)), key=state.K_HEAD, bind="query-params",
                        format_func=lambda h: "mean of all heads" if h == -1 else f"head {h}")
    query = c3.selectbox("Query token (or click a patch)", list(range(g.num_tokens)), index=_patch_query_default(cap),
                         key=state.K_QUERY, format_func=g.token_name, bind="query-params")
    amap = analyses.attention_map(cap.pattern, layer, None if head == -1 else head, query, p, g.grid)
    query_patch = query - p if query >= p else None
    which = "mean of heads" if head == -1 else f"head {head}"
    left, right = st.columns([2, 3])
    with left:
        st.markdown(f"**{g.token_name(query)}**, layer {layer}, {which}")
        s = figures.display_scale(cap.input_image.shape[1])
        def overlay() -> np.ndarray:
            return figures.enlarge(figures.overlay(cap.input_image, amap.map, g.patch_size), s)
        # shown as JPEG (it travels inside the plotly JSON on every change); the PNG is made on download
        shown = ctx.png(lambda: figures.jpeg_bytes(overlay()), "attention_jpeg", layer, head, query)
        fig = figures.clickable_image_figure(shown, g.grid, g.patch_size, selected=query_patch, hover_values=amap.map)
        st.plotly_chart(fig, key="attn_click", on_select=partial(state.patch_click_callback, "attn_click", state.K_QUERY, p),
                        selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", lambda: figures.png_bytes(overlay()),
                           file_name=f"{ctx.stem}_attention_L{layer}_{which.replace(' ', '_')}_q{query}.png",
                           mime="image/png", key="dl_attn_one", icon=":material/download:", on_click="ignore", type="tertiary")
        if p:
            st.metric("Share of this row that goes to prefix tokens", f"{amap.prefix_share:.1%}",
                      help="the map shows only the attention to patches; it is not renormalised")
            if p > 1:
                row = cap.pattern[layer, :, query, :p].mean(0) if head == -1 else cap.pattern[layer, head, query, :p]
                st.caption(" · ".join(f"{name}: {v:.1%}" for name, v in zip(g.prefix_names, row)))
        st.caption(f"attention of layer {layer}: `{shape(cap.pattern[layer].shape)}` (heads, queries, keys); "
                   f"the query's row restricted to patches: `{shape(amap.map.shape, batch=False)}`")
    with right:
        maps = analyses.layer_attention_maps(cap.pattern, layer, query, p, g.grid)  # (H, gh, gw)
        maps = np.concatenate([maps, maps.mean(axis=0, keepdims=True)])  # (H+1, gh, gw)
        titles = [f"head {h}" for h in range(g.num_heads)] + ["mean"]
        cols = 6 if g.num_heads + 1 > 8 else min(4, g.num_heads + 1)
        def sheet() -> np.ndarray:
            return figures.head_maps_mosaic(cap.input_image, maps, g.patch_size, titles, query_patch, g.grid, cols=cols)
        show_picture(ctx.png(lambda: figures.jpeg_bytes(sheet()), "heads_jpeg", layer, query),
                     "attn_heads", f"{ctx.stem}_attention_L{layer}_q{query}_all_heads",
                     caption=f"all {g.num_heads} heads of layer {layer} for {g.token_name(query)} (each scaled on its own)",
                     png=lambda: figures.png_bytes(sheet()))


@st.fragment
def _rollout(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    c1, c2 = st.columns(2)
    fusion = c1.radio("Head fusion", ["mean", "max", "min"], horizontal=True, key=state.K_FUSION, bind="query-params")
    last = c2.slider("Roll out up to layer", 0, g.num_layers - 1, g.num_layers - 1, key=state.K_ROLLOUT_LAYER,
                     bind="query-params")
    rollout = state.rollout(ctx.request.key, ctx.image.sha, fusion, last, cap)
    whose = "class token" if g.has_class_token else "mean of the patch rows"
    left, right = st.columns(2)
    with left:
        s = figures.display_scale(cap.input_image.shape[1], 384)
        def overlay() -> np.ndarray:
            return figures.enlarge(figures.overlay(cap.input_image, rollout, g.patch_size), s)
        show_picture(ctx.png(lambda: figures.jpeg_bytes(overlay()), "rollout_jpeg", fusion, last),
                     "rollout_overlay", f"{ctx.stem}_rollout_{fusion}_L{last}", width=420,
                     caption=f"rollout ({fusion} fusion, layers 0-{last}), {whose}, over the crop",
                     png=lambda: figures.png_bytes(overlay()))
    with right:
        show_picture(ctx.png(lambda: figures.map_png(rollout, f"rollout map {shape(rollout.shape, batch=False)}, unscaled",
                                                     cmap=figures.ATTENTION_CMAP, label="share of the token"), "rollout_map", fusion, last),
                     "rollout_map", f"{ctx.stem}_rollout_map_{fusion}_L{last}", width=420)


# ----------------------------------------------------------------------------------------------
# 6. Attention distance


@st.fragment
def distance_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.DISTANCE)
    c1, c2 = st.columns([1, 2])
    renorm = c1.toggle("Renormalise rows over patches", key=state.K_MAD_RENORM, help=text.DISTANCE_CONVENTION)
    batch = c2.file_uploader(f"Add images to the average (up to {state.MAX_BATCH_IMAGES})", type=list(state.IMAGE_TYPES),
                             accept_multiple_files=True, key=state.K_MAD_BATCH, max_upload_size=state.MAX_IMAGE_MB,
                             help=text.UPLOAD_HELP.format(mb=state.MAX_IMAGE_MB) + " Each file is limited, not the batch.")
    mad, mad_renorm = state.attention_distances(ctx.request, ctx.image, cap)
    if batch:
        with st.spinner(f"Running the model on {len(batch[:state.MAX_BATCH_IMAGES])} images..."):
            for upload in batch[:state.MAX_BATCH_IMAGES]:
                try:
                    image = state.decode(upload.name, upload.getvalue())
                except state.ImageError as e:
                    st.warning(f"{upload.name}: {e}")
                    continue
                if image.sha not in state.distance_history(ctx.request):  # each forward once, not on every rerun
                    state.attention_distances(ctx.request, image, state.capture(ctx.request, ctx.loaded, image))
    history = state.distance_history(ctx.request)
    index = 1 if renorm else 0
    current = mad_renorm if renorm else mad
    average = analyses.average_over_images([v[index] for v in history.values()])
    uniform = analyses.uniform_attention_distance(g.grid, g.patch_size)
    convention = "renormalised over patches" if renorm else "prefix attention left out"
    png = ctx.png(lambda: figures.attention_distance_png(current, uniform, average, len(history),
                                                         title=f"{ctx.loaded.name}: mean attention distance ({convention})"),
                  "mad", renorm, hash(tuple(sorted(history))))
    show_picture(png, "mad", f"{ctx.stem}_attention_distance{'_renorm' if renorm else ''}", width=900)
    st.caption(f"dots: this image; crosses: the average over the {len(history)} image(s) analysed with this model in "
               f"this session. Distances in input pixels; per-head values `{shape(current.shape, batch=False)}` "
               f"(layers, heads) from attention `{shape(cap.pattern.shape, batch=False)}`. "
               f"Uniform attention over the {g.grid[0]} x {g.grid[1]} grid: {uniform:.1f} px.")
    st.markdown(f"First layer: heads from **{current[0].min():.0f}** to **{current[0].max():.0f} px**; "
                f"last layer: **{current[-1].min():.0f}** to **{current[-1].max():.0f} px**.")


# ----------------------------------------------------------------------------------------------
# 7. Prediction


@st.fragment
def prediction_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    st.markdown(text.PREDICTION)
    if not g.num_classes:
        st.info(f"This model has no classifier head: its output is the pooled feature vector `{shape(cap.logits.shape)}`. "
                "Load weights with a head (or a fine-tuned checkpoint) to see predictions.")
        show_picture(ctx.png(lambda: figures.vector_png(cap.logits, "pooled features", channels=None), "features"), "features", f"{ctx.stem}_features")
        return
    k = st.slider("How many classes to list", 1, min(20, g.num_classes), min(5, g.num_classes), key=state.K_TOPK)
    preds = analyses.top_k(cap.logits, ctx.loaded.labels, k)
    left, right = st.columns([2, 3])
    with left:
        show_picture(ctx.png(lambda: figures.top_k_png([p.label for p in preds], [p.prob for p in preds]), "topk", k), "topk", f"{ctx.stem}_top{k}")
    with right:
        st.markdown("| # | class | index | probability | logit |\n| --- | --- | --- | --- | --- |\n" + "\n".join(
            f"| {i + 1} | {p.label} | {p.index} | {p.prob:.2%} | {p.logit:.2f} |" for i, p in enumerate(preds)))
        if ctx.loaded.labels is None:
            st.caption("No label names for this head: class indices are shown. Upload a label file with your weights.")
    show_picture(ctx.png(lambda: figures.logits_png(cap.logits, [p.index for p in preds], [p.label for p in preds]), "logits", k),
                 "logits",
                 f"{ctx.stem}_logits", caption=f"all {g.num_classes} logits `{shape(cap.logits.shape)}`")


VIEWS = (pipeline_view, patches_view, filters_view, positions_view, attention_view, distance_view, prediction_view)
