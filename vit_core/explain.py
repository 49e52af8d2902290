"""Why this prediction: relevance maps, the logit lens, interventions and the faithfulness test.

Definitions: shared/spec/analyses.md, "Why this prediction". Shapes: L layers, H heads, T = P + N
tokens (P prefix tokens first, then N = gh*gw patches row-major), D width, C classes, S curve steps.

Two kinds of functions live here:

- pure ones on numpy arrays (`raw_attention_map`, `chefer_map`, `gradcam_map`, `deletion_counts`,
  `insertion_counts`, `patch_order`, `auc`), each one definition of the spec, tested against loops;
- entry points that run the shared model (`relevance_maps`, `logit_lens`, `patch_logit_lens`,
  `predict_intervened`, `faithfulness`). Each takes `loaded.lock` around every forward: a capture on
  another thread registers hooks on the same modules, which a concurrent forward would fire.

The capture (`run_with_capture`) stays in `inference_mode`. The relevance pass is its own entry point
with the same hygiene: hooks and the `fused_attn` flags restored also on error (through
`capture.attention_recorded` and the capture's hook registry), every parameter frozen for the pass
and its `requires_grad` restored, so no `.grad` is ever written to the model.

The model may live on any device (`LoadedModel.device`): every tensor an entry point hands it is made
there (`model_input`, `capture.on_model_device`), every pass runs in full float32 (`_model_pass`), and
results come back to the host as float32 numpy (`capture.to_host`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal, Mapping

import numpy as np
import torch
from PIL import Image

from . import analyses
from .capture import Capture, _register, attention_recorded, full_float32, on_model_device, preprocess, to_host
from .errors import CaptureError, ViTLensError
from .loading import Geometry, LoadedModel

METHODS = ("raw_attention", "rollout", "chefer", "gradcam", "attnlrp")  # display order
RANDOM = "random"  # the name of the random baseline in the faithfulness curves
RANDOM_ORDERS = 8
DEFAULT_STEPS = 10

ATTNLRP_UNSUPPORTED = (
    "AttnLRP is not available for timm ViTs: the lxt package (2.1) supports torchvision's ViT only, "
    "by patching torch's LayerNorm and GELU classes process-wide, and has no rules for timm's attention."
)

Ablation = Literal["zero", "mean"]


class TargetError(ViTLensError, ValueError):
    """A target class that the model does not have (index out of range, unknown label)."""


class InterventionError(ViTLensError, ValueError):
    """An intervention the model can't run: a patch or head it does not have, an unknown ablation, or
    every patch dropped from a model that pools its patch tokens (no class token)."""


# ----------------------------------------------------------------------------------------------
# Target class


def resolve_target(loaded: LoadedModel, logits: np.ndarray, target: int | str | None = None) -> int:
    """The target class c: None -> top-1 of `logits` (C,) (ties: the lower index, as `analyses.top_k`);
    an int -> that class index; a string -> the class whose label (or its first comma-separated part)
    equals it, case-insensitive, or a decimal index. Raises TargetError (a ValueError) with a message for the user."""
    num_classes = int(logits.shape[-1])
    if target is None:
        return int(np.argmax(logits))  # argmax returns the first maximum: the lower index wins ties
    if isinstance(target, str):
        wanted = target.strip().lower()
        if wanted.isdigit():
            return resolve_target(loaded, logits, int(wanted))
        for i in range(num_classes):
            label = loaded.label(i).lower()
            if wanted in (label, label.split(",")[0].strip()):
                return i
        raise TargetError(f"no class is labelled {target!r}")
    index = int(target)
    if not 0 <= index < num_classes:
        raise TargetError(f"class index {index} is outside 0..{num_classes - 1}")
    return index


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


@contextlib.contextmanager
def parameters_frozen(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block no parameter requires grad (so backward writes no `.grad`); every parameter's
    `requires_grad` is restored on exit, also when the block raises."""
    with contextlib.ExitStack() as stack:
        for param in model.parameters():
            stack.callback(param.requires_grad_, param.requires_grad)
            param.requires_grad_(False)
        yield


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside the block; the previous mode restored on exit."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _model_pass(loaded: LoadedModel) -> Iterator[None]:
    """A forward of the shared model without gradients: its lock held, eval mode, ViT Lens's float32 (`full_float32`:
    no TF32 on a GPU, linears on oneDNN on a CPU)."""
    with loaded.lock, torch.inference_mode(), eval_mode(loaded.model), full_float32(loaded.device):
        yield


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
        _register(stack, model, model.blocks[0].register_forward_pre_hook(block_input_as_leaf))
        for blk in model.blocks:
            _register(stack, model, blk.attn.attn_drop.register_forward_hook(keep_pattern))
        _register(stack, model, model.blocks[-1].norm1.register_forward_hook(lambda m, i, o: live["norm1"].append(o)))
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


