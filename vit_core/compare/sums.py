"""What two models' tokens and rows add up to over a set of images, kept so that any split of the images merges into
the sums of all, bit for bit (as vit_core.dataset.totals does for one model).

The CKA sums are large (two ViT-B/16: 13 x 13 cross products of 768 x 768), so they are not Python integers as
dataset's ExactMoments are: each image's float64 sum is rounded once to a multiple of 2**-FRACTION_BITS and kept as
two int64 limbs (`FixedSums`), whose additions are exact in any order. Shapes: L blocks, D widths, n images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from ..dataset import ExactMoments

FRACTION_BITS = 40  # each image's sums are kept to 2**-40 (about 9e-13)
LIMB_BITS = 32
MAX_MAGNITUDE = 2.0 ** (62 + LIMB_BITS - FRACTION_BITS)  # beyond it an image's value is counted as not finite


def fixed_limbs(values: torch.Tensor, images: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each image's float64 values rounded to the nearest multiple of 2**-FRACTION_BITS (half to even) and summed over
    the first `images` rows exactly: values (F, ...) -> (high, low, not_finite), int64 (...) each: the sum is
    high * 2**32 + low in units of 2**-40, not_finite counts the values that were NaN, infinite or beyond MAX_MAGNITUDE
    (left out of the sums). Computed on the values' device (in a few passes: the CKA sums are large); the limbs come
    back to the host."""
    values = values[:images].double()
    largest = float(torch.linalg.vector_norm(values, float("inf"))) if values.numel() else 0.0  # NaN or inf where one is
    if largest * 2.0 ** FRACTION_BITS * images < 2.0 ** 62:  # the usual case: every image's integers summed in int64
        units = torch.mul(values, 2.0 ** FRACTION_BITS).round_().long().sum(dim=0)  # exact: below 2**62 in all
        high, low = units >> LIMB_BITS, units & ((1 << LIMB_BITS) - 1)  # floor division: also right for negatives
        return high.cpu().numpy(), low.cpu().numpy(), np.zeros(values.shape[1:], dtype=np.int64)
    bad = None
    if not largest < MAX_MAGNITUDE:  # rare: the values left out counted
        bad = ~torch.isfinite(values) | (values.abs() >= MAX_MAGNITUDE)
        values = torch.where(bad, 0.0, values)
    units = torch.mul(values, 2.0 ** FRACTION_BITS).round_()  # integers, exact in float64 (or beyond: already integers)
    high = torch.mul(units, 2.0 ** -LIMB_BITS).floor_()  # exact: a power of two
    low = units.add_(high, alpha=-(2.0 ** LIMB_BITS))  # exact: the low 32 bits, in [0, 2**32)
    high, low = high.long(), low.long()
    if images > 1:
        high, low = high.sum(dim=0), low.sum(dim=0)
    else:
        high, low = high[0], low[0]
    not_finite = bad.long().sum(dim=0) if bad is not None else torch.zeros(values.shape[1:], dtype=torch.long)
    return high.cpu().numpy(), low.cpu().numpy(), not_finite.cpu().numpy()


class FixedSums:
    """Sums over images of per-image arrays of one shape, exact (`fixed_limbs`): the same bits in any order or split.
    The last `element_dims` dims share one not-finite count per leading index (a CKA pair is NaN as a whole)."""

    def __init__(self, element_dims: int = 0) -> None:
        self.element_dims = element_dims
        self.high: np.ndarray | None = None  # int64 (...): in units of 2**(32 - 40)
        self.low: np.ndarray | None = None  # int64 (...): in units of 2**-40
        self.not_finite: np.ndarray | None = None  # int64 (leading dims)

    def add(self, values: torch.Tensor, images: int, shape: tuple[int, ...] | None = None, at: int | None = None) -> None:
        """The first `images` rows of values (F, ...), one per image. With `at`, values (F, ...) are the sums' row
        `at` of a whole of `shape` (so a large whole is added a row at a time)."""
        high, low, bad = fixed_limbs(values, images)
        bad = bad.reshape(*bad.shape[:bad.ndim - self.element_dims], -1).sum(axis=-1) if self.element_dims else bad
        if at is None:
            self._merge(high, low, bad)
            return
        if self.high is None:
            self.high, self.low = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
            self.not_finite = np.zeros(shape[:len(shape) - self.element_dims], dtype=np.int64)
        self.high[at] += high
        self.low[at] += low
        self.not_finite[at] += bad

    def merge(self, other: FixedSums, take: bool = False) -> None:
        """Add other's sums. `take`: other is not used afterwards, so an empty self may take its arrays (two ViT-B/16s'
        CKA sums are 1.7 GiB: a copy per batch is time and memory)."""
        if other.high is not None:
            self._merge(other.high, other.low, other.not_finite, copy=not take)

    def _merge(self, high: np.ndarray, low: np.ndarray, not_finite: np.ndarray, copy: bool = True) -> None:
        if self.high is None:
            self.high, self.low = high.astype(np.int64, copy=copy), low.astype(np.int64, copy=copy)
            self.not_finite = np.array(not_finite, dtype=np.int64)
        else:
            if high.shape != self.high.shape:
                raise ValueError(f"sums of shape {high.shape} and {self.high.shape} can't be added")
            self.high += high
            self.low += low
            self.not_finite = self.not_finite + not_finite

    def _carry(self) -> None:
        """The canonical limbs (low in [0, 2**32)): one sum, one pair of limbs, so one float and one file. Before
        reading them only: a low limb grows by less than 2**32 per image, so 2**31 images fit between carries."""
        carry = self.low >> LIMB_BITS  # floor division by 2**32, also for negative lows
        self.low -= carry << LIMB_BITS
        self.high += carry

    def value(self) -> np.ndarray:
        """float64 (...): the sums (NaN in a leading index that met a value left out)."""
        self._carry()
        value = self.high.astype(np.float64) * 2.0 ** (LIMB_BITS - FRACTION_BITS) + self.low * 2.0 ** -FRACTION_BITS
        bad = self.not_finite.reshape(self.not_finite.shape + (1,) * self.element_dims) > 0
        return np.where(bad, np.nan, value)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        if self.high is None:
            return {}
        self._carry()
        return {f"{prefix}_high": self.high, f"{prefix}_low": self.low.astype(np.uint32),
                f"{prefix}_not_finite": self.not_finite}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str, element_dims: int = 0) -> FixedSums:
        sums = cls(element_dims)
        if f"{prefix}_high" in arrays:
            sums._merge(np.asarray(arrays[f"{prefix}_high"], dtype=np.int64), np.asarray(arrays[f"{prefix}_low"],
                        dtype=np.int64), np.asarray(arrays[f"{prefix}_not_finite"], dtype=np.int64))
        return sums


