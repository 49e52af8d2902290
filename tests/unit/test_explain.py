"""Explanations, logit lens, interventions and faithfulness, each against a loop-based reference of its
definition (analyses.md, "Why this prediction") on the class-token, distilled, register and
no-class-token branches; hook, flag and gradient hygiene; threads."""

from __future__ import annotations

import copy
import dataclasses
import threading
import types

import numpy as np
import pytest
import torch

from conftest import drawn_image, hooks_on
from tools.vit_families import LRP_FAMILIES
from vit_core import CaptureError, analyses, explain, load_model, preprocess, recording_hooks_on, run_with_capture
from vit_core.explain import perturbation

BRANCHES = ["class_token", "distilled", "registers", "no_class_token"]


# ---------------------------------------------------------------------------------- a reference forward, block by block


def reference_forward(model, x, *, kept=None, attn_override=None):
    """timm's forward written out block by block with explicit attention: (1, 3, H, W) -> logits (1, C),
    the patterns (one (1, H, T, T) per block, retain_grad'ed when grad is on) and blocks[-1].norm1's output.

    kept: patch indices kept after the position embedding (a Python list; None = all), gathered row by row.
    attn_override(layer, per_head_outputs (1, H, T, hd)) -> the (1, T, H*hd) proj input, if given."""
    tokens = model._pos_embed(model.patch_embed(x))  # (1, T, D)
    p = model.num_prefix_tokens
    if kept is not None:
        tokens = torch.cat([tokens[:, :p]] + [tokens[:, p + k:p + k + 1] for k in kept], dim=1)
    tokens = model.norm_pre(tokens)
    patterns, norm1_out = [], None
    for layer, blk in enumerate(model.blocks):
        attn = blk.attn
        h = blk.norm1(tokens)
        if layer == len(model.blocks) - 1:
            norm1_out = h
            if h.requires_grad:
                h.retain_grad()
        b, t, _ = h.shape
        qkv = attn.qkv(h).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = attn.q_norm(qkv[0]), attn.k_norm(qkv[1]), qkv[2]
        pattern = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)  # (1, H, T, T)
        if pattern.requires_grad:
            pattern.retain_grad()
        patterns.append(pattern)
        heads = pattern @ v  # (1, H, T, hd)
        merged = heads.transpose(1, 2).reshape(b, t, -1) if attn_override is None else attn_override(layer, heads)
        tokens = tokens + blk.ls1(attn.proj(attn.norm(merged)))
        tokens = tokens + blk.ls2(blk.mlp(blk.norm2(tokens)))
    logits = model.forward_head(model.norm(tokens))
    return logits, patterns, norm1_out


def reference_gradients(loaded, image, target):
    """dy_c/dpattern and dy_c/d norm1 by .backward() on a frozen deep copy of the model (its .grad untouched)."""
    model = copy.deepcopy(loaded.model).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    _, x = preprocess(loaded, image)
    logits, patterns, norm1 = reference_forward(model, x.clone().requires_grad_(True))
    logits[0, target].backward()
    pattern = np.stack([a.detach()[0].numpy() for a in patterns])  # (L, H, T, T)
    grad = np.stack([a.grad[0].numpy() for a in patterns])
    return pattern, grad, norm1.detach()[0].numpy(), norm1.grad[0].numpy()


def class_row_loop(matrix, p, has_cls):
    if has_cls:
        return matrix[0]
    return sum(matrix[p + i] for i in range(matrix.shape[0] - p)) / (matrix.shape[0] - p)


def chefer_loop(pattern, grad, p, grid, has_cls):
    layers, heads, t, _ = pattern.shape
    relevance = np.eye(t)
    for layer in range(layers):
        cam = np.zeros((t, t))
        for h in range(heads):
            cam += np.maximum(grad[layer, h].astype(np.float64) * pattern[layer, h], 0) / heads
        product = np.zeros((t, t))
        for i in range(t):
            for j in range(t):
                product[i, j] = cam[i, :] @ relevance[:, j]
        relevance = relevance + product
    return class_row_loop(relevance, p, has_cls)[p:].reshape(grid)


def gradcam_loop(x, g, grid):
    n, d = x.shape
    weights = [sum(g[i, j] for i in range(n)) / n for j in range(d)]
    return np.array([max(0.0, sum(weights[j] * x[i, j] for j in range(d))) for i in range(n)]).reshape(grid)


def raw_attention_loop(pattern, p, grid, has_cls):
    last = sum(pattern[-1, h] for h in range(pattern.shape[1])) / pattern.shape[1]  # (T, T)
    return class_row_loop(last, p, has_cls)[p:].reshape(grid)


# ---------------------------------------------------------------------------------- relevance maps


