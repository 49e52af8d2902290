"""ViT Lens core: load a timm Vision Transformer, capture its internals, compute the paper's analyses.

No Streamlit here: everything is usable from a notebook, a script or `python -m vit_core`.

    from vit_core import load_model, run_with_capture
    loaded = load_model("vit_base_patch16_224")  # device="auto": CUDA, then Apple MPS, then the CPU
    loaded.device  # torch.device('cuda', 0), say; the capture's arrays are on the host all the same
    cap = run_with_capture(loaded, pil_image)
    cap.logits   # float32 (C,)
    cap.pattern  # float32 (L, H, T, T)

The names below are imported on first use (PEP 562), so that `import vit_core.settings` (the server's launcher
reads a setting before anything heavy loads) and `vit-lens --help` don't pay for torch and timm. Importing
vit_core changes nothing in the process: entry points set threads and the like themselves (`vit_core.runtime`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {  # name -> the module that defines it
    "Capture": "capture", "preprocess": "capture", "run_with_capture": "capture",
    "DeviceError": "runtime.devices", "describe_device": "runtime.devices", "on_model_device": "runtime.devices",
    "resolve_device": "runtime.devices",
    "CaptureError": "errors", "ImageError": "errors", "ModelError": "errors", "OfflineError": "errors",
    "ViTLensError": "errors", "WeightsError": "errors",
    "recording_hooks_on": "hooks",
    "hub_reachable": "loading.create",
    "DecodedImage": "images", "decode_image": "images", "load_image": "images",
    "DEFAULT_MODEL": "loading", "TEACHING_MODEL": "loading", "load_model": "loading",
    "Geometry": "loading.model", "LoadedModel": "loading.model",
}
_SUBMODULES = ("analyses", "concepts", "dataset", "explain", "export", "settings")

__all__ = [  # _PUBLIC and _SUBMODULES, spelled out for linters and `from vit_core import *`
    "analyses", "Capture", "CaptureError", "concepts", "dataset", "decode_image", "DecodedImage", "DEFAULT_MODEL",
    "describe_device", "DeviceError", "explain", "export", "Geometry", "hub_reachable", "ImageError", "load_image",
    "load_model", "LoadedModel", "ModelError", "OfflineError", "on_model_device", "preprocess", "recording_hooks_on",
    "resolve_device", "run_with_capture", "settings", "TEACHING_MODEL", "ViTLensError", "WeightsError",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from . import analyses, concepts, dataset, explain, export, settings
    from .capture import Capture, preprocess, run_with_capture
    from .errors import CaptureError, ImageError, ModelError, OfflineError, ViTLensError, WeightsError
    from .hooks import recording_hooks_on
    from .images import DecodedImage, decode_image, load_image
    from .loading import DEFAULT_MODEL, TEACHING_MODEL, load_model
    from .loading.create import hub_reachable
    from .loading.model import Geometry, LoadedModel
    from .runtime.devices import DeviceError, describe_device, on_model_device, resolve_device
