"""AttnLRP and CP-LRP (vit_core.explain.lrp; analyses.md, "AttnLRP and CP-LRP").

- Against an explicit reference: relevance propagated layer by layer with each rule's formula written out (float64
  numpy, no autograd), for a class-token ViT and a DeiT-III-style one (layer scale, average pool, fc_norm), with the
  eps-rule and with gamma on some linears (the gamma rule as contributions: zennit's generalised form).
- Each rule against its formula on small tensors; the gamma rule against zennit's four-term form, by loops.
- The LRP forward equal to the model's on every family; conservation: the input relevance plus the relevance each
  rule absorbs (biases, constants, eps, softmax) equals y_c, and with biases and constants zeroed CP-LRP's input
  relevance alone is y_c (AttnLRP's plus the softmax's share).
- `relevance_maps`: the LRP maps, the gamma choice by a (fake) scorer, only the asked methods run, Grad-CAM's own
  pass equal to the full pass's, the model untouched, the unsupported path.
"""

from __future__ import annotations

import copy
import dataclasses
import gc

import numpy as np
import pytest
import torch

from conftest import drawn_image, hooks_on
from tools.benchmarks.lrp import lively, without_biases  # O(1) weights; biases and constants zeroed
from tools.vit_families import LRP_FAMILIES, SMALL
from vit_core import explain, load_model, preprocess, recording_hooks_on, run_with_capture
from vit_core.explain import lrp, relevance_maps

FAMILIES = LRP_FAMILIES  # every branch of the family the project supports (tools/vit_families.py)


@pytest.fixture(scope="module")
def families():
    return {key: load_model(name, pretrained=False, seed=0, device="cpu", **kwargs)
            for key, (name, kwargs) in FAMILIES.items()}


def an_input(model: torch.nn.Module, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    h, w = model.patch_embed.img_size
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(seed), dtype=dtype)


SOME_GAMMA = lrp.GammaChoice("some gamma", (("patch_embed.proj", 1.0), ("blocks.0.mlp.fc1", 0.5), ("blocks.0.attn.proj", 0.25),
                                             ("blocks.1.mlp.fc2", 0.1), ("head", 0.1)))


# ---------------------------------------------------------------------------------- the explicit reference


def stab(z, eps):
    return np.where(z >= 0, z + eps, z - eps)


def linear_relevance(x, w, b, z, r, eps, gamma=0.0):
    """The eps-rule, or the generalised gamma-rule, written with contributions c_ji = x_i w_ji (per token):
    R_i = sum_j c'_ji R_j / (sum_i c'_ji + b'_j), c' = c + gamma c+ and b' = b + gamma b+ where z_j > 0, c + gamma c-
    and b + gamma b- where z_j < 0. x (T, Din), w (Dout, Din), z and r (T, Dout) -> (T, Din)."""
    contributions = x[:, None, :] * w[None, :, :]  # (T, Dout, Din)
    bias = np.zeros(w.shape[0]) if b is None else b
    if not gamma:
        return (contributions * (r / stab(z, eps))[:, :, None]).sum(axis=1)
    up = contributions + gamma * contributions.clip(min=0)
    down = contributions + gamma * contributions.clip(max=0)
    share_up = r / stab(up.sum(-1) + bias + gamma * bias.clip(min=0), eps)  # (T, Dout)
    share_down = r / stab(down.sum(-1) + bias + gamma * bias.clip(max=0), eps)
    return (np.where(z > 0, share_up, 0)[:, :, None] * up + np.where(z < 0, share_down, 0)[:, :, None] * down).sum(axis=1)


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    y = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps)
    return y * w + b, centred


def layer_norm_relevance(x, centred, y, b, r):
    """Std held constant: the bias takes b/y of R by the addition's rule, the gain and 1/std pass the rest on (identity),
    and x - mean is linear: R_i = sum_j x_i (delta_ij - 1/n) R'_j / (x_j - mean)."""
    per_centred = r * (y - b) / y / centred  # (T, n)
    return x * (per_centred - per_centred.mean(-1, keepdims=True))


def addition_relevance(a, b, r):
    """a + b: each addend gets its share of the sum's relevance."""
    total = a + b
    return r * a / total, r * b / total


def gelu(u):
    import math

    return 0.5 * u * (1 + np.vectorize(math.erf)(u / np.sqrt(2)))


