"""One forward pass with forward hooks, returned as one frozen result.

`run_with_capture` is the only place that touches the model during a pass. Hooks exist only inside
the recording context managers (`attention_recorded`, `_intermediates_kept`) and are removed on
their way out, as is the one module flag they change (`attn.fused_attn`: timm's fused SDPA path
never materialises the attention matrix); `recording_hooks_on(model)` counts the ones still
registered (0 outside a pass). Passes on one model run one at a time, or, after
`set_parallel_passes(n)`, up to n at once sharing one set of hooks that hands each thread's tensors to
that thread's pass (a server's classroom burst: see "Passes at once" below). The result holds CPU
float32 numpy arrays with the batch axis removed, made read-only, so it can be cached and shared between sessions without copies.
A server sets `set_traced_forward(True)`: on a CPU the hooked forward is then recorded once per model as a
TorchScript trace that returns the same tensors bit for bit and runs without the GIL ("A forward without
the GIL" below).

The model may live on any device (`LoadedModel.device`): its input is made there
(`on_model_device`), each intermediate is copied to the host once, in `_frozen`, and a CUDA pass runs
in full float32 (`full_float32`), so that results equal the CPU's within float32 tolerance; a CPU pass runs its
linears on oneDNN there (vit_core.onednn).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.hooks import RemovableHandle

from .analyses import softmax
from .errors import CaptureError
from .images import to_rgb
from .loading import Geometry, LoadedModel
from .onednn import linears_on_onednn
from .runtime import lower_this_threads_priority

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capture:
    """Everything one forward pass showed. Shapes: T tokens, D width, L layers, H heads, C classes."""

    model_name: str
    geometry: Geometry
    input_image: np.ndarray  # uint8 (H, W, 3): the exact crop the model saw
    input_tensor: np.ndarray  # float32 (3, H, W): normalised input of patch_embed
    patch_embeddings: np.ndarray  # float32 (N, D): patch_embed output, before prefix tokens and position
    tokens: np.ndarray  # float32 (L+1, T, D): entering block 0, then after each block (before the final norm)
    pattern: np.ndarray  # float32 (L, H, T, T): post-softmax attention, rows = queries
    final_tokens: np.ndarray  # float32 (T, D): after the final norm
    pre_logits: np.ndarray  # float32 (D',): input of the classifier head (pooled, fc_norm'ed)
    logits: np.ndarray  # float32 (C,)
    forward_seconds: float  # wall time of the hooked forward pass

    @property
    def probs(self) -> np.ndarray:
        return softmax(self.logits)  # (C,)


# ----------------------------------------------------------------------------------------------
# Preprocessing: timm's eval transform, split where the PIL crop becomes a tensor


def preprocess(loaded: LoadedModel, image: Image.Image) -> tuple[np.ndarray, torch.Tensor]:
    """The crop the model sees (uint8 (H, W, 3)) and its normalised tensor ((1, 3, H, W)), through the
    model's eval transform (built once, at load time: `LoadedModel.crop_transform` / `tensor_transform`)."""
    crop = loaded.crop_transform(to_rgb(image))
    return np.asarray(crop, dtype=np.uint8).copy(), loaded.tensor_transform(crop).unsqueeze(0)  # (3, H, W) -> (1, 3, H, W)