def model_input(loaded: LoadedModel, image: Image.Image | Capture) -> torch.Tensor:
    """The normalised model input (1, 3, H, W) of `image`, on the model's device: a picture preprocessed as the
    capture does, or a Capture of it, whose `input_tensor` is exactly that input (no second decode and preprocessing)."""
    if isinstance(image, Capture):
        x = torch.tensor(image.input_tensor).unsqueeze(0)  # (3, H, W) -> (1, 3, H, W), a writable copy
    else:
        x = preprocess(loaded, image)[1]
    return on_model_device(loaded.model, x)


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
# Logit lens


def head_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's own head path on a token sequence: forward_head(norm(tokens)). (B, T, D) -> (B, C)"""
    return model.forward_head(model.norm(tokens))


def logit_lens(loaded: LoadedModel, cap: Capture) -> np.ndarray:
    """What the model would predict after each block: forward_head(norm(tokens[l])) for the L+1 token
    sequences of `cap` (row 0: entering block 0; row l: after block l). -> float32 (L+1, C); row L
    equals cap.logits within float32 tolerance."""
    model = loaded.model
    tokens = on_model_device(model, torch.from_numpy(np.array(cap.tokens, dtype=np.float32)))  # (L+1, T, D)
    with _model_pass(loaded):
        return to_host(head_logits(model, tokens))  # (L+1, C)


def patch_logit_lens(loaded: LoadedModel, cap: Capture, layer: int) -> np.ndarray:
    """Every patch token of `layer` (0..L, as in `logit_lens`) through norm, fc_norm and head, without
    pooling: float32 (N, C) logits, patches row-major."""
    model, p = loaded.model, loaded.geometry.num_prefix_tokens
    patches = on_model_device(model, torch.from_numpy(np.array(cap.tokens[layer, p:], dtype=np.float32)))  # (N, D)
    with _model_pass(loaded):
        return to_host(model.head(model.fc_norm(model.norm(patches))))  # (N, C)


# ----------------------------------------------------------------------------------------------
# Interventions