def attention_relevance(q, k, v, r_out, scale, method):
    """One head: S = scale q k^T, A = softmax(S), O = A v. A v's products A_ij v_jd share R_O by value, half to A and
    half to v (AttnLRP) or all to v (CP-LRP); the softmax rule R_S = S (R_A - A sum R_A); S's products half to q, half
    to k. Returns R_q, R_k, R_v (T, hd)."""
    s = scale * q @ k.T
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    per_out = r_out / (a @ v)  # (T, hd)
    split = 0.5 if method == "attnlrp" else 1.0
    r_v = split * v * (a.T @ per_out)
    if method == "cplrp":
        return np.zeros_like(q), np.zeros_like(k), r_v
    r_a = 0.5 * a * (per_out @ v.T)
    r_s = s * (r_a - a * r_a.sum(-1, keepdims=True))
    per_s = r_s / s
    return 0.5 * q * (per_s @ k) * scale, 0.5 * k * (per_s.T @ q) * scale, r_v


def reference_relevance(model, x, target, method, choice=lrp.EPSILON_ONLY, eps=lrp.EPSILON):
    """LRP of y_c through a class-token or average-pool ViT with pre-norm blocks (optionally layer scale, fc_norm),
    forward and relevance written out in float64. -> (3, H, W)"""
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    gamma = dict(choice.gamma)
    x = x.double().numpy()[0]
    c_in, height, width = x.shape
    ph, pw = model.patch_embed.patch_size
    gh, gw = height // ph, width // pw
    patches = x.reshape(c_in, gh, ph, gw, pw).transpose(1, 3, 0, 2, 4).reshape(gh * gw, -1)  # (N, C ph pw)
    w_pe = p["patch_embed.proj.weight"].reshape(p["patch_embed.proj.weight"].shape[0], -1)
    embedded = patches @ w_pe.T + p["patch_embed.proj.bias"]
    cls = p["cls_token"][0]
    pos = p["pos_embed"][0]
    if model.no_embed_class:
        tokens = np.concatenate([cls, embedded + pos])
    else:
        tokens = np.concatenate([cls, embedded]) + pos
    eps_ln = model.blocks[0].norm1.eps
    h, hd = model.blocks[0].attn.num_heads, model.blocks[0].attn.head_dim
    saved = []
    for i in range(len(model.blocks)):
        b = f"blocks.{i}."
        h1, c1 = layer_norm(tokens, p[b + "norm1.weight"], p[b + "norm1.bias"], eps_ln)
        qkv = h1 @ p[b + "attn.qkv.weight"].T + p[b + "attn.qkv.bias"]
        q, k, v = (qkv[:, j * h * hd:(j + 1) * h * hd].reshape(-1, h, hd).transpose(1, 0, 2) for j in range(3))
        scale = model.blocks[i].attn.scale
        heads = []
        for head in range(h):
            s = scale * q[head] @ k[head].T
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ v[head])
        merged = np.concatenate(heads, axis=-1)
        proj = merged @ p[b + "attn.proj.weight"].T + p[b + "attn.proj.bias"]
        ls1 = p.get(b + "ls1.gamma", np.ones_like(proj[0]))
        after_attn = tokens + ls1 * proj
        h2, c2 = layer_norm(after_attn, p[b + "norm2.weight"], p[b + "norm2.bias"], eps_ln)
        u = h2 @ p[b + "mlp.fc1.weight"].T + p[b + "mlp.fc1.bias"]
        g = gelu(u)
        m = g @ p[b + "mlp.fc2.weight"].T + p[b + "mlp.fc2.bias"]
        ls2 = p.get(b + "ls2.gamma", np.ones_like(m[0]))
        out = after_attn + ls2 * m
        saved.append(dict(tokens=tokens, h1=h1, c1=c1, qkv=qkv, q=q, k=k, v=v, merged=merged, proj=proj, ls1=ls1,
                          after_attn=after_attn, h2=h2, c2=c2, u=u, g=g, m=m, ls2=ls2, out=out, scale=scale))
        tokens = out
    if "norm.weight" in p:
        final_n, final_c = layer_norm(tokens, p["norm.weight"], p["norm.bias"], eps_ln)
    else:
        final_n = tokens
    pooled = final_n[0] if model.global_pool == "token" else final_n[1:].mean(0)
    if "fc_norm.weight" in p:
        pooled_n, pooled_c = layer_norm(pooled[None], p["fc_norm.weight"], p["fc_norm.bias"], eps_ln)
    else:
        pooled_n = pooled[None]
    logits = pooled_n @ p["head.weight"].T + p["head.bias"]  # (1, C)

    r = np.zeros_like(logits)
    r[0, target] = logits[0, target]
    r = linear_relevance(pooled_n, p["head.weight"], p["head.bias"], logits, r, eps, gamma.get("head", 0.0))
    if "fc_norm.weight" in p:
        r = layer_norm_relevance(pooled[None], pooled_c, pooled_n, p["fc_norm.bias"], r)
    r_final = np.zeros_like(final_n)
    if model.global_pool == "token":
        r_final[0] = r[0]
    else:  # the mean: a linear map, each token's share by value
        r_final[1:] = final_n[1:] / len(final_n[1:]) * (r[0] / pooled)
    if "norm.weight" in p:
        r_final = layer_norm_relevance(tokens, final_c, final_n, p["norm.bias"], r_final)
    r_tokens = r_final
    for i in reversed(range(len(model.blocks))):
        b, f = f"blocks.{i}.", saved[i]
        r_after, r_mlp = addition_relevance(f["after_attn"], f["ls2"] * f["m"], r_tokens)
        r_g = linear_relevance(f["g"], p[b + "mlp.fc2.weight"], p[b + "mlp.fc2.bias"], f["m"], r_mlp, eps,
                               gamma.get(b + "mlp.fc2", 0.0))
        r_h2 = linear_relevance(f["h2"], p[b + "mlp.fc1.weight"], p[b + "mlp.fc1.bias"], f["u"], r_g, eps,
                                gamma.get(b + "mlp.fc1", 0.0))  # GELU: the identity rule
        r_after = r_after + layer_norm_relevance(f["after_attn"], f["c2"], f["h2"], p[b + "norm2.bias"], r_h2)
        r_in, r_proj = addition_relevance(f["tokens"], f["ls1"] * f["proj"], r_after)
        r_merged = linear_relevance(f["merged"], p[b + "attn.proj.weight"], p[b + "attn.proj.bias"], f["proj"], r_proj, eps,
                                    gamma.get(b + "attn.proj", 0.0))
        r_q, r_k, r_v = (np.zeros((h, len(r_merged), hd)) for _ in range(3))
        for head in range(h):
            r_q[head], r_k[head], r_v[head] = attention_relevance(f["q"][head], f["k"][head], f["v"][head],
                                                                  r_merged[:, head * hd:(head + 1) * hd], f["scale"], method)
        r_qkv = np.concatenate([r.transpose(1, 0, 2).reshape(len(r_merged), -1) for r in (r_q, r_k, r_v)], axis=-1)
        r_h1 = linear_relevance(f["h1"], p[b + "attn.qkv.weight"], p[b + "attn.qkv.bias"], f["qkv"], r_qkv, eps,
                                gamma.get(b + "attn.qkv", 0.0))
        r_tokens = r_in + layer_norm_relevance(f["tokens"], f["c1"], f["h1"], p[b + "norm1.bias"], r_h1)
    r_embedded = r_tokens[1:]
    if model.no_embed_class:
        r_embedded = addition_relevance(embedded, pos, r_embedded)[0]
    else:
        r_embedded = addition_relevance(embedded, pos[1:], r_embedded)[0]
    r_patches = linear_relevance(patches, w_pe, p["patch_embed.proj.bias"], embedded, r_embedded, eps,
                                 gamma.get("patch_embed.proj", 0.0))
    return r_patches.reshape(gh, gw, c_in, ph, pw).transpose(2, 0, 3, 1, 4).reshape(c_in, height, width), logits[0]


