"""The Registers & norms tab and its figures, on random-init models in which a high-norm token is PLANTED.

Two ways to plant one:
- in the model: one patch's row of the position embedding gets norm 100 (the other tokens' norms are a few
  units), so that patch token's norm is far above the others at every layer; the view is then driven
  alone through `AppTest.from_function` (`view_script`), on a class-token ViT, a ViT without prefix tokens
  (SigLIP) and a register model (CLS + 4 REG);
- in the image, for the whole app: a mid-grey picture (normalised to about 0) with one high-contrast
  checkerboard patch, uploaded to the tiny test model's app (only that patch's embedding is large).
What the tab states (the marked patches, the prefix norms, the attention shares) is checked against
`vit_core.analyses` and against naive loops over the same capture.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import vit_core
from conftest import APP_TIMEOUT, assert_healthy, drawn_image, encoded, run_app
from dashboard import session
from dashboard.figures import base as figures
from dashboard.figures import registers as register_figures
from dashboard.image_choice import ImageChoice
from dashboard.models import TEST_TINY, ModelRequest, build_named_model
from dashboard.views import registers as register_views
from dashboard.views.context import ViewContext
from vit_core import analyses, explain

TAB = "Registers & norms"
PLANTED_NORM = 100.0
# key -> (timm name, create_model kwargs, the planted patch)
PLANTED = {
    "class_token": ("vit_tiny_patch16_224", dict(depth=2), 23),  # 14 x 14 patches, CLS
    "no_prefix": ("vit_base_patch16_siglip_224", dict(embed_dim=64, num_heads=4, depth=2), 30),  # 14 x 14, no prefix token
    "registers": ("vit_small_patch14_reg4_dinov2", dict(embed_dim=64, num_heads=4, depth=2, img_size=112), 45),  # 8 x 8, +4 REG
}


@functools.lru_cache(maxsize=None)
def planted_model(key: str) -> vit_core.LoadedModel:
    """A random-init ViT whose position-embedding row of one patch has norm PLANTED_NORM (cached: the view
    script of `AppTest.from_function` runs in this process and gets the same object)."""
    name, kwargs, patch = PLANTED[key]
    loaded = vit_core.load_model(name, pretrained=False, seed=0, device="cpu", **kwargs)
    g = loaded.geometry
    row = patch + (0 if g.no_embed_class else g.num_prefix_tokens)  # the pos_embed row of that patch
    direction = torch.randn(g.embed_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loaded.model.pos_embed[0, row] = direction / direction.norm() * PLANTED_NORM
    return loaded


@functools.lru_cache(maxsize=None)
def planted_context(key: str) -> ViewContext:
    """The planted model, a drawn image and its capture, as the views get them."""
    loaded = planted_model(key)
    data = encoded(np.asarray(drawn_image(3)))
    picture = vit_core.decode_image(data).image
    image = ImageChoice("drawn.png", hashlib.sha256(data).hexdigest(), data, picture.size, (), picture)
    request = ModelRequest(f"planted-{key}")  # a name of its own: figure cache keys hold the request's key
    return ViewContext(request, loaded, vit_core.run_with_capture(loaded, picture), image)


@functools.lru_cache(maxsize=None)
def steered_context(key: str) -> ViewContext:
    """`planted_context(key)` with the last block's attention replaced by a known one (a random-init model attends
    almost uniformly, so its shares cannot tell one group of keys from another). Every query of every head gives
    30% to the planted patch; with registers 40% to them (10% each) and 30% to the class token; without, 40% to
    the class token and 30% to patch 0."""
    ctx = planted_context(key)
    g, patch = ctx.loaded.geometry, PLANTED[key][2]
    registers = [i for i, name in enumerate(g.prefix_names) if name.startswith("REG")]
    cls = g.prefix_names.index("CLS")
    row = np.zeros(g.num_tokens, dtype=np.float32)
    row[g.num_prefix_tokens + patch] = 0.3
    if registers:
        row[registers] = 0.4 / len(registers)
        row[cls] = 0.3
    else:
        row[cls] = 0.4
        row[g.num_prefix_tokens] = 0.3  # patch 0
    pattern = ctx.cap.pattern.copy()  # (L, H, T, T)
    pattern[-1] = row  # every head, every query
    cap = dataclasses.replace(ctx.cap, pattern=pattern)
    return dataclasses.replace(ctx, request=ModelRequest(f"planted-steered-{key}"), cap=cap)


def view_script(key: str, steered: bool) -> None:
    """The Registers & norms view alone, on `planted_context(key)` or `steered_context(key)` (run by
    AppTest.from_function, in this process)."""
    from app import test_registers
    from dashboard.views.registers import registers_view

    registers_view((test_registers.steered_context if steered else test_registers.planted_context)(key))


def run_view(key: str, steered: bool = False) -> AppTest:
    at = AppTest.from_function(view_script, args=(key, steered), default_timeout=APP_TIMEOUT)
    at.run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    return at


def pictures(at: AppTest) -> tuple:
    """The pictures shown, with their captions (this planted model's blocks leave the norms as they are: the row
    shown is said in the captions)."""
    return tuple((url, im.proto.imgs[0].caption) for im in at.get("image") for url in im.value)


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def naive_share(pattern_layer: np.ndarray, keys: list[int]) -> float:
    """The mean over heads and queries of the attention that goes to `keys`, by loops."""
    heads, tokens, _ = pattern_layer.shape
    total = 0.0
    for h in range(heads):
        for q in range(tokens):
            total += sum(float(pattern_layer[h, q, k]) for k in keys)
    return total / (heads * tokens)


# ----------------------------------------------------------------------------------------------
# The analysis finds the planted token


@pytest.mark.parametrize("key", list(PLANTED))
def test_high_norm_patches_marks_exactly_the_planted_patch(key):
    ctx = planted_context(key)
    g, patch = ctx.loaded.geometry, PLANTED[key][2]
    norms = explain.token_norms(ctx.cap)  # (L+1, T)
    high = analyses.high_norm_patches(norms, g.num_prefix_tokens)  # (L+1, N)
    assert high.shape == (g.num_layers + 1, g.num_patches)
    for row in range(g.num_layers + 1):
        assert np.flatnonzero(high[row]).tolist() == [patch], f"row {row}"
        assert norms[row, g.num_prefix_tokens + patch] > 5 * np.median(norms[row, g.num_prefix_tokens:])
    np.testing.assert_allclose(analyses.high_norm_rate(norms, g.num_prefix_tokens), 1 / g.num_patches)


def test_without_the_plant_the_same_model_marks_nothing_far_out():
    """The control: the unplanted random-init model has no patch anywhere near the planted norm."""
    name, kwargs, patch = PLANTED["class_token"]
    loaded = vit_core.load_model(name, pretrained=False, seed=0, device="cpu", **kwargs)
    norms = explain.token_norms(vit_core.run_with_capture(loaded, drawn_image(3)))
    assert norms[:, loaded.geometry.num_prefix_tokens + patch].max() < PLANTED_NORM / 5
    assert not analyses.high_norm_patches(norms, loaded.geometry.num_prefix_tokens)[:, patch].any()


@pytest.mark.parametrize("key", list(PLANTED))
def test_one_rows_norms_and_marks_equal_those_of_all_rows(key):
    cap, p = planted_context(key).cap, planted_model(key).geometry.num_prefix_tokens
    norms = explain.token_norms(cap)  # (L+1, T)
    high = analyses.high_norm_patches(norms, p)  # (L+1, N)
    for row in range(norms.shape[0]):
        np.testing.assert_array_equal(explain.token_norms(cap, row), norms[row])  # one row, as the view computes it
        np.testing.assert_array_equal(analyses.high_norm_patches(norms[row], p), high[row])  # one row, as the view calls it


def test_register_and_patch_keys():
    prefix = ("CLS", "REG1", "REG2", "REG3", "REG4")
    assert register_views.register_keys(prefix, 3).tolist() == [False, True, True, True, True, False, False, False]
    assert not register_views.register_keys(("CLS", "DIST"), 2).any()
    assert register_views.register_keys((), 2).tolist() == [False, False]
    assert register_views.patch_keys(np.array([False, True, False]), 2).tolist() == [False, False, False, True, False]


# ----------------------------------------------------------------------------------------------
# The view, alone, on the planted models


@pytest.mark.parametrize("key", list(PLANTED))
def test_the_view_marks_the_planted_patch_and_states_the_shares(key):
    ctx = planted_context(key)
    g, cap, patch = ctx.loaded.geometry, ctx.cap, PLANTED[key][2]
    p = g.num_prefix_tokens
    at = run_view(key)
    text = markdown(at)
    assert f"**1** of {g.num_patches} patch tokens exceed the fence" in text
    assert g.token_name(p + patch) in text  # "patch 23 (row 1, col 9)"
    assert at.get("image"), "no figure"
    last = cap.pattern[-1]  # (H, T, T)
    assert metric(at, "Marked patches") == f"{naive_share(last, [p + patch]):.1%}"
    if g.has_class_token:
        assert metric(at, "Class token") == f"{naive_share(last, [g.prefix_names.index('CLS')]):.1%}"
    else:
        assert not any(m.label == "Class token" for m in at.metric) and "| token | norm |" not in text
    norms = explain.token_norms(cap)[-1]  # (T,): the default row is the last
    for i, name in enumerate(g.prefix_names):
        assert f"| {name} | {norms[i]:.3g} |" in text
    registers = [i for i, name in enumerate(g.prefix_names) if name.startswith("REG")]
    if registers:
        assert "**This model has 4 register token(s)** (REG1, REG2, REG3, REG4)" in text
        assert metric(at, "Registers") == f"{naive_share(last, registers):.1%}"
    else:
        prefix = "its prefix tokens: CLS" if g.prefix_names else "and no prefix tokens at all"
        assert f"**This model has no registers** ({prefix})" in text
        assert not any(m.label == "Registers" for m in at.metric)
    assert "Vision Transformers Need Registers" in text and "ICLR 2024" in text


@pytest.mark.parametrize("key", ["class_token", "registers"])
def test_the_view_states_the_shares_of_a_known_attention(key):
    ctx = steered_context(key)
    g, patch = ctx.loaded.geometry, PLANTED[key][2]
    at = run_view(key, steered=True)
    last = ctx.cap.pattern[-1]  # (H, T, T)
    registers = [i for i, name in enumerate(g.prefix_names) if name.startswith("REG")]
    assert naive_share(last, [g.num_prefix_tokens + patch]) == pytest.approx(0.3)
    assert metric(at, "Marked patches") == "30.0%"
    if registers:
        assert metric(at, "Registers") == "40.0%" and metric(at, "Class token") == "30.0%"
        assert "4 token(s); uniform attention: " + f"{4 / g.num_tokens:.1%}" in "\n".join(c.value for c in at.caption)
    else:
        assert metric(at, "Class token") == "40.0%"


def test_the_layer_slider_changes_the_row_shown():
    key = "registers"
    ctx = planted_context(key)
    g, patch = ctx.loaded.geometry, PLANTED[key][2]
    at = run_view(key)
    assert at.select_slider(key=session.K_NORM_LAYER).value == g.num_layers  # the last row by default
    before = pictures(at)
    at.select_slider(key=session.K_NORM_LAYER).set_value(0).run()
    assert_healthy(at)
    assert pictures(at) != before
    text = markdown(at)
    norms = explain.token_norms(ctx.cap)[0]  # (T,): the embeddings
    assert g.token_name(g.num_prefix_tokens + patch) in text  # planted in the position embedding: marked from row 0 on
    assert f"| REG1 | {norms[1]:.3g} |" in text
    assert "high-norm in the embeddings" in text


# ----------------------------------------------------------------------------------------------
# The whole app, with the high-norm token planted in the image


def planted_image(row: int, col: int) -> bytes:
    """Mid grey (normalised to about 0), one checkerboard patch at (row, col) of the test model's crop.

    The test model resizes the shorter side to 224 / 0.9 = 248 px and crops the centre 224: a 248 x 248
    picture is cropped 12 px in from each side, so patch (row, col) starts at 12 + 16 * (row, col)."""
    picture = np.full((248, 248, 3), 128, dtype=np.uint8)
    yy, xx = np.mgrid[0:16, 0:16]
    top, left = 12 + 16 * row, 12 + 16 * col
    picture[top:top + 16, left:left + 16] = np.where(((yy // 2 + xx // 2) % 2)[..., None] == 0, 255, 0)
    return encoded(picture)


def test_the_tab_in_the_app_marks_a_patch_planted_in_the_image(tiny_env):
    data = planted_image(5, 9)
    reference = build_named_model(TEST_TINY)
    cap = vit_core.run_with_capture(reference, vit_core.decode_image(data).image)
    g = reference.geometry
    norms = explain.token_norms(cap)
    assert np.flatnonzero(analyses.high_norm_patches(norms, 1)[-1]).tolist() == [5 * 14 + 9]  # the plant worked

    at = run_app(view=TAB)
    at.file_uploader(key="upload").set_value(("planted.png", data, "image/png")).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    text = markdown(at)
    assert "**1** of 196 patch tokens exceed the fence" in text and "patch 79 (row 5, col 9)" in text
    assert "**This model has no registers**" in text
    assert metric(at, "Marked patches") == f"{naive_share(cap.pattern[-1], [1 + 79]):.1%}"
    assert metric(at, "Class token") == f"{naive_share(cap.pattern[-1], [0]):.1%}"
    assert f"| CLS | {norms[-1, 0]:.3g} |" in text
    assert f"`[{g.num_layers + 1}, 197, 192]`" in "\n".join(c.value for c in at.caption)


def test_the_layer_is_a_url_parameter(tiny_env):
    at = run_app(view=TAB, norm_layer="after block 0")
    assert at.select_slider(key=session.K_NORM_LAYER).value == 1
    assert "high-norm after block 0" in markdown(at)


# ----------------------------------------------------------------------------------------------
# Figures


def test_norm_map_frames_exactly_the_high_norm_patches():
    crop = np.full((32, 48, 3), 90, dtype=np.uint8)  # a 4 x 6 grid of 8 px patches
    norm_map = np.arange(24, dtype=np.float32).reshape(4, 6)
    high = np.zeros((4, 6), dtype=bool)
    high[1, 2] = high[3, 5] = True
    picture = register_figures.norm_map_image(crop, norm_map, high, (8, 8))
    s = figures.display_scale(48)
    assert picture.shape == (32 * s, 48 * s, 3)
    framed = np.all(picture == register_figures.HIGH_NORM_FRAME, axis=-1)  # (H*s, W*s)
    cells = {(y // (8 * s), x // (8 * s)) for y, x in zip(*np.nonzero(framed), strict=True)}
    assert cells == {(1, 2), (3, 5)}
    top, left = 1 * 8 * s, 2 * 8 * s
    assert framed[top, left:left + 8 * s].all() and framed[top:top + 8 * s, left].all()  # the whole border
    unmarked = register_figures.norm_map_image(crop, norm_map, np.zeros_like(high), (8, 8))
    assert not np.any(np.all(unmarked == register_figures.HIGH_NORM_FRAME, axis=-1))


@pytest.mark.parametrize("patch_norms, prefix_names", [
    (np.r_[np.linspace(1, 2, 50), 30.0], ("CLS", "REG1", "REG2")),
    (np.full(16, 3.0), ()),  # every norm equal (one histogram bin), no prefix token
])
def test_norm_histogram_and_rate_figures_are_pngs(patch_norms, prefix_names):
    patch_norms = patch_norms.astype(np.float32)
    fence = float(analyses.high_norm_fence(patch_norms))
    prefix_norms = np.linspace(5, 9, len(prefix_names)).astype(np.float32)
    hist = register_figures.token_norms_png(patch_norms, fence, prefix_norms, prefix_names, title="after block 1")
    rate = register_figures.high_norm_rate_png(np.array([0.0, 0.02, 0.05], dtype=np.float32), title="rate")
    for data in (hist, rate):
        assert data.startswith(b"\x89PNG") and figures.image_size(data)[0] > 300
