"""What two models' tokens and rows add up to over a set of images, kept so that any split of the images merges into
the sums of all, bit for bit (as vit_core.dataset.totals does for one model).

The CKA sums are large (two ViT-B/16: 13 x 13 cross products of 768 x 768), so they are not Python integers as
dataset's ExactMoments are: each image's float64 sum is rounded once to a multiple of 2**-FRACTION_BITS and kept as
two limbs (`FixedSums`: int64 high, uint32 low), whose additions are exact in any order. Shapes: L blocks, D widths,
n images.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from ..dataset import ExactMoments
from ..export import npz_member, read_piece

FRACTION_BITS = 40  # each image's sums are kept to 2**-40 (about 9e-13)
LIMB_BITS = 32
LOW_MASK = (1 << LIMB_BITS) - 1
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


CHUNK_VALUES = 2 ** 16  # values of a sum's array worked on at a time: scratch of a few hundred KiB, in the CPU's cache


def limb_threads() -> int:
    """Threads that turn a large sum's values into limbs: torch's intra-op threads, the forwards' own between sums."""
    return max(1, torch.get_num_threads())


def flat_chunks(size: int) -> list[slice]:
    """Consecutive pieces of CHUNK_VALUES values (the last one shorter) covering range(size)."""
    return [slice(start, min(start + CHUNK_VALUES, size)) for start in range(0, size, CHUNK_VALUES)]