def on_model_device(model: torch.nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the device of `model`'s parameters (itself if it is there already): every tensor a pass
    hands to the model goes through here, so that a model moved to a GPU gets its inputs there."""
    return tensor.to(next(model.parameters()).device)


# The TF32 flags are process-wide: passes in several threads (two models, each with its own lock) share one
# setting, turned off by the first pass to start and restored by the last one to end.
_tf32_lock = threading.Lock()
_tf32_passes = 0
_tf32_saved: tuple[bool, bool] = (False, False)


@contextlib.contextmanager
def full_float32(device: torch.device) -> Iterator[None]:
    """The float32 arithmetic of every ViT Lens pass on `device`, for the block.

    CUDA convolutions and matrix products run in full float32, not TF32 (torch lets cuDNN convolutions use TF32
    by default: 10 mantissa bits, so the patch embedding alone would move the results well beyond float32
    tolerance); the flags are restored when the last pass in any thread ends, also on error. On a CPU this
    thread's linears that need no gradient run on oneDNN (`vit_core.onednn.linears_on_onednn`: IEEE float32 too,
    in half the time where MKL takes its slower path). On other devices nothing changes."""
    global _tf32_passes, _tf32_saved
    if device.type != "cuda":
        with linears_on_onednn(device):  # nothing off the CPU
            yield
        return
    with _tf32_lock:
        if _tf32_passes == 0:
            _tf32_saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        _tf32_passes += 1
    try:
        yield
    finally:
        with _tf32_lock:
            _tf32_passes -= 1
            if _tf32_passes == 0:
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = _tf32_saved


# ----------------------------------------------------------------------------------------------
# Hooks: registered only through `_register`, which keeps each handle until it is removed, so that
# the recording's own hooks can be counted without reading torch's private hook dictionaries.

_live_handles: weakref.WeakKeyDictionary[torch.nn.Module, set[RemovableHandle]] = weakref.WeakKeyDictionary()
_live_handles_lock = threading.Lock()


def _register(stack: contextlib.ExitStack, model: torch.nn.Module, handle: RemovableHandle) -> None:
    """Note `handle` as one of `model`'s recording hooks, removed (and forgotten) when `stack` closes."""
    with _live_handles_lock:
        _live_handles.setdefault(model, set()).add(handle)

    def remove() -> None:
        handle.remove()
        with _live_handles_lock:
            _live_handles[model].discard(handle)

    stack.callback(remove)


def recording_hooks_on(model: torch.nn.Module) -> int:
    """Hooks the recording context managers registered on `model` (or its modules) and have not
    removed yet: 0 outside a pass, also after a forward that raised."""
    with _live_handles_lock:
        return len(_live_handles.get(model, ()))


@contextlib.contextmanager
def attention_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, every attention block runs timm's un-fused path and hands its post-softmax
    pattern (B, H, T, T) to `record`; the hooks and the `fused_attn` flags are restored on exit,
    also when the forward raises.

    timm's fused SDPA path never materialises the pattern (a hook on `attn_drop` would see nothing);
    the un-fused path computes softmax(q k^T * scale) and passes it through `attn_drop`.
    """
    with contextlib.ExitStack() as stack:
        for blk in model.blocks:
            stack.callback(setattr, blk.attn, "fused_attn", blk.attn.fused_attn)  # restored on exit
            blk.attn.fused_attn = False
            _register(stack, model, blk.attn.attn_drop.register_forward_hook(lambda m, i, o: record(o.detach())))
        yield


@contextlib.contextmanager
def tokens_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward hands `record` the token sequence (B, T, D) entering block 0, then after
    each block (before the final norm): L+1 calls in order. Hooks removed on exit, also when the forward raises."""
    with contextlib.ExitStack() as stack:
        _register(stack, model, model.blocks[0].register_forward_pre_hook(lambda m, args: record(args[0])))
        for blk in model.blocks:
            _register(stack, model, blk.register_forward_hook(lambda m, i, o: record(o)))
        yield


