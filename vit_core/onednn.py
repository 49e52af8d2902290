"""Float32 linear layers on the CPU through oneDNN rather than MKL: the same products, faster on CPUs where MKL
takes a slower path (on AMD CPUs MKL does not use AVX-512 even where the CPU has it).

How much this gains depends on the CPU, from about 2x to nothing (docs/performance.md, "oneDNN linears"). Both
are IEEE float32 (no TF32 or bf16 inside) and sum in different orders, so results differ within float32
tolerance, as they do between devices (docs/spec/interface.md, "Devices").

`linears_on_onednn(device)`, which every pass of ViT Lens enters through `devices.full_float32`, routes the
linears of the calling thread's forward passes (a TorchFunctionMode is per thread) through
`torch.ops.mkldnn._linear_pointwise` (torch's binding of oneDNN's linear), called through a TorchScript function so
that a `torch.jit.trace` of the forward (`vit_core.serving.traced`) records it. Only where gradients are not
needed: the op has no backward, so a relevance pass keeps MKL. Off, and nothing changes, on other devices, where
torch lacks the op or it disagrees with `F.linear` on a probe, off x86-64 (on ARM oneDNN goes through the Arm
Compute Library: not measured), and where $VIT_LENS_ONEDNN_LINEAR says off.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import platform
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import settings

_logger = logging.getLogger(__name__)

# TorchScript source, not a decorated function: the op's `Scalar?[]` argument is spelled `List[Optional[number]]`
# there, a type Python annotations can't name. (An empty list given from Python can't be recorded by the tracer.)
_LINEAR_SOURCE = '''
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    no_post_op_scalars: List[Optional[number]] = []
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", no_post_op_scalars, "")
'''

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@functools.cache
def onednn_linear() -> Linear | None:
    """oneDNN's float32 linear `(x (..., D_in), weight (D_out, D_in), bias (D_out,) | None) -> (..., D_out)`, or None
    where it is off (see the module docstring). Checked once per process against `F.linear` on a small probe."""
    if not settings.ONEDNN_LINEAR.on():
        return None
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


class _LinearsOnOneDNN(TorchFunctionMode):
    """Sends float32 CPU `F.linear` calls that need no gradient, outside a CPU autocast, to `linear`; everything
    else as it was."""

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
                    and not torch.is_autocast_enabled("cpu")):  # autocast's own bfloat16 linear stays
                return self._linear(x, weight, bias)
        return func(*args, **kwargs)


@contextlib.contextmanager
def linears_on_onednn(device: torch.device) -> Iterator[None]:
    """Inside the block, this thread's float32 linears on the CPU that need no gradient run on oneDNN (where
    `onednn_linear()` is on; see the module docstring). Nothing changes for `device`s other than the CPU."""
    linear = onednn_linear() if device.type == "cpu" else None
    if linear is None:
        yield
        return
    with _LinearsOnOneDNN(linear):
        yield