@dataclass
class CompareTotals:
    """What a set of images adds up to for the comparison of two models (the per-model totals are dataset's, in a/ and
    b/): the CKA sums, the attention JS moments, and per image its KL and rollout correlation."""

    tokens: int = 0  # rows of X and Y: patch tokens (or images, when CKA is over mean tokens)
    sum_a: FixedSums = field(default_factory=lambda: FixedSums(1))  # (La+1, Da): column sums of each residual row
    sum_b: FixedSums = field(default_factory=lambda: FixedSums(1))  # (Lb+1, Db)
    self_a: FixedSums = field(default_factory=lambda: FixedSums(2))  # (La+1, Da, Da): X^T X
    self_b: FixedSums = field(default_factory=lambda: FixedSums(2))  # (Lb+1, Db, Db)
    cross: FixedSums = field(default_factory=lambda: FixedSums(2))  # (La+1, Lb+1, Da, Db): X^T Y
    js: ExactMoments = field(default_factory=ExactMoments)  # per image (L, H): attention JS
    file: list[str] = field(default_factory=list)  # images compared, in the run's order
    kl: list[float] = field(default_factory=list)  # KL(p_a || p_b) per image, NaN where the classes differ
    rollout_correlation: list[float] = field(default_factory=list)  # Pearson per image, NaN where the grids differ

    def merge(self, other: CompareTotals, take: bool = False) -> None:
        """Add another set of images: other's rows after self's. `take`: other is not used afterwards (a batch's or a
        part's totals), so its sums' arrays may become self's."""
        self.tokens += other.tokens
        for name in ("sum_a", "sum_b", "self_a", "self_b", "cross"):
            getattr(self, name).merge(getattr(other, name), take)
        self.js.merge(other.js)
        self.file.extend(other.file)
        self.kl.extend(other.kl)
        self.rollout_correlation.extend(other.rollout_correlation)

    def cka(self) -> np.ndarray:
        """float64 (La+1, Lb+1): linear CKA of every pair of residual rows (NaN before any image)."""
        if self.cross.high is None:
            return np.full((0, 0), np.nan)
        from .measures import linear_cka

        sum_a, sum_b, self_a, self_b, cross = (s.value() for s in (self.sum_a, self.sum_b, self.self_a, self.self_b,
                                                                    self.cross))
        return np.array([[linear_cka(cross[i, j], self_a[i], self_b[j], sum_a=sum_a[i], sum_b=sum_b[j], n=self.tokens)
                          for j in range(cross.shape[1])] for i in range(cross.shape[0])], dtype=np.float64)

    def kl_mean(self) -> float | None:
        """The mean KL over images, the exact sum rounded once (math.fsum); None without KL."""
        kl = [k for k in self.kl if not math.isnan(k)]
        return math.fsum(kl) / len(kl) if kl else None

    def arrays(self) -> dict[str, np.ndarray]:
        return {"tokens": np.asarray(self.tokens, dtype=np.int64),
                **self.sum_a.arrays("sum_a"), **self.sum_b.arrays("sum_b"), **self.self_a.arrays("self_a"),
                **self.self_b.arrays("self_b"), **self.cross.arrays("cross"), **self.js.arrays("js"),
                "file": np.asarray(self.file, dtype=str), "kl": np.asarray(self.kl, dtype=np.float64),
                "rollout_correlation": np.asarray(self.rollout_correlation, dtype=np.float64)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> CompareTotals:
        return cls(tokens=int(arrays["tokens"]), sum_a=FixedSums.from_arrays(arrays, "sum_a", 1),
                   sum_b=FixedSums.from_arrays(arrays, "sum_b", 1), self_a=FixedSums.from_arrays(arrays, "self_a", 2),
                   self_b=FixedSums.from_arrays(arrays, "self_b", 2), cross=FixedSums.from_arrays(arrays, "cross", 2),
                   js=ExactMoments.from_arrays(arrays, "js"), file=[str(f) for f in arrays["file"]],
                   kl=[float(k) for k in arrays["kl"]],
                   rollout_correlation=[float(r) for r in arrays["rollout_correlation"]])