@contextlib.contextmanager
def _intermediates_kept(model: torch.nn.Module, keep: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward pass in eval mode hands `keep(key, tensor)` every intermediate the result
    needs (keys "pattern", "tokens", "patch_embeddings", "final_tokens", "pre_logits"); mode and hooks
    restored on exit."""
    with contextlib.ExitStack() as stack:
        stack.callback(model.train, model.training)
        model.eval()
        stack.enter_context(attention_recorded(model, lambda pattern: keep("pattern", pattern)))
        stack.enter_context(tokens_recorded(model, lambda tokens: keep("tokens", tokens)))
        hooks = [  # (how to register, the hook): each handle is in the stack as soon as it exists
            (model.patch_embed.register_forward_hook, lambda m, i, o: keep("patch_embeddings", o)),
            (model.norm.register_forward_hook, lambda m, i, o: keep("final_tokens", o)),
            (model.head.register_forward_pre_hook, lambda m, args: keep("pre_logits", args[0])),
        ]
        for register, hook in hooks:
            _register(stack, model, register(hook))
        yield


# ----------------------------------------------------------------------------------------------
# Passes at once. A capture pass of a shared model holds the model's lock (`LoadedModel.lock`) for its
# recording hooks and the `fused_attn` flags, which are per-model state. With `set_parallel_passes(n)`
# (n > 1) up to n capture passes share one hold of the lock and one set of hooks: the first pass of a
# group takes the lock and installs them, the last one to end removes them and lets the lock go, and each
# hook hands what it sees to the pass of the thread that runs it (a thread-local store), so a pass records
# its own forward and nothing of the others. Other holders of the lock (the explanation passes, the
# dataset's reductions) wait for the group to end, as they waited for a single pass before.
#
# On a CPU, n passes at once each run with 1/n of torch's threads ("narrow"): a forward whose OpenMP threads
# share the cores with other work waits at every barrier for the thread that lost its core (on 2 cores,
# a 2-thread ViT-B/16 forward took 1.7 s beside one busy core, a 1-thread one 0.5 s). A pass that finds
# nobody waiting runs alone with all the threads ("wide"), and later arrivals wait for it to end.

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
                hooks.enter_context(_intermediates_kept(loaded.model, _keep_for_this_thread(loaded.model)))
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
def _capture_pass(loaded: LoadedModel, store: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block, this thread's forward of `loaded.model` (in eval mode, un-fused attention) appends
    every intermediate the result needs to `store` (through `_intermediates_kept`), while up to
    `parallel_passes()` such passes run at once (see above). Hooks, flags, mode, the lock and this thread's
    torch thread count are restored on exit, also when the forward raises."""
    model = loaded.model
    with _groups_lock:
        group = _groups.setdefault(model, _PassGroup())

    def keep(key: str, tensor: torch.Tensor) -> None:
        store.setdefault(key, []).append(tensor.detach())

    narrow = group.enter(loaded)
    threads = torch.get_num_threads()
    try:
        _this_thread.recording = (model, keep)
        if narrow and threads != _parallel.narrow_threads:
            torch.set_num_threads(_parallel.narrow_threads)
        yield
    finally:
        _this_thread.recording = None
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        group.leave()


# ----------------------------------------------------------------------------------------------
# A forward without the GIL (`set_traced_forward(True)`: the server, on a CPU). An eager forward gives the
# GIL up around each of its few hundred torch operations and must win it back after each; on a server
# where 30 sessions' scripts, figures and downloads hold it, that made a ViT-B/16 forward take up to three
# times its time alone. A TorchScript trace of the hooked forward runs the whole recorded graph in C++
# without the GIL and returns every intermediate the hooks saw as an output. It is recorded once per
# model, by the model's first capture pass, and kept only if its outputs equal the eager forward's in
# every bit, on that pass's input and on the same input mirrored (a ViT's forward has no branch that
# depends on the pixels; a model that had one would show it here); else, or if tracing fails, the model
# stays eager. The graph holds no hooks and changes no flags; it reads the model's parameters in place.
# `torch.jit.trace` is deprecated (a FutureWarning since torch 2.10): torch.compile's and torch.export's
# programs still come back to Python between operations, so nothing else in torch does this; without
# torch.jit the model stays eager.
#
# The traced forwards run on "forward lanes": as many threads as passes may run at once, at a lower CPU
# priority than the threads that answer pages (Linux: a thread's own nice value). A forward that never
# gives the GIL up would otherwise take both cores from a student moving a slider; this way it fills the
# time the pages leave. The pass waits for its lane without the GIL.

_TRACED_OUTPUTS = ("pattern", "tokens", "patch_embeddings", "final_tokens", "pre_logits")
# 30-session load test (README, "Serving a class"): with 0.4 s forwards, at +0 control changes took 0.41 s (median), at +5
# 0.08 s; with oneDNN's 0.17 s forwards, at +5 0.16-0.20 s, at +10 0.12-0.14 s, new images 3.5-3.6 s.
FORWARD_LANE_NICENESS = 10


@dataclass
class _Tracing:
    enabled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)  # one model traced at a time
    traced: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)  # model -> _Traced | None
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
    """The model's forward returning (logits, *intermediates): traced once, with the capture hooks on."""

    def __init__(self, model: torch.nn.Module, store: dict[str, list[torch.Tensor]]) -> None:
        super().__init__()
        self.model = model
        self._store = store  # filled by this thread's capture hooks during the forward

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._store.clear()
        logits = self.model(x)
        return (logits, *(t for key in _TRACED_OUTPUTS for t in self._store.get(key, [])))


