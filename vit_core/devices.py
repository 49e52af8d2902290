"""Which torch device runs the model: `auto` = CUDA, then Apple MPS, then the CPU.

One place that turns what a user typed (`--device`, `load_model(device=...)`, the dashboard's
setting) into a `torch.device`, or refuses it with one sentence. Results do not depend on the device
beyond float32 tolerance (shared/spec/interface.md, "Devices").
"""

from __future__ import annotations

import re

import torch

from .errors import ViTLensError

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
