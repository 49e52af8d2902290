"""The Logit lens tab: the model's own head applied after every block (the top classes per layer), and to every
patch token of one layer without pooling (each patch's top-1 class over the crop).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import lens as lens_figures
from dashboard.literal import markdown_literal as md  # class names come from uploaded label files
from dashboard.views.context import PAGE_PX, ViewContext, cached_figure, no_head, shape, show_picture
from dashboard.views.registry import view
from vit_core import analyses

LENS_CLASSES = 5  # the logit lens strip shows every class that is in the top 5 after some layer...
MAX_LENS_COLUMNS = 16  # ...up to this many, the final prediction's first


def lens_classes(probs: np.ndarray, k: int = LENS_CLASSES, limit: int = MAX_LENS_COLUMNS) -> list[int]:
    """The classes in the top k of some row of `probs` (L+1, C): the final row's top k first (best first),
    then the others by their best probability over the layers; at most `limit`."""
    final = [int(i) for i in np.argsort(-probs[-1], kind="stable")[:k]]
    anywhere = {int(i) for row in probs for i in np.argsort(-row, kind="stable")[:k]} - set(final)
    others = sorted(anywhere, key=lambda c: (-float(probs[:, c].max()), c))
    return (final + others)[:limit]


def logit_lens_rows(ctx: ViewContext) -> np.ndarray:
    """The logit lens float32 (L+1, C), row l = the head applied after block l (row 0: the embeddings): the catalog's
    logit_lens lens, cached for every session (`caches.lens_arrays`)."""
    return caches.lens_arrays(ctx.request, ctx.loaded, ctx.image, ctx.cap, "logit_lens")["logit_lens"]


def _lens_strip_png(ctx: ViewContext) -> bytes:
    lens = logit_lens_rows(ctx)  # (L+1, C)
    probs = analyses.softmax(lens)  # (L+1, C)
    classes = lens_classes(probs)
    return lens_figures.logit_lens_strip_png(probs[:, classes], [ctx.loaded.label(c) for c in classes],
                                             max_width_px=PAGE_PX - 20)


def _patch_lens_png(ctx: ViewContext, layer: int) -> bytes:
    g = ctx.loaded.geometry
    probs = analyses.softmax(caches.patch_logit_lens(ctx.request.key, ctx.image.sha, layer, ctx.loaded, ctx.cap))  # (N, C)
    top = probs.argmax(axis=1)  # (N,)
    classes, best = top.reshape(g.grid), probs[np.arange(len(top)), top].reshape(g.grid)  # (gh, gw) each
    names = {int(c): ctx.loaded.label(int(c)) for c in set(top)}
    return lens_figures.patch_lens_png(ctx.cap.input_image, classes, best, names, g.patch_size)


@view("Logit lens", family="research", order=20)
def logit_lens_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    if no_head(ctx):
        st.markdown(text.LOGIT_LENS)
        return
    lens = logit_lens_rows(ctx)  # (L+1, C)
    show_picture(cached_figure(_lens_strip_png, ctx), "lens_strip", f"{ctx.stem}_logit_lens",
                 caption=f"logit lens {shape(lens.shape, batch=False)}: the top classes after each block")
    tops = lens.argmax(axis=1)  # (L+1,)
    final = int(tops[-1])
    settled = next(layer for layer in range(len(tops)) if (tops[layer:] == final).all())
    st.caption(f"logit lens `{shape(lens.shape, batch=False)}` ({g.num_layers} blocks + the embeddings, {lens.shape[1]} "
               f"classes), each row through softmax; max |last row - logits| = {np.abs(lens[-1] - ctx.cap.logits).max():.1e}. "
               f"The top-1 class is **{md(ctx.loaded.label(final))}** from "
               + ("the embeddings on." if settled == 0 else f"block {settled - 1} on."))
    st.markdown(text.LOGIT_LENS)
    _patch_lens(ctx)


@st.fragment
def _patch_lens(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    layer = st.select_slider("Patch tokens of", list(range(g.num_layers + 1)), value=g.num_layers, key=session.K_LENS_LAYER,
                             format_func=lens_figures.lens_row_name, bind="query-params",
                             help="the logit lens's rows: the embeddings entering block 0, then the tokens after each block")
    where = "the embeddings entering block 0" if layer == 0 else lens_figures.lens_row_name(layer)
    show_picture(cached_figure(_patch_lens_png, ctx, layer), "lens_patches", f"{ctx.stem}_patch_lens_{layer}",
                 caption=f"each patch's top-1 class, {where}")
    st.caption(f"patch tokens {lens_figures.lens_row_name(layer)} `{shape((g.num_patches, g.embed_dim))}` -> norm, fc_norm, "
               "head, one at a time: the colour is each patch's top-1 class, pale when it is unsure; the number its "
               "probability in %.")


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def lens_figure(ctx: ViewContext) -> bytes:
    """The Logit lens tab's strip: the top classes after each block: PNG bytes."""
    return cached_figure(_lens_strip_png, ctx)
