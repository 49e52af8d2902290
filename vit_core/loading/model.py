"""The model as ViT Lens holds it: its token geometry, its preprocessing, and the arrays read off its weights.

`Geometry` is read from the model's own attributes (docs/spec/analyses.md: never hard-code 197, 14 or 1);
`LoadedModel` is what `vit_core.loading.load_model` returns and every pass takes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import timm.data
import torch
from timm.data.transforms import MaybePILToTensor
from timm.models.vision_transformer import VisionTransformer
from torchvision import transforms as T

from ..errors import ImageError
from ..images import DRAFT_MIN_SIDE, MAX_PIXELS
from ..runtime.devices import describe_device, to_host


@dataclass(frozen=True)
class Geometry:
    """Token geometry read from the model (analyses.md: never hard-code 197, 14 or 1)."""

    img_size: tuple[int, int]  # (H, W) of the input the model was built for
    patch_size: tuple[int, int]  # (ph, pw)
    grid: tuple[int, int]  # (gh, gw)
    prefix_names: tuple[str, ...]  # e.g. ("CLS",), ("CLS", "DIST"), ("CLS", "REG1", ..), ()
    no_embed_class: bool  # position embedding has no rows for prefix tokens
    has_pos_embed: bool  # a learned absolute position embedding exists
    num_layers: int
    num_heads: int
    embed_dim: int
    num_classes: int  # 0: no classifier head, the model outputs its pooled features (D' of them)

    @property
    def num_prefix_tokens(self) -> int:
        return len(self.prefix_names)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_patches

    @property
    def has_class_token(self) -> bool:
        return "CLS" in self.prefix_names

    @property
    def center_patch(self) -> int:
        """Index among the patches (0..N-1) of the patch at the grid's centre: row gh // 2, column gw // 2."""
        return (self.grid[0] // 2) * self.grid[1] + self.grid[1] // 2

    def token_name(self, index: int) -> str:
        """'CLS', 'DIST', 'REG1' for prefix tokens, 'patch 17 (row 1, col 3)' for patches."""
        if index < self.num_prefix_tokens:
            return self.prefix_names[index]
        k = index - self.num_prefix_tokens
        return f"patch {k} (row {k // self.grid[1]}, col {k % self.grid[1]})"


class ModelLock(Protocol):
    """What `LoadedModel.lock` is: threading.Lock's methods (not re-entrant)."""

    def acquire(self) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc_info: object) -> None: ...


