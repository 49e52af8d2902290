"""Once per server process: torch's thread count and the garbage collector's view of the long-lived heap.

No Streamlit here: `dashboard.serve` calls these before Streamlit starts, the app script on every run
(each does its work once).
"""

from __future__ import annotations

import functools
import gc

from vit_core.runtime import (
    SERVER_SWITCH_INTERVAL,
    TRACED_SERVER_SWITCH_INTERVAL,
    configure_parallel_passes,
    configure_switch_interval,
    configure_threads,
    configure_traced_forward,
)


@functools.cache
def configure_torch_threads() -> int:
    """Size torch's thread pool from the container's CPU quota, once (the pool is process-wide), let as many
    sessions' forward passes run at once, each on its share of the threads (vit_core.runtime.configure_parallel_passes),
    run the capture forward traced where it can, and hand the GIL over more often than Python's 5 ms: every 0.5 ms
    for eager forwards, which need it between operations; every 2 ms for traced ones, which don't
    (vit_core.runtime.configure_switch_interval)."""
    threads = configure_threads()
    configure_parallel_passes(threads)
    traced = configure_traced_forward()
    configure_switch_interval(TRACED_SERVER_SWITCH_INTERVAL if traced else SERVER_SWITCH_INTERVAL)
    return threads


_heap_frozen = False


def freeze_long_lived_heap() -> None:
    """Once per process, after the first full page: hide everything alive from the cyclic garbage collector.

    With torch, timm, plotly and matplotlib imported a full collection walks ~485k objects: 257 ms on the
    2-core machine when Streamlit still ran ``gc.collect(2)`` after every script run (``runner.postScriptGC``,
    now off in the shipped config; Python's own full collections, and a config that turns it back on, still
    walk them). Those objects live as long as the server; ``gc.freeze`` moves them to a generation the
    collector skips (after it: 0 ms). Reference counting still frees them as usual; only reference cycles
    alive right now would never be collected.
    """
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()
