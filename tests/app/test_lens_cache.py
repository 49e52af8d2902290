"""The dashboard's one cache of lens results (dashboard.caches.lens_arrays): keyed by what a lens declares (model,
image, lens, its settings' values), read from the shared capture unless the lens asks for sites beyond it, bounded by
bytes, and shared by the views, the lesson and the export."""

from __future__ import annotations

import numpy as np
import pytest

import vit_core
from dashboard import caches, examples
from dashboard.models import TEST_TINY, ModelRequest
from dashboard.server.byte_budget import ByteBudgetCache
from dashboard.views import attention
from dashboard.views.context import ViewContext
from vit_core import analyses, lenses
from vit_core.lenses.attention_logits import attention_scores


@pytest.fixture
def page(tiny_env, monkeypatch):
    """(request, loaded, image, cap) of the tiny model's default example, with an empty lens store of its own and the
    forwards run by a lens counted."""
    monkeypatch.setattr(caches, "_lens_results", ByteBudgetCache(caches.LENS_BUDGET, size_of=caches._lens_nbytes))
    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    name = examples.default_example(loaded.name)
    image = caches.decode(name, caches.example_bytes(name), in_session=False)
    cap = caches.shared_capture(request, loaded, image)
    passes = []
    real = vit_core.run_with_capture

    def counted(*args, **kwargs):
        passes.append(kwargs.get("sites"))
        return real(*args, **kwargs)

    monkeypatch.setattr(vit_core, "run_with_capture", counted)
    return request, loaded, image, cap, passes


def test_a_lens_of_the_default_capture_runs_no_forward_and_one_with_extra_sites_one(page):
    request, loaded, image, cap, passes = page
    g = cap.geometry
    distances = caches.lens_arrays(request, loaded, image, cap, "mean_attention_distance")
    assert passes == []  # read from the shared capture
    plain, renorm = analyses.mean_attention_distances(cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)
    np.testing.assert_array_equal(distances["mean_attention_distance"], plain)
    np.testing.assert_array_equal(distances["mean_attention_distance_renorm"], renorm)

    (logits_lens,) = lenses.lenses_of(["attention_logits"])  # reads q and k: beyond the default capture
    first = caches.lens_arrays(request, loaded, image, cap, logits_lens)
    again = caches.lens_arrays(request, loaded, image, cap, logits_lens)
    assert passes == [logits_lens.sites] and again is first  # one pass of its own, once
    own = vit_core.run_with_capture(loaded, caches.full_image(image, loaded.decode_min_side), sites=logits_lens.sites)
    np.testing.assert_array_equal(first["scores"], attention_scores(own.site("blocks.*.attn.q"), own.site("blocks.*.attn.k")))
    arrays, failure = caches.lens_result(request, loaded, image, cap, logits_lens)  # the Lenses tab: <lens>.<key>
    assert failure is None and arrays["attention_logits.scores"] is first["scores"] and len(passes) == 2


def test_the_settings_key_the_entries_and_the_tabs_default_is_the_exports(page):
    request, loaded, image, cap, _ = page
    g = cap.geometry
    ctx = ViewContext(request, loaded, cap, image)
    mean_all = caches.lens_arrays(request, loaded, image, cap, "rollout")["rollout"]  # the defaults: the export's
    assert attention.rollout_map(ctx, "mean", g.num_layers - 1) is mean_all  # the Attention tab's default: one entry
    max_first = attention.rollout_map(ctx, "max", 0)
    np.testing.assert_array_equal(max_first, analyses.attention_rollout(
        cap.pattern, g.num_prefix_tokens, g.grid, fusion="max", last_layer=0, has_class_token=g.has_class_token))
    assert not np.array_equal(max_first, mean_all)
    assert caches.lens_arrays(request, loaded, image, cap, "rollout", last_layer=0, fusion="max")["rollout"] is max_first
    assert len(caches._lens_results.keys()) == 2
    assert not max_first.flags.writeable  # shared by every session
    with pytest.raises(lenses.LensError, match=r"^lens 'rollout' has no setting 'head' \(its settings: fusion, last_layer\)\.$"):
        caches.lens_arrays(request, loaded, image, cap, "rollout", head=2)


def test_a_failure_is_kept_as_its_sentence_and_the_store_is_bounded_by_bytes(page, monkeypatch):
    request, loaded, image, cap, _ = page
    calls = []

    def broken(cap):
        calls.append(1)
        raise ValueError("nothing to see")

    one = lenses.Lens("broken", (), broken, source="test")
    assert caches.lens_result(request, loaded, image, cap, one) == ({}, "lens 'broken' failed: ValueError: nothing to see")
    with pytest.raises(lenses.LensError, match=r"^lens 'broken' failed: ValueError: nothing to see$"):
        caches.lens_arrays(request, loaded, image, cap, one)
    assert calls == [1]  # computed once, its sentence kept

    small = ByteBudgetCache(2 * caches.LENS_ENTRY_BYTES, size_of=caches._lens_nbytes)  # room for two small entries
    monkeypatch.setattr(caches, "_lens_results", small)
    for last in range(cap.geometry.num_layers):
        for fusion in ("mean", "max"):
            caches.lens_arrays(request, loaded, image, cap, "rollout", fusion=fusion, last_layer=last)
    assert len(small.keys()) == 2 and small.total_bytes <= small.max_bytes
