"""The process's runtime. Here: what a program using ViT Lens applies once at start (torch's thread count from the
CPU quota, numpy's BLAS threads before numpy is imported) and `torch_threads`, one thread's torch threads for a
block. Beside it: `devices`, where a model runs and how a pass runs there, and `onednn`, which library computes the
CPU's linears. What the environment asks of them they read from `vit_core.settings`, never from `os.environ`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import Iterator

from .. import settings

_logger = logging.getLogger(__name__)


def memory_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 or v1) or the machine's memory, whichever is smaller; None where
    neither can be read."""
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            limits.append(int(text))
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    return min(limits) if limits else None


def one_blas_thread() -> None:
    """Ask numpy's OpenBLAS for one thread, unless the environment says otherwise; only has an effect before numpy is
    imported, so entry points call it first. On a small machine its threads spin against torch's (the filter PCA
    took several times longer with 2 BLAS threads than with 1 on 2 cores: docs/performance.md, "One BLAS thread")."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


# Where a GPU driver shows itself without importing torch: NVIDIA's and AMD's (ROCm) device files.
GPU_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def no_triton_without_a_gpu(driver_files: tuple[str, ...] = GPU_DRIVER_FILES) -> bool:
    """On a machine without a GPU driver, stop triton from being imported (returns whether it did), so entry points
    call it before torch is imported. triton compiles GPU kernels only, yet `import timm` imports it (timm -> torchvision
    .ops -> torch._dynamo -> triton, when installed, as the registry's torch installs it on Linux); its nanobind
    bindings then print some forty "nanobind: leaked ..." lines when the interpreter ends. A None in sys.modules makes
    `import triton` raise ImportError, which torch reads as triton absent (torch.utils._triton.has_triton_package)."""
    if "triton" in sys.modules or any(os.path.exists(path) for path in driver_files):
        return False
    sys.modules["triton"] = None  # type: ignore[assignment]
    return True


def cpu_quota() -> int:
    """CPUs this process may really use: the cgroup quota and affinity mask, not the host's cores.

    PyTorch sizes its thread pool from the host, which oversubscribes a container with a quota.
    """
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:  # cgroup v2: "max 100000" or "200000 100000"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            available = min(available, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, available)


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count from the CPU quota (or $VIT_LENS_THREADS); returns it."""
    import torch

    threads = threads or settings.THREADS.number() or cpu_quota()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _logger.info("torch threads: %d", threads)
    return threads


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """This thread's torch thread count set to `threads` (None: left as it is) inside the block, restored after,
    also when the block raises."""
    import torch

    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def gradient_threads() -> int:
    """torch threads for a gradient pass: $VIT_LENS_GRADIENT_THREADS (default 1; 0: the CPUs a process may use here,
    `cpu_quota`). A backward's kernels may split their sums by thread count (torch's softmax backward does), so the
    count is one fixed number, not the process's own thread setting: the CLI, a Ray worker and the dashboard's
    server make the same maps, bit for bit. One by default: the same maps whatever CPUs a machine has, and a pass that
    never waits at a barrier for a thread that another process took the core from (docs/performance.md)."""
    return settings.GRADIENT_THREADS.number() or cpu_quota()