@pytest.mark.parametrize("key", ["class_token", "layer_scale_average_pool"])
@pytest.mark.parametrize("method", lrp.LRP_METHODS)
@pytest.mark.parametrize("choice", [lrp.EPSILON_ONLY, SOME_GAMMA], ids=["epsilon", "gamma"])
def test_input_relevance_equals_the_explicit_rules(key, method, choice):
    if key == "class_token":
        model = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, **SMALL, img_size=32, patch_size=8).model
    else:  # DeiT-III's layer scale, position rows without the class token, the patch tokens' mean, fc_norm
        model = load_model("deit3_small_patch16_224", pretrained=False, seed=0, **SMALL, img_size=32, init_values=0.5,
                           global_pool="avg").model
        assert model.fc_norm.weight is not None and model.no_embed_class
    model = lively(model).double()
    x = an_input(model, dtype=torch.float64)
    expected, logits = reference_relevance(model, x, target=2, method=method, choice=choice)
    got = lrp.input_relevance(model, x, 2, methods=(method,), choices=(choice,))
    np.testing.assert_allclose(got.logits, logits, rtol=1e-6, atol=1e-6)
    pixels = got.pixels[(method, choice.name)]
    assert pixels.shape == x.shape[1:] and pixels.dtype == np.float32
    np.testing.assert_allclose(pixels, expected, atol=1e-5 * np.abs(expected).max())
    assert np.abs(expected).max() > 1e-3  # a real test: the relevance is not all zero


