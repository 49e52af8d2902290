"""Images in parallel on a CPU: W forwards at once, each on its own thread at one torch thread.

Why: on a CPU that other work shares (a laptop with a browser open, a lab server), a one-image forward at several
torch threads waits at every operator for the thread that lost its core; a forward at one thread never waits for
another, and W images in flight keep W cores busy (docs/performance.md, "Many images: one thread per forward").
An image's values are the same bits whatever W: a forward's operators give the same bits at any thread count and
on whichever thread runs them (analyses.md, "Reproducibility"; tests/unit/test_reproducible.py checks W = 1, 2, 3).

Each worker thread has its own `replica` of the model: a copy of its modules that shares its parameters and
buffers (the same tensors: no second copy of the weights), so a forward's hooks and `fused_attn` flags are its own
and the workers share no lock. torch releases the GIL inside its operators, so threads suffice (docs/performance.md
compares them with processes). W = 1 is one such worker: one torch thread too, whatever the caller's count. The
caller holds the model's lock while the workers run (`map_forwards`), so a server's other passes of the model wait
for them as they waited for a batch's forwards one after another. On an accelerator there is no pool: one forward
of `forward_images` images at a time, in the caller's thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable, Iterator, Sequence, TypeVar

import torch

from .. import settings
from ..loading.model import LoadedModel
from ..runtime import cpu_quota

T = TypeVar("T")
R = TypeVar("R")


def model_workers(device: torch.device, asked: int | None = None) -> int:
    """Forwards at once: `asked`, else $VIT_LENS_MODEL_WORKERS, else on a CPU the CPUs this process may use
    (`runtime.cpu_quota`); 1 on an accelerator, whose speed is its batch of `forward_images`."""
    if device.type != "cpu":
        return 1
    workers = asked or settings.MODEL_WORKERS.number() or cpu_quota()
    if workers < 1:
        raise ValueError(f"model workers must be at least 1, got {workers}")
    return workers


def pool_width(device: torch.device, items: int, asked: int | None = None) -> int:
    """`model_workers`, but no more than the `items` to run (at least 1): a pool with none idle."""
    return max(1, min(model_workers(device, asked), items))


def _modules_copied(module: torch.nn.Module, memo: dict[int, torch.nn.Module]) -> torch.nn.Module:
    """`module` and every module inside it copied: each copy's own attributes, and its own dictionaries (hooks,
    submodules, parameters and buffers), whose values are the same tensors and functions (a shallow copy of each)."""
    if id(module) in memo:  # a module reached twice stays one module
        return memo[id(module)]
    copied = object.__new__(type(module))
    state = {key: type(value)(value) if type(value) in (dict, set, OrderedDict) else value  # hooks added to the copy
             for key, value in vars(module).items()}                                        # stay on the copy
    state["_modules"] = {name: None if child is None else _modules_copied(child, memo)
                         for name, child in module._modules.items()}
    copied.__dict__.update(state)
    memo[id(module)] = copied
    return copied


def replica(loaded: LoadedModel) -> LoadedModel:
    """`loaded` with a copy of its model's modules that shares its parameters and buffers (the same tensors) and a
    lock of its own: hooks and flags set on the copy don't reach the model, its weights are the model's. Made from
    the model as it is now (a run makes its own: a module patched before it is patched in the copy too)."""
    with loaded.lock:  # no pass's hooks or fused_attn flags on the model while it is copied
        copied = _modules_copied(loaded.model, {})
    return dataclasses.replace(loaded, model=copied, lock=threading.Lock())


def _one_torch_thread(started: threading.Barrier) -> None:
    """A worker thread's start: one torch thread for every operator it runs (torch's count is per thread: OpenMP's
    and MKL's), then wait until every worker has started, so that each worker is its own thread."""
    # torch sets a thread's count once, lazily, at its first call that reads it: to the count last set by any
    # thread. Read it first, or that first operator would undo the count set here (the caller sets its own back).
    torch.get_num_threads()
    torch.set_num_threads(1)
    started.wait()


class ForwardPool:
    """`workers` threads at one torch thread each, and as many replicas of a model; `map` runs a function of (a
    replica, an item) over items, results in the items' order; `once` keeps what the pool's run makes once."""

    def __init__(self, loaded: LoadedModel, workers: int) -> None:
        self.workers = workers
        self._made: dict[Hashable, object] = {}
        self._made_lock = threading.Lock()
        self._free: queue.SimpleQueue[LoadedModel] = queue.SimpleQueue()
        for _ in range(workers):
            self._free.put(replica(loaded))
        started = threading.Barrier(workers + 1)
        caller_threads = torch.get_num_threads()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="vit-lens-forward")
        for _ in range(workers):  # every thread started now, each held at the barrier until all are there
            self._executor.submit(_one_torch_thread, started)
        started.wait()
        # torch.set_num_threads also sets the count that a thread's first operator adopts; give it back the caller's
        # count, so that threads started later (a server's next page run) don't start at one thread.
        torch.set_num_threads(caller_threads)

    def map(self, run: Callable[[LoadedModel, T], R], items: Sequence[T],
            each: Callable[[int], None] | None = None) -> list[R]:
        """run(a replica, item) for each item, results in the items' order; each(i), in this thread, as soon as item i
        and every item before it are done."""
        def one(item: T) -> R:
            worker = self._free.get()
            try:
                return run(worker, item)
            finally:
                self._free.put(worker)

        results = []
        for index, result in enumerate(self._executor.map(one, items)):  # in order, as they finish
            results.append(result)
            if each is not None:
                each(index)
        return results

    def once(self, key: Hashable, make: Callable[[], R]) -> R:
        """make(), run on one of the workers the first time `key` is asked for in this pool's life, and its result
        every time after. On a worker, so at one torch thread as the pool's passes run: a trace records the library
        each operator chose at its thread count (vit_core.runtime.onednn). Not from inside `map`'s function."""
        with self._made_lock:
            if key not in self._made:
                self._made[key] = self._executor.submit(make).result()
            return self._made[key]  # type: ignore[return-value]

    def close(self) -> None:
        self._executor.shutdown(wait=True)


@contextlib.contextmanager
def forward_pool(loaded: LoadedModel, workers: int) -> Iterator[ForwardPool | None]:
    """For the block, on a CPU a pool of `workers` forwards of `loaded`'s model as it is now (its threads ended
    after): one worker too, so that its forwards run at one torch thread whatever the caller's count; None on an
    accelerator (the caller's thread runs the forwards, each a batch)."""
    if loaded.device.type != "cpu":
        yield None
        return
    pool = ForwardPool(loaded, workers)
    try:
        yield pool
    finally:
        pool.close()


def map_forwards(pool: ForwardPool | None, loaded: LoadedModel, run: Callable[[LoadedModel, T], R],
                 items: Sequence[T], each: Callable[[int], None] | None = None) -> list[R]:
    """run(model, item) for each item, results in order: on `pool`'s workers (each with its replica as `model`) while
    this thread holds `loaded.lock`, so that other passes of the model (a server's foreground capture) wait for the
    items as they waited for a batch's forwards one after another; without a pool, one after another in this thread
    on `loaded`. `run` takes its model's lock for its pass. each(i), in this thread, once item i and those before it
    are done (a progress bar's step)."""
    if pool is None:
        results = []
        for index, item in enumerate(items):
            results.append(run(loaded, item))
            if each is not None:
                each(index)
        return results
    with loaded.lock:
        return pool.map(run, items, each)
