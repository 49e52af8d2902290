"""Relevance maps: where the model looked for the target class, by four methods (docs/spec/analyses.md,
"Why this prediction"). Shapes: L layers, H heads, T = P + N tokens (P prefix tokens first, then N = gh*gw
patches row-major), D width, C classes.

The map definitions (`raw_attention_map`, `rollout_map`, `chefer_map`, `gradcam_map`) are pure functions of
arrays, each tested against loops. `relevance_maps` runs the one forward + backward they need: hooks and the
`fused_attn` flags restored also on error (`vit_core.hooks`), every parameter frozen for the pass and its
`requires_grad` restored, so no `.grad` is ever written to the model.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .. import analyses
from ..capture import Capture
from ..devices import full_float32, on_model_device, to_host
from ..errors import CaptureError
from ..hooks import attention_recorded, register
from ..model import Geometry, LoadedModel
from .passes import eval_mode, model_input, parameters_frozen, resolve_target

METHODS = ("raw_attention", "rollout", "chefer", "gradcam", "attnlrp")  # display order

ATTNLRP_UNSUPPORTED = (
    "AttnLRP is not available for timm ViTs: the lxt package (2.1) supports torchvision's ViT only, "
    "by patching torch's LayerNorm and GELU classes process-wide, and has no rules for timm's attention."
)


# ----------------------------------------------------------------------------------------------
# Pure map definitions


def class_token_row(matrix: np.ndarray, num_prefix_tokens: int, has_class_token: bool) -> np.ndarray:
    """The "class-token row" of a (T, T) matrix: row 0 with a class token, else the mean of the patch
    rows. -> (T,)"""
    return matrix[0] if has_class_token else matrix[num_prefix_tokens:].mean(axis=0)


def raw_attention_map(pattern: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Last layer, head mean, class-token row, patch columns: pattern (L, H, T, T) -> (gh, gw) float32."""
    p = geometry.num_prefix_tokens
    if geometry.has_class_token:
        return analyses.attention_map(pattern, pattern.shape[0] - 1, None, 0, p, geometry.grid).map
    last = analyses.fuse_heads(pattern[-1:], "mean")[0]  # (1, H, T, T) -> (T, T)
    return class_token_row(last, p, False)[p:].reshape(geometry.grid).astype(np.float32)


