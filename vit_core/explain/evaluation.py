"""Which map to trust on this image: every faithfulness test and the localisation metrics, each beside its random
baseline with a verdict by a margin, in one table (docs/spec/analyses.md, "Which to trust here"); and over a
folder, the methods' mean scores, their ranks under each test and how far the tests agree.

Tests, each labelled with its convention (`CONVENTIONS`): deletion and insertion AUCs by token dropping and by
pixel masking (`perturbation`), the symmetric relevance gain (SRG, Blücher et al. 2024) and the salience-guided
faithfulness coefficient (SaCo, Wu et al. 2024) by token dropping, and, given the object's patches, the pointing
game, relevance mass and relevance rank accuracy (`localisation`). `judge` runs them with one cache of perturbed
forwards per perturbation, so curves that keep the same patches run once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image

from ..capture import Capture
from ..loading.model import LoadedModel
from .localisation import LOCALISATION_METRICS, MaskError, localisation, random_localisation
from .passes import model_input
from .perturbation import (
    DEFAULT_STEPS,
    RANDOM,
    RANDOM_ORDERS,
    Faithfulness,
    KeptSetProbs,
    KnownSets,
    Verdict,
    auc,
    deletion_kept,
    deletion_x,
    faithfulness_of,
    lerf_kept,
    patch_order,
    random_patch_orders,
    spread,
    units,
)
from .ranks import average_ranks, kendall_tau_b

SACO_GROUPS = 10  # K, as in Wu et al.

FAITHFULNESS_TESTS = ("deletion_auc", "insertion_auc", "pixel_deletion_auc", "pixel_insertion_auc", "srg", "saco")
TESTS = FAITHFULNESS_TESTS + LOCALISATION_METRICS  # the table's columns, in this order

# test -> (its convention, in a few words; higher is better)
CONVENTIONS: dict[str, tuple[str, bool]] = {
    "deletion_auc": ("token dropping, most relevant patches dropped first: AUC of p_c (lower is better)", False),
    "insertion_auc": ("token dropping, most relevant patches kept first: AUC of p_c (higher is better)", True),
    "pixel_deletion_auc": ("pixel masking to the normalisation mean, most relevant first: AUC of p_c (lower is better)", False),
    "pixel_insertion_auc": ("pixel masking to the normalisation mean, most relevant kept first: AUC of p_c (higher is better)",
                            True),
    "srg": ("token dropping: AUC least relevant first minus AUC most relevant first (SRG, higher is better)", True),
    "saco": (f"token dropping, {SACO_GROUPS} groups by relevance each removed alone: SaCo in [-1, 1] (higher is better)", True),
    "pointing_game": ("the highest patch is in the object: 1 or 0 (higher is better)", True),
    "relevance_mass": ("share of the positive relevance on object patches (higher is better)", True),
    "relevance_rank": ("share of object patches among the top K, K = object patches (higher is better)", True),
}


# ----------------------------------------------------------------------------------------------
# SRG and SaCo (pure definitions)


def srg(deletion: np.ndarray, lerf_deletion: np.ndarray) -> float:
    """Symmetric relevance gain of one order: AUC of its least relevant first deletion minus AUC of its most
    relevant first deletion, both (S,) at x_k = k / S, k = 0..S-1, by the same perturbation."""
    x = deletion_x(len(deletion))
    return auc(lerf_deletion, x) - auc(deletion, x)


def saco_groups(order: np.ndarray, groups: int = SACO_GROUPS) -> list[np.ndarray]:
    """The K = min(groups, N) groups of an order (N,): group i holds the patches at positions round(i N / K) up to
    round((i + 1) N / K) (exclusive), the most relevant group first."""
    n = len(order)
    k = min(groups, n)
    return [order[round(i * n / k):round((i + 1) * n / k)] for i in range(k)]


def saco(salience: np.ndarray, drops: np.ndarray) -> float:
    """Salience-guided faithfulness coefficient (Wu et al., CVPR 2024, their Algorithm 1) of K groups, given each
    group's salience sum s_i (most salient first) and the drop in p_c when it alone is removed:
    F = sum over i < j of w_ij / sum of |w_ij|, w_ij = s_i - s_j where drop_i >= drop_j, else -(s_i - s_j).
    In [-1, 1]; 0 where every group has the same salience sum (the paper raises there)."""
    s, d = np.asarray(salience, dtype=np.float64), np.asarray(drops, dtype=np.float64)
    upper = np.triu(np.ones((s.size, s.size), dtype=bool), k=1)  # the pairs i < j
    differences = (s[:, None] - s[None, :])[upper]  # (P,)
    weights = np.where((d[:, None] >= d[None, :])[upper], differences, -differences)
    total = np.abs(weights).sum()
    return float(weights.sum() / total) if total > 0 else 0.0


def rank_map(order: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """A map whose patch order is `order` (N,): the patch at position j has value N - j. -> (gh, gw) float64"""
    values = np.empty(len(order), dtype=np.float64)
    values[order] = np.arange(len(order), 0, -1)
    return values.reshape(grid)


def saco_scores(probs: KeptSetProbs, maps: Sequence[np.ndarray], groups: int = SACO_GROUPS) -> np.ndarray:
    """SaCo of each map (gh, gw) under `probs`' perturbation: its order's groups (`saco_groups`), their sums of the
    map's values, and p_c of the image minus p_c with the group alone removed. Every map's removals run batched
    together. -> (M,) float64"""
    everything = np.arange(probs.loaded.geometry.num_patches)
    parts = [saco_groups(patch_order(m), groups) for m in maps]
    p = probs([everything] + [np.setdiff1d(everything, g) for groups_of_map in parts for g in groups_of_map])
    drops = float(p[0]) - p[1:].astype(np.float64)  # (sum of K,)
    scores, start = [], 0
    for relevance, groups_of_map in zip(maps, parts, strict=True):
        values = np.asarray(relevance, dtype=np.float64).reshape(-1)
        scores.append(saco(np.array([values[g].sum() for g in groups_of_map]), drops[start:start + len(groups_of_map)]))
        start += len(groups_of_map)
    return np.array(scores, dtype=np.float64)


def saco_of(probs: KeptSetProbs, relevance: np.ndarray, groups: int = SACO_GROUPS) -> float:
    """SaCo of one map (gh, gw): `saco_scores` of it alone."""
    return float(saco_scores(probs, [relevance], groups)[0])


# ----------------------------------------------------------------------------------------------
# One image: the table


@dataclass(frozen=True)
class TestResult:
    """One test (a column of the table): each method's score and the random baseline's mean and spread."""

    name: str  # a key of CONVENTIONS
    values: dict[str, float]  # method -> score
    random_mean: float
    random_std: float  # ddof 1 over the random orders (the random maps' std for localisation)
    random_values: np.ndarray | None = None  # float64 (R,): each random order's score, for the tests that run them

    @property
    def convention(self) -> str:
        return CONVENTIONS[self.name][0]

    @property
    def higher_is_better(self) -> bool:
        return CONVENTIONS[self.name][1]

    def verdict(self, method: str) -> Verdict:
        return Verdict(self.values[method], self.random_mean, self.random_std, self.higher_is_better)


def sampled(name: str, values: dict[str, float], random_values: np.ndarray) -> TestResult:
    """A test whose random baseline is the R random orders' scores (R,): their mean and spread."""
    random_values = np.asarray(random_values, dtype=np.float64)
    return TestResult(name, values, float(random_values.mean()), spread(random_values), random_values)


