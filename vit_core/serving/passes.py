"""Capture passes of one shared model at once, for a class server's burst of uploads.

A capture pass holds the model's lock (`LoadedModel.lock`) for its recording hooks and the `fused_attn` flags,
which are per-model state. With `set_parallel_passes(n)` (n > 1) up to n capture passes share one hold of the
lock and one set of hooks: the first pass of a group takes the lock and installs them, the last one to end
removes them and lets the lock go, and each hook hands what it sees to the pass of the thread that runs it (a
thread-local store), so a pass records its own forward and nothing of the others. Other holders of the lock
(the explanation passes, the dataset's reductions, a plain `run_with_capture`) wait for the group to end.

On a CPU, n passes at once each run with 1/n of torch's threads ("narrow"): a forward whose OpenMP threads
share the cores with other work waits at every barrier for the thread that lost its core (docs/performance.md,
"Forward passes on lanes of one thread"). A pass that finds nobody waiting runs alone with all the threads ("wide"), and later
arrivals wait for it to end.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ..hooks import intermediates_kept
from ..loading.model import LoadedModel
from ..runtime import torch_threads

_MAX_PASSES_PER_GROUP = 16  # then the group closes, so that a waiting explanation pass gets the lock between bursts


@dataclass
class _Parallel:
    passes: int = 1  # capture passes of one model at once
    narrow_threads: int = 1  # torch threads of each of them when several run (or wait)


_parallel = _Parallel()


def set_parallel_passes(passes: int, threads: int | None = None) -> None:
    """Let up to `passes` capture passes of one model run at once, each with `threads // passes` torch
    threads (`threads`: torch's thread count, by default the current one) when more than one wants to run.
    1 (the default) runs them one at a time with all of torch's threads."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    _parallel.passes = passes
    _parallel.narrow_threads = max(1, (threads or torch.get_num_threads()) // passes)


def narrow_threads() -> int:
    """The torch threads of each capture pass when several run at once (`set_parallel_passes`)."""
    return _parallel.narrow_threads


def parallel_passes() -> int:
    """How many capture passes of one model may run at once (`set_parallel_passes`)."""
    return _parallel.passes


_this_thread = threading.local()  # .recording: (model, keep) of the capture pass this thread runs, if any


def _keep_for_this_thread(model: torch.nn.Module) -> Callable[[str, torch.Tensor], None]:
    """A `keep` for hooks shared by concurrent passes: it hands each tensor to the pass of the calling thread
    (hooks run in the thread of the forward that triggers them); a forward of another thread keeps nothing."""

    def keep(key: str, tensor: torch.Tensor) -> None:
        recording = getattr(_this_thread, "recording", None)
        if recording is not None and recording[0] is model:
            recording[1](key, tensor)

    return keep


class _PassGroup:
    """The capture passes of one model running now, with the hooks and the hold of the model's lock they share."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.running = 0  # passes inside the group now
        self.waiting = 0  # passes waiting to get in
        self.tickets = 0  # tickets handed out: passes get in in the order they came (a Condition wakes any waiter)
        self.serving = 0  # the ticket whose turn it is
        self.abandoned: set[int] = set()  # tickets of passes that stopped waiting
        self.admitted = 0  # passes the current group let in so far
        self.opening = False  # a first pass is taking the lock and installing the hooks
        self.narrow = False  # the group runs narrow passes (others may join) rather than one wide pass
        self.hooks: contextlib.ExitStack | None = None
        self.lock: threading.Lock | None = None  # the model lock the group holds

    def _next_in_line(self) -> None:
        """Under `cond`: skip abandoned tickets and wake the waiters, so the one whose turn it is can look."""
        while self.serving in self.abandoned:
            self.abandoned.discard(self.serving)
            self.serving += 1
        self.cond.notify_all()

    def _may_join(self) -> bool:
        return (self.running > 0 and not self.opening and self.narrow and self.running < _parallel.passes
                and self.admitted < _MAX_PASSES_PER_GROUP)

    def enter(self, loaded: LoadedModel) -> bool:
        """Wait until this pass may run, taking the lock and installing the hooks if it is the group's first;
        returns whether it runs narrow."""
        with self.cond:
            ticket, self.tickets = self.tickets, self.tickets + 1
            self.waiting += 1
            try:
                while ticket != self.serving or not (self._may_join() or (self.running == 0 and not self.opening)):
                    self.cond.wait()
            except BaseException:  # interrupted while waiting: its turn is skipped, not waited for by the others
                self.abandoned.add(ticket)
                self._next_in_line()
                raise
            finally:
                self.waiting -= 1
            self.serving += 1
            self._next_in_line()
            if self.running > 0:
                self.running += 1
                self.admitted += 1
                return True
            self.opening = True
        hooks = contextlib.ExitStack()
        try:
            loaded.lock.acquire()
            try:
                hooks.enter_context(intermediates_kept(loaded.model, _keep_for_this_thread(loaded.model)))
            except BaseException:
                hooks.close()
                loaded.lock.release()
                raise
        except BaseException:
            with self.cond:
                self.opening = False
                self.cond.notify_all()
            raise
        with self.cond:
            self.opening = False
            self.hooks, self.lock = hooks, loaded.lock
            self.running, self.admitted = 1, 1
            self.narrow = _parallel.passes > 1 and self.waiting > 0
            self.cond.notify_all()
            return self.narrow

    def leave(self) -> None:
        """End one pass; the last one of the group removes the hooks and releases the model's lock."""
        with self.cond:
            self.running -= 1
            if self.running:
                self.cond.notify_all()  # a lane is free: the next one in line may join the passes still running
                return
            hooks, lock, self.hooks, self.lock = self.hooks, self.lock, None, None
            try:
                hooks.close()
            finally:
                lock.release()
                self.cond.notify_all()


_groups: weakref.WeakKeyDictionary[torch.nn.Module, _PassGroup] = weakref.WeakKeyDictionary()
_groups_lock = threading.Lock()


@contextlib.contextmanager
def capture_pass(loaded: LoadedModel, store: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block, this thread's forward of `loaded.model` (in eval mode, un-fused attention) appends
    every intermediate the result needs to `store` (through `hooks.intermediates_kept`), while up to
    `parallel_passes()` such passes run at once (see above). Hooks, flags, mode, the lock and this thread's
    torch thread count are restored on exit, also when the forward raises."""
    model = loaded.model
    with _groups_lock:
        group = _groups.setdefault(model, _PassGroup())

    def keep(key: str, tensor: torch.Tensor) -> None:
        store.setdefault(key, []).append(tensor.detach())

    narrow = group.enter(loaded)
    try:
        with torch_threads(_parallel.narrow_threads if narrow else None):
            _this_thread.recording = (model, keep)
            try:
                yield
            finally:
                _this_thread.recording = None
    finally:
        group.leave()

