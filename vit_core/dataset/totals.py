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
from typing import Iterator, Mapping, Sequence

import numpy as np

from .reductions import BatchValues

NO_LABEL = -1  # an image without a known true class, in the table's integer columns


# A float64 is an integer multiple of 2**-1074 (its smallest subnormal): times 2**EXACT_SCALE_BITS, every finite
# float64 is an integer (m * 2**e with m < 2**53 and e >= -1074 - 53), so sums of such integers are exact.
EXACT_SCALE_BITS = 1074 + 53

LIMB_BITS = 32
_LIMB_MASK = (1 << LIMB_BITS) - 1
_PIECE_BELOW = 1 << 33  # what one deposited number adds to any limb, at most (_Block.deposit)
_LIMB_HEADROOM = 1 << 62  # carries are propagated before a limb could pass this, so int64 never overflows
_BLOCK = 1 << 16  # elements per window: a window that grows copies one block, never the whole array
_CHUNK = 1 << 18  # values turned into deposits at once: bounds what `add` holds besides the sums
_UNSUMMED_ROWS = 8  # images whose values moments keep as they came (a CPU's batch): fewer bytes than their limbs
# A sum of squares of 2**63 float64s below 2**1024, in units of 2**-(2 * EXACT_SCALE_BITS), has fewer bits.
_WIDEST_SUM = 2 * (1024 + EXACT_SCALE_BITS) + 64


