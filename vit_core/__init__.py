"""ViT Lens core: load a timm Vision Transformer, capture its internals, compute the paper's analyses.

No Streamlit here: everything is usable from a notebook, a script or `python -m vit_core`.

    from vit_core import load_model, run_with_capture
    loaded = load_model("vit_base_patch16_224")
    cap = run_with_capture(loaded, pil_image)
    cap.logits   # float32 (C,)
    cap.pattern  # float32 (L, H, T, T)
"""

from . import analyses
from .capture import Capture, hook_count, preprocess, run_with_capture
from .errors import CaptureError, ImageError, ModelError, OfflineError, ViTLensError, WeightsError
from .images import DecodedImage, decode_image, load_image
from .loading import DEFAULT_MODEL, TEACHING_MODEL, Geometry, LoadedModel, hub_reachable, load_model

__all__ = [
    "analyses", "Capture", "CaptureError", "DecodedImage", "DEFAULT_MODEL", "Geometry", "ImageError",
    "LoadedModel", "ModelError", "OfflineError", "TEACHING_MODEL", "ViTLensError", "WeightsError",
    "decode_image", "hook_count", "hub_reachable", "load_image", "load_model", "preprocess", "run_with_capture",
]
