"""Relevance maps: where the model looked for the target class, by six methods (docs/spec/analyses.md,
"Why this prediction"). Shapes: L layers, H heads, T = P + N tokens (P prefix tokens first, then N = gh*gw
patches row-major), D width, C classes.

The map definitions (`raw_attention_map`, `rollout_map`, `chefer_map`, `gradcam_map`) are pure functions of
arrays, each tested against loops; AttnLRP and CP-LRP are `vit_core.explain.lrp`. `relevance_maps` runs only the
passes the asked methods need: hooks and the `fused_attn` flags restored also on error (`vit_core.hooks`), every
parameter frozen for the pass and its `requires_grad` restored, so no `.grad` is ever written to the model.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from .. import analyses
from ..capture import Capture
from ..errors import CaptureError
from ..hooks import attention_recorded, register
from ..loading.model import Geometry, LoadedModel
from ..runtime import gradient_threads, torch_threads
from ..runtime.devices import full_float32, on_model_device, to_host
from . import lrp
from .passes import eval_mode, model_input, model_pass, parameters_frozen, resolve_target
from .perturbation import KeptSetProbs, KnownSets, method_curves

_logger = logging.getLogger(__name__)

METHODS = ("raw_attention", "rollout", "chefer", "gradcam", "attnlrp", "cplrp")  # display order
ATTENTION_METHODS = ("raw_attention", "rollout")  # the patterns only: no backward
LRP_CHOICE_STEPS = 5  # steps of the faithfulness test that picks each LRP method's gamma choice (the test's default: 10)
LRP_LOGIT_TOLERANCE = 1e-3  # relative: the LRP forward's logits against the model's, or its maps are not shown


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
    """Relevance maps of the asked methods for one image and target class."""

    target: int
    maps: dict[str, np.ndarray]  # method -> float32 (gh, gw), unscaled; in METHODS order
    unsupported: dict[str, str]  # method -> one sentence for the UI, why it has no map
    gamma_choice: dict[str, lrp.LrpChoice] = field(default_factory=dict)  # LRP method -> the gamma choice its map used
    # The p_c of the token-dropping forwards the gamma choice ran (None without a choice, or with a caller's scorer):
    # `judge`'s `reuse` takes them instead of running the chosen maps' sets again.
    choice_sets: KnownSets | None = None


@dataclass(frozen=True)
class _Gradients:
    logits: np.ndarray  # (C,)
    pattern: np.ndarray  # (L, H, T, T)
    pattern_grad: np.ndarray  # (L, H, T, T): dy_c / dpattern
    last_norm1: np.ndarray  # (T, D): output of blocks[-1].norm1
    last_norm1_grad: np.ndarray  # (T, D): dy_c / d(that output)
    target: int


@contextlib.contextmanager
def _gradient_pass_context(loaded: LoadedModel) -> Iterator[contextlib.ExitStack]:
    """What both gradient passes run in: the model's lock, the gradient passes' torch threads
    (`runtime.gradient_threads`), full float32, autograd on (also inside inference mode), eval mode and every
    parameter frozen (restored on exit). Yields the stack, for the pass's own hooks."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(loaded.lock)
        stack.enter_context(torch_threads(gradient_threads()))
        stack.enter_context(full_float32(loaded.device))
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        stack.enter_context(eval_mode(loaded.model))
        stack.enter_context(parameters_frozen(loaded.model))
        yield stack


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

    with _gradient_pass_context(loaded) as stack:
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


@dataclass(frozen=True)
class _LastBlock:
    logits: np.ndarray  # (C,)
    target: int
    last_norm1: np.ndarray  # (T, D): output of blocks[-1].norm1
    last_norm1_grad: np.ndarray  # (T, D): dy_c / d(that output)
    pattern: np.ndarray | None  # (L, H, T, T) when asked for


