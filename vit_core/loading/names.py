"""Resolving a model name: timm knows it (and its pretrained tag), and it is a Vision Transformer of the family
ViT Lens reads, checked on the architecture built on 'meta' (shapes, no memory) before anything is downloaded,
read or built for real.

`check_supported` is the family's definition: timm's VisionTransformer, one standard Attention per block whose
pattern a capture can record, a patch embedding over pixels and a fixed input size.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import timm
import torch
from timm.layers import to_2tuple
from timm.models.vision_transformer import Attention, VisionTransformer

from ..arguments import unknown_model_message
from ..errors import ModelError
from ..teaching.model import TEACHING_MODEL

_logger = logging.getLogger(__name__)


def resolve_name(name: str, model_kwargs: dict[str, Any]) -> torch.nn.Module | None:
    """Refuse a name timm doesn't know or a model outside the family, before any file is read or weights downloaded.

    Returns the architecture built on 'meta', or None where it is not built there (the bundled teaching model, an
    "hf-hub:" id, a model that can't be built on 'meta'): `create_model` checks the real model then."""
    if name.startswith("hf-hub:"):
        check_hub_id(name)
        return None
    if name == TEACHING_MODEL:
        return None
    _check_name(name)
    return _probe_family(name, model_kwargs)


# A hub repository id as the hub itself allows one (huggingface_hub's validate_repo_id): an optional owner and a name
# of letters, digits, '-', '_' and '.', at most 96 characters, no '--' or '..'; timm takes an '@revision' after it.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$", re.ASCII)


def check_hub_id(name: str) -> None:
    """Refuse an "hf-hub:" name that is no hub repository id (`hf-hub:../../etc/passwd`) in one sentence, before
    timm or huggingface_hub sees it (each would raise its own error, or build a path from it)."""
    hub_id = name[len("hf-hub:"):]
    repo = hub_id.split("@", 1)[0]
    if (not _HUB_ID.match(hub_id) or len(repo) > 96 or ".." in hub_id or "--" in repo
            or repo.endswith((".", "-"))):
        raise ModelError(f"{name[:120]!r} is not a Hugging Face hub id: write hf-hub:OWNER/NAME (letters, digits, "
                         "'-', '_' and '.'), e.g. hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k.")


def _check_name(name: str) -> None:
    """Refuse a name timm doesn't know, or a pretrained tag (`arch.tag`) that is not one of the architecture's."""
    arch, tag = timm.models.split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ModelError(unknown_model_message(name, set(timm.list_models())))
    if tag:  # timm.is_model ignores the tag, and create_model raises a RuntimeError for one it doesn't know
        tags = [known.split(".", 1)[1] for known in timm.list_pretrained(f"{arch}.*")]
        if tag not in tags:
            listed = f"its tags are {', '.join(tags[:6])}{', ...' if len(tags) > 6 else ''}" if tags else "it has none"
            raise ModelError(f"timm has no pretrained tag {tag!r} for {arch} ({listed}).")


def _probe_family(name: str, model_kwargs: dict[str, Any]) -> torch.nn.Module | None:
    """Refuse a non-ViT before building it for real (a resnet or swin costs nothing on 'meta').

    Returns the architecture built on 'meta' (its tensors' shapes, no memory), or None if it can't be
    built there: the real model is checked then."""
    try:
        with torch.device("meta"):
            probe = timm.create_model(name, pretrained=False, **model_kwargs)
    except (TypeError, ValueError, AssertionError, RuntimeError, NotImplementedError) as e:
        _logger.debug("meta probe of %s failed (%s); checking after the real build", name, e)
        return None
    check_supported(probe, name)
    return probe


def check_supported(model: torch.nn.Module, name: str) -> None:
    """Refuse models outside timm's VisionTransformer family, or with attention we can't capture."""
    if not isinstance(model, VisionTransformer):
        raise ModelError(
            f"{name} is not a Vision Transformer of timm's VisionTransformer family "
            f"(it is a {type(model).__name__}). ViT Lens shows ViT, DeiT, SigLIP-style and register "
            "models such as vit_base_patch16_224, deit_small_distilled_patch16_224 or vit_small_patch16_224."
        )
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if attn is None:  # timm's parallel blocks (ParallelThingsBlock, ParallelScalingBlock) fuse or split it
            raise ModelError(f"{name}: block {i} is a {type(block).__name__}, with no single attention module whose "
                             "pattern ViT Lens can capture. Choose a standard ViT.")
        if not isinstance(attn, Attention) or not hasattr(attn, "fused_attn") or not hasattr(attn, "attn_drop"):
            # e.g. DiffAttention: two softmax patterns per head and their difference, not one distribution per head
            raise ModelError(f"{name}: block {i} uses {type(attn).__name__}, not timm's standard Attention, so its "
                             "attention is not one pattern per head that ViT Lens can capture. Choose a standard ViT.")
    if not _embeds_pixel_patches(model.patch_embed):
        raise ModelError(f"{name} embeds the feature map of a CNN backbone ({type(model.patch_embed).__name__}, a hybrid "
                         "ViT), not patches of pixels: ViT Lens's patch geometry and filters need a plain patch embedding.")
    if getattr(model.patch_embed, "dynamic_img_pad", False) or getattr(model, "dynamic_img_size", False):
        raise ModelError(f"{name} uses a dynamic image size; ViT Lens needs a fixed input size.")


def _embeds_pixel_patches(patch_embed: torch.nn.Module) -> bool:
    """A patch embedding that cuts the RGB image into patches: one Conv2d over 3 channels with kernel = stride =
    patch size (timm's PatchEmbed). A hybrid's HybridEmbed runs a CNN first (its `patch_size` is then (1, 1) on the
    feature map, not pixels), which would make distances in pixels and the filter view wrong."""
    proj = getattr(patch_embed, "proj", None)
    return (isinstance(proj, torch.nn.Conv2d) and proj.in_channels == 3 and getattr(patch_embed, "backbone", None) is None
            and tuple(proj.kernel_size) == tuple(proj.stride) == tuple(to_2tuple(patch_embed.patch_size)))
