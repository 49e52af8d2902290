"""Perturbation tests of faithfulness: deletion and insertion curves of the target's probability, against a random
baseline, and the verdict rule that says when a map beats that baseline.

Patches are dropped (deletion) or kept (insertion) in the order a relevance map ranks them, by one of two
perturbations (docs/spec/analyses.md, "Faithfulness"): token dropping after the position embedding ("drop",
ours), or pixel masking to the normalisation mean ("mask", the RISE / Chefer et al. form). The random baseline
is the mean of seeded random orders, with their spread; a map beats it under a test only by a margin (`verdict`).

Every perturbed input is a set of kept patches; `KeptSetProbs` runs each distinct set once per call, so curves
that keep the same patches (insertion and the least-relevant-first deletion of one order, the unmodified image
of every curve) share their forwards.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np
import torch
from PIL import Image

from .. import analyses
from ..capture import Capture
from ..loading.model import LoadedModel
from ..runtime.devices import to_host
from .interventions import embedded_tokens, keep_tokens, run_from_embedded
from .passes import forwards_on_lanes, model_input, model_pass

RANDOM = "random"  # the name of the random baseline in the faithfulness curves
RANDOM_ORDERS = 8
DEFAULT_STEPS = 10
MARGIN_SDS = 2.0  # a map beats random by more than this many standard deviations of the random orders' scores
MIN_MARGIN = 1e-6  # ... and by more than this (float32 noise), so that a spread of 0 does not make noise a verdict
# Perturbed inputs per forward, exactly: a shorter batch is padded with copies of one of its sets. A matrix
# product's library picks its algorithm by shape, so a set's probability would otherwise depend on how many new sets
# shared its forward, and with that on what the judge (or the dashboard's earlier test) had already run. The set of
# every patch runs alone (a plain forward, whatever ran before). Small, so that padding costs little: a judge's 8
# random orders and 6 maps give 14 sets of each length, 16 rows.
MASK_BATCH = 4  # pixel-masked inputs: each is a whole image
DROP_BATCH = 8  # token-dropped inputs of one length

Perturbation = Literal["drop", "mask"]
PERTURBATIONS: tuple[Perturbation, ...] = ("drop", "mask")

BEATS, WORSE, TIED = "beats random", "worse than random", "not distinguishable from random"


# ----------------------------------------------------------------------------------------------
# Orders, counts and curves' x


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


def deletion_kept(order: np.ndarray, steps: int) -> list[np.ndarray]:
    """Most relevant first deletion: at k = 0..S-1 the patches kept once the first n_k of `order` are dropped."""
    return [order[d:] for d in deletion_counts(len(order), steps)]


def insertion_kept(order: np.ndarray, steps: int) -> list[np.ndarray]:
    """Insertion: at k = 1..S the first max(1, n_k) patches of `order`, the only ones kept."""
    return [order[:k] for k in insertion_counts(len(order), steps)]


def lerf_kept(order: np.ndarray, steps: int) -> list[np.ndarray]:
    """Least relevant first deletion (the deletion of the reversed order): at k = 0..S-1 the first N - n_k
    patches of `order` are kept. The same kind of set as insertion's: where N - n_k equals an insertion count
    (every step, unless N is odd and k N / S a half-integer) the two curves keep the same patches."""
    n = len(order)
    return [order[:n - d] for d in deletion_counts(n, steps)]


# ----------------------------------------------------------------------------------------------
# Verdicts: better than the random baseline by a margin


@dataclass(frozen=True)
class Verdict:
    """A map's score under one test beside the random baseline's: its mean and spread over the random orders
    (or, for localisation, over random maps). `gain` is the score's improvement on the random mean in the test's
    better direction; the map beats random when the gain exceeds `threshold` = max(MARGIN_SDS * std, MIN_MARGIN),
    is worse than random when the gain is below -threshold, and is otherwise not distinguishable from random."""

    value: float
    random_mean: float
    random_std: float  # ddof 1 over the random orders; NaN with fewer than 2 (then nothing is distinguishable)
    higher_is_better: bool

    @property
    def gain(self) -> float:
        return (self.value - self.random_mean) * (1.0 if self.higher_is_better else -1.0)

    @property
    def threshold(self) -> float:
        return max(MARGIN_SDS * self.random_std, MIN_MARGIN)

    @property
    def label(self) -> str:
        """"beats random", "worse than random" or "not distinguishable from random" (also where a number is NaN)."""
        if math.isnan(self.gain) or math.isnan(self.threshold):
            return TIED
        return BEATS if self.gain > self.threshold else WORSE if self.gain < -self.threshold else TIED

    @property
    def beats(self) -> bool:
        return self.label == BEATS


def spread(values: np.ndarray) -> float:
    """The standard deviation (ddof 1) of the random orders' scores: NaN for fewer than 2."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1)) if values.size >= 2 else math.nan


