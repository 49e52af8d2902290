"""Background work below the foreground (vit_core.serving.background): a waiting foreground forward gets the shared
model before waiting background work and between two of its slices, background work stops when told to, and it
computes the same bits as the foreground; a notebook's model and passes carry none of it. The class-wide effect (one
student judging, the others' new images): tools/loadtest --attacker --attack judge."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

import vit_core
from vit_core import explain
from vit_core.explain.passes import forwards_on_lanes, model_input
from vit_core.runtime import torch_threads
from vit_core.serving.background import ForegroundFirstLock, WorkStopped, background_work, shared_model


@pytest.fixture(scope="module")
def shared(tiny):
    """The tiny model as the class server shares it (dashboard.models.build_model: `shared_model`)."""
    return shared_model(tiny)


def test_a_waiting_foreground_acquire_goes_before_a_waiting_background_one():
    lock = ForegroundFirstLock()
    order: list[str] = []
    lock.acquire()  # held by this thread
    background_in, foreground_in = threading.Event(), threading.Event()

    def background() -> None:
        with background_work(), lock:
            order.append("background")
            background_in.set()

    def foreground() -> None:
        with lock:
            order.append("foreground")
            foreground_in.set()

    b = threading.Thread(target=background, daemon=True)
    b.start()
    time.sleep(0.1)  # the background acquire waits first
    f = threading.Thread(target=foreground, daemon=True)
    f.start()
    deadline = time.monotonic() + 5
    while not lock.foreground_waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    lock.release()
    b.join(5), f.join(5)
    assert order == ["foreground", "background"]


def test_background_work_waits_for_a_quiet_moment_after_the_foreground(monkeypatch):
    """A class's new images come in bursts: background work takes the model only after FOREGROUND_GRACE_S without a
    foreground holder, so that a slice doesn't land between two images of a burst. Told apart by the grace's size, not
    by tight timings: with a 60 s grace, what must not wait returns long before it; with 0.3 s, what must wait does."""
    from vit_core.serving import background

    monkeypatch.setattr(background, "FOREGROUND_GRACE_S", 60.0)
    lock = ForegroundFirstLock()
    with background_work():
        started = time.monotonic()
        with lock:  # nobody in the foreground yet: at once
            pass
        with lock:  # a background release starts no grace
            pass
        assert time.monotonic() - started < 30
    monkeypatch.setattr(background, "FOREGROUND_GRACE_S", 0.3)
    with lock:  # a foreground holder
        pass
    with background_work():
        started = time.monotonic()
        with lock:
            waited = time.monotonic() - started
    assert waited >= 0.25


def test_background_work_that_is_told_to_stop_stops_while_waiting():
    lock = ForegroundFirstLock()
    lock.acquire()
    stop = threading.Event()
    raised: list[BaseException] = []

    def background() -> None:
        try:
            with background_work(stop), lock:
                pass
        except WorkStopped as e:
            raised.append(e)

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    time.sleep(0.1)
    stop.set()
    thread.join(5)
    assert len(raised) == 1 and not thread.is_alive()
    lock.release()
    with lock:  # the lock is still whole
        assert lock.locked()
    assert not lock.locked()


def test_a_foreground_forward_waits_for_one_slice_of_background_forwards_not_for_all(shared, image):
    """20 slow forwards in the background: a foreground forward asked for during the first one gets the model
    after that slice (a few forwards), long before the 20 are done."""
    x = model_input(shared, image)
    lanes = explain.forward_lanes(shared, 20)
    started, finished = threading.Event(), []

    asked = threading.Event()  # the foreground forward got the model

    def slow(_: int) -> float:
        started.set()
        deadline = time.monotonic() + 30
        while not (asked.is_set() or shared.lock.foreground_waiting()) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first slice lasts until the foreground asks, however late a busy machine lets it
        time.sleep(0.1)
        return 0.0

    def background() -> None:
        with background_work():
            forwards_on_lanes(shared, slow, list(range(20)), done=lambda i, r: finished.append(time.monotonic()))

    thread = threading.Thread(target=background, daemon=True)
    thread.start()
    started.wait(5)
    with shared.lock:
        got_it = time.monotonic()
        asked.set()
        with torch.inference_mode():
            shared.model(x)
    thread.join(30)
    assert len(finished) == 20
    before = sum(t < got_it for t in finished)
    assert before <= lanes, f"the foreground forward waited for {before} background forwards (one slice is {lanes})"


def test_stopped_background_forwards_raise_and_leave_the_model_free(shared):
    stop = threading.Event()
    seen: list[int] = []

    def forward(i: int) -> int:
        if i == 2:
            stop.set()
        return i

    with pytest.raises(WorkStopped), background_work(stop):
        forwards_on_lanes(shared, forward, list(range(40)), done=lambda i, r: seen.append(r))
    assert len(seen) < 40 and not shared.lock.locked()


def test_the_judge_in_the_background_gives_the_foregrounds_bits(tiny, shared, image):
    """The server's judge (the shared model, in slices, behind its foreground-first lock) and a notebook's (the plain
    model, its lock held once): the same bits."""
    cap = vit_core.run_with_capture(tiny, image)
    relevance = explain.relevance_maps(tiny, cap, methods=("rollout", "raw_attention"))
    tests = ("deletion_auc", "insertion_auc", "pixel_deletion_auc")
    with torch_threads(2):
        ahead = explain.judge(tiny, cap, relevance.maps, relevance.target, steps=4, tests=tests)
        with background_work():
            behind = explain.judge(shared, cap, relevance.maps, relevance.target, steps=4, tests=tests)
    for test in ahead.results:
        for method in ahead.methods:
            assert ahead.results[test].values[method] == behind.results[test].values[method], (test, method)
        assert ahead.results[test].random_mean == behind.results[test].random_mean


def test_a_sessions_second_job_stops_its_first_and_a_disconnect_stops_the_second(shared):
    """dashboard.server.jobs: one explanation job per session (a second click, or a rerun that left the first run
    going on, replaces it), and none after the session's browser went away."""
    from dashboard.server import jobs

    outcomes: dict[str, str] = {}
    running = {name: threading.Event() for name in ("first", "second")}

    def job(name: str) -> None:
        def forward(_: int) -> None:
            running[name].set()
            time.sleep(0.05)

        try:
            with jobs.session_job("session-a"):
                forwards_on_lanes(shared, forward, list(range(400)))
            outcomes[name] = "finished"
        except WorkStopped:
            outcomes[name] = "stopped"

    first = threading.Thread(target=job, args=("first",), daemon=True)
    first.start()
    running["first"].wait(5)
    second = threading.Thread(target=job, args=("second",), daemon=True)
    second.start()
    first.join(10)
    running["second"].wait(5)
    assert jobs.stop_session_job("session-a")
    second.join(10)
    assert outcomes == {"first": "stopped", "second": "stopped"}
    assert jobs.running_jobs() == 0 and not shared.lock.locked()


