"""The Filters and Positions tabs: the patch-embedding filters and their principal components (paper Fig. 7
left), and the position-embedding similarity, resampled to other input sizes (Fig. 7 center).
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import embeddings as embedding_figures
from dashboard.views.context import ModelSource, ViewContext, cached_figure, column_px, shape, show_picture
from dashboard.views.registry import view
from vit_core import Geometry, analyses
from vit_core.loading.model import patch_embed_weight, pos_embed_rows


def geometry_at(g: Geometry, grid: tuple[int, int]) -> Geometry:
    """The model's geometry at another input resolution: `grid` patches of the same size."""
    return replace(g, grid=grid, img_size=(grid[0] * g.patch_size[0], grid[1] * g.patch_size[1]))


# ----------------------------------------------------------------------------------------------
# 3. Embedding filters

RAW_FILTERS_PER_PAGE = 32
EMBEDDING_COLUMNS = [3, 2]  # the main figure, then the text, controls and the smaller figure
FIGURE_BOX = (column_px(EMBEDDING_COLUMNS, 0), 440)  # pixels: the main figure, within a projector's first screen
POS_TILE_PX = column_px(EMBEDDING_COLUMNS, 1) - 150  # one patch's map of the Positions tab, inside its axes and bar


def _filters_pca_png(model: ModelSource) -> bytes:
    pca = caches.filters_pca(model.request.key, model.loaded)
    titles = [f"{i + 1}: {r:.1%}" for i, r in enumerate(pca.explained_variance_ratio)]  # short: within its tile
    cols, tile = figures.fit_tiles(len(titles), FIGURE_BOX)
    return embedding_figures.filters_grid_png(pca.components, titles, cols=cols, tile_side=tile,
                                              title=f"Top {pca.components.shape[0]} principal components of the filters "
                                                    "(n: share of variance)")


def _filters_variance_png(model: ModelSource) -> bytes:
    return embedding_figures.explained_variance_png(caches.filters_pca(model.request.key, model.loaded).explained_variance_ratio,
                                                    width_px=column_px(EMBEDDING_COLUMNS, 1) - 10)


def _raw_filters_png(model: ModelSource, start: int) -> bytes:
    weight = patch_embed_weight(model.loaded)  # (D, 3, ph, pw)
    images = analyses.filter_images(weight[start:start + RAW_FILTERS_PER_PAGE])  # (n, ph, pw, 3)
    titles = [f"#{start + i}" for i in range(len(images))]
    return embedding_figures.filters_grid_png(images, titles, cols=16, tile_side=48,
                                              title=f"filters {start}-{start + len(images) - 1} of {weight.shape[0]}")


@view("Filters", family="lesson", order=3)
def filters_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    weight = patch_embed_weight(ctx.loaded)  # (D, 3, ph, pw)
    pca = caches.filters_pca(ctx.request.key, ctx.loaded)
    k = pca.components.shape[0]
    left, right = st.columns(EMBEDDING_COLUMNS)
    with left:
        show_picture(cached_figure(_filters_pca_png, ctx.model), "filters_pca", f"{ctx.stem}_filters_pca")
    with right:
        st.markdown(text.FILTERS)
        st.caption(f"patch-embedding weight `{shape(weight.shape, batch=False)}`: {weight.shape[0]} filters of "
                   f"{g.patch_size[0]} x {g.patch_size[1]} x 3; top {k} components explain "
                   f"{pca.explained_variance_ratio.sum():.0%} of their variance")
        show_picture(cached_figure(_filters_variance_png, ctx.model), "filters_var", f"{ctx.stem}_filters_variance")
    _raw_filters(ctx, weight.shape[0])


@st.fragment
def _raw_filters(ctx: ViewContext, num_filters: int) -> None:
    st.markdown("**Raw filters** (each min-max scaled on its own)")
    start = st.number_input("First filter", 0, max(0, num_filters - 1), 0, step=RAW_FILTERS_PER_PAGE,
                            key=session.K_FILTER_START)
    show_picture(cached_figure(_raw_filters_png, ctx.model, start), "filters_raw", f"{ctx.stem}_filters_{start}")


