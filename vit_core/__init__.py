"""ViT Lens core: load a timm Vision Transformer, capture its internals, compute the paper's analyses.

No Streamlit here: everything is usable from a notebook, a script or `python -m vit_core`.

    from vit_core import load_model, run_with_capture
    loaded = load_model("vit_base_patch16_224")  # device="auto": CUDA, then Apple MPS, then the CPU
    loaded.device  # torch.device('cuda', 0), say; the capture's arrays are on the host all the same
    cap = run_with_capture(loaded, pil_image)
    cap.logits   # float32 (C,)
    cap.pattern  # float32 (L, H, T, T)
"""

import os

# numpy's OpenBLAS threads spin against torch's on a small machine: measured on 2 cores, the filter
# PCA took 1.8-2.9 s with 2 BLAS threads and 0.4 s with 1. The forward pass runs in torch, whose
# own thread pool is set by runtime.configure_threads. Takes effect only if numpy is not imported
# yet (the CLI, a notebook importing vit_core first); scripts/dashboard and scripts/test export it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from . import analyses
from .capture import Capture, on_model_device, preprocess, recording_hooks_on, run_with_capture
from .devices import DeviceError, describe_device, resolve_device
from .errors import CaptureError, ImageError, ModelError, OfflineError, ViTLensError, WeightsError
from .images import DecodedImage, decode_image, load_image
from .loading import DEFAULT_MODEL, TEACHING_MODEL, Geometry, LoadedModel, hub_reachable, load_model

__all__ = [
    "analyses", "Capture", "CaptureError", "DecodedImage", "DEFAULT_MODEL", "DeviceError", "Geometry", "ImageError",
    "LoadedModel", "ModelError", "OfflineError", "TEACHING_MODEL", "ViTLensError", "WeightsError",
    "decode_image", "describe_device", "hub_reachable", "load_image", "load_model", "on_model_device", "preprocess",
    "recording_hooks_on", "resolve_device", "run_with_capture",
]
