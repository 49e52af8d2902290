"""The paper's analyses as pure functions of numpy arrays.

Every function here implements one definition of `docs/spec/analyses.md` and nothing else: no
model, no torch, no I/O, so each can be checked against a naive loop-based version. Conventions:

- a token axis has T = P + gh*gw entries, P prefix tokens first (class, distillation, registers),
  then patches in row-major order (patch k at row k // gw, column k % gw);
- `pattern` is post-softmax attention (L, H, T, T): layer, head, query, key; rows sum to 1;
- distances are in input pixels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

Fusion = Literal["mean", "max", "min"]


# ----------------------------------------------------------------------------------------------
# Patch splitting and the patch embedding as a linear map


def split_patches(image: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """Cut an image into its patch grid, row-major.

    image: (H, W, C) with H = gh*ph, W = gw*pw  ->  (gh*gw, ph, pw, C)
    """
    ph, pw = patch_size
    height, width, channels = image.shape
    assert height % ph == 0 and width % pw == 0, f"image {height}x{width} is not a multiple of patch {ph}x{pw}"
    gh, gw = height // ph, width // pw
    patches = image.reshape(gh, ph, gw, pw, channels)  # (gh, ph, gw, pw, C)
    patches = patches.transpose(0, 2, 1, 3, 4)  # (gh, gw, ph, pw, C)
    return patches.reshape(gh * gw, ph, pw, channels)


def flatten_patches(patches: np.ndarray) -> np.ndarray:
    """Flatten each patch pixel by pixel, channels innermost: (N, ph, pw, C) -> (N, ph*pw*C).

    This is the paper's x_p in R^{N x (P^2 C)}, in the "(p1 p2 c)" order of the common einops
    rearrangement.
    """
    return patches.reshape(patches.shape[0], -1)


def patch_embed_as_linear(weight: np.ndarray) -> np.ndarray:
    """The patch-embedding Conv2d weight rewritten as the matrix E of the paper (eq. 1).

    weight: (D, C, ph, pw)  ->  E: (D, ph*pw*C), columns in the order of `flatten_patches`.
    Because kernel = stride = patch size, conv(x)[:, i, j] == E @ flatten(patch(i, j)) + bias.
    """
    return weight.transpose(0, 2, 3, 1).reshape(weight.shape[0], -1)  # (D, C, ph, pw) -> (D, ph, pw, C) -> (D, F)


def embed_patches_linear(flat_patches: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Patch embeddings computed as a plain matrix product, x_p E^T + b.

    flat_patches: (N, ph*pw*C) of the *normalised* input tensor; weight: (D, C, ph, pw); bias: (D,)
    -> (N, D), equal to the Conv2d output flattened row-major.
    """
    out = flat_patches.astype(np.float64) @ patch_embed_as_linear(weight).astype(np.float64).T
    if bias is not None:
        out = out + bias
    return out.astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Embedding filters (paper Fig. 7 left)


def filter_images(weight: np.ndarray) -> np.ndarray:
    """Patch-embedding filters as RGB images: (D, C, ph, pw) -> (D, ph, pw, C), unscaled."""
    return weight.transpose(0, 2, 3, 1)


@dataclass(frozen=True)
class FilterPCA:
    components: np.ndarray  # (k, ph, pw, C), each unit norm over its ph*pw*C values, unscaled
    explained_variance_ratio: np.ndarray  # (k,), share of the total variance of the D filters
    mean_filter: np.ndarray  # (ph, pw, C)


PCA_COMPONENTS = 28  # the paper's Fig. 7 (left) shows 28


