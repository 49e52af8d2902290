"""Loading any Vision Transformer of timm's family, with its geometry, preprocessing and labels.

`load_model` is the one way in, and it runs in a straight line, each step a module of this package: resolve the
name (`names`: timm knows it, and it is of the family, checked on 'meta'), create the model (`create`: the bundled
teaching model, timm's pretrained weights with the hub cache first, or an explicit random init), load and check a
weights file (`weights`: read safely, its declarations checked first), name the classes (`labels`), and read the
geometry (`model`, which also holds `LoadedModel`, what every pass takes). timm's modules are wrapped, never edited.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import timm.data
import torch

from ..errors import ModelError
from ..runtime.devices import resolve_device
from ..teaching.model import TEACHING_MODEL
from .create import create_model, teaching_model_available
from .labels import model_labels
from .model import LoadedModel, read_geometry
from .names import resolve_name
from .weights import load_weights

__all__ = ["DEFAULT_MODEL", "TEACHING_MODEL", "load_model", "teaching_model_available"]

_logger = logging.getLogger(__name__)

DEFAULT_MODEL = "vit_base_patch16_224"


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    weights: str | Path | None = None,
    pretrained: bool = True,
    labels: str | Path | tuple[str, ...] | list[str] | None = None,
    seed: int = 0,
    device: str | torch.device | None = "auto",
    **model_kwargs: Any,
) -> LoadedModel:
    """Load a Vision Transformer by name, ready for `run_with_capture`.

    name: a timm model name (optionally with a pretrained tag), an "hf-hub:" id, or TEACHING_MODEL.
    weights: a local weights file (.safetensors, .pth/.pt/.bin loaded with weights_only, or a JAX
        .npz); the head size is taken from the file. Overrides `pretrained`. Refused (ModelError) with
        TEACHING_MODEL, which has its own weights: a file is never ignored without a word.
    pretrained: False for an explicit random init (deterministic under `seed`).
    labels: class names, or a label file (txt: one per line; json). Default: a label file beside
        the weights, else ImageNet names when the head has 1000/21k classes, else indices.
    device: where the model runs: "auto" (CUDA, then Apple MPS, then the CPU), "cpu", "cuda", "cuda:N",
        "mps" or a torch.device. The model is built and its weights checked and loaded on the CPU, then moved.
    model_kwargs: passed to timm.create_model (e.g. depth=2 for a small test model).
    Raises ModelError, WeightsError or OfflineError with a message for the user, DeviceError for a device
    this machine doesn't have (before anything is read or built).
    """
    started = time.perf_counter()
    target_device = resolve_device(device)
    if weights is not None and name == TEACHING_MODEL:  # never ignored without a word
        raise ModelError(f"{TEACHING_MODEL} comes with its own weights and takes no weights file; to load a file, name "
                         "the timm architecture it was trained for (e.g. vit_tiny_patch16_224).")
    weights_file = Path(weights) if weights is not None else None
    probe = resolve_name(name, model_kwargs)
    model, source = create_model(name, probe, pretrained=pretrained and weights_file is None, seed=seed, **model_kwargs)
    if weights_file is not None:
        load_weights(model, weights_file, name, keep_head="num_classes" in model_kwargs)
        source = f"file: {weights_file.name}"
    label_names = model_labels(model, name, labels, weights_file)
    geometry = read_geometry(model)
    data_config = timm.data.resolve_model_data_config(model)
    # The pretrained config keeps its own size when a model is built at another (img_size=...):
    # the model's patch embedding is the authority.
    data_config["input_size"] = (3, *geometry.img_size)
    model.to(target_device)  # in place: the module is the one checked above, its parameters now on the device
    loaded = LoadedModel(model, name, source, geometry, data_config, label_names)
    _logger.info("loaded %s (%s) on %s in %.1f s", name, source, loaded.device_name, time.perf_counter() - started)
    return loaded