def _last_block_pass(loaded: LoadedModel, x: torch.Tensor, target: int | str | None, keep_pattern: bool) -> _LastBlock:
    """Grad-CAM's pass: one forward whose graph starts at `blocks[-1].norm1`'s output, made a leaf by a forward hook
    (with every parameter frozen nothing before it is recorded), and the backward of y_c to it: no earlier block is
    differentiated. `keep_pattern`: also record the attention patterns (the un-fused path). x: (1, 3, H, W)."""
    model = loaded.model
    x = on_model_device(model, x)
    live: dict[str, list[torch.Tensor]] = {"norm1": [], "pattern": []}

    def output_as_leaf(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        leaf = output.detach().requires_grad_(True)
        live["norm1"].append(leaf)
        return leaf

    with _gradient_pass_context(loaded) as stack:
        if keep_pattern:
            stack.enter_context(attention_recorded(model, live["pattern"].append))
        register(stack, model, model.blocks[-1].norm1.register_forward_hook(output_as_leaf))
        logits = model(x)  # (1, C)
        if len(live["norm1"]) != 1 or (keep_pattern and len(live["pattern"]) != len(model.blocks)):
            raise CaptureError(f"expected one attention pattern per block ({len(model.blocks)}) and one output of the last "
                               f"block's norm1, got {len(live['pattern'])} and {len(live['norm1'])}: this model's attention "
                               "does not run through timm's standard path.")
        c = resolve_target(loaded, to_host(logits[0]), target)
        (grad,) = torch.autograd.grad(logits[0, c], [live["norm1"][0]])
    return _LastBlock(
        logits=to_host(logits[0]), target=c, last_norm1=to_host(live["norm1"][0][0]), last_norm1_grad=to_host(grad[0]),
        pattern=to_host(torch.cat(live["pattern"], dim=0)) if keep_pattern else None,  # L x (1, H, T, T) -> (L, H, T, T)
    )


def _pattern_pass(loaded: LoadedModel, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A forward with no gradient that records the attention patterns: (logits (C,), pattern (L, H, T, T))."""
    patterns: list[torch.Tensor] = []
    with model_pass(loaded), attention_recorded(loaded.model, patterns.append):
        logits = loaded.model(on_model_device(loaded.model, x))  # (1, C)
    if len(patterns) != len(loaded.model.blocks):
        raise CaptureError(f"expected one attention pattern per block ({len(loaded.model.blocks)}), got {len(patterns)}: "
                           "this model's attention does not run through timm's standard path.")
    return to_host(logits[0]), to_host(torch.cat(patterns, dim=0))


def faithfulness_scorer(loaded: LoadedModel, image: Image.Image | Capture, target: int,
                        steps: int = LRP_CHOICE_STEPS, probs: KeptSetProbs | None = None,
                        ) -> Callable[[dict[str, np.ndarray]], dict[str, float]]:
    """Scores maps (name -> (gh, gw)) by the faithfulness test (analyses.md, "Faithfulness") at `steps` steps:
    insertion AUC - deletion AUC, higher is better. One call for all maps, so they share the test's forwards.
    `probs`: the token-dropping p_c of this image and target to run them through (and keep them in), else a new one."""

    def score(maps: dict[str, np.ndarray]) -> dict[str, float]:
        sets = probs if probs is not None else KeptSetProbs(loaded, model_input(loaded, image), target)
        curves = method_curves(sets, maps, steps)
        return {name: c.insertion_auc - c.deletion_auc for name, c in curves.items()}

    return score


def _lrp_maps(loaded: LoadedModel, x: torch.Tensor, target: int | str | None, methods: Sequence[str],
              choices: Sequence[lrp.GammaChoice]) -> tuple[lrp.InputRelevance, dict[tuple[str, str], np.ndarray]]:
    """One LRP forward and a backward per (method, gamma choice), the model locked: the input relevance and its
    patch maps (gh, gw). target: c, or resolved from the LRP forward's logits."""
    g = loaded.geometry
    wanted = target if isinstance(target, int) else (lambda logits: resolve_target(loaded, logits, target))
    with loaded.lock, full_float32(loaded.device):
        result = lrp.input_relevance(loaded.model, on_model_device(loaded.model, x), wanted, methods=methods, choices=choices)
    return result, {key: lrp.patch_relevance(pixels, g.patch_size, g.grid) for key, pixels in result.pixels.items()}


def _checked_methods(methods: Sequence[str]) -> set[str]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown relevance method(s) {unknown}; known: {METHODS}")
    return set(methods)


def relevance_maps(loaded: LoadedModel, image: Image.Image | Capture, target: int | str | None = None,
                   cap: Capture | None = None, *, methods: Sequence[str] = METHODS, choose_gamma: bool = True,
                   choice_steps: int = LRP_CHOICE_STEPS,
                   scorer: Callable[[dict[str, np.ndarray]], dict[str, float]] | None = None) -> Relevance:
    """Relevance maps (gh, gw) of `methods` (default: all of METHODS) for the target class (None: top-1), running
    only the passes they need:

    - Chefer: one forward + backward (parameters frozen; gradients only to the attention patterns and norm1's
      output), which also gives Grad-CAM;
    - Grad-CAM without Chefer: a backward from y_c to `blocks[-1].norm1`'s output only (`_last_block_pass`);
    - raw attention and rollout: the patterns of `cap` (a Capture of the same image) when given, else of a pass
      above, else of a forward without gradients;
    - AttnLRP and CP-LRP (`vit_core.explain.lrp`): one LRP forward and a backward per method and gamma choice. With
      `choose_gamma`, each method's map is that of the choice (`lrp.gamma_candidates`) with the best faithfulness
      score on this image (`faithfulness_scorer` at `choice_steps` steps, or `scorer`), in `Relevance.gamma_choice`,
      with the forwards of that test in `Relevance.choice_sets` (for `judge`'s `reuse`); else the eps-rule everywhere.

    A method that can't run on this model is in `unsupported` with one sentence saying why."""
    wanted = _checked_methods(methods)
    geometry = loaded.geometry
    p = geometry.num_prefix_tokens
    x = model_input(loaded, image)  # (1, 3, H, W)
    maps: dict[str, np.ndarray] = {}
    logits, c = (cap.logits, None) if cap is not None else (None, None)
    pattern = cap.pattern if cap is not None else None
    needs_pattern = pattern is None and bool(wanted & set(ATTENTION_METHODS))
    if "chefer" in wanted:
        passed = _gradient_pass(loaded, x, target)
        maps["chefer"] = chefer_map(passed.pattern, passed.pattern_grad, geometry)
        if "gradcam" in wanted:
            maps["gradcam"] = gradcam_map(passed.last_norm1[p:], passed.last_norm1_grad[p:], geometry.grid)
        logits, c, pattern = passed.logits, passed.target, passed.pattern if pattern is None else pattern
    elif "gradcam" in wanted:
        last = _last_block_pass(loaded, x, target, keep_pattern=needs_pattern)
        maps["gradcam"] = gradcam_map(last.last_norm1[p:], last.last_norm1_grad[p:], geometry.grid)
        logits, c, pattern = last.logits, last.target, last.pattern if pattern is None else pattern
    elif needs_pattern:
        logits, pattern = _pattern_pass(loaded, x)
    if c is None and logits is not None:
        c = resolve_target(loaded, logits, target)
    if "raw_attention" in wanted:
        maps["raw_attention"] = raw_attention_map(pattern, geometry)
    if "rollout" in wanted:
        maps["rollout"] = rollout_map(pattern, geometry)

    unsupported: dict[str, str] = {}
    picks: dict[str, lrp.LrpChoice] = {}
    choice_probs: KeptSetProbs | None = None
    lrp_methods = [m for m in lrp.LRP_METHODS if m in wanted]
    reason = lrp.why_unsupported(loaded.model) if lrp_methods else None
    if reason:
        unsupported = {m: reason for m in lrp_methods}
    elif lrp_methods:
        choices = lrp.gamma_candidates(loaded.model) if choose_gamma else (lrp.EPSILON_ONLY,)
        result, candidate_maps = _lrp_maps(loaded, x, c if c is not None else target, lrp_methods, choices)
        c = result.target if c is None else c
        gap = None if logits is None else float(np.abs(result.logits - logits).max())
        if gap is not None and gap > LRP_LOGIT_TOLERANCE * max(1.0, float(np.abs(logits).max())):
            _logger.warning("LRP forward of %s differs from the model's logits by %.3g", loaded.name, gap)
            why = (f"AttnLRP's forward, written out op by op, does not reproduce this model's logits (they differ by "
                   f"{gap:.2g}), so its maps would explain another function.")
            unsupported = {m: why for m in lrp_methods}
        else:
            if choose_gamma:
                if scorer is None:
                    choice_probs = KeptSetProbs(loaded, x, c)
                    scorer = faithfulness_scorer(loaded, image, c, choice_steps, choice_probs)
                picks = lrp.choose_per_method(candidate_maps, scorer)
            for m in lrp_methods:
                maps[m] = candidate_maps[(m, picks[m].name if m in picks else lrp.EPSILON_ONLY.name)]

    ordered = {m: maps[m] for m in METHODS if m in maps}
    for m in ordered.values():
        m.setflags(write=False)
    if c is None:  # nothing was asked for
        c = resolve_target(loaded, _pattern_pass(loaded, x)[0], target)
    return Relevance(target=c, maps=ordered, unsupported=unsupported, gamma_choice=picks,
                     choice_sets=choice_probs.known_sets() if choice_probs is not None and choice_probs.known else None)


# ----------------------------------------------------------------------------------------------
