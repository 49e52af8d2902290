"""A set of images through the concepts (vit_core.concepts.sets, the Many images page's Concepts section): the set's
features, top patches and error against a plain loop over its images, its tokens against the collection's, and one
concept removed over the set against the Concepts tab's per-image removal. The bundled Shapes ViT, a few drawn images,
a small autoencoder trained here."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PIL import Image

from unit.test_concepts import LAYER, drawn, patch_tokens_of, random_concepts, shapes, tokens_in_memory  # noqa: F401
from vit_core import analyses, recording_hooks_on, run_with_capture
from vit_core.concepts import (
    ConceptsError,
    TrainingSettings,
    logits_with_concept_removed,
    removal_agreement,
    set_concepts,
    set_logits_with_concept_removed,
    set_tokens,
)
from vit_core.concepts.learn import learned_concepts
from vit_core.explain import between_batches
from vit_core.serving import WorkStopped, background_work

IMAGES = 3


@pytest.fixture(scope="module")
def pictures(drawn):  # noqa: F811
    return [Image.fromarray(image) for image in drawn.images[:IMAGES]]


@pytest.fixture(scope="module")
def trained(shapes, drawn):  # noqa: F811
    """32 features, k = 4, one epoch over 12 drawn images' tokens."""
    tokens = patch_tokens_of(shapes, drawn.images[:12])
    return learned_concepts(shapes, tokens_in_memory(tokens), LAYER, TrainingSettings(num_features=32, k=4, epochs=1,
                                                                                       batch_tokens=128))


def test_the_sets_features_top_patches_and_error_equal_a_loop_over_its_images():
    concepts = random_concepts(num_features=12, k=3)
    tokens = np.random.default_rng(5).normal(size=(4, 6, 16)).astype(np.float32)  # 4 images of 6 patches
    seen = set_concepts(concepts, tokens, count=5, top=7)
    totals, fired, error = np.zeros(12), np.zeros(12), 0.0
    every = []
    for i in range(4):
        z = concepts.encode(tokens[i])  # (6, 12)
        totals += z.sum(axis=0)
        fired += (z > 0).sum(axis=0)
        error += float(((tokens[i].astype(np.float64) - concepts.decode(z)) ** 2).sum())
        every += [(i, p, z[p]) for p in range(6)]
    np.testing.assert_allclose(seen.mean_activation, totals / 24, rtol=1e-5)
    np.testing.assert_allclose(seen.firing_rate, fired / 24)
    ranked = sorted(range(12), key=lambda f: (-totals[f], f))
    assert seen.strongest.tolist() == [f for f in ranked[:5] if totals[f] > 0]
    for j, f in enumerate(seen.strongest.tolist()):
        best = sorted(every, key=lambda t: -t[2][f])[:7]  # stable: image, then patch, among equals
        np.testing.assert_allclose(seen.top_activation[j], [t[2][f] for t in best], rtol=1e-5)
        assert list(zip(seen.top_image[j].tolist(), seen.top_patch[j].tolist(), strict=True)) == [(t[0], t[1]) for t in best]
    flat = tokens.reshape(24, 16).astype(np.float64)
    assert seen.error == pytest.approx(error / ((flat - flat.mean(axis=0)) ** 2).sum(), rel=1e-5)


def test_a_set_of_another_width_or_no_image_is_refused():
    concepts = random_concepts()
    with pytest.raises(ConceptsError):
        set_concepts(concepts, np.zeros((2, 6, 8), dtype=np.float32))
    with pytest.raises(ConceptsError):
        set_concepts(concepts, np.zeros((0, 6, 16), dtype=np.float32))


def test_the_sets_tokens_are_the_collections(shapes, drawn, pictures):  # noqa: F811
    done = []
    tokens = set_tokens(shapes, pictures, LAYER, progress=lambda d, n: done.append((d, n)))
    assert tokens.shape == (IMAGES, shapes.geometry.num_patches, shapes.geometry.embed_dim)
    np.testing.assert_allclose(tokens, patch_tokens_of(shapes, drawn.images[:IMAGES]), rtol=1e-5, atol=1e-5)
    assert done[-1] == (IMAGES, IMAGES)


def test_removal_over_the_set_equals_the_tabs_removal_image_by_image(shapes, pictures, trained):  # noqa: F811
    feature = int(set_concepts(trained, set_tokens(shapes, pictures, LAYER)).strongest[0])
    plain, removed = set_logits_with_concept_removed(shapes, pictures, trained, feature)
    assert recording_hooks_on(shapes.model) == 0
    agree, divergence = 0, 0.0
    np.testing.assert_allclose(plain[0], run_with_capture(shapes, pictures[0]).logits, rtol=1e-5, atol=1e-5)
    for i, picture in enumerate(pictures):
        one = logits_with_concept_removed(shapes, picture, trained, feature)
        np.testing.assert_allclose(removed[i], one, rtol=1e-5, atol=1e-5)
        p, q = analyses.softmax(plain[i]).astype(np.float64), analyses.softmax(one).astype(np.float64)
        agree += int(np.argmax(p) == np.argmax(q))
        divergence += float(sum(p[c] * (np.log(p[c]) - np.log(q[c])) for c in range(len(p))))
    agreement, kl = removal_agreement(plain, removed)
    assert agreement == agree / IMAGES
    assert kl == pytest.approx(divergence / IMAGES, rel=1e-4, abs=1e-7)
    # The plain logits of an earlier call are taken as they are: the removed ones are the same.
    again_plain, again = set_logits_with_concept_removed(shapes, pictures, trained, feature, plain=plain)
    assert again_plain is plain and again.tobytes() == removed.tobytes()


def test_the_between_batches_hook_runs_before_each_image_and_may_end_the_run(shapes, pictures, trained):  # noqa: F811
    """The library's one hook for a caller sharing the model: called before each image's forward, and a raise from it
    ends the set there."""

    class Ended(Exception):
        pass

    calls: list[int] = []

    def second_ends() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            raise Ended

    with between_batches(lambda: calls.append(len(calls))):
        set_tokens(shapes, pictures, LAYER)
    assert len(calls) == len(pictures)
    for run in (lambda: set_tokens(shapes, pictures, LAYER),
                lambda: set_logits_with_concept_removed(shapes, pictures, trained, 0)):
        calls.clear()
        with between_batches(second_ends), pytest.raises(Ended):
            run()
        assert len(calls) == 2
    assert recording_hooks_on(shapes.model) == 0 and not shapes.lock.locked()


def test_a_stopped_job_stops_before_its_next_image(shapes, pictures, trained):  # noqa: F811
    """The server's explanation job (vit_core.serving.background_work) through that hook."""
    stop = threading.Event()
    stop.set()
    with background_work(stop), pytest.raises(WorkStopped):
        set_tokens(shapes, pictures, LAYER)
    with background_work(stop), pytest.raises(WorkStopped):
        set_logits_with_concept_removed(shapes, pictures, trained, 0)
    assert recording_hooks_on(shapes.model) == 0


def test_removal_agreement_of_known_logits():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    assert removal_agreement(logits, logits) == (1.0, pytest.approx(0.0, abs=1e-12))
    swapped = logits[:, [1, 0, 2]]  # the first image's top-1 moves; the second's too
    agreement, kl = removal_agreement(logits, swapped)
    assert agreement == 0.0 and kl > 0
