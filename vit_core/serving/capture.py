"""The class server's capture: `run_with_capture`'s result, with passes at once and a forward without the GIL."""

from __future__ import annotations

import time

import torch
from PIL import Image

from ..capture import Capture, capture_of_pass, preprocess
from ..devices import finished, full_float32, on_model_device
from ..model import LoadedModel
from .passes import capture_pass
from .traced import on_a_lane, traced_forward


def serve_capture(loaded: LoadedModel, image: Image.Image) -> Capture:
    """The same `Capture` as `vit_core.run_with_capture(loaded, image)`, bit for bit, run the server's way: up to
    `parallel_passes()` passes of one model at once, each recording only its own forward (`serving.passes`), and
    on the CPU through the model's trace on a low-priority forward lane when tracing is on (`serving.traced`)."""
    model = loaded.model
    crop, x = preprocess(loaded, image)  # (H, W, 3), (1, 3, H, W) on the host
    store: dict[str, list[torch.Tensor]] = {}
    with capture_pass(loaded, store):
        with torch.inference_mode(), full_float32(loaded.device):
            traced = traced_forward(loaded, x, store)  # the model's first pass records the trace
            started = time.perf_counter()
            if traced is not None:
                logits, store = on_a_lane(traced, x)  # the tensors the hooks would have kept, without the GIL
            else:
                logits = model(on_model_device(model, x))  # (1, C), on the model's device
            finished(logits.device)  # a GPU runs asynchronously: time the pass, not its launch
        seconds = time.perf_counter() - started
    return capture_of_pass(loaded, crop, x, logits, store, seconds)
