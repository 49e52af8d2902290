"""The class server's capture: `run_with_capture`'s result, with passes at once and a forward without the GIL."""

from __future__ import annotations

import time
from typing import Iterable

import torch
from PIL import Image

from ..capture import Capture, capture_of_pass, preprocess, run_with_capture
from ..loading.model import LoadedModel
from ..runtime import torch_threads
from ..runtime.devices import finished, full_float32, on_model_device
from ..sites import recorded_sites
from .passes import capture_pass
from .traced import on_a_lane, traced_forward

# A pass with fewer multiply-adds than this (parameters x tokens: the Shapes ViT's about 0.3 G, ViT-S/16's 4.3 G)
# takes 10-20 ms on one core: it runs on the thread that asks, at the pages' priority, with one torch thread. On a
# low-priority lane with both cores beside a browser, each stroke of a drawing waited 0.06-0.98 s for it
# (docs/performance.md, "A light model on the asking thread").
LIGHT_PASS_MACS = 1e9


def light_pass(loaded: LoadedModel) -> bool:
    """Whether a capture pass of `loaded` is light enough to run on the thread that asks for it (LIGHT_PASS_MACS)."""
    return loaded.multiply_adds < LIGHT_PASS_MACS


def serve_capture(loaded: LoadedModel, image: Image.Image, *, on_this_thread: bool = False,
                  sites: Iterable[str] = ()) -> Capture:
    """The same `Capture` as `vit_core.run_with_capture(loaded, image, sites=sites)`, bit for bit, run the server's
    way: up to `parallel_passes()` passes of one model at once, each recording only its own forward
    (`serving.passes`), and on the CPU through the model's trace on a low-priority forward lane when tracing is on
    (`serving.traced`; a trace per set of named sites). `on_this_thread`: the forward runs on the calling thread, at
    its priority, with one torch thread (a light pass: `light_pass`). Named sites beyond the default capture without
    a trace: `run_with_capture` itself (its site hooks would be on the model that the burst's other passes run)."""
    model = loaded.model
    extra = recorded_sites(sites, loaded.geometry.num_layers)  # SiteError before any pass
    crop, x = preprocess(loaded, image)  # (H, W, 3), (1, 3, H, W) on the host
    store: dict[str, list[torch.Tensor]] = {}
    with capture_pass(loaded, store), torch_threads(1 if on_this_thread else None):
        with torch.inference_mode(), full_float32(loaded.device):
            traced = traced_forward(loaded, x, store, 1 if on_this_thread else None, extra)  # recorded by the first pass
            started = time.perf_counter()
            if traced is None and extra:
                logits = None  # run below, alone, with the sites' hooks
            elif traced is not None and on_this_thread:
                with torch.jit.optimized_execution(False):  # as on a lane: the recorded operations as they are
                    logits, store = traced(x)
            elif traced is not None:
                logits, store = on_a_lane(traced, x)  # the tensors the hooks would have kept, without the GIL
            else:
                logits = model(on_model_device(model, x))  # (1, C), on the model's device
            if logits is not None:
                finished(logits.device)  # a GPU runs asynchronously: time the pass, not its launch
        seconds = time.perf_counter() - started
    if logits is None:
        return run_with_capture(loaded, image, sites=extra)
    return capture_of_pass(loaded, crop, x, logits, store, seconds, extra)
