"""Capture passes at once (`set_parallel_passes`): each records only its own forward, exactly; the shared hooks,
flags, mode, lock and thread counts come back afterwards, also when one of the passes raises."""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest
import torch

from conftest import drawn_image, hooks_on
from vit_core import recording_hooks_on, run_with_capture, serving, settings
from vit_core.serving import configure_parallel_passes, serve_capture
from vit_core.serving import passes as pass_groups

PARALLEL_PASSES_ENV = settings.PARALLEL_PASSES.name


@pytest.fixture
def two_at_once():
    serving.set_parallel_passes(2, threads=2)
    yield
    serving.set_parallel_passes(1)


def patch_mlp(model, inside):
    """Call `inside()` in blocks[1]'s MLP, in the middle of every forward; returns the undo."""
    mlp = model.blocks[1].mlp
    original = mlp.forward

    def forward(self, x):
        inside()
        return original(x)

    mlp.forward = types.MethodType(forward, mlp)
    return lambda: mlp.__dict__.pop("forward")


def arrive_together(loaded, work, count):
    """Run `work(i)` in `count` threads that all wait for the model while the lock is held (as by an
    explanation pass), so the first pass to get it finds the others waiting; returns (results, errors)."""
    results, errors = {}, []

    def run(i):
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    with loaded.lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # one opening the group (blocked on the lock), the others waiting
            group = pass_groups._groups.get(loaded.model)
            if group is not None and group.opening and group.waiting == count - 1:
                break
            time.sleep(0.01)
    for t in threads:
        t.join(timeout=60)
    return results, errors


def assert_restored(loaded):
    model = loaded.model
    assert hooks_on(model) == 0 and recording_hooks_on(model) == 0
    assert all(blk.attn.fused_attn for blk in model.blocks)
    assert not loaded.lock.locked()


def test_two_passes_run_at_once_each_recording_exactly_its_own(tiny, two_at_once):
    images = [drawn_image(seed) for seed in (3, 4)]
    alone = [run_with_capture(tiny, im) for im in images]
    both_inside = threading.Barrier(2, timeout=20)  # passes run one at a time: the first waits here in vain
    seen = []

    def inside():
        seen.append((torch.get_num_threads(), tiny.lock.locked()))
        both_inside.wait()

    threads_before = torch.get_num_threads()
    undo = patch_mlp(tiny.model, inside)
    try:
        results, errors = arrive_together(tiny, lambda i: serve_capture(tiny, images[i]), 2)
    finally:
        undo()
    assert not errors, errors
    assert seen == [(1, True), (1, True)]  # narrow (2 threads // 2 passes), under the one hold of the model's lock
    for i, expected in enumerate(alone):
        for field in ("pattern", "tokens", "patch_embeddings", "final_tokens", "pre_logits", "logits", "input_image"):
            np.testing.assert_array_equal(getattr(results[i], field), getattr(expected, field), err_msg=field)
    assert not np.array_equal(results[0].logits, results[1].logits)
    assert_restored(tiny)
    assert torch.get_num_threads() == threads_before


def test_a_pass_that_finds_nobody_waiting_runs_with_every_thread(tiny, image, two_at_once):
    seen = []
    undo = patch_mlp(tiny.model, lambda: seen.append(torch.get_num_threads()))
    try:
        serve_capture(tiny, image)
    finally:
        undo()
    assert seen == [torch.get_num_threads()] == [2]
    assert_restored(tiny)


def test_one_of_two_passes_raising_leaves_the_other_exact_and_the_model_clean(tiny, two_at_once):
    images = [drawn_image(seed) for seed in (5, 6)]
    expected = run_with_capture(tiny, images[1])
    both_inside = threading.Barrier(2, timeout=20)
    tiny.model.train()  # the caller's mode comes back

    def inside():
        both_inside.wait()
        if threading.current_thread().name == "boom":
            raise RuntimeError("boom")

    def work(i):
        threading.current_thread().name = "boom" if i == 0 else "fine"
        return serve_capture(tiny, images[i])

    undo = patch_mlp(tiny.model, inside)
    try:
        results, errors = arrive_together(tiny, work, 2)
    finally:
        undo()
    assert [(i, str(e)) for i, e in errors] == [(0, "boom")]
    np.testing.assert_array_equal(results[1].pattern, expected.pattern)
    np.testing.assert_array_equal(results[1].logits, expected.logits)
    assert tiny.model.training
    tiny.model.eval()
    assert_restored(tiny)


def test_more_passes_than_lanes_all_come_back_exact(tiny, two_at_once):
    images = [drawn_image(seed) for seed in range(6)]
    alone = [run_with_capture(tiny, im) for im in images]
    results, errors = arrive_together(tiny, lambda i: serve_capture(tiny, images[i]), len(images))
    assert not errors, errors
    for i, expected in enumerate(alone):
        np.testing.assert_array_equal(results[i].pattern, expected.pattern)
        np.testing.assert_array_equal(results[i].tokens, expected.tokens)
    assert_restored(tiny)