def filters_pca(weight: np.ndarray, k: int = PCA_COMPONENTS) -> FilterPCA:
    """Top-k principal components of the patch-embedding filters.

    The D filters are D samples of ph*pw*C features (flattened as in `filter_images`); the mean
    filter is subtracted and the principal directions are the eigenvectors of the centred data's
    scatter matrix, largest eigenvalue first. Explained-variance ratio = lambda_i / sum_j lambda_j
    over all components. The sign of a component is arbitrary; k is capped at min(D, F).

    Computed with `eigh` on the smaller of the Gram (D x D) and scatter (F x F) matrices: several
    times faster than an SVD of the (D, F) matrix with the same result.
    """
    images = filter_images(weight).astype(np.float64)  # (D, ph, pw, C)
    num_filters, ph, pw, channels = images.shape
    samples = images.reshape(num_filters, -1)  # (D, F)
    mean = samples.mean(axis=0)
    centred = samples - mean
    if num_filters <= centred.shape[1]:
        eigval, u = np.linalg.eigh(centred @ centred.T)  # Gram (D, D), ascending
        eigval, u = np.clip(eigval[::-1], 0, None), u[:, ::-1]
        directions = centred.T @ u / np.sqrt(np.maximum(eigval, 1e-300))  # (F, D): v_i = X^T u_i / s_i
    else:
        eigval, directions = np.linalg.eigh(centred.T @ centred)  # scatter (F, F), ascending
        eigval, directions = np.clip(eigval[::-1], 0, None), directions[:, ::-1]
    k = min(k, num_filters, centred.shape[1])
    total = eigval.sum()
    ratio = eigval[:k] / total if total > 0 else np.zeros(k)
    components = directions[:, :k].T  # (k, F)
    components = components / np.maximum(np.linalg.norm(components, axis=1, keepdims=True), 1e-300)
    return FilterPCA(
        components=components.reshape(k, ph, pw, channels).astype(np.float32),
        explained_variance_ratio=ratio.astype(np.float32),
        mean_filter=mean.reshape(ph, pw, channels).astype(np.float32),
    )


