"""What a set of files adds up to, kept so that the totals of any split of the files merge into the totals of all.

Every dataset value of analyses.md "Over many images" is a function of these totals: counts, and per array the
exact sums of the values and of their squares (`ExactMoments`: integers, so adding them in any order gives the
same sums). The per-image table and the skipped files are lists, merged by concatenation in the order of the
parts. So a run cut into shards, on one machine or many, gives the one-process result bit for bit, whatever the
cut.

Totals travel as flat numpy arrays (`arrays`, `from_arrays`): the part files of a sharded run, and Ray's
results. Shapes: L blocks, H heads, C classes, n images.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .reductions import BatchValues

NO_LABEL = -1  # an image without a known true class, in the table's integer columns


# A float64 is an integer multiple of 2**-1074 (its smallest subnormal): times 2**EXACT_SCALE_BITS, every finite
# float64 is an integer (m * 2**e with m < 2**53 and e >= -1074 - 53), so sums of such integers are exact.
EXACT_SCALE_BITS = 1074 + 53


def exact_units(values: np.ndarray) -> np.ndarray:
    """Each finite value of `values` (any float dtype, read as float64) times 2**EXACT_SCALE_BITS, as a Python int:
    an object array of the input's shape. Non-finite values give 0 (the caller counts them apart)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    mantissa, exponent = np.frexp(np.where(finite, values, 0.0))  # values = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    integer = (mantissa * 2.0**53).astype(np.int64)  # exact: a float64's mantissa has 53 bits
    shift = np.where(integer == 0, 0, exponent + 1074).astype(np.int64)  # >= 0 for every finite float64
    return integer.astype(object) << shift.astype(object)


def _nearest_float(numerator: int, denominator: int) -> float:
    """numerator / denominator rounded once to the nearest float64 (Python's int division is correctly rounded)."""
    return numerator / denominator


def _sqrt_of_ratio(numerator: int, denominator: int) -> float:
    """sqrt(numerator / denominator) for a ratio >= 0 that may be too large for a float64 (the variance of values
    near 1e200): scaled by a power of four first where it must be."""
    excess = max(0, numerator.bit_length() - denominator.bit_length() - 1000) // 2
    return math.sqrt(_nearest_float(numerator, denominator << (2 * excess))) * 2.0**excess