@dataclass(frozen=True)
class Judgement:
    """Which map to trust on one image: methods x tests, the random baseline, the verdicts with their margins."""

    target: int
    steps: int
    methods: tuple[str, ...]
    results: dict[str, TestResult]  # test -> result, in TESTS order, only the tests that ran
    curves: Faithfulness | None = None  # the token-dropping curves, where deletion, insertion or SRG ran
    pixel_curves: Faithfulness | None = None  # the pixel-masking curves, where a pixel test ran
    random_orders: int = RANDOM_ORDERS  # the random baseline's patch orders ...
    seed: int = 0  # ... drawn with this seed (random_patch_orders), the localisation's random maps too

    def verdicts(self) -> dict[str, dict[str, Verdict]]:
        """test -> method -> its verdict."""
        return {t: {m: r.verdict(m) for m in self.methods} for t, r in self.results.items()}

    def rows(self) -> list[dict[str, object]]:
        """The table as plain rows, one per method, then "random". A method's row: "method", and per test `t`:
        t (its score), t + "_verdict" (the label), t + "_gain" (its improvement on the random mean, in the test's
        better direction), t + "_threshold" (the margin it had to pass). The random row: t (the mean), t + "_std"."""
        rows: list[dict[str, object]] = []
        for m in self.methods:
            row: dict[str, object] = {"method": m}
            for t, result in self.results.items():
                v = result.verdict(m)
                row.update({t: v.value, f"{t}_verdict": v.label, f"{t}_gain": v.gain, f"{t}_threshold": v.threshold})
            rows.append(row)
        baseline: dict[str, object] = {"method": RANDOM}
        for t, result in self.results.items():
            baseline.update({t: result.random_mean, f"{t}_std": result.random_std})
        return rows + [baseline]


