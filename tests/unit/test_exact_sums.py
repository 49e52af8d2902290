"""Exact sums in limbs (vit_core.dataset.totals: ExactMoments, ExactSums): the same integers, and so the same mean
and std bits, as the plain Python-int sums they replace (a reference copy of them below), for values at every
magnitude a float64 has, in any order and split; carries kept in bounds over many additions; the part files'
words, and the hexadecimal sums of older parts, read back."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from vit_core.dataset import totals
from vit_core.dataset.totals import EXACT_SCALE_BITS, ExactMoments, ExactSums, moments_problem, moments_shape

# ---------------------------------------------------------------------------------- the reference: Python ints


def reference_units(values: np.ndarray) -> np.ndarray:
    """Each finite value times 2**EXACT_SCALE_BITS as a Python int (object array), non-finite ones 0: the
    accumulator's own conversion before limbs."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    mantissa, exponent = np.frexp(np.where(finite, values, 0.0))
    integer = (mantissa * 2.0**53).astype(np.int64)
    shift = np.where(integer == 0, 0, exponent + 1074).astype(np.int64)
    return integer.astype(object) << shift.astype(object)


class Reference:
    """The sums as the accumulator kept them before limbs: per element a Python int of the values and of their squares."""

    def __init__(self, values: np.ndarray) -> None:
        units = reference_units(values)
        self.count = len(values)
        self.total = units.sum(axis=0)
        self.squares = (units * units).sum(axis=0)
        self.not_finite = (~np.isfinite(values)).sum(axis=0)

    def mean(self) -> np.ndarray:
        scale = self.count << EXACT_SCALE_BITS
        mean = np.array([t / scale for t in np.asarray(self.total).flat], dtype=np.float64).reshape(self.not_finite.shape)
        return np.where(self.not_finite > 0, np.nan, mean)

    def std(self) -> np.ndarray:
        n = self.count
        std = np.array([sqrt_of_ratio(n * q - t * t, (n * n) << (2 * EXACT_SCALE_BITS))
                        for t, q in zip(np.asarray(self.total).flat, np.asarray(self.squares).flat, strict=True)])
        return np.where(self.not_finite > 0, np.nan, std.reshape(self.not_finite.shape))


def sqrt_of_ratio(numerator: int, denominator: int) -> float:
    excess = max(0, numerator.bit_length() - denominator.bit_length() - 1000) // 2
    return math.sqrt(numerator / (denominator << (2 * excess))) * 2.0**excess


