"""The server wing's one door: `prepare_process` sets the process up for serving, once; `serving` wraps a script run
in it; `new_image_turn` schedules a run that made a new capture below the others; `explanation_job` runs a student's
explanation work below the class's new images; `low_priority` makes a download below the pages, `low_priority_worker`
work made ahead of need.

No Streamlit imported here at import time: `dashboard.serve` calls `prepare_process` before Streamlit starts, the app
script `serving` on every run (the preparation happens once). How long Streamlit keeps a made download is
`streamlit_internals`' business, asked from here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import gc
import threading
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

from dashboard.server import jobs
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

if TYPE_CHECKING:
    from dashboard.server.uploads import UploadLimits

T = TypeVar("T")


@functools.cache
def prepare_process(upload_limits: Callable[[], UploadLimits] | None = None) -> None:
    """Once per process, before any session runs: the modules that sessions share imported, torch's threads and the
    forwards' scheduling set from the CPU quota, made downloads kept on their shelf for a while, and, given the app's
    `upload_limits` (dashboard.upload_limits, made above the server wing), every upload held to them
    (streamlit_internals.install_upload_budget), and the pages served with the server's base set, so that a page such
    as /lesson asks no 404s (streamlit_internals.serve_pages_with_backend_base: from the server's start only). The
    server's start calls it before Streamlit starts; `streamlit run
    dashboard/app.py` gets it from the app's first run, with the same limits."""
    _import_shared_modules()
    _configure_forwards()
    from dashboard.server import streamlit_internals  # imports Streamlit: this module stays free of it until now

    streamlit_internals.shelve_made_downloads()
    streamlit_internals.install_disconnect_hook()
    streamlit_internals.serve_pages_with_backend_base()
    if upload_limits is not None:
        streamlit_internals.install_upload_budget(upload_limits())


def _import_shared_modules() -> None:
    """The modules that would otherwise be imported lazily in one session's thread while others use them. Streamlit
    imports pandas at the first render of the Draw canvas (a custom component with data: it looks for data frames),
    and meanwhile plotly, in other sessions' threads, takes the half-imported module from sys.modules and fails on
    `pd.Series` (tracebacks in other students' views, found by the load test's attacker, who turns Draw on
    mid-class)."""
    import pandas  # noqa: F401


def _configure_forwards() -> None:
    """Size torch's thread pool from the container's CPU quota, once (the pool is process-wide), let as many
    sessions' forward passes run at once, each on its share of the threads (vit_core.serving.configure_parallel_passes),
    run the capture forward traced where it can, and hand the GIL over more often than Python's 5 ms: every 0.5 ms
    for eager forwards, which need it between operations; every 2 ms for traced ones, which don't
    (vit_core.serving.configure_switch_interval)."""
    threads = configure_threads()
    configure_parallel_passes(threads)
    traced = configure_traced_forward()
    configure_switch_interval(TRACED_SERVER_SWITCH_INTERVAL if traced else SERVER_SWITCH_INTERVAL)


@contextlib.contextmanager
def serving(upload_limits: Callable[[], UploadLimits] | None = None) -> Iterator[None]:
    """Around a script run of the app: the process prepared first (`prepare_process` with the app's `upload_limits`,
    once), and after the first run that drew its whole page, the long-lived heap frozen (`freeze_long_lived_heap`).
    A run that stops early (a rerun asked for, an exception) freezes nothing."""
    prepare_process(upload_limits)
    from dashboard.server import streamlit_internals

    streamlit_internals.upload_run_started()  # the run's uploaders claim their files; what none claims is dropped
    completed = False
    try:
        yield
        completed = True
    finally:
        streamlit_internals.upload_run_finished(completed)
    freeze_long_lived_heap()  # after the first full page: Streamlit's per-rerun gc.collect gets cheap


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

# New images' figures drawn at once share the cores among themselves, and each student waits for all of them. Drawn
# one run at a time, the first student's page is done before the second's starts, and the students who have theirs
# find the cores freer for their control changes (docs/performance.md, "New images' figures in turn").
# A run waits at most NEW_IMAGE_TURN_WAIT_S for its turn, so a long one (the Why? tab's
# relevance passes on a new image) delays the others by that much, not by all of it.
NEW_IMAGE_TURN_WAIT_S = 2.0


class NewImageTurn:
    """The server's scheduling of script runs that made a new capture: the capture says so (`made_a_capture`), and
    the page draws its figures inside the turn (`with new_image_turn:`). A run that found its capture cached (a
    control change, a tab switch) is neither lowered nor ever waits."""

    def __init__(self) -> None:
        self._turn = threading.BoundedSemaphore(1)
        self._this_thread = threading.local()  # Streamlit runs a session's script runs on a thread of their own

    def made_a_capture(self) -> None:
        """Called by a script run that made a new capture: the rest of it at NEW_IMAGE_RUN_NICENESS (Linux; see
        above), its figures in turn. Never lowers the main thread, whose priority every thread it starts would
        inherit."""
        if threading.current_thread() is not threading.main_thread():
            lower_this_threads_priority(NEW_IMAGE_RUN_NICENESS)
        self._this_thread.made_a_capture = True

    def __enter__(self) -> None:
        """Around a page's figures: if this run made a new capture (`made_a_capture` since the last turn on this
        thread), they are drawn when no other such run is drawing, or after NEW_IMAGE_TURN_WAIT_S."""
        made_a_capture = getattr(self._this_thread, "made_a_capture", False)
        self._this_thread.made_a_capture = False
        self._this_thread.took_the_turn = made_a_capture and self._turn.acquire(timeout=NEW_IMAGE_TURN_WAIT_S)

    def __exit__(self, *exc_info: object) -> None:
        if self._this_thread.took_the_turn:
            self._this_thread.took_the_turn = False
            self._turn.release()


new_image_turn = NewImageTurn()  # one for the process: the turn is shared by every session


@contextlib.contextmanager
def explanation_job() -> Iterator[None]:
    """Around explanation work a student asked for (Judge, the sanity checks, a Many images run): the session's one
    job, below the class's new images, stopped by a newer job of the session or its disconnect (dashboard.server.jobs).
    Raises vit_core.serving.WorkStopped (a ViTLensError) out of the block when stopped."""
    from dashboard.server import streamlit_internals  # imports Streamlit: this module stays free of it until now

    with jobs.session_job(streamlit_internals.current_session_id()):
        yield


# A download made on click (the `.npz` exports: tens of MB of arrays) is on no one's way to a picture, yet Streamlit
# makes it on a thread at the pages' priority, above the forward lanes that every new image waits for (vit_core.serving,
# FORWARD_LANE_NICENESS = 10). Made on these lanes instead, below both, a class's downloads take the cores the pages and
# forwards leave (docs/performance.md, "Lanes below the pages").
DOWNLOAD_LANE_NICENESS = 15


@functools.cache
def _download_lanes() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=cpu_quota(), thread_name_prefix=EXPORT_LANE_NAME,
    initializer=become_a_lane, initargs=(EXPORT_LANE_NAME, DOWNLOAD_LANE_NICENESS))


def low_priority(make: Callable[[], T]) -> Callable[[], T]:
    """`make` for a download button's `data`: when Streamlit calls it (on click), it runs on a download lane, below
    the priority of the pages and of the forward passes, and its result or exception comes back to the caller."""

    def on_a_download_lane() -> T:
        return _download_lanes().submit(contextvars.copy_context().run, make).result()

    return on_a_download_lane


def low_priority_worker(name: str) -> concurrent.futures.ThreadPoolExecutor:
    """One worker thread, named `name`, below the pages (at the forward lanes' priority): for work made ahead of need,
    such as the lesson's next step, which nobody is waiting for yet."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                                 initializer=lower_this_threads_priority,
                                                 initargs=(FORWARD_LANE_NICENESS,))
