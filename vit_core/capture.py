"""One forward pass with forward hooks, returned as one frozen result.

`run_with_capture` is the only place that touches the model during a pass. Hooks exist only inside
the recording context managers (`attention_recorded`, `_intermediates_recorded`) and are removed on
their way out, as is the one module flag they change (`attn.fused_attn`: timm's fused SDPA path
never materialises the attention matrix); `recording_hooks_on(model)` counts the ones still
registered (0 outside a pass). The result holds CPU float32 numpy arrays with the batch axis
removed, made read-only, so it can be cached and shared between sessions without copies.

The model may live on any device (`LoadedModel.device`): its input is made there
(`on_model_device`), each intermediate is copied to the host once, in `_frozen`, and a CUDA pass runs
in full float32 (`full_float32`), so that results equal the CPU's within float32 tolerance.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.hooks import RemovableHandle

from .analyses import softmax
from .errors import CaptureError
from .images import to_rgb
from .loading import Geometry, LoadedModel

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capture:
    """Everything one forward pass showed. Shapes: T tokens, D width, L layers, H heads, C classes."""

    model_name: str
    geometry: Geometry
    input_image: np.ndarray  # uint8 (H, W, 3): the exact crop the model saw
    input_tensor: np.ndarray  # float32 (3, H, W): normalised input of patch_embed
    patch_embeddings: np.ndarray  # float32 (N, D): patch_embed output, before prefix tokens and position
    tokens: np.ndarray  # float32 (L+1, T, D): entering block 0, then after each block (before the final norm)
    pattern: np.ndarray  # float32 (L, H, T, T): post-softmax attention, rows = queries
    final_tokens: np.ndarray  # float32 (T, D): after the final norm
    pre_logits: np.ndarray  # float32 (D',): input of the classifier head (pooled, fc_norm'ed)
    logits: np.ndarray  # float32 (C,)
    forward_seconds: float  # wall time of the hooked forward pass

    @property
    def probs(self) -> np.ndarray:
        return softmax(self.logits)  # (C,)


# ----------------------------------------------------------------------------------------------
# Preprocessing: timm's eval transform, split where the PIL crop becomes a tensor


def preprocess(loaded: LoadedModel, image: Image.Image) -> tuple[np.ndarray, torch.Tensor]:
    """The crop the model sees (uint8 (H, W, 3)) and its normalised tensor ((1, 3, H, W)), through the
    model's eval transform (built once, at load time: `LoadedModel.crop_transform` / `tensor_transform`)."""
    crop = loaded.crop_transform(to_rgb(image))
    return np.asarray(crop, dtype=np.uint8).copy(), loaded.tensor_transform(crop).unsqueeze(0)  # (3, H, W) -> (1, 3, H, W)


