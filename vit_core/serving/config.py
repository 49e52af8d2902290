"""How a class server sets up the process at start: passes at once, the traced forward, the GIL's switch interval."""

from __future__ import annotations

import logging
import sys

from .. import settings
from .passes import set_parallel_passes
from .traced import set_traced_forward

_logger = logging.getLogger(__name__)

MAX_PARALLEL_PASSES = 4  # on a larger machine each of 4 passes at once gets a quarter of the threads


def configure_parallel_passes(threads: int, passes: int | None = None) -> int:
    """Let up to `passes` (else $VIT_LENS_PARALLEL_PASSES, else the thread count, at most 4) capture passes of
    one model run at once, each with `threads // passes` torch threads when several want to run
    (`serving.set_parallel_passes`); returns it. Several 1-thread forwards are slowed less by the other sessions'
    work than one forward on all threads (docs/performance.md, "Forward passes on lanes of one thread")."""
    passes = passes or settings.PARALLEL_PASSES.number() or min(threads, MAX_PARALLEL_PASSES)
    set_parallel_passes(passes, threads)
    _logger.info("capture passes at once: %d", passes)
    return passes


def configure_traced_forward(enabled: bool | None = None) -> bool:
    """Run capture passes on the CPU through a trace of the hooked forward, which runs without the GIL and
    returns the same numbers bit for bit (`serving.set_traced_forward`); on unless `enabled` is False or
    $VIT_LENS_TRACED_FORWARD says off. Returns whether it is on."""
    if enabled is None:
        enabled = settings.TRACED_FORWARD.on()
    set_traced_forward(enabled)
    _logger.info("traced capture forward: %s", "on" if enabled else "off")
    return enabled


SERVER_SWITCH_INTERVAL = 0.0005  # seconds, with eager forwards: Python's default is 0.005
TRACED_SERVER_SWITCH_INTERVAL = 0.002  # seconds, with traced forwards (see configure_switch_interval)


def configure_switch_interval(seconds: float = SERVER_SWITCH_INTERVAL) -> float:
    """Hand the GIL over after `seconds` instead of Python's 5 ms; returns the previous interval.

    An eager forward gives the GIL up around each of its few hundred torch operations and must get it back after
    each, while a thread running Python keeps it for up to the whole interval: a short interval keeps eager
    forwards near their time alone. A traced forward takes the GIL only to start and end, and every handover
    costs the kernel a wake-up, so it is served best by a longer one (docs/performance.md, "The GIL switch")."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    _logger.info("GIL switch interval: %.2f ms", seconds * 1000)
    return previous