def _checked_tests(tests: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(tests)
    unknown = [t for t in chosen if t not in FAITHFULNESS_TESTS]
    if unknown:
        raise ValueError(f"unknown test(s) {unknown}; choose among {FAITHFULNESS_TESTS}")
    return tuple(t for t in FAITHFULNESS_TESTS if t in chosen)


def judge(loaded: LoadedModel, image: Image.Image | Capture, maps: Mapping[str, np.ndarray], target: int, *,
          mask: np.ndarray | None = None, steps: int = DEFAULT_STEPS, tests: Iterable[str] = FAITHFULNESS_TESTS,
          random_orders: int = RANDOM_ORDERS, seed: int = 0, saco_groups: int = SACO_GROUPS,
          progress: Callable[[float, str], None] | None = None, reuse: KnownSets | None = None) -> Judgement:
    """The table of one image: each map (gh, gw) under each of `tests` (FAITHFULNESS_TESTS by default) beside the
    random baseline of `random_orders` seeded orders (the same orders for every test), and, where `mask` (the object
    patches (gh, gw) bool, as `object_patches` gives them) is given, the localisation metrics beside a uniformly
    random map's. `progress(done_fraction, message)` as each stage ends. `reuse`: token-dropping p_c already run on
    this input for this target (`Relevance.choice_sets`, the LRP rule choice's forwards): those sets are not run
    again. Raises ValueError for an unknown test or a `reuse` of another input, and MaskError for a mask of another
    shape than the grid."""
    chosen = _checked_tests(tests)
    geometry = loaded.geometry
    if mask is not None and np.shape(mask) != geometry.grid:
        raise MaskError(f"the object patches are {np.shape(mask)}, the model's grid {geometry.grid}: give object_patches()")
    report = progress or (lambda fraction, message: None)
    stages = [s for s, wanted in (("token", {"deletion_auc", "insertion_auc", "srg"} & set(chosen)),
                                  ("pixel", {"pixel_deletion_auc", "pixel_insertion_auc"} & set(chosen)),
                                  ("srg", "srg" in chosen), ("saco", "saco" in chosen)) if wanted]  # in the order run
    done = 0

    def finished(stage: str) -> None:
        nonlocal done
        done += 1
        report(done / max(1, len(stages)), f"{stage} done, {done} of {len(stages)}")

    def within(fraction: float, message: str) -> None:
        report((done + fraction) / max(1, len(stages)), message)

    x = model_input(loaded, image)  # (1, 3, H, W)
    orders = random_patch_orders(geometry.num_patches, random_orders, seed)  # (R, N)
    method_orders = {m: patch_order(maps[m]) for m in maps}
    drop = KeptSetProbs(loaded, x, target, "drop")
    if reuse is not None:
        drop.take(reuse)
    results: dict[str, TestResult] = {}
    curves = pixel_curves = None
    if "token" in stages:
        curves = faithfulness_of(target, steps, units(drop, maps, steps, orders, within), "drop")
        results |= _curve_results(curves, "", chosen)
        finished("token-dropping curves")
    if "pixel" in stages:
        pixel = KeptSetProbs(loaded, x, target, "mask")
        pixel.share(drop)
        pixel_curves = faithfulness_of(target, steps, units(pixel, maps, steps, orders, within), "mask")
        results |= _curve_results(pixel_curves, "pixel_", chosen)
        finished("pixel-masking curves")
    if "srg" in chosen:
        lerf = drop([k for m in maps for k in lerf_kept(method_orders[m], steps)]).reshape(len(maps), steps)  # (M, S)
        values = {m: srg(curves.deletion[m], lerf[i]) for i, m in enumerate(maps)}
        morf = drop([k for o in orders for k in deletion_kept(o, steps)]).reshape(len(orders), steps)  # (R, S), batched
        randoms = [srg(morf[r], drop(lerf_kept(o, steps))) for r, o in enumerate(orders)]  # LeRF: the baseline's sets
        results["srg"] = sampled("srg", values, np.array(randoms))
        finished("SRG")
    if "saco" in chosen:
        scores = saco_scores(drop, [maps[m] for m in maps] + [rank_map(o, geometry.grid) for o in orders], saco_groups)
        results["saco"] = sampled("saco", dict(zip(maps, scores[:len(maps)].tolist(), strict=True)), scores[len(maps):])
        finished("SaCo")
    if mask is not None:
        scores = localisation(maps, mask)
        for metric, (mean, std) in random_localisation(mask, seed=seed).items():
            results[metric] = TestResult(metric, {m: scores[m][metric] for m in maps}, mean, std)
    ordered = {t: results[t] for t in TESTS if t in results}
    return Judgement(target=int(target), steps=steps, methods=tuple(maps), results=ordered, curves=curves,
                     pixel_curves=pixel_curves, random_orders=random_orders, seed=seed)


def _curve_results(curves: Faithfulness, prefix: str, chosen: tuple[str, ...]) -> dict[str, TestResult]:
    """The deletion and insertion AUC tests of one perturbation's curves ("" tokens dropped, "pixel_" pixels masked)
    that are among `chosen`, each beside the random orders' AUCs."""
    methods = [m for m in curves.deletion_auc if m != RANDOM]
    tests = {f"{prefix}deletion_auc": (curves.deletion_auc, curves.random_deletion_aucs),
             f"{prefix}insertion_auc": (curves.insertion_auc, curves.random_insertion_aucs)}
    return {t: sampled(t, {m: aucs[m] for m in methods}, randoms) for t, (aucs, randoms) in tests.items() if t in chosen}


def judgement_scalars(judgement: Judgement) -> dict[str, float]:
    """The table as flat scalars, for sums and counts over a folder: per test t and method m, "<t>_<m>" (the score)
    and "beats_random_<t>_<m>" (1.0 or 0.0); per test "<t>_random" (the random mean) and "<t>_random_std"."""
    flat: dict[str, float] = {}
    for t, result in judgement.results.items():
        for m in judgement.methods:
            flat[f"{t}_{m}"] = float(result.values[m])
            flat[f"beats_random_{t}_{m}"] = 1.0 if result.verdict(m).beats else 0.0
        flat[f"{t}_random"] = float(result.random_mean)
        flat[f"{t}_random_std"] = float(result.random_std)
    return flat


# ----------------------------------------------------------------------------------------------
# Over a folder


def mean_scalars(per_image: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each key over the images that have it (NaN values left out), keys in first-seen order."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for scalars in per_image:
        for key, value in scalars.items():
            sums.setdefault(key, 0.0)
            counts.setdefault(key, 0)
            if not math.isnan(value):
                sums[key] += float(value)
                counts[key] += 1
    return {key: sums[key] / counts[key] if counts[key] else math.nan for key in sums}


def _split_key(key: str) -> tuple[str, str, str] | None:
    """"beats_random_<t>_<m>" -> ("beats", t, m); "<t>_<name>" -> ("score", t, name); None for other keys."""
    kind, rest = ("beats", key[len("beats_random_"):]) if key.startswith("beats_random_") else ("score", key)
    for test in sorted(TESTS, key=len, reverse=True):  # "pixel_deletion_auc" before "deletion_auc"
        if rest.startswith(test + "_"):
            return kind, test, rest[len(test) + 1:]
    return None


@dataclass(frozen=True)
class FolderJudgement:
    """The methods over a folder: mean scores, ranks under each test, the share of images where each beat random, and
    how far the tests agree on the methods' ranking (Kendall's tau-b between every two tests)."""

    methods: tuple[str, ...]
    tests: tuple[str, ...]
    means: dict[str, dict[str, float]]  # test -> method or "random" -> mean score over the images
    ranks: dict[str, dict[str, float]]  # test -> method -> 1 (best) .. M by the mean score; ties share their mean rank
    beats_share: dict[str, dict[str, float]]  # test -> method -> share of the images where it beat random
    agreement: dict[tuple[str, str], float]  # (test a, test b), a before b in `tests` -> tau-b; NaN where undefined

    def rows(self) -> list[dict[str, object]]:
        """One row per method: "method", and per test t: t (the mean), t + "_rank", t + "_beats_share"."""
        rows = []
        for m in self.methods:
            row: dict[str, object] = {"method": m}
            for t in self.tests:
                row.update({t: self.means[t].get(m, math.nan), f"{t}_rank": self.ranks[t].get(m, math.nan),
                            f"{t}_beats_share": self.beats_share[t].get(m, math.nan)})
            rows.append(row)
        return rows


def folder_judgement(means: Mapping[str, float]) -> FolderJudgement:
    """The folder's table from the mean over its images of each `judgement_scalars` key (`mean_scalars`, or sums /
    counts). Ranks and agreement use the test's better direction: a lower deletion AUC ranks higher."""
    scores: dict[str, dict[str, float]] = {}
    beats: dict[str, dict[str, float]] = {}
    methods: list[str] = []
    for key, value in means.items():
        split = _split_key(key)
        if split is None:
            continue
        kind, test, name = split
        if kind == "beats":
            beats.setdefault(test, {})[name] = float(value)
        elif name != f"{RANDOM}_std":
            scores.setdefault(test, {})[name] = float(value)
        if name not in (RANDOM, f"{RANDOM}_std") and name not in methods:
            methods.append(name)
    tests = tuple(t for t in TESTS if t in scores)
    ranks, oriented = {}, {}
    for t in tests:
        present = [m for m in methods if m in scores[t]]
        sign = 1.0 if CONVENTIONS[t][1] else -1.0
        oriented[t] = {m: sign * scores[t][m] for m in present}
        ranked = average_ranks(-np.array([oriented[t][m] for m in present]))  # the best score gets rank 1
        ranks[t] = dict(zip(present, ranked.tolist(), strict=True))
    agreement = {}
    for i, a in enumerate(tests):
        for b in tests[i + 1:]:
            common = [m for m in methods if m in oriented[a] and m in oriented[b]]
            agreement[(a, b)] = kendall_tau_b(np.array([oriented[a][m] for m in common]),
                                              np.array([oriented[b][m] for m in common])) if len(common) >= 2 else math.nan
    return FolderJudgement(methods=tuple(methods), tests=tests, means={t: scores[t] for t in tests}, ranks=ranks,
                           beats_share={t: beats.get(t, {}) for t in tests}, agreement=agreement)


def summarise(judgements: Sequence[Judgement]) -> FolderJudgement:
    """`folder_judgement` of the per-image judgements' mean scalars."""
    return folder_judgement(mean_scalars(judgement_scalars(j) for j in judgements))