# ----------------------------------------------------------------------------------------------
# 4. Position embeddings


def _resolution_options(grid: tuple[int, int]) -> list[int]:
    gh = grid[0]
    return sorted({max(2, round(gh * f)) for f in (0.5, 0.75, 1.0, 1.5, 2.0)})


def _pos_tiles_png(model: ModelSource, grid: tuple[int, int], k: int) -> bytes:
    similarity = caches.pos_similarity(model.request.key, grid, model.loaded)  # (n, gh', gw')
    return embedding_figures.similarity_tiles_png(similarity, grid, highlight=k, side_px=FIGURE_BOX[1] + 30)


def _pos_tile_png(model: ModelSource, grid: tuple[int, int], k: int) -> bytes:
    similarity = caches.pos_similarity(model.request.key, grid, model.loaded)  # (n, gh', gw')
    r, c = divmod(k, grid[1])
    return figures.map_png(similarity[k], f"patch {k} (row {r}, col {c}) vs all", vmin=-1, vmax=1, highlight=k,
                           label="cosine similarity", side=POS_TILE_PX)



@view("Positions", family="lesson", order=4)
@st.fragment
def positions_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    rows = pos_embed_rows(ctx.loaded)
    if rows is None or not g.has_pos_embed:
        st.markdown(text.POSITIONS)
        st.info(text.NO_POS_EMBED)
        return
    left, right = st.columns(EMBEDDING_COLUMNS)
    tiles_area = left.container()  # the main figure, drawn once the controls beside it are read
    with right:
        c1, c2 = st.columns([3, 2])
        options = _resolution_options(g.grid)
        ph = g.patch_size[0]
        side = c1.select_slider("Input resolution (grid side)", options, value=g.grid[0], key=session.K_POS_RES,
                                format_func=lambda n: f"{n} x {n} patches ({n * ph} px)", bind="query-params")
        shown = geometry_at(g, (side, round(side * g.grid[1] / g.grid[0])))
        grid, n = shown.grid, shown.num_patches
        session.reset_if_out_of_range(session.K_POS_PATCH, n, shown.center_patch)  # the grid may have shrunk
        k = c2.number_input("Patch", 0, n - 1, shown.center_patch, key=session.K_POS_PATCH)
        show_picture(cached_figure(_pos_tile_png, ctx.model, grid, k), "pos_tile", f"{ctx.stem}_pos_similarity_patch{k}")
        st.markdown(text.POSITIONS)
    similarity = caches.pos_similarity(ctx.request.key, grid, ctx.loaded)  # (n, gh', gw')
    with tiles_area:
        show_picture(cached_figure(_pos_tiles_png, ctx.model, grid, k),
                     "pos_tiles", f"{ctx.stem}_pos_similarity_{grid[0]}x{grid[1]}",
                     caption=f"position embedding similarity, {grid[0]} x {grid[1]} grid")  # short: no wider than it
    note = "learned" if grid == tuple(g.grid) else f"resampled in 2D from {g.grid[0]} x {g.grid[1]}"
    prefix_rows = "no rows for prefix tokens" if g.no_embed_class else f"{g.num_prefix_tokens} prefix row(s) first"
    st.caption(f"position embedding `{shape(rows.shape)}` ({prefix_rows}); "
               f"patch rows on a {grid[0]} x {grid[1]} grid: {note}; similarity tiles `{shape(similarity.shape, batch=False)}`")
    if grid != tuple(g.grid):
        st.caption(text.POSITIONS_RESAMPLE)


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def filters_figure(model: ModelSource) -> bytes:
    """The Filters tab's principal components of the patch-embedding filters: PNG bytes."""
    return cached_figure(_filters_pca_png, model)


def positions_figure(model: ModelSource, k: int) -> bytes:
    """The Positions tab's similarity tiles on the model's own grid, patch k framed: PNG bytes."""
    return cached_figure(_pos_tiles_png, model, tuple(model.loaded.geometry.grid), k)
