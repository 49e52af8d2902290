"""Thread priorities for a server: work no student waits for runs below the threads that answer pages. Its lanes
also carry names the kernel knows, so that a measurement from outside can tell where the server's CPU went."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

# The names of the server's lanes, Python's thread name prefix and the kernel's (/proc/PID/task/TID/comm, at most 15
# characters): the class load test reports the server's CPU by them (tools/loadtest/meters.py, CpuMeter).
FORWARD_LANE_NAME = "vitlens-forward"
EXPORT_LANE_NAME = "vitlens-export"
_PR_SET_NAME = 15  # prctl(2)


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


def name_this_thread(name: str) -> None:
    """Linux: give the calling thread `name` (its first 15 characters) as the kernel's name for it, which Python's
    thread names are not; elsewhere nothing."""
    if sys.platform == "linux":
        try:
            ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this C library: the thread keeps its name
            pass


def become_a_lane(name: str, niceness: int) -> None:
    """A lane's initializer: the thread named `name` (name_this_thread) and `niceness` below the process
    (lower_this_threads_priority)."""
    name_this_thread(name)
    lower_this_threads_priority(niceness)
