"""Concepts across layers (vit_core.concepts.circuit): several blocks collected in one pass as each alone, the
attribution against a plain autograd loop over (u, v), the removal sums against one removal at a time, the edges'
order, the same bits whatever the forward pool's width, and a planted marker found at blocks 1 and 2 and joined by an
edge whose removal effect is at least 0.5. On the bundled Shapes ViT and images the tests draw."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_core import __main__ as core_cli
from vit_core import load_model
from vit_core.concepts import TokenStore, collect_shards, load_concepts
from vit_core.concepts.circuit import (
    EDGES_PER_FEATURE,
    blocks_between,
    gradient_pass,
    image_attribution,
    layer_pair,
    padded,
    removal_sums,
    top_upstream,
)
from vit_core.concepts.collect import collect_layers, residual_after, residuals_after
from vit_core.concepts.folders import BUNDLED_DIR
from vit_core.dataset import plan_run
from vit_core.explain.passes import model_input, model_pass
from vit_core.teaching.data import LABELS, draw_set

P = 1  # the Shapes ViT's prefix tokens (its class token)


@pytest.fixture(scope="module")
def shapes():
    return load_model("vit-lens/shapes-vit", device="cpu")


@pytest.fixture(scope="module")
def pair():
    """The bundled block-2 dictionary downstream, the same weights standing in for block 1's upstream (the arithmetic
    is checked, not what the features mean)."""
    downstream = load_concepts(BUNDLED_DIR)
    return replace(downstream, layer=1), downstream


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """24 drawn Shapes images in class folders (2 held out)."""
    drawn = draw_set(24, seed=58)
    root = tmp_path_factory.mktemp("circuit")
    for i in range(24):
        (root / LABELS[drawn.labels[i]]).mkdir(exist_ok=True)
        Image.fromarray(drawn.images[i]).save(root / LABELS[drawn.labels[i]] / f"{i:02d}.png")
    return root


def residual(shapes, image: np.ndarray, layer: int) -> torch.Tensor:
    with model_pass(shapes):
        return residual_after(shapes, model_input(shapes, Image.fromarray(image)), layer)[0].clone()  # (T, D)


def test_several_blocks_collect_the_tokens_each_block_collects_alone(shapes, folder, tmp_path):
    x = model_input(shapes, Image.open(next(folder.rglob("*.png"))))
    with model_pass(shapes):
        together = residuals_after(shapes, x, (1, 3))
        for layer, found in zip((1, 3), together, strict=True):
            assert torch.equal(found, residual_after(shapes, x, layer))
    plan = plan_run(shapes, folder, num_shards=2)
    alone, stores = TokenStore(tmp_path / "alone"), [TokenStore(tmp_path / "one"), TokenStore(tmp_path / "three")]
    collect_shards(shapes, plan, 3, alone, plan.shards, batch_size=5)
    collect_layers(shapes, plan, (1, 3), stores, plan.shards, batch_size=5)
    for name in ("tokens-00000.npy", "images-00000.npy", "done.json"):
        for shard in plan.shards:
            assert (alone.shard_path(shard) / name).read_bytes() == (stores[1].shard_path(shard) / name).read_bytes()
    assert not np.array_equal(np.load(stores[0].shard_path(plan.shards[0]) / "tokens-00000.npy"),
                              np.load(alone.shard_path(plan.shards[0]) / "tokens-00000.npy"))


@pytest.mark.parametrize("b, hooked", [(2, False), (3, False), (2, True)])  # a hooked block b runs whole
def test_the_attribution_is_a_plain_autograd_loop_over_u_and_v(shapes, pair, b, hooked):
    upstream, downstream = pair[0], replace(pair[1], layer=b)
    h = residual(shapes, draw_set(1, seed=3).images[0], 1)
    hook = shapes.model.blocks[b].register_forward_hook(lambda *_: None) if hooked else None
    try:
        with gradient_pass(shapes):
            seen = image_attribution(shapes, upstream, downstream, h)
    finally:
        if hook is not None:
            hook.remove()
    assert len(seen.downstream) > 3 and seen.attribution.shape == (len(seen.downstream), upstream.sae.num_features)
    z = upstream.codes(h[P:])  # (N, Fa)
    absent = int(np.flatnonzero((z == 0).all(dim=0).numpy())[0])
    for row in (0, len(seen.downstream) // 2, len(seen.downstream) - 1):
        v = int(seen.downstream[row])
        strongest = np.argsort(-np.abs(seen.attribution[row]), kind="stable")[:2].tolist()
        for u in [*strongest, absent]:
            z_u = z[:, u].clone().requires_grad_(True)  # (N,): x(t') moves by s d_u per unit of z_u(t')
            with gradient_pass(shapes):
                moved = h[P:] + upstream.normalisation.scale * (z_u - z_u.detach())[:, None] * upstream.sae.W_dec[:, u].detach()
                after = blocks_between(shapes, torch.cat([h[:P], moved])[None], 1, b)[0, P:]  # (N, D)
                pre = downstream.sae.pre_activations(downstream.normalisation.apply(after))[:, v]  # (N,)
                (gradient,) = torch.autograd.grad((pre * torch.as_tensor(seen.fires[:, v])).sum(), z_u)
            expected = sum(float(z[t, u]) * float(gradient[t]) for t in range(len(z)))
            assert seen.attribution[row, u] == pytest.approx(expected, rel=1e-4, abs=1e-4 * (1 + abs(expected)))
        assert seen.attribution[row, absent] == 0.0


@pytest.mark.parametrize("b", [2, 3])  # block b right after a, or with a whole block between them
def test_the_removal_sums_are_one_removal_at_a_time(shapes, pair, b):
    upstream, downstream = pair[0], replace(pair[1], layer=b)
    h = residual(shapes, draw_set(1, seed=4).images[0], 1)
    z = upstream.codes(h[P:])
    present = np.flatnonzero((z > 0).any(dim=0).numpy())
    with torch.no_grad():
        fires = downstream.codes(blocks_between(shapes, h[None], 1, b)[0, P:]) > 0  # (N, Fb)
    v_fires = np.flatnonzero(fires.any(dim=0).numpy())
    absent = int(np.flatnonzero((z == 0).all(dim=0).numpy())[0])
    edges = np.array([(int(present[0]), int(v_fires[0])), (int(present[1]), int(v_fires[0])),
                      (int(present[0]), int(v_fires[1])), (absent, int(v_fires[2]))])
    with model_pass(shapes):
        plain, removed = removal_sums(shapes, upstream, downstream, h, edges)
    for e, (u, v) in enumerate(edges.tolist()):
        with torch.no_grad():
            moved = h.clone()
            moved[P:] -= upstream.normalisation.scale * z[:, u:u + 1] * upstream.sae.W_dec[:, u]
            after = downstream.codes(blocks_between(shapes, moved[None], 1, b)[0, P:])[:, v]
            before = downstream.codes(blocks_between(shapes, h[None], 1, b)[0, P:])[:, v]
        mask = fires[:, v]
        assert plain[e] == pytest.approx(float(before[mask].double().sum()), rel=1e-5)
        assert removed[e] == pytest.approx(float(after[mask].double().sum()), rel=1e-4, abs=1e-4)
    assert removed[3] == plain[3] and plain[0] > 0


def test_the_pairs_are_padded_to_a_few_sizes_with_copies_of_the_first():
    for count, size in ((0, 64), (1, 64), (64, 64), (65, 128), (1000, 1024)):
        rows, patches = torch.arange(count) // 7, torch.arange(count) % 7 + 3
        rows_padded, patches_padded = padded(rows, patches)
        assert len(rows_padded) == len(patches_padded) == size
        assert torch.equal(rows_padded[:count], rows) and torch.equal(patches_padded[:count], patches)
        first = (int(rows[0]), int(patches[0])) if count else (0, 0)
        assert set(zip(rows_padded[count:].tolist(), patches_padded[count:].tolist(), strict=True)) <= {first}


def test_the_edges_are_the_largest_absolute_attributions_ties_by_index():
    attribution = np.array([[0.0, -3.0, 1.0, 3.0, 0.5],
                            [0.0, 0.0, 0.0, 0.0, 0.0],
                            [2.0, 2.0, -2.0, 0.0, 1.0]])
    alive = np.array([True, True, True])
    assert top_upstream(attribution, alive, count=3).tolist() == [[1, 0], [3, 0], [2, 0], [0, 2], [1, 2], [2, 2]]
    assert top_upstream(attribution, np.array([False, False, True]), count=10).tolist() == [[0, 2], [1, 2], [2, 2], [4, 2]]


def test_the_circuit_is_the_same_bits_with_one_or_two_forwards_at_once(shapes, pair, folder, monkeypatch):
    upstream, downstream = pair
    plan = plan_run(shapes, folder)
    monkeypatch.setenv("VIT_LENS_MODEL_WORKERS", "1")
    one = layer_pair(shapes, plan, upstream, downstream)
    monkeypatch.setenv("VIT_LENS_MODEL_WORKERS", "2")
    two = layer_pair(shapes, plan, upstream, downstream)
    assert one.attribution.tobytes() == two.attribution.tobytes() and np.array_equal(one.edges, two.edges)
    assert one.removed.tobytes() == two.removed.tobytes() and one.plain.tobytes() == two.plain.tobytes()
    assert len(one.edges) > 0 and (one.plain > 0).all()


MARKER_PATCHES = 3  # the marker covers the top-left 3 x 3 patches (24 x 24 pixels)


def marked(image: np.ndarray) -> np.ndarray:
    """A magenta and green checkerboard of 4-pixel squares over the top-left MARKER_PATCHES^2 patches."""
    side = 8 * MARKER_PATCHES
    rows, cols = np.mgrid[0:side, 0:side]
    squares = ((rows // 4 + cols // 4) % 2).astype(bool)[..., None]
    image = image.copy()
    image[:side, :side] = np.where(squares, [255, 0, 255], [0, 255, 0])
    return image


def test_a_planted_marker_is_found_at_blocks_1_and_2_joined_by_an_edge_that_removal_breaks(shapes, tmp_path, capsys):
    """Every other image of 60 carries the marker; the command learns blocks 1 and 2 (F = 64, k = 2): some feature of
    each block finds it (fires on >= 90 % of the marker's patches, at least half of its firings there), and the
    circuit joins two such features by an edge whose removal effect is at least 0.5."""
    drawn = draw_set(60, seed=57)
    images = [marked(image) if i % 2 == 0 else image for i, image in enumerate(drawn.images)]
    for i, image in enumerate(images):
        (tmp_path / "images" / LABELS[drawn.labels[i]]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "images" / LABELS[drawn.labels[i]] / f"{i:03d}.png")
    out = tmp_path / "out"
    assert core_cli.main(["concepts", str(tmp_path / "images"), "--model", "vit-lens/shapes-vit", "--layer", "1,2",
                          "--features", "64", "--k", "2", "--epochs", "4", "--workers", "0", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "circuit of blocks 1, 2" in said and "circuit: 12 of 12 images" in said, said
    assert sorted(p.name for p in out.iterdir()) == ["circuit.json", "layer-1", "layer-2"]
    for layer in (1, 2):
        written = {p.name for p in (out / f"layer-{layer}").iterdir()}
        assert {"concepts.safetensors", "concepts.json", "contact_sheet.png", "tokens"} <= written
    circuit = json.loads((out / "circuit.json").read_text())
    assert circuit["layers"] == [1, 2]
    by_v: dict[int, list[float]] = {}
    for edge in circuit["edges"]:
        assert (edge["from"]["layer"], edge["to"]["layer"]) == (1, 2)
        by_v.setdefault(edge["to"]["feature"], []).append(abs(edge["attribution"]))
    assert all(len(sizes) <= EDGES_PER_FEATURE and sizes == sorted(sizes, reverse=True) for sizes in by_v.values())
    dictionaries = [load_concepts(out / "layer-1"), load_concepts(out / "layer-2")]
    grid = shapes.geometry.grid
    on_marker = np.zeros(grid, dtype=bool)
    on_marker[:MARKER_PATCHES, :MARKER_PATCHES] = True
    truth = np.concatenate([on_marker.reshape(-1) & (i % 2 == 0) for i in range(len(images))])  # (n N,)
    finders = []
    for concepts in dictionaries:
        fires = []
        for image in images:
            with model_pass(shapes):
                h = residual_after(shapes, model_input(shapes, Image.fromarray(image)), concepts.layer)[0]
            fires.append(concepts.encode(h[P:].numpy()) > 0)
        fires = np.concatenate(fires)  # (n N, F)
        found = (fires & truth[:, None]).sum(axis=0)
        precision, recall = found / np.maximum(fires.sum(axis=0), 1), found / truth.sum()
        finders.append(set(np.flatnonzero((recall >= 0.9) & (precision >= 0.5)).tolist()))
    joined = [edge for edge in circuit["edges"] if edge["from"]["feature"] in finders[0] and edge["to"]["feature"] in finders[1]]
    print(f"marker finders {finders}, their edges {joined}")
    assert finders[0] and finders[1] and max(edge["removal_effect"] for edge in joined) >= 0.5


def test_the_command_refuses_blocks_out_of_order(tmp_path, folder, capsys):
    for layers in ("2,1", "1,1", "0,1,2,3"):
        with pytest.raises(SystemExit):
            core_cli.main(["concepts", str(folder), "--layer", layers, "--out", str(tmp_path / "out")])
        assert "increasing order" in capsys.readouterr().err
    assert core_cli.main(["concepts", str(folder), "--layer", "2", "--circuit-images", "5", "--out", str(tmp_path)]) == 2
    assert "--circuit-images needs several blocks" in capsys.readouterr().err


def test_one_images_circuit_is_its_attribution_between_its_strongest_features(shapes, pair):
    from vit_core.concepts.circuit import image_circuit
    from vit_core.concepts.quality import logits_after

    upstream, downstream = pair
    image = draw_set(1, seed=6).images[0]
    x = model_input(shapes, Image.fromarray(image))
    seen = image_circuit(shapes, [upstream, downstream], x, shown=4)
    h = residual(shapes, image, 1)
    with gradient_pass(shapes):
        full = image_attribution(shapes, upstream, downstream, h)
    rows = {int(v): r for r, v in enumerate(full.downstream)}
    expected = np.stack([full.attribution[rows[int(v)]][seen.strongest[0]] for v in seen.strongest[1]])
    np.testing.assert_allclose(seen.attribution[0], expected, rtol=1e-9, atol=1e-9)
    z = upstream.codes(h[P:])
    assert seen.strongest[0].tolist() == np.argsort(-z.double().sum(dim=0).numpy(), kind="stable")[:4].tolist()
    h2 = residual(shapes, image, 2)
    z2 = downstream.codes(h2[P:])
    f = int(seen.strongest[1][0])
    z_f = z2[:, f].clone().requires_grad_(True)
    with gradient_pass(shapes):
        moved = h2[P:] + downstream.normalisation.scale * (z_f - z_f.detach())[:, None] * downstream.sae.W_dec[:, f].detach()
        (gradient,) = torch.autograd.grad(logits_after(shapes, torch.cat([h2[:P], moved])[None], 2)[0, seen.prediction], z_f)
    assert seen.to_prediction[0] == pytest.approx(float((z2[:, f].double() * gradient.double()).sum()), rel=1e-4, abs=1e-5)


def test_a_circuit_file_is_read_bounded_and_checked(tmp_path):
    from vit_core.concepts import ConceptsError
    from vit_core.concepts.folders import read_circuit

    good = {"layers": [1, 2], "edges": [{"from": {"layer": 1, "feature": 3}, "to": {"layer": 2, "feature": 5},
                                         "attribution": -2.5, "removal_effect": 0.75}]}
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps(good))
    assert read_circuit(path, 8) == good
    broken = [[], {"layers": [2, 1], "edges": []}, {"layers": [1, 2, 3, 4], "edges": []}, {"layers": [1, 2]},
              {**good, "edges": [{**good["edges"][0], "to": {"layer": 1, "feature": 5}}]},
              {**good, "edges": [{**good["edges"][0], "from": {"layer": 1, "feature": 8}}]},
              {**good, "edges": [{**good["edges"][0], "removal_effect": 1.5}]},
              {**good, "edges": [{**good["edges"][0], "attribution": True}]},
              {**good, "edges": [good["edges"][0]] * 81}]
    for content in broken:
        path.write_text(json.dumps(content))
        with pytest.raises(ConceptsError, match="circuit.json is damaged"):
            read_circuit(path, 8)
    path.write_text("[" * 50 + "]" * 50)
    with pytest.raises(ConceptsError, match="damaged"):
        read_circuit(path, 8)
    path.write_bytes(b" " * (2**20 + 400 * 10 * 8 * 2 + 1))
    with pytest.raises(ConceptsError, match="more than"):
        read_circuit(path, 8)
