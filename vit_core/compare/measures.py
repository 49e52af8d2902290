"""The comparisons of two models, as pure functions of arrays (definitions: docs/spec/analyses.md, "Two models").

- `linear_cka`: linear CKA between two sets of tokens, from their sums (so the sums can be added up over images first);
- `attention_js`: the Jensen-Shannon divergence between two attention patterns, row by row;
- `prediction_kl`: KL(p_a || p_b) between two models' softmax outputs;
- `pearson`: the correlation of two maps.

numpy versions are the definitions; `torch_*` versions compute the same on a model's device, batched, for the engine.
Shapes: n tokens, D widths, L blocks, H heads, T tokens per image, C classes, F images in a forward.
"""

from __future__ import annotations

import numpy as np
import torch


def centred_cross(cross: np.ndarray, sum_a: np.ndarray, sum_b: np.ndarray, n: int) -> np.ndarray:
    """X_c^T Y_c from the sums: cross = X^T Y (Da, Db), sum_a = the column sums of X (Da,), sum_b of Y (Db,), n rows
    -> float64 (Da, Db) = X^T Y - (sum X)(sum Y)^T / n."""
    return np.asarray(cross, dtype=np.float64) - np.outer(sum_a, sum_b) / n


def linear_cka(cross: np.ndarray, self_a: np.ndarray, self_b: np.ndarray, centred: bool = True, *,
               sum_a: np.ndarray | None = None, sum_b: np.ndarray | None = None, n: int | None = None) -> float:
    """Linear CKA (Kornblith et al. 2019) of X (n, Da) and Y (n, Db), each column centred:
    ||X^T Y||_F^2 / (||X^T X||_F ||Y^T Y||_F), from the uncentred sums cross = X^T Y (Da, Db), self_a = X^T X (Da, Da),
    self_b = Y^T Y (Db, Db) and, unless `centred` is False (sums of centred columns given), the column sums and n.
    In [0, 1]; NaN where a side has no spread (a constant X)."""
    if centred:
        cross = centred_cross(cross, sum_a, sum_b, n)
        self_a = centred_cross(self_a, sum_a, sum_a, n)
        self_b = centred_cross(self_b, sum_b, sum_b, n)
    numerator = float(np.sum(np.square(cross, dtype=np.float64)))
    denominator = float(np.linalg.norm(self_a)) * float(np.linalg.norm(self_b))
    return numerator / denominator if denominator > 0 else float("nan")


def _xlogy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x log y with 0 log 0 = 0 (a key no one attends to adds nothing)."""
    return np.where(x > 0, x * np.log(np.where(x > 0, y, 1.0)), 0.0)


def attention_js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (nats) of each attention row: p, q (..., T) rows that sum to 1 -> float64 (...) =
    (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2; 0 for equal rows, at most log 2."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    m = (p + q) / 2
    return (np.sum(_xlogy(p, p) - _xlogy(p, m), axis=-1) + np.sum(_xlogy(q, q) - _xlogy(q, m), axis=-1)) / 2


def prediction_kl(logits_a: np.ndarray, logits_b: np.ndarray) -> np.ndarray:
    """KL(p_a || p_b) in nats of the softmax outputs: logits (..., C) each -> float64 (...)."""
    log_a = _log_softmax(np.asarray(logits_a, dtype=np.float64))
    log_b = _log_softmax(np.asarray(logits_b, dtype=np.float64))
    return np.sum(np.exp(log_a) * (log_a - log_b), axis=-1)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation of two maps of one shape (flattened), float64; NaN where one is constant."""
    a = np.asarray(a, dtype=np.float64).ravel() - np.mean(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).ravel() - np.mean(b, dtype=np.float64)
    denominator = float(np.sqrt(np.sum(a * a) * np.sum(b * b)))
    return float(np.sum(a * b)) / denominator if denominator > 0 else float("nan")


# ----------------------------------------------------------------------------------------------
# The same on a model's device, batched (the engine's per-image values)


def torch_attention_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """attention_js of each image and head, averaged over the query rows: p, q (F, H, T, T) -> float64 (F, H). As
    (sum p log p + sum q log q) / 2 - sum m log m (the same quantity: sum (p + q) log m = 2 sum m log m), 0 exactly
    for equal rows."""
    p, q = p.double(), q.double()
    m = (p + q) / 2
    own = (torch.xlogy(p, p).sum(dim=-1) + torch.xlogy(q, q).sum(dim=-1)) / 2  # (F, H, T)
    return (own - torch.xlogy(m, m).sum(dim=-1)).mean(dim=-1)


def torch_prediction_kl(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """prediction_kl of each image: (F, C) each -> float64 (F,)."""
    log_a, log_b = logits_a.double().log_softmax(dim=-1), logits_b.double().log_softmax(dim=-1)
    return (log_a.exp() * (log_a - log_b)).sum(dim=-1)


def torch_rollout_step(rollout: torch.Tensor | None, pattern: torch.Tensor) -> torch.Tensor:
    """One layer of analyses.rollout_matrix (mean over heads): R <- rownorm(0.5 fuse(A) + 0.5 I) R, float64;
    pattern (F, H, T, T), rollout (F, T, T) or None before the first layer -> (F, T, T)."""
    fused = pattern.double().mean(dim=1)  # (F, H, T, T) -> (F, T, T)
    eye = torch.eye(fused.shape[-1], dtype=torch.float64, device=fused.device)
    a = 0.5 * fused + 0.5 * eye
    a = a / a.sum(dim=-1, keepdim=True)
    return a if rollout is None else a @ rollout


def rollout_maps(rollout: torch.Tensor, num_prefix_tokens: int, has_class_token: bool) -> torch.Tensor:
    """analyses.attention_rollout's map of each image, flattened: rollout (F, T, T) -> float64 (F, N): the class token's
    row over the patch keys, or the mean of the patch rows where there is no class token."""
    p = num_prefix_tokens
    row = rollout[:, 0] if has_class_token else rollout[:, p:].mean(dim=1)  # (F, T)
    return row[:, p:]


def torch_pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """pearson of each image's two maps: (F, N) each -> float64 (F,), NaN where one is constant."""
    a = a.double() - a.double().mean(dim=-1, keepdim=True)
    b = b.double() - b.double().mean(dim=-1, keepdim=True)
    return (a * b).sum(dim=-1) / torch.sqrt((a * a).sum(dim=-1) * (b * b).sum(dim=-1))