def test_the_methods_and_choices_differ():
    """AttnLRP and CP-LRP, eps and gamma, give different maps (the rules are switched per backward, not ignored)."""
    model = lively(load_model("vit_tiny_patch16_224", pretrained=False, seed=0, **SMALL, img_size=32, patch_size=8).model)
    got = lrp.input_relevance(model, an_input(model), 1, choices=(lrp.EPSILON_ONLY, SOME_GAMMA))
    maps = list(got.pixels.values())
    assert len(maps) == 4
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.allclose(maps[i], maps[j], atol=1e-6), (i, j)


# ---------------------------------------------------------------------------------- each rule against its formula


def gradient(fn, *inputs):
    """(x, grad) of sum(fn(*inputs) * upstream) for a seeded upstream gradient, through the rule's backward."""
    leaves = [t.clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, upstream, allow_unused=True, materialize_grads=True)
    return out.detach(), upstream, grads


def test_softmax_rule_is_x_times_r_minus_s_sum_r():
    rules = lrp._Rules(shares={"softmax": 0.0})
    x = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    s, g, (grad,) = gradient(lambda t: lrp._SoftmaxRule.apply(t, rules), x)
    r_out = (s * g).numpy()
    expected = x.numpy() * (r_out - s.numpy() * r_out.sum(-1, keepdims=True))
    np.testing.assert_allclose((x * grad).numpy(), expected, rtol=1e-12, atol=1e-12)
    assert rules.shares["softmax"] == pytest.approx(r_out.sum() - expected.sum(), abs=1e-12)


def test_identity_rule_passes_all_relevance_through():
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y, g, (grad,) = gradient(lambda t: lrp._IdentityRule.apply(t, torch.nn.functional.gelu, lrp._Rules()), x)
    np.testing.assert_allclose((x * grad).numpy(), (y * g).numpy(), rtol=1e-12)


def test_uniform_rule_halves_and_cp_lrp_holds_the_pattern_constant():
    a = torch.rand(2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def product(rules):
        return lambda p, w: lrp._Share.apply(p, "pattern", rules) @ lrp._Share.apply(w, "value", rules)

    for method, (share_a, share_v) in {"attnlrp": (0.5, 0.5), "cplrp": (0.0, 1.0)}.items():
        out, g, (ga, gv) = gradient(product(lrp._Rules(method=method)), a, v)
        total = float((out * g).sum())
        assert float((a * ga).sum()) == pytest.approx(share_a * total, rel=1e-12)
        assert float((v * gv).sum()) == pytest.approx(share_v * total, rel=1e-12)


def test_layer_norm_rule_holds_the_std_constant():
    """x times the rule's gradient sums, per token, to (y - b) g: conservative up to the bias; and it is the gradient
    of (x - mean) / std * w + b with std detached."""
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 + 1
    w = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    b = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y, g, (grad,) = gradient(lambda t: lrp._NormRule.apply(t, w, b, 1e-6, True, lrp._Rules()), x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (6,), w, b, 1e-6))
    np.testing.assert_allclose((x * grad).sum(-1).numpy(), ((y - b) * g).sum(-1).numpy(), rtol=1e-10)
    _, _, (reference,) = gradient(lambda t: (t - t.mean(-1, keepdim=True)) / t.var(-1, unbiased=False, keepdim=True)
                                  .add(1e-6).sqrt().detach() * w + b, x)
    torch.testing.assert_close(grad, reference)


