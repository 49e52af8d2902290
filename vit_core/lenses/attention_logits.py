"""The attention logits: q.k^T x scale before the softmax, and the part of a query's row the key norms alone explain
(docs/spec/analyses.md, "Attention logits"). A built-in lens: `vit-lens analyze --lens attention_logits`."""

from __future__ import annotations

import numpy as np

from .declare import lens


def attention_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(q x scale) k^T with timm's scale d_head^-1/2, as its un-fused Attention computes it before the softmax.
    q, k: (..., H, T, d_head) -> (..., H, T, T), rows = queries."""
    return (q * np.float32(q.shape[-1] ** -0.5)) @ np.swapaxes(k, -1, -2)


def key_norm_fit(rows: np.ndarray, key_norms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares line through each row of logits over the keys against those keys' norms:
    rows (..., N) and key_norms (..., N) (broadcast) -> the fitted rows a + b ||k_j|| (..., N) and R^2 (...,), the
    squared correlation of row and norms (0 where either is constant). In float64, returned as float32."""
    y, x = rows.astype(np.float64), np.broadcast_to(key_norms, rows.shape).astype(np.float64)
    dx, dy = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    sxx, syy, sxy = (dx * dx).sum(-1), (dy * dy).sum(-1), (dx * dy).sum(-1)
    slope = np.divide(sxy, sxx, out=np.zeros_like(sxy), where=sxx > 0)
    fitted = y.mean(-1, keepdims=True) + slope[..., None] * dx
    r2 = np.divide(sxy * sxy, sxx * syy, out=np.zeros_like(sxy), where=(sxx > 0) & (syy > 0))
    return fitted.astype(np.float32), r2.astype(np.float32)


def query_row(scores: np.ndarray, key_norms: np.ndarray, query: int, num_prefix: int, grid: tuple[int, int]
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """One head's logits of `query` over the image's patches and the part the key norms explain: scores (T, T),
    key_norms (T,) -> the row (gh, gw), its fit on the patches' key norms (gh, gw), and R^2."""
    row, norms = scores[query, num_prefix:], key_norms[num_prefix:]  # (N,) each: the prefix tokens are not the image
    fitted, r2 = key_norm_fit(row, norms)
    return row.reshape(grid), fitted.reshape(grid), float(r2)


@lens("attention_logits", sites=["blocks.*.attn.q", "blocks.*.attn.k"], spec="Attention logits",
      keys=("scores", "key_norms", "key_norm_r2"))
def attention_logits(cap) -> dict[str, np.ndarray]:
    """scores (L, H, T, T), the keys' norms (L, H, T), and key_norm_r2 (L, H, T): for each query, the share of its
    row's variance over the patches that the patches' key norms explain."""
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head) each
    p = cap.geometry.num_prefix_tokens
    scores = attention_scores(q, k)  # (L, H, T, T)
    key_norms = np.linalg.norm(k.astype(np.float64), axis=-1).astype(np.float32)  # (L, H, T)
    _, r2 = key_norm_fit(scores[..., p:], key_norms[:, :, None, p:])  # (L, H, T, N) against (L, H, 1, N) -> (L, H, T)
    return {"scores": scores, "key_norms": key_norms, "key_norm_r2": r2}