@dataclass(frozen=True)
class _Traced:
    graph: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    counts: dict[str, int]  # tensors per key of the store, in the order of _TRACED_OUTPUTS
    input_shape: tuple[int, ...]  # a trace is valid for this input shape only

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        """(logits, store) as the eager hooked forward gives them."""
        outputs, store, i = self.graph(x), {}, 1
        for key in _TRACED_OUTPUTS:
            store[key], i = list(outputs[i:i + self.counts[key]]), i + self.counts[key]
        return outputs[0], store


def _trace(loaded: LoadedModel, x: torch.Tensor, store: dict[str, list[torch.Tensor]]) -> _Traced | None:
    """Inside a capture pass (its hooks fill `store`): `loaded.model` traced at the shape of `x`, or None if
    tracing fails or the trace's outputs differ from the eager forward's in any bit."""
    started = time.perf_counter()

    def eager(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        logits = loaded.model(x)
        return logits, {key: store.pop(key, []) for key in _TRACED_OUTPUTS}

    def same(a: tuple[torch.Tensor, dict], b: tuple[torch.Tensor, dict]) -> bool:
        return torch.equal(a[0], b[0]) and all(
            len(a[1][key]) == len(b[1][key]) and all(map(torch.equal, a[1][key], b[1][key])) for key in _TRACED_OUTPUTS)

    try:
        checks = [x, x.flip(-1)]
        expected = [eager(c) for c in checks]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation, and TracerWarnings on timm's shape asserts
            graph = torch.jit.trace(_Recorder(loaded.model, store), x, check_trace=False)
        traced = _Traced(graph, {key: len(t) for key, t in expected[0][1].items()}, tuple(x.shape))
        with torch.jit.optimized_execution(False):
            exact = all(same(traced(c), e) for c, e in zip(checks, expected, strict=True))
    except Exception as e:  # noqa: BLE001 - a model the tracer can't record stays eager
        _logger.info("%s: capture stays eager (tracing failed: %s)", loaded.name, e)
        return None
    finally:
        store.clear()
    if not exact:
        _logger.info("%s: capture stays eager (the traced forward differs from the eager one)", loaded.name)
        return None
    _logger.info("%s: capture forward traced in %.1f s", loaded.name, time.perf_counter() - started)
    return traced


def _traced_forward(loaded: LoadedModel, x: torch.Tensor, store: dict[str, list[torch.Tensor]]) -> _Traced | None:
    """Inside a capture pass, with tracing on and the model on the CPU: the model's trace, recorded now if it
    has none yet; None where the model stays eager."""
    if not _tracing.enabled or loaded.device.type != "cpu" or not hasattr(torch, "jit") or _foreign_hooks(loaded.model):
        return None
    with _tracing.lock:
        if loaded.model not in _tracing.traced:
            _tracing.traced[loaded.model] = _trace(loaded, x, store)
        traced = _tracing.traced[loaded.model]
    return traced if traced is not None and traced.input_shape == tuple(x.shape) else None


def _foreign_hooks(model: torch.nn.Module) -> bool:
    """Whether a module of `model` carries a forward hook or pre-hook that no capture recording registered
    (someone's own probe): a trace would skip it, so such a pass runs eager. (torch lists a module's hooks
    only in these dictionaries.)"""
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return hooks > recording_hooks_on(model)


def _on_a_lane(traced: _Traced, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """`traced(x)` on a forward lane, with this pass's share of torch's threads."""
    threads = torch.get_num_threads()

    def run() -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)  # the lane's own OpenMP setting, as the pass's
        with torch.inference_mode(), torch.jit.optimized_execution(False):  # the recorded operations as they are
            return traced(x)

    return _forward_lanes().submit(run).result()


def _forward_lanes() -> concurrent.futures.ThreadPoolExecutor:
    """The threads traced forwards run on, one per pass that may run at once, at a lower CPU priority."""
    with _tracing.lock:
        if _tracing.lanes is None or _tracing.lane_count < _parallel.passes:
            if _tracing.lanes is not None:
                _tracing.lanes.shutdown(wait=False)  # its running forwards finish; new ones go to the wider pool
            _tracing.lanes = concurrent.futures.ThreadPoolExecutor(
                max_workers=_parallel.passes, thread_name_prefix="vit-lens-forward",
                initializer=lower_this_threads_priority, initargs=(FORWARD_LANE_NICENESS,))
            _tracing.lane_count = _parallel.passes
        return _tracing.lanes


def _finished(device: torch.device) -> None:
    """Wait until the work queued on `device` is done (CUDA and MPS run asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def to_host(t: torch.Tensor) -> np.ndarray:
    """`t` (on any device) as a float32 numpy array on the host: the one copy off the device."""
    return t.detach().to(torch.float32).cpu().numpy()


def _frozen(t: torch.Tensor) -> np.ndarray:
    """`to_host(t)`, made read-only."""
    array = to_host(t)
    array.setflags(write=False)
    return array


# ----------------------------------------------------------------------------------------------
# The entry point


def run_with_capture(loaded: LoadedModel, image: Image.Image) -> Capture:
    """Preprocess `image` as the model's pretrained config says, run one hooked forward pass, and
    return every intermediate as numpy.

    Safe to call from many threads on one shared `loaded`: passes hold its lock (the hooks and the
    attention flag are per-model state), one at a time, or up to `parallel_passes()` at once, each
    recording only its own forward (`set_parallel_passes`). Raises CaptureError if the model did not
    produce exactly one attention pattern per block.
    """
    model, geometry = loaded.model, loaded.geometry
    crop, x = preprocess(loaded, image)  # (H, W, 3), (1, 3, H, W) on the host
    store: dict[str, list[torch.Tensor]] = {}
    with _capture_pass(loaded, store):
        with torch.inference_mode(), full_float32(loaded.device):
            traced = _traced_forward(loaded, x, store)  # the model's first pass records the trace
            started = time.perf_counter()
            if traced is not None:
                logits, store = _on_a_lane(traced, x)  # the tensors the hooks would have kept, without the GIL
            else:
                logits = model(on_model_device(model, x))  # (1, C), on the model's device
            _finished(logits.device)  # a GPU runs asynchronously: time the pass, not its launch
        seconds = time.perf_counter() - started

    num_layers = geometry.num_layers
    patterns = store.get("pattern", [])
    if len(patterns) != num_layers:
        raise CaptureError(
            f"expected one attention pattern per block ({num_layers}), got {len(patterns)}: this model's "
            "attention does not run through timm's standard path."
        )
    tokens = store["tokens"]
    assert len(tokens) == num_layers + 1, f"{len(tokens)} token captures for {num_layers} blocks"
    pattern = torch.cat(patterns, dim=0)  # L x (1, H, T, T) -> (L, H, T, T)
    if pattern.shape[1:] != (geometry.num_heads, geometry.num_tokens, geometry.num_tokens):
        raise CaptureError(f"the attention patterns have shape {tuple(pattern.shape[1:])}, not (heads, tokens, tokens) = "
                           f"{(geometry.num_heads, geometry.num_tokens, geometry.num_tokens)}: this model's attention is not "
                           "one softmax per head.")

    input_image = crop
    input_image.setflags(write=False)
    return Capture(
        model_name=loaded.name,
        geometry=geometry,
        input_image=input_image,
        input_tensor=_frozen(x[0]),  # (3, H, W): the host input, not a copy back from the device
        patch_embeddings=_frozen(store["patch_embeddings"][0][0]),  # (1, N, D) -> (N, D)
        tokens=_frozen(torch.cat(tokens, dim=0)),  # (L+1) x (1, T, D) -> (L+1, T, D)
        pattern=_frozen(pattern),
        final_tokens=_frozen(store["final_tokens"][0][0]),  # (1, T, D) -> (T, D)
        pre_logits=_frozen(store["pre_logits"][0][0]),  # (1, D') -> (D',)
        logits=_frozen(logits[0]),  # (1, C) -> (C,)
        forward_seconds=seconds,
    )
