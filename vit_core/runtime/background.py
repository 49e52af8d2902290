"""Work nobody is waiting for, below the forwards somebody is: the shared model's lock, and the background context.

On a class server one student's Judge (hundreds of perturbed forwards) or Many images run holds the shared model for
minutes, while the others' new images each need one forward. `ModelLock`, the lock every forward of a LoadedModel
takes, lets a waiting foreground forward in before any waiting background work, and background work (the code inside
`background_work`) takes the lock in slices (`vit_core.explain.passes.forwards_on_lanes`: a few forwards, then the lock
is taken again), and only after a moment without foreground holders (FOREGROUND_GRACE_S), so a new image waits for
one slice at most, not for the whole job. Background work also stops at its next slice once its `stop` event is set
(`WorkStopped`): a newer job of the same session, or the session's end.

Only the order of who holds the lock changes, never what a forward computes: results are the same bits in the
background as in the foreground.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import ViTLensError

# How often a waiting background holder looks at its stop event (seconds): it is set from another thread, with no
# notify on the lock's condition.
STOP_POLL_S = 0.25
# Background work takes the model only once no foreground holder has let it go for this long: a class's new images
# come in bursts, and a slice taken between two of them (a batch of perturbed forwards: seconds on ViT-B/16 at one
# thread per lane) would hold up every image of the burst that follows.
FOREGROUND_GRACE_S = 1.0
STOPPED = "stopped: a newer job of this session, or the session ended"


class WorkStopped(ViTLensError):
    """Background work stopped before its end: its stop event was set (a newer job of its session, or the session's
    end). Nothing it computed so far is kept."""


@dataclass
class Background:
    """The background work running in this context: `stop` ends it at its next slice; `niceness` is how far below
    the process its worker threads run (`lower_this_threads_priority`)."""

    stop: threading.Event = field(default_factory=threading.Event)
    niceness: int = 0


_background: contextvars.ContextVar[Background | None] = contextvars.ContextVar("vit_lens_background", default=None)


@contextlib.contextmanager
def background_work(stop: threading.Event | None = None, niceness: int = 0) -> Iterator[Background]:
    """Inside the block this context's forwards of any LoadedModel are background work (see above)."""
    work = Background(stop if stop is not None else threading.Event(), niceness)
    token = _background.set(work)
    try:
        yield work
    finally:
        _background.reset(token)


def current_background() -> Background | None:
    """The background work this context runs in, or None (foreground)."""
    return _background.get()


def check_stopped() -> None:
    """Raise WorkStopped if this context is background work whose stop event is set; else nothing."""
    work = _background.get()
    if work is not None and work.stop.is_set():
        raise WorkStopped(STOPPED)


def lower_this_threads_priority(by: int) -> None:
    """Give the calling thread a nice value `by` above the process's own (at most 19) unless its own is that high
    already, so that it gets a core only after the threads at the process's priority. Linux only: there each thread
    has a nice value of its own (its thread id names it to setpriority, the process id names the main thread);
    elsewhere that call would lower the whole process, so nothing is done. Counted from the process, not from the
    thread: a thread inherits the nice value of the thread that starts it (a pool's worker, started by whichever
    thread submitted work first, maybe one lowered already), and lowering it twice must not push it further down."""
    if sys.platform == "linux":
        tid = threading.get_native_id()
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + by)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)


class ModelLock:
    """A lock of one shared model (not re-entrant) with two classes of holders: a foreground acquire waits only for
    the holder; a background acquire (inside `background_work`) also waits while any foreground acquire is waiting
    and until FOREGROUND_GRACE_S after the last foreground release, and gives up with WorkStopped once its stop event
    is set. Among foreground waiters there is no order, as with
    threading.Lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held = False
        self._held_by_background = False
        self._foreground_waiting = 0
        self._foreground_left = -math.inf  # time.monotonic() of the last foreground release

    def acquire(self) -> bool:
        work = _background.get()
        with self._cond:
            if work is None:
                self._foreground_waiting += 1
                try:
                    while self._held:
                        self._cond.wait()
                finally:
                    self._foreground_waiting -= 1
            else:
                while True:
                    if work.stop.is_set():
                        raise WorkStopped(STOPPED)
                    grace_left = self._foreground_left + FOREGROUND_GRACE_S - time.monotonic()
                    if not (self._held or self._foreground_waiting or grace_left > 0):
                        break
                    self._cond.wait(min(STOP_POLL_S, grace_left) if grace_left > 0 else STOP_POLL_S)
            self._held, self._held_by_background = True, work is not None
            return True

    def release(self) -> None:
        with self._cond:
            if not self._held:
                raise RuntimeError("release of an unlocked ModelLock")
            if not self._held_by_background:
                self._foreground_left = time.monotonic()
            self._held = False
            self._cond.notify_all()

    def locked(self) -> bool:
        return self._held

    def foreground_waiting(self) -> bool:
        """Whether a foreground acquire waits for the holder now (background work holding the lock yields then)."""
        return self._foreground_waiting > 0

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
