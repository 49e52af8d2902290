"""The Pipeline and Patches tabs: the forward pass stage by stage with its shapes, and one patch through the
patch embedding (the convolution as one matrix product).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import pipeline as pipeline_figures
from dashboard.literal import markdown_literal
from dashboard.views.context import ViewContext, cached_figure, column_px, shape, show_picture
from dashboard.views.registry import view
from vit_core import analyses
from vit_core.loading.model import patch_embed_weight

# ----------------------------------------------------------------------------------------------
# 1. Pipeline


PIPELINE_COLUMNS = [1, 1, 1.5, 1.1]  # the image, the crop and its patches, the tokens, the top classes


@view("Pipeline", family="lesson", order=1)
def pipeline_view(ctx: ViewContext) -> None:
    g, cap, dc = ctx.loaded.geometry, ctx.cap, ctx.loaded.data_config
    _pipeline_figures(ctx)  # the figures first, the explanation and the shapes below them
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


def _image_picture(ctx: ViewContext, encoding: str) -> bytes:
    """The preview as "png" or "jpeg" bytes. Shown as JPEG when the file was a photo (a JPEG), which encodes
    in a tenth of a PNG's time (a 1024 px preview: ~8 ms against ~70 ms, on every new image); drawings and
    other files as lossless PNG, whose sharp edges JPEG would blur. The download is always the PNG."""
    return figures.encode(np.asarray(ctx.image.preview), encoding)


CROP_GRID_PX = column_px(PIPELINE_COLUMNS, 1) - 2  # the crop with its patch grid, drawn at the size it is shown
TOKEN_MATRIX_PX = (column_px(PIPELINE_COLUMNS, 2) - 150, 190)  # the matrix inside its axes and colour bar


def _crop_grid_png(ctx: ViewContext) -> bytes:
    g = ctx.loaded.geometry
    return pipeline_figures.patch_grid_png(ctx.cap.input_image, g.grid, g.patch_size, CROP_GRID_PX, show_indices=False)


def _tokens_png(ctx: ViewContext, block: int) -> bytes:
    tokens = ctx.cap.tokens[block]  # (T, D)
    return pipeline_figures.token_matrix_png(tokens, "", ctx.loaded.geometry.num_prefix_tokens, sides=TOKEN_MATRIX_PX)


@st.fragment
def _pipeline_figures(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    cols = st.columns(PIPELINE_COLUMNS)
    # The image no wider than the crop beside it: on a phone the columns stack, and a full-width image sat above a
    # crop of half its width, as if the model saw a smaller picture.
    with cols[0], st.container(width=CROP_GRID_PX, key="pipe_image_box"):
        w, h = ctx.image.size
        photo = figures.is_jpeg(ctx.image.data)
        show_picture(cached_figure(_image_picture, ctx, "jpeg" if photo else "png"), "pipe_image", f"{ctx.stem}_image",
                     caption=f"1. your image {shape((h, w, 3), batch=False)}", width="stretch",  # a picture: no text
                     png=partial(_image_picture, ctx, "png") if photo else None)  # else the shown PNG itself
    with cols[1]:
        show_picture(cached_figure(_crop_grid_png, ctx), "pipe_grid", f"{ctx.stem}_patches",
                     caption=f"2-3. the crop, {g.num_patches} patches")  # short: a wider caption widens the picture
    with cols[2]:
        tokens_area = st.container()  # the figure above its slider
        block = st.slider("Blocks applied", 0, g.num_layers, g.num_layers, key="pipe_block",
                          help="0 = the tokens entering block 0 (the first); n = the tokens after n blocks, i.e. "
                               "after block n - 1 (blocks are numbered from 0, as in the Attention tab)")
        where = "entering block 0" if block == 0 else f"after block {block - 1}"
        with tokens_area:
            show_picture(cached_figure(_tokens_png, ctx, block), "pipe_tokens", f"{ctx.stem}_tokens_{block}",
                         caption=f"4-6. the tokens {where} {shape(cap.tokens[block])}")
    with cols[3]:
        if g.num_classes:
            k = min(5, g.num_classes)
            st.markdown(f"**8. Top {k} of {g.num_classes} classes**")
            st.markdown("\n".join(f"{i + 1}. {markdown_literal(p.label)} ({p.prob:.1%})"
                                   for i, p in enumerate(analyses.top_k(cap.logits, ctx.loaded.labels, k))))
            st.caption("details in the Prediction tab")
        else:
            st.info("This model has no classifier head.")


# ----------------------------------------------------------------------------------------------
# 2. Patches


PATCH_GRID_PX = 440  # the clickable crop: as wide as it is shown (the left column is 458 px at 1280 px), numbers fit


def _indexed_grid_png(ctx: ViewContext, k: int) -> bytes:
    """The crop at PATCH_GRID_PX with its grid, its patch numbers and patch k framed, drawn at that size (the
    download; the tab shows the crop with the same grid and numbers drawn by the browser, _crop_picture)."""
    g = ctx.loaded.geometry
    return pipeline_figures.patch_grid_png(ctx.cap.input_image, g.grid, g.patch_size, PATCH_GRID_PX, highlight=k)


def _crop_picture(ctx: ViewContext) -> bytes:
    """The crop alone at PATCH_GRID_PX: the clickable chart draws its grid lines and numbers on top."""
    picture, _ = figures.resized_crop(ctx.cap.input_image, PATCH_GRID_PX)
    return figures.png_bytes(np.asarray(picture))


def _patch_pixels_png(ctx: ViewContext, k: int) -> bytes:
    pixels = analyses.split_patches(ctx.cap.input_image, ctx.loaded.geometry.patch_size)  # (N, ph, pw, 3) uint8
    return figures.png_bytes(pipeline_figures.patch_pixels_image(pixels[k], side=128))


def _patch_vector_png(ctx: ViewContext, k: int) -> bytes:
    flat, _ = caches.patches_as_linear(ctx.request.key, ctx.image.sha, ctx.loaded, ctx.cap)  # (N, ph*pw*3)
    return pipeline_figures.vector_png(flat[k], "")


def _patch_embedding_png(ctx: ViewContext, k: int) -> bytes:
    return pipeline_figures.vector_png(ctx.cap.patch_embeddings[k], "", channels=None)


@view("Patches", family="lesson", order=2)
@st.fragment
def patches_view(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    ph, pw = g.patch_size
    left, right = st.columns([1, 1])
    with left:
        chart_area = st.container()  # the chart above its number input
        k = st.number_input("Patch number (or click a patch)", 0, g.num_patches - 1, g.center_patch,
                            key=session.K_PATCH, bind="query-params")
        fig = figures.clickable_image_figure(cached_figure(_crop_picture, ctx), g.grid, g.patch_size, selected=k,
                                             height=PATCH_GRID_PX, grid_lines=True, numbers=True)
        chart_area.plotly_chart(fig, key="patch_click",
                                on_select=partial(session.patch_click_callback, "patch_click", session.K_PATCH, 0),
                                selection_mode="points", config={"displayModeBar": False})
        st.download_button("PNG", partial(_indexed_grid_png, ctx, k), file_name=f"{ctx.stem}_patch_grid.png",
                           mime="image/png", key="dl_patch_grid", icon=":material/download:", on_click="ignore",
                           type="tertiary")
    flat, linear = caches.patches_as_linear(ctx.request.key, ctx.image.sha, ctx.loaded, cap)  # (N, ph*pw*3), (N, D)
    weight = patch_embed_weight(ctx.loaded)
    diff_k = float(np.abs(linear[k] - cap.patch_embeddings[k]).max())
    diff_all = float(np.abs(linear - cap.patch_embeddings).max())
    with right:
        st.markdown(text.PATCHES)
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
        show_picture(cached_figure(_patch_vector_png, ctx, k), "patch_vector", f"{ctx.stem}_patch{k}_vector",
                     caption=f"flattened patch {k}: {flat.shape[1]} numbers (pixel by pixel, R G B)")
        show_picture(cached_figure(_patch_embedding_png, ctx, k), "patch_embedding", f"{ctx.stem}_patch{k}_embedding",
                     caption=f"its embedding z_{k} (Conv2d output): {g.embed_dim} numbers")


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def patch_grid_figure(ctx: ViewContext, k: int) -> bytes:
    """The Patches tab's crop with its numbered patch grid, patch k framed: PNG bytes."""
    return cached_figure(_indexed_grid_png, ctx, k)
