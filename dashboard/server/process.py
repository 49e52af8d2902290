"""Once per server process: torch's thread count, the garbage collector's view of the long-lived heap, and the
priorities of the threads that make new images' figures and downloads.

No Streamlit here: `dashboard.server.serve` calls these before Streamlit starts, the app script on every run
(each does its work once). How long Streamlit keeps a made download is `streamlit_internals`' business.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import gc
import threading
from typing import Callable, Iterator, TypeVar

from vit_core.runtime import configure_threads, cpu_quota
from vit_core.serving import (
    FORWARD_LANE_NICENESS,
    SERVER_SWITCH_INTERVAL,
    TRACED_SERVER_SWITCH_INTERVAL,
    configure_parallel_passes,
    configure_switch_interval,
    configure_traced_forward,
    lower_this_threads_priority,
)
from vit_core.serving.priority import EXPORT_LANE_NAME, become_a_lane

T = TypeVar("T")


@functools.cache
def import_what_sessions_share() -> None:
    """Once per process, before any session runs: the modules that would otherwise be imported lazily in one
    session's thread while others use them. Streamlit imports pandas at the first render of the Draw canvas (a
    custom component with data: it looks for data frames), and meanwhile plotly, in other sessions' threads, takes
    the half-imported module from sys.modules and fails on `pd.Series` (tracebacks in other students' views, found
    by the load test's attacker, who turns Draw on mid-class)."""
    import pandas  # noqa: F401


@functools.cache
def configure_torch_threads() -> int:
    """Size torch's thread pool from the container's CPU quota, once (the pool is process-wide), let as many
    sessions' forward passes run at once, each on its share of the threads (vit_core.serving.configure_parallel_passes),
    run the capture forward traced where it can, and hand the GIL over more often than Python's 5 ms: every 0.5 ms
    for eager forwards, which need it between operations; every 2 ms for traced ones, which don't
    (vit_core.serving.configure_switch_interval)."""
    threads = configure_threads()
    configure_parallel_passes(threads)
    traced = configure_traced_forward()
    configure_switch_interval(TRACED_SERVER_SWITCH_INTERVAL if traced else SERVER_SWITCH_INTERVAL)
    return threads


_heap_frozen = False


def freeze_long_lived_heap() -> None:
    """Once per process, after the first full page: hide everything alive from the cyclic garbage collector.

    With torch, timm, plotly and matplotlib imported a full collection walks about half a million objects, a
    quarter of a second on a small machine (docs/performance.md, "The event loop"), and
    Python's own full collections (and Streamlit's ``runner.postScriptGC``, off in the shipped config) walk them
    all. Those objects live as long as the server; ``gc.freeze`` moves them to a generation the collector skips.
    Reference counting still frees them as usual; only reference cycles alive right now would never be collected.
    """
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


# A run that has just made a new image's capture (a forward pass, then that image's figures) finishes below the runs
# that answer control changes, so that a burst of new images' figures doesn't take the cores from students moving a
# slider (docs/performance.md, "New images' figures in turn"). Streamlit runs each session's runs on a thread of their
# own, which ends when the session has no rerun waiting; lowered, it stays lowered for the reruns it takes on (an
# unprivileged process can't raise a thread's priority again), and the session's next run starts on a new thread at the
# pages'.
NEW_IMAGE_RUN_NICENESS = FORWARD_LANE_NICENESS


def finish_this_run_below_the_pages() -> None:
    """Called by a script run that made a new capture: the rest of it at NEW_IMAGE_RUN_NICENESS (Linux; see above),
    its figures in turn (`new_image_figures_in_turn`). Never lowers the main thread, whose priority every thread it
    starts would inherit."""
    if threading.current_thread() is not threading.main_thread():
        lower_this_threads_priority(NEW_IMAGE_RUN_NICENESS)
    _this_thread.made_a_capture = True


# New images' figures drawn at once share the cores among themselves, and each student waits for all of them. Drawn
# one run at a time, the first student's page is done before the second's starts, and the students who have theirs
# find the cores freer for their control changes (docs/performance.md, "New images' figures in turn").
# A run waits at most NEW_IMAGE_TURN_WAIT_S for its turn, so a long one (the Why? tab's
# relevance passes on a new image) delays the others by that much, not by all of it.
NEW_IMAGE_TURN_WAIT_S = 2.0
_new_image_turn = threading.BoundedSemaphore(1)
_this_thread = threading.local()  # Streamlit runs a session's script runs on a thread of their own


@contextlib.contextmanager
def new_image_figures_in_turn() -> Iterator[None]:
    """Around a page's figures: if this run made a new capture (`finish_this_run_below_the_pages` since the last
    call on this thread), they are drawn when no other such run is drawing, or after NEW_IMAGE_TURN_WAIT_S.
    A run that found its capture cached (a control change, a tab switch) never waits."""
    made_a_capture = getattr(_this_thread, "made_a_capture", False)
    _this_thread.made_a_capture = False
    took_the_turn = made_a_capture and _new_image_turn.acquire(timeout=NEW_IMAGE_TURN_WAIT_S)
    try:
        yield
    finally:
        if took_the_turn:
            _new_image_turn.release()


# A download made on click (the `.npz` exports: tens of MB of arrays) is on no one's way to a picture, yet Streamlit
# makes it on a thread at the pages' priority, above the forward lanes that every new image waits for (vit_core.serving,
# FORWARD_LANE_NICENESS = 10). Made on these lanes instead, below both, a class's downloads take the cores the pages and
# forwards leave (docs/performance.md, "Lanes below the pages").
DOWNLOAD_LANE_NICENESS = 15


@functools.cache
def _download_lanes() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=cpu_quota(), thread_name_prefix=EXPORT_LANE_NAME,
    initializer=become_a_lane, initargs=(EXPORT_LANE_NAME, DOWNLOAD_LANE_NICENESS))


def made_at_low_priority(make: Callable[[], T]) -> Callable[[], T]:
    """`make` for a download button's `data`: when Streamlit calls it (on click), it runs on a download lane, below
    the priority of the pages and of the forward passes, and its result or exception comes back to the caller."""

    def on_a_download_lane() -> T:
        return _download_lanes().submit(contextvars.copy_context().run, make).result()

    return on_a_download_lane
