"""The static lesson's ONNX graph (vit_core.web.graph) run by onnxruntime against the library on the same tensor:
`run_with_capture` (logits, attention, token norms), the logit lens, patch dropping and head ablation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

ort = pytest.importorskip("onnxruntime")

from vit_core import load_model, run_with_capture  # noqa: E402
from vit_core.explain.interventions import predict_intervened  # noqa: E402
from vit_core.explain.lens import logit_lens  # noqa: E402
from vit_core.web.graph import WebExportError, check_exportable, onnx_graph, shared_weights  # noqa: E402

TOLERANCE = 1e-5


def ring(size=(120, 100)) -> Image.Image:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).ellipse((20, 15, 95, 85), outline=(30, 60, 200), width=7)
    return image


@pytest.fixture(scope="module")
def shapes():
    loaded = load_model("vit-lens/shapes-vit")
    session = ort.InferenceSession(onnx_graph(loaded), providers=["CPUExecutionProvider"])
    return loaded, session


def run_graph(session, loaded, x: np.ndarray, kept: np.ndarray | None = None, heads: np.ndarray | None = None):
    """x (B, 3, H, W), kept (B, K) patch indices (default: all) -> the graph's four outputs."""
    g = loaded.geometry
    kept = np.tile(np.arange(g.num_patches), (x.shape[0], 1)) if kept is None else kept
    heads = np.ones((g.num_layers, g.num_heads), np.float32) if heads is None else heads
    return session.run(None, {"pixels": x.astype(np.float32), "kept": kept.astype(np.int64), "head_mask": heads})


def test_graph_equals_the_capture(shapes):
    loaded, session = shapes
    cap = run_with_capture(loaded, ring())
    logits, attention, lens, norms = run_graph(session, loaded, cap.input_tensor[None])
    assert np.abs(logits[0] - cap.logits).max() <= TOLERANCE
    assert np.abs(attention[0] - cap.pattern).max() <= TOLERANCE
    assert np.abs(lens[0] - logit_lens(loaded, cap)).max() <= TOLERANCE * max(1.0, np.abs(cap.logits).max())
    token_norms = np.linalg.norm(cap.tokens.astype(np.float64), axis=-1)  # (L+1, T)
    assert np.abs(norms[0] - token_norms).max() <= TOLERANCE * token_norms.max()


def test_keep_mask_and_head_mask_are_the_library_interventions(shapes):
    loaded, session = shapes
    image = ring()
    cap = run_with_capture(loaded, image)
    g = loaded.geometry
    dropped = set(range(0, g.num_patches, 3))
    kept = np.array([[k for k in range(g.num_patches) if k not in dropped]] * 2)
    kept[1] = kept[1][::-1]  # the same set in another order: the same prediction
    heads = np.ones((g.num_layers, g.num_heads), np.float32)
    logits, *_ = run_graph(session, loaded, np.repeat(cap.input_tensor[None], 2, axis=0), kept)  # a batch of two
    dropped_logits = predict_intervened(loaded, cap, drop=dropped)
    assert np.abs(logits - dropped_logits).max() <= TOLERANCE
    heads[1, 2] = heads[3, 0] = 0
    logits, *_ = run_graph(session, loaded, cap.input_tensor[None], heads=heads)
    assert np.abs(logits[0] - predict_intervened(loaded, cap, ablate=[(1, 2), (3, 0)])).max() <= TOLERANCE


def test_the_logits_graph_shares_the_weights_and_gives_the_librarys_dropped_logits(shapes, tmp_path):
    """The perturbation tests' graph (logits alone, the last block for the class token) reads the same weights file as
    the full graph, each tensor stored once, and gives the library's logits of a dropped-patch set."""
    loaded, _ = shapes
    graphs, weights = shared_weights({"full.onnx": onnx_graph(loaded), "logits.onnx": onnx_graph(loaded, logits_only=True)},
                                     "w.bin")
    params = sum(p.numel() for p in loaded.model.parameters()) * 4
    assert params <= len(weights) < 1.2 * params  # once, plus the last block's query and key-value halves
    for name, data in {**graphs, "w.bin": weights}.items():
        (tmp_path / name).write_bytes(data)
    cap = run_with_capture(loaded, ring())
    g = loaded.geometry
    dropped = set(range(5, g.num_patches, 4))
    kept = np.array([[k for k in range(g.num_patches) if k not in dropped]])
    expected = predict_intervened(loaded, cap, drop=dropped)
    for name in graphs:
        session = ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"])
        logits = session.run(["logits"], {"pixels": cap.input_tensor[None], "kept": kept,
                                          "head_mask": np.ones((g.num_layers, g.num_heads), np.float32)})[0]
        assert np.abs(logits[0] - expected).max() <= TOLERANCE, name


