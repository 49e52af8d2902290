"""Work nobody is waiting for, below the forwards somebody is: the shared model's lock, and the background context.

On a class server one student's Judge (hundreds of perturbed forwards) or Many images run holds the shared model for
minutes, while the others' new images each need one forward. `ForegroundFirstLock`, which `shared_model` puts on the
server's LoadedModel in place of the library's plain lock, lets a waiting foreground forward in before any waiting
background work; background work (the code inside `background_work`) takes the lock in slices (the library's
`between_batches` hook, vit_core.explain.passes: a few forwards, then the lock is taken again), and only after a
moment without foreground holders (FOREGROUND_GRACE_S), so a new image waits for one slice at most, not for the whole
job. Background work also stops at its next slice once its `stop` event is set (`WorkStopped`): a newer job of the
same session, or the session's end.

Only the order of who holds the lock changes, never what a forward computes: results are the same bits in the
background as in the foreground.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import ViTLensError
from ..explain.passes import between_batches
from ..loading.model import LoadedModel

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
    """The background work running in this context: `stop` ends it at its next slice."""

    stop: threading.Event = field(default_factory=threading.Event)


_background: contextvars.ContextVar[Background | None] = contextvars.ContextVar("vit_lens_background", default=None)


@contextlib.contextmanager
def background_work(stop: threading.Event | None = None) -> Iterator[Background]:
    """Inside the block this context's forwards of a `shared_model` are background work (see above): its acquires
    of the ForegroundFirstLock are background ones, and the library's long runs of forwards take it a slice at a
    time, checking `stop` before each (`check_stopped` as their `between_batches` hook)."""
    work = Background(stop if stop is not None else threading.Event())
    token = _background.set(work)
    try:
        with between_batches(check_stopped):
            yield work
    finally:
        _background.reset(token)


def check_stopped() -> None:
    """Raise WorkStopped if this context is background work whose stop event is set; else nothing."""
    work = _background.get()
    if work is not None and work.stop.is_set():
        raise WorkStopped(STOPPED)


class ForegroundFirstLock:
    """A lock of one shared model (not re-entrant) with two classes of holders: a foreground acquire waits only for
    the holder; a background acquire (inside `background_work`) also waits while any foreground acquire is waiting
    and until FOREGROUND_GRACE_S after the last foreground release, and gives up with WorkStopped once its stop event
    is set. Among foreground waiters there is no order, as with threading.Lock."""

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
                raise RuntimeError("release of an unlocked ForegroundFirstLock")
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


def shared_model(loaded: LoadedModel) -> LoadedModel:
    """`loaded` as a server shares it among its users: the same model, its lock a ForegroundFirstLock. Made once per
    model (each call makes a new lock)."""
    return dataclasses.replace(loaded, lock=ForegroundFirstLock())
