"""The concepts' quality numbers (vit_core.concepts.quality): stability across seeds against a plain loop and known
values, the later blocks' logits against the model's own forward, and the steerable features against one spliced
forward per feature and image. On the bundled Shapes ViT, its bundled concepts and images the tests draw."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_core import load_model
from vit_core.concepts import concept_removed, held_out, load_concepts, spliced_logits
from vit_core.concepts.collect import residual_after
from vit_core.concepts.folders import BUNDLED_DIR
from vit_core.concepts.quality import (
    decoder_match,
    image_steers,
    logits_after,
    stability_of,
    steerable,
    steerable_share,
)
from vit_core.concepts.sae import initialised_sae
from vit_core.dataset import plan_run
from vit_core.explain.passes import model_input, model_pass
from vit_core.teaching.data import LABELS, draw_set


@pytest.fixture(scope="module")
def shapes():
    return load_model("vit-lens/shapes-vit", device="cpu")


@pytest.fixture(scope="module")
def concepts():
    return load_concepts(BUNDLED_DIR)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """20 drawn Shapes images in class folders (2 held out)."""
    drawn = draw_set(20, seed=57)
    root = tmp_path_factory.mktemp("quality")
    for i in range(20):
        (root / LABELS[drawn.labels[i]]).mkdir(exist_ok=True)
        Image.fromarray(drawn.images[i]).save(root / LABELS[drawn.labels[i]] / f"{i:02d}.png")
    return root


def test_decoder_match_is_the_largest_cosine_of_a_plain_loop_and_stability_its_alive_mean():
    first, second = initialised_sae(12, 20, 3, seed=1), initialised_sae(12, 30, 3, seed=2)
    with torch.no_grad():
        second.W_dec[:, 7] = first.W_dec[:, 4] * 2.5  # the same direction, another norm
    match = decoder_match(first, second)
    a, b = first.W_dec.detach().double().numpy(), second.W_dec.detach().double().numpy()
    for f in range(20):
        cosines = [a[:, f] @ b[:, g] / np.linalg.norm(a[:, f]) / np.linalg.norm(b[:, g]) for g in range(30)]
        assert match[f] == pytest.approx(max(cosines), abs=1e-12)
    assert match[4] == pytest.approx(1.0)
    assert decoder_match(first, first) == pytest.approx(np.ones(20))
    alive = np.zeros(20, dtype=bool)
    alive[[4, 5]] = True
    assert stability_of(match, alive) == pytest.approx({"stability": (match[4] + match[5]) / 2,
                                                        "stable_share": 0.5 if match[5] <= 0.9 else 1.0})
    assert np.isnan(stability_of(match, np.zeros(20, dtype=bool))["stability"])
    assert steerable_share(np.array([True, False, True]), np.array([True, True, False])) == 0.5


def test_the_later_blocks_give_the_models_own_logits(shapes, folder):
    x = model_input(shapes, Image.open(next(folder.rglob("*.png"))))
    with model_pass(shapes):
        for layer in range(shapes.geometry.num_layers):
            after = logits_after(shapes, residual_after(shapes, x, layer), layer)
            np.testing.assert_allclose(after.numpy(), shapes.model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_a_feature_steers_exactly_when_its_spliced_removal_changes_the_top_1(shapes, concepts, folder):
    """Every feature firing on two images, removed one at a time through the real splice (a hook on block L, the
    whole model run): top-1 changed or not, as image_steers says."""
    unchanged_somewhere = False
    for path in sorted(folder.rglob("*.png"))[:2]:
        x = model_input(shapes, Image.open(path))
        with model_pass(shapes):
            h = residual_after(shapes, x, concepts.layer)[0]  # (T, D)
            candidates = np.flatnonzero((concepts.codes(h[1:]) > 0).any(dim=0).numpy())
            said = image_steers(shapes, concepts, h, candidates)
        plain = int(spliced_logits(shapes, x, concepts.layer, None).argmax())
        truth = np.array([int(spliced_logits(shapes, x, concepts.layer, concept_removed(concepts, int(f))).argmax())
                          != plain for f in candidates])
        assert said.tolist() == truth.tolist()
        unchanged_somewhere |= bool((~truth).any())
    assert unchanged_somewhere


def test_steerable_features_are_those_some_held_out_image_steers(shapes, concepts, folder):
    concepts = copy.deepcopy(concepts)
    with torch.no_grad():
        concepts.sae.decoder.mul_(8.0)  # removals eight times as large: a few change a top-1 (none at 1x)
    plan = plan_run(shapes, folder)
    alive = np.ones(concepts.sae.num_features, dtype=bool)
    alive[::2] = False  # the dead are never tried
    found = steerable(shapes, concepts, plan, alive, batch_size=3, forwards=2)
    assert steerable(shapes, concepts, plan, alive, batch_size=2, forwards=1).tolist() == found.tolist()  # images apart
    per_image = []  # each held-out image's steering features, in the run's order
    for path, held in zip(plan.paths, held_out(plan.names), strict=True):
        if not held:
            continue
        x = model_input(shapes, Image.open(path))
        with model_pass(shapes):
            h = residual_after(shapes, x, concepts.layer)[0]
            candidates = np.flatnonzero((concepts.codes(h[1:]) > 0).any(dim=0).numpy() & alive)
            per_image.append(np.isin(np.arange(len(alive)), candidates[image_steers(shapes, concepts, h, candidates)]))
    assert len(per_image) == 2
    assert found.tolist() == np.logical_or.reduce(per_image).tolist()
    assert not found[~alive].any()
    assert found.any() and (per_image[0] != per_image[1]).any()  # the second image steers features the first does not
    shown = []
    first = steerable(shapes, concepts, plan, alive, batch_size=3, forwards=2, images=1,  # --steering-images 1
                      progress=lambda done, of: shown.append((done, of)))
    assert first.tolist() == per_image[0].tolist() and shown[-1] == (1, 1)


def test_the_command_measures_the_steerable_share_on_the_first_steering_images(folder, tmp_path, capsys):
    """`concepts --steering-images 1` on a folder with 2 held-out images: concepts.json's steers are those of the
    first held-out image alone (`steerable` with images=1), `steering_images` says 1, and the last line says so."""
    from vit_core import __main__ as core_cli

    out = tmp_path / "concepts"
    assert core_cli.main(["concepts", str(folder), "--model", "vit-lens/shapes-vit", "--layer", "2", "--features", "64",
                          "--k", "4", "--epochs", "1", "--workers", "0", "--steering-images", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "concepts.json").read_text())
    assert (summary["held_out_images"], summary["steering_images"]) == (2, 1)
    assert "(on 1 of the 2 held-out images)" in capsys.readouterr().out.splitlines()[-1]
    shapes = load_model("vit-lens/shapes-vit", device="cpu")
    concepts = load_concepts(out)
    alive = np.array([f["firing_rate"] > 0 for f in summary["features"]])  # fires somewhere: a superset of the alive
    first = steerable(shapes, concepts, plan_run(shapes, folder), alive, images=1)
    steers = np.array([f["steers"] for f in summary["features"]])
    assert steers[alive].tolist() == first[alive].tolist()
