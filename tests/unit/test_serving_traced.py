"""The server's traced capture forward (`set_traced_forward`): the same numbers as the eager hooked forward, bit
for bit, for every model family; a model it can't record, or records wrongly, stays eager; passes at once stay
exact; the forward lanes run at a lower CPU priority; nothing of the model stays behind."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import torch

from conftest import FAMILY, drawn_image, hooks_on
from unit.test_serving_passes import arrive_together, assert_restored
from vit_core import load_model, recording_hooks_on, run_with_capture, serving, settings
from vit_core.serving import capture as serving_capture
from vit_core.serving import configure_traced_forward, serve_capture
from vit_core.serving import traced as tracing
from vit_core.sites import SiteError

TRACED_FORWARD_ENV = settings.TRACED_FORWARD.name

FIELDS = ("input_image", "input_tensor", "patch_embeddings", "tokens", "pattern", "final_tokens", "pre_logits", "logits")


@pytest.fixture
def traced():
    serving.set_traced_forward(True)
    yield
    serving.set_traced_forward(False)


def fresh_tiny():
    """A model of its own (the session's `tiny` may already have a trace, or a refusal, recorded)."""
    return load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2)


def eager_capture(loaded, image):
    """The library's capture: eager, whatever the server's setting."""
    return run_with_capture(loaded, image)


def assert_same_capture(got, expected):
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), err_msg=field)


@pytest.mark.parametrize("key", list(FAMILY))
def test_the_traced_forward_gives_the_eager_numbers_bit_for_bit(family, key, traced):
    loaded = family[key]
    images = [drawn_image(seed) for seed in (1, 2)]
    eager = [eager_capture(loaded, im) for im in images]
    for im, expected in zip(images, eager, strict=True):  # the first pass records the trace, the second only runs it
        assert_same_capture(serve_capture(loaded, im), expected)
    assert tracing._tracing.traced.get(loaded.model) is not None, "recorded, and kept"
    assert_restored(loaded)


def test_a_model_the_tracer_cant_record_stays_eager(traced, monkeypatch, image):
    loaded = fresh_tiny()
    expected = eager_capture(loaded, image)

    def refuse(*args, **kwargs):
        raise RuntimeError("this model has Python control flow the tracer can't follow")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    assert_same_capture(serve_capture(loaded, image), expected)
    assert tracing._tracing.traced[loaded.model] is None  # not asked again on the next pass
    assert_same_capture(serve_capture(loaded, image), expected)
    assert_restored(loaded)


def test_a_trace_whose_numbers_differ_from_the_eager_forward_is_not_used(traced, monkeypatch, image):
    loaded = fresh_tiny()
    expected = eager_capture(loaded, image)
    real_trace = torch.jit.trace

    def off_by_a_little(module, x, **kwargs):  # a real trace, whose logits come out a little off
        graph = real_trace(module, x, **kwargs)
        return lambda x: (graph(x)[0] * (1 + 1e-6), *graph(x)[1:])

    monkeypatch.setattr(torch.jit, "trace", off_by_a_little)
    assert_same_capture(serve_capture(loaded, image), expected)
    assert tracing._tracing.traced[loaded.model] is None


def test_a_pass_on_a_model_that_carries_someone_elses_hook_runs_eager(traced, monkeypatch, image):
    """A trace would skip a hook registered on the model outside the capture (a probe of one's own)."""
    loaded = fresh_tiny()
    serve_capture(loaded, image)  # records the trace
    lanes = []
    real_on_a_lane = serving_capture.on_a_lane
    monkeypatch.setattr(serving_capture, "on_a_lane", lambda traced, x: lanes.append(1) or real_on_a_lane(traced, x))
    seen = []
    handle = loaded.model.head.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    try:
        with_probe = serve_capture(loaded, image)
    finally:
        handle.remove()
    assert len(seen) == 1 and lanes == []  # eager: the probe saw the forward
    assert_same_capture(serve_capture(loaded, image), with_probe)
    assert lanes == [1]  # without it, traced again
    assert_restored(loaded)