def embedded_tokens(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The token sequence that enters `patch_drop`: patch embedding, prefix tokens, position. (B, 3, H, W) -> (B, T, D)"""
    return model._pos_embed(model.patch_embed(x))


def run_from_embedded(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The rest of timm's forward from what enters `patch_drop` (any sequence length): (B, T', D) -> (B, C)."""
    return head_logits(model, model.blocks(model.norm_pre(model.patch_drop(tokens))))


def keep_tokens(tokens: torch.Tensor, kept_patches: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """The prefix tokens and the kept patches, in the order given.
    tokens (1 or B, T, D), kept_patches (B, K) patch indices 0..N-1 (on any device) -> (B, P + K, D) on the tokens' device."""
    batch = kept_patches.shape[0]
    tokens = tokens.expand(batch, -1, -1)
    kept_patches = kept_patches.to(tokens.device)
    prefix = torch.arange(num_prefix_tokens, device=tokens.device).expand(batch, -1)  # (B, P)
    index = torch.cat([prefix, kept_patches + num_prefix_tokens], dim=1)
    return torch.gather(tokens, 1, index[..., None].expand(-1, -1, tokens.shape[-1]))  # (B, P + K, D)


def mask_patches(x: torch.Tensor, patches: Iterable[int], geometry: Geometry) -> torch.Tensor:
    """The normalised input with the pixels of `patches` set to 0 (the normalisation mean). (B, 3, H, W), a copy."""
    (_, gw), (ph, pw) = geometry.grid, geometry.patch_size
    masked = x.clone()
    for k in patches:
        row, col = divmod(int(k), gw)
        masked[:, :, row * ph:(row + 1) * ph, col * pw:(col + 1) * pw] = 0
    return masked


@contextlib.contextmanager
def heads_ablated(model: torch.nn.Module, heads: Iterable[tuple[int, int]], ablation: Ablation = "zero") -> Iterator[None]:
    """Inside the block, head h of layer l (its slice of `attn @ v`, i.e. of the (B, T, H*hd) input of
    `attn.proj`) is set to 0 ("zero") or to its mean over the sequence's tokens ("mean"). Hooks removed
    on exit."""
    if ablation not in ("zero", "mean"):
        raise InterventionError(f"unknown ablation {ablation!r}; use 'zero' or 'mean'")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(int(layer), []).append(int(head))

    def hook_for(attn: torch.nn.Module, chosen: list[int]) -> Callable:
        head_dim = attn.head_dim

        def ablate(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            out = args[0].clone()  # (B, T, H*hd)
            for h in chosen:
                part = out[..., h * head_dim:(h + 1) * head_dim]
                out[..., h * head_dim:(h + 1) * head_dim] = 0 if ablation == "zero" else part.mean(dim=1, keepdim=True)
            return (out, *args[1:])

        return ablate

    with contextlib.ExitStack() as stack:
        for layer, chosen in by_layer.items():
            if not 0 <= layer < len(model.blocks):
                raise InterventionError(f"layer {layer} is outside 0..{len(model.blocks) - 1}")
            attn = model.blocks[layer].attn
            if not all(0 <= h < attn.num_heads for h in chosen):
                raise InterventionError(f"a head of layer {layer} is outside 0..{attn.num_heads - 1}")
            _register(stack, model, attn.proj.register_forward_pre_hook(hook_for(attn, chosen)))
        yield


def predict_intervened(loaded: LoadedModel, image: Image.Image | Capture, *, drop: Iterable[int] = (), mask: Iterable[int] = (),
                       ablate: Iterable[tuple[int, int]] = (), ablation: Ablation = "zero") -> np.ndarray:
    """The logits (C,) float32 after an intervention, any combination of: `drop` patch tokens (indices
    0..N-1) after the position embedding; `mask` patches in pixel space (normalised input 0); `ablate`
    heads given as (layer, head), by `ablation` "zero" or "mean". No intervention: the plain logits.
    Raises InterventionError (a ValueError) for patches or heads the model lacks, or no patch left to pool."""
    model, geometry = loaded.model, loaded.geometry
    dropped, masked = set(int(k) for k in drop), [int(k) for k in mask]
    if not all(0 <= k < geometry.num_patches for k in dropped | set(masked)):
        raise InterventionError(f"a patch index is outside 0..{geometry.num_patches - 1}")
    if len(dropped) == geometry.num_patches and not geometry.has_class_token:
        raise InterventionError("keep at least one patch: this model pools its patch tokens (it has no class token)")
    kept = torch.tensor([k for k in range(geometry.num_patches) if k not in dropped], dtype=torch.long)[None]  # (1, K)
    x = model_input(loaded, image)  # (1, 3, H, W)
    x = mask_patches(x, masked, geometry)
    with _model_pass(loaded), heads_ablated(model, ablate, ablation):
        tokens = keep_tokens(embedded_tokens(model, x), kept, geometry.num_prefix_tokens)
        return to_host(run_from_embedded(model, tokens)[0])  # (1, C) -> (C,)


# ----------------------------------------------------------------------------------------------
# Faithfulness: deletion and insertion curves


def patch_order(relevance: np.ndarray) -> np.ndarray:
    """Patches by relevance descending, ties by index ascending (a stable sort): (gh, gw) -> (N,) int64."""
    return np.argsort(-relevance.reshape(-1).astype(np.float64), kind="stable").astype(np.int64)


def deletion_counts(num_patches: int, steps: int) -> list[int]:
    """n_k = round(k N / S) patches dropped at k = 0..S-1 (Python's round: halves to even)."""
    return [round(k * num_patches / steps) for k in range(steps)]


def insertion_counts(num_patches: int, steps: int) -> list[int]:
    """n_k = max(1, round(k N / S)) patches kept at k = 1..S."""
    return [max(1, round(k * num_patches / steps)) for k in range(1, steps + 1)]


def deletion_x(steps: int) -> np.ndarray:
    return np.arange(steps) / steps  # (S,): k / S, k = 0..S-1


def insertion_x(steps: int) -> np.ndarray:
    return np.arange(1, steps + 1) / steps  # (S,): k / S, k = 1..S


def auc(curve: np.ndarray, x: np.ndarray) -> float:
    """Trapezoid rule over the points (x_k, curve_k)."""
    return float(np.trapezoid(np.asarray(curve, dtype=np.float64), x))


def random_patch_orders(num_patches: int, count: int = RANDOM_ORDERS, seed: int = 0) -> np.ndarray:
    """`count` seeded random patch orders: (count, N) int64."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(num_patches) for _ in range(count)]).astype(np.int64)


@dataclass(frozen=True)
class Faithfulness:
    """Deletion and insertion curves (p_c per step) of every method and of the random baseline."""

    target: int
    steps: int
    deletion: dict[str, np.ndarray]  # name -> float32 (S,), x_k = k/S, k = 0..S-1; methods in order, then "random"
    insertion: dict[str, np.ndarray]  # name -> float32 (S,), x_k = k/S, k = 1..S
    deletion_auc: dict[str, float]
    insertion_auc: dict[str, float]
    random_deletion_std: np.ndarray  # float32 (S,): spread of the random orders' deletion curves (ddof 0)
    random_insertion_std: np.ndarray  # float32 (S,)
    beats_random: dict[str, bool]  # method -> deletion AUC below random's and insertion AUC above random's


@dataclass(frozen=True)
class MethodCurves:
    """One finished unit of the faithfulness test: a method's curves, or the random baseline's (the mean of its orders)."""

    name: str  # a method, or RANDOM
    deletion: np.ndarray  # float32 (S,)
    insertion: np.ndarray  # float32 (S,)
    deletion_auc: float
    insertion_auc: float
    deletion_std: np.ndarray | None = None  # float32 (S,): the random orders' spread (ddof 0); None for a method
    insertion_std: np.ndarray | None = None


def faithfulness_of(target: int, steps: int, finished: Iterable[MethodCurves]) -> Faithfulness:
    """The result of the finished units (the random baseline among them): the methods in the order given, then
    "random". Also for a partial result, while the other methods are still running."""
    units = list(finished)
    baseline = next(u for u in units if u.name == RANDOM)
    methods = [u for u in units if u.name != RANDOM] + [baseline]
    return Faithfulness(
        target=int(target),
        steps=steps,
        deletion={u.name: u.deletion for u in methods},
        insertion={u.name: u.insertion for u in methods},
        deletion_auc={u.name: u.deletion_auc for u in methods},
        insertion_auc={u.name: u.insertion_auc for u in methods},
        random_deletion_std=baseline.deletion_std,
        random_insertion_std=baseline.insertion_std,
        beats_random={u.name: u.deletion_auc < baseline.deletion_auc and u.insertion_auc > baseline.insertion_auc
                      for u in methods[:-1]},
    )


class _KeptSetProbs:
    """p_c of kept-patch sets, each distinct set run once over one call (every order keeps all patches at deletion
    step 0 and the last insertion step: the two longest forwards, shared by every method and the random orders)."""

    def __init__(self, loaded: LoadedModel, tokens: torch.Tensor, target: int):
        self.loaded, self.tokens, self.target = loaded, tokens, target  # tokens (1, T, D)
        self.known: dict[bytes, float] = {}  # sorted kept patches -> p_c

    def __call__(self, rows: list[np.ndarray]) -> np.ndarray:
        """p_c for each kept set (K_i,) of `rows`; the new sets batched by length (one forward per length). -> (B,)"""
        kept_sorted = [np.sort(r).astype(np.int64) for r in rows]  # the kept patches stay in sequence order
        by_length: dict[int, dict[bytes, np.ndarray]] = {}
        for r in kept_sorted:
            if r.tobytes() not in self.known:
                by_length.setdefault(len(r), {})[r.tobytes()] = r
        for length in sorted(by_length, reverse=True):
            keys, kept = list(by_length[length]), np.stack(list(by_length[length].values())).reshape(-1, length)  # (U, K)
            with _model_pass(self.loaded):
                logits = run_from_embedded(self.loaded.model, keep_tokens(
                    self.tokens, torch.from_numpy(kept), self.loaded.geometry.num_prefix_tokens))
            probs = analyses.softmax(to_host(logits))[:, self.target]  # (U, C) -> (U,)
            self.known.update(zip(keys, probs.tolist(), strict=True))
        return np.array([self.known[r.tobytes()] for r in kept_sorted], dtype=np.float32)  # (B,)


def _unit_curves(probs: _KeptSetProbs, name: str, orders: np.ndarray, steps: int) -> MethodCurves:
    """Deletion and insertion curves of one unit: a method's order (1, N) or the random orders (R, N), all of its
    2 S perturbed inputs batched by kept length (deletion step k and insertion step S - k keep about as many)."""
    n = orders.shape[1]
    deleted, inserted = deletion_counts(n, steps), insertion_counts(n, steps)
    rows = [o[d:] for d in deleted for o in orders] + [o[:k] for k in inserted for o in orders]  # (2 S R) kept sets
    p = probs(rows).reshape(2, steps, len(orders)).astype(np.float64)  # (2, S, R): deletion, insertion
    del_curves, ins_curves = p[0].T, p[1].T  # (R, S) each
    deletion, insertion = del_curves.mean(axis=0).astype(np.float32), ins_curves.mean(axis=0).astype(np.float32)  # (S,)
    spread = name == RANDOM
    return MethodCurves(name=name, deletion=deletion, insertion=insertion,
                        deletion_auc=auc(deletion, deletion_x(steps)), insertion_auc=auc(insertion, insertion_x(steps)),
                        deletion_std=del_curves.std(axis=0).astype(np.float32) if spread else None,
                        insertion_std=ins_curves.std(axis=0).astype(np.float32) if spread else None)


def faithfulness_by_method(loaded: LoadedModel, image: Image.Image | Capture, maps: Mapping[str, np.ndarray], target: int, *,
                           steps: int = DEFAULT_STEPS, random_orders: int = RANDOM_ORDERS, seed: int = 0,
                           progress: Callable[[float, str], None] | None = None) -> Iterator[MethodCurves]:
    """The deletion and insertion curves of p_c (analyses.md), one unit at a time as each finishes: first the
    random baseline (the mean of `random_orders` seeded orders, with their std; every method is compared with
    it), then each map (gh, gw) in the order given. `progress(done_fraction, message)` after each unit.

    A unit's 2 S perturbed inputs run batched by length; a kept-patch set already run (the full set) is not
    run again. Same curves as all orders batched per step (one forward per step), but the first methods'
    results come before the last one is run."""
    geometry = loaded.geometry
    n = geometry.num_patches
    x = model_input(loaded, image)  # (1, 3, H, W)
    with _model_pass(loaded):
        tokens = embedded_tokens(loaded.model, x)  # (1, T, D), computed once
    probs = _KeptSetProbs(loaded, tokens, target)
    units = [(RANDOM, random_patch_orders(n, random_orders, seed))] + [
        (m, patch_order(maps[m]).reshape(1, n)) for m in maps]  # name -> orders (R or 1, N)
    report = progress or (lambda fraction, message: None)
    for i, (name, orders) in enumerate(units):
        unit = _unit_curves(probs, name, orders, steps)
        report((i + 1) / len(units), f"{name} done, {i + 1} of {len(units)}")
        yield unit


def faithfulness(loaded: LoadedModel, image: Image.Image | Capture, maps: Mapping[str, np.ndarray], target: int, *,
                 steps: int = DEFAULT_STEPS, random_orders: int = RANDOM_ORDERS, seed: int = 0,
                 progress: Callable[[float, str], None] | None = None) -> Faithfulness:
    """Deletion and insertion curves of p_c (analyses.md) for each map (gh, gw), in the order given,
    then for "random": the mean of `random_orders` (default 8) seeded orders, with their std.
    All of `faithfulness_by_method` (which see) at once. Returns curves and AUCs keyed by method name and "random"."""
    finished = faithfulness_by_method(loaded, image, maps, target, steps=steps, random_orders=random_orders, seed=seed,
                                      progress=progress)
    return faithfulness_of(target, steps, finished)