@pytest.mark.parametrize("gamma", [0.0, 0.25, 1.0])
def test_linear_rule_against_zennits_four_term_form(gamma):
    """zennit's Gamma: inputs x+ and x- through W + gamma W+ and W + gamma W- (bias b + gamma b+ with x+ only, ...),
    looped over tokens, outputs and inputs; gamma 0: the eps-rule."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    w = torch.randn(4, 5, dtype=torch.float64, generator=gen)
    b = torch.randn(4, dtype=torch.float64, generator=gen)
    eps = 1e-6
    rules = lrp._Rules(gamma={"fc": gamma} if gamma else {}, epsilon=eps)
    z, g, (grad,) = gradient(lambda t: lrp._LinearRule.apply(t, w, b, "fc", rules), x)
    r = (z * g).numpy()
    xn, wn, bn, zn = x.numpy(), w.numpy(), b.numpy(), z.numpy()
    expected = np.zeros_like(xn)
    for t in range(3):
        for j in range(4):
            if gamma == 0.0:
                for i in range(5):
                    expected[t, i] += xn[t, i] * wn[j, i] * r[t, j] / stab(zn[t, j], eps)
                continue
            if zn[t, j] == 0:
                continue
            boost = (lambda v: max(v, 0.0)) if zn[t, j] > 0 else (lambda v: min(v, 0.0))
            terms = [max(xn[t, i], 0) * (wn[j, i] + gamma * boost(wn[j, i])) +
                     min(xn[t, i], 0) * (wn[j, i] + gamma * (min(wn[j, i], 0) if zn[t, j] > 0 else max(wn[j, i], 0)))
                     for i in range(5)]
            denominator = sum(terms) + bn[j] + gamma * boost(bn[j])
            for i in range(5):
                expected[t, i] += terms[i] * r[t, j] / stab(denominator, eps)
    np.testing.assert_allclose((x * grad).numpy(), expected, rtol=1e-9, atol=1e-12)


def test_patch_relevance_sums_channels_and_each_patchs_pixels():
    rng = np.random.default_rng(0)
    pixels = rng.normal(size=(3, 8, 12)).astype(np.float32)
    got = lrp.patch_relevance(pixels, (4, 4), (2, 3))
    expected = np.zeros((2, 3))
    for r in range(2):
        for c in range(3):
            for ch in range(3):
                for y in range(4):
                    for x in range(4):
                        expected[r, c] += pixels[ch, r * 4 + y, c * 4 + x]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------- every family: forward, conservation


@pytest.mark.parametrize("key", list(FAMILIES))
def test_lrp_forward_equals_the_models_forward(families, key):
    model = families[key].model
    assert lrp.why_unsupported(model) is None
    x = an_input(model)
    with torch.no_grad():
        expected = model(x)[0].numpy()
    got = lrp.input_relevance(model, x, 0, methods=("cplrp",))
    np.testing.assert_allclose(got.logits, expected, rtol=1e-5, atol=1e-6)


def conservation_gap(result, key):
    """|input relevance + every share - y_c| and the scale it is measured against (the largest term, or |y_c|)."""
    y = float(result.logits[result.target])
    total = float(result.pixels[key].astype(np.float64).sum())
    shares = result.shares[key]
    scale = max(abs(y), abs(total), *(abs(v) for v in shares.values()))
    return abs(total + sum(shares.values()) - y), scale


@pytest.mark.parametrize("key", list(FAMILIES))
def test_input_relevance_plus_the_absorbed_shares_is_the_logit(families, key):
    """Conservation, with real biases: what reaches the input plus what the biases, the constants (position
    embedding, prefix tokens), the eps stabilisers and the softmax rule absorb is y_c, for both methods and a gamma
    choice, to float32 rounding."""
    model = lively(families[key].model)
    choices = lrp.gamma_candidates(model)
    result = lrp.input_relevance(model, an_input(model, 1), lambda logits: int(np.argmax(logits)), choices=choices,
                                 shares=True)
    for method_choice in result.pixels:
        gap, scale = conservation_gap(result, method_choice)
        assert gap <= 2e-5 * scale, (method_choice, gap, scale, result.shares[method_choice])
        kinds = set(result.shares[method_choice])
        assert ("softmax" in kinds) == (method_choice[0] == "attnlrp")  # CP-LRP's pattern is constant: nothing absorbed


def test_a_gated_attention_is_a_product_of_two_inputs(families):
    """timm's Attention with an output gate (x * sigmoid(gate(x))): the forward equals the model's, and the uniform rule
    on the product (AttnLRP) or the gate held constant (CP-LRP) keeps the shares summing to y_c."""
    model = copy.deepcopy(families["class_token"].model)
    for blk in model.blocks:
        blk.attn.gate = torch.nn.Linear(32, 32)
    model = lively(model)
    x = an_input(model, 3)
    with torch.no_grad():
        expected = model(x)[0].numpy()
    result = lrp.input_relevance(model, x, 1, shares=True)
    np.testing.assert_allclose(result.logits, expected, rtol=1e-5, atol=1e-6)
    for key in result.pixels:
        gap, scale = conservation_gap(result, key)
        assert gap <= 2e-5 * scale, (key, gap, scale)


@pytest.mark.parametrize("key", ["class_token", "distilled", "registers", "attention_pool", "average_pool", "clip_pre_norm",
                                 "layer_scale"])
def test_without_biases_cp_lrp_conserves_the_logit(families, key):
    """Biases and constants zeroed, eps -> 0: CP-LRP's input relevance sums to y_c; AttnLRP's plus the softmax
    rule's share does (in an attention pool only if the keys get all of q k^T's relevance: its query is a parameter).
    With a large eps, the eps share is what is missing."""
    model = without_biases(lively(families[key].model))
    x = an_input(model, 2)
    tiny = lrp.input_relevance(model, x, lambda logits: int(np.argmax(logits)), epsilon=1e-12, shares=True)
    y = float(tiny.logits[tiny.target])
    cp = float(tiny.pixels[("cplrp", "epsilon")].astype(np.float64).sum())
    assert cp == pytest.approx(y, rel=2e-5)
    attn = float(tiny.pixels[("attnlrp", "epsilon")].astype(np.float64).sum())
    assert attn + tiny.shares[("attnlrp", "epsilon")]["softmax"] == pytest.approx(y, rel=2e-5)
    large = lrp.input_relevance(model, x, tiny.target, methods=("cplrp",), epsilon=0.05, shares=True)
    lost = large.shares[("cplrp", "epsilon")]["epsilon"]
    total = float(large.pixels[("cplrp", "epsilon")].astype(np.float64).sum())
    assert abs(lost) > 1e-4 * abs(y) and total + lost == pytest.approx(y, rel=2e-5)


# ---------------------------------------------------------------------------------- gamma choices


def test_gamma_candidates_are_epsilon_then_each_gamma_on_the_lower_half(families):
    model = families["class_token"].model
    choices = lrp.gamma_candidates(model)
    assert [c.name for c in choices] == ["epsilon", "gamma 0.25, lower half", "gamma 1, lower half"]
    assert choices[0].gamma == ()
    assert dict(choices[1].gamma) == {"blocks.0.mlp.fc1": 0.25, "blocks.0.mlp.fc2": 0.25, "blocks.0.attn.proj": 0.25}
    swiglu = lrp.lower_half_linears(families["swiglu_rmsnorm"].model)
    assert swiglu == ["blocks.0.mlp.fc1_g", "blocks.0.mlp.fc1_x", "blocks.0.mlp.fc2", "blocks.0.attn.proj"]


def test_pick_choice_takes_the_best_score_ties_and_nan_to_the_first():
    assert lrp.pick_choice({"a": 0.1, "b": 0.3, "c": 0.2}).name == "b"
    assert lrp.pick_choice({"a": 0.3, "b": 0.3}).name == "a"
    assert lrp.pick_choice({"a": float("nan"), "b": -1.0}).name == "b"
    picked = lrp.pick_choice({"a": float("nan"), "b": float("nan")})
    assert picked.name == "a" and np.isnan(picked.score)
    picked = lrp.pick_choice({"x": -0.5, "y": 0.25})
    assert (picked.name, picked.score, picked.scores) == ("y", 0.25, {"x": -0.5, "y": 0.25})


def test_choose_per_method_scores_every_map_in_one_call():
    maps = {(m, c): np.full((2, 2), i, dtype=np.float32) for i, (m, c) in
            enumerate((m, c) for m in ("attnlrp", "cplrp") for c in ("epsilon", "g1", "g2"))}
    calls = []

    def fake(keyed):
        calls.append(sorted(keyed))
        return {"attnlrp/epsilon": 0.1, "attnlrp/g1": 0.5, "attnlrp/g2": 0.5, "cplrp/epsilon": 0.4, "cplrp/g1": 0.0,
                "cplrp/g2": -1.0}

    picks = lrp.choose_per_method(maps, fake)
    assert len(calls) == 1 and len(calls[0]) == 6
    assert picks["attnlrp"].name == "g1" and picks["cplrp"].name == "epsilon"
    assert list(picks["attnlrp"].scores) == ["epsilon", "g1", "g2"]
    one_each = lrp.choose_per_method({("attnlrp", "epsilon"): maps[("attnlrp", "epsilon")]}, fake)  # nothing to choose
    assert one_each["attnlrp"].name == "epsilon" and len(calls) == 1


# ---------------------------------------------------------------------------------- relevance_maps


@pytest.fixture(scope="module")
def tiny_lively():
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, **SMALL, img_size=32, patch_size=8)
    return dataclasses.replace(loaded, model=lively(loaded.model))


def test_relevance_maps_use_the_choice_the_scorer_picks(tiny_lively):
    loaded, image = tiny_lively, drawn_image(1)
    names = [c.name for c in lrp.gamma_candidates(loaded.model)]
    wanted = {"attnlrp": names[2], "cplrp": names[1]}
    seen = []

    def fake(keyed):
        seen.append(set(keyed))
        return {key: 1.0 if key.split("/")[1] == wanted[key.split("/")[0]] else 0.0 for key in keyed}

    relevance = relevance_maps(loaded, image, target=3, methods=("attnlrp", "cplrp"), scorer=fake)
    assert seen == [{f"{m}/{n}" for m in wanted for n in names}]
    assert {m: c.name for m, c in relevance.gamma_choice.items()} == wanted
    _, x = preprocess(loaded, image)
    direct = lrp.input_relevance(loaded.model, x, 3, choices=lrp.gamma_candidates(loaded.model))
    g = loaded.geometry
    for method, name in wanted.items():
        expected = lrp.patch_relevance(direct.pixels[(method, name)], g.patch_size, g.grid)
        np.testing.assert_allclose(relevance.maps[method], expected, rtol=1e-5, atol=1e-7)
        assert relevance.maps[method].shape == g.grid and not relevance.maps[method].flags.writeable
    plain = relevance_maps(loaded, image, target=3, methods=("cplrp",), choose_gamma=False)
    assert plain.gamma_choice == {}
    np.testing.assert_allclose(plain.maps["cplrp"], lrp.patch_relevance(direct.pixels[("cplrp", "epsilon")], g.patch_size,
                                                                        g.grid), rtol=1e-5, atol=1e-7)


def test_the_faithfulness_scorer_picks_deterministically(tiny_lively):
    first = relevance_maps(tiny_lively, drawn_image(2), methods=("attnlrp", "cplrp"))
    second = relevance_maps(tiny_lively, drawn_image(2), methods=("attnlrp", "cplrp"))
    assert first.gamma_choice == second.gamma_choice and set(first.gamma_choice) == {"attnlrp", "cplrp"}
    for pick in first.gamma_choice.values():
        assert pick.score == max(pick.scores.values()) and np.isfinite(pick.score)


def test_the_judge_reuses_the_choice_forwards_with_the_same_numbers(tiny_lively, monkeypatch):
    """The gamma choice's token-dropping p_c come with the maps (`choice_sets`); the judge given them runs fewer
    kept sets and gives the numbers it gives alone. They are refused for another target; they hold the model weakly;
    a caller's scorer or no choice gives none."""
    loaded, image = tiny_lively, drawn_image(2)
    relevance = relevance_maps(loaded, image, methods=("rollout", "attnlrp", "cplrp"))
    known = relevance.choice_sets
    assert known is not None and known.target == relevance.target and known.perturbation == "drop"
    assert known.model() is loaded.model and len(known.probs) > 1
    run: list[int] = []
    make = explain.KeptSetProbs._run

    def counted(self, new, progress=None):
        run.append(len(new))
        return make(self, new, progress)

    monkeypatch.setattr(explain.KeptSetProbs, "_run", counted)
    tests = ("deletion_auc", "insertion_auc", "srg")
    alone = explain.judge(loaded, image, relevance.maps, relevance.target, tests=tests)
    sets_alone, run[:] = sum(run), []
    reused = explain.judge(loaded, image, relevance.maps, relevance.target, tests=tests, reuse=known)
    assert 0 < sum(run) < sets_alone  # the chosen maps' sets at the choice's steps were not run again
    for test in tests:
        for method in relevance.maps:
            assert reused.results[test].values[method] == pytest.approx(alone.results[test].values[method], abs=1e-6)
        np.testing.assert_allclose(reused.results[test].random_values, alone.results[test].random_values, atol=1e-6)
    other = (relevance.target + 1) % loaded.geometry.num_classes
    with pytest.raises(ValueError, match="another model, input, target"):
        explain.judge(loaded, image, relevance.maps, other, tests=tests, reuse=known)
    assert relevance_maps(loaded, image, methods=("attnlrp",), choose_gamma=False).choice_sets is None
    assert relevance_maps(loaded, image, methods=("attnlrp",), scorer=lambda keyed: dict.fromkeys(keyed, 0.0)
                          ).choice_sets is None
    another = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, **SMALL, img_size=32, patch_size=8)
    another = dataclasses.replace(another, model=lively(another.model))
    weak = relevance_maps(another, image, methods=("cplrp",)).choice_sets
    del another
    gc.collect()
    assert weak.model() is None  # a cached result never keeps a model alive


