"""A capture forward without the GIL, for a server on the CPU (`set_traced_forward(True)`).

An eager forward gives the GIL up around each of its few hundred torch operations and must win it back after
each; on a server where 30 sessions' scripts, figures and downloads hold it, that made a forward take up to
three times its time alone (docs/performance.md, "The traced forward"). A TorchScript trace of the hooked forward runs the whole
recorded graph in C++ without the GIL and returns every intermediate the hooks saw as an output. It is recorded
once per model, by the model's first capture pass, and kept only where its outputs equal the eager forward's in
every bit (vit_core.runtime.tracing.exact_trace); else the model stays eager. The graph holds no hooks and changes
no flags; it reads the model's parameters in place.

The traced forwards run on "forward lanes": as many threads as passes may run at once, at a lower CPU priority
than the threads that answer pages (Linux: a thread's own nice value), so that a forward that never gives the
GIL up fills the time the pages leave instead of taking both cores from a student moving a slider.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from ..hooks import CAPTURED_KEYS, foreign_hooks
from ..loading.model import LoadedModel
from ..runtime import torch_threads
from ..runtime.tracing import exact_trace
from ..sites import recorded_sites, sites_recorded
from .passes import narrow_threads, parallel_passes
from .priority import FORWARD_LANE_NAME, become_a_lane

_logger = logging.getLogger(__name__)

# A lane's nice value above the pages' threads: the step that keeps control changes fast in the class load test
# (docs/performance.md, "Lanes below the pages").
FORWARD_LANE_NICENESS = 10

@dataclass
class _Tracing:
    enabled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)  # one model traced at a time
    traced: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # model -> _Traced | None
    # model -> {named sites beyond the default capture: _Traced | None}: a trace records the sites it was made with
    with_sites: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    lanes: concurrent.futures.ThreadPoolExecutor | None = None
    lane_count: int = 0


_tracing = _Tracing()


def set_traced_forward(enabled: bool) -> None:
    """Run capture passes of models on the CPU through a trace of the hooked forward (see above): the same
    numbers, bit for bit, without the GIL during the forward. Off by default: recording and checking the
    trace costs five forwards more, once per model, which a server earns back and a single analysis does not."""
    _tracing.enabled = enabled


def traced_forward_enabled() -> bool:
    """Whether capture passes run traced where they can (`set_traced_forward`)."""
    return _tracing.enabled


class _Recorder(torch.nn.Module):
    """The model's forward returning (logits, *intermediates, *sites): traced once, with the capture hooks on."""

    def __init__(self, model: torch.nn.Module, store: dict[str, list[torch.Tensor]], sites: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self._store = store  # filled by this thread's capture hooks during the forward
        self._keys = (*CAPTURED_KEYS, *sites)
        self.counts: dict[str, int] = {}  # tensors per key of the store in the last forward

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._store.clear()
        logits = self.model(x)
        self.counts = {key: len(self._store.get(key, [])) for key in self._keys}  # how a trace's outputs split
        return (logits, *(t for key in self._keys for t in self._store.get(key, [])))


@dataclass(frozen=True)
class _Traced:
    graph: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    counts: dict[str, int]  # tensors per key of the store, in the order of CAPTURED_KEYS, then of `sites`
    input_shape: tuple[int, ...]  # a trace is valid for this input shape only
    sites: tuple[str, ...] = ()  # the named sites beyond the default capture it records (vit_core.sites, canonical)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        """(logits, store) as the eager hooked forward gives them (with its sites' hooks on)."""
        outputs, store, i = self.graph(x), {}, 1  # the graph runs its recorded operators (exact_trace)
        for key in (*CAPTURED_KEYS, *self.sites):
            store[key], i = list(outputs[i:i + self.counts[key]]), i + self.counts[key]
        return outputs[0], store


@contextlib.contextmanager
def _sites_of_this_thread(model: torch.nn.Module, sites: tuple[str, ...], store: dict[str, list[torch.Tensor]]
                          ) -> Iterator[None]:
    """Inside the block, this thread's forwards of `model` append each of `sites` to `store` (the hooks of
    vit_core.sites, which hand over what other threads' forwards compute to nobody)."""
    me = threading.get_ident()

    def keep(name: str, tensor: torch.Tensor) -> None:
        if threading.get_ident() == me:
            store.setdefault(name, []).append(tensor)

    with sites_recorded(model, sites, keep) if sites else contextlib.nullcontext():
        yield


def _trace(loaded: LoadedModel, x: torch.Tensor, store: dict[str, list[torch.Tensor]], threads: int,
           sites: tuple[str, ...] = ()) -> _Traced | None:
    """Inside a capture pass (its hooks fill `store`): `loaded.model` traced at the shape of `x` with `threads` torch
    threads, recording `sites` too (canonical names beyond the default capture), or None if tracing fails or the
    trace's outputs differ from the eager forward's in any bit (vit_core.runtime.tracing.exact_trace)."""
    started = time.perf_counter()
    recorder = _Recorder(loaded.model, store, sites)
    # At the thread count its passes run at: the trace records the library each linear was given, and
    # vit_core.runtime.onednn chooses it per thread count (docs/performance.md, "Linears on MKL, oneDNN opt-in").
    with torch_threads(threads):
        try:
            with _sites_of_this_thread(loaded.model, sites, store):
                graph = exact_trace(recorder, (x,), f"{loaded.name}: capture")
        finally:
            store.clear()
    if graph is None:
        return None
    _logger.info("%s: capture forward traced in %.1f s", loaded.name, time.perf_counter() - started)
    return _Traced(graph, recorder.counts, tuple(x.shape), sites)


def traced_forward(loaded: LoadedModel, x: torch.Tensor, store: dict[str, list[torch.Tensor]],
                   threads: int | None = None, sites: Iterable[str] = ()) -> _Traced | None:
    """Inside a capture pass, with tracing on and the model on the CPU: the model's trace that also records `sites`
    (vit_core.sites names; those the default capture records anyway cost nothing), recorded now if it has none yet,
    at `threads` torch threads (those its passes run at; by default a burst's narrow passes'); None where the model
    stays eager. Raises SiteError for a site that isn't on this model."""
    if not _tracing.enabled or loaded.device.type != "cpu" or not hasattr(torch, "jit") or foreign_hooks(loaded.model):
        return None
    extra = recorded_sites(sites, loaded.geometry.num_layers)
    with _tracing.lock:
        held = _tracing.with_sites.setdefault(loaded.model, {}) if extra else None
        if extra and extra not in held:
            held[extra] = _trace(loaded, x, store, threads or narrow_threads(), extra)
        elif not extra and loaded.model not in _tracing.traced:
            _tracing.traced[loaded.model] = _trace(loaded, x, store, threads or narrow_threads())
        traced = held[extra] if extra else _tracing.traced[loaded.model]
    return traced if traced is not None and traced.input_shape == tuple(x.shape) else None



def on_a_lane(traced: _Traced, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """`traced(x)` on a forward lane, with this pass's share of torch's threads."""
    threads = torch.get_num_threads()

    def run() -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)  # the lane's own OpenMP setting, as the pass's
        with torch.inference_mode():
            return traced(x)

    return _forward_lanes().submit(run).result()


def _forward_lanes() -> concurrent.futures.ThreadPoolExecutor:
    """The threads traced forwards run on, one per pass that may run at once, at a lower CPU priority."""
    with _tracing.lock:
        if _tracing.lanes is None or _tracing.lane_count < parallel_passes():
            if _tracing.lanes is not None:
                _tracing.lanes.shutdown(wait=False)  # its running forwards finish; new ones go to the wider pool
            _tracing.lanes = concurrent.futures.ThreadPoolExecutor(
                max_workers=parallel_passes(), thread_name_prefix=FORWARD_LANE_NAME,
                initializer=become_a_lane, initargs=(FORWARD_LANE_NAME, FORWARD_LANE_NICENESS))
            _tracing.lane_count = parallel_passes()
        return _tracing.lanes


