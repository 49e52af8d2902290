"""`vit-lens compare --concepts-layer L` (vit_core.compare.concepts): one dictionary on both models' tokens, each
feature's share of activation mass from A, its lists; a model against itself, the Shapes ViT against its random
init, the same bytes in one shard and in two, and the sentence for models that can't share a dictionary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import drawn_image
from vit_core import __main__ as core_cli
from vit_core import load_model
from vit_core.compare.concepts import ONLY, concepts_skipped, feature_lists, shares
from vit_core.concepts import load_concepts
from vit_core.teaching.model import BUNDLED_DIR

SHAPES = ("--model", "vit-lens/shapes-vit")
SHAPES_RANDOM = ("--model-b", "vit_shapes_patch8_96", "--random-init-b", "--labels", BUNDLED_DIR / "labels.txt")
CPU = ("--device", "cpu", "--workers", "0", "--batch-size", "3")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for seed in range(5):
        drawn_image(seed, size=(100, 120)).save(root / f"{seed}.png")
    return root


def _compare(capsys, folder: Path, out: Path, *args) -> tuple[int, str, str]:
    status = core_cli.main(["compare", str(folder), *map(str, args), "--out", str(out), *CPU])
    said = capsys.readouterr()
    return status, said.out, said.err


def _summary(out: Path) -> dict:
    return json.loads((out / "compare.json").read_text())


def _feature_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "concepts").rglob("*"))
            if p.is_file() and "tokens" not in p.parts}


def test_shares_and_lists_follow_the_definition_and_leave_dead_features_out():
    mass_a = np.array([0.0, 3.0, 0.0, 1.0, 19.0, 1.0])
    mass_b = np.array([0.0, 0.0, 2.0, 1.0, 1.0, 19.0])
    share_a = shares(mass_a, mass_b)
    assert np.isnan(share_a[0]) and share_a[1] == 1.0 and share_a[2] == 0.0 and share_a[3] == 0.5
    assert share_a[4] == 19 / 20 == ONLY and share_a[5] == 1 / 20
    assert feature_lists(share_a) == {"only_a": [1, 4], "only_b": [2, 5], "shared": [3]}


def test_models_of_different_widths_or_too_few_blocks_share_no_dictionary():
    tiny = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, device="cpu")
    small = load_model("vit_small_patch16_224", pretrained=False, seed=0, depth=2, device="cpu")
    assert concepts_skipped(tiny.geometry, small.geometry, 1) == (
        "A's tokens have width 192 and B's 384: one dictionary can't encode both, so no concepts are shared.")
    assert concepts_skipped(tiny.geometry, tiny.geometry, 1) is None
    assert "beyond model A's blocks 0..1" in concepts_skipped(tiny.geometry, tiny.geometry, 2)


@pytest.fixture(scope="module")
def against_random(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    assert core_cli.main(["compare", str(folder), *map(str, SHAPES), *map(str, SHAPES_RANDOM), "--out", str(out),
                          *CPU, "--concepts-layer", "2"]) == 0
    return out


def test_the_shapes_vit_against_its_random_init_lists_every_alive_feature_once(against_random):
    summary = _summary(against_random)["concepts"]
    written = json.loads((against_random / "concepts" / "concepts.json").read_text())
    assert summary["layer"] == 2 and written["num_features"] == 8 * 256
    lists = [summary[name] for name in ("only_a", "only_b", "shared")]
    assert all(features == sorted(features) for features in lists)
    listed = [f for features in lists for f in features]
    assert len(listed) == len(set(listed)) and len(listed) + summary["counts"]["dead"] == written["num_features"]
    assert [f["index"] for f in written["features"]] == sorted(listed)
    assert summary["only_a"] or summary["only_b"]  # a trained model and noise don't share every concept
    for feature in written["features"]:
        share = feature["mass_a"] / (feature["mass_a"] + feature["mass_b"])
        assert feature["share_a"] == share
        assert feature["list"] == ("only_a" if share >= ONLY else "only_b" if share <= 1 - ONLY else "shared")
        assert (feature["mass_a"] > 0) == bool(feature["a"]["top"]) and (feature["mass_b"] > 0) == bool(feature["b"]["top"])
        for top in feature["a"]["top"] + feature["b"]["top"]:
            assert top["file"].endswith(".png") and 0 <= top["row"] < 12 and 0 <= top["col"] < 12
    a, b = (load_concepts(against_random / "concepts" / side) for side in ("a", "b"))  # each model's own file
    assert (a.model, b.model, a.layer) == ("vit-lens/shapes-vit", "vit_shapes_patch8_96", 2)
    assert np.array_equal(a.sae.W_enc.detach().numpy(), b.sae.W_enc.detach().numpy())  # one dictionary
    assert not np.array_equal(a.normalisation.mean, b.normalisation.mean)  # each its own statistics


def test_concepts_in_two_shards_collected_with_the_comparison_or_after_it_give_the_same_bytes(folder, against_random,
                                                                                                 tmp_path, capsys):
    both = (*SHAPES, *SHAPES_RANDOM)
    status, said, _ = _compare(capsys, folder, tmp_path, *both, "--concepts-layer", 2, "--shard", "1/2")
    assert status == 0 and "1 of 2 shards done" in said  # shard 1's tokens collected in the comparison's pass
    assert not (tmp_path / "concepts" / "concepts.json").exists()
    status, said, _ = _compare(capsys, folder, tmp_path, *both, "--shard", "2/2")  # without: no tokens of shard 2
    assert status == 0 and "concepts" not in _summary(tmp_path)
    status, said, _ = _compare(capsys, folder, tmp_path, *both, "--concepts-layer", 2)  # shard 2's tokens on their own
    assert status == 0 and "2 of 2 shards already done" in said
    assert (tmp_path / "compare.json").read_bytes() == (against_random / "compare.json").read_bytes()
    assert _feature_files(tmp_path) == _feature_files(against_random)


def test_a_model_against_itself_shares_every_alive_feature_half_and_half(folder, tmp_path, capsys):
    status, said, _ = _compare(capsys, folder, tmp_path, *SHAPES, "--concepts-layer", 1)
    assert status == 0 and " 0 only in A, 0 only in B, " in said
    summary = _summary(tmp_path)["concepts"]
    written = json.loads((tmp_path / "concepts" / "concepts.json").read_text())
    assert summary["only_a"] == summary["only_b"] == [] and summary["shared"]
    assert all(f["share_a"] == 0.5 and f["mass_a"] == f["mass_b"] and f["a"] == f["b"] for f in written["features"])


def test_a_block_beyond_the_models_is_skipped_with_a_sentence_and_no_folder(folder, tmp_path, capsys):
    status, _, _ = _compare(capsys, folder, tmp_path, *SHAPES, *SHAPES_RANDOM, "--concepts-layer", 4)
    assert status == 0 and not (tmp_path / "concepts").exists()
    summary = _summary(tmp_path)
    assert "concepts" not in summary
    assert {"comparison": "concepts", "reason": "Block 4 is beyond model A's blocks 0..3, so no concepts are shared "
            "there."} in summary["skipped"]


def test_concepts_with_the_ray_engine_are_refused_in_one_line(folder, tmp_path, capsys):
    status, _, err = _compare(capsys, folder, tmp_path, *SHAPES, "--concepts-layer", 1, "--engine", "ray")
    assert status == 2
    assert err == "vit_core: --concepts-layer 1: the two models' tokens are collected by --engine local only\n"
