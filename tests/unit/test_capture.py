"""Capture exactness on every branch of the family, hook hygiene, and thread safety."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import torch

from conftest import FAMILY, drawn_image, hooks_on
from vit_core import CaptureError, analyses, preprocess, recording_hooks_on, run_with_capture
from vit_core.loading.model import patch_embed_bias, patch_embed_weight


def reference_patterns(model, tokens):
    """softmax(q k^T * scale) recomputed from each block's captured input, outside the hooked pass."""
    out = []
    with torch.no_grad():
        for blk, x in zip(model.blocks, tokens[:-1], strict=True):
            attn = blk.attn
            x = blk.norm1(torch.from_numpy(np.array(x))[None])  # (1, T, D)
            b, t, _ = x.shape
            qkv = attn.qkv(x).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])  # (1, H, T, hd)
            out.append(((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)[0].numpy())  # (H, T, T)
    return np.stack(out)  # (L, H, T, T)


@pytest.mark.parametrize("kind", list(FAMILY))
def test_capture_is_exact_on_every_branch_of_the_family(family, kind):
    loaded = family[kind]
    model, g = loaded.model, loaded.geometry
    assert all(blk.attn.fused_attn for blk in model.blocks), "the test needs timm's default fused attention"
    image = drawn_image(1)
    cap = run_with_capture(loaded, image)

    _, x = preprocess(loaded, image)
    with torch.no_grad():
        plain = model(x)[0].numpy()  # plain fused forward, no hooks
    np.testing.assert_allclose(cap.logits, plain, atol=1e-5, rtol=1e-4)

    t = g.num_tokens
    assert cap.pattern.shape == (g.num_layers, g.num_heads, t, t)
    assert cap.tokens.shape == (g.num_layers + 1, t, g.embed_dim)
    np.testing.assert_allclose(cap.pattern.sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(cap.pattern, reference_patterns(model, cap.tokens), atol=1e-6)
    assert cap.input_image.shape == (*g.img_size, 3) and cap.input_image.dtype == np.uint8

    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0
    assert all(blk.attn.fused_attn for blk in model.blocks)


def test_geometry_of_each_branch(family):
    g = {k: v.geometry for k, v in family.items()}
    assert g["class_token"].prefix_names == ("CLS",) and g["class_token"].grid == (14, 14)
    assert g["distilled"].prefix_names == ("CLS", "DIST")
    assert g["registers"].prefix_names == ("CLS", "REG1", "REG2", "REG3", "REG4") and g["registers"].no_embed_class
    assert g["registers"].patch_size == (14, 14) and g["registers"].grid == (8, 8)
    assert g["no_class_token"].prefix_names == () and not g["no_class_token"].has_class_token
    assert g["patch32"].grid == (7, 7) and g["patch32"].patch_size == (32, 32)
    assert g["input384"].img_size == (384, 384) and g["input384"].grid == (24, 24)
    assert g["class_token"].token_name(0) == "CLS" and g["class_token"].token_name(1 + 15) == "patch 15 (row 1, col 1)"


def test_capture_shows_the_conv_patch_embedding_is_a_linear_map(tiny, image):
    cap = run_with_capture(tiny, image)
    patches = analyses.split_patches(cap.input_tensor.transpose(1, 2, 0), tiny.geometry.patch_size)  # (N, 16, 16, 3)
    linear = analyses.embed_patches_linear(analyses.flatten_patches(patches), patch_embed_weight(tiny), patch_embed_bias(tiny))
    np.testing.assert_allclose(linear, cap.patch_embeddings, atol=1e-4)


def test_capture_arrays_are_read_only_numpy(tiny, image):
    cap = run_with_capture(tiny, image)
    for name in ("input_image", "pattern", "tokens", "logits", "final_tokens", "pre_logits", "patch_embeddings"):
        array = getattr(cap, name)
        assert isinstance(array, np.ndarray)
        with pytest.raises(ValueError):
            array.flat[0] = 0
    assert cap.pattern.dtype == np.float32


def test_hooks_and_state_restored_when_the_forward_raises(tiny, image):
    model = tiny.model
    model.train()  # capture must run in eval and give the caller's mode back

    def boom(self, x):
        raise RuntimeError("boom")

    model.blocks[1].mlp.forward = types.MethodType(boom, model.blocks[1].mlp)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            run_with_capture(tiny, image)
    finally:
        del model.blocks[1].mlp.forward
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0
    assert all(blk.attn.fused_attn for blk in model.blocks)
    assert model.training
    model.eval()
    assert not tiny.lock.locked()


def test_each_modules_own_mode_comes_back_after_a_capture(tiny, image):
    model = tiny.model
    model.train()
    model.blocks[0].eval()  # a frozen block inside a model being trained, as a fine-tuning script leaves it
    inside = []
    model.blocks[1].register_forward_pre_hook(lambda m, args: inside.append([mod.training for mod in model.modules()]))
    try:
        run_with_capture(tiny, image)
    finally:
        model.blocks[1]._forward_pre_hooks.clear()
        modes = [(name, mod.training) for name, mod in model.named_modules()]
        model.eval()
    assert inside and not any(inside[0])  # every module in eval mode during the forward
    assert all(training == (not name.startswith("blocks.0")) for name, training in modes)


def test_a_block_whose_attention_bypasses_the_hook_is_an_error_not_an_empty_view(tiny, image):
    attn = tiny.model.blocks[0].attn
    original = attn.forward

    def always_fused(*args, **kwargs):  # an attention that ignores the capture's un-fused switch
        attn.fused_attn = True
        return original(*args, **kwargs)

    attn.forward = always_fused
    try:
        with pytest.raises(CaptureError, match="one attention pattern per block"):
            run_with_capture(tiny, image)
    finally:
        del attn.forward
        attn.fused_attn = True
    assert hooks_on(tiny.model) == 0 and recording_hooks_on(tiny.model) == 0
    run_with_capture(tiny, image)  # and the model still works


def test_concurrent_captures_equal_sequential_ones(tiny):
    images = [drawn_image(seed) for seed in range(8)]
    sequential = [run_with_capture(tiny, im) for im in images]
    results: dict[int, object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(images))

    def work(i):
        try:
            barrier.wait()
            results[i] = run_with_capture(tiny, images[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(images))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for i, expected in enumerate(sequential):
        np.testing.assert_array_equal(results[i].logits, expected.logits)
        np.testing.assert_array_equal(results[i].pattern, expected.pattern)
        np.testing.assert_array_equal(results[i].input_image, expected.input_image)
    assert len({r.logits.tobytes() for r in results.values()}) == len(images)  # really different images
    assert hooks_on(tiny.model) == 0 and recording_hooks_on(tiny.model) == 0


def test_crop_follows_the_model_preprocessing(tiny):
    # 448 x 224 image, crop_pct 0.9: resize shorter side to int(224 / 0.9) = 248, centre-crop 224.
    wide = np.zeros((224, 448, 3), dtype=np.uint8)
    wide[:, 224 - 8 : 224 + 8] = 255  # a white vertical bar in the centre
    from PIL import Image

    cap = run_with_capture(tiny, Image.fromarray(wide))
    assert cap.input_image.shape == (224, 224, 3)
    column = cap.input_image[:, :, 0].mean(axis=0)
    assert column[112] > 200 and column[10] < 20  # the bar stays centred, the edges are cropped away
    expected = (cap.input_image.astype(np.float32) / 255 - 0.5) / 0.5  # mean = std = 0.5 for this model
    np.testing.assert_allclose(cap.input_tensor.transpose(1, 2, 0), expected, atol=1e-6)


def test_hook_counts_see_hooks_inside_a_pass_and_a_leaked_one(tiny, image):
    """Both counters are live: 0 outside, every recording hook inside a pass, and a hook left behind counts."""
    from vit_core.hooks import intermediates_kept

    model, g = tiny.model, tiny.geometry
    expected = 2 * g.num_layers + 4  # attention per block, output per block, blocks[0] input, patch_embed, norm, head
    with intermediates_kept(model, lambda key, tensor: None):
        assert recording_hooks_on(model) == hooks_on(model) == expected
    assert recording_hooks_on(model) == hooks_on(model) == 0

    leaked = model.blocks[0].register_forward_hook(lambda m, i, o: None)  # what a forgotten handle looks like
    try:
        assert hooks_on(model) == 1
    finally:
        leaked.remove()
    assert hooks_on(model) == 0


def test_the_eval_transform_is_built_once_per_model(tiny, image, monkeypatch):
    import timm.data

    calls = []
    monkeypatch.setattr(timm.data, "create_transform", lambda *a, **k: calls.append(1))
    run_with_capture(tiny, image)
    run_with_capture(tiny, drawn_image(2))
    assert calls == []  # built at load time (LoadedModel.crop_transform / tensor_transform), not per image
    crop, x = preprocess(tiny, image)
    assert crop.shape == (224, 224, 3) and x.shape == (1, 3, 224, 224) and x.dtype == torch.float32
