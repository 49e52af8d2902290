"""Loading any Vision Transformer of timm's family, with its geometry, preprocessing and labels.

`load_model` is the one way in. It wraps timm and never edits its modules: weights come through
timm's own pretrained machinery (`vit_core.hub`: hub cache first, so a populated cache works with no
network), a local file loaded safely (`vit_core.weights`), the bundled teaching model, or an explicit
random init. Labels come from `vit_core.labels`; what the result holds is `vit_core.model`.
"""

from __future__ import annotations

import difflib
import logging
import time
from pathlib import Path
from typing import Any

import timm
import timm.data
import torch
from timm.models.vision_transformer import Attention, VisionTransformer

from .devices import resolve_device
from .errors import ModelError, WeightsError
from .hub import create_pretrained, timm_create
from .labels import imagenet_labels, labels_beside, read_labels
from .model import LoadedModel, pair, read_geometry
from .teaching.model import BUNDLED_DIR, TEACHING_MODEL, load_shapes_vit  # importing it registers the Shapes ViT
from .weights import (
    PICKLE_SUFFIXES,
    check_state_dict,
    check_weights_file,
    head_classes,
    load_weights_into,
    read_state_dict,
)

_logger = logging.getLogger(__name__)

DEFAULT_MODEL = "vit_base_patch16_224"
TEACHING_MODEL_DIR = BUNDLED_DIR  # package data: vit_core/assets/shapes_vit


# ----------------------------------------------------------------------------------------------
# Family checks


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
            and tuple(proj.kernel_size) == tuple(proj.stride) == pair(patch_embed.patch_size))


def _check_name(name: str) -> None:
    """Refuse a name timm doesn't know, or a pretrained tag (`arch.tag`) that is not one of the architecture's."""
    arch, tag = timm.models.split_model_name_tag(name)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models("*vit*") + timm.list_models("deit*"), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ModelError(f"timm has no model called {name!r}.{hint}")
    if tag:  # timm.is_model ignores the tag, and create_model raises a RuntimeError for one it doesn't know
        tags = [known.split(".", 1)[1] for known in timm.list_pretrained(f"{arch}.*")]
        if tag not in tags:
            listed = f"its tags are {', '.join(tags[:6])}{', ...' if len(tags) > 6 else ''}" if tags else "it has none"
            raise ModelError(f"timm has no pretrained tag {tag!r} for {arch} ({listed}).")


# ----------------------------------------------------------------------------------------------
# The bundled teaching model


def _load_teaching_model() -> tuple[VisionTransformer, tuple[str, ...]]:
    """The bundled Shapes ViT through its timm registration (vit_core.teaching.model), with its label names."""
    if not teaching_model_available():
        raise ModelError("The bundled teaching model is missing from this installation (vit_core/assets/shapes_vit); "
                         "retrain it (see its MODEL_CARD.md).")  # the package's folder, not the server's path
    try:
        model, _ = load_shapes_vit(TEACHING_MODEL_DIR)
    except RuntimeError as e:  # timm's strict load: missing / unexpected keys or a shape mismatch
        raise WeightsError(f"The bundled teaching model's weights don't fit its config: {e}") from e
    return model, tuple(model.pretrained_cfg["label_names"])


# ----------------------------------------------------------------------------------------------
# The entry point


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
        .npz); the head size is taken from the file. Overrides `pretrained`.
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
    label_names: tuple[str, ...] | None = None
    checked = False  # check_supported has passed for this architecture
    if name == TEACHING_MODEL:
        model, label_names = _load_teaching_model()
        source = f"bundled: {TEACHING_MODEL_DIR.name}"
    else:
        probe = None
        if not name.startswith("hf-hub:"):
            _check_name(name)
            probe = _probe_family(name, model_kwargs)  # before any file is read or weights downloaded
            checked = probe is not None
        if weights is not None:
            weights = Path(weights)
            # Declared shapes first (headers only), then read once (a file can be 350 MB): the head
            # size comes from it, then its tensors go in.
            check_weights_file(weights, probe)
            state = None if weights.suffix.lower() == ".npz" else read_state_dict(weights)
            if weights.suffix.lower() in PICKLE_SUFFIXES:
                check_state_dict(weights, state, probe)
            classes = head_classes(state) if state is not None else None
            if classes is not None:
                model_kwargs.setdefault("num_classes", classes)
            model = _random_init(name, seed, model_kwargs)
            if not checked:  # refuse a non-ViT before trying its weights: the clearer message
                check_supported(model, name)
                checked = True
            load_weights_into(model, weights, state, name)
            source = f"file: {weights.name}"
            label_names = labels_beside(weights)
        elif pretrained:
            model, source = create_pretrained(name, **model_kwargs)
        else:
            model = _random_init(name, seed, model_kwargs)
            source = f"random init (seed {seed})"
    if not checked:
        check_supported(model, name)
    model.eval()

    if labels is not None:
        label_names = read_labels(labels) if isinstance(labels, (str, Path)) else tuple(labels)
    elif label_names is None:
        label_names = imagenet_labels(model)  # a guess from the pretrained config's class count, not the head's:
        if label_names is not None and len(label_names) != model.num_classes:  # built with num_classes=0, say
            label_names = None
    if label_names is not None and len(label_names) != model.num_classes:
        raise WeightsError(
            f"The labels list {len(label_names)} classes but the model's head has {model.num_classes}: "
            "wrong label file or wrong class count."
        )

    geometry = read_geometry(model)
    data_config = timm.data.resolve_model_data_config(model)
    # The pretrained config keeps its own size when a model is built at another (img_size=...):
    # the model's patch embedding is the authority.
    data_config["input_size"] = (3, *geometry.img_size)
    model.to(target_device)  # in place: the module is the one checked above, its parameters now on the device
    loaded = LoadedModel(model, name, source, geometry, data_config, label_names)
    _logger.info("loaded %s (%s) on %s in %.1f s", name, source, loaded.device_name, time.perf_counter() - started)
    return loaded


def _random_init(name: str, seed: int, model_kwargs: dict[str, Any]) -> torch.nn.Module:
    """timm's random init of `name`, deterministic under `seed`, leaving the global RNG as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return timm_create(name, pretrained=False, **model_kwargs)


def _probe_family(name: str, model_kwargs: dict[str, Any]) -> torch.nn.Module | None:
    """Refuse a non-ViT before building it for real (a resnet or swin costs nothing on 'meta').

    Returns the architecture built on 'meta' (its tensors' shapes, no memory), or None if it can't be
    built there: the caller checks the real model then."""
    try:
        with torch.device("meta"):
            probe = timm.create_model(name, pretrained=False, **model_kwargs)
    except (TypeError, ValueError, AssertionError, RuntimeError, NotImplementedError) as e:
        _logger.debug("meta probe of %s failed (%s); checking after the real build", name, e)
        return None
    check_supported(probe, name)
    return probe


def teaching_model_available() -> bool:
    return (TEACHING_MODEL_DIR / "model.safetensors").is_file()