@pytest.mark.parametrize("kind", BRANCHES)
def test_relevance_maps_equal_their_loop_references(family, kind):
    loaded = family[kind]
    g = loaded.geometry
    p, grid, has_cls = g.num_prefix_tokens, g.grid, g.has_class_token
    image = drawn_image(2)
    cap = run_with_capture(loaded, image)
    top2 = int(np.argsort(-cap.logits, kind="stable")[1])  # a target other than the top-1
    relevance = explain.relevance_maps(loaded, image, target=top2)

    assert relevance.target == top2
    assert list(relevance.maps) == list(explain.METHODS) and relevance.unsupported == {}
    assert set(relevance.gamma_choice) == {"attnlrp", "cplrp"}  # each LRP map's gamma choice (tests/unit/test_lrp.py)
    for m in relevance.maps.values():
        assert m.shape == grid and m.dtype == np.float32

    pattern, grad, norm1, norm1_grad = reference_gradients(loaded, image, top2)
    np.testing.assert_allclose(pattern, cap.pattern, atol=1e-5)
    np.testing.assert_allclose(relevance.maps["chefer"], chefer_loop(pattern, grad, p, grid, has_cls), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(relevance.maps["gradcam"], gradcam_loop(norm1[p:], norm1_grad[p:], grid), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(relevance.maps["raw_attention"], raw_attention_loop(cap.pattern, p, grid, has_cls), atol=1e-6)
    np.testing.assert_allclose(relevance.maps["rollout"],
                               analyses.attention_rollout(cap.pattern, p, grid, has_class_token=has_cls), atol=1e-6)
    assert relevance.maps["chefer"].max() > 0 and relevance.maps["gradcam"].max() > 0  # really computed, not all clipped

    # With the capture given, the attention-only maps come from it (same numbers), and the default target is top-1.
    from_cap = explain.relevance_maps(loaded, image, cap=cap)
    assert from_cap.target == int(np.argmax(cap.logits))
    np.testing.assert_allclose(from_cap.maps["rollout"], relevance.maps["rollout"], atol=1e-6)


def test_chefer_and_gradcam_pure_functions_on_random_arrays(family):
    g = family["distilled"].geometry
    rng = np.random.default_rng(0)
    t, n = g.num_tokens, g.num_patches
    pattern = rng.random((3, 2, t, t)).astype(np.float32)
    grad = rng.normal(size=(3, 2, t, t)).astype(np.float32)
    expected = chefer_loop(pattern, grad, g.num_prefix_tokens, g.grid, True)
    np.testing.assert_allclose(explain.chefer_map(pattern, grad, g), expected, rtol=1e-5)
    x, gx = rng.normal(size=(n, 5)), rng.normal(size=(n, 5))
    np.testing.assert_allclose(explain.gradcam_map(x, gx, g.grid), gradcam_loop(x, gx, g.grid), rtol=1e-5, atol=1e-7)


def test_resolve_target(tiny):
    logits = np.zeros(tiny.geometry.num_classes, dtype=np.float32)
    logits[[7, 3]] = 5.0  # a tie: the lower index wins
    assert explain.resolve_target(tiny, logits) == 3
    assert explain.resolve_target(tiny, logits, 42) == 42
    label = tiny.label(281)
    assert explain.resolve_target(tiny, logits, label.upper()) == 281
    assert explain.resolve_target(tiny, logits, label.split(",")[0]) == 281
    assert explain.resolve_target(tiny, logits, "12") == 12
    with pytest.raises(ValueError, match="outside"):
        explain.resolve_target(tiny, logits, len(logits))
    with pytest.raises(ValueError, match="no class"):
        explain.resolve_target(tiny, logits, "no such thing")


# ---------------------------------------------------------------------------------- hygiene


def model_state(model):
    return ([blk.attn.fused_attn for blk in model.blocks], [p.requires_grad for p in model.parameters()], model.training)


def assert_clean(loaded, before):
    model = loaded.model
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0
    assert model_state(model) == before
    assert all(p.grad is None for p in model.parameters())
    assert not loaded.lock.locked()


def test_a_capture_stands_for_its_image(tiny, image):
    """Every entry point given the Capture of an image (its input_tensor: no second decode) gives what it gives
    for the image itself, bit for bit."""
    cap = run_with_capture(tiny, image)
    from_image, from_cap = explain.relevance_maps(tiny, image, cap=cap), explain.relevance_maps(tiny, cap, cap=cap)
    for method in from_image.maps:
        np.testing.assert_array_equal(from_image.maps[method], from_cap.maps[method])
    intervention = dict(drop=(3, 40), mask=(7,), ablate=((1, 2),), ablation="mean")
    np.testing.assert_array_equal(explain.predict_intervened(tiny, image, **intervention),
                                  explain.predict_intervened(tiny, cap, **intervention))
    target = from_image.target
    a = explain.faithfulness(tiny, image, from_image.maps, target, steps=4, random_orders=2)
    b = explain.faithfulness(tiny, cap, from_image.maps, target, steps=4, random_orders=2)
    assert a.deletion_auc == b.deletion_auc and a.insertion_auc == b.insertion_auc
    assert cap.input_tensor.flags.writeable is False  # the shared capture was not made writable or changed


def test_token_norms_of_one_row_equal_that_row_of_all(tiny, image):
    """token_norms(cap, row) is row `row` of token_norms(cap), bit for bit, and both are the float64 norms."""
    cap = run_with_capture(tiny, image)
    every = explain.token_norms(cap)  # (L+1, T)
    assert every.shape == cap.tokens.shape[:2] and every.dtype == np.float32
    np.testing.assert_array_equal(every, np.linalg.norm(cap.tokens.astype(np.float64), axis=-1).astype(np.float32))
    for row in range(every.shape[0]):
        one = explain.token_norms(cap, row)  # (T,)
        assert one.dtype == np.float32
        np.testing.assert_array_equal(one, every[row])


def test_relevance_pass_leaves_the_model_as_it_was(tiny, image):
    model = tiny.model
    blocks = list(model.blocks)
    params = list(model.parameters())
    blocks[0].attn.fused_attn = False  # a mixed state, to see each flag restored as it was
    params[0].requires_grad_(False)
    try:
        before = model_state(model)
        explain.relevance_maps(tiny, image)
        assert_clean(tiny, before)
    finally:
        blocks[0].attn.fused_attn = True
        params[0].requires_grad_(True)


@pytest.mark.parametrize("entry", ["relevance", "intervention", "faithfulness"])
def test_state_restored_when_the_forward_raises(tiny, image, entry):
    model = tiny.model
    model.train()  # each entry point runs in eval and gives the caller's mode back
    before = model_state(model)

    def boom(self, x):
        raise RuntimeError("boom")

    run = {
        "relevance": lambda: explain.relevance_maps(tiny, image),
        "intervention": lambda: explain.predict_intervened(tiny, image, drop=[1], ablate=[(0, 1)], ablation="mean"),
        "faithfulness": lambda: explain.faithfulness(tiny, image, {"m": np.zeros(tiny.geometry.grid)}, 0, steps=2),
    }[entry]
    model.blocks[1].mlp.forward = types.MethodType(boom, model.blocks[1].mlp)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            run()
        assert model.training  # the caller's mode is back, also after the error
    finally:
        del model.blocks[1].mlp.forward
        model.eval()
    assert_clean(tiny, (before[0], before[1], False))
    assert before[2]


def test_an_attention_that_bypasses_the_hook_is_an_error_not_a_wrong_map(tiny, image):
    attn = tiny.model.blocks[0].attn
    original = attn.forward

    def always_fused(*args, **kwargs):  # ignores the un-fused switch: no pattern, no gradient to it
        attn.fused_attn = True
        return original(*args, **kwargs)

    attn.forward = always_fused
    try:
        with pytest.raises(CaptureError, match="one attention pattern per block"):
            explain.relevance_maps(tiny, image)
    finally:
        del attn.forward
        attn.fused_attn = True
    assert_clean(tiny, ([True] * tiny.geometry.num_layers, [True] * len(list(tiny.model.parameters())), False))


# ---------------------------------------------------------------------------------- logit lens


@pytest.mark.parametrize("kind", BRANCHES)
def test_logit_lens_equals_truncated_models(family, kind):
    loaded = family[kind]
    image = drawn_image(4)
    cap = run_with_capture(loaded, image)
    lens = explain.logit_lens(loaded, cap)
    num_layers = loaded.geometry.num_layers
    assert lens.shape == (num_layers + 1, cap.logits.shape[0]) and lens.dtype == np.float32  # registers: no head, C = D
    np.testing.assert_allclose(lens[-1], cap.logits, atol=1e-5, rtol=1e-5)
    _, x = preprocess(loaded, image)
    for layer in range(num_layers + 1):
        truncated = copy.deepcopy(loaded.model)
        truncated.blocks = torch.nn.Sequential(*list(truncated.blocks)[:layer])  # stop after block `layer`
        with torch.no_grad():
            expected = truncated(x)[0].numpy()
        np.testing.assert_allclose(lens[layer], expected, atol=1e-5, rtol=1e-4)

    p = loaded.geometry.num_prefix_tokens
    per_patch = explain.patch_logit_lens(loaded, cap, 1)
    assert per_patch.shape == (loaded.geometry.num_patches, cap.logits.shape[0])
    m = loaded.model
    with torch.no_grad():
        for k in range(0, loaded.geometry.num_patches, 7):
            token = torch.from_numpy(np.array(cap.tokens[1, p + k]))[None]  # (1, D)
            np.testing.assert_allclose(per_patch[k], m.head(m.fc_norm(m.norm(token)))[0].numpy(), atol=1e-5)


# ---------------------------------------------------------------------------------- interventions


@pytest.mark.parametrize("kind", BRANCHES)
def test_interventions_equal_explicit_references(family, kind):
    loaded = family[kind]
    model, g = loaded.model, loaded.geometry
    image = drawn_image(5)
    cap = run_with_capture(loaded, image)
    _, x = preprocess(loaded, image)
    n = g.num_patches

    np.testing.assert_allclose(explain.predict_intervened(loaded, image), cap.logits, atol=1e-5, rtol=1e-4)

    dropped = [0, 3, n // 2, n - 1]
    kept = [k for k in range(n) if k not in dropped]
    with torch.no_grad():
        expected = reference_forward(model, x, kept=kept)[0][0].numpy()
    np.testing.assert_allclose(explain.predict_intervened(loaded, image, drop=dropped), expected, atol=1e-5, rtol=1e-4)
    # all but one patch dropped: the prefix tokens and that patch alone
    with torch.no_grad():
        expected_one = reference_forward(model, x, kept=[n - 2])[0][0].numpy()
    np.testing.assert_allclose(explain.predict_intervened(loaded, image, drop=[k for k in range(n) if k != n - 2]),
                               expected_one, atol=1e-5, rtol=1e-4)

    # masking in pixel space: the normalised input of those patches set to 0, by loops over pixels
    masked = x.clone()
    (ph, pw), gw = g.patch_size, g.grid[1]
    for k in dropped:
        for yy in range(ph):
            for xx in range(pw):
                masked[0, :, (k // gw) * ph + yy, (k % gw) * pw + xx] = 0.0
    with torch.no_grad():
        expected_mask = model(masked)[0].numpy()
    np.testing.assert_allclose(explain.predict_intervened(loaded, image, mask=dropped), expected_mask, atol=1e-5, rtol=1e-4)
    assert not np.allclose(expected_mask, cap.logits, atol=1e-6)  # the mask changed something

    # head ablation, zero and mean, against the explicit per-head attention output
    heads_hit = [(0, 1), (g.num_layers - 1, 0), (g.num_layers - 1, g.num_heads - 1)]

    def override(kind_of_ablation):
        def apply(layer, heads):  # heads (1, H, T, hd)
            heads = heads.clone()
            for lay, h in heads_hit:
                if lay == layer:
                    heads[:, h] = 0 if kind_of_ablation == "zero" else heads[:, h].mean(dim=1, keepdim=True)
            return heads.transpose(1, 2).reshape(heads.shape[0], heads.shape[2], -1)
        return apply

    for ablation in ("zero", "mean"):
        with torch.no_grad():
            expected_ablated = reference_forward(model, x, attn_override=override(ablation))[0][0].numpy()
        got = explain.predict_intervened(loaded, image, ablate=heads_hit, ablation=ablation)
        np.testing.assert_allclose(got, expected_ablated, atol=1e-5, rtol=1e-4)
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0


def test_zero_ablating_every_head_of_a_layer_is_a_zero_proj_input(tiny, image):
    model, g = tiny.model, tiny.geometry
    _, x = preprocess(tiny, image)
    # By hand: block 1's attention branch contributes only proj's bias (proj(0) = bias).
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        tokens = model.blocks[0](tokens)
        blk = model.blocks[1]
        tokens = tokens + blk.ls1(blk.attn.proj.bias.expand_as(tokens))
        tokens = tokens + blk.ls2(blk.mlp(blk.norm2(tokens)))
        expected = model.forward_head(model.norm(tokens))[0].numpy()
    got = explain.predict_intervened(tiny, image, ablate=[(1, h) for h in range(g.num_heads)])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(explain.InterventionError, match="ablation"):
        explain.predict_intervened(tiny, image, ablate=[(1, 0)], ablation="noise")
    with pytest.raises(explain.InterventionError, match="outside"):
        explain.predict_intervened(tiny, image, ablate=[(1, g.num_heads)])
    with pytest.raises(explain.InterventionError, match="outside"):
        explain.predict_intervened(tiny, image, mask=[g.num_patches])
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0 and not tiny.lock.locked()


def test_dropping_every_patch_keeps_the_prefix_tokens_or_is_refused(family):
    image = drawn_image(7)
    loaded = family["distilled"]
    model = loaded.model
    _, x = preprocess(loaded, image)
    with torch.no_grad():
        expected = reference_forward(model, x, kept=[])[0][0].numpy()  # the class and distillation tokens alone
    got = explain.predict_intervened(loaded, image, drop=range(loaded.geometry.num_patches))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)
    pooled = family["no_class_token"]
    with pytest.raises(explain.InterventionError, match="at least one patch"):
        explain.predict_intervened(pooled, image, drop=range(pooled.geometry.num_patches))


# ---------------------------------------------------------------------------------- faithfulness


def test_orders_and_counts_follow_the_spec():
    np.testing.assert_array_equal(explain.patch_order(np.array([[1.0, 3.0], [3.0, 1.0]])), [1, 2, 0, 3])  # ties by index
    np.testing.assert_array_equal(explain.patch_order(np.zeros((2, 3))), np.arange(6))
    assert explain.deletion_counts(25, 10) == [0, 2, 5, 8, 10, 12, 15, 18, 20, 22]  # round() as Python rounds halves
    assert explain.insertion_counts(196, 10) == [20, 39, 59, 78, 98, 118, 137, 157, 176, 196]
    assert explain.insertion_counts(4, 10)[:3] == [1, 1, 1]  # at least one patch kept
    assert explain.auc(np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.5, 1.0])) == pytest.approx(0.75)


@pytest.mark.parametrize("kind", BRANCHES)
def test_faithfulness_curves_equal_per_step_forwards(family, kind):
    loaded = family[kind]
    g = loaded.geometry
    n, steps, orders_count = g.num_patches, 4, 3
    image = drawn_image(6)
    cap = run_with_capture(loaded, image)
    rng = np.random.default_rng(1)
    maps = {"b": rng.random(g.grid), "a": np.round(rng.random(g.grid), 1)}  # "a" has ties
    target = int(np.argmax(cap.logits))
    seen = []
    result = explain.faithfulness(loaded, image, maps, target, steps=steps, random_orders=orders_count, seed=3,
                                  progress=lambda fraction, message: seen.append(fraction))
    assert list(result.deletion) == ["b", "a", "random"] and list(result.insertion) == ["b", "a", "random"]
    assert seen[-1] == pytest.approx(1.0) and seen == sorted(seen)

    def p_c(dropped):
        return float(analyses.softmax(explain.predict_intervened(loaded, image, drop=dropped))[target])

    def curves(order):
        deletion = [p_c(order[:round(k * n / steps)]) for k in range(steps)]
        insertion = [p_c(order[max(1, round(k * n / steps)):]) for k in range(1, steps + 1)]
        return np.array(deletion), np.array(insertion)

    def trapezoid(y, x):
        return sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(y) - 1))

    xs_del, xs_ins = [k / steps for k in range(steps)], [k / steps for k in range(1, steps + 1)]
    for name, relevance in maps.items():
        flat = relevance.reshape(-1)
        order = sorted(range(n), key=lambda i: (-flat[i], i))
        deletion, insertion = curves(order)
        np.testing.assert_allclose(result.deletion[name], deletion, atol=1e-5)
        np.testing.assert_allclose(result.insertion[name], insertion, atol=1e-5)
        assert result.deletion_auc[name] == pytest.approx(trapezoid(deletion, xs_del), abs=1e-5)
        assert result.insertion_auc[name] == pytest.approx(trapezoid(insertion, xs_ins), abs=1e-5)
    generator = np.random.default_rng(3)
    random_orders = [list(generator.permutation(n)) for _ in range(orders_count)]
    # the random baseline deletes from each order's end: the deletion of the reversed order
    deletions = np.stack([curves(order[::-1])[0] for order in random_orders])
    insertions = np.stack([curves(order)[1] for order in random_orders])
    np.testing.assert_allclose(result.deletion["random"], deletions.mean(0), atol=1e-5)
    np.testing.assert_allclose(result.insertion["random"], insertions.mean(0), atol=1e-5)
    np.testing.assert_allclose(result.random_deletion_std, deletions.std(0), atol=1e-5)
    np.testing.assert_allclose(result.random_insertion_std, insertions.std(0), atol=1e-5)
    deletion_aucs = [trapezoid(c, xs_del) for c in deletions]
    insertion_aucs = [trapezoid(c, xs_ins) for c in insertions]
    np.testing.assert_allclose(result.random_deletion_aucs, deletion_aucs, atol=1e-5)
    np.testing.assert_allclose(result.random_insertion_aucs, insertion_aucs, atol=1e-5)

    def beats(value, randoms, higher):  # the margin rule, written out
        mean = sum(randoms) / len(randoms)
        std = (sum((r - mean) ** 2 for r in randoms) / (len(randoms) - 1)) ** 0.5
        gain = value - mean if higher else mean - value
        return gain > max(2 * std, 1e-6)

    for name in maps:
        assert result.beats_random[name] == (beats(result.deletion_auc[name], deletion_aucs, False)
                                             and beats(result.insertion_auc[name], insertion_aucs, True))
    # deletion starts from the unmodified image; insertion ends with every patch kept
    assert result.deletion["b"][0] == pytest.approx(float(cap.probs[target]), abs=1e-5)
    assert result.insertion["b"][-1] == pytest.approx(float(cap.probs[target]), abs=1e-5)
    assert set(result.beats_random) == {"a", "b"}


