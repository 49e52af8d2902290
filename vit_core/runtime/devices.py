"""Which torch device runs the model (`auto` = CUDA, then Apple MPS, then the CPU), and how a pass runs there.

One place that turns what a user typed (`--device`, `load_model(device=...)`, the dashboard's
setting) into a `torch.device`, or refuses it with one sentence; and the three things every pass of
ViT Lens does on that device: make its input there (`on_model_device`), compute in full float32
(`full_float32`), and copy results to the host once (`to_host`). Results do not depend on the device
beyond float32 tolerance (docs/spec/interface.md, "Devices").
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Iterator

import numpy as np
import torch

from ..errors import ViTLensError
from .onednn import linears_on_onednn

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_SYNTAX = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class DeviceError(ViTLensError, ValueError):
    """A device name that is malformed, or names a device this machine doesn't have."""


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None): the first of CUDA, MPS, CPU that this machine has; otherwise the named one,
    refused if it is not here. `cuda` means the current CUDA device (`cuda:0` unless set otherwise)."""
    if isinstance(device, torch.device):
        device = str(device)
    name = (device or "auto").strip().lower()
    if not _DEVICE_SYNTAX.match(name):
        raise DeviceError(f"unknown device {device!r}: use {DEVICE_CHOICES}.")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(f"device {name!r} asked for, but this machine has no usable CUDA GPU.")
        index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device {name!r} asked for, but this machine has {torch.cuda.device_count()} CUDA GPU(s).")
        return torch.device("cuda", index)
    if name == "mps" and not _mps_available():
        raise DeviceError("device 'mps' asked for, but Apple's Metal backend is not available here.")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """A short name for people: 'CPU', 'CUDA 0 (NVIDIA H100 80GB HBM3)', 'Apple MPS'."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"CUDA {index} ({torch.cuda.get_device_name(index)})"
    return {"cpu": "CPU", "mps": "Apple MPS"}.get(device.type, str(device))


# ----------------------------------------------------------------------------------------------
# A pass on the model's device


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
    thread's linears that need no gradient run on oneDNN (`vit_core.runtime.onednn`: IEEE float32 too). On other
    devices nothing changes."""
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


def finished(device: torch.device) -> None:
    """Wait until the work queued on `device` is done (CUDA and MPS run asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def to_host(t: torch.Tensor) -> np.ndarray:
    """`t` (on any device) as a float32 numpy array on the host: the one copy off the device."""
    return t.detach().to(torch.float32).cpu().numpy()