def test_only_the_asked_methods_run(tiny_lively):
    """Attention maps from a capture need no forward; LRP calls none of the model's modules (the model's forward
    replaced by one that raises still gives LRP maps)."""
    loaded = tiny_lively
    image = drawn_image(3)
    cap = run_with_capture(loaded, image)
    model = loaded.model

    def boom(*args, **kwargs):
        raise AssertionError("the model's forward ran")

    model.forward = boom
    try:
        attention = relevance_maps(loaded, image, cap=cap, methods=("rollout", "raw_attention"))
        lrp_only = relevance_maps(loaded, image, target=1, methods=("attnlrp",), choose_gamma=False)
    finally:
        del model.forward
    assert list(attention.maps) == ["raw_attention", "rollout"] and attention.target == int(np.argmax(cap.logits))
    assert list(lrp_only.maps) == ["attnlrp"] and lrp_only.target == 1
    full = relevance_maps(loaded, image, cap=cap, choose_gamma=False)
    assert list(full.maps) == ["raw_attention", "rollout", "chefer", "gradcam", "attnlrp", "cplrp"] and full.unsupported == {}
    np.testing.assert_allclose(attention.maps["rollout"], full.maps["rollout"])
    with pytest.raises(ValueError, match="unknown relevance method"):
        relevance_maps(loaded, image, methods=("lime",))