@dataclass(frozen=True)
class LoadedModel:
    """A timm ViT in eval mode with everything needed to run and explain it."""

    model: VisionTransformer
    name: str  # as asked for, e.g. "vit_base_patch16_224" or "vit-lens/shapes-vit"
    weights: str  # where the weights came from, for people: "hub: timm/...", "file: ft.safetensors", "random init (seed 0)"
    geometry: Geometry
    data_config: dict[str, Any]  # timm's resolved preprocessing: input_size, interpolation, crop_pct, mean, std
    labels: tuple[str, ...] | None  # class names in head order, or None (indices are shown)
    # Forwards on a shared model are serialised: capture flips module flags and registers hooks. A plain lock; a
    # server sharing the model among many users may put one of its own here (vit_core.serving.shared_model).
    lock: ModelLock = field(default_factory=threading.Lock, repr=False, compare=False)
    # timm's eval transform for `data_config`, built once here and split where the crop becomes a tensor:
    crop_transform: GuardedCrop = field(init=False, repr=False, compare=False)  # PIL RGB -> PIL crop (H, W)
    tensor_transform: T.Compose = field(init=False, repr=False, compare=False)  # PIL crop -> float32 (3, H, W), normalised

    def __post_init__(self) -> None:
        crop, to_tensor = split_eval_transform(self.data_config)
        object.__setattr__(self, "crop_transform", GuardedCrop(crop, self.data_config))  # frozen: set once
        object.__setattr__(self, "tensor_transform", to_tensor)

    def label(self, index: int) -> str:
        """The class name of output `index`; for a model without a classifier head (num_classes 0: DINOv2 or a
        SigLIP image tower as published), whose outputs are its pooled features, 'feature 17'."""
        if self.labels and index < len(self.labels):
            return self.labels[index]
        return f"feature {index}" if self.geometry.num_classes == 0 else f"class {index}"

    @property
    def decode_min_side(self) -> int:
        """The shorter side a large JPEG keeps when decoded at reduced size for this model
        (images.draft_size): images.DRAFT_MIN_SIDE, or the side timm's eval transform resizes the
        shorter side to where that is more (input / crop_pct: 896 for SigLIP-896), so no model's
        input is upsampled from a reduced decode."""
        height, width = self.data_config["input_size"][1:]
        resize = math.ceil(max(height, width) / (self.data_config.get("crop_pct") or 1.0))
        return max(DRAFT_MIN_SIDE, resize)

    @property
    def multiply_adds(self) -> int:
        """About the multiply-adds of one image's forward: parameters x tokens (the Shapes ViT about 0.3 G,
        ViT-Ti/16 1.1 G, ViT-S/16 4.3 G, ViT-B/16 17 G). What decides how much each operator's Python weighs."""
        return sum(p.numel() for p in self.model.parameters()) * self.geometry.num_tokens

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are, read from the model itself (so it stays true if someone moves it):
        its inputs are made there, its results copied back to the host."""
        return next(self.model.parameters()).device

    @property
    def device_name(self) -> str:
        """The device for people: 'CPU', 'CUDA 0 (NVIDIA H100 80GB HBM3)', 'Apple MPS'."""
        return describe_device(self.device)


# The largest picture the model's resize may make before its crop: the largest file decoded (images.MAX_PIXELS),
# so a preprocess never holds more than a decode did. A 400,000 x 10 PNG (12 KB, 4 MP) would be enlarged to
# 9,920,000 x 248 (2.5 GP, 9.8 GB) by a 224-pixel model's resize; a 4:3 photo becomes 331 x 248.
MAX_RESIZED_PIXELS = MAX_PIXELS


def resized_size(data_config: dict[str, Any], size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) that timm's eval transform for `data_config` resizes a picture of `size` (width, height) to
    before its crop (timm.data.transforms_factory.transforms_imagenet_eval): each side of the input / crop_pct,
    then 'squash' takes that size, 'border' fits the picture inside it, 'center' (the default) scales the shorter
    side to it (torchvision's Resize(int) when square: the longer side truncated; timm's ResizeKeepRatio: rounded)."""
    height, width = data_config["input_size"][1:]
    crop_pct = data_config.get("crop_pct") or timm.data.DEFAULT_CROP_PCT
    scale_h, scale_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    w, h = size
    mode = data_config.get("crop_mode") or "center"
    if mode == "squash":
        return scale_w, scale_h
    if mode == "border":
        ratio = max(h / scale_h, w / scale_w)
        return round(w / ratio), round(h / ratio)
    if scale_h == scale_w:  # Resize(int): the shorter side to scale, the longer int(scale * long / short)
        return (scale_w, scale_w * h // w) if w <= h else (scale_h * w // h, scale_h)
    ratio = min(h / scale_h, w / scale_w)
    return round(w / ratio), round(h / ratio)


class GuardedCrop:
    """timm's eval transform up to its crop (PIL RGB -> PIL crop), refusing with ImageError a picture its resize
    would enlarge past MAX_RESIZED_PIXELS (an extreme aspect ratio). Picklable, for DataLoader workers."""

    def __init__(self, crop: T.Compose, data_config: dict[str, Any]) -> None:
        self.crop, self.data_config = crop, dict(data_config)

    def resized_size(self, size: tuple[int, int]) -> tuple[int, int]:
        return resized_size(self.data_config, size)

    def check(self, size: tuple[int, int]) -> None:
        """Raise ImageError if a picture of `size` (width, height) would be resized past MAX_RESIZED_PIXELS."""
        width, height = self.resized_size(size)
        if width * height > MAX_RESIZED_PIXELS:
            raise ImageError(f"This image is {size[0]} x {size[1]} pixels: the model would enlarge it to "
                             f"{width} x {height} before cropping; crop it closer to a square first.")

    def __call__(self, image):
        self.check(image.size)
        return self.crop(image)


def split_eval_transform(data_config: dict[str, Any]) -> tuple[T.Compose, T.Compose]:
    """timm's eval transform for `data_config` as (PIL -> PIL crop, PIL crop -> normalised tensor).

    The split is the one step that turns the PIL image into a tensor (torchvision's ToTensor, which
    timm's MaybeToTensor extends, or a PILToTensor); everything before it is geometry on PIL images.
    """
    steps = list(timm.data.create_transform(**data_config, is_training=False).transforms)
    to_tensor = [i for i, step in enumerate(steps) if isinstance(step, (T.ToTensor, T.PILToTensor, MaybePILToTensor))]
    assert len(to_tensor) == 1, f"expected one PIL -> tensor step in timm's eval transform, found {steps}"
    return T.Compose(steps[: to_tensor[0]]), T.Compose(steps[to_tensor[0]:])


# ----------------------------------------------------------------------------------------------
# Geometry


def pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, int) else (int(x[0]), int(x[1]))


def read_geometry(model: VisionTransformer) -> Geometry:
    """Token geometry of a timm VisionTransformer, from its own attributes."""
    prefix = []
    if getattr(model, "cls_token", None) is not None:
        prefix.append("CLS")
    if getattr(model, "dist_token", None) is not None:  # DeiT distilled: cls, dist, patches
        prefix.append("DIST")
    num_reg = model.reg_token.shape[1] if getattr(model, "reg_token", None) is not None else 0
    prefix += [f"REG{i + 1}" for i in range(num_reg)]
    assert len(prefix) == model.num_prefix_tokens, f"prefix {prefix} vs num_prefix_tokens {model.num_prefix_tokens}"
    patch_embed = model.patch_embed
    return Geometry(
        img_size=pair(patch_embed.img_size),
        patch_size=pair(patch_embed.patch_size),
        grid=pair(patch_embed.grid_size),
        prefix_names=tuple(prefix),
        no_embed_class=bool(model.no_embed_class),
        has_pos_embed=getattr(model, "pos_embed", None) is not None,
        num_layers=len(model.blocks),
        num_heads=model.blocks[0].attn.num_heads,
        embed_dim=model.embed_dim,
        num_classes=model.num_classes,
    )


# ----------------------------------------------------------------------------------------------
# Arrays read off the weights (per model, not per image)


def patch_embed_weight(loaded: LoadedModel) -> np.ndarray:
    """The patch-embedding Conv2d weight: (D, C, ph, pw) float32."""
    return to_host(loaded.model.patch_embed.proj.weight)


def patch_embed_bias(loaded: LoadedModel) -> np.ndarray | None:
    bias = loaded.model.patch_embed.proj.bias
    return None if bias is None else to_host(bias)


def pos_embed_rows(loaded: LoadedModel) -> np.ndarray | None:
    """The learned absolute position embedding (T_pe, D), or None if the model has none."""
    pos = getattr(loaded.model, "pos_embed", None)
    if pos is None or not isinstance(pos, torch.nn.Parameter):
        return None
    return to_host(pos)[0]  # (1, T_pe, D) -> (T_pe, D)