def verdict(value: float, random_values: np.ndarray, higher_is_better: bool) -> Verdict:
    """The verdict of `value` beside the scores of the R random orders (R,): their mean and their spread."""
    random_values = np.asarray(random_values, dtype=np.float64)
    return Verdict(float(value), float(random_values.mean()), spread(random_values), higher_is_better)


# ----------------------------------------------------------------------------------------------
# Results


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
    beats_random: dict[str, bool]  # method -> beats random under both deletion and insertion, by the margin (`verdict`)
    random_deletion_aucs: np.ndarray | None = None  # float64 (R,): each random order's deletion AUC
    random_insertion_aucs: np.ndarray | None = None  # float64 (R,)
    perturbation: Perturbation = "drop"

    def deletion_verdict(self, method: str) -> Verdict:
        return verdict(self.deletion_auc[method], self.random_deletion_aucs, higher_is_better=False)

    def insertion_verdict(self, method: str) -> Verdict:
        return verdict(self.insertion_auc[method], self.random_insertion_aucs, higher_is_better=True)


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
    deletion_aucs: np.ndarray | None = None  # float64 (R,): each random order's AUC; None for a method
    insertion_aucs: np.ndarray | None = None


def faithfulness_of(target: int, steps: int, finished: Iterable[MethodCurves],
                    perturbation: Perturbation = "drop") -> Faithfulness:
    """The result of the units (the random baseline among them, any subset of the methods): the methods in the order
    given, then "random"."""
    units = list(finished)
    baseline = next(u for u in units if u.name == RANDOM)
    methods = [u for u in units if u.name != RANDOM] + [baseline]
    deletion_aucs = baseline.deletion_aucs if baseline.deletion_aucs is not None else np.array([baseline.deletion_auc])
    insertion_aucs = baseline.insertion_aucs if baseline.insertion_aucs is not None else np.array([baseline.insertion_auc])
    return Faithfulness(
        target=int(target),
        steps=steps,
        deletion={u.name: u.deletion for u in methods},
        insertion={u.name: u.insertion for u in methods},
        deletion_auc={u.name: u.deletion_auc for u in methods},
        insertion_auc={u.name: u.insertion_auc for u in methods},
        random_deletion_std=baseline.deletion_std,
        random_insertion_std=baseline.insertion_std,
        beats_random={u.name: verdict(u.deletion_auc, deletion_aucs, higher_is_better=False).beats
                      and verdict(u.insertion_auc, insertion_aucs, higher_is_better=True).beats for u in methods[:-1]},
        random_deletion_aucs=deletion_aucs,
        random_insertion_aucs=insertion_aucs,
        perturbation=perturbation,
    )


# ----------------------------------------------------------------------------------------------
# p_c of kept-patch sets


@dataclass(frozen=True)
class KnownSets:
    """p_c of kept-patch sets already run on one input for one target (`KeptSetProbs.known_sets`). The model is held
    weakly: a cached result never keeps a model alive."""

    model: weakref.ref  # to the torch module the sets ran through
    perturbation: Perturbation
    target: int
    x: torch.Tensor  # (1, 3, H, W): the input perturbed
    probs: dict[bytes, float]  # sorted kept patches (int64 bytes) -> p_c

    def ran_on(self, model: torch.nn.Module) -> bool:
        """Whether the sets ran through this very module (not another copy of the same weights, say one loaded
        again after a cache let the first go)."""
        return self.model() is model