def binary_parts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The finite non-zero values of `values` (B, n) float32 or float64, each as odd * 2**position in units of
    2**-EXACT_SCALE_BITS: column (m,) each one's column, odd (m,) int64 odd with the value's sign and below 2**53
    in magnitude, position (m,) int64 >= 0. Zeros (of either sign) and non-finite values are left out (the caller
    counts the latter)."""
    finite = np.where(np.isfinite(values), values, 0.0).astype(np.float64, copy=False)
    fraction, exponent = np.frexp(finite)  # value = fraction * 2**exponent
    mantissa = (fraction * 2.0**53).astype(np.int64).reshape(-1)  # exact: a float64's mantissa has 53 bits
    exponent = exponent.reshape(-1)
    if mantissa.all():  # dense values: no gather
        column = np.tile(np.arange(values.shape[1]), len(values))
    else:
        index = np.flatnonzero(mantissa)
        mantissa, exponent, column = mantissa[index], exponent[index], index % values.shape[1]
    zeros = np.frexp((mantissa & -mantissa).astype(np.float64))[1] - 1  # trailing zero bits (of either sign)
    position = (exponent + zeros).astype(np.int64) + 1074  # the odd part's last bit: exponent - 53 + EXACT_SCALE_BITS
    return column, mantissa >> zeros, position


class _Block:
    """Exact integers, one per element of a block of `size`, as int64 limbs of LIMB_BITS bits over a window of bit
    positions that all its elements share: element j is sum_k limbs[k, j] * 2**(shift + 32 k).

    A deposit adds each number's pieces (each below 2**33) to the limbs of its bit positions, so a limb is not kept
    within 0..2**32-1 as numbers come: `bound` tracks the largest magnitude a limb may have, and the carries are
    propagated (`normalise`) before it could pass 2**62. The window grows when a number lies outside it."""

    def __init__(self, size: int) -> None:
        self.shift = 0  # bit position of limb 0, a multiple of LIMB_BITS
        self.limbs = np.zeros((0, size), dtype=np.int64)  # (K, size)
        self.bound = 0  # no limb's magnitude is above it

    def copy(self) -> _Block:
        block = _Block(0)
        block.shift, block.limbs, block.bound = self.shift, self.limbs.copy(), self.bound
        return block

    def cover(self, start: int, stop: int) -> None:
        """Grow the window to hold bit positions start..stop-1 (multiples of LIMB_BITS), zeros in the new limbs."""
        count = len(self.limbs)
        if count:
            start, stop = min(start, self.shift), max(stop, self.shift + LIMB_BITS * count)
            if (start, stop) == (self.shift, self.shift + LIMB_BITS * count):
                return
        limbs = np.zeros(((stop - start) // LIMB_BITS, self.limbs.shape[1]), dtype=np.int64)
        at = (self.shift - start) // LIMB_BITS
        limbs[at:at + count] = self.limbs
        self.shift, self.limbs = start, limbs

    def make_room(self, added: int) -> None:
        """Propagate the carries if limbs could grow by `added` past the headroom."""
        if self.bound + added > _LIMB_HEADROOM:
            self.normalise()

    def deposit(self, elements: np.ndarray, numbers: np.ndarray, positions: np.ndarray, repeats: int) -> None:
        """Add numbers[i] * 2**positions[i] to element elements[i], for each i: elements, positions (m,) int64 >= 0,
        numbers (m,) int64 non-zero, of magnitude below 2**54; no element named more than `repeats` times."""
        if len(elements) == 0:
            return
        lowest, highest = int(positions.min()), int(positions.max())
        self.cover(lowest - lowest % LIMB_BITS, highest - highest % LIMB_BITS + 3 * LIMB_BITS)  # pieces reach 2 limbs up
        self.make_room(repeats * _PIECE_BELOW)
        offset = positions - self.shift
        limb, bit = offset >> 5, offset & (LIMB_BITS - 1)  # (m,) offset // 32, offset % 32: where its last bit falls
        low = (numbers & _LIMB_MASK) << bit  # in 0..2**63-1
        high = (numbers >> LIMB_BITS) << bit  # floor: numbers = high 2**32 + low before the shifts; |high| < 2**53
        pieces = (low & _LIMB_MASK, (low >> LIMB_BITS) + (high & _LIMB_MASK), high >> LIMB_BITS)  # limbs limb, +1, +2
        size = self.limbs.shape[1]
        flat, index = self.limbs.reshape(-1), limb * size + elements  # a view: the limbs are C-contiguous
        for step, piece in enumerate(pieces):  # 0..2**32-1, 0..2**33-1, and signed below 2**21
            np.add.at(flat, index + step * size if step else index, piece)
        self.bound += repeats * _PIECE_BELOW

    def add(self, other: _Block) -> None:
        """Add another block's integers, element by element."""
        if not len(other.limbs):
            return
        if self.bound + other.bound > _LIMB_HEADROOM:
            self.normalise()
            other.normalise()  # the same integers: only where its carries sit changes
        self.cover(other.shift, other.shift + LIMB_BITS * len(other.limbs))
        at = (other.shift - self.shift) // LIMB_BITS
        self.limbs[at:at + len(other.limbs)] += other.limbs
        self.bound += other.bound

    def normalise(self) -> None:
        """Carry each limb's excess into the next: afterwards limbs 0..K-2 are in 0..2**32-1 and the top one, signed,
        in -2**31..2**31-1 (the window gains limbs at the top where a sum needs them), the integers unchanged."""
        limbs = self.limbs
        for k in range(len(limbs) - 1):
            carry = limbs[k] >> LIMB_BITS  # floor division: also right for negative limbs
            limbs[k] &= _LIMB_MASK
            limbs[k + 1] += carry
        while len(limbs) and ((limbs[-1] < -(1 << 31)) | (limbs[-1] >= 1 << 31)).any():
            limbs = np.concatenate([limbs, limbs[-1:] >> LIMB_BITS])
            limbs[-2] &= _LIMB_MASK
        self.limbs, self.bound = limbs, (1 << LIMB_BITS if len(limbs) else 0)

    def trim(self) -> None:
        """Normalised, with the fewest limbs: no all-zero limb at the bottom, no top limb that only repeats the sign of
        the one below. So its limbs and shift depend on the integers alone."""
        self.normalise()
        limbs, shift = self.limbs, self.shift
        while len(limbs) and not limbs[0].any():
            limbs, shift = limbs[1:], shift + LIMB_BITS
        while len(limbs) > 1 and (limbs[-1] == -(limbs[-2] >> 31)).all():  # top = -1 where bit 31 below is set, else 0
            limbs = limbs[:-1].copy()
            limbs[-1] -= (limbs[-1] >> 31) << LIMB_BITS  # the new top limb, signed
        self.limbs, self.shift = np.ascontiguousarray(limbs), shift if len(limbs) else 0

    def words(self) -> np.ndarray:
        """uint32 (size, K): each element's integer in two's complement, least significant word first (after `trim`)."""
        return (self.limbs & _LIMB_MASK).astype(np.uint32).T.copy()


