"""Explanation jobs of the sessions (the Why? tab's Judge and sanity checks, a Many images run): one per session, below
the class's new images, stopped when the session goes. No Streamlit here: sessions are named by their id.

Inside `session_job` the work is `vit_core.serving.background` work: it takes the shared model in slices and lets a
new image's forward in first, the script thread that runs it (and so the lanes that thread starts) sits below the
forward lanes, and it ends
with WorkStopped at its next slice once it is stopped: when the same session starts another job (a second click, a
rerun that left the old run going on) or when the session's browser disconnects (`stop_session_job`, called by
streamlit_internals' disconnect hook).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from vit_core.serving import background_work, lower_this_threads_priority

# Below the forward lanes (vit_core.serving.FORWARD_LANE_NICENESS = 10), with the downloads: nobody's next picture
# waits for a judge.
EXPLANATION_NICENESS = 15

_jobs: dict[str, threading.Event] = {}  # session id -> the stop event of its job running now
_jobs_lock = threading.Lock()


@contextlib.contextmanager
def session_job(session_id: str | None) -> Iterator[None]:
    """The block as `session_id`'s one explanation job (see above); a job of the same session still running is
    stopped. `session_id` None (no server: a test's script, the CLI): background work with nothing to stop it."""
    stop = threading.Event()
    if session_id is not None:
        with _jobs_lock:
            previous = _jobs.get(session_id)
            if previous is not None:
                previous.set()
            _jobs[session_id] = stop
    # The job's lanes inherit this thread's priority (explain.forwards_on_lanes); never the main thread's, which
    # every thread it starts would inherit.
    if threading.current_thread() is not threading.main_thread():
        lower_this_threads_priority(EXPLANATION_NICENESS)
    try:
        with background_work(stop):
            yield
    finally:
        if session_id is not None:
            with _jobs_lock:
                if _jobs.get(session_id) is stop:
                    del _jobs[session_id]


def stop_session_job(session_id: str) -> bool:
    """Stop `session_id`'s job, if one runs; returns whether one did."""
    with _jobs_lock:
        stop = _jobs.pop(session_id, None)
    if stop is not None:
        stop.set()
    return stop is not None


def running_jobs() -> int:
    with _jobs_lock:
        return len(_jobs)