def on_model_device(model: torch.nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the device of `model`'s parameters (itself if it is there already): every tensor a pass
    hands to the model goes through here, so that a model moved to a GPU gets its inputs there."""
    return tensor.to(next(model.parameters()).device)


# The TF32 flags are process-wide: passes in several threads (two models, each with its own lock) share one
# setting, turned off by the first pass to start and restored by the last one to end.
_tf32_lock = threading.Lock()
_tf32_passes = 0
_tf32_saved: tuple[bool, bool] = (False, False)


@contextlib.contextmanager
def full_float32(device: torch.device) -> Iterator[None]:
    """Inside the block, CUDA convolutions and matrix products run in full float32, not TF32 (torch lets cuDNN
    convolutions use TF32 by default: 10 mantissa bits, so the patch embedding alone would move the results
    well beyond float32 tolerance). The flags are restored when the last pass in any thread ends, also on error;
    on other devices nothing changes."""
    global _tf32_passes, _tf32_saved
    if device.type != "cuda":
        yield
        return
    with _tf32_lock:
        if _tf32_passes == 0:
            _tf32_saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        _tf32_passes += 1
    try:
        yield
    finally:
        with _tf32_lock:
            _tf32_passes -= 1
            if _tf32_passes == 0:
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = _tf32_saved


# ----------------------------------------------------------------------------------------------
# Hooks: registered only through `_register`, which keeps each handle until it is removed, so that
# the recording's own hooks can be counted without reading torch's private hook dictionaries.

_live_handles: weakref.WeakKeyDictionary[torch.nn.Module, set[RemovableHandle]] = weakref.WeakKeyDictionary()
_live_handles_lock = threading.Lock()


def _register(stack: contextlib.ExitStack, model: torch.nn.Module, handle: RemovableHandle) -> None:
    """Note `handle` as one of `model`'s recording hooks, removed (and forgotten) when `stack` closes."""
    with _live_handles_lock:
        _live_handles.setdefault(model, set()).add(handle)

    def remove() -> None:
        handle.remove()
        with _live_handles_lock:
            _live_handles[model].discard(handle)

    stack.callback(remove)


def recording_hooks_on(model: torch.nn.Module) -> int:
    """Hooks the recording context managers registered on `model` (or its modules) and have not
    removed yet: 0 outside a pass, also after a forward that raised."""
    with _live_handles_lock:
        return len(_live_handles.get(model, ()))


@contextlib.contextmanager
def attention_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, every attention block runs timm's un-fused path and hands its post-softmax
    pattern (B, H, T, T) to `record`; the hooks and the `fused_attn` flags are restored on exit,
    also when the forward raises.

    timm's fused SDPA path never materialises the pattern (a hook on `attn_drop` would see nothing);
    the un-fused path computes softmax(q k^T * scale) and passes it through `attn_drop`.
    """
    with contextlib.ExitStack() as stack:
        for blk in model.blocks:
            stack.callback(setattr, blk.attn, "fused_attn", blk.attn.fused_attn)  # restored on exit
            blk.attn.fused_attn = False
            _register(stack, model, blk.attn.attn_drop.register_forward_hook(lambda m, i, o: record(o.detach())))
        yield


@contextlib.contextmanager
def tokens_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward hands `record` the token sequence (B, T, D) entering block 0, then after
    each block (before the final norm): L+1 calls in order. Hooks removed on exit, also when the forward raises."""
    with contextlib.ExitStack() as stack:
        _register(stack, model, model.blocks[0].register_forward_pre_hook(lambda m, args: record(args[0])))
        for blk in model.blocks:
            _register(stack, model, blk.register_forward_hook(lambda m, i, o: record(o)))
        yield


@contextlib.contextmanager
def _intermediates_recorded(model: torch.nn.Module, store: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block, a forward pass in eval mode appends every intermediate the result needs
    (attention, tokens, patch embeddings, head input) to `store`; mode and hooks restored on exit."""

    def keep(key: str, tensor: torch.Tensor) -> None:
        store.setdefault(key, []).append(tensor.detach())

    with contextlib.ExitStack() as stack:
        stack.callback(model.train, model.training)
        model.eval()
        stack.enter_context(attention_recorded(model, lambda pattern: keep("pattern", pattern)))
        stack.enter_context(tokens_recorded(model, lambda tokens: keep("tokens", tokens)))
        hooks = [  # (how to register, the hook): each handle is in the stack as soon as it exists
            (model.patch_embed.register_forward_hook, lambda m, i, o: keep("patch_embeddings", o)),
            (model.norm.register_forward_hook, lambda m, i, o: keep("final_tokens", o)),
            (model.head.register_forward_pre_hook, lambda m, args: keep("pre_logits", args[0])),
        ]
        for register, hook in hooks:
            _register(stack, model, register(hook))
        yield


def _finished(device: torch.device) -> None:
    """Wait until the work queued on `device` is done (CUDA and MPS run asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def to_host(t: torch.Tensor) -> np.ndarray:
    """`t` (on any device) as a float32 numpy array on the host: the one copy off the device."""
    return t.detach().to(torch.float32).cpu().numpy()


def _frozen(t: torch.Tensor) -> np.ndarray:
    """`to_host(t)`, made read-only."""
    array = to_host(t)
    array.setflags(write=False)
    return array


# ----------------------------------------------------------------------------------------------
# The entry point


def run_with_capture(loaded: LoadedModel, image: Image.Image) -> Capture:
    """Preprocess `image` as the model's pretrained config says, run one hooked forward pass, and
    return every intermediate as numpy.

    Safe to call from many threads on one shared `loaded`: passes are serialised by its lock (the
    hooks and the attention flag are per-model state). Raises CaptureError if the model did not
    produce exactly one attention pattern per block.
    """
    model, geometry = loaded.model, loaded.geometry
    crop, x = preprocess(loaded, image)  # (H, W, 3), (1, 3, H, W) on the host
    store: dict[str, list[torch.Tensor]] = {}
    with loaded.lock:
        started = time.perf_counter()
        with torch.inference_mode(), full_float32(loaded.device), _intermediates_recorded(model, store):
            logits = model(on_model_device(model, x))  # (1, C), on the model's device
        _finished(logits.device)  # a GPU runs asynchronously: time the pass, not its launch
        seconds = time.perf_counter() - started

    num_layers = geometry.num_layers
    patterns = store.get("pattern", [])
    if len(patterns) != num_layers:
        raise CaptureError(
            f"expected one attention pattern per block ({num_layers}), got {len(patterns)}: this model's "
            "attention does not run through timm's standard path."
        )
    tokens = store["tokens"]
    assert len(tokens) == num_layers + 1, f"{len(tokens)} token captures for {num_layers} blocks"
    pattern = torch.cat(patterns, dim=0)  # L x (1, H, T, T) -> (L, H, T, T)
    if pattern.shape[1:] != (geometry.num_heads, geometry.num_tokens, geometry.num_tokens):
        raise CaptureError(f"the attention patterns have shape {tuple(pattern.shape[1:])}, not (heads, tokens, tokens) = "
                           f"{(geometry.num_heads, geometry.num_tokens, geometry.num_tokens)}: this model's attention is not "
                           "one softmax per head.")

    input_image = crop
    input_image.setflags(write=False)
    return Capture(
        model_name=loaded.name,
        geometry=geometry,
        input_image=input_image,
        input_tensor=_frozen(x[0]),  # (3, H, W): the host input, not a copy back from the device
        patch_embeddings=_frozen(store["patch_embeddings"][0][0]),  # (1, N, D) -> (N, D)
        tokens=_frozen(torch.cat(tokens, dim=0)),  # (L+1) x (1, T, D) -> (L+1, T, D)
        pattern=_frozen(pattern),
        final_tokens=_frozen(store["final_tokens"][0][0]),  # (1, T, D) -> (T, D)
        pre_logits=_frozen(store["pre_logits"][0][0]),  # (1, D') -> (D',)
        logits=_frozen(logits[0]),  # (1, C) -> (C,)
        forward_seconds=seconds,
    )
