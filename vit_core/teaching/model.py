"""The Shapes ViT registered with timm, and the one loader of a Shapes ViT model directory.

After ``import vit_core.teaching.model`` the bundled model is a timm model like any other::

    model = timm.create_model(SHAPES_VIT_TIMM_NAME, pretrained=True)   # the bundled weights, offline
    data_config = timm.data.resolve_model_data_config(model)          # its preprocessing
    labels = model.pretrained_cfg["label_names"]

A model directory (the bundled ``vit_core/assets/shapes_vit`` or a freshly trained one) holds
``config.json`` (``model_args``: the VisionTransformer keyword arguments; ``pretrained_cfg``: the
preprocessing; both written by training, the single source of truth), ``model.safetensors`` and
``labels.txt``. Only timm is imported here, so ``vit_core`` can import this module for the registration.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer

SHAPES_VIT_TIMM_NAME = "vit_shapes_patch8_96"  # timm's name
TEACHING_MODEL = "vit-lens/shapes-vit"  # the name users see and `vit_core.load_model` takes
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "assets" / "shapes_vit"  # package data
WEIGHTS_FILE = "model.safetensors"


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a model directory: {"name", "model_args", "pretrained_cfg", "train"}."""
    return json.loads((Path(model_dir) / "config.json").read_text())


def read_label_names(model_dir: str | Path) -> tuple[str, ...]:
    """labels.txt: one class name per line, in the head's index order."""
    return tuple(line for line in (Path(model_dir) / "labels.txt").read_text().splitlines() if line)


def pretrained_cfg_of(model_dir: str | Path) -> dict[str, Any]:
    """timm's pretrained cfg for the weights in ``model_dir``: file, preprocessing, classes and their names."""
    config = read_config(model_dir)
    names = read_label_names(model_dir)
    assert len(names) == config["model_args"]["num_classes"], (len(names), config["model_args"]["num_classes"])
    preprocessing = {k: tuple(v) if isinstance(v, list) else v for k, v in config["pretrained_cfg"].items()}
    return {
        "file": str(Path(model_dir) / WEIGHTS_FILE),
        **preprocessing,  # input_size, mean, std, crop_pct, interpolation, crop_mode
        "num_classes": len(names),
        "label_names": names,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "same as ViT Lens",
        "description": "ViT Lens teaching model, trained in this repository on procedurally drawn shapes",
    }


def _bundled_model_args() -> dict[str, Any]:
    return read_config(BUNDLED_DIR)["model_args"]


def _bundled_pretrained_cfg() -> dict[str, Any]:
    """The default cfg points at the bundled weights; without them (a checkout that deleted them to
    retrain) the name is still registered, and only ``pretrained=True`` fails."""
    return pretrained_cfg_of(BUNDLED_DIR) if (BUNDLED_DIR / "config.json").is_file() else {}


default_cfgs = generate_default_cfgs({SHAPES_VIT_TIMM_NAME: _bundled_pretrained_cfg()})  # read by register_model


@register_model
def vit_shapes_patch8_96(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    """The Shapes ViT: the bundled config.json's architecture; keyword arguments override it."""
    model_args = {**_bundled_model_args(), **kwargs}
    return build_model_with_cfg(VisionTransformer, SHAPES_VIT_TIMM_NAME, pretrained, **model_args)


assert vit_shapes_patch8_96.__name__ == SHAPES_VIT_TIMM_NAME  # register_model registers the function's name


def load_shapes_vit(model_dir: str | Path = BUNDLED_DIR) -> tuple[VisionTransformer, dict[str, Any]]:
    """THE loader: a Shapes ViT directory -> (model in eval mode, its config.json).

    Goes through timm's ``create_model(pretrained=True)`` with the directory's weights file and
    preprocessing as the pretrained cfg, so the model carries ``pretrained_cfg`` (incl. ``label_names``)
    like any timm model. The load is strict: a state_dict that doesn't fit the architecture raises
    RuntimeError (missing or unexpected keys, or a shape mismatch).
    """
    config = read_config(model_dir)
    model = timm.create_model(
        SHAPES_VIT_TIMM_NAME,
        pretrained=True,
        pretrained_cfg_overlay=pretrained_cfg_of(model_dir),
        **config["model_args"],
    )
    return model.eval(), config


def batch_transform(data_config: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """timm's eval transform for a batch of images at the model's input size, as tensor ops.

    ``data_config`` is ``timm.data.resolve_model_data_config(model)``. At the native size with
    crop_pct 1, timm's resize and centre crop do nothing, leaving ToTensor + Normalize: uint8
    (B, H, W, 3) or (B, 3, H, W) -> float32 (B, 3, H, W). tests/test_teaching_model.py checks that
    this equals ``timm.data.create_transform(**data_config)`` on PIL images.
    """
    _, height, width = data_config["input_size"]
    assert data_config["crop_pct"] == 1.0, "a crop would change the image: use timm's transform on PIL images"
    mean = torch.tensor(data_config["mean"], dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(data_config["std"], dtype=torch.float32).view(1, 3, 1, 1)

    def transform(images: torch.Tensor) -> torch.Tensor:
        if images.shape[-1] == 3:
            images = images.permute(0, 3, 1, 2)  # (B, H, W, 3) -> (B, 3, H, W)
        assert images.dtype == torch.uint8 and images.shape[-2:] == (height, width), (images.dtype, images.shape)
        x = images.float().div(255.0)  # ToTensor
        return (x - mean.to(x.device)) / std.to(x.device)  # Normalize

    return transform