class KeptSetProbs:
    """p_c of kept-patch sets under one perturbation of one image, each distinct set run once over the object's life.

    "drop": the prefix tokens and the kept patches' tokens (after the position embedding) run through the blocks,
    the new sets batched by length (DROP_BATCH per forward, padded). "mask": the normalised input with every other
    patch's pixels set to 0, whole images, MASK_BATCH per forward (padded). The set of every patch runs alone: every
    order keeps all patches at deletion step 0 and the last insertion step, so that forward is shared by every curve
    of every map."""

    def __init__(self, loaded: LoadedModel, x: torch.Tensor, target: int, perturbation: Perturbation = "drop"):
        if perturbation not in PERTURBATIONS:
            raise ValueError(f"unknown perturbation {perturbation!r}; use one of {PERTURBATIONS}")
        self.loaded, self.x, self.target, self.perturbation = loaded, x, target, perturbation  # x (1, 3, H, W)
        self.tokens: torch.Tensor | None = None  # (1, T, D), for "drop", made at the first call
        self.known: dict[bytes, float] = {}  # sorted kept patches -> p_c
        self.forwards = 0  # forwards run (each one batch)
        self.rows = 0  # perturbed inputs run
        self.patches = 0  # patch tokens run through the blocks over all of them: a measure of the work

    def __call__(self, rows: list[np.ndarray], progress: Callable[[float], None] | None = None) -> np.ndarray:
        """p_c for each kept set (K_i,) of `rows`, the new ones run now; `progress(fraction of them run)` after each
        forward. -> (B,) float32"""
        kept_sorted = [np.sort(r).astype(np.int64) for r in rows]  # the kept patches stay in sequence order
        new: dict[bytes, np.ndarray] = {}
        for r in kept_sorted:
            if r.tobytes() not in self.known:
                new[r.tobytes()] = r
        if new:
            self._run(new, progress)
        return np.array([self.known[r.tobytes()] for r in kept_sorted], dtype=np.float32)  # (B,)

    def share(self, other: KeptSetProbs) -> None:
        """Take `other`'s p_c of the unmodified image (every patch kept), the same forward under either perturbation."""
        full = np.arange(self.loaded.geometry.num_patches, dtype=np.int64).tobytes()
        if full in other.known and other.target == self.target:
            self.known.setdefault(full, other.known[full])

    def known_sets(self) -> KnownSets:
        """A copy of every p_c run so far, for another test of the same input to `take`."""
        return KnownSets(weakref.ref(self.loaded.model), self.perturbation, self.target, self.x, dict(self.known))

    def take(self, known: KnownSets) -> None:
        """Take the p_c of `known` (the LRP rule choice's forwards, reused by the judge): they must come from the same
        model, input, target and perturbation. Raises ValueError otherwise: they would belong to another test."""
        if (not known.ran_on(self.loaded.model) or known.perturbation != self.perturbation
                or known.target != self.target or not torch.equal(known.x, self.x)):  # (equal: shapes too)
            raise ValueError("the kept sets to take come from another model, input, target or perturbation")
        for key, p in known.probs.items():
            self.known.setdefault(key, p)

    def _run(self, new: dict[bytes, np.ndarray], progress: Callable[[float], None] | None = None) -> None:
        every_patch = self.loaded.geometry.num_patches
        if self.perturbation == "drop":
            by_length: dict[int, dict[bytes, np.ndarray]] = {}
            for key, r in new.items():
                by_length.setdefault(len(r), {})[key] = r
            groups, size = [by_length[length] for length in sorted(by_length, reverse=True)], DROP_BATCH
        else:
            groups, size = [{k: r for k, r in new.items() if len(r) < every_patch},
                            {k: r for k, r in new.items() if len(r) == every_patch}], MASK_BATCH
        batches = []
        for group in groups:
            keys = list(group)
            batches += [{k: group[k] for k in keys[i:i + size]} for i in range(0, len(keys), size)]
        if self.perturbation == "drop" and self.tokens is None:
            with model_pass(self.loaded):
                self.tokens = embedded_tokens(self.loaded.model, self.x)  # (1, T, D), computed once

        def forward(batch: dict[bytes, np.ndarray]) -> np.ndarray:
            kept = list(batch.values())
            rows = 1 if len(kept[0]) == every_patch else size  # see MASK_BATCH: one shape per kind of batch
            padded = kept + kept[:1] * (rows - len(kept))
            probs = analyses.softmax(to_host(self._forward(padded)))[:, self.target]  # (rows, C) -> (rows,)
            return probs[:len(kept)]  # (U,)

        run = 0

        def done(i: int, probs: np.ndarray) -> None:
            nonlocal run
            batch = batches[i]
            self.known.update(zip(batch, probs.tolist(), strict=True))
            self.forwards += 1
            self.rows += len(batch)
            self.patches += sum(len(r) for r in batch.values()) if self.perturbation == "drop" else \
                len(batch) * self.loaded.geometry.num_patches
            run += len(batch)
            if progress is not None:
                progress(run / len(new))

        forwards_on_lanes(self.loaded, forward, batches, done)

    def _forward(self, kept: list[np.ndarray]) -> torch.Tensor:
        """The logits (U, C) of U kept sets: all of one length for "drop". Inside `forwards_on_lanes` (the model's
        lock held, no gradients)."""
        loaded, geometry = self.loaded, self.loaded.geometry
        if self.perturbation == "drop":
            index = torch.from_numpy(np.stack(kept).reshape(len(kept), -1))  # (U, K)
            return run_from_embedded(loaded.model, keep_tokens(self.tokens, index, geometry.num_prefix_tokens))
        (gh, gw), (ph, pw) = geometry.grid, geometry.patch_size
        keep = np.zeros((len(kept), gh * gw), dtype=bool)
        for i, r in enumerate(kept):
            keep[i, r] = True
        pixels = torch.from_numpy(np.kron(keep.reshape(-1, 1, gh, gw), np.ones((1, 1, ph, pw), dtype=bool)))  # (U, 1, H, W)
        pixels = pixels.to(self.x.device)
        masked = torch.where(pixels, self.x, torch.zeros((), dtype=self.x.dtype, device=self.x.device))  # (U, 3, H, W)
        tokens = embedded_tokens(loaded.model, masked)  # (U, T, D)
        return run_from_embedded(loaded.model, tokens)


