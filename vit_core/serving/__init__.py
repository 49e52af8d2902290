"""What a class server needs beyond the library: many sessions' passes on one shared model, and the CPU shared
fairly between forwards, figures and pages.

The library never imports this package (a test checks it): `vit_core.run_with_capture` is a plain eager pass.
A server calls `serve_capture` instead (the same result) after setting the process up at start
(`configure_parallel_passes`, `configure_traced_forward`, `configure_switch_interval`), and writes its
downloads with `npz_bytes`, which copies without the GIL.

- `passes`: capture passes of one model at once, each recording only its own forward;
- `traced`: the capture forward as a TorchScript trace that runs without the GIL, on low-priority lanes;
- `capture`: `serve_capture`, the two together (a light model's pass on the calling thread: `light_pass`);
- `npz`: the `.npz` export copied without the GIL;
- `background`: explanation work below the class's new images (`shared_model`'s foreground-first lock,
  `background_work`, which reaches the library's long runs of forwards through its `between_batches` hook);
- `priority`: lowering a thread below the pages' threads;
- `config`: the start-up settings.
"""

from .background import WorkStopped, background_work, shared_model
from .capture import light_pass, serve_capture
from .config import (
    MAX_PARALLEL_PASSES,
    SERVER_SWITCH_INTERVAL,
    TRACED_SERVER_SWITCH_INTERVAL,
    configure_parallel_passes,
    configure_switch_interval,
    configure_traced_forward,
)
from .npz import npz_bytes
from .passes import parallel_passes, set_parallel_passes
from .priority import lower_this_threads_priority
from .traced import FORWARD_LANE_NICENESS, set_traced_forward, traced_forward_enabled

__all__ = [
    "FORWARD_LANE_NICENESS", "MAX_PARALLEL_PASSES", "SERVER_SWITCH_INTERVAL", "TRACED_SERVER_SWITCH_INTERVAL",
    "configure_parallel_passes", "configure_switch_interval", "configure_traced_forward", "light_pass",
    "lower_this_threads_priority", "npz_bytes", "parallel_passes", "serve_capture", "set_parallel_passes",
    "set_traced_forward", "traced_forward_enabled", "WorkStopped", "background_work", "shared_model",
]
