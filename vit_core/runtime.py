"""Process-wide runtime settings, applied once at start-up by the CLI and the dashboard."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from pathlib import Path

import torch

_logger = logging.getLogger(__name__)


def setting_on(variable: str) -> bool:
    """A server setting that is on unless the environment variable says 0/off/false/no."""
    return os.environ.get(variable, "on").strip().lower() not in ("0", "off", "false", "no")


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
    threads = threads or int(os.environ.get("VIT_LENS_THREADS", "0")) or cpu_quota()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _logger.info("torch threads: %d", threads)
    return threads


def lower_this_threads_priority(by: int) -> None:
    """Give the calling thread a nice value `by` above the process's own (at most 19) unless its own is that high
    already, so that it gets a core only after the threads at the process's priority. Linux only: there each thread
    has a nice value of its own (its thread id names it to setpriority, the process id names the main thread);
    elsewhere that call would lower the whole process, so nothing is done. Counted from the process, not from the
    thread: a thread inherits the nice value of the thread that starts it (a pool's worker, started by whichever
    thread submitted work first, maybe one lowered already), and lowering it twice must not push it further down."""
    if sys.platform == "linux":
        tid = threading.get_native_id()
        target = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + by)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)


PARALLEL_PASSES_ENV = "VIT_LENS_PARALLEL_PASSES"
MAX_PARALLEL_PASSES = 4  # on a larger machine each of 4 passes at once gets a quarter of the threads


def configure_parallel_passes(threads: int, passes: int | None = None) -> int:
    """For a server of many sessions: let up to `passes` (else $VIT_LENS_PARALLEL_PASSES, else the
    thread count, at most 4) capture passes of one model run at once, each with `threads // passes`
    torch threads when several want to run (`vit_core.capture.set_parallel_passes`); returns it.

    On the 2-core development machine, in a burst of 30 students' uploads (scripts/loadtest.py), two 1-thread
    forwards at once are not slowed by the other sessions' figures the way one 2-thread forward is."""
    from .capture import set_parallel_passes

    passes = passes or int(os.environ.get(PARALLEL_PASSES_ENV, "0")) or min(threads, MAX_PARALLEL_PASSES)
    set_parallel_passes(passes, threads)
    _logger.info("capture passes at once: %d", passes)
    return passes


TRACED_FORWARD_ENV = "VIT_LENS_TRACED_FORWARD"


def configure_traced_forward(enabled: bool | None = None) -> bool:
    """For a server: run capture passes on the CPU through a trace of the hooked forward, which runs
    without the GIL and returns the same numbers bit for bit (`vit_core.capture.set_traced_forward`); on
    unless `enabled` is False or $VIT_LENS_TRACED_FORWARD says off (`setting_on`). Returns whether it is on."""
    from .capture import set_traced_forward

    if enabled is None:
        enabled = setting_on(TRACED_FORWARD_ENV)
    set_traced_forward(enabled)
    _logger.info("traced capture forward: %s", "on" if enabled else "off")
    return enabled


SERVER_SWITCH_INTERVAL = 0.0005  # seconds, with eager forwards: Python's default is 0.005
TRACED_SERVER_SWITCH_INTERVAL = 0.002  # seconds, with traced forwards (see configure_switch_interval)


def configure_switch_interval(seconds: float = SERVER_SWITCH_INTERVAL) -> float:
    """For a server whose forward passes share the GIL with many sessions' Python work: hand the GIL over
    after `seconds` instead of Python's 5 ms; returns the previous interval.

    An eager forward pass gives the GIL up around each of its few hundred torch operations and must get it
    back after each; a thread running Python (a figure, a protobuf message) keeps it for up to the whole
    interval meanwhile. Measured on the 2-core development machine (ViT-B/16, 1 torch thread, beside one
    thread running pure Python): 1.52 s a forward at 5 ms, 0.64 s at 1 ms, 0.53 s at 0.5 ms (0.45 s alone).
    A traced forward (vit_core.capture, "A forward without the GIL") takes the GIL only to start and end, and
    every handover costs the kernel a wake-up: with it, TRACED_SERVER_SWITCH_INTERVAL (2 ms) served 30
    sessions' uploads faster than 0.5 ms (scripts/loadtest.py, alternate runs: new-image median 9.2 and 9.4 s
    against 10.4 and 9.8 s, control changes 0.08-0.09 s in both; 5 ms, one run: 9.5 s)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    _logger.info("GIL switch interval: %.2f ms", seconds * 1000)
    return previous
