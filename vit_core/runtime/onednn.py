"""Float32 linear layers on the CPU through oneDNN rather than MKL, an opt-in for speed.

Off by default: the two libraries are both IEEE float32 (no TF32 or bf16 inside) but sum in different orders, so
results move within float32 tolerance, and a choice made by timing could differ from one process to the next
(docs/spec/analyses.md, "Reproducibility"). Opted in, how much oneDNN gains depends on the CPU and the product:
about 2x for ViT-B's linears on a Zen 5 (where MKL does not use AVX-512), a loss at 1 thread on a Zen 3
(docs/performance.md, "Linears on MKL, oneDNN opt-in"). $VIT_LENS_ONEDNN_LINEAR = off (MKL for every product, the
default), on (oneDNN for every product) or auto: like cuDNN's benchmark mode, the first time a product of a new
kind runs (rows up to MEASURE_ROWS, in and out features, bias, torch threads), both libraries run it a few times
in turn, and the faster one (oneDNN only when it is clearly faster: ONEDNN_MARGIN) takes every later product of
that kind in this process.

`linears_on_onednn(device)`, which every pass of ViT Lens enters through `devices.full_float32`, routes the
linears of the calling thread's forward passes (a TorchFunctionMode is per thread) through
`torch.ops.mkldnn._linear_pointwise` (torch's binding of oneDNN's linear) where oneDNN was chosen, called through
a TorchScript function so that a `torch.jit.trace` of the forward (`vit_core.serving.traced`) records it. Only
where gradients are not needed: the op has no backward, so a relevance pass keeps MKL. Off, and nothing changes,
on other devices, where torch lacks the op or it disagrees with `F.linear` on a probe, and off x86-64 (on ARM
oneDNN goes through the Arm Compute Library: not measured).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import platform
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import settings

_logger = logging.getLogger(__name__)

# TorchScript source, not a decorated function: the op's `Scalar?[]` argument is spelled `List[Optional[number]]`
# there, a type Python annotations can't name. (An empty list given from Python can't be recorded by the tracer.)
_LINEAR_SOURCE = '''
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    no_post_op_scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", no_post_op_scalars, "")
'''

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def onednn_linear() -> Linear | None:
    """oneDNN's float32 linear where $VIT_LENS_ONEDNN_LINEAR opts in and this torch and CPU have it
    (`available_linear`), else None."""
    return None if settings.ONEDNN_LINEAR.mode() == "off" else available_linear()


@functools.cache
def available_linear() -> Linear | None:
    """oneDNN's float32 linear `(x (..., D_in), weight (D_out, D_in), bias (D_out,) | None) -> (..., D_out)` of this
    torch and CPU, whatever the setting, or None (see the module docstring). Checked once per process against
    `F.linear` on a small probe."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return None
    try:
        linear = torch.jit.CompilationUnit(_LINEAR_SOURCE).linear
        generator = torch.Generator().manual_seed(0)
        x, weight, bias = (torch.randn(shape, generator=generator) for shape in ((2, 5, 48), (40, 48), (40,)))
        with torch.inference_mode():
            agrees = all(torch.allclose(linear(x, weight, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
                         for b in (bias, None))
    except Exception as e:  # noqa: BLE001 - a torch without the op (or without TorchScript) keeps MKL
        _logger.info("linears stay on MKL (oneDNN's linear is not available: %s)", e)
        return None
    if not agrees:
        _logger.warning("linears stay on MKL (oneDNN's linear disagrees with F.linear on a probe)")
        return None
    return linear


# oneDNN takes a kind of product only where its fastest time is at least 5 % below MKL's: within that, the two
# are a wash on the machines measured, and MKL (torch's own) is kept. The fastest round of each, not the median: a
# busy neighbour only adds time, so slow rounds of one library beside other work can put the slower one on a product
# (docs/performance.md, "Linears on MKL, oneDNN opt-in"). A kind with more rows (a batch of inputs) is judged at
# MEASURE_ROWS rows, where both libraries run at their full speed; fewer rows are judged as they come.
ONEDNN_MARGIN = 0.05
MEASURE_ROWS = 1024
MEASURE_ROUNDS = 5  # rounds of one MKL and one oneDNN product each, after one of each untimed


@dataclass(frozen=True)
class ProductKind:
    """What the choice is made for: products with these rows (a power of two, at most MEASURE_ROWS), in and out
    features, bias or none, at this many torch threads."""

    rows: int
    d_in: int
    d_out: int
    bias: bool
    threads: int

    def __str__(self) -> str:
        rows = (f">{self.rows // 2}" if self.rows == MEASURE_ROWS else
                f"{self.rows // 2 + 1}-{self.rows}" if self.rows > 2 else f"{self.rows}")
        return f"{rows} rows x {self.d_in} -> {self.d_out}, {self.threads} thread{'s' * (self.threads > 1)}"


@dataclass(frozen=True)
class Choice:
    kind: ProductKind
    mkl_s: float  # seconds of one product, the fastest round measured
    onednn_s: float
    onednn: bool  # the product kind runs on oneDNN


def product_kind(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, threads: int) -> ProductKind:
    """The kind of `F.linear(x (..., d_in), weight (d_out, d_in), bias)` at `threads` torch threads."""
    rows = max(1, math.prod(int(d) for d in x.shape[:-1]))  # plain ints, also while a forward is being traced
    return ProductKind(min(1 << (rows - 1).bit_length(), MEASURE_ROWS), int(weight.shape[1]), int(weight.shape[0]),
                       bias is not None, threads)


def prefers_onednn(mkl_seconds: Sequence[float], onednn_seconds: Sequence[float],
                   margin: float = ONEDNN_MARGIN) -> bool:
    """The decision from interleaved timings of the same product: oneDNN only when its fastest round is more than
    `margin` below MKL's."""
    return min(onednn_seconds) < (1 - margin) * min(mkl_seconds)


def time_both(linear: Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              rounds: int = MEASURE_ROUNDS) -> tuple[list[float], list[float]]:
    """Seconds of `rounds` MKL and `rounds` oneDNN products of x's first MEASURE_ROWS rows, in turn (a VM's
    speed drifts; each round sees the same drift), after one untimed product of each."""
    x = x.detach().reshape(-1, x.shape[-1])[:MEASURE_ROWS].contiguous()  # (rows, d_in)
    weight = weight.detach()
    bias = None if bias is None else bias.detach()
    mkl, onednn = [], []
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for fn, times in ((F.linear, mkl), (linear, onednn)):
                started = time.perf_counter()
                fn(x, weight, bias)
                if round_:
                    times.append(time.perf_counter() - started)
    return mkl, onednn


@dataclass
class _Choices:
    lock: threading.Lock
    made: dict[ProductKind, Choice]


_choices = _Choices(threading.Lock(), {})
Measure = Callable[[Linear, torch.Tensor, torch.Tensor, "torch.Tensor | None"], tuple[list[float], list[float]]]


def choose(linear: Linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           measure: Measure | None = None) -> bool:
    """Whether this product runs on oneDNN: the choice made for its kind, measured now (with `measure`, by default
    `time_both`) if this is the first product of the kind in the process. Under $VIT_LENS_ONEDNN_LINEAR=on always,
    and, while a forward is being traced (nothing may run beside the recorded operations) without a choice yet,
    never."""
    if settings.ONEDNN_LINEAR.mode() == "on":
        return True
    kind = product_kind(x, weight, bias, torch.get_num_threads())
    choice = _choices.made.get(kind)
    if choice is not None:
        return choice.onednn
    if torch.jit.is_tracing():
        return False
    with _choices.lock:  # one measurement at a time: two at once would time each other
        if kind not in _choices.made:
            mkl, onednn = (measure or time_both)(linear, x, weight, bias)
            choice = Choice(kind, min(mkl), min(onednn), prefers_onednn(mkl, onednn))
            _choices.made[kind] = choice
            _logger.debug("linears %s: %s (MKL %.3f ms, oneDNN %.3f ms)", kind, "oneDNN" if choice.onednn else "MKL",
                          choice.mkl_s * 1e3, choice.onednn_s * 1e3)
        return _choices.made[kind].onednn


def choices() -> list[Choice]:
    """The choices this process has made so far, in the order they were made."""
    return list(_choices.made.values())


def forget_choices() -> None:
    """Forget every choice (tests; a later product measures again)."""
    with _choices.lock:
        _choices.made.clear()


def choices_line(made: Sequence[Choice]) -> str:
    """The choices in one line, for a server's log: which library takes which kind of product, and the times."""
    if not made:
        return "linears: no product measured yet"
    on = sum(c.onednn for c in made)
    each = "; ".join(f"{c.kind}: {'oneDNN' if c.onednn else 'MKL'} (MKL {c.mkl_s * 1e3:.2f} ms, oneDNN "
                     f"{c.onednn_s * 1e3:.2f} ms)" for c in made)
    return f"linears measured on this CPU: oneDNN for {on} of {len(made)} kinds of product, MKL for the rest: {each}"


class _LinearsOnOneDNN(TorchFunctionMode):
    """Sends float32 CPU `F.linear` calls that need no gradient, outside a CPU autocast, to `linear` where oneDNN
    was chosen for their kind of product (`choose`); everything else as it was."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self._linear = linear

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            tensors = (x, weight) if bias is None else (x, weight, bias)
            if (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
                    and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
                    and not torch.is_autocast_enabled("cpu")  # autocast's own bfloat16 linear stays
                    and choose(self._linear, x, weight, bias)):
                return self._linear(x, weight, bias)
        return func(*args, **kwargs)


@contextlib.contextmanager
def linears_on_onednn(device: torch.device) -> Iterator[None]:
    """Inside the block, this thread's float32 linears on the CPU that need no gradient run on oneDNN where it is
    available and chosen (see the module docstring). Nothing changes for `device`s other than the CPU."""
    linear = onednn_linear() if device.type == "cpu" else None
    if linear is None:
        yield
        return
    with _LinearsOnOneDNN(linear):
        yield