def batched_per_step_reference(loaded, image, maps, target, steps, random_orders, seed):
    """An earlier implementation of explain.faithfulness: every order (the methods', then the random ones) batched
    per step, one forward per step (identical kept sets once), the random orders reversed for deletion.
    -> (deletion (M + R, S), insertion (M + R, S))"""
    n = loaded.geometry.num_patches
    randoms = explain.random_patch_orders(n, random_orders, seed)
    methods = np.stack([explain.patch_order(maps[m]) for m in maps]).reshape(len(maps), n)
    orders = np.concatenate([methods, randoms])  # (M + R, N), for insertion
    deletion_orders = np.concatenate([methods, randoms[:, ::-1]])  # the random baseline deletes from each order's end
    _, x = preprocess(loaded, image)
    with torch.inference_mode(), explain.eval_mode(loaded.model):
        tokens = explain.embedded_tokens(loaded.model, x)  # (1, T, D)

    def probs(kept):  # (B, K) -> (B,)
        unique, inverse = np.unique(np.sort(kept, axis=1), axis=0, return_inverse=True)
        with torch.inference_mode(), explain.eval_mode(loaded.model):
            logits = explain.run_from_embedded(loaded.model, explain.keep_tokens(
                tokens, torch.from_numpy(unique), loaded.geometry.num_prefix_tokens))
        return analyses.softmax(logits.to(torch.float32).numpy())[:, target][inverse.reshape(-1)]

    deletion = np.stack([probs(deletion_orders[:, d:]) for d in explain.deletion_counts(n, steps)], axis=1).astype(np.float64)
    insertion = np.stack([probs(orders[:, :k]) for k in explain.insertion_counts(n, steps)], axis=1).astype(np.float64)
    return deletion, insertion