@pytest.mark.parametrize("key", ["class_token", "registers", "attention_pool"])
def test_grad_cam_alone_stops_at_its_layer_and_equals_the_full_pass(families, key):
    loaded = dataclasses.replace(families[key], model=lively(families[key].model))
    image = drawn_image(4)
    seen = []
    handle = loaded.model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.requires_grad))
    try:
        alone = [relevance_maps(loaded, image, target=c, methods=("gradcam",)) for c in range(5)]
    finally:
        handle.remove()
    assert seen == [False] * 5  # nothing before the last block's norm1 is recorded for autograd
    for c, one in enumerate(alone):
        full = relevance_maps(loaded, image, target=c, methods=("chefer", "gradcam"))
        assert list(one.maps) == ["gradcam"] and one.target == full.target == c
        np.testing.assert_allclose(one.maps["gradcam"], full.maps["gradcam"], rtol=1e-5, atol=1e-8)
    assert any(one.maps["gradcam"].max() > 0 for one in alone)  # Grad-CAM's ReLU did not clip every map
    with_patterns = relevance_maps(loaded, image, methods=("gradcam", "rollout"))
    np.testing.assert_allclose(with_patterns.maps["rollout"], run_with_capture_rollout(loaded, image), atol=1e-6)


def run_with_capture_rollout(loaded, image):
    cap = run_with_capture(loaded, image)
    return relevance_maps(loaded, image, cap=cap, methods=("rollout",)).maps["rollout"]