# ----------------------------------------------------------------------------------------------
# The curves, unit by unit


def _method_rows(order: np.ndarray, steps: int) -> list[np.ndarray]:
    """A method's 2 S kept sets: its deletion curve's, then its insertion curve's."""
    return deletion_kept(order, steps) + insertion_kept(order, steps)


def _random_rows(orders: np.ndarray, steps: int) -> list[np.ndarray]:
    """The random baseline's 2 S kept sets per order (R, N): insertion keeps the first n_k of each order; deletion
    drops each order's patches from its end (the deletion of the reversed order, an order as random), so that it
    keeps the first N - n_k: sets of insertion's kind, most of them the same sets, each run once."""
    return [kept for o in orders for kept in lerf_kept(o, steps) + insertion_kept(o, steps)]  # (R 2 S) kept sets


def _method_unit(probs: KeptSetProbs, name: str, order: np.ndarray, steps: int) -> MethodCurves:
    """A method's deletion and insertion curves from p_c of its 2 S kept sets."""
    p = probs(_method_rows(order, steps)).astype(np.float64)  # (2 S,)
    deletion, insertion = p[:steps].astype(np.float32), p[steps:].astype(np.float32)
    return MethodCurves(name=name, deletion=deletion, insertion=insertion,
                        deletion_auc=auc(deletion, deletion_x(steps)), insertion_auc=auc(insertion, insertion_x(steps)))