def test_the_random_baseline_and_every_map_run_their_kept_sets_together(tiny):
    """The random baseline's and every map's kept sets run in one call: each distinct set once, batched by length
    across the units (DROP_BATCH per forward at most), so the forwards are those of the sets' lengths, not of the
    units; and the methods' curves alone (the LRP rule choice) run no random order."""
    image, n, steps = drawn_image(4), tiny.geometry.num_patches, 10
    target = int(np.argmax(run_with_capture(tiny, image).logits))
    rng = np.random.default_rng(3)
    maps = {name: rng.random(tiny.geometry.grid) for name in ("a", "b", "c")}
    orders = explain.random_patch_orders(n, explain.RANDOM_ORDERS, 0)
    sets = [o[:n - d] for o in orders for d in explain.deletion_counts(n, steps)]
    sets += [o[:k] for o in orders for k in explain.insertion_counts(n, steps)]
    for m in maps:
        order = explain.patch_order(maps[m])
        sets += [order[d:] for d in explain.deletion_counts(n, steps)] + [order[:k] for k in explain.insertion_counts(n, steps)]
    distinct = {np.sort(r).tobytes(): len(r) for r in sets}
    lengths = np.bincount(list(distinct.values()))
    probs = explain.KeptSetProbs(tiny, explain.model_input(tiny, image), target)
    list(perturbation.units(probs, maps, steps, orders))
    assert probs.rows == len(distinct)
    assert probs.forwards == sum(-(-count // perturbation.DROP_BATCH) for count in lengths if count)

    alone = explain.KeptSetProbs(tiny, explain.model_input(tiny, image), target)
    curves = perturbation.method_curves(alone, maps, steps)
    method_sets = {np.sort(r).tobytes() for m in maps for r in perturbation._method_rows(explain.patch_order(maps[m]), steps)}
    assert alone.rows == len(method_sets)
    for m in maps:  # the same numbers as the curves beside the random baseline
        rows = perturbation._method_rows(explain.patch_order(maps[m]), steps)
        np.testing.assert_array_equal(curves[m].deletion, probs(rows)[:steps])


@pytest.mark.parametrize("kind", ["drop", "mask"])
def test_a_kept_sets_probability_is_the_same_bits_alone_or_among_others(tiny, image, monkeypatch, kind):
    """Every perturbed forward has the batch's full size (padded with copies of its first set): what a judge had
    already run, and so which sets share a forward, moves no bit of a set's probability."""
    x, size = explain.model_input(tiny, image), {"drop": perturbation.DROP_BATCH, "mask": perturbation.MASK_BATCH}[kind]
    n, rng = tiny.geometry.num_patches, np.random.default_rng(5)
    sets = [rng.permutation(n)[:20] for _ in range(size + 3)]  # one length: a batch and a part
    sets.insert(2, np.arange(n))  # every patch: a plain forward, alone
    rows_run = []
    original = perturbation.KeptSetProbs._forward
    monkeypatch.setattr(perturbation.KeptSetProbs, "_forward",
                        lambda self, kept: rows_run.append(len(kept)) or original(self, kept))
    together = explain.KeptSetProbs(tiny, x, 0, kind)(sets)
    alone = np.concatenate([explain.KeptSetProbs(tiny, x, 0, kind)([r]) for r in sets])
    assert together.tobytes() == alone.tobytes()
    assert set(rows_run) == {size, 1} and rows_run.count(1) == 2, "every patch alone, in both runs"


def test_forwards_on_lanes_run_in_order_on_one_thread_each(tiny):
    """On a CPU with 2 torch threads: the items' results in order, each forward on a lane thread (not the caller's)
    with 1 torch thread, in inference mode, the model's lock held; `done` on the calling thread, in order; the lock
    is free afterwards and the caller's thread count unchanged."""
    assert torch.get_num_threads() == 2  # tests/conftest.py
    assert explain.forward_lanes(tiny, 10) == 2 and explain.forward_lanes(tiny, 1) == 1
    caller, seen, done_on = threading.get_ident(), [], []

    def forward(item):
        seen.append((threading.get_ident(), torch.get_num_threads(), torch.is_inference_mode_enabled(), tiny.lock.locked()))
        return item * item

    results = explain.forwards_on_lanes(tiny, forward, list(range(10)),
                                        lambda i, r: done_on.append((i, r, threading.get_ident())))
    assert results == [i * i for i in range(10)]
    assert done_on == [(i, i * i, caller) for i in range(10)]
    assert all(thread != caller and threads == 1 and inference and locked for thread, threads, inference, locked in seen)
    assert not tiny.lock.locked() and torch.get_num_threads() == 2
    one = types.SimpleNamespace(device=torch.device("cuda"))
    assert explain.forward_lanes(one, 10) == 1  # a GPU runs one batch at a time


class CountingLock:
    """threading.Lock, counting its acquires."""

    def __init__(self) -> None:
        self._lock, self.acquires = threading.Lock(), 0

    def acquire(self) -> bool:
        self._lock.acquire()
        self.acquires += 1
        return True

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def test_forwards_on_lanes_take_the_lock_once_or_a_slice_at_a_time_with_a_between_batches_hook(tiny):
    """Without a hook (a notebook) the lock is taken once for the run; with `between_batches` (a server sharing the
    model) it is taken for one slice of `lanes` items at a time, the hook called before each slice with the lock free,
    and a raise from the hook ends the run with the lock free. The results are the same."""
    counted = dataclasses.replace(tiny, lock=CountingLock())
    lanes = explain.forward_lanes(counted, 5)
    assert lanes == 2  # tests/conftest.py: 2 torch threads
    done: list[int] = []
    assert explain.forwards_on_lanes(counted, lambda i: i * i, list(range(5))) == [i * i for i in range(5)]
    assert counted.lock.acquires == 1
    calls: list[tuple[int, bool]] = []
    with explain.between_batches(lambda: calls.append((len(done), counted.lock.locked()))):
        results = explain.forwards_on_lanes(counted, lambda i: i * i, list(range(5)), lambda i, r: done.append(i))
    assert results == [i * i for i in range(5)] and done == list(range(5))
    assert calls == [(0, False), (2, False), (4, False)] and counted.lock.acquires == 1 + 3

    def ends_at_the_second_slice() -> None:
        if counted.lock.acquires == 1 + 3 + 1:
            raise KeyboardInterrupt("stopped")

    done.clear()
    with explain.between_batches(ends_at_the_second_slice), pytest.raises(KeyboardInterrupt):
        explain.forwards_on_lanes(counted, lambda i: i, list(range(5)), lambda i, r: done.append(i))
    assert done == [0, 1] and not counted.lock.locked()


def test_forwards_on_lanes_stop_when_done_raises(tiny):
    """A rerun interrupting the page raises in `done`: the forwards not yet started are dropped, the error goes to
    the caller, and the model's lock is free again."""
    started = []

    def forward(item):
        started.append(item)
        return item

    def done(i, result):
        if i == 1:
            raise KeyboardInterrupt("rerun")

    with pytest.raises(KeyboardInterrupt):
        explain.forwards_on_lanes(tiny, forward, list(range(200)), done)
    assert len(started) < 200 and not tiny.lock.locked()


@pytest.mark.parametrize("kind", BRANCHES)
def test_the_curves_equal_all_orders_batched_per_step(family, kind):
    """`units` gives the random baseline first, then each method, with the numbers of the previous all-orders-per-step
    batching; faithfulness assembles the same, methods first, then random."""
    loaded = family[kind]
    image = drawn_image(2)
    target = int(np.argmax(run_with_capture(loaded, image).logits))
    rng = np.random.default_rng(7)
    maps = {"c": rng.random(loaded.geometry.grid), "a": np.round(rng.random(loaded.geometry.grid), 1),
            "b": np.zeros(loaded.geometry.grid)}  # ties, and every patch tied
    steps, random_orders, seed = 10, explain.RANDOM_ORDERS, 0
    deletion, insertion = batched_per_step_reference(loaded, image, maps, target, steps, random_orders, seed)
    seen = []
    probs = explain.KeptSetProbs(loaded, explain.model_input(loaded, image), target)
    orders = explain.random_patch_orders(loaded.geometry.num_patches, random_orders, seed)
    units = list(perturbation.units(probs, maps, steps, orders,
                                    progress=lambda fraction, message: seen.append((fraction, message))))
    assert [u.name for u in units] == ["random", "c", "a", "b"]
    fractions = [fraction for fraction, _ in seen]  # after each forward, all of them before the first unit
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(set(fractions)) == len(fractions)
    assert all(message.startswith("curves: ") for _, message in seen)
    for i, unit in enumerate(units[1:]):
        np.testing.assert_allclose(unit.deletion, deletion[i].astype(np.float32), atol=1e-6)
        np.testing.assert_allclose(unit.insertion, insertion[i].astype(np.float32), atol=1e-6)
        assert unit.deletion_std is None and unit.insertion_std is None
    baseline = units[0]
    np.testing.assert_allclose(baseline.deletion, deletion[len(maps):].mean(0), atol=1e-6)
    np.testing.assert_allclose(baseline.insertion, insertion[len(maps):].mean(0), atol=1e-6)
    np.testing.assert_allclose(baseline.deletion_std, deletion[len(maps):].std(0), atol=1e-6)
    np.testing.assert_allclose(baseline.insertion_std, insertion[len(maps):].std(0), atol=1e-6)
    result = explain.faithfulness(loaded, image, maps, target, steps=steps)
    assert list(result.deletion) == ["c", "a", "b", "random"]
    for unit in units:
        np.testing.assert_array_equal(result.deletion[unit.name], unit.deletion)
        np.testing.assert_array_equal(result.insertion[unit.name], unit.insertion)
        assert result.deletion_auc[unit.name] == unit.deletion_auc == pytest.approx(
            explain.auc(unit.deletion, explain.deletion_x(steps)))
        assert result.insertion_auc[unit.name] == unit.insertion_auc
    partial = explain.faithfulness_of(target, steps, units[:2])  # any subset of the methods, beside random
    assert list(partial.deletion) == ["c", "random"] and set(partial.beats_random) == {"c"}
    assert partial.beats_random["c"] == result.beats_random["c"]


def test_the_full_patch_set_runs_once_per_call(tiny, image, monkeypatch):
    """Deletion step 0 and the last insertion step keep every patch for every order: one forward of N patches."""
    lengths = []
    forward = explain.run_from_embedded
    monkeypatch.setattr(explain.perturbation, "run_from_embedded",
                        lambda model, tokens: lengths.append(tokens.shape) or forward(model, tokens))
    n, p = tiny.geometry.num_patches, tiny.geometry.num_prefix_tokens
    explain.faithfulness(tiny, image, {"a": np.zeros(tiny.geometry.grid), "b": np.ones(tiny.geometry.grid)}, 0, steps=5)
    assert sum(shape[1] == p + n for shape in lengths) == 1
    assert all(shape[0] == 1 for shape in lengths if shape[1] == p + n)


def kept_sets_of_the_definition(n, steps, method_orders, random_orders):
    """Every distinct kept set the curves need, from the spec: each method's deletion (first n_k dropped) and insertion,
    each random order's insertion and deletion from its end."""
    sets = set()
    for order in method_orders:
        sets |= {frozenset(order[d:]) for d in explain.deletion_counts(n, steps)}
        sets |= {frozenset(order[:k]) for k in explain.insertion_counts(n, steps)}
    for order in random_orders:
        sets |= {frozenset(order[:n - d]) for d in explain.deletion_counts(n, steps)}
        sets |= {frozenset(order[:k]) for k in explain.insertion_counts(n, steps)}
    return sets


@pytest.mark.parametrize("kind, steps, shared", [("class_token", 10, True), ("class_token", 8, True), ("patch32", 2, False),
                                                ("patch32", 10, False), ("patch32", 7, True)])
def test_each_kept_set_runs_once_and_the_random_baseline_shares_deletion_and_insertion(family, kind, steps, shared,
                                                                                        monkeypatch):
    """Every distinct kept set of the definition runs exactly once. The random baseline's deletion and insertion keep
    the same sets wherever N - round(kN/S) = round((S-k)N/S): for 196 patches (even) at every step, so its R orders
    need R (S - 1) sets beside the full one; for 49 patches (odd) not where kN/S is a half-integer (S = 2 or 10)."""
    loaded = family[kind]
    n = loaded.geometry.num_patches
    rows = []  # the kept sets each batch of new ones ran (a forward pads its batch with copies of a set in it)
    run = perturbation.KeptSetProbs._run
    monkeypatch.setattr(perturbation.KeptSetProbs, "_run", lambda self, new, *a: rows.append(len(new)) or run(self, new, *a))
    randoms = explain.random_patch_orders(n, explain.RANDOM_ORDERS, 0)
    probs = explain.KeptSetProbs(loaded, explain.model_input(loaded, drawn_image(3)), 0)
    next(perturbation.units(probs, {}, steps, randoms))  # the random baseline alone
    assert sum(rows) == len(kept_sets_of_the_definition(n, steps, [], randoms))
    # the sets of one random order are its prefixes, one per kept size: N - n_k for deletion, max(1, n_k) for insertion
    sizes = {n - d for d in explain.deletion_counts(n, steps)} | set(explain.insertion_counts(n, steps))
    assert sum(rows) == 1 + explain.RANDOM_ORDERS * (len(sizes) - 1)
    assert (len(sizes) == steps) == shared  # shared: S - 1 prefixes and the full set, not 2 (S - 1)
    rng = np.random.default_rng(5)
    maps = {"a": rng.random(loaded.geometry.grid), "b": np.round(rng.random(loaded.geometry.grid), 1)}
    rows.clear()
    explain.faithfulness(loaded, drawn_image(3), maps, 0, steps=steps)
    expected = kept_sets_of_the_definition(n, steps, [explain.patch_order(maps[m]) for m in maps], randoms)
    assert sum(rows) == len(expected)


@pytest.mark.parametrize("kind", ["class_token", "no_class_token"])
def test_pixel_masking_curves_equal_per_step_masked_forwards(family, kind):
    """perturbation="mask": the same orders and steps, the removed patches' normalised input set to 0
    (predict_intervened's `mask`), every token kept."""
    loaded = family[kind]
    g = loaded.geometry
    n, steps, orders_count = g.num_patches, 3, 2
    image = drawn_image(4)
    target = int(np.argmax(run_with_capture(loaded, image).logits))
    rng = np.random.default_rng(2)
    maps = {"m": rng.random(g.grid)}
    result = explain.faithfulness(loaded, image, maps, target, steps=steps, random_orders=orders_count, seed=1,
                                  perturbation="mask")
    assert result.perturbation == "mask" and list(result.deletion) == ["m", "random"]

    def p_c(masked):
        return float(analyses.softmax(explain.predict_intervened(loaded, image, mask=masked))[target])

    def curves(order):
        deletion = [p_c(order[:round(k * n / steps)]) for k in range(steps)]
        insertion = [p_c(order[max(1, round(k * n / steps)):]) for k in range(1, steps + 1)]
        return np.array(deletion), np.array(insertion)

    order = sorted(range(n), key=lambda i: (-maps["m"].reshape(-1)[i], i))
    deletion, insertion = curves(order)
    np.testing.assert_allclose(result.deletion["m"], deletion, atol=1e-5)
    np.testing.assert_allclose(result.insertion["m"], insertion, atol=1e-5)
    generator = np.random.default_rng(1)
    random_orders = [list(generator.permutation(n)) for _ in range(orders_count)]
    np.testing.assert_allclose(result.deletion["random"], np.mean([curves(o[::-1])[0] for o in random_orders], axis=0),
                               atol=1e-5)
    np.testing.assert_allclose(result.insertion["random"], np.mean([curves(o)[1] for o in random_orders], axis=0), atol=1e-5)
    with pytest.raises(ValueError, match="unknown perturbation"):
        explain.faithfulness(loaded, image, maps, target, steps=2, perturbation="blur")


# ---------------------------------------------------------------------------------- threads


def test_explanations_and_captures_from_threads_equal_sequential_results(tiny):
    images = [drawn_image(seed) for seed in range(4)]
    jobs = []
    for i, im in enumerate(images):
        jobs.append(("capture", i, lambda im=im: run_with_capture(tiny, im).logits))
        jobs.append(("relevance", i, lambda im=im: np.stack(list(explain.relevance_maps(tiny, im).maps.values()))))
        jobs.append(("intervened", i, lambda im=im: explain.predict_intervened(tiny, im, drop=[5, 6], ablate=[(1, 0)])))
    sequential = {(kind, i): fn() for kind, i, fn in jobs}
    results, errors = {}, []
    barrier = threading.Barrier(len(jobs))

    def work(kind, i, fn):
        try:
            barrier.wait()
            results[(kind, i)] = fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    for key, expected in sequential.items():
        np.testing.assert_array_equal(results[key], expected, err_msg=str(key))
    assert_clean(tiny, ([True] * tiny.geometry.num_layers, [True] * len(list(tiny.model.parameters())), False))


@pytest.mark.parametrize("kind", sorted(LRP_FAMILIES))
def test_the_last_block_runs_for_the_head_only_where_the_head_reads_only_prefix_tokens(kind, monkeypatch):
    """run_from_embedded gives the model's own logits (its whole forward from the same tokens) on every family, kept
    sets of any length among them; where the head pools the class token and the last block is timm's standard one,
    that block computes only the prefix tokens' rows, and a hook on it (an ablation) makes it run whole."""
    name, kwargs = LRP_FAMILIES[kind]
    loaded = load_model(name, pretrained=False, seed=0, **kwargs)
    model, g = loaded.model, loaded.geometry
    x = explain.model_input(loaded, drawn_image(2))
    rows = []
    prefix_rows = explain.interventions._prefix_rows
    monkeypatch.setattr(explain.interventions, "_prefix_rows",
                        lambda block, tokens, p: rows.append(p) or prefix_rows(block, tokens, p))
    kept = torch.from_numpy(np.stack([np.arange(g.num_patches), np.arange(g.num_patches)[::-1]]))  # (2, N), reordered
    with torch.inference_mode(), explain.eval_mode(model):
        tokens = explain.embedded_tokens(model, x)  # (1, T, D)
        for index in (kept, kept[:, : g.num_patches // 3]):
            sets = explain.keep_tokens(tokens, index, g.num_prefix_tokens)
            whole = explain.head_logits(model, model.blocks(model.norm_pre(sets)))
            torch.testing.assert_close(explain.run_from_embedded(model, sets), whole, rtol=1e-5, atol=1e-5)
        fast = getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None and \
            type(model.blocks[-1]).__name__ == "Block" and type(model.blocks[-1].attn).__name__ == "Attention"
        assert rows == ([g.num_prefix_tokens] * 2 if fast else []), (kind, rows)
        rows.clear()
        with explain.heads_ablated(model, [(g.num_layers - 1, 0)], "mean"):
            explain.run_from_embedded(model, sets)
        assert rows == []  # the mean over the sequence's tokens needs every row
    assert kind not in ("class_token", "distilled", "registers", "layer_scale", "qk_norm") or fast  # the usual ones
