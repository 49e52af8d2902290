"""Perturbation tests of faithfulness: deletion and insertion curves of the target's probability, against a random baseline.

Patches are dropped (deletion) or kept (insertion) in the order a relevance map ranks them, as token dropping
after the position embedding (docs/spec/analyses.md, "Faithfulness"); the random baseline is the mean of seeded
random orders, with their spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch
from PIL import Image

from .. import analyses
from ..capture import Capture
from ..devices import to_host
from ..model import LoadedModel
from .interventions import embedded_tokens, keep_tokens, run_from_embedded
from .passes import model_input, model_pass

RANDOM = "random"  # the name of the random baseline in the faithfulness curves
RANDOM_ORDERS = 8
DEFAULT_STEPS = 10


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
            with model_pass(self.loaded):
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
    with model_pass(loaded):
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
