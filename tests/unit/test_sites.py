"""Named sites (vit_core.sites): each one the tensor timm's own modules compute, recorded only when asked, hooks gone after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FAMILY, drawn_image, hooks_on
from vit_core import load_model, preprocess, recording_hooks_on, run_with_capture
from vit_core.sites import BLOCK_ALIASES, BLOCK_SITES, MODEL_ALIASES, SiteError, recorded_sites, site_names

EVERY_SITE = ("embed", "norm", "pre_logits", "logits", *(f"blocks.*.{part}" for part in BLOCK_SITES))


@pytest.fixture(scope="module")
def qk_normed():
    """A 2-block ViT whose attention normalises q and k (timm's qk_norm=True), so "after q_norm" is not raw qkv."""
    model = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, qk_norm=True)
    for blk in model.model.blocks:  # LayerNorm's init is the identity map: make the norms' affine part visible
        torch.nn.init.normal_(blk.attn.q_norm.weight, 1.0, 0.3, generator=torch.Generator().manual_seed(1))
        torch.nn.init.normal_(blk.attn.k_norm.weight, 1.0, 0.3, generator=torch.Generator().manual_seed(2))
    return model


def timm_outputs(loaded, image, modules):
    """What each of `modules` (name -> module) outputs in a forward of `image` on timm's un-fused attention path (the one
    the capture runs, so later blocks see the same bits), hooked here by the test itself."""
    seen, handles = {}, []
    for blk in loaded.model.blocks:
        blk.attn.fused_attn = False
    for name, module in modules.items():
        handles.append(module.register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, o[0].detach().clone())))
    try:
        with torch.no_grad():
            loaded.model(preprocess(loaded, image)[1])
    finally:
        for h in handles:
            h.remove()
        for blk in loaded.model.blocks:
            blk.attn.fused_attn = True
    return {name: t.numpy() for name, t in seen.items()}