def row_chunks(shape: tuple[int, ...], axes: int) -> list[slice | type(Ellipsis)]:
    """Index expressions cutting an array of `shape` along its first axis into pieces of about CHUNK_VALUES values
    (at least one row each); the whole array (`...`) where `axes` is 0 (its first axis may not be cut)."""
    if axes == 0 or not shape:
        return [Ellipsis]
    step = max(1, CHUNK_VALUES // max(1, math.prod(shape[1:])))
    return [slice(start, min(start + step, shape[0])) for start in range(0, shape[0], step)]


def add_limbs(high: np.ndarray, low: np.ndarray, part_high: np.ndarray | int, part_low: np.ndarray) -> None:
    """high (int64) and low (uint32) += part_high and part_low (int64, any), in place: the sums stay
    high * 2**32 + low with low in [0, 2**32), the carry gone into high."""
    total = low + part_low  # int64: below 2**63 for any part_low of fewer than 2**31 images
    high += part_high
    high += total >> LIMB_BITS  # floor division: also right for negatives
    low[...] = total & LOW_MASK


def add_small_units(high: np.ndarray, low: np.ndarray, values: np.ndarray, scratch: tuple[np.ndarray, ...]) -> bool:
    """`fixed_limbs`' usual case on the host, in place: values (F, n) float64, F images' -> their rounded units summed
    into the limbs high (int64) and low (uint32) (n,) as `add_limbs` adds, where every value is finite and the F
    images' units sum within int64; False, nothing added, where one is not. `scratch`: a float64 and two int64
    arrays of n values or more."""
    bound = 2.0 ** 62 / (2.0 ** FRACTION_BITS * len(values))  # a power of two: the images' units sum below 2**62
    if not (-bound < values.min() and values.max() < bound):  # also False for a NaN
        return False
    scaled, units, part = (array[:values.shape[1]] for array in scratch)
    for k, image in enumerate(values):
        np.rint(np.multiply(image, 2.0 ** FRACTION_BITS, out=scaled), out=scaled)  # half to even, as torch.round
        np.copyto(units if k == 0 else part, scaled, casting="unsafe")  # exact: integers below 2**62
        if k:
            units += part
    units += low  # below 2**62 + 2**32: within int64
    high += np.right_shift(units, LIMB_BITS, out=part)  # floor division: also right for negatives
    np.copyto(low, units, casting="unsafe")  # int64 -> uint32 keeps the low 32 bits (C's modular conversion)
    return True


class FixedSums:
    """Sums over images of per-image arrays of one shape, exact (`fixed_limbs`): the same bits in any order or split.
    The last `element_dims` dims share one not-finite count per leading index (a CKA pair is NaN as a whole). Two
    ViT-B/16s' sums are 1.3 GiB: every addition goes into the sums' own arrays a chunk at a time (`flat_chunks`), so
    no temporary of their size is ever made beside them, and the low limbs are kept carried (uint32, 4 bytes a value
    less than int64 would take)."""

    def __init__(self, element_dims: int = 0) -> None:
        self.element_dims = element_dims
        self.high: np.ndarray | None = None  # int64 (...): in units of 2**(32 - 40)
        self.low: np.ndarray | None = None  # uint32 (...): in units of 2**-40
        self.not_finite: np.ndarray | None = None  # int64 (leading dims)

    def add(self, values: torch.Tensor, images: int, shape: tuple[int, ...] | None = None, at: int | None = None) -> None:
        """The first `images` rows of values (F, ...), one per image. With `at`, values (F, ...) are the sums' row
        `at` of a whole of `shape` (so a large whole is added a row at a time)."""
        self._allocate(tuple(values.shape[1:]) if at is None else tuple(shape))
        index = () if at is None else (at,)
        high, low, not_finite = (_at(array, index).reshape(-1) for array in (self.high, self.low, self.not_finite))
        if values.device.type != "cpu":  # an accelerator's: the limbs made there, a row at a time, added here
            part_high, part_low, bad = fixed_limbs(values, images)
            for piece in flat_chunks(high.size):
                add_limbs(high[piece], low[piece], part_high.reshape(-1)[piece], part_low.reshape(-1)[piece])
            not_finite += self._per_leading_index(bad).reshape(-1)
            return
        values = np.ascontiguousarray(values[:images].double().numpy()).reshape(images, -1)  # (F, n) float64
        size = min(CHUNK_VALUES, values.shape[1])

        def add_pieces(pieces: list[slice]) -> list[slice]:  # -> the pieces it left: a NaN or a value too large
            scratch = (np.empty(size), np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64))
            return [piece for piece in pieces if not add_small_units(high[piece], low[piece], values[:, piece], scratch)]

        pieces = flat_chunks(values.shape[1])
        threads = min(limb_threads(), len(pieces))
        if threads > 1:  # numpy lets go of the GIL in each operation: the pieces are apart, each thread its own
            with ThreadPoolExecutor(threads) as pool:
                left = [piece for share in pool.map(add_pieces, [pieces[t::threads] for t in range(threads)])
                        for piece in share]
        else:
            left = add_pieces(pieces)
        per_index = high.size // max(1, not_finite.size)  # values per leading index
        for piece in sorted(left, key=lambda piece: piece.start):  # rare: on this thread, the counts shared
            part_high, part_low, bad = fixed_limbs(torch.from_numpy(values[:, piece]), images)
            add_limbs(high[piece], low[piece], part_high, part_low)
            where = np.flatnonzero(bad)
            np.add.at(not_finite, (piece.start + where) // per_index, bad[where])

    def _per_leading_index(self, bad: np.ndarray) -> np.ndarray:
        """Not-finite counts per value (...) -> per leading index."""
        return bad.reshape(*bad.shape[:bad.ndim - self.element_dims], -1).sum(axis=-1) if self.element_dims else bad

    def _allocate(self, shape: tuple[int, ...]) -> None:
        """Zero sums of `shape` where there are none yet; ValueError where there are sums of another shape."""
        if self.high is None:
            self.high, self.low = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.uint32)
            self.not_finite = np.zeros(shape[:len(shape) - self.element_dims], dtype=np.int64)
        elif self.high.shape != shape:
            raise ValueError(f"sums of shape {shape} and {self.high.shape} can't be added")

    def merge(self, other: FixedSums, take: bool = False) -> None:
        """Add other's sums. `take`: other is not used afterwards, so an empty self may take its arrays (two ViT-B/16s'
        CKA sums are 1.3 GiB: a copy is time and memory)."""
        if other.high is None:
            return
        if self.high is None and take:
            self.high, self.low, self.not_finite = other.high, other.low, other.not_finite
            return
        self._allocate(other.high.shape)
        high, low, other_high, other_low = (a.reshape(-1) for a in (self.high, self.low, other.high, other.low))
        for piece in flat_chunks(high.size):
            add_limbs(high[piece], low[piece], other_high[piece], other_low[piece].astype(np.int64))
        self.not_finite += other.not_finite

    def merge_npz(self, npz: np.lib.npyio.NpzFile, prefix: str) -> None:
        """Add the sums an open .npz holds under `prefix` (as `arrays` writes them), read a chunk at a time straight
        into self's arrays. Raises ValueError (or KeyError, OSError, zipfile.BadZipFile) for a damaged file."""
        if f"{prefix}_high" not in npz.files:
            return
        not_finite = np.asarray(npz[f"{prefix}_not_finite"])
        for limb in ("high", "low"):  # high's whole array, then low's: the sums are the same once both are in
            with npz_member(npz, f"{prefix}_{limb}") as (shape, dtype, file):
                if dtype.kind not in "iu" or not_finite.shape != shape[:len(shape) - self.element_dims]:
                    raise ValueError(f"{prefix}'s sums are not limbs of one shape")
                self._allocate(shape)
                high, low = self.high.reshape(-1), self.low.reshape(-1)
                for piece in flat_chunks(high.size):
                    read = read_piece(file, (piece.stop - piece.start,), dtype).astype(np.int64)
                    if limb == "high":
                        high[piece] += read
                    else:
                        add_limbs(high[piece], low[piece], 0, read)
        self.not_finite += not_finite.astype(np.int64)

    def value(self, index: tuple[int, ...] = ()) -> np.ndarray:
        """float64: the sums at `index` of the leading dims (all of them by default), NaN in a leading index that met
        a value left out."""
        high, low, not_finite = (_at(array, index) for array in (self.high, self.low, self.not_finite))
        out = np.empty(high.shape, dtype=np.float64)
        for rows in row_chunks(high.shape, not_finite.ndim):
            value = high[rows].astype(np.float64) * 2.0 ** (LIMB_BITS - FRACTION_BITS) + low[rows] * 2.0 ** -FRACTION_BITS
            bad = not_finite[rows]
            out[rows] = np.where(bad.reshape(bad.shape + (1,) * self.element_dims) > 0, np.nan, value)
        return out

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The sums as named arrays, the low limbs uint32 (`from_arrays`, `merge_npz` read them back): the sums'
        own arrays, not copies."""
        if self.high is None:
            return {}
        return {f"{prefix}_high": self.high, f"{prefix}_low": self.low, f"{prefix}_not_finite": self.not_finite}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str, element_dims: int = 0) -> FixedSums:
        """The sums `arrays` holds under `prefix` (as `arrays` writes them, or any int64 limbs of them), copied."""
        sums = cls(element_dims)
        if f"{prefix}_high" in arrays:
            high, low = (np.asarray(arrays[f"{prefix}_{limb}"]) for limb in ("high", "low"))
            not_finite = np.asarray(arrays[f"{prefix}_not_finite"], dtype=np.int64)
            if low.shape != high.shape or not_finite.shape != high.shape[:high.ndim - element_dims]:
                raise ValueError(f"{prefix}'s sums are not limbs of one shape")
            sums._allocate(high.shape)
            add_limbs(sums.high, sums.low, high.astype(np.int64), low.astype(np.int64))
            sums.not_finite += not_finite
        return sums


def _at(array: np.ndarray, index: tuple[int, ...]) -> np.ndarray:
    """A view of `array` at `index` of its leading dims (a 0-d view, not a scalar, where it indexes them all)."""
    return array[(*index, Ellipsis)]


SUMS = ("sum_a", "sum_b", "self_a", "self_b", "cross")  # CompareTotals' FixedSums, each its arrays' prefix


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
        for name in SUMS:
            getattr(self, name).merge(getattr(other, name), take)
        self.js.merge(other.js)
        self.file.extend(other.file)
        self.kl.extend(other.kl)
        self.rollout_correlation.extend(other.rollout_correlation)

    def merge_npz(self, npz: np.lib.npyio.NpzFile) -> None:
        """Add the totals an open .npz holds (as `arrays` writes them): its rows after self's, its sums read a chunk
        at a time straight into self's (`FixedSums.merge_npz`). Raises ValueError, KeyError or TypeError (or OSError,
        zipfile.BadZipFile) for a damaged file."""
        self.merge(CompareTotals.from_arrays({key: npz[key] for key in npz.files if not key.startswith(SUMS)}))
        for name in SUMS:
            getattr(self, name).merge_npz(npz, name)

    def cka(self) -> np.ndarray:
        """float64 (La+1, Lb+1): linear CKA of every pair of residual rows (NaN before any image)."""
        if self.cross.high is None:
            return np.full((0, 0), np.nan)
        from .measures import linear_cka

        sum_a, sum_b, self_a, self_b = (s.value() for s in (self.sum_a, self.sum_b, self.self_a, self.self_b))
        rows, columns = self.cross.high.shape[:2]
        return np.array([[linear_cka(self.cross.value((i, j)), self_a[i], self_b[j], sum_a=sum_a[i], sum_b=sum_b[j],
                                     n=self.tokens)  # one (Da, Db) block of the cross sums at a time
                          for j in range(columns)] for i in range(rows)], dtype=np.float64)

    def kl_mean(self) -> float | None:
        """The mean KL over images, the exact sum rounded once (math.fsum); None without KL."""
        kl = [k for k in self.kl if not math.isnan(k)]
        return math.fsum(kl) / len(kl) if kl else None

    def arrays(self) -> dict[str, np.ndarray]:
        """The totals as named arrays (`from_arrays`, `merge_npz` read them back); the sums' are their own arrays."""
        sums = {key: value for name in SUMS for key, value in getattr(self, name).arrays(name).items()}
        return {"tokens": np.asarray(self.tokens, dtype=np.int64), **sums, **self.js.arrays("js"),
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
