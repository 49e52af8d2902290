"""Thread priorities for a server: work no student waits for runs below the threads that answer pages."""

from __future__ import annotations

import os
import sys
import threading


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