def rollout_map(pattern: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Attention rollout (mean fusion, all layers), as the export's `rollout`: (L, H, T, T) -> (gh, gw)."""
    return analyses.attention_rollout(pattern, geometry.num_prefix_tokens, geometry.grid,
                                      has_class_token=geometry.has_class_token)


def chefer_map(pattern: np.ndarray, grad: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Gradient-weighted attention relevance (Chefer, Gur & Wolf 2021).

    pattern, grad: (L, H, T, T), grad = dy_c / dpattern. Abar_l = mean_h max(G_l * A_l, 0);
    R_0 = I, R_l = R_{l-1} + Abar_l @ R_{l-1} (forward order). -> class-token row of R_L at the patch
    columns, (gh, gw) float32. Computed in float64.
    """
    p = geometry.num_prefix_tokens
    cams = np.clip(grad.astype(np.float64) * pattern.astype(np.float64), 0, None).mean(axis=1)  # (L, T, T)
    relevance = np.eye(cams.shape[-1])
    for cam in cams:
        relevance = relevance + cam @ relevance
    return class_token_row(relevance, p, geometry.has_class_token)[p:].reshape(geometry.grid).astype(np.float32)


def gradcam_map(activations: np.ndarray, grad: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Grad-CAM on a ViT: activations X and grad dy_c/dX of the patch tokens, both (N, D).
    w_d = mean over patches of grad[:, d]; map = ReLU(X @ w) -> (gh, gw) float32."""
    weights = grad.astype(np.float64).mean(axis=0)  # (D,)
    return np.maximum(activations.astype(np.float64) @ weights, 0).reshape(grid).astype(np.float32)


def token_norms(cap: Capture, row: int | None = None) -> np.ndarray:
    """Euclidean norm of every token entering block 0 and after each block: (L+1, T) float32, in float64 sums.
    `row`: only that row of the residual stream (0: entering block 0, l: after block l), (T,): a slider
    move needs one row, a 25th of the work of all of a ViT-L/14's."""
    tokens = cap.tokens if row is None else cap.tokens[row]  # (L+1, T, D) or (T, D)
    return np.linalg.norm(tokens.astype(np.float64), axis=-1).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# The relevance pass: one forward + backward, parameters frozen


@dataclass(frozen=True)
class Relevance:
    """Relevance maps of every supported method for one image and target class."""

    target: int
    maps: dict[str, np.ndarray]  # method -> float32 (gh, gw), unscaled; in METHODS order
    unsupported: dict[str, str]  # method -> one sentence for the UI, why it has no map


@dataclass(frozen=True)
class _Gradients:
    logits: np.ndarray  # (C,)
    pattern: np.ndarray  # (L, H, T, T)
    pattern_grad: np.ndarray  # (L, H, T, T): dy_c / dpattern
    last_norm1: np.ndarray  # (T, D): output of blocks[-1].norm1
    last_norm1_grad: np.ndarray  # (T, D): dy_c / d(that output)
    target: int


def _gradient_pass(loaded: LoadedModel, x: torch.Tensor, target: int | str | None) -> _Gradients:
    """One forward in float32 through the un-fused attention path and one backward of y_c to the
    post-softmax patterns and to `blocks[-1].norm1`'s output only (torch.autograd.grad with those
    inputs: no parameter gradient is computed). x: (1, 3, H, W), on any device."""
    model = loaded.model
    x = on_model_device(model, x)
    live: dict[str, list[torch.Tensor]] = {"pattern": [], "norm1": []}

    def keep_pattern(module: torch.nn.Module, args: tuple, pattern: torch.Tensor) -> None:
        live["pattern"].append(pattern)

    def block_input_as_leaf(module: torch.nn.Module, args: tuple) -> tuple:
        # With every parameter frozen, nothing before block 0 is recorded for autograd: the graph starts at this
        # leaf, the one thing that requires grad. Every pattern and every norm1 output lies downstream of it (also
        # block 0's norm1, the last block's in a 1-block model), so their gradients are exact.
        return (args[0].detach().requires_grad_(True), *args[1:])

    with contextlib.ExitStack() as stack:
        stack.enter_context(loaded.lock)
        stack.enter_context(full_float32(loaded.device))
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        stack.enter_context(eval_mode(model))
        stack.enter_context(parameters_frozen(model))
        stack.enter_context(attention_recorded(model, lambda pattern: None))  # un-fused path, flags restored
        register(stack, model, model.blocks[0].register_forward_pre_hook(block_input_as_leaf))
        for blk in model.blocks:
            register(stack, model, blk.attn.attn_drop.register_forward_hook(keep_pattern))
        register(stack, model, model.blocks[-1].norm1.register_forward_hook(lambda m, i, o: live["norm1"].append(o)))
        logits = model(x)  # (1, C)
        if len(live["pattern"]) != len(model.blocks) or len(live["norm1"]) != 1:
            raise CaptureError(f"expected one attention pattern per block ({len(model.blocks)}), got {len(live['pattern'])}: "
                               "this model's attention does not run through timm's standard path.")
        c = resolve_target(loaded, to_host(logits[0]), target)
        grads = torch.autograd.grad(logits[0, c], [*live["pattern"], live["norm1"][0]])
    return _Gradients(
        logits=to_host(logits[0]),
        pattern=to_host(torch.cat(live["pattern"], dim=0)),  # L x (1, H, T, T) -> (L, H, T, T)
        pattern_grad=to_host(torch.cat(grads[:-1], dim=0)),
        last_norm1=to_host(live["norm1"][0][0]),  # (1, T, D) -> (T, D)
        last_norm1_grad=to_host(grads[-1][0]),
        target=c,
    )



def relevance_maps(loaded: LoadedModel, image: Image.Image | Capture, target: int | str | None = None,
                   cap: Capture | None = None) -> Relevance:
    """Relevance maps (gh, gw) of every method in METHODS for the target class (None: top-1).

    One forward + backward pass (parameters frozen; gradients only to the attention patterns and
    norm1's output) gives Chefer and Grad-CAM; raw attention and rollout come from `cap` (a Capture of
    the same image) when given, else from the pass itself. AttnLRP is listed in `unsupported`.
    """
    geometry = loaded.geometry
    p = geometry.num_prefix_tokens
    x = model_input(loaded, image)  # (1, 3, H, W)
    passed = _gradient_pass(loaded, x, target)
    pattern = cap.pattern if cap is not None else passed.pattern
    maps = {
        "raw_attention": raw_attention_map(pattern, geometry),
        "rollout": rollout_map(pattern, geometry),
        "chefer": chefer_map(passed.pattern, passed.pattern_grad, geometry),
        "gradcam": gradcam_map(passed.last_norm1[p:], passed.last_norm1_grad[p:], geometry.grid),
    }
    for m in maps.values():
        m.setflags(write=False)
    return Relevance(target=passed.target, maps=maps, unsupported={"attnlrp": ATTNLRP_UNSUPPORTED})


# ----------------------------------------------------------------------------------------------