def test_lrp_leaves_the_model_as_it_was(tiny_lively):
    loaded = tiny_lively
    model = loaded.model
    params = list(model.parameters())
    params[0].requires_grad_(False)
    model.train()
    try:
        state = [p.requires_grad for p in params], [b.attn.fused_attn for b in model.blocks]
        before = [p.detach().clone() for p in params]
        relevance_maps(loaded, drawn_image(5), methods=("attnlrp", "cplrp"))
        assert ([p.requires_grad for p in params], [b.attn.fused_attn for b in model.blocks]) == state
        assert model.training and all(p.grad is None for p in params)
        assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
        assert hooks_on(model) == 0 and recording_hooks_on(model) == 0 and not loaded.lock.locked()
    finally:
        params[0].requires_grad_(True)
        model.eval()


def test_a_part_without_a_rule_is_unsupported_with_a_sentence(families):
    from timm.layers import ConvMlp

    loaded = families["class_token"]
    model = copy.deepcopy(loaded.model)
    model.blocks[1].mlp = ConvMlp(32, 64)
    why = lrp.why_unsupported(model)
    assert why == "AttnLRP has no rule for blocks.1.mlp, a ConvMlp."
    with pytest.raises(lrp.LrpError, match="blocks.1.mlp"):
        lrp.input_relevance(model, an_input(model), 0)
    assert lrp.why_unsupported(torch.nn.Linear(2, 2)).startswith("AttnLRP runs on timm's VisionTransformer family")


def test_a_forward_that_does_not_reproduce_the_logits_is_not_shown(families, monkeypatch):
    """The LRP forward's logits are checked against the model's (the gradient pass's): a mismatch is `unsupported`,
    never a map of another function."""
    loaded = families["class_token"]
    real = lrp.input_relevance

    def shifted(*args, **kwargs):
        result = real(*args, **kwargs)
        return dataclasses.replace(result, logits=result.logits + 1.0)

    monkeypatch.setattr(lrp, "input_relevance", shifted)
    relevance = relevance_maps(loaded, drawn_image(6), choose_gamma=False)
    assert set(relevance.unsupported) == {"attnlrp", "cplrp"} and "attnlrp" not in relevance.maps
    assert "does not reproduce this model's logits" in relevance.unsupported["cplrp"]
    assert list(relevance.maps) == ["raw_attention", "rollout", "chefer", "gradcam"]