def _random_unit(probs: KeptSetProbs, orders: np.ndarray, steps: int) -> MethodCurves:
    """The random baseline over the orders (R, N): the mean of their curves, with their spread and each one's AUC."""
    p = probs(_random_rows(orders, steps)).reshape(len(orders), 2, steps).astype(np.float64)  # (R, 2, S): del, ins
    del_curves, ins_curves = p[:, 0], p[:, 1]  # (R, S) each
    deletion, insertion = del_curves.mean(axis=0).astype(np.float32), ins_curves.mean(axis=0).astype(np.float32)  # (S,)
    del_aucs = np.array([auc(c, deletion_x(steps)) for c in del_curves])  # (R,)
    ins_aucs = np.array([auc(c, insertion_x(steps)) for c in ins_curves])
    return MethodCurves(name=RANDOM, deletion=deletion, insertion=insertion,
                        deletion_auc=auc(deletion, deletion_x(steps)), insertion_auc=auc(insertion, insertion_x(steps)),
                        deletion_std=del_curves.std(axis=0).astype(np.float32),
                        insertion_std=ins_curves.std(axis=0).astype(np.float32),
                        deletion_aucs=del_aucs, insertion_aucs=ins_aucs)


def method_curves(probs: KeptSetProbs, maps: Mapping[str, np.ndarray], steps: int,
                  progress: Callable[[float], None] | None = None,
                  with_rows: Sequence[np.ndarray] = ()) -> dict[str, MethodCurves]:
    """Each map's deletion and insertion curves through `probs`, without a random baseline (the LRP rule choice
    compares maps with each other): every map's kept sets run together first, batched with `with_rows` (more kept
    sets, run in the same forwards: the random baseline's, in `units`). -> name -> its curves"""
    orders = {m: patch_order(maps[m]) for m in maps}
    probs(list(with_rows) + [kept for m in maps for kept in _method_rows(orders[m], steps)], progress)
    return {m: _method_unit(probs, m, orders[m], steps) for m in maps}


def units(probs: KeptSetProbs, maps: Mapping[str, np.ndarray], steps: int, orders: np.ndarray,
          progress: Callable[[float, str], None] | None = None) -> Iterator[MethodCurves]:
    """The random baseline over `orders` (R, N), then each map's curves, through `probs`.

    Every unit's kept sets run first, together: batched by length across the units, the forwards are fewer and
    fuller (the Shapes ViT's curves: 64 forwards of 1 to 8 sets became 19 of up to 16; docs/performance.md,
    "The judge's forwards on lanes"). `progress(fraction, message)` as they run."""
    def forwards_done(fraction: float) -> None:
        if progress is not None:
            progress(fraction, f"curves: {fraction:.0%} of the perturbed inputs run")

    curves = method_curves(probs, maps, steps, forwards_done, with_rows=_random_rows(orders, steps))
    yield _random_unit(probs, orders, steps)  # every set known by now: no forward
    yield from curves.values()


def faithfulness(loaded: LoadedModel, image: Image.Image | Capture, maps: Mapping[str, np.ndarray], target: int, *,
                 steps: int = DEFAULT_STEPS, random_orders: int = RANDOM_ORDERS, seed: int = 0,
                 progress: Callable[[float, str], None] | None = None, perturbation: Perturbation = "drop") -> Faithfulness:
    """Deletion and insertion curves of p_c (analyses.md) for each map (gh, gw), in the order given, then for
    "random": the mean of `random_orders` (default 8) seeded orders, with their std and each order's AUC (every
    method is compared with it). `progress(done_fraction, message)` after each forward. `perturbation`: "drop"
    (token dropping, the default) or "mask" (pixel masking to the normalisation mean). Returns curves and AUCs keyed
    by method name and "random".

    Every perturbed input runs batched with the others (`units`); a kept-patch set already run (the full set; the
    random baseline's deletion and insertion sets, mostly the same) is not run again."""
    probs = KeptSetProbs(loaded, model_input(loaded, image), target, perturbation)
    orders = random_patch_orders(loaded.geometry.num_patches, random_orders, seed)
    return faithfulness_of(target, steps, units(probs, maps, steps, orders, progress), perturbation)