def test_a_small_imagenet_vit_too(tiny, image):
    session = ort.InferenceSession(onnx_graph(tiny), providers=["CPUExecutionProvider"])
    cap = run_with_capture(tiny, image)
    logits, attention, *_ = run_graph(session, tiny, cap.input_tensor[None])
    assert np.abs(logits[0] - cap.logits).max() <= TOLERANCE
    assert np.abs(attention[0] - cap.pattern).max() <= TOLERANCE


def test_models_the_graph_cant_carry_are_refused_in_one_sentence(family):
    with pytest.raises(WebExportError, match="class token"):
        check_exportable(family["no_class_token"])
    with pytest.raises(WebExportError, match=r"MB, above the 1 MB"):
        check_exportable(family["class_token"], limit=2**20)


GRAPH_SITES = ["blocks.*.attn.q", "blocks.1.attn.hook_k", "blocks.0.attn.v", "blocks.*.attn.out", "blocks.*.mlp.hidden",
               "blocks.*.in", "blocks.2.out", "blocks.*.attn.pattern", "embed", "norm", "pre_logits", "logits"]


def test_the_graph_writes_out_named_sites_as_the_capture_records_them(shapes):
    """"The browser needs q.k" is a name: each site asked for is an output of its name (in our words), the capture's."""
    loaded, _ = shapes
    session = ort.InferenceSession(onnx_graph(loaded, sites=GRAPH_SITES), providers=["CPUExecutionProvider"])
    names = [out.name for out in session.get_outputs()]
    assert names == ["logits", "attention", "logit_lens", "token_norms", "blocks.*.attn.q", "blocks.1.attn.k",
                     *GRAPH_SITES[2:-1]]  # "logits" is the lesson's output already
    cap = run_with_capture(loaded, ring(), sites=GRAPH_SITES)
    got = dict(zip(names, run_graph(session, loaded, cap.input_tensor[None]), strict=True))
    for name in names[4:]:
        want = cap.site(name)
        assert got[name].shape == (1, *want.shape), name
        assert np.abs(got[name][0] - want).max() <= TOLERANCE * max(1.0, np.abs(want).max()), name
    np.testing.assert_array_equal(got["blocks.*.attn.pattern"], got["attention"])  # one tensor, two names
    g = loaded.geometry
    kept = np.arange(0, g.num_patches, 3)[None]  # patches dropped: the sites' token axes follow
    dropped = dict(zip(names, run_graph(session, loaded, cap.input_tensor[None], kept=kept), strict=True))
    assert dropped["blocks.*.attn.q"].shape == (1, g.num_layers, g.num_heads, g.num_prefix_tokens + kept.shape[1],
                                                g.embed_dim // g.num_heads)


def test_a_site_the_graph_cant_write_is_refused_in_one_sentence(shapes):
    from vit_core.sites import SiteError

    loaded, _ = shapes
    with pytest.raises(SiteError, match=r"^no site 'blocks.\*.attn.scores'"):
        onnx_graph(loaded, sites=["blocks.*.attn.scores"])
    with pytest.raises(SiteError, match=r"^no site 'blocks.9.attn.q' on this model: it has 4 blocks"):
        onnx_graph(loaded, sites=["blocks.9.attn.q"])
    with pytest.raises(WebExportError, match=r"^the logits graph computes the last block for the class token only"):
        onnx_graph(loaded, logits_only=True, sites=["blocks.*.attn.q"])