class ExactMoments:
    """Mean and population standard deviation (ddof 0) over images of a per-image array, from exact sums: each value
    and its square are added as integers (`exact_units`), so the result is the same bits whatever the order, batches
    or shards the images came in, and is rounded once at the end. An element that met a NaN or infinity is NaN."""

    def __init__(self) -> None:
        self.count = 0
        self.total: np.ndarray | None = None  # object (...): sum of the values, in units of 2**-EXACT_SCALE_BITS
        self.squares: np.ndarray | None = None  # object (...): sum of their squares, in units of 2**-(2 * that)
        self.not_finite: np.ndarray | None = None  # int64 (...): values that were NaN or infinite

    def add(self, values: np.ndarray) -> None:
        """values: (B, ...) one row per image."""
        values = np.asarray(values, dtype=np.float64)
        if len(values) == 0:
            return
        units = exact_units(values)  # (B, ...)
        self._merge(len(values), units.sum(axis=0), (units * units).sum(axis=0),
                    (~np.isfinite(values)).sum(axis=0).astype(np.int64))

    def merge(self, other: ExactMoments) -> None:
        """Add the images `other` has seen: afterwards self is as if it had seen both sets."""
        if other.count:
            self._merge(other.count, other.total, other.squares, other.not_finite)

    def _merge(self, count: int, total: np.ndarray, squares: np.ndarray, not_finite: np.ndarray) -> None:
        total, squares = np.asarray(total, dtype=object), np.asarray(squares, dtype=object)
        if self.count == 0:
            self.count, self.total, self.squares = count, total.copy(), squares.copy()
            self.not_finite = np.array(not_finite, dtype=np.int64)
            return
        if total.shape != self.total.shape:
            raise ValueError(f"per-image arrays of shape {total.shape} and {self.total.shape} can't be added")
        self.count += count
        self.total = np.asarray(self.total + total, dtype=object)  # a 0-d sum comes back as a plain int
        self.squares = np.asarray(self.squares + squares, dtype=object)
        self.not_finite = self.not_finite + not_finite

    @property
    def mean(self) -> np.ndarray:
        """float64 (...): the exact mean, rounded once."""
        scale = self.count << EXACT_SCALE_BITS
        mean = np.array([_nearest_float(t, scale) for t in self.total.flat], dtype=np.float64).reshape(self.total.shape)
        return np.where(self.not_finite > 0, np.nan, mean)

    def std(self) -> np.ndarray:
        """float64 (...): sqrt of the exact population variance (n * sum x^2 - (sum x)^2) / n^2, rounded once
        before the square root."""
        n, scale = self.count, 2 * EXACT_SCALE_BITS
        std = np.array([_sqrt_of_ratio(n * q - t * t, (n * n) << scale)
                        for t, q in zip(self.total.flat, self.squares.flat, strict=True)], dtype=np.float64)
        return np.where(self.not_finite > 0, np.nan, std.reshape(self.total.shape))

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its state as arrays named <prefix>_count, <prefix>_total, <prefix>_squares (hexadecimal strings: np.load
        reads them without pickle) and <prefix>_not_finite; only the count while empty."""
        state = {f"{prefix}_count": np.asarray(self.count, dtype=np.int64)}
        if self.count:
            state[f"{prefix}_total"] = _hex_strings(self.total)
            state[f"{prefix}_squares"] = _hex_strings(self.squares)
            state[f"{prefix}_not_finite"] = self.not_finite
        return state

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> ExactMoments:
        moments = cls()
        count = int(arrays[f"{prefix}_count"])
        if count:
            moments._merge(count, _from_hex_strings(arrays[f"{prefix}_total"]),
                           _from_hex_strings(arrays[f"{prefix}_squares"]),
                           np.asarray(arrays[f"{prefix}_not_finite"], dtype=np.int64))
        return moments


def _hex_strings(integers: np.ndarray) -> np.ndarray:
    """An object array of Python ints as a unicode array of the same shape (hex, exact)."""
    return np.array([hex(int(i)) for i in integers.flat], dtype=str).reshape(integers.shape)


def _from_hex_strings(strings: np.ndarray) -> np.ndarray:
    strings = np.asarray(strings)
    return np.array([int(str(s), 16) for s in strings.flat] or [], dtype=object).reshape(strings.shape)


@dataclass
class ImageRows:
    """The per-image table, a list per column: one row per analysed image, in the run's order."""

    file: list[str] = field(default_factory=list)
    label: list[int] = field(default_factory=list)  # true class, NO_LABEL when unknown
    predicted: list[int] = field(default_factory=list)  # top-1 class
    probability: list[float] = field(default_factory=list)  # its softmax probability
    explained: list[dict[str, float]] = field(default_factory=list)  # named scalars (explained_values), {} without

    def __len__(self) -> int:
        return len(self.file)

    def extend(self, other: ImageRows) -> None:
        for name in ("file", "label", "predicted", "probability", "explained"):
            getattr(self, name).extend(getattr(other, name))

    def explained_keys(self) -> list[str]:
        """Every explained key of any row, in the order first met."""
        return list(dict.fromkeys(key for row in self.explained for key in row))

    def explained_column(self, key: str) -> np.ndarray:
        """float64 (n,): each row's value of `key`, NaN where the row has none."""
        return np.array([row.get(key, np.nan) for row in self.explained], dtype=np.float64)