def test_a_stopped_job_stops_the_sanity_checks_between_two_stages(shared, image):
    """The cascade runs on a private copy with a plain lock of its own: the job's stop reaches it through the
    library's hook, before the next stage."""
    stop, calls = threading.Event(), []

    def explain_maps(loaded, im, target):
        calls.append(loaded is shared)
        if len(calls) == 2:  # the first stage's maps
            stop.set()
        return {"norms": explain.token_norms(vit_core.run_with_capture(loaded, im))[1, 1:]}

    with pytest.raises(WorkStopped), background_work(stop):
        explain.cascading_randomisation(shared, image, 3, explain_maps, seed=5)
    assert calls == [True, False] and not shared.lock.locked()


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="threads have nice values of their own on Linux only")
def test_a_jobs_lanes_sit_below_the_forward_lanes_as_its_thread_does(shared):
    """The library's lanes are started by the job's thread and inherit its priority: a session's job (on a script
    thread, never the main one) runs its forwards at EXPLANATION_NICENESS below the process, as it did when the lanes
    were lowered by the library."""
    from dashboard.server import jobs

    process = os.getpriority(os.PRIO_PROCESS, os.getpid())
    seen: list[int] = []

    def a_script_run() -> None:
        with torch_threads(2), jobs.session_job("session-nice"):
            forwards_on_lanes(shared, lambda _: seen.append(_nice_of_this_thread()), list(range(6)))

    thread = threading.Thread(target=a_script_run)  # lowered for good: a thread of its own, as Streamlit's runs are
    thread.start()
    thread.join(30)
    assert len(seen) == 6 and set(seen) == {min(19, process + jobs.EXPLANATION_NICENESS)}
    assert _nice_of_this_thread() == process


def test_the_dashboards_models_are_shared_models(tiny_env):
    """The dashboard's model cache builds each model with the server's lock; the library's own stays plain."""
    from dashboard import models

    loaded = models.build_model(models.TEST_TINY, "", "", False)
    assert isinstance(loaded.lock, ForegroundFirstLock)
    assert not isinstance(models.build_named_model(models.TEST_TINY).lock, ForegroundFirstLock)

