"""The dashboard's figure builders, headless: types, sizes, and that what is drawn is the analysis."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io
import pytest
from matplotlib.transforms import Bbox

from dashboard.figures import attention as attention_figures
from dashboard.figures import base as figures
from dashboard.figures import embeddings as embedding_figures
from dashboard.figures import interventions as intervention_figures
from dashboard.figures import pipeline as pipeline_figures
from dashboard.figures import prediction as prediction_figures
from vit_core import analyses, plots

GRID, PATCH = (4, 5), (8, 8)
H, W = GRID[0] * PATCH[0], GRID[1] * PATCH[1]


@pytest.fixture
def crop():
    return np.random.default_rng(0).integers(0, 256, size=(H, W, 3), dtype=np.uint8)


def is_png(data: bytes) -> bool:
    return isinstance(data, bytes) and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_map_to_pixels_fills_each_patch_with_its_value():
    amap = np.arange(20, dtype=np.float32).reshape(GRID)
    pixels = figures.map_to_pixels(amap, PATCH)
    assert pixels.shape == (H, W)
    for k in range(20):
        r, c = divmod(k, GRID[1])
        block = pixels[r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
        assert np.all(block == amap[r, c])


def test_overlay_orders_patches_like_the_map(crop):
    amap = np.zeros(GRID, dtype=np.float32)
    amap[2, 3] = 1.0  # the hottest patch must be the brightest once overlaid on a black image
    out = figures.overlay(np.zeros_like(crop), amap, PATCH)
    assert out.shape == crop.shape and out.dtype == np.uint8
    brightness = out.sum(axis=-1)
    assert brightness[2 * 8 + 4, 3 * 8 + 4] == brightness.max()
    assert brightness[0, 0] < brightness.max()


def test_patch_grid_image_is_enlarged_and_highlights(crop):
    plain = pipeline_figures.patch_grid_image(crop, GRID, PATCH, show_indices=False)
    s = figures.display_scale(W)
    assert plain.shape == (H * s, W * s, 3)
    marked = pipeline_figures.patch_grid_image(crop, GRID, PATCH, highlight=7, show_indices=False)
    assert not np.array_equal(plain, marked)


def test_clickable_figure_has_one_marker_per_patch_at_its_centre(crop):
    amap = np.random.default_rng(1).random(GRID).astype(np.float32)
    display = figures.enlarge(figures.overlay(crop, amap, PATCH), 3)
    assert figures.clickable_image_figure(figures.png_bytes(display), GRID, PATCH).data[1].x[6] == pytest.approx(36)
    fig = figures.clickable_image_figure(display, GRID, PATCH, selected=6, hover_values=amap)
    assert isinstance(fig, go.Figure)
    image, markers = fig.data
    assert isinstance(image, go.Image) and image.source.startswith("data:image/png;base64,")
    assert list(markers.customdata) == list(range(20))
    # patch 6 = row 1, col 1: centre at (1.5 * 8 * 3) in display pixels on both axes
    assert markers.x[6] == pytest.approx(36) and markers.y[6] == pytest.approx(36)
    assert f"{amap[1, 1]:.4f}" in markers.hovertext[6]
    assert len(fig.layout.shapes) == 1


def test_clickable_figure_carries_a_jpeg_as_jpeg():
    import base64
    import io

    from PIL import Image

    y, x = np.mgrid[0 : H * 3, 0 : W * 3]
    display = np.stack([x * 255 // (W * 3), y * 255 // (H * 3), (x + y) % 256], axis=-1).astype(np.uint8)  # smooth
    jpeg = figures.jpeg_bytes(display)
    image = figures.clickable_image_figure(jpeg, GRID, PATCH).data[0]
    assert image.source.startswith("data:image/jpeg;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(image.source.split(",", 1)[1])))
    assert decoded.format == "JPEG" and decoded.size == (display.shape[1], display.shape[0])
    # lossy, but the picture is the same picture
    assert np.abs(np.asarray(decoded, dtype=np.int16) - display).mean() < 6


def test_head_mosaic_is_one_image_for_all_heads(crop):
    pattern = np.random.default_rng(2).random((2, 6, 21, 21)).astype(np.float32)
    pattern /= pattern.sum(-1, keepdims=True)
    maps = analyses.layer_attention_maps(pattern, 1, 0, 1, GRID)
    titles = [f"head {h}" for h in range(6)]
    sheet = attention_figures.head_maps_mosaic(crop, maps, PATCH, titles, query_patch=3, grid=GRID, cols=3)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3
    assert is_png(figures.png_bytes(sheet))


def test_head_mosaic_tiles_are_the_overlays_at_tile_size():
    crop = np.full((32, 40, 3), 128, dtype=np.uint8)  # grey, so each tile shows the map's colours alone
    amap = np.arange(20, dtype=np.float32).reshape(GRID)  # 4 x 5 patches of 8 px
    sheet = attention_figures.head_maps_mosaic(crop, amap[None], PATCH, ["m"], cols=1, tile_side=80)  # factor 2
    full = figures.overlay(crop, amap, PATCH)  # (32, 40, 3): the same picture at crop size
    pad, title = 6, figures.TEXT_PX + 5
    tile = sheet[pad + title : pad + title + 64, pad : pad + 80]
    np.testing.assert_array_equal(tile[::2, ::2], full)  # nearest-neighbour enlargement of the overlay


def test_png_builders_return_pngs(crop):
    rng = np.random.default_rng(3)
    sim = analyses.pos_embed_similarity(rng.normal(size=(21, 16)), 1, False, GRID)
    pca = analyses.filters_pca(rng.normal(size=(32, 3, 8, 8)).astype(np.float32), k=6)
    mad = rng.uniform(0, 40, size=(3, 4)).astype(np.float32)
    logits = rng.normal(size=10).astype(np.float32)
    pngs = [
        embedding_figures.similarity_tiles_png(sim, GRID, highlight=2, title="t"),
        figures.map_png(sim[2], "tile", vmin=-1, vmax=1, highlight=2),
        embedding_figures.filters_grid_png(pca.components, [f"PC{i}" for i in range(6)], cols=3, title="pca"),
        embedding_figures.explained_variance_png(pca.explained_variance_ratio),
        plots.attention_distance_png(mad, analyses.uniform_attention_distance(GRID, PATCH), average=mad * 0.5, num_images=2),
        prediction_figures.top_k_png(["a", "b"], [0.7, 0.2]),
        prediction_figures.logits_png(logits, [1, 2], ["b", "c"]),
        pipeline_figures.vector_png(rng.normal(size=192), "v"),
        pipeline_figures.token_matrix_png(rng.normal(size=(21, 16)), "tokens", 1),
    ]
    for data in pngs:
        assert is_png(data)
        width, height = figures.image_size(data)
        assert 50 < width < 3000 and 50 < height < 3000


def test_similarity_tiles_sheet_holds_every_tile():
    # the sheet drawn is tile k at block (k // gw, k % gw): rebuild it the way the figure does
    sim = np.random.default_rng(4).random((20, 4, 5)).astype(np.float32)
    gh, gw = GRID
    sheet = np.full((gh * (gh + 1), gw * (gw + 1)), np.nan)
    for k in range(20):
        r, c = divmod(k, gw)
        sheet[r * (gh + 1):r * (gh + 1) + gh, c * (gw + 1):c * (gw + 1) + gw] = sim[k]
    assert np.array_equal(sheet[(gh + 1):(gh + 1) + gh, 2 * (gw + 1):2 * (gw + 1) + gw], sim[gw + 2])
    assert is_png(embedding_figures.similarity_tiles_png(sim, GRID))


def test_colorize_uses_the_full_range():
    rgb = figures.colorize(np.array([[0.0, 1.0]]), "gray")
    assert rgb[0, 0].tolist() == [0, 0, 0] and rgb[0, 1].tolist() == [255, 255, 255]


def test_colorize_scales_like_matplotlib_and_clips_to_given_limits():
    values = np.array([[0.0, 0.25], [0.5, 2.0]])
    ramp = figures.colorize(values, "gray")[..., 0].astype(int)  # grey: R = G = B
    assert ramp.tolist() == [[0, 32], [64, 255]]  # min-max scaled: 0, 1/8, 1/4, 1 of the 256-entry table
    clipped = figures.colorize(values, "gray", vmin=0, vmax=1)[..., 0].astype(int)
    assert clipped.tolist() == [[0, 64], [128, 255]]  # 2.0 clipped to the top
    assert figures.colorize(np.full((2, 2), 3.0), "gray").max() == 0  # a constant map: the colormap's low end


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_colorize_each_gives_every_map_the_bytes_colorize_gives_it(dtype):
    rng = np.random.default_rng(4)
    maps = (rng.random((7, 5, 6)) ** 3).astype(dtype)  # skewed, as attention is
    maps[1] *= 1e-4  # a tiny range
    maps[2] = 0.25  # a constant map: the low end
    maps[3, rng.random((5, 6)) < 0.2] = np.nan  # the "bad" colour
    maps[4] = 37.0 * maps[4] - 5  # negative values
    together = figures.colorize_each(maps)
    assert together.shape == (7, 5, 6, 3) and together.dtype == np.uint8
    for amap, colours in zip(maps, together, strict=True):
        np.testing.assert_array_equal(colours, figures.colorize(amap))


def test_enlarge_repeats_blocks_with_one_scale_or_two():
    a = np.arange(6).reshape(2, 3)
    assert figures.enlarge(a, 1) is a
    assert figures.enlarge(a, 2).tolist()[1] == [0, 0, 1, 1, 2, 2]
    big = figures.enlarge(a, (2, 3))
    assert big.shape == (4, 9) and big[3, 8] == 5 and big[0, 3] == 1


# ----------------------------------------------------------------------------------------------
# Figure cache keys (dashboard.figure_keys, used by caches.cached_figure)


class _Source:
    def __init__(self, key: str):
        self.cache_key = key


def _figure_a(source, *settings, **options) -> bytes:
    _BUILT.append((source.cache_key, settings, options))
    return repr((source.cache_key, settings, options)).encode()


def _figure_b(source, *settings, **options) -> bytes:
    return b"b"


_BUILT: list = []


def test_different_settings_never_share_a_figure_key():
    from dashboard.figure_keys import figure_key

    one, other = _Source("model|pretrained|sha1"), _Source("model|pretrained|sha2")
    cases = [
        (_figure_a, one, (1,), {}), (_figure_a, one, ("1",), {}), (_figure_a, one, (1.0,), {}), (_figure_a, one, (True,), {}),
        (_figure_a, one, ("a|b",), {}), (_figure_a, one, ("a", "b"), {}), (_figure_a, one, ((7, 7), 3), {}),
        (_figure_a, one, ((7, 7), 4), {}), (_figure_a, one, (None,), {}), (_figure_a, one, (), {}),
        (_figure_a, one, (), {"encoding": "png"}), (_figure_a, one, (), {"encoding": "jpeg"}),
        (_figure_a, other, (1,), {}), (_figure_b, one, (1,), {}),
    ]
    keys = [figure_key(build, source, settings, options) for build, source, settings, options in cases]
    assert len(set(keys)) == len(cases)  # with the old "|".join(str(...)) keys, 1/"1" and "a|b"/("a", "b") collided
    assert figure_key(_figure_a, one, (1,), {"x": 1, "y": 2}) == figure_key(_figure_a, one, (1,), {"y": 2, "x": 1})


def test_a_figure_key_refuses_what_it_could_not_tell_apart():
    from dashboard.figure_keys import figure_key

    source, layer = _Source("m|s"), 3
    with pytest.raises(TypeError, match="module-level"):
        figure_key(lambda s: b"", source, (), {})
    with pytest.raises(TypeError, match="module-level"):  # a closure draws `layer` without keying on it

        def closure(s):
            return bytes(layer)

        figure_key(closure, source, (), {})
    with pytest.raises(TypeError, match="arrays"):
        figure_key(_figure_a, source, (np.zeros(3),), {})
    with pytest.raises(TypeError, match="arrays"):
        figure_key(_figure_a, source, ((1, np.int64(2)),), {})
    with pytest.raises(TypeError, match="arrays"):
        figure_key(_figure_a, source, (), {"values": [1, 2]})


def test_cached_figure_builds_each_setting_once():
    from dashboard import caches

    _BUILT.clear()
    source = _Source(f"test|{np.random.default_rng().integers(1 << 62)}")  # fresh: the cache outlives tests
    first = caches.cached_figure(_figure_a, source, 1, encoding="png")
    assert caches.cached_figure(_figure_a, source, 1, encoding="png") == first
    assert caches.cached_figure(_figure_a, source, 2, encoding="png") != first
    assert caches.cached_figure(_figure_a, source, 1, encoding="jpeg") != first
    assert len(_BUILT) == 3


def _picture_of(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_map_and_token_matrix_are_drawn_without_matplotlib(monkeypatch):
    """Both are on the path of every new image (the rollout map, the pipeline's token matrix): PIL, not a
    matplotlib figure (50-350 ms of savefig each on the 2-core machine)."""
    def no_matplotlib(*args, **kwargs):
        raise AssertionError("a matplotlib figure was made")

    monkeypatch.setattr(figures, "Figure", no_matplotlib)
    monkeypatch.setattr(figures, "figure_png", no_matplotlib)
    rng = np.random.default_rng(5)
    assert is_png(figures.map_png(rng.random(GRID), "rollout", cmap=figures.ATTENTION_CMAP, label="share"))
    assert is_png(pipeline_figures.token_matrix_png(rng.normal(size=(21, 16)), "tokens", 1))


def test_map_png_shows_every_cell_in_its_colour_and_frames_the_highlight():
    amap = np.arange(20, dtype=np.float32).reshape(GRID) / 19  # every cell its own colour
    picture = _picture_of(figures.map_png(amap, "m", vmin=0, vmax=1, highlight=7))
    colours = figures.colorize(amap, figures.SIMILARITY_CMAP, 0, 1)  # (gh, gw, 3)
    scale = max(1, round(figures.MAP_DISPLAY_SIDE / max(GRID)))
    ys, xs = np.nonzero(np.all(picture == colours[0, 0], axis=-1))
    top, left = ys.min(), xs.min()  # where cell (0, 0) begins
    for r in range(GRID[0]):
        for c in range(GRID[1]):
            centre = picture[top + r * scale + scale // 2, left + c * scale + scale // 2]
            np.testing.assert_array_equal(centre, colours[r, c], err_msg=f"cell {r, c}")
    r, c = divmod(7, GRID[1])
    np.testing.assert_array_equal(picture[top + r * scale, left + c * scale + scale // 2], [255, 0, 0])  # the frame
    np.testing.assert_array_equal(picture[top + scale // 2, left + scale // 2], colours[0, 0])  # no frame elsewhere


def test_token_matrix_keeps_each_entry_and_marks_the_prefix_rows():
    rng = np.random.default_rng(6)
    tokens = rng.normal(size=(21, 16)).astype(np.float32)  # small: one pixel per entry
    picture = _picture_of(pipeline_figures.token_matrix_png(tokens, "tokens", 2))
    lim = float(np.percentile(np.abs(tokens), 99))
    colours = figures.colorize(tokens, "RdBu_r", -lim, lim)  # (T, D, 3)
    found = [(y, x) for y in range(picture.shape[0] - 21) for x in range(picture.shape[1] - 16)
             if np.array_equal(picture[y, x:x + 16], colours[0])]
    assert len(found) == 1
    top, left = found[0]
    np.testing.assert_array_equal(picture[top:top + 21, left:left + 16], colours)  # every entry, none hidden
    # the prefix tokens (rows 0-1) are set apart by marks on both sides at the boundary, outside the matrix
    np.testing.assert_array_equal(picture[top + 2, left - 8:left - 1], np.zeros((7, 3)))
    np.testing.assert_array_equal(picture[top + 2, left + 17:left + 23], np.zeros((6, 3)))


# ----------------------------------------------------------------------------------------------
# Text a projector can show, and a patch grid that keeps every line


def _ink_rows(picture: np.ndarray) -> np.ndarray:
    """Rows (y) of a white sheet with dark ink in them."""
    return np.flatnonzero((picture.min(axis=-1) < 128).any(axis=1))


def test_every_builder_records_the_size_of_its_smallest_text(crop):
    """The bytes say how large their smallest text is (the browser test scales it by the shown width): every
    figure that writes text writes it at TEXT_PX or more; pictures without text say so."""
    rng = np.random.default_rng(7)
    sim = analyses.pos_embed_similarity(rng.normal(size=(21, 16)), 1, False, GRID)
    pca = analyses.filters_pca(rng.normal(size=(32, 3, 8, 8)).astype(np.float32), k=6)
    with_text = [
        embedding_figures.similarity_tiles_png(sim, GRID, highlight=2, title="t"),
        embedding_figures.filters_grid_png(pca.components, [f"PC{i}" for i in range(6)], cols=3, title="pca"),
        embedding_figures.explained_variance_png(pca.explained_variance_ratio),
        figures.map_png(sim[2], "tile", vmin=-1, vmax=1, highlight=2),
        prediction_figures.top_k_png(["a", "b"], [0.7, 0.2]),
        prediction_figures.logits_png(rng.normal(size=10), [1, 2], ["b", "c"]),
        pipeline_figures.vector_png(rng.normal(size=192), ""),
        pipeline_figures.token_matrix_png(rng.normal(size=(21, 16)), "", 1),
        pipeline_figures.patch_grid_png(crop, GRID, PATCH, side=200),
        figures.jpeg_bytes(np.zeros((8, 8, 3), np.uint8), text_px=figures.TEXT_PX),
    ]
    for data in with_text:
        assert figures.recorded_text_px(data) >= figures.TEXT_PX >= 14
    assert figures.recorded_text_px(figures.png_bytes(crop)) is None
    assert figures.recorded_text_px(pipeline_figures.patch_grid_png(crop, GRID, PATCH, side=200, show_indices=False)) is None
    with pytest.raises(KeyError):
        figures.recorded_text_px(_plain_png(crop))


def _plain_png(rgb: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_matplotlib_figures_record_is_its_smallest_drawn_text():
    """Measured from the drawn figure, tick labels included (they exist only once it is drawn): 7 pt at 100 dpi."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1])
    ax.set_title("title", fontsize=12)
    ax.tick_params(labelsize=7)
    assert figures.recorded_text_px(figures.figure_png(fig, dpi=100)) == pytest.approx(7 * 100 / 72, abs=0.01)
    empty = Figure(figsize=(1, 1))
    assert figures.recorded_text_px(figures.figure_png(empty)) is None


def test_legible_raises_every_small_text_to_the_screen_size():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(fontsize=6)
    ax.set_xlabel("x", fontsize=7)
    ax.tick_params(labelsize=5)
    figures.legible(fig, 400, 300)
    assert figures.recorded_text_px(figures.figure_png(fig)) >= figures.TEXT_PX - 0.01
    assert figures.image_size(figures.figure_png(fig))[0] <= 400


def test_the_mosaics_titles_are_drawn_as_large_as_recorded(crop):
    """The record is no promise on paper: the titles' ink is at least 60 % of the font size tall (digits and
    lowercase letters reach about 0.7 of it)."""
    maps = np.random.default_rng(8).random((3, *GRID)).astype(np.float32)
    sheet = attention_figures.head_maps_mosaic(np.full_like(crop, 255), maps * 0, PATCH, ["head 0", "head 1", "mean"],
                                               cols=3, tile_side=80)
    title_band = sheet[:6 + figures.TEXT_PX + 5]  # the pad and the first row's titles
    rows = _ink_rows(title_band)
    assert rows.max() - rows.min() + 1 >= 0.6 * figures.TEXT_PX


def test_the_patch_grid_drawn_at_display_size_keeps_every_line():
    """A 224 px crop of 14 x 14 patches shown 190 px wide: the 13 lines between patches are all there (drawing them
    at 448 px and letting the browser shrink the picture lost one in two)."""
    crop = np.zeros((224, 224, 3), np.uint8)
    picture = pipeline_figures.patch_grid_image(crop, (14, 14), (16, 16), show_indices=False, side=190)
    assert picture.shape == (190, 190, 3)
    grey_columns = np.flatnonzero((picture[5] == figures.GRID_LINE).all(axis=-1))
    assert len(grey_columns) == 13
    assert np.allclose(grey_columns, [round(c * 190 / 14) for c in range(1, 14)], atol=1)


def test_patch_numbers_are_written_only_where_they_fit():
    crop = np.zeros((224, 224, 3), np.uint8)
    assert pipeline_figures.numbers_fit((14, 14), 440) and not pipeline_figures.numbers_fit((14, 14), 190)
    assert figures.recorded_text_px(pipeline_figures.patch_grid_png(crop, (14, 14), (16, 16), side=190)) is None
    big = pipeline_figures.patch_grid_png(crop, (14, 14), (16, 16), side=440)
    assert figures.recorded_text_px(big) == figures.TEXT_PX


def test_the_clickable_grid_draws_its_lines_and_numbers_as_vectors(crop):
    display = figures.enlarge(crop, 10)  # 400 x 500 px: patches of 80 px
    fig = figures.clickable_image_figure(display, GRID, PATCH, height=400, grid_lines=True, numbers=True, selected=3)
    lines = [shape for shape in fig.layout.shapes if shape.type == "line"]
    assert len(lines) == (GRID[0] - 1) + (GRID[1] - 1)
    markers = fig.data[1]
    assert markers.mode == "markers+text" and list(markers.text) == [str(k) for k in range(20)]
    assert markers.textfont.size >= 14
    small = figures.clickable_image_figure(display, (20, 25), (2, 2), height=300, numbers=True)  # 12 px a patch
    assert small.data[1].mode == "markers" and small.data[1].text is None


def test_the_clickable_map_built_without_plotlys_checks_is_the_figure_the_checks_pass(crop):
    """Built with validate=False (as every page does), the figure must reach the browser exactly as the checked
    build does: the same JSON once parsed (plotly may order keys differently), for every option of the figure."""
    display = figures.enlarge(crop, 10)
    amap = np.linspace(0, 1, GRID[0] * GRID[1], dtype=np.float32).reshape(GRID)
    jpeg = figures.encode(display, "jpeg")
    for args, options in (((display, GRID, PATCH), {}),
                          ((jpeg, GRID, PATCH), dict(selected=6, hover_values=amap, height=400)),
                          ((display, GRID, PATCH), dict(grid_lines=True, numbers=True, selected=3, height=400)),
                          ((display, (20, 25), (2, 2)), dict(numbers=True, height=300))):
        fast = figures.clickable_image_figure(*args, **options)
        checked = figures.clickable_image_figure(*args, **options, validate=True)
        assert json.loads(plotly.io.to_json(fast, validate=False)) == json.loads(plotly.io.to_json(checked))


def test_tiles_fill_the_box_without_leaving_it():
    for n, box in ((9, (550, 430)), (13, (550, 430)), (28, (549, 440)), (1, (300, 300))):
        cols, tile = figures.fit_tiles(n, box)
        rows = -(-n // cols)
        assert cols * (tile + 6) + 6 <= box[0] and rows * (tile + figures.TEXT_PX + 5 + 6) + 6 <= box[1]
        assert not any(figures.fit_tiles(n, box, max_cols=c)[1] > tile for c in range(1, n + 1))


def drawn_figures(monkeypatch, module) -> list:
    """The matplotlib figures `module`'s builders draw (through its figure_png), recorded once drawn."""
    drawn = []
    real = module.figure_png

    def recording(fig, *args, **kwargs):
        data = real(fig, *args, **kwargs)  # draws the figure: legends and axes are where the PNG shows them
        drawn.append(fig)
        return data

    monkeypatch.setattr(module, "figure_png", recording)
    return drawn


@pytest.mark.parametrize("build", [
    lambda: (pipeline_figures, lambda: pipeline_figures.vector_png(np.random.default_rng(0).normal(size=192), "")),
    lambda: (pipeline_figures, lambda: pipeline_figures.vector_png(np.random.default_rng(0).normal(size=192), "v")),
    lambda: (embedding_figures, lambda: embedding_figures.explained_variance_png(np.array([0.5, 0.3, 0.15, 0.05]))),
    lambda: (intervention_figures, lambda: intervention_figures.prediction_change_png(
        ["circle", "heart", "cross", "triangle", "star", "square"], [0.91, 0.02, 0.02, 0.02, 0.02, 0.01],
        [0.02, 0.02, 0.02, 0.02, 0.02, 0.90])),
    lambda: (intervention_figures, lambda: intervention_figures.prediction_change_png(["a", "b"], [0.6, 0.3],
                                                                                      [0.2, 0.7], title="t")),
], ids=["rgb-vector", "rgb-vector-titled", "explained-variance", "intervention", "intervention-titled"])
def test_legends_sit_outside_the_data_area_and_clear_of_the_title(monkeypatch, build):
    """A legend inside the axes hides the points or bars under it (the R/G/B legend covered a patch's values; the
    intervention's covered the last classes' bars): each legend is drawn outside its axes, and not over the title."""
    module, make = build()
    drawn = drawn_figures(monkeypatch, module)
    make()
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box, data = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
        overlap = Bbox.intersection(box, data)
        assert overlap is None or overlap.width * overlap.height < 1, (box, data)  # touching at most
        title = ax.title
        if title.get_text():
            assert Bbox.intersection(box, title.get_window_extent(renderer)) is None, "legend over the title"
