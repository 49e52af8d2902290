"""Loading any Vision Transformer of timm's family, with its geometry, preprocessing and labels.

`load_model` is the one way in. It wraps timm and never edits its modules: weights come through
timm's own pretrained machinery (hub cache first, so a populated cache works with no network), a
local file loaded safely, the bundled teaching model, or an explicit random init.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import timm.data
import torch
from timm.data.transforms import MaybePILToTensor
from timm.models.vision_transformer import Attention, VisionTransformer
from torchvision import transforms as T

from .devices import describe_device, resolve_device
from .errors import ModelError, OfflineError, WeightsError
from .images import DRAFT_MIN_SIDE
from .teaching.model import BUNDLED_DIR, load_shapes_vit  # importing it registers the Shapes ViT with timm

_logger = logging.getLogger(__name__)

DEFAULT_MODEL = "vit_base_patch16_224"
TEACHING_MODEL = "vit-lens/shapes-vit"
TEACHING_MODEL_DIR = BUNDLED_DIR  # package data: vit_core/assets/shapes_vit
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
PICKLE_SUFFIXES = (".pth", ".pt", ".bin")  # torch.save checkpoints: their tensors are checked once read
HUB_PROBE_TIMEOUT_S = 3.0
# Limits on what a weights or label file may make us build, checked before anything is built: a file
# declares its shapes, and a tiny file declaring a 4M-class head would otherwise cost gigabytes.
MAX_CLASSES = 100_000  # ImageNet-21k has 21,843; the head of a 100k-class ViT-B is 300 MB
MAX_LABEL_FILE_BYTES = 8 * 2**20  # 100k names of 80 characters
SAFETENSORS_MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
NPZ_MAX_MEMBERS = 4096  # a ViT-H JAX checkpoint with its optimizer state has about 1,500 arrays
# The item sizes of safetensors' dtypes (its spec), to check declared shapes against the bytes present.
_SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


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


@dataclass(frozen=True)
class LoadedModel:
    """A timm ViT in eval mode with everything needed to run and explain it."""

    model: VisionTransformer
    name: str  # as asked for, e.g. "vit_base_patch16_224" or "vit-lens/shapes-vit"
    weights: str  # where the weights came from, for people: "hub: timm/...", "file: ft.safetensors", "random init (seed 0)"
    geometry: Geometry
    data_config: dict[str, Any]  # timm's resolved preprocessing: input_size, interpolation, crop_pct, mean, std
    labels: tuple[str, ...] | None  # class names in head order, or None (indices are shown)
    # Forwards on a shared model are serialised: capture flips module flags and registers hooks.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # timm's eval transform for `data_config`, built once here and split where the crop becomes a tensor:
    crop_transform: T.Compose = field(init=False, repr=False, compare=False)  # PIL RGB -> PIL crop (H, W)
    tensor_transform: T.Compose = field(init=False, repr=False, compare=False)  # PIL crop -> float32 (3, H, W), normalised

    def __post_init__(self) -> None:
        crop, to_tensor = split_eval_transform(self.data_config)
        object.__setattr__(self, "crop_transform", crop)  # frozen dataclass: set once, at construction
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
    def device(self) -> torch.device:
        """Where the model's parameters are, read from the model itself (so it stays true if someone moves it):
        its inputs are made there, its results copied back to the host."""
        return next(self.model.parameters()).device

    @property
    def device_name(self) -> str:
        """The device for people: 'CPU', 'CUDA 0 (NVIDIA H100 80GB HBM3)', 'Apple MPS'."""
        return describe_device(self.device)


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
# Geometry and family checks


def _pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
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
        img_size=_pair(patch_embed.img_size),
        patch_size=_pair(patch_embed.patch_size),
        grid=_pair(patch_embed.grid_size),
        prefix_names=tuple(prefix),
        no_embed_class=bool(model.no_embed_class),
        has_pos_embed=getattr(model, "pos_embed", None) is not None,
        num_layers=len(model.blocks),
        num_heads=model.blocks[0].attn.num_heads,
        embed_dim=model.embed_dim,
        num_classes=model.num_classes,
    )


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
            and tuple(proj.kernel_size) == tuple(proj.stride) == _pair(patch_embed.patch_size))


def _check_name(name: str) -> None:
    if timm.is_model(name):
        return
    arch, _ = timm.models.split_model_name_tag(name)
    if timm.is_model(arch):
        return
    close = difflib.get_close_matches(arch, timm.list_models("*vit*") + timm.list_models("deit*"), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ModelError(f"timm has no model called {name!r}.{hint}")


# ----------------------------------------------------------------------------------------------
# Hub access: fail within seconds when offline, use the cache when it holds the weights


def _probe(url: str, answer: list[bool]) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_TIMEOUT_S).close()
        answer.append(True)
    except urllib.error.HTTPError:
        answer.append(True)  # the server answered: the network is there
    except (OSError, ValueError) as e:
        _logger.info("hub %s not reachable: %s", url, e)
        answer.append(False)


@functools.lru_cache(maxsize=1)
def _hub_reachable_at(bucket: int) -> bool:
    del bucket  # only keys the cache: one probe a minute at most
    from huggingface_hub import constants

    # urllib's timeout does not cover the DNS lookup, which can hang on a broken network: the probe
    # runs in a daemon thread and whatever it hasn't answered by the deadline counts as offline.
    answer: list[bool] = []
    probe = threading.Thread(target=_probe, args=(constants.ENDPOINT, answer), daemon=True)
    probe.start()
    probe.join(HUB_PROBE_TIMEOUT_S + 0.5)
    return bool(answer and answer[0])


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers within a few seconds (cached for a minute)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    return _hub_reachable_at(int(time.time() // 60))


def _cached_weights_file(hub_id: str) -> str | None:
    """Path of a weights file of `hub_id` already in the local hub cache, if any."""
    from huggingface_hub import try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        path = try_to_load_from_cache(hub_id, filename)
        if isinstance(path, str):
            return path
    return None


def _offline_message(what: str) -> str:
    return (
        f"Pretrained weights for {what} are not in the local cache and the Hugging Face hub can't be "
        "reached. Connect once to download them, point HF_HOME at a cache that has them, pass a "
        f"weights file, or use the bundled offline model {TEACHING_MODEL!r}."
    )


def _create_pretrained(name: str, **kwargs: Any) -> tuple[torch.nn.Module, str]:
    """timm.create_model(pretrained=True), but from the hub cache when possible and never slow offline."""
    if name.startswith("hf-hub:"):
        hub_id = name[len("hf-hub:"):]
        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE and not hub_reachable():
            raise OfflineError(_offline_message(name) + " (With HF_HUB_OFFLINE=1, hub ids are read from the cache.)")
        return _timm_create(name, pretrained=True, **kwargs), f"hub: {hub_id}"

    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id:
        raise ModelError(f"timm has no pretrained weights for {name}; load it with pretrained=False or a weights file.")
    cached = _cached_weights_file(hub_id)
    if cached:
        # timm's own load path, pointed at the cached file: no network round trip at all.
        model = _timm_create(name, pretrained=True, pretrained_cfg_overlay={"file": cached}, **kwargs)
        return model, f"hub cache: {hub_id}"
    if not hub_reachable():
        raise OfflineError(_offline_message(name))
    _logger.info("downloading %s from the hub", hub_id)
    return _timm_create(name, pretrained=True, **kwargs), f"hub: {hub_id}"


def _timm_create(name: str, **kwargs: Any) -> torch.nn.Module:
    try:
        return timm.create_model(name, **kwargs)
    except (OSError, RuntimeError) as e:
        from huggingface_hub.errors import LocalEntryNotFoundError

        if isinstance(e, LocalEntryNotFoundError) or isinstance(e.__cause__, LocalEntryNotFoundError):
            raise OfflineError(_offline_message(name)) from e
        raise


# ----------------------------------------------------------------------------------------------
# Weights files


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors / .pth / .pt / .bin file, never unpickling arbitrary objects."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WEIGHT_SUFFIXES:
        raise WeightsError(f"{path.name}: unsupported weights format; use {', '.join(WEIGHT_SUFFIXES)}.")
    if not path.is_file():  # the name only: an uploaded file's path is the server's business
        raise WeightsError(f"{path.name}: no such weights file.")
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightsError(f"{path.name} is not a valid safetensors file (truncated or damaged?): {e}") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types; all mean "refused"
        import pickle

        if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e) or "Unsupported global" in str(e):
            raise WeightsError(
                f"{path.name} was refused: it contains Python objects, not only tensors, and loading it "
                "could run code. ViT Lens loads weights safely (weights_only); convert it to safetensors."
            ) from e
        raise WeightsError(f"{path.name} could not be read as a PyTorch checkpoint: {e}") from e
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path.name} holds no state dict of tensors.")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _head_classes(state: dict[str, torch.Tensor]) -> int | None:
    head = state.get("head.weight")
    return int(head.shape[0]) if head is not None and head.ndim == 2 else None


# ----------------------------------------------------------------------------------------------
# Declared shapes, checked before anything is read in full or built
#
# A weights file says what it holds (a safetensors header, a zip directory of .npy headers, tensor
# metadata in a pickle); these checks hold the declarations against the bytes really present and
# against the architecture's own tensors (built on 'meta': shapes, no memory), so that a small file
# can't make the loader allocate gigabytes before refusing it.


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Declared shapes of a .safetensors file, from its JSON header only, each checked against the bytes
    it points at. Raises WeightsError for a header that is damaged or claims more than the file holds."""
    def refuse(why: str) -> WeightsError:
        return WeightsError(f"{path.name} is not a valid safetensors file ({why}).")

    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise refuse("too short")
        header_len = int.from_bytes(head, "little")
        if header_len > min(SAFETENSORS_MAX_HEADER_BYTES, size - 8):
            raise refuse("its header is larger than the file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, ValueError) as e:
            raise refuse("its header is not JSON") from e
    if not isinstance(header, dict):
        raise refuse("its header is not a table of tensors")
    data_len = size - 8 - header_len
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            itemsize = _SAFETENSORS_ITEMSIZE[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise refuse(f"tensor {name[:80]!r} is not described properly") from e
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len or end - begin != math.prod(shape) * itemsize:
            raise refuse(f"tensor {name[:80]!r} declares {shape} but the file holds {max(end - begin, 0)} bytes for it")
        shapes[str(name)] = shape
    return shapes


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Declared shapes of a .npz archive's arrays, from the zip directory and each .npy header: only the
    first bytes of each member are inflated. Raises WeightsError for a damaged archive or a non-numeric array."""
    import zipfile

    import numpy as np

    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if len(members) > NPZ_MAX_MEMBERS:
                raise WeightsError(f"{path.name} holds {len(members)} arrays; a ViT checkpoint has far fewer.")
            for member in members:
                with archive.open(member) as f:
                    npy = np.lib.format
                    version = npy.read_magic(f)
                    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read_header(f)
                if dtype.hasobject or dtype.itemsize == 0:
                    raise WeightsError(f"{path.name}: array {member.filename[:80]!r} is not numeric.")
                shapes[member.filename.removesuffix(".npy")] = tuple(int(d) for d in shape)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise WeightsError(f"{path.name} is not a valid .npz archive (truncated or damaged?).") from e
    return shapes


def _architecture_shapes(probe: torch.nn.Module | None) -> dict[str, tuple[int, ...]]:
    return {} if probe is None else {k: tuple(v.shape) for k, v in probe.state_dict().items()}


def check_head_classes(path: Path, classes: int) -> None:
    """Refuse a head of more than MAX_CLASSES classes (or none) before a model is built with it. A head of
    the wrong width is left to the full mismatch report of the strict load: its size is bounded by then."""
    if not 1 <= classes <= MAX_CLASSES:
        raise WeightsError(f"{path.name} declares a head of {classes:,} classes; ViT Lens loads 1 to {MAX_CLASSES:,}.")


def check_declared_shapes(path: Path, shapes: dict[str, tuple[int, ...]], probe: torch.nn.Module | None) -> None:
    """Every tensor of the file no larger than the architecture could use: its largest tensor four
    times over (a position embedding trained at a larger size is resampled), or a full-size head."""
    arch = _architecture_shapes(probe)
    width = getattr(probe, "num_features", 4096) if probe is not None else 4096
    largest = max(math.prod(s) for s in arch.values()) * 4 if arch else 2**28
    limit = max(largest, MAX_CLASSES * width)
    for name, shape in shapes.items():
        if math.prod(shape) > limit:
            raise WeightsError(
                f"{path.name}: {name[:80]!r} declares {math.prod(shape):,} values, more than "
                f"{probe.__class__.__name__ if probe is not None else 'a ViT'} could use ({limit:,}): refused before loading."
            )
    total = sum(math.prod(s) for s in shapes.values())
    if arch and total > 4 * sum(math.prod(s) for s in arch.values()) + limit:
        raise WeightsError(f"{path.name} declares {total:,} values in all, far more than the architecture holds: refused.")


def check_torch_archive(path: Path) -> None:
    """A PyTorch checkpoint (a zip since torch 1.6) whose records would inflate beyond the file's own size
    is refused unread: torch.save stores records uncompressed, so only a crafted file compresses them."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return  # the legacy format: torch reads it as it comes
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise WeightsError(f"{path.name} could not be read as a PyTorch checkpoint (damaged zip).") from e
    if inflated > path.stat().st_size:
        raise WeightsError(f"{path.name} holds compressed records that would inflate to {inflated:,} bytes; "
                           "torch.save writes none, so it was refused unread.")


def check_weights_file(path: Path, probe: torch.nn.Module | None) -> None:
    """Check a weights file's declarations before it is read in full (a pickled checkpoint: its archive only;
    `check_state_dict` checks its tensors once read). `probe`: the architecture on 'meta', or None."""
    suffix = path.suffix.lower()
    if not path.is_file():
        return  # read_state_dict says so
    if suffix in PICKLE_SUFFIXES:
        check_torch_archive(path)
        return
    if suffix == ".safetensors":
        shapes = safetensors_shapes(path)
        check_declared_shapes(path, shapes, probe)
        head = shapes.get("head.weight")
        if head is not None and len(head) == 2:
            check_head_classes(path, head[0])
        return
    if suffix == ".npz":
        shapes = npz_shapes(path)
        check_declared_shapes(path, shapes, probe)
        kernel = next((s for k, s in shapes.items() if k.endswith("head/kernel") and len(s) == 2), None)
        if kernel is not None:
            check_head_classes(path, kernel[1])  # JAX: (D, C)


def check_state_dict(path: Path, state: dict[str, torch.Tensor], probe: torch.nn.Module | None) -> None:
    """The checks of `check_weights_file` for a pickled checkpoint, once its tensors are read (their data is
    no larger than the file): each tensor's view must lie within its own storage (a pickle can declare a huge
    tensor over one stored value, stride 0), and the shapes must fit the architecture."""
    for name, tensor in state.items():
        needed = tensor.numel() * tensor.element_size()
        if needed > tensor.untyped_storage().nbytes():
            raise WeightsError(f"{path.name}: {name[:80]!r} declares {tuple(tensor.shape)} over less data: refused.")
    check_declared_shapes(path, {k: tuple(v.shape) for k, v in state.items()}, probe)
    classes = _head_classes(state)
    if classes is not None:
        check_head_classes(path, classes)


def _load_weights_into(model: VisionTransformer, path: Path, state: dict[str, torch.Tensor] | None, name: str) -> None:
    """Load the weights file `path` into `model`: `state` is its tensors as already read (None for a JAX .npz)."""
    if state is None:  # the original Google JAX checkpoints (.npz), through timm's converter
        try:
            model.load_pretrained(str(path))
        except Exception as e:  # timm's converter raises many types; its messages may hold the server's path
            raise WeightsError(f"{path.name} is not a JAX ViT checkpoint that fits {name}: "
                               f"{str(e).replace(str(path), path.name)}") from e
        return
    from timm.models.vision_transformer import checkpoint_filter_fn

    try:
        state = checkpoint_filter_fn(state, model)  # timm's own conversions (e.g. pos_embed resampling)
    except Exception as e:
        raise WeightsError(f"{path.name} does not fit {name}: {e}") from e
    result = _strict_load(model, state)
    if result:
        raise WeightsError(f"{path.name} does not fit {name}: {result}")


def _first_three(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")


def _strict_load(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Load `state` into `model`; '' if every tensor fit exactly, else a one-line description of the
    mismatch (the model is then partly loaded: discard it).

    torch's `load_state_dict(strict=False)` reports missing and unexpected keys; tensors of the wrong
    shape make it raise instead, so those are found (and left out) first.
    """
    own = model.state_dict()
    wrong_shape = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    report = model.load_state_dict({k: v for k, v in state.items() if k not in wrong_shape}, strict=False)
    missing = [k for k in report.missing_keys if k not in wrong_shape]
    problems = [f"{len(keys)} {what} tensors ({_first_three(keys)})"
                for what, keys in (("missing", missing), ("unexpected", report.unexpected_keys)) if keys]
    if wrong_shape:
        shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong_shape[:3]]
        problems.append(f"shape mismatch: {'; '.join(shapes)} (file vs model)")
    return "; ".join(problems) + ". Is it the right architecture?" if problems else ""


# ----------------------------------------------------------------------------------------------
# Labels


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a text file (one per line) or JSON (a list, or {"label_names": [...]}, or id2label).

    Raises WeightsError with one sentence for a file that is too large, not UTF-8 text or not such JSON.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_LABEL_FILE_BYTES:
            raise WeightsError(f"The label file {path.name} is {size / 2**20:.0f} MB; label files are limited to "
                               f"{MAX_LABEL_FILE_BYTES // 2**20} MB.")
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise WeightsError(f"The label file {path.name} is not UTF-8 text; save it as UTF-8, one class name per line.") from e
    except OSError as e:
        raise WeightsError(f"The label file {path.name} can't be read ({e.strerror or 'error'}).") from e
    if path.suffix.lower() == ".json":
        names = _labels_from_json(text)
        if names is None:
            raise WeightsError(f"The label file {path.name} is not JSON of the form [\"cat\", \"dog\", ...], "
                               "{\"label_names\": [...]} or {\"0\": \"cat\", ...}.")
    else:
        names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) > MAX_CLASSES:
        raise WeightsError(f"The label file {path.name} lists {len(names):,} classes; ViT Lens loads at most {MAX_CLASSES:,}.")
    return names


def _labels_from_json(text: str) -> tuple[str, ...] | None:
    """Names from a JSON list, {"label_names" | "labels" | "id2label": ...} or an {"0": name} map; None if it is none of those."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if isinstance(data, dict):
        data = data.get("label_names") or data.get("labels") or data.get("id2label") or data
    if isinstance(data, dict):
        try:
            data = [data[k] for k in sorted(data, key=int)]
        except (TypeError, ValueError):  # keys that are not class indices
            return None
    if not isinstance(data, list) or not all(isinstance(x, (str, int, float)) for x in data):
        return None
    return tuple(str(x) for x in data)


def _labels_beside(weights: Path) -> tuple[str, ...] | None:
    for candidate in (weights.with_suffix(".labels.txt"), weights.parent / "labels.txt", weights.parent / "label_names.json"):
        if candidate.is_file():
            return read_labels(candidate)
    return None


def imagenet_labels(model: torch.nn.Module) -> tuple[str, ...] | None:
    """Human-readable ImageNet names from timm's bundled ImageNetInfo (no download), if the head fits."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if not subset:
        return None
    return tuple(ImageNetInfo(subset).label_descriptions())


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
            classes = _head_classes(state) if state is not None else None
            if classes is not None:
                model_kwargs.setdefault("num_classes", classes)
            model = _random_init(name, seed, model_kwargs)
            if not checked:  # refuse a non-ViT before trying its weights: the clearer message
                check_supported(model, name)
                checked = True
            _load_weights_into(model, weights, state, name)
            source = f"file: {weights.name}"
            label_names = _labels_beside(weights)
        elif pretrained:
            model, source = _create_pretrained(name, **model_kwargs)
        else:
            model = _random_init(name, seed, model_kwargs)
            source = f"random init (seed {seed})"
    if not checked:
        check_supported(model, name)
    model.eval()

    if labels is not None:
        label_names = read_labels(labels) if isinstance(labels, (str, Path)) else tuple(labels)
    elif label_names is None:
        label_names = imagenet_labels(model)
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
        return _timm_create(name, pretrained=False, **model_kwargs)


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


def env_default_model() -> str:
    """The model the dashboard opens with: $VIT_LENS_MODEL, else the ImageNet ViT-B/16."""
    return os.environ.get("VIT_LENS_MODEL", DEFAULT_MODEL)
