"""Work for the next step made ahead, while the student reads this one: step 8 (the prediction) starts step 9's
relevance maps, so that Next finds them made. No Streamlit here: what is made ahead lands in the caches that the
next step reads (dashboard.caches), and the next step only needs to know whether it is still being made.

One low-priority worker for the whole server: in a class, 30 students on step 8 queue 30 jobs; a job still queued
when its student presses Next is cancelled and made by the step itself, so nobody waits behind the others' queue.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any

from dashboard.server import process

AHEAD_THREAD = "vit-lens-lesson-ahead"

_lock = threading.Lock()
_pending: dict[Hashable, concurrent.futures.Future] = {}  # key -> its job, until the job is done


@functools.cache
def _worker() -> concurrent.futures.ThreadPoolExecutor:
    return process.low_priority_worker(AHEAD_THREAD)  # making ahead must not slow anybody's page of now


def _forget(key: Hashable, job: concurrent.futures.Future) -> None:
    with _lock:
        if _pending.get(key) is job:
            del _pending[key]


def start(key: Hashable, make: Callable[[], Any]) -> None:
    """Run `make()` on the worker unless a job for `key` is queued or running already. Its result is not kept here
    (`make` stores it in a cache); an exception it raises is dropped: the step that needs the result makes it again,
    and shows that error."""
    with _lock:
        if key in _pending:
            return
        job = _worker().submit(make)
        _pending[key] = job
    job.add_done_callback(functools.partial(_forget, key))


def running(key: Hashable) -> concurrent.futures.Future | None:
    """The job for `key` if it is running now; None if there is none or it is done. A job still queued is cancelled
    (None): the caller makes the result itself rather than wait for the jobs ahead of it."""
    with _lock:
        job = _pending.get(key)
    if job is None or job.done() or job.cancel():
        return None
    return job


def wait(job: concurrent.futures.Future | None) -> None:
    """Until `job` (from `running`) is done, whatever its outcome."""
    if job is not None:
        concurrent.futures.wait([job])