def test_a_forward_of_another_thread_records_nothing_into_a_pass(tiny, image, two_at_once):
    """The shared hooks hand tensors only to the pass of the thread that runs the forward."""
    other_thread_ran = threading.Event()

    def plain_forward_elsewhere():  # what a forward outside any capture would be (the lock is the group's)
        with torch.inference_mode():
            tiny.model(torch.zeros(1, 3, 224, 224))
        other_thread_ran.set()

    def inside():
        if not other_thread_ran.is_set() and threading.current_thread().name != "elsewhere":
            t = threading.Thread(target=plain_forward_elsewhere, name="elsewhere")
            t.start()
            t.join(timeout=20)

    undo = patch_mlp(tiny.model, inside)
    try:
        cap = serve_capture(tiny, image)  # would raise CaptureError on 2 patterns per block
    finally:
        undo()
    assert other_thread_ran.is_set()
    assert cap.pattern.shape[0] == tiny.geometry.num_layers
    np.testing.assert_array_equal(cap.logits, run_with_capture(tiny, image).logits)
    assert_restored(tiny)


def test_the_server_runs_as_many_passes_at_once_as_threads_at_most_four(monkeypatch):
    monkeypatch.delenv(PARALLEL_PASSES_ENV, raising=False)
    try:
        assert configure_parallel_passes(2) == serving.parallel_passes() == 2
        assert pass_groups._parallel.narrow_threads == 1
        assert configure_parallel_passes(16) == 4 and pass_groups._parallel.narrow_threads == 4
        monkeypatch.setenv(PARALLEL_PASSES_ENV, "1")  # one at a time, with every thread
        assert configure_parallel_passes(2) == serving.parallel_passes() == 1
    finally:
        serving.set_parallel_passes(1)
    with pytest.raises(ValueError):
        serving.set_parallel_passes(0)


def queue_up(loaded, work, names):
    """Start one thread per name, each only once the one before is waiting for the model (whose lock is held,
    as by an explanation pass), then let them go; returns (results by name, errors by name)."""
    results, errors = {}, {}

    def run(name):
        try:
            results[name] = work(name)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[name] = e

    threads = []
    group = pass_groups._groups.setdefault(loaded.model, pass_groups._PassGroup())
    with loaded.lock:
        for name in names:
            tickets = group.tickets
            threads.append(threading.Thread(target=run, args=(name,), name=name))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while group.tickets == tickets and time.monotonic() < deadline:  # until it is in the queue
                time.sleep(0.005)
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a pass never got its turn"
    return results, errors


@pytest.mark.parametrize("passes", [1, 2])
def test_passes_get_in_in_the_order_they_came(tiny, image, passes, monkeypatch):
    serving.set_parallel_passes(passes, threads=2)
    admitted, order = [], []
    next_in_line = pass_groups._PassGroup._next_in_line

    def recording(group):  # called under the group's condition by each pass as it is let in (nothing abandons here)
        admitted.append(threading.current_thread().name)
        next_in_line(group)

    monkeypatch.setattr(pass_groups._PassGroup, "_next_in_line", recording)
    undo = patch_mlp(tiny.model, lambda: order.append(threading.current_thread().name))
    try:
        names = [f"pass{i}" for i in range(8)]
        results, errors = queue_up(tiny, lambda name: serve_capture(tiny, image), names)
    finally:
        undo()
        serving.set_parallel_passes(1)
    assert not errors and sorted(results) == sorted(names)
    assert admitted == names  # let in strictly in the order they queued, one lane or two
    if passes == 1:
        assert order == names  # one at a time: their forwards ran in that order too
    # two at a time, the forwards of neighbours may interleave in any order (a lane frees when either ends)
    assert_restored(tiny)


def test_a_pass_that_stops_waiting_does_not_hold_up_the_ones_behind_it(tiny, image, two_at_once, monkeypatch):
    group = pass_groups._groups.setdefault(tiny.model, pass_groups._PassGroup())
    wait = group.cond.wait

    def impatient_wait(*args, **kwargs):
        if threading.current_thread().name == "impatient":
            raise KeyboardInterrupt
        return wait(*args, **kwargs)

    monkeypatch.setattr(group.cond, "wait", impatient_wait)
    results, errors = queue_up(tiny, lambda name: serve_capture(tiny, image), ["first", "impatient", "third"])
    assert set(results) == {"first", "third"} and isinstance(errors["impatient"], KeyboardInterrupt)
    assert group.serving == group.tickets and not group.abandoned
    assert_restored(tiny)


def test_a_free_lane_is_taken_while_the_other_pass_still_runs(tiny, image, two_at_once):
    """Three passes, two lanes: the third starts as soon as the first ends, not when both of the first two have."""
    third_started = threading.Event()
    second_saw_the_third = []

    def inside():
        name = threading.current_thread().name
        if name == "second":
            second_saw_the_third.append(third_started.wait(timeout=20))
        elif name == "third":
            third_started.set()

    undo = patch_mlp(tiny.model, inside)
    try:
        results, errors = queue_up(tiny, lambda name: serve_capture(tiny, image), ["first", "second", "third"])
    finally:
        undo()
    assert not errors and set(results) == {"first", "second", "third"}
    assert second_saw_the_third == [True]
    assert_restored(tiny)