@dataclass
class Totals:
    """Everything a set of files adds up to. `add_batch` takes a reduced batch, `merge` another set's totals."""

    distance: ExactMoments = field(default_factory=ExactMoments)  # per image (L, H): mean attention distance
    distance_renorm: ExactMoments = field(default_factory=ExactMoments)  # (L, H): rows renormalised
    high_norm_rate: ExactMoments = field(default_factory=ExactMoments)  # (L+1,)
    labelled: int = 0  # analysed images with a known true class
    correct: int = 0  # ... whose top-1 is it
    lens_correct: np.ndarray | None = None  # int64 (L+1,): ... whose logit-lens row's top-1 is it; None before one
    confusion: Counter[tuple[int, int]] = field(default_factory=Counter)  # (true, predicted) -> labelled images
    explained: dict[str, ExactMoments] = field(default_factory=dict)  # key -> moments over images that have it
    lensed: dict[str, ExactMoments] = field(default_factory=dict)  # <lens>.<key> -> moments of its array over images
    lens_varying: set[str] = field(default_factory=set)  # lens arrays whose shape differed between images: no mean
    lens_failures: list[tuple[str, str]] = field(default_factory=list)  # (file, one sentence): a lens that raised on it
    rows: ImageRows = field(default_factory=ImageRows)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (file, one sentence): images that couldn't be used
    not_images: list[tuple[str, str]] = field(default_factory=list)  # (file, one sentence): files that aren't images

    @property
    def num_images(self) -> int:
        return self.distance.count

    def add_batch(self, files: Sequence[str], labels: Sequence[int | None] | None, values: BatchValues,
                  explained: Sequence[Mapping[str, float]] | None = None) -> None:
        """One reduced batch: files (B,) its images' names, labels (B,) their true classes (None: unknown; all
        unknown: None), values the device's per-image values, explained (B,) each image's named scalars."""
        self.distance.add(values.distance)
        self.distance_renorm.add(values.distance_renorm)
        self.high_norm_rate.add(values.high_norm_rate)
        explained = explained if explained is not None else [{}] * len(files)
        for row, (file, scalars) in enumerate(zip(files, explained, strict=True)):
            label = labels[row] if labels is not None else None
            predicted = int(values.top1[row])
            self.rows.file.append(file)
            self.rows.label.append(NO_LABEL if label is None else int(label))
            self.rows.predicted.append(predicted)
            self.rows.probability.append(float(values.probability[row]))
            self.rows.explained.append(dict(scalars))
            for key, value in scalars.items():
                self.explained.setdefault(key, ExactMoments()).add(np.array([value]))
            if label is not None:
                self.labelled += 1
                self.correct += int(predicted == label)
                self.confusion[int(label), predicted] += 1
                if values.lens_top1 is not None:
                    hits = (values.lens_top1[row] == label).astype(np.int64)  # (L+1,)
                    self.lens_correct = hits if self.lens_correct is None else self.lens_correct + hits

    def add_lensed(self, key: str, moments: ExactMoments) -> None:
        """The moments of lens array `key` over more images; a shape unlike the others' makes the key one with no mean."""
        if key in self.lens_varying:
            return
        mine = self.lensed.setdefault(key, ExactMoments())
        if mine.count and moments.count and mine.total.shape != moments.total.shape:
            del self.lensed[key]
            self.lens_varying.add(key)
            return
        mine.merge(moments)

    def merge(self, other: Totals) -> None:
        """Add another set of files: afterwards self holds the totals of both, other's rows and failures after self's."""
        for name in ("distance", "distance_renorm", "high_norm_rate"):
            getattr(self, name).merge(getattr(other, name))
        self.labelled += other.labelled
        self.correct += other.correct
        if other.lens_correct is not None:
            self.lens_correct = other.lens_correct.copy() if self.lens_correct is None else self.lens_correct + other.lens_correct
        self.confusion.update(other.confusion)
        for key, moments in other.explained.items():
            self.explained.setdefault(key, ExactMoments()).merge(moments)
        for key in other.lens_varying:
            self.lensed.pop(key, None)
            self.lens_varying.add(key)
        for key, moments in other.lensed.items():
            self.add_lensed(key, moments)
        self.lens_failures.extend(other.lens_failures)
        self.rows.extend(other.rows)
        self.failures.extend(other.failures)
        self.not_images.extend(other.not_images)

    # ------------------------------------------------------------------------------------------
    # As flat arrays (a part file, Ray's results): numbers, and unicode string arrays, never objects

    def arrays(self) -> dict[str, np.ndarray]:
        """The totals as named arrays that `from_arrays` reads back exactly (np.load without pickle)."""
        keys = self.rows.explained_keys()
        arrays = {
            **self.distance.arrays("distance"), **self.distance_renorm.arrays("distance_renorm"),
            **self.high_norm_rate.arrays("high_norm_rate"),
            "labelled": np.asarray(self.labelled, dtype=np.int64), "correct": np.asarray(self.correct, dtype=np.int64),
            "confusion": confusion_array(self.confusion),
            "explained_keys": _strings(list(self.explained)),
            "rows_file": _strings(self.rows.file),
            "rows_label": np.asarray(self.rows.label, dtype=np.int64),
            "rows_predicted": np.asarray(self.rows.predicted, dtype=np.int64),
            "rows_probability": np.asarray(self.rows.probability, dtype=np.float32),
            "rows_explained_keys": _strings(keys),
            "rows_explained": np.stack([self.rows.explained_column(k) for k in keys], axis=1) if keys
            else np.zeros((len(self.rows), 0)),  # (n, K), NaN where an image has no value
            "failure_file": _strings([f for f, _ in self.failures]), "failure_reason": _strings([r for _, r in self.failures]),
            "not_image_file": _strings([f for f, _ in self.not_images]),
            "not_image_reason": _strings([r for _, r in self.not_images]),
        }
        if self.lens_correct is not None:
            arrays["lens_correct"] = self.lens_correct
        for i, moments in enumerate(self.explained.values()):
            arrays.update(moments.arrays(f"explained{i}"))  # numbered: a key is free text
        if self.lensed or self.lens_varying or self.lens_failures:
            arrays["lensed_keys"], arrays["lens_varying"] = _strings(list(self.lensed)), _strings(sorted(self.lens_varying))
            arrays["lens_failure_file"] = _strings([f for f, _ in self.lens_failures])
            arrays["lens_failure_reason"] = _strings([r for _, r in self.lens_failures])
            for i, moments in enumerate(self.lensed.values()):
                arrays.update(moments.arrays(f"lensed{i}"))
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Totals:
        keys = [str(k) for k in arrays["rows_explained_keys"]]
        table = np.asarray(arrays["rows_explained"], dtype=np.float64)  # (n, K)
        rows = ImageRows(
            file=[str(f) for f in arrays["rows_file"]], label=[int(v) for v in arrays["rows_label"]],
            predicted=[int(v) for v in arrays["rows_predicted"]],
            probability=[float(v) for v in arrays["rows_probability"]],
            explained=[{k: float(v) for k, v in zip(keys, row, strict=True) if not np.isnan(v)} for row in table],
        )
        return cls(
            distance=ExactMoments.from_arrays(arrays, "distance"),
            distance_renorm=ExactMoments.from_arrays(arrays, "distance_renorm"),
            high_norm_rate=ExactMoments.from_arrays(arrays, "high_norm_rate"),
            labelled=int(arrays["labelled"]), correct=int(arrays["correct"]),
            lens_correct=np.array(arrays["lens_correct"], dtype=np.int64) if "lens_correct" in arrays else None,
            confusion=Counter({(int(t), int(p)): int(n) for t, p, n in np.asarray(arrays["confusion"])}),
            explained={str(key): ExactMoments.from_arrays(arrays, f"explained{i}")
                       for i, key in enumerate(arrays["explained_keys"])},
            lensed={str(key): ExactMoments.from_arrays(arrays, f"lensed{i}")
                    for i, key in enumerate(arrays.get("lensed_keys", ()))},
            lens_varying={str(key) for key in arrays.get("lens_varying", ())},
            lens_failures=list(zip(map(str, arrays.get("lens_failure_file", ())),
                                   map(str, arrays.get("lens_failure_reason", ())), strict=True)),
            rows=rows,
            failures=list(zip(map(str, arrays["failure_file"]), map(str, arrays["failure_reason"]), strict=True)),
            not_images=list(zip(map(str, arrays["not_image_file"]), map(str, arrays["not_image_reason"]), strict=True)),
        )


def confusion_array(confusion: Mapping[tuple[int, int], int]) -> np.ndarray:
    """The confusion counts as int64 (K, 3) rows (true class, predicted class, images), sorted, zeros left out:
    a dense (C, C) matrix would be 8 MB per part for ImageNet's 1000 classes and 3.8 GB for 21k."""
    cells = sorted((t, p, n) for (t, p), n in confusion.items() if n)
    return np.array(cells, dtype=np.int64).reshape(len(cells), 3)


def _strings(values: Sequence[str]) -> np.ndarray:
    """A unicode array (np.load reads it without pickle), also when empty."""
    return np.array(list(values), dtype=str) if values else np.zeros(0, dtype="<U1")