def extreme_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float64 values of every kind a float64 has, mixed at random: ordinary, subnormal, near the smallest and the
    largest normal, zeros of both signs, float32 values, powers of two, NaN and infinities."""
    sign = rng.choice([-1.0, 1.0], size=shape)
    kinds = [
        rng.normal(100, 30, size=shape),
        sign * rng.integers(1, 2**52, size=shape) * 5e-324,  # subnormal: k * 2**-1074
        sign * rng.uniform(1, 10, size=shape) * 1e-300,
        sign * rng.uniform(1, 1.79, size=shape) * 1e308,
        sign * 0.0,
        rng.normal(0, 3, size=shape).astype(np.float32).astype(np.float64),
        sign * 2.0 ** rng.integers(-1074, 1024, size=shape).astype(np.float64),
        rng.choice([np.nan, np.inf, -np.inf], size=shape),
        sign * rng.choice([np.finfo(np.float64).max, np.finfo(np.float64).tiny, 5e-324, 1.0, 2.0**53 - 1], size=shape),
        sign * rng.normal(size=shape) * 1e-9,
    ]
    weights = np.array([4, 2, 2, 2, 2, 3, 2, 1, 1, 2], dtype=np.float64)
    choice = rng.choice(len(kinds), size=shape, p=weights / weights.sum())
    return np.choose(choice, kinds)


def assert_same_as_reference(moments: ExactMoments, values: np.ndarray) -> None:
    reference = Reference(values)
    assert moments.count == reference.count
    np.testing.assert_array_equal(moments.not_finite, reference.not_finite)
    assert list(moments.total.flat) == list(np.asarray(reference.total).flat)
    assert list(moments.squares.flat) == list(np.asarray(reference.squares).flat)
    assert moments.mean.tobytes() == reference.mean().tobytes()
    assert moments.std().tobytes() == reference.std().tobytes()


def one_pass(values: np.ndarray) -> ExactMoments:
    moments = ExactMoments()
    moments.add(values)
    return moments


def limb_bytes(moments: ExactMoments) -> int:
    return sum(block.limbs.nbytes for sums in (moments._sums, moments._square_sums) for block in sums.blocks)


@pytest.fixture(params=[1 << 16, 3], ids=["one block", "blocks of 3"])
def block(request, monkeypatch):
    """The array in one block, or in blocks of 3 elements, each with a window of its own."""
    monkeypatch.setattr(totals, "_BLOCK", request.param)
    return request.param


# ---------------------------------------------------------------------------------- the same integers


@pytest.mark.parametrize("seed", range(4))
def test_the_sums_are_the_python_int_sums_for_values_of_every_magnitude(seed, block):
    values = extreme_values(np.random.default_rng(seed), (37, 4, 5))
    values[:, 0, 0] = np.random.default_rng(seed).normal(size=37)  # some elements all finite, with a spread
    values[:, 0, 1] = np.random.default_rng(seed).integers(1, 2**52, size=37) * 5e-324
    assert_same_as_reference(one_pass(values), values)
    moments = ExactMoments()
    for row in values:
        moments.add(row[None])  # one image at a time: kept unsummed, then summed
    assert_same_as_reference(moments, values)


def test_an_element_that_sums_to_zero_or_to_a_negative_number_is_exact(block):
    values = np.array([[1e300, -1e-300, 0.0, -0.0, 2.0**-1074], [-1e300, 1e-300, -0.0, 0.0, -(2.0**-1074)],
                       [-5.0, -3e-200, -0.0, 0.0, -(2.0**-1074)]])
    moments = one_pass(values)
    assert_same_as_reference(moments, values)
    assert moments.total[0] < 0 and moments.total[2] == moments.total[3] == 0


@pytest.mark.parametrize("seed", range(3))
def test_any_order_and_split_merges_into_the_one_pass_sums(seed, block, monkeypatch):
    monkeypatch.setattr(totals, "_UNSUMMED_ROWS", seed)  # 0: every add summed at once
    rng = np.random.default_rng(10 + seed)
    values = extreme_values(rng, (29, 3, 4))
    whole = one_pass(values)
    expected = {key: (value.dtype.str, value.shape, value.tobytes()) for key, value in whole.arrays("m").items()}
    for _ in range(6):
        order = rng.permutation(len(values))
        cuts = np.sort(rng.choice(np.arange(1, len(values)), size=rng.integers(1, 8), replace=False))
        parts = [one_pass(values[chunk]) for chunk in np.split(order, cuts)]
        merged = ExactMoments()
        for index in rng.permutation(len(parts)):
            merged.merge(parts[index])
            merged.merge(ExactMoments())  # an empty part changes nothing
        assert {key: (value.dtype.str, value.shape, value.tobytes()) for key, value in merged.arrays("m").items()} == expected
        assert merged.mean.tobytes() == whole.mean.tobytes() and merged.std().tobytes() == whole.std().tobytes()
    assert_same_as_reference(whole, values)


def test_a_merged_part_is_left_as_it_was():
    values = np.random.default_rng(3).normal(size=(12, 5))
    part, whole = one_pass(values[:4]), one_pass(values[4:])
    before = part.arrays("p")
    whole.merge(part)
    whole.merge(part)  # the same part twice: its images counted twice
    assert {k: v.tobytes() for k, v in part.arrays("p").items()} == {k: v.tobytes() for k, v in before.items()}
    assert_same_as_reference(whole, np.concatenate([values[4:], values[:4], values[:4]]))


def test_batches_are_added_a_chunk_of_values_at_a_time(monkeypatch, block):
    monkeypatch.setattr(totals, "_CHUNK", 7)  # fewer values than one row: a column at a time
    values = extreme_values(np.random.default_rng(5), (9, 4, 6))
    assert_same_as_reference(one_pass(values), values)


# ---------------------------------------------------------------------------------- carries


def test_carries_are_propagated_before_a_limb_could_overflow(monkeypatch):
    """Limbs gather pieces below 2**33 each; with room for only a few, the carries run every few additions, and
    negative sums borrow. The values are the widest mantissas (53 bits set) at both signs and many exponents."""
    monkeypatch.setattr(totals, "_LIMB_HEADROOM", 1 << 36)
    rng = np.random.default_rng(7)
    widest = (2.0**53 - 1) * 2.0 ** rng.integers(-1022, 971, size=(600, 6)).astype(np.float64)  # normal: all 53 bits
    values = np.where(rng.random((600, 6)) < 0.7, widest, -widest)
    values[:, 0] = np.finfo(np.float64).max  # a sum that needs limbs above the window of one value
    values[:, 1] = -np.finfo(np.float64).max
    values[:, 2] = np.abs(values[:, 2])
    moments = ExactMoments()
    for chunk in np.array_split(values, 150):
        moments.add(chunk)
    for sums in (moments._sums, moments._square_sums):
        assert all(block.bound <= 1 << 36 for block in sums.blocks)
    assert_same_as_reference(moments, values)


def test_normalised_limbs_hold_32_bits_and_the_top_one_its_sign():
    values = np.random.default_rng(8).normal(size=(50, 7)) * 1e5
    sums = one_pass(values)._summed()[0]
    (block,) = sums.blocks
    block.normalise()
    assert ((block.limbs[:-1] >= 0) & (block.limbs[:-1] < 2**32)).all()
    assert ((block.limbs[-1] >= -(2**31)) & (block.limbs[-1] < 2**31)).all()


def test_the_memory_of_the_sums_does_not_grow_with_the_images():
    """Values of one range: after the first images, more images add no limbs (the carries fit in the window)."""
    rng = np.random.default_rng(9)
    values = rng.normal(0, 3, size=(400, 50, 20)).astype(np.float32)
    moments = ExactMoments()
    moments.add(values[:40])
    first = limb_bytes(moments)
    for chunk in np.split(values[40:], 9):
        moments.add(chunk)
    assert limb_bytes(moments) <= first + 2 * 8 * 1000  # at most a limb more per sum, not one per image
    assert limb_bytes(moments) <= 2 * 8 * 8 * 1000  # float32 values of one range: a few int64 per element
    assert all(block.limbs.dtype == np.int64 for block in moments._sums.blocks)


def test_a_few_images_are_kept_unsummed_and_summed_when_more_come(monkeypatch):
    monkeypatch.setattr(totals, "_UNSUMMED_ROWS", 3)
    values = np.random.default_rng(11).normal(size=(5, 4))
    moments, run = ExactMoments(), ExactMoments()
    for row in values[:3]:
        one = ExactMoments()
        one.add(row[None])
        assert one._sums is None  # a copy of its values, no limbs
        moments.merge(one)
    assert moments._sums is None and sum(map(len, moments._unsummed)) == 3
    moments.add(values[3:])
    assert moments._sums is not None and moments._unsummed == []
    run.merge(moments)
    assert_same_as_reference(run, values)
    source = values[:2].copy()
    written = ExactMoments()
    written.add(source)
    source[:] = 0  # the caller's array written to afterwards: the moments kept their own copy
    assert_same_as_reference(written, values[:2])


@pytest.mark.parametrize("seed", range(3))
def test_unsummed_values_a_float32_holds_take_its_bytes(seed):
    rng = np.random.default_rng(20 + seed)
    narrow = rng.normal(0, 3, size=(2, 6)).astype(np.float32)
    narrow[0, :3] = [np.nan, -0.0, np.float32(1e-45)]  # NaN, negative zero, float32's smallest subnormal
    wide = extreme_values(rng, (1, 6))
    wide[0, 0] = 2.0**-1074  # no float32 holds it
    moments = ExactMoments()
    moments.add(narrow.astype(np.float64))  # a lens's float32 array, widened by its caller
    moments.add(wide)
    assert [values.dtype for values in moments._unsummed] == [np.float32, np.float64]
    assert_same_as_reference(moments, np.concatenate([narrow.astype(np.float64), wide]))


# ---------------------------------------------------------------------------------- as arrays


def _through_npz(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


@pytest.mark.parametrize("shape", [(), (3,), (2, 0), (4, 3)])
def test_the_arrays_are_words_that_come_back_the_same(shape, block):
    values = extreme_values(np.random.default_rng(12), (17, *shape))
    moments = one_pass(values)
    arrays = _through_npz(moments.arrays("x"))
    for name in ("total", "squares"):
        assert arrays[f"x_{name}"].dtype == np.uint32 and arrays[f"x_{name}"].shape[:-1] == shape
    assert moments_problem(arrays, "x", shape) is None and moments_shape(arrays, "x") == shape
    back = ExactMoments.from_arrays(arrays, "x")
    assert_same_as_reference(back, values)
    more = extreme_values(np.random.default_rng(13), (5, *shape))
    back.add(more)
    assert_same_as_reference(back, np.concatenate([values, more]))


def test_all_zero_sums_are_words_of_no_limbs():
    moments = one_pass(np.zeros((3, 2, 2)))
    arrays = moments.arrays("z")
    assert arrays["z_total"].shape == (2, 2, 0) and moments.mean.tobytes() == np.zeros((2, 2)).tobytes()
    assert ExactMoments.from_arrays(arrays, "z").std().tobytes() == np.zeros((2, 2)).tobytes()


def test_the_words_depend_on_the_sums_alone(monkeypatch):
    """Summed in one block or in blocks of 2, in one pass or image by image, the words are the fewest that hold
    every element: the same integers, the same arrays."""
    values = extreme_values(np.random.default_rng(14), (11, 7))
    seen = []
    for size in (1 << 16, 2):
        monkeypatch.setattr(totals, "_BLOCK", size)
        for moments in (one_pass(values), _image_by_image(values)):
            seen.append({key: value.tobytes() for key, value in moments.arrays("w").items()})
    assert all(arrays == seen[0] for arrays in seen)


def _image_by_image(values: np.ndarray) -> ExactMoments:
    moments = ExactMoments()
    for row in values:
        one = ExactMoments()
        one.add(row[None])
        moments.merge(one)
    return moments


def test_hexadecimal_sums_of_an_older_part_are_read():
    values = extreme_values(np.random.default_rng(15), (9, 2, 3))
    reference = Reference(values)
    old = {"o_count": np.asarray(9, dtype=np.int64), "o_not_finite": reference.not_finite.astype(np.int64),
           "o_total": np.array([hex(int(i)) for i in reference.total.flat], dtype=str).reshape(2, 3),
           "o_squares": np.array([hex(int(i)) for i in reference.squares.flat], dtype=str).reshape(2, 3)}
    old = _through_npz(old)
    assert moments_problem(old, "o", (2, 3)) is None and moments_shape(old, "o") == (2, 3)
    moments = ExactMoments.from_arrays(old, "o")
    assert_same_as_reference(moments, values)
    moments.merge(one_pass(values))  # an older part merged with a newer one
    assert_same_as_reference(moments, np.concatenate([values, values]))


def _words_part(values: np.ndarray) -> dict[str, np.ndarray]:
    return _through_npz(one_pass(values).arrays("p"))


BROKEN = {
    "another shape": (lambda a: a.update(p_total=a["p_total"][:, :1]), "p_total is not exact sums of shape (2, 3)"),
    "int64 words": (lambda a: a.update(p_squares=a["p_squares"].astype(np.int64)), "p_squares is not exact sums"),
    "no shift": (lambda a: a.pop("p_total_shift"), "p_total_shift is not a bit position"),
    "a shift between limbs": (lambda a: a.update(p_total_shift=a["p_total_shift"] + 3), "p_total_shift is not a bit"),
    "a shift past any sum": (lambda a: a.update(p_squares_shift=np.asarray(10**6)), "p_squares_shift is not a bit"),
    "negative squares": (lambda a: a["p_squares"].__setitem__((0, 0, -1), 2**31 + 5), "negative sum of squares"),
    "hex garbage": (lambda a: a.update(p_total=np.full((2, 3), "zz")), "p_total is not hexadecimal text"),
    "hex of another shape": (lambda a: a.update(p_total=np.full((3, 2), "0x1")), "p_total is not exact sums of shape"),
    "negative hex squares": (lambda a: a.update(p_squares=np.full((2, 3), "-0x1")), "negative sum of squares"),
    "more not finite than images": (lambda a: a.update(p_not_finite=a["p_not_finite"] + 99), "p_not_finite"),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_broken_part_is_refused_naming_its_array(what):
    arrays = _words_part(np.random.default_rng(16).normal(size=(4, 2, 3)))
    change, said = BROKEN[what]
    change(arrays)
    assert said in moments_problem(arrays, "p", (2, 3))


def test_from_integers_reads_any_sign_and_size():
    integers = [0, 1, -1, 2**31, -(2**31), 2**32 - 1, -(2**32), 3 << 2000, -(5 << 1500) + 7]
    sums = ExactSums.from_integers(integers)
    assert [value << shift for value, shift in sums.integers()] == integers