def test_two_traced_passes_at_once_each_get_exactly_their_own(traced, image):
    loaded = fresh_tiny()
    images = [drawn_image(seed) for seed in (7, 8, 9)]
    alone = [eager_capture(loaded, im) for im in images]
    serve_capture(loaded, image)  # records the trace
    serving.set_parallel_passes(2, threads=2)
    try:
        results, errors = arrive_together(loaded, lambda i: serve_capture(loaded, images[i]), len(images))
    finally:
        serving.set_parallel_passes(1)
    assert not errors, errors
    for i, expected in enumerate(alone):
        assert_same_capture(results[i], expected)
    assert_restored(loaded)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is a Linux feature")
def test_forward_lanes_run_at_a_lower_cpu_priority_than_the_threads_that_answer_pages():
    def own_niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    here = own_niceness()
    lane = tracing._forward_lanes().submit(own_niceness).result()
    assert lane == min(19, here + serving.FORWARD_LANE_NICENESS) and lane > here
    assert own_niceness() == here  # the threads that answer pages keep theirs


def test_the_trace_keeps_no_hooks_and_no_model_alive(traced, image):
    loaded = fresh_tiny()
    serve_capture(loaded, image)
    model = loaded.model
    assert tracing._tracing.traced.get(model) is not None
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0
    gone = weakref.ref(model)
    del loaded, model
    gc.collect()
    assert gone() is None, "the trace cache must not keep an evicted model (and its weights) alive"


def test_the_server_turns_it_on_and_an_environment_variable_turns_it_off(monkeypatch):
    monkeypatch.delenv(TRACED_FORWARD_ENV, raising=False)
    try:
        assert configure_traced_forward() is True and serving.traced_forward_enabled()
        for off in ("0", "off"):  # as the other server settings (VIT_LENS_WEIGHTS_UPLOADS=off)
            serving.set_traced_forward(True)
            monkeypatch.setenv(TRACED_FORWARD_ENV, off)
            assert configure_traced_forward() is False and not serving.traced_forward_enabled()
    finally:
        serving.set_traced_forward(False)
    code = ("from dashboard.server import process; from vit_core import serving; "
            "process.prepare_process(); print(serving.traced_forward_enabled())")
    env = {k: v for k, v in os.environ.items() if k != TRACED_FORWARD_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split()[-1] == "True"  # the library default stays eager; the server process traces
    assert tracing._tracing.enabled is False


QK = ["blocks.*.attn.q", "blocks.*.attn.k"]


def test_a_trace_takes_named_sites_and_gives_the_eager_captures_bits(traced):
    """"The server needs q.k" is a name: a trace per set of sites, each the library's numbers bit for bit."""
    loaded = fresh_tiny()
    image = drawn_image(4)
    for sites in (QK, ["blocks.1.mlp.hidden", "blocks.0.attn.hook_v", "blocks.*.attn.out"], QK):  # QK's trace reused
        expected = run_with_capture(loaded, image, sites=sites)
        got = serve_capture(loaded, image, sites=sites)
        assert_same_capture(got, expected)
        assert got.sites.keys() == expected.sites.keys() != set()
        for name in sites:
            np.testing.assert_array_equal(got.site(name), expected.site(name), err_msg=name)
    held = tracing._tracing.with_sites[loaded.model]
    assert len(held) == 2 and all(one is not None and one.sites for one in held.values())
    assert tracing._tracing.traced.get(loaded.model) is None, "the default capture's trace is its own"
    assert_same_capture(serve_capture(loaded, image), run_with_capture(loaded, image))
    assert tracing._tracing.traced[loaded.model].sites == ()
    assert recording_hooks_on(loaded.model) == 0 and hooks_on(loaded.model) == 0


def test_named_sites_without_a_trace_are_the_librarys_capture(image):
    loaded = fresh_tiny()  # tracing off: the eager pass with the sites' hooks, alone
    expected = run_with_capture(loaded, image, sites=QK)
    got = serve_capture(loaded, image, sites=QK)
    assert_same_capture(got, expected)
    np.testing.assert_array_equal(got.site("blocks.*.attn.q"), expected.site("blocks.*.attn.q"))
    with pytest.raises(SiteError, match=r"^no site 'blocks.7.attn.q' on this model: it has 2 blocks"):
        serve_capture(loaded, image, sites=["blocks.7.attn.q"])