class ExactSums:
    """One exact integer per element of a flat array of `size` elements, in blocks of _BLOCK elements, each with a
    window of its own (`_Block`)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.blocks = [_Block(min(_BLOCK, size - start)) for start in range(0, size, _BLOCK)]

    def copy(self) -> ExactSums:
        sums = ExactSums(0)
        sums.size, sums.blocks = self.size, [block.copy() for block in self.blocks]
        return sums

    def spans(self) -> Iterator[tuple[int, int, _Block]]:
        """(start, stop, block): each block with the elements start..stop-1 of the array that it holds."""
        start = 0
        for block in self.blocks:
            yield start, start + block.limbs.shape[1], block
            start += block.limbs.shape[1]

    def add(self, other: ExactSums) -> None:
        for mine, theirs in zip(self.blocks, other.blocks, strict=True):
            mine.add(theirs)

    def integers(self) -> Iterator[tuple[int, int]]:
        """Each element's integer as (value, shift): the integer is value * 2**shift."""
        for block in self.blocks:
            block.trim()
            width = 4 * len(block.limbs)
            words = memoryview(block.words().tobytes())
            for j in range(block.limbs.shape[1]):
                yield int.from_bytes(words[j * width:(j + 1) * width], "little", signed=True), block.shift

    def stored(self) -> tuple[np.ndarray, int]:
        """(words, shift): uint32 (size, K) each element's integer in two's complement, least significant word first,
        times 2**shift; the fewest words that hold every element, so the same integers give the same arrays."""
        for block in self.blocks:
            block.trim()
        used = [block for block in self.blocks if len(block.limbs)]
        if not used:
            return np.zeros((self.size, 0), dtype=np.uint32), 0
        shift = min(block.shift for block in used)
        count = max((block.shift - shift) // LIMB_BITS + len(block.limbs) for block in used)
        words = np.zeros((self.size, count), dtype=np.uint32)
        for start, stop, block in self.spans():
            if len(block.limbs):
                at = (block.shift - shift) // LIMB_BITS
                words[start:stop, at:at + len(block.limbs)] = block.words()
                words[start:stop, at + len(block.limbs):] = np.where(block.limbs[-1] < 0, _LIMB_MASK, 0)[:, None]  # sign
        return words, shift

    @classmethod
    def from_stored(cls, words: np.ndarray, shift: int) -> ExactSums:
        """The sums that `stored` gave (words (size, K) uint32, shift a multiple of LIMB_BITS)."""
        sums = cls(len(words))
        for start, stop, block in list(sums.spans()):  # a list: the blocks' limbs change below
            limbs = np.ascontiguousarray(words[start:stop].T, dtype=np.int64)  # (size, K) -> (K, size)
            if len(limbs):
                limbs[-1] -= (limbs[-1] >> 31) << LIMB_BITS  # the top word is signed
            block.shift, block.limbs, block.bound = shift, np.ascontiguousarray(limbs), 1 << LIMB_BITS
            block.trim()
        return sums

    @classmethod
    def from_integers(cls, integers: Sequence[int]) -> ExactSums:
        """Python ints as sums (a part written before sums were kept as words)."""
        count = max([(int(i).bit_length() + LIMB_BITS) // LIMB_BITS for i in integers] or [0])  # room for the sign bit
        data = b"".join(int(i).to_bytes(4 * count, "little", signed=True) for i in integers)
        return cls.from_stored(np.frombuffer(data, dtype="<u4").reshape(len(integers), count), 0)


def _nearest_float(numerator: int, denominator: int) -> float:
    """numerator / denominator rounded once to the nearest float64 (Python's int division is correctly rounded)."""
    return numerator / denominator


def _times_power_of_two(numerator: int, denominator: int, power: int) -> tuple[int, int]:
    """A fraction equal to numerator * 2**power / denominator, by shifting one of the two integers."""
    return (numerator << power, denominator) if power >= 0 else (numerator, denominator << -power)


def _sqrt_of_ratio(numerator: int, denominator: int) -> float:
    """sqrt(numerator / denominator) for a ratio >= 0 that may be too large for a float64 (the variance of values
    near 1e200): scaled by a power of four first where it must be. Scaling both integers by one power of two gives
    the same float."""
    excess = max(0, numerator.bit_length() - denominator.bit_length() - 1000) // 2
    return math.sqrt(_nearest_float(numerator, denominator << (2 * excess))) * 2.0**excess


def _mean(total: tuple[int, int], count: int) -> float:
    """S1 / n rounded once, S1 = value * 2**shift in units of 2**-EXACT_SCALE_BITS."""
    value, shift = total
    return _nearest_float(*_times_power_of_two(value, count, shift - EXACT_SCALE_BITS))


def _std(total: tuple[int, int], squares: tuple[int, int], count: int) -> float:
    """sqrt of (n S2 - S1^2) / n^2 rounded once: S1 = t * 2**st in units of 2**-EXACT_SCALE_BITS, S2 = q * 2**sq in
    units of 2**-(2 * EXACT_SCALE_BITS). The power of two both sides share is taken out first (smaller integers,
    the same ratio and so the same float)."""
    (t, st), (q, sq) = total, squares
    common = min(sq, 2 * st)
    numerator = ((count * q) << (sq - common)) - ((t * t) << (2 * st - common))
    return _sqrt_of_ratio(*_times_power_of_two(numerator, count * count, common - 2 * EXACT_SCALE_BITS))


class ExactMoments:
    """Mean and population standard deviation (ddof 0) over images of a per-image array, from exact sums: each value
    and its square are added as integers (in units of 2**-EXACT_SCALE_BITS and of its square), so the result is the
    same bits whatever the order, batches or shards the images came in, and is rounded once at the end. An element
    that met a NaN or infinity is NaN.

    The integers are limbs in numpy arrays (`ExactSums`): a few int64 per element, however many images. The values
    of the first few images are kept as they came until more come, so moments of a batch's images, merged into a
    run's, cost a copy of their values (float32 where that holds them exactly) and no limbs of their own."""

    def __init__(self) -> None:
        self.count = 0
        self.not_finite: np.ndarray | None = None  # int64 (...): values that were NaN or infinite
        self._unsummed: list[np.ndarray] = []  # float32 or float64 (B, ...) each, never written to: values not in the sums yet
        self._sums: ExactSums | None = None  # of the flattened (...): sum of the values; None while all are unsummed
        self._square_sums: ExactSums | None = None  # ... and of their squares

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The per-image array's shape, None before any image."""
        return None if self.not_finite is None else self.not_finite.shape

    def add(self, values: np.ndarray) -> None:
        """values: (B, ...) one row per image."""
        if len(values) == 0:
            return
        values = _own_copy(values)  # the caller may write to its array
        if self.count:
            self._check_shape(values.shape[1:])
        self._include(values)
        self.not_finite = _not_finite(values) + (self.not_finite if self.count else 0)
        self.count += len(values)

    def merge(self, other: ExactMoments) -> None:
        """Add the images `other` has seen: afterwards self is as if it had seen both sets."""
        if not other.count:
            return
        if self.count:
            self._check_shape(other.shape)
        if other._sums is None:
            for values in other._unsummed:
                self._include(values)
        elif self.count == 0:
            self._sums, self._square_sums = other._sums.copy(), other._square_sums.copy()
        else:
            self._sum_unsummed()
            self._sums.add(other._sums)
            self._square_sums.add(other._square_sums)
        self.not_finite = other.not_finite + (self.not_finite if self.count else 0)
        self.count += other.count

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        if tuple(shape) != self.shape:
            raise ValueError(f"per-image arrays of shape {tuple(shape)} and {self.shape} can't be added")

    def _include(self, values: np.ndarray) -> None:
        """values (B, ...) float32 or float64, never written to afterwards: kept unsummed while few images are, else summed."""
        if self._sums is None and sum(map(len, self._unsummed)) + len(values) <= _UNSUMMED_ROWS:
            self._unsummed.append(values)
            return
        self._sum_unsummed(values.shape[1:])
        self._deposit(values)

    def _sum_unsummed(self, shape: tuple[int, ...] | None = None) -> None:
        """Sums from here on (of `shape`, the default the moments' own), with the unsummed values in them."""
        if self._sums is None:
            size = math.prod(self.shape if shape is None else shape)
            self._sums, self._square_sums = ExactSums(size), ExactSums(size)
        unsummed, self._unsummed = self._unsummed, []
        for values in unsummed:
            self._deposit(values)

    def _deposit(self, values: np.ndarray) -> None:
        """Add values (B, ...) float64 to the sums, _CHUNK values at a time: each value v = odd * 2**p (odd signed) adds
        odd at bit p to the sums, and to the sums of squares odd**2 = (h 2**27 + l)**2 (h, l the high and low bits of
        |odd|) as l*l at bit 2p, 2*h*l at 2p + 27 and h*h at 2p + 54: integers below 2**54, no float squared."""
        flat = values.reshape(len(values), -1)  # (B, N)
        for row in range(0, len(flat), _CHUNK):
            rows = flat[row:row + _CHUNK]
            columns = max(1, _CHUNK // len(rows))
            for (start, stop, block), squares in zip(self._sums.spans(), self._square_sums.blocks, strict=True):
                for first in range(start, stop, columns):
                    column, odd, position = binary_parts(rows[:, first:min(first + columns, stop)])
                    column += first - start  # (m,): elements of the block
                    block.deposit(column, odd, position, len(rows))
                    magnitude = np.abs(odd)
                    high, low = magnitude >> 27, magnitude & ((1 << 27) - 1)
                    squares.deposit(column, low * low, 2 * position, len(rows))
                    wide = high > 0  # |odd| >= 2**27: not a float32's mantissa
                    if wide.any():
                        column, high, low, position = column[wide], high[wide], low[wide], position[wide]
                        squares.deposit(column, 2 * high * low, 2 * position + 27, len(rows))
                        squares.deposit(column, high * high, 2 * position + 54, len(rows))

    def _summed(self) -> tuple[ExactSums, ExactSums]:
        if not self.count:
            raise ValueError("no images were added")
        self._sum_unsummed()
        return self._sums, self._square_sums

    @property
    def total(self) -> np.ndarray:
        """object (...): the sum of the values as Python ints, in units of 2**-EXACT_SCALE_BITS (some 1,200 bits
        each: for a look at a few elements)."""
        return self._python_ints(self._summed()[0])

    @property
    def squares(self) -> np.ndarray:
        """object (...): the sum of their squares as Python ints, in units of 2**-(2 * EXACT_SCALE_BITS)."""
        return self._python_ints(self._summed()[1])

    def _python_ints(self, sums: ExactSums) -> np.ndarray:
        integers = np.empty(sums.size, dtype=object)
        integers[:] = [value << shift for value, shift in sums.integers()]
        return integers.reshape(self.shape)

    @property
    def mean(self) -> np.ndarray:
        """float64 (...): the exact mean, rounded once."""
        sums, n = self._summed()[0], self.count
        mean = np.fromiter((_mean(total, n) for total in sums.integers()), dtype=np.float64, count=sums.size)
        return np.where(self.not_finite > 0, np.nan, mean.reshape(self.shape))

    def std(self) -> np.ndarray:
        """float64 (...): sqrt of the exact population variance (n * sum x^2 - (sum x)^2) / n^2, rounded once
        before the square root."""
        (sums, square_sums), n = self._summed(), self.count
        pairs = zip(sums.integers(), square_sums.integers(), strict=True)
        std = np.fromiter((_std(total, squares, n) for total, squares in pairs), dtype=np.float64, count=sums.size)
        return np.where(self.not_finite > 0, np.nan, std.reshape(self.shape))

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its state as arrays named <prefix>_count; <prefix>_total and <prefix>_squares, uint32 (..., K) each
        element's sum in two's complement, least significant word first, times 2**<prefix>_total_shift (and
        <prefix>_squares_shift); <prefix>_not_finite. Only the count while empty."""
        state = {f"{prefix}_count": np.asarray(self.count, dtype=np.int64)}
        if self.count:
            for name, sums in zip(("total", "squares"), self._summed(), strict=True):
                words, shift = sums.stored()
                state[f"{prefix}_{name}"] = words.reshape(*self.shape, words.shape[1])
                state[f"{prefix}_{name}_shift"] = np.asarray(shift, dtype=np.int64)
            state[f"{prefix}_not_finite"] = self.not_finite
        return state

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> ExactMoments:
        """The moments that `arrays` wrote; also from a part's hexadecimal sums (as runs wrote them before words)."""
        moments = cls()
        count = int(arrays[f"{prefix}_count"])
        if count:
            moments.count = count
            moments.not_finite = np.array(arrays[f"{prefix}_not_finite"], dtype=np.int64)
            moments._sums, moments._square_sums = (_stored_sums(arrays, f"{prefix}_{name}") for name in ("total", "squares"))
        return moments


def _own_copy(values: np.ndarray) -> np.ndarray:
    """A copy of values read as float64: float32 where that holds every value exactly (a float32 array, or a lens's
    float32 values widened), so that unsummed values take half the bytes; float64 otherwise."""
    wide = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore"):  # a value beyond float32's range: kept as float64
        narrow = wide.astype(np.float32)
    if np.array_equal(narrow, wide, equal_nan=True):
        return narrow
    return wide.copy() if wide is values else wide


def _not_finite(values: np.ndarray) -> np.ndarray:
    """int64 (...): per element, the rows of values (B, ...) that are NaN or infinite."""
    return (~np.isfinite(values)).sum(axis=0).astype(np.int64)


def _stored_sums(arrays: Mapping[str, np.ndarray], key: str) -> ExactSums:
    stored = np.asarray(arrays[key])
    if stored.dtype.kind == "U":
        return ExactSums.from_integers([int(str(text), 16) for text in stored.flat])
    return ExactSums.from_stored(stored.reshape(math.prod(stored.shape[:-1]), stored.shape[-1]), int(arrays[f"{key}_shift"]))


def moments_shape(arrays: Mapping[str, np.ndarray], prefix: str) -> tuple[int, ...]:
    """The per-image array's shape that the moments of `prefix` in `arrays` claim (() where it can't be read)."""
    total = arrays.get(f"{prefix}_total")
    if not isinstance(total, np.ndarray):
        return ()
    return total.shape if total.dtype.kind == "U" or total.ndim == 0 else total.shape[:-1]


def moments_problem(arrays: Mapping[str, np.ndarray], prefix: str, shape: tuple[int, ...]) -> str | None:
    """What is wrong with the ExactMoments.arrays of `prefix`, whose values are each of `shape`, or None. Also reads
    the hexadecimal sums of parts written before the words."""
    count = array_scalar(arrays.get(f"{prefix}_count"), int)
    if count is None or count < 0:
        return f"{prefix}_count is not a whole number >= 0"
    if count == 0:
        return None
    for suffix in ("total", "squares"):
        name, value = f"{prefix}_{suffix}", arrays.get(f"{prefix}_{suffix}")
        problem = (_hex_problem(name, value, shape) if isinstance(value, np.ndarray) and value.dtype.kind == "U"
                   else _words_problem(name, value, arrays.get(f"{name}_shift"), shape))
        if problem:
            return problem
    not_finite = arrays.get(f"{prefix}_not_finite")
    if (not isinstance(not_finite, np.ndarray) or not_finite.dtype.kind not in "iu" or not_finite.shape != shape
            or (not_finite < 0).any() or (not_finite > count).any()):
        return f"{prefix}_not_finite is not counts of shape {shape}"
    return None


def array_scalar(value: object, kind: type) -> int | str | None:
    """A 0-d array of `kind`'s numpy kind (int: integers, str: unicode) as that Python value, else None (what a part's
    file may hold instead)."""
    if not isinstance(value, np.ndarray) or value.shape != ():
        return None
    if kind is int and value.dtype.kind in "iu":
        return int(value)
    if kind is str and value.dtype.kind == "U":
        return str(value)
    return None


def _words_problem(name: str, words: object, shift: object, shape: tuple[int, ...]) -> str | None:
    if (not isinstance(words, np.ndarray) or words.dtype != np.uint32 or words.ndim != len(shape) + 1
            or words.shape[:-1] != shape):
        return f"{name} is not exact sums of shape {shape}"  # never broadcast to it
    shift = array_scalar(shift, int)
    if shift is None or shift < 0 or shift % LIMB_BITS or shift + LIMB_BITS * words.shape[-1] > _WIDEST_SUM + LIMB_BITS:
        return f"{name}_shift is not a bit position of the sums"
    if name.endswith("_squares") and words.shape[-1] and (words[..., -1] >= 1 << 31).any():
        return f"{name} holds a negative sum of squares"
    return None


def _hex_problem(name: str, value: np.ndarray, shape: tuple[int, ...]) -> str | None:
    if value.shape != shape:
        return f"{name} is not exact sums of shape {shape}"
    try:
        numbers = [int(str(text), 16) for text in value.flat]
    except ValueError:
        return f"{name} is not hexadecimal text"
    if name.endswith("_squares") and any(n < 0 for n in numbers):
        return f"{name} holds a negative sum of squares"
    return None


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
        if mine.count and moments.count and mine.shape != moments.shape:
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