def minmax_scale(x: np.ndarray, axis: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Scale to [0, 1] over `axis` (for display only; a constant slice becomes 0.5)."""
    lo = x.min(axis=axis, keepdims=True)
    hi = x.max(axis=axis, keepdims=True)
    span = hi - lo
    safe = np.where(span > 0, span, 1.0)
    return np.where(span > 0, (x - lo) / safe, 0.5).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Position-embedding similarity (paper Fig. 7 center)


def patch_position_rows(pos_embed: np.ndarray, num_prefix_tokens: int, no_embed_class: bool) -> np.ndarray:
    """The rows of a learned absolute position embedding that belong to patches.

    pos_embed: (T_pe, D), T_pe = gh*gw if `no_embed_class` (prefix tokens get no position) else
    num_prefix_tokens + gh*gw  ->  (gh*gw, D)
    """
    return pos_embed if no_embed_class else pos_embed[num_prefix_tokens:]


def cosine_similarity_matrix(rows: np.ndarray) -> np.ndarray:
    """All-pairs cosine similarity: (N, D) -> (N, N)."""
    rows = rows.astype(np.float64)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = rows / np.maximum(norms, 1e-12)
    return (unit @ unit.T).astype(np.float32)


def pos_embed_similarity(
    pos_embed: np.ndarray, num_prefix_tokens: int, no_embed_class: bool, grid: tuple[int, int]
) -> np.ndarray:
    """Cosine similarity of every patch's position embedding with every other patch's.

    pos_embed: (T_pe, D)  ->  (gh*gw, gh, gw): tile k is the similarity map of patch k.
    """
    gh, gw = grid
    rows = patch_position_rows(pos_embed, num_prefix_tokens, no_embed_class)
    assert rows.shape[0] == gh * gw, f"{rows.shape[0]} patch rows for a {gh}x{gw} grid"
    return cosine_similarity_matrix(rows).reshape(gh * gw, gh, gw)


def resample_pos_embed(
    pos_embed: np.ndarray,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int,
    no_embed_class: bool,
) -> np.ndarray:
    """The position embedding for another input resolution, interpolated in 2D as timm does it.

    pos_embed: (T_pe, D) -> (T_pe', D) with gh'*gw' patch rows; prefix rows are left untouched.
    Uses timm's own `resample_abs_pos_embed` (bicubic, antialiased), the code path a model built at
    another `img_size` takes when it loads these weights.
    """
    import torch
    from timm.layers import resample_abs_pos_embed

    prefix = 0 if no_embed_class else num_prefix_tokens
    resampled = resample_abs_pos_embed(
        torch.from_numpy(np.ascontiguousarray(pos_embed, dtype=np.float32))[None],  # (1, T_pe, D)
        new_size=list(new_grid),
        old_size=list(old_grid),
        num_prefix_tokens=prefix,
        verbose=False,
    )
    return resampled[0].numpy()  # (1, T_pe', D) -> (T_pe', D)


# ----------------------------------------------------------------------------------------------
# Attention maps (one head, head mean, prefix share)


def patch_coordinates(grid: tuple[int, int], patch_size: tuple[int, int]) -> np.ndarray:
    """Centres of the patches in input pixels, row-major: (gh*gw, 2) as (y, x)."""
    gh, gw = grid
    ph, pw = patch_size
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    return np.stack([(rows + 0.5) * ph, (cols + 0.5) * pw], axis=1).astype(np.float64)


def patch_distances(grid: tuple[int, int], patch_size: tuple[int, int]) -> np.ndarray:
    """Euclidean distance between every pair of patch centres in pixels: (gh*gw, gh*gw)."""
    centres = patch_coordinates(grid, patch_size)
    return np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)


@functools.lru_cache(maxsize=16)
def _patch_distances_as(grid: tuple[int, int], patch_size: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """patch_distances cast to `dtype`, made once per geometry and read-only: every new image's mean attention
    distances need it, and making it took longer than the sum it feeds."""
    distance = patch_distances(grid, patch_size).astype(dtype)
    distance.setflags(write=False)
    return distance


@dataclass(frozen=True)
class AttentionMap:
    map: np.ndarray  # (gh, gw): attention from the query to each patch key, not renormalised
    prefix_share: float  # share of the query's row that goes to prefix tokens


def attention_map(
    pattern: np.ndarray,
    layer: int,
    head: int | None,
    query: int,
    num_prefix_tokens: int,
    grid: tuple[int, int],
) -> AttentionMap:
    """Row `pattern[layer, head, query]` restricted to patch keys, as a (gh, gw) map.

    head=None gives the head mean. `query` is a token index: 0..P-1 for prefix tokens, P + k for
    patch k. The part of the row that goes to prefix tokens is reported as `prefix_share`.
    """
    gh, gw = grid
    rows = pattern[layer, :, query] if head is None else pattern[layer, head, query][None]  # (H', T)
    row = rows.mean(axis=0)  # (T,)
    return AttentionMap(
        map=row[num_prefix_tokens:].reshape(gh, gw).astype(np.float32),
        prefix_share=float(row[:num_prefix_tokens].sum()),
    )


def prefix_token_shares(
    pattern: np.ndarray, layer: int, head: int | None, query: int, num_prefix_tokens: int
) -> np.ndarray:
    """The attention the query's row gives to each prefix token: (P,), in [0, 1].

    Same row as `attention_map` (head=None: the head mean); its sum is that map's `prefix_share`.
    """
    rows = pattern[layer, :, query] if head is None else pattern[layer, head, query][None]  # (H', T)
    return rows[:, :num_prefix_tokens].mean(axis=0)  # (H', P) -> (P,)


def layer_attention_maps(
    pattern: np.ndarray, layer: int, query: int, num_prefix_tokens: int, grid: tuple[int, int]
) -> np.ndarray:
    """Every head's map for one layer and query: (H, gh, gw)."""
    gh, gw = grid
    rows = pattern[layer, :, query, num_prefix_tokens:]  # (H, gh*gw)
    return rows.reshape(-1, gh, gw)


# ----------------------------------------------------------------------------------------------
# Attention rollout (Abnar & Zuidema 2020; paper Fig. 6)


def fuse_heads(pattern: np.ndarray, fusion: Fusion = "mean") -> np.ndarray:
    """Fuse the heads of each layer: (L, H, T, T) -> (L, T, T)."""
    if fusion == "mean":
        return pattern.mean(axis=1)
    if fusion == "max":
        return pattern.max(axis=1)
    if fusion == "min":
        return pattern.min(axis=1)
    raise ValueError(f"unknown head fusion {fusion!r}; use 'mean', 'max' or 'min'")


def rollout_matrix(pattern: np.ndarray, fusion: Fusion = "mean", last_layer: int | None = None) -> np.ndarray:
    """R = A_last ... A_1 A_0 with A_l = rownorm(0.5 * fuse(pattern[l]) + 0.5 * I).

    pattern: (L, H, T, T) -> R: (T, T). `last_layer` (inclusive, 0-based) stops early; None = all.
    Computed in float64: a product of up to 24+ stochastic matrices.
    """
    fused = fuse_heads(pattern, fusion).astype(np.float64)  # (L, T, T): fuse first, the product needs float64
    stop = fused.shape[0] if last_layer is None else last_layer + 1
    assert 1 <= stop <= fused.shape[0], f"last_layer {last_layer} outside 0..{fused.shape[0] - 1}"
    eye = np.eye(fused.shape[-1])
    result = eye
    for layer in range(stop):
        a = 0.5 * fused[layer] + 0.5 * eye
        a = a / a.sum(axis=-1, keepdims=True)
        result = a @ result  # later layers on the left
    return result


def attention_rollout(
    pattern: np.ndarray,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    fusion: Fusion = "mean",
    last_layer: int | None = None,
    has_class_token: bool | None = None,
) -> np.ndarray:
    """Rollout map: the class token's row of R restricted to patch keys, (gh, gw), unscaled.

    For models without a class token (num_prefix_tokens == 0, or has_class_token=False as for
    register-only models), the mean of the patch rows is used instead.
    """
    gh, gw = grid
    result = rollout_matrix(pattern, fusion, last_layer)  # (T, T)
    if has_class_token is None:
        has_class_token = num_prefix_tokens > 0
    if has_class_token:
        row = result[0]
    else:
        row = result[num_prefix_tokens:].mean(axis=0)
    return row[num_prefix_tokens:].reshape(gh, gw).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Mean attention distance (paper Fig. 7 right, Appendix D.7)


def mean_attention_distance(
    pattern: np.ndarray,
    num_prefix_tokens: int,
    grid: tuple[int, int],
    patch_size: tuple[int, int],
    renormalize: bool = False,
) -> np.ndarray:
    """MAD[l, h] = (1/N) sum_i sum_j pattern[l, h, i, j] * d(i, j) over patch queries i and keys j.

    pattern: (L, H, T, T) -> (L, H) in pixels. Default: attention to prefix tokens is left out and
    not renormalised (Raghu et al. 2021). renormalize=True first rescales each patch row to sum 1
    over patch keys.
    """
    per_query, patch_to_patch = _distance_per_query(pattern, num_prefix_tokens, grid, patch_size)
    return _renormalized_mean(per_query, patch_to_patch) if renormalize else per_query.mean(axis=-1).astype(np.float32)


def mean_attention_distances(
    pattern: np.ndarray, num_prefix_tokens: int, grid: tuple[int, int], patch_size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(mean_attention_distance as defined, and with renormalize=True): both (L, H), the same numbers as the two
    calls, from one pass over the pattern (each new image of the dashboard needs both)."""
    per_query, patch_to_patch = _distance_per_query(pattern, num_prefix_tokens, grid, patch_size)
    return per_query.mean(axis=-1).astype(np.float32), _renormalized_mean(per_query, patch_to_patch)


def _distance_per_query(
    pattern: np.ndarray, num_prefix_tokens: int, grid: tuple[int, int], patch_size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(sum_j pattern[l, h, i, j] * d(i, j) as float64 (L, H, N), the patch-to-patch view (L, H, N, N))."""
    p = num_prefix_tokens
    patch_to_patch = pattern[:, :, p:, p:]  # (L, H, N, N), a view: no copy of the whole pattern
    distance = _patch_distances_as(tuple(grid), tuple(patch_size), patch_to_patch.dtype)  # (N, N)
    return np.einsum("lhij,ij->lhi", patch_to_patch, distance).astype(np.float64), patch_to_patch


def _renormalized_mean(per_query: np.ndarray, patch_to_patch: np.ndarray) -> np.ndarray:
    """(L, H): each query's distance over the mass its row gives to patches, averaged over the queries."""
    row_mass = patch_to_patch.sum(axis=-1, dtype=np.float64)  # (L, H, N): what the row gives to patches
    return (per_query / np.maximum(row_mass, 1e-12)).mean(axis=-1).astype(np.float32)


def uniform_attention_distance(grid: tuple[int, int], patch_size: tuple[int, int]) -> float:
    """MAD of uniform attention over all patches: the mean distance between two patch centres.

    The reference level for the distance plot (about 116.5 px for 14 x 14 patches of 16 px).
    """
    return float(_patch_distances_as(tuple(grid), tuple(patch_size), np.dtype(np.float64)).mean())


def average_over_images(per_image: Sequence[np.ndarray]) -> np.ndarray:
    """Average per-image (L, H) values, as the paper averages over 128 images."""
    assert len(per_image) > 0, "no images to average"
    return np.mean(np.stack(per_image), axis=0).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Token norms and high-norm tokens (Darcet et al., ICLR 2024, "Vision Transformers Need Registers")

HIGH_NORM_IQR_FACTOR = 3.0  # Tukey's far-out fence: Q3 + 3 IQR


def high_norm_fence(patch_norms: np.ndarray) -> np.ndarray:
    """Q3 + 3 IQR of the patch-token norms, per layer: (..., N) -> (...,).

    Quartiles by linear interpolation (numpy's and torch.quantile's default), so a device-side
    version with torch.quantile gives the same fence.
    """
    q1, q3 = np.quantile(patch_norms.astype(np.float64), [0.25, 0.75], axis=-1)
    return (q3 + HIGH_NORM_IQR_FACTOR * (q3 - q1)).astype(np.float32)


def high_norm_patches(norms: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
    """Which patch tokens are high-norm, per layer: norms (L+1, T) -> bool (L+1, N).

    A patch token of layer l is high-norm when its norm exceeds the fence of that layer's patch
    norms (`high_norm_fence`); prefix tokens (class, registers) are never counted.
    """
    patch_norms = norms[..., num_prefix_tokens:]  # (L+1, N)
    return patch_norms > high_norm_fence(patch_norms)[..., None]


def high_norm_rate(norms: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
    """Share of patch tokens that are high-norm, per layer: (L+1, T) -> float32 (L+1,)."""
    return high_norm_patches(norms, num_prefix_tokens).mean(axis=-1).astype(np.float32)


def attention_share_to(pattern_layer: np.ndarray, keys: np.ndarray) -> float:
    """Share of one layer's attention that goes to the chosen keys, averaged over heads and all
    queries: pattern_layer (H, T, T), keys bool (T,) -> a number in [0, 1]."""
    return float(pattern_layer[:, :, keys].sum(axis=-1, dtype=np.float64).mean())


# ----------------------------------------------------------------------------------------------
# Prediction


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax over the last axis, float32."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    prob: float
    logit: float


def top_k(logits: np.ndarray, labels: Sequence[str] | None, k: int = 5) -> list[Prediction]:
    """The k most probable classes, best first (ties broken by the lower index)."""
    probs = softmax(logits)
    k = min(k, logits.shape[-1])
    order = np.lexsort((np.arange(len(probs)), -probs))[:k]
    return [
        Prediction(
            index=int(i),
            label=labels[i] if labels is not None and i < len(labels) else f"class {i}",
            prob=float(probs[i]),
            logit=float(logits[i]),
        )
        for i in order
    ]