def test_q_and_k_are_timms_own_q_norm_and_k_norm_outputs(qk_normed):
    image = drawn_image(3)
    cap = run_with_capture(qk_normed, image, sites=["blocks.*.attn.q", "blocks.*.attn.k"])
    blocks = qk_normed.model.blocks
    want = timm_outputs(qk_normed, image, {f"{b}.{qk}": getattr(blk.attn, f"{qk}_norm")
                                           for b, blk in enumerate(blocks) for qk in "qk"})
    g = qk_normed.geometry
    for b in range(g.num_layers):
        q, k = cap.site(f"blocks.{b}.attn.q"), cap.site(f"blocks.{b}.attn.k")
        assert q.shape == k.shape == (g.num_heads, g.num_tokens, g.embed_dim // g.num_heads) and q.dtype == np.float32
        np.testing.assert_array_equal(q, want[f"{b}.q"])
        np.testing.assert_array_equal(k, want[f"{b}.k"])
        # the norm did something, and softmax(q k^T x scale) from these sites is the captured pattern
        raw_q = (blocks[b].attn.qkv(blocks[b].norm1(torch.from_numpy(cap.site(f"blocks.{b}.in").copy())))
                 .reshape(g.num_tokens, 3, g.num_heads, -1)[:, 0].transpose(0, 1))  # (T, 3, H, dh) -> (H, T, dh)
        assert not np.allclose(q, raw_q.detach().numpy(), atol=1e-3)
        scores = torch.from_numpy(q * blocks[b].attn.scale) @ torch.from_numpy(k.copy()).transpose(-2, -1)  # (H, T, T)
        np.testing.assert_allclose(scores.softmax(-1).numpy(), cap.site(f"blocks.{b}.attn.pattern"), atol=1e-6)
    assert cap.site("blocks.*.attn.q").shape == (g.num_layers, g.num_heads, g.num_tokens, g.embed_dim // g.num_heads)


def test_v_attn_out_and_mlp_hidden_are_the_blocks_own(tiny):
    image = drawn_image(4)
    cap = run_with_capture(tiny, image, sites=["blocks.1.attn.v", "blocks.1.attn.out", "blocks.1.mlp.hidden"])
    blk, g = tiny.model.blocks[1], tiny.geometry
    x = torch.from_numpy(cap.site("blocks.1.in").copy())[None]  # (1, T, D)
    with torch.no_grad():
        h = blk.norm1(x)
        v = blk.attn.qkv(h).reshape(1, g.num_tokens, 3, g.num_heads, -1)[0, :, 2].transpose(0, 1)  # (H, T, dh)
        attn_out = blk.attn(h)[0]  # (T, D)
        mid = x + blk.ls1(attn_out)
        hidden = blk.mlp.act(blk.mlp.fc1(blk.norm2(mid)))[0]  # (T, D_mlp)
    np.testing.assert_allclose(cap.site("blocks.1.attn.v"), v.numpy(), atol=1e-6)
    np.testing.assert_allclose(cap.site("blocks.1.attn.out"), attn_out.numpy(), atol=1e-5)
    np.testing.assert_allclose(cap.site("blocks.1.mlp.hidden"), hidden.numpy(), atol=1e-5)
    assert cap.site("blocks.1.mlp.hidden").shape == (g.num_tokens, blk.mlp.fc1.out_features)
    # the block's output is its input plus both branches
    np.testing.assert_allclose(cap.site("blocks.1.out"), (mid + blk.ls2(blk.mlp(blk.norm2(mid))))[0].detach().numpy(), atol=1e-5)


def test_default_sites_are_the_captures_fields_and_asking_for_more_changes_no_bit(tiny):
    image = drawn_image(5)
    plain = run_with_capture(tiny, image)
    full = run_with_capture(tiny, image, sites=EVERY_SITE)
    for name in ("input_image", "input_tensor", "patch_embeddings", "tokens", "pattern", "final_tokens", "pre_logits", "logits"):
        np.testing.assert_array_equal(getattr(full, name), getattr(plain, name), err_msg=name)
    assert plain.sites == {} and set(full.sites) == set(recorded_sites(EVERY_SITE, 2))  # q, k, v, out, hidden of 2 blocks
    assert len(full.sites) == 10
    np.testing.assert_array_equal(plain.site("embed"), plain.patch_embeddings)
    np.testing.assert_array_equal(plain.site("blocks.*.in"), plain.tokens[:-1])
    np.testing.assert_array_equal(plain.site("blocks.*.out"), plain.tokens[1:])
    np.testing.assert_array_equal(plain.site("blocks.*.attn.pattern"), plain.pattern)
    np.testing.assert_array_equal(plain.site("norm"), plain.final_tokens)
    for name in ("pre_logits", "logits"):
        np.testing.assert_array_equal(plain.site(name), getattr(plain, name))
    assert all(not a.flags.writeable for a in full.sites.values())


def test_transformerlens_names_are_aliases_of_the_same_arrays(tiny):
    cap = run_with_capture(tiny, drawn_image(6), sites=["blocks.0.attn.hook_q", "blocks.*.mlp.hook_post"])
    pairs = [*MODEL_ALIASES.items(), *((f"blocks.0.{alias}", f"blocks.0.{ours}") for alias, ours in BLOCK_ALIASES.items()
                                       if ours not in ("attn.k", "attn.v", "attn.out"))]  # those three: not recorded here
    assert len(pairs) == 7
    for alias, ours in pairs:
        np.testing.assert_array_equal(cap.site(alias), cap.site(ours))
    assert site_names("blocks.*.hook_resid_post", 2) == ["blocks.0.out", "blocks.1.out"]


@pytest.mark.parametrize("name, says", [
    ("blocks.0.attn.scores", "no site 'blocks.0.attn.scores'"), ("resid", "no site 'resid'"),
    ("blocks.2.attn.q", "it has 2 blocks, 0 to 1"), ("blocks.1.attn.k", "was not recorded"),
])
def test_a_site_that_is_not_there_is_one_sentence_naming_it(tiny, name, says):
    cap = run_with_capture(tiny, drawn_image(0), sites=["blocks.0.attn.k"])
    with pytest.raises(SiteError, match=says.replace("(", r"\(")) as raised:
        cap.site(name)
    assert "\n" not in str(raised.value)


def test_an_unknown_site_is_refused_before_the_pass(tiny):
    with pytest.raises(SiteError, match="no site 'blocks.9.in' on this model"):
        run_with_capture(tiny, drawn_image(0), sites=["blocks.9.in"])
    assert hooks_on(tiny.model) == 0


def test_site_hooks_are_gone_after_the_pass_also_when_the_forward_raises(tiny):
    def broken(module, args, output):
        raise RuntimeError("a probe that fails")

    foreign = tiny.model.norm.register_forward_hook(broken)
    try:
        with pytest.raises(RuntimeError, match="a probe that fails"):
            run_with_capture(tiny, drawn_image(0), sites=EVERY_SITE)
        assert recording_hooks_on(tiny.model) == 0 and hooks_on(tiny.model) == 1  # only the test's own
    finally:
        foreign.remove()
    run_with_capture(tiny, drawn_image(0), sites=EVERY_SITE)
    assert hooks_on(tiny.model) == 0 and all(blk.attn.fused_attn for blk in tiny.model.blocks)


@pytest.mark.parametrize("kind", list(FAMILY))
def test_every_site_on_every_branch_of_the_family(family, kind):
    loaded = family[kind]
    g = loaded.geometry
    cap = run_with_capture(loaded, drawn_image(1), sites=EVERY_SITE)
    dh, t = g.embed_dim // g.num_heads, g.num_tokens
    shapes = {"embed": (g.grid[0] * g.grid[1], g.embed_dim), "norm": (t, g.embed_dim),
              "blocks.*.in": (g.num_layers, t, g.embed_dim), "blocks.*.attn.q": (g.num_layers, g.num_heads, t, dh),
              "blocks.*.attn.pattern": (g.num_layers, g.num_heads, t, t), "blocks.*.attn.out": (g.num_layers, t, g.embed_dim)}
    for name, shape in shapes.items():
        assert cap.site(name).shape == shape, name
        assert cap.site(name).dtype == np.float32
    assert hooks_on(loaded.model) == 0
