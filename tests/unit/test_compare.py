"""`vit-lens compare` (vit_core.compare): the measures against plain loop computations, the engine's values against
two captures, a model against itself, and DIR/a and DIR/b bit for bit against `dataset` alone (one process, --shards 2,
and shards run one by one into one folder)."""

from __future__ import annotations

import csv
import json
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import drawn_image
from vit_core import __main__ as core_cli
from vit_core import analyses, load_model, run_with_capture
from vit_core.compare import (
    CompareTotals,
    FixedSums,
    Pair,
    attention_js,
    comparable,
    linear_cka,
    pearson,
    prediction_kl,
    reduce_pairs,
)
from vit_core.dataset import consecutive_batches, plan_run
from vit_core.images import load_image
from vit_core.teaching.model import BUNDLED_DIR

SHAPES = ("--model", "vit-lens/shapes-vit")
SHAPES_RANDOM = ("--model-b", "vit_shapes_patch8_96", "--random-init-b")
NAMES = BUNDLED_DIR / "labels.txt"  # the Shapes ViT's class names: B, its random init, takes them


# ----------------------------------------------------------------------------------------------
# The measures, against their definitions written as loops


def _plain_js(p: list[float], q: list[float]) -> float:
    m = [(x + y) / 2 for x, y in zip(p, q, strict=True)]
    kl = lambda u, v: sum(x * math.log(x / y) for x, y in zip(u, v, strict=True) if x > 0)  # noqa: E731
    return (kl(p, m) + kl(q, m)) / 2


def test_attention_js_is_the_mean_of_the_two_kls_to_the_midpoint_row_by_row():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=(3, 5)), rng.dirichlet(np.ones(7), size=(3, 5))  # (3, 5, 7) rows
    p[0, 0] = [1, 0, 0, 0, 0, 0, 0]  # a row all on one key: 0 log 0 counts 0
    got = attention_js(p, q)
    assert got.shape == (3, 5)
    for index in np.ndindex(3, 5):
        assert got[index] == pytest.approx(_plain_js(list(p[index]), list(q[index])), abs=1e-13)
    assert np.all(attention_js(p, p) == 0)
    assert attention_js(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(math.log(2))


def test_torch_attention_js_averages_the_rows_of_each_head():
    from vit_core.compare.measures import torch_attention_js

    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(6), size=(2, 3, 6)), rng.dirichlet(np.ones(6), size=(2, 3, 6))  # (F, H, T, T)
    got = torch_attention_js(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(got, attention_js(p, q).mean(axis=-1), rtol=1e-12, atol=1e-15)
    assert np.all(torch_attention_js(torch.from_numpy(p), torch.from_numpy(p)).numpy() == 0)


def test_prediction_kl_against_the_sum_over_classes():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(4, 9)) * 3, rng.normal(size=(4, 9)) * 3
    for row in range(4):
        pa = np.exp(a[row]) / np.exp(a[row]).sum()
        pb = np.exp(b[row]) / np.exp(b[row]).sum()
        assert prediction_kl(a, b)[row] == pytest.approx(sum(x * math.log(x / y) for x, y in zip(pa, pb, strict=True)), rel=1e-12)
    assert np.all(prediction_kl(a, a) == 0)


def _plain_cka(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    return np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y))


def test_linear_cka_from_sums_equals_cka_of_the_centred_tokens_and_knows_its_invariances():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(50, 6)) + 4, rng.normal(size=(50, 4))
    y[:, 0] += x[:, 0]
    from_sums = linear_cka(x.T @ y, x.T @ x, y.T @ y, sum_a=x.sum(0), sum_b=y.sum(0), n=len(x))
    assert from_sums == pytest.approx(_plain_cka(x, y), rel=1e-10)
    rotation, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    for other in (x, 3 * x @ rotation + 7):  # CKA of X with itself, and with a rotated, scaled, shifted copy: 1
        assert linear_cka(x.T @ other, x.T @ x, other.T @ other, sum_a=x.sum(0), sum_b=other.sum(0),
                          n=len(x)) == pytest.approx(1, abs=1e-12)
    assert math.isnan(linear_cka(x.T @ np.ones((50, 2)), x.T @ x, np.ones((2, 2)) * 50, sum_a=x.sum(0),
                                 sum_b=np.full(2, 50.0), n=50))


def test_pearson_against_numpy():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    assert pearson(a, b) == pytest.approx(np.corrcoef(a.ravel(), b.ravel())[0, 1], rel=1e-12)
    assert math.isnan(pearson(np.ones(4), a.ravel()[:4]))


def test_fixed_sums_give_the_same_bits_in_any_order_or_split():
    rng = np.random.default_rng(5)
    values = rng.normal(size=(6, 3, 4)) * 10.0 ** rng.integers(-8, 8, size=(6, 3, 4))  # (images, ...), wide range
    whole = FixedSums(1)
    whole.add(torch.from_numpy(values), 6)
    parts = [FixedSums(1), FixedSums(1)]
    parts[0].add(torch.from_numpy(values[[5, 1, 3]]), 3)
    for i in (4, 0, 2):
        parts[1].add(torch.from_numpy(values[i:i + 1]), 1)
    merged = FixedSums(1)
    merged.merge(parts[1])
    merged.merge(parts[0])
    assert whole.value().tobytes() == merged.value().tobytes()
    np.testing.assert_allclose(whole.value(), values.sum(axis=0), rtol=1e-12, atol=6 * 2.0 ** -40)
    row = FixedSums(1)  # added a row of a whole at a time
    for i in range(3):
        row.add(torch.from_numpy(values[:, i]), 6, shape=(3, 4), at=i)
    assert row.value().tobytes() == whole.value().tobytes()
    bad = values.copy()
    bad[2, 1, 0] = np.nan
    nan_sums = FixedSums(1)
    nan_sums.add(torch.from_numpy(bad), 6)
    assert np.isnan(nan_sums.value()[1]).all() and np.isfinite(nan_sums.value()[[0, 2]]).all()
    back = FixedSums.from_arrays(whole.arrays("s"), "s", 1)
    assert back.value().tobytes() == whole.value().tobytes()


def _exact_units(values: np.ndarray) -> list[int]:
    """Per element, the sum over images of each value times 2**40 rounded half to even, as Python ints."""
    from fractions import Fraction

    return [sum(round(Fraction(float(v)) * 2**40) for v in column) for column in values.reshape(len(values), -1).T]


@pytest.mark.parametrize("scale", [1.0, 2.0**20, 2.0**40], ids=["small: summed in int64", "near the bound", "large"])
def test_fixed_sums_are_each_images_value_rounded_half_to_even_and_summed_exactly(scale):
    """Whichever way fixed_limbs takes (int64 sums while every image's integers fit, else limbs per image), the
    sums are the exact integers: halves to even, negatives floored into the limbs, and one sum per element."""
    rng = np.random.default_rng(6)
    values = rng.normal(size=(5, 4, 3)) * scale
    values[0, 0] = [2.5 * 2.0**-40, -2.5 * 2.0**-40, 3.5 * 2.0**-40]  # halves: to 2, -2, 4
    values[1, 0] = [-0.0, 2.0**-60, -(2.0**-41)]  # rounded to 0
    sums = FixedSums(1)
    sums.add(torch.from_numpy(values), 4)  # the first 4 images; the 5th is padding
    arrays = sums.arrays("s")
    got = [int(h) * 2**32 + int(low) for h, low in zip(arrays["s_high"].ravel(), arrays["s_low"].ravel(), strict=True)]
    assert got == _exact_units(values[:4])
    assert ((arrays["s_low"] >= 0) & (arrays["s_low"] < 2**32)).all()
    one_by_one = FixedSums(1)
    for image in values[:4]:
        one_by_one.add(torch.from_numpy(image[None]), 1)
    assert {k: v.tobytes() for k, v in one_by_one.arrays("s").items()} == {k: v.tobytes() for k, v in arrays.items()}


def test_a_large_sums_pieces_shared_among_threads_give_the_limbs_of_one_thread(monkeypatch):
    """A sum of many pieces (two ViT-B/16s' cross products: 117 of them per row of A) is made by torch's threads, each
    its own pieces: the same limbs as one thread, with the halves, values rounded to 0, a value too large for the
    int64 sums (its piece counted the long way) and a NaN whose row alone is left out."""
    from vit_core.compare import sums as sums_module

    rng = np.random.default_rng(9)
    width = 3 * sums_module.CHUNK_VALUES + 5  # four pieces per leading index, the last one short
    values = rng.normal(size=(3, 2, width)) * 10.0 ** rng.integers(-12, 6, size=(3, 2, width))
    values[0, 0, :3] = [2.5 * 2.0**-40, -3.5 * 2.0**-40, 2.0**-60]  # halves to even, and one rounded to 0
    values[2, 0, -2] = 2.0**30  # beyond the int64 sums' bound for 3 images: that piece goes through fixed_limbs
    values[1, 1, -1] = np.nan

    def limbs(threads: int) -> tuple[dict[str, bytes], list[int]]:
        monkeypatch.setattr(sums_module, "limb_threads", lambda: threads)
        sums = FixedSums(1)
        sums.add(torch.from_numpy(values), 3)
        return {k: v.tobytes() for k, v in sums.arrays("s").items()}, sums.not_finite.tolist()

    one = limbs(1)
    assert one[1] == [0, 1]
    assert limbs(3) == one
    sums = FixedSums(1)
    sums.add(torch.from_numpy(values), 3)
    np.testing.assert_allclose(sums.value()[0], values[:, 0].sum(axis=0), rtol=1e-12, atol=3 * 2.0**-40)


def test_small_values_with_a_nan_or_an_infinity_leave_only_their_own_row_out():
    """Values small enough for int64 sums still go the counted way when one is NaN or infinite: that leading index
    is NaN, the others exact."""
    values = np.random.default_rng(8).normal(size=(4, 3, 5))
    for odd in (np.nan, np.inf):
        bad = values.copy()
        bad[1, 2, 4] = odd
        sums = FixedSums(1)
        sums.add(torch.from_numpy(bad), 4)
        assert np.isnan(sums.value()[2]).all() and sums.not_finite.tolist() == [0, 0, 1]
        clean = FixedSums(1)
        clean.add(torch.from_numpy(values), 4)
        assert sums.value()[:2].tobytes() == clean.value()[:2].tobytes()


def test_merged_totals_are_copies_unless_taken_and_taken_ones_from_an_npz_stay_writable():
    """merge copies (the merged totals are left as they were); `take` lets an empty total keep a throwaway's arrays,
    a batch's or a part's read from its file, and add later sums into them."""
    import io

    values = np.random.default_rng(7).normal(size=(3, 2, 4))
    part = FixedSums(1)
    part.add(torch.from_numpy(values), 3)
    before = {k: v.copy() for k, v in part.arrays("p").items()}
    kept, taken = FixedSums(1), FixedSums(1)
    kept.merge(part)
    kept.merge(part)
    assert {k: v.tobytes() for k, v in part.arrays("p").items()} == {k: v.tobytes() for k, v in before.items()}
    taken.merge(part, take=True)
    assert np.shares_memory(taken.high, part.high)
    buffer = io.BytesIO()
    np.savez(buffer, **part.arrays("p"))
    with np.load(io.BytesIO(buffer.getvalue())) as npz:
        read = FixedSums.from_arrays({k: npz[k] for k in npz.files}, "p", 1)
    from_npz = FixedSums(1)
    from_npz.merge(read, take=True)
    from_npz.add(torch.from_numpy(values), 3)  # adds into the taken arrays
    assert from_npz.value().tobytes() == kept.value().tobytes()


def _limbs(sums: FixedSums) -> dict[str, bytes]:
    return {k: v.tobytes() for k, v in sums.arrays("s").items()}


@pytest.fixture
def small_chunks(monkeypatch):
    """FixedSums' work in chunks of 20 values: boundaries inside the (3, 4) blocks that share a not-finite count."""
    from vit_core.compare import sums

    monkeypatch.setattr(sums, "CHUNK_VALUES", 20)
    assert sums.flat_chunks(50) == [slice(0, 20), slice(20, 40), slice(40, 50)]
    assert sums.row_chunks((5, 3, 4), 1) == [slice(k, k + 1) for k in range(5)] and sums.row_chunks((5, 3, 4), 0) == [...]
    assert sums.row_chunks((5, 2, 4), 1) == [slice(0, 2), slice(2, 4), slice(4, 5)]


def _signed_values(seed: int) -> np.ndarray:
    """(images, 2, 5, 3, 4): negatives and positives over a wide range, a half-unit tie, one NaN, one huge value."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(4, 2, 5, 3, 4)) * 10.0 ** rng.integers(-12, 6, size=(4, 2, 5, 3, 4))
    values[0, 0, 0, 0] = [2.5 * 2.0**-40, -2.5 * 2.0**-40, -3.5 * 2.0**-40, -(2.0**-41)]
    values[1, 1, 3, 2, 1] = np.nan  # pair (1, 3) is left out; its block straddles a chunk boundary
    values[2, 0, 4, 0, 0] = -(2.0**40) - 0.75  # too large for int64 sums of units: the limbs' way, its chunk only
    return values


def test_fixed_sums_added_and_merged_a_chunk_at_a_time_are_the_plain_exact_sums(small_chunks):
    """Rows of a large whole (`at`) and whole arrays, added and merged in chunks of rows: per value the exact integer
    sum of the images' rounded units (negatives too), a NaN leaving out its own pair only, the same limbs as one
    pass over unchunked arrays."""
    from vit_core.compare import sums as sums_module

    values = _signed_values(9)
    by_rows, whole = FixedSums(2), FixedSums(2)
    for i in range(2):  # (images, 5, 3, 4) a row at a time into (2, 5, 3, 4)
        by_rows.add(torch.from_numpy(values[:, i]), 4, shape=(2, 5, 3, 4), at=i)
    whole.add(torch.from_numpy(values), 4)
    assert _limbs(by_rows) == _limbs(whole)
    got = by_rows.arrays("s")
    units = [int(h) * 2**32 + int(low) for h, low in zip(got["s_high"].ravel(), got["s_low"].ravel(), strict=True)]
    finite = np.where(np.isnan(values), 0.0, values)
    assert units == _exact_units(finite)  # the NaN's pair: the other images' units, counted as left out
    assert got["s_not_finite"].tolist() == [[0] * 5, [0, 0, 0, 1, 0]]
    value = by_rows.value()
    assert np.isnan(value[1, 3]).all() and not np.isnan(np.delete(value.reshape(10, 12), 8, axis=0)).any()
    split = FixedSums(2)  # images one by one, merged into a total a chunk at a time
    for image in values:
        one = FixedSums(2)
        one.add(torch.from_numpy(image[None]), 1)
        split.merge(one)
    assert _limbs(split) == _limbs(whole)
    unchunked = FixedSums(2)
    small_chunks_size, sums_module.CHUNK_VALUES = sums_module.CHUNK_VALUES, 2**40
    try:
        unchunked.add(torch.from_numpy(values), 4)
    finally:
        sums_module.CHUNK_VALUES = small_chunks_size
    assert _limbs(unchunked) == _limbs(whole)


def test_add_limbs_keeps_low_in_32_bits_and_the_sum_exact_for_negative_parts():
    from vit_core.compare.sums import add_limbs

    rng = np.random.default_rng(12)
    high, low = rng.integers(-(2**40), 2**40, size=50), rng.integers(0, 2**32, size=50).astype(np.uint32)
    expected = [int(h) * 2**32 + int(lo) for h, lo in zip(high, low, strict=True)]
    for _ in range(3):
        part_high, part_low = rng.integers(-(2**40), 2**40, size=50), rng.integers(-(2**40), 2**40, size=50)
        add_limbs(high, low, part_high, part_low)
        expected = [e + int(h) * 2**32 + int(lo) for e, h, lo in zip(expected, part_high, part_low, strict=True)]
    assert low.dtype == np.uint32 and [int(h) * 2**32 + int(lo) for h, lo in zip(high, low, strict=True)] == expected


def test_fixed_sums_read_one_index_at_a_time_are_the_whole_values(small_chunks):
    values = _signed_values(10)
    sums = FixedSums(2)
    sums.add(torch.from_numpy(values), 4)
    whole = sums.value()
    for index in np.ndindex(2, 5):
        assert sums.value(index).tobytes() == whole[index].tobytes()
    assert sums.value((1,)).tobytes() == whole[1].tobytes()
    column = FixedSums(1)  # values (images, 3): a (3,) sum with no leading dims, never cut
    column.add(torch.from_numpy(values[:, 0, 0, 0, :3]), 4)
    assert column.value().shape == (3,) and column.not_finite.shape == ()


def test_fixed_sums_merged_from_a_file_a_chunk_at_a_time_are_the_in_memory_merge(small_chunks, tmp_path):
    """A part's file streamed into place is the bytes of its arrays; merged back from it a chunk at a time (into
    nothing, and into other sums) it is the in-memory merge, and a file of another shape is refused."""
    from vit_core.export import npz_bytes, write_npz
    from vit_core.images.files import OutputFolder

    values = _signed_values(11)
    first, second = FixedSums(2), FixedSums(2)
    first.add(torch.from_numpy(values[:2]), 2)
    second.add(torch.from_numpy(values[2:]), 2)
    with OutputFolder(tmp_path) as out:
        path = out.write_with("part.npz", lambda file: write_npz(file, second.arrays("s")))
    assert path.read_bytes() == npz_bytes(second.arrays("s"))
    expected = FixedSums(2)
    expected.merge(first)
    expected.merge(second)
    read, into = FixedSums(2), FixedSums(2)
    into.merge(first)
    with np.load(path) as npz:
        read.merge_npz(npz, "s")
        into.merge_npz(npz, "s")
        FixedSums(2).merge_npz(npz, "other")  # a prefix the file lacks adds nothing
    assert _limbs(read) == _limbs(second) and _limbs(into) == _limbs(expected)
    wrong = FixedSums(2)
    wrong.add(torch.from_numpy(values[:, 0, :4]), 4)  # (4, 3, 4): another shape
    with np.load(path) as npz, pytest.raises(ValueError):
        wrong.merge_npz(npz, "s")


# ----------------------------------------------------------------------------------------------
# The engine's values against two captures


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for seed, name in enumerate(("circle/a.png", "circle/b.png", "square/c.png", "square/d.jpg", "e.png")):
        (root / name).parent.mkdir(exist_ok=True)
        drawn_image(seed, size=(120, 150)).save(root / name, quality=95)
    (root / "square" / "notes.png").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def two_tiny():
    a = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, device="cpu")
    b = load_model("vit_tiny_patch16_224", pretrained=False, seed=1, depth=2, device="cpu")
    return a, b


def _compare_totals(a, b, folder: Path) -> CompareTotals:
    plans = [plan_run(m, folder) for m in (a, b)]
    totals = CompareTotals()
    for _, _, _, batch in reduce_pairs(Pair(a, b, *plans), consecutive_batches(0, len(plans[0].paths), 2)):
        totals.merge(batch)
    return totals


def test_cka_js_kl_and_rollout_correlation_equal_a_plain_computation_from_two_captures(two_tiny, folder):
    a, b = two_tiny
    totals = _compare_totals(a, b, folder)
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.suffix in (".png", ".jpg")
                   and p.name != "notes.png")
    assert totals.file == names
    caps = [[run_with_capture(m, load_image(folder / name)) for name in names] for m in (a, b)]
    g = a.geometry
    p = g.num_prefix_tokens
    x = np.concatenate([c.tokens[:, p:] for c in caps[0]], axis=1).astype(np.float64)  # (L+1, images x N, D)
    y = np.concatenate([c.tokens[:, p:] for c in caps[1]], axis=1).astype(np.float64)
    expected_cka = np.array([[_plain_cka(x[i], y[j]) for j in range(len(y))] for i in range(len(x))])
    np.testing.assert_allclose(totals.cka(), expected_cka, rtol=1e-7)
    js = np.mean([attention_js(ca.pattern, cb.pattern).mean(axis=-1) for ca, cb in zip(*caps, strict=True)], axis=0)  # (L, H)
    np.testing.assert_allclose(totals.js.mean, js, rtol=1e-5, atol=1e-9)
    kl = [float(prediction_kl(ca.logits, cb.logits)) for ca, cb in zip(*caps, strict=True)]
    np.testing.assert_allclose(totals.kl, kl, rtol=1e-4, atol=1e-9)
    rollout = [pearson(analyses.attention_rollout(ca.pattern, p, g.grid, has_class_token=True),
                       analyses.attention_rollout(cb.pattern, p, g.grid, has_class_token=True))
               for ca, cb in zip(*caps, strict=True)]
    np.testing.assert_allclose(totals.rollout_correlation, rollout, rtol=1e-4, atol=1e-6)
    assert totals.kl_mean() == pytest.approx(np.mean(kl), rel=1e-4)


def test_a_model_against_itself_has_cka_one_on_the_diagonal_js_zero_and_kl_zero(two_tiny, folder):
    a, _ = two_tiny
    totals = _compare_totals(a, a, folder)
    cka = totals.cka()
    np.testing.assert_allclose(np.diag(cka), 1, atol=1e-12)
    assert np.all(totals.js.mean == 0) and np.all(np.asarray(totals.kl) == 0)
    np.testing.assert_allclose(totals.rollout_correlation, 1, atol=1e-12)


def _all_arrays(a, b, folder: Path) -> dict[str, np.ndarray]:
    """Every array of a comparison's totals and of each model's, keyed by where it came from."""
    plans = [plan_run(m, folder) for m in (a, b)]
    out = {}
    for k, (_, ta, tb, tc) in enumerate(reduce_pairs(Pair(a, b, *plans), consecutive_batches(0, len(plans[0].paths), 2))):
        for name, totals in (("a", ta.arrays()), ("b", tb.arrays()), ("compare", tc.arrays())):
            out |= {f"{k}/{name}/{key}": value for key, value in totals.items()}
    return out


def test_compare_beside_another_sessions_captures_on_the_same_models_leaves_both_their_own_bits(two_tiny, folder):
    """A class server: another session's forwards on A and B while compare runs on them. Compare records on replicas
    of its own, so neither sees the other's hooks: both finish, and each has the bits it has when alone."""
    a, b = two_tiny
    image = drawn_image(7)
    expected = _all_arrays(a, b, folder)
    caps_alone = [run_with_capture(m, image) for m in (a, b)]
    fused = [[blk.attn.fused_attn for blk in m.model.blocks] for m in (a, b)]
    stop, errors, caps = threading.Event(), [], []

    def other_session() -> None:
        try:
            while not stop.is_set() or len(caps) < 4:
                caps.append(run_with_capture((a, b)[len(caps) % 2], image))
        except Exception as e:  # noqa: BLE001 - the failure is asserted below
            errors.append(e)

    thread = threading.Thread(target=other_session)
    thread.start()
    try:
        got = _all_arrays(a, b, folder)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and errors == []
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    for k, cap in enumerate(caps):
        np.testing.assert_array_equal(cap.logits, caps_alone[k % 2].logits)
        np.testing.assert_array_equal(cap.pattern, caps_alone[k % 2].pattern)
    assert [[blk.attn.fused_attn for blk in m.model.blocks] for m in (a, b)] == fused  # no flag of compare's left
    assert all(not m.model._forward_hooks for m in (a, b))


def test_geometries_that_differ_skip_what_cannot_be_compared_with_a_sentence_each(two_tiny):
    a, _ = two_tiny
    shapes = load_model("vit-lens/shapes-vit", device="cpu")
    which = comparable(a.geometry, shapes.geometry)
    assert not which.classes and not which.grid and not which.attention
    skipped = dict(which.skipped)
    assert set(skipped) >= {"kl", "changed", "agreement", "rollout_correlation", "attention_js",
                            "mean_attention_distance_diff", "cka over patch tokens"}
    assert all(reason.endswith(".") and "\n" not in reason for reason in skipped.values())
    assert comparable(a.geometry, a.geometry).skipped == ()


# ----------------------------------------------------------------------------------------------
# The command: DIR/a and DIR/b are `dataset`'s files bit for bit


def _run(capsys, *args) -> tuple[int, str, str]:
    status = core_cli.main([*map(str, args)])
    out = capsys.readouterr()
    return status, out.out, out.err


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def alone(folder, tmp_path_factory):
    """`dataset` run alone for the Shapes ViT and for its random init (with its class names)."""
    out = tmp_path_factory.mktemp("alone")
    assert core_cli.main(["dataset", str(folder), *SHAPES, "--out", str(out / "a"), "--device", "cpu", "--workers", "0"]) == 2
    assert core_cli.main(["dataset", str(folder), "--model", "vit_shapes_patch8_96", "--random-init", "--labels",
                          str(NAMES), "--out", str(out / "b"), "--device", "cpu", "--workers", "0"]) == 2
    return _files(out / "a"), _files(out / "b")


@pytest.fixture(scope="module")
def compared(folder, alone, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    status = core_cli.main(["compare", str(folder), *SHAPES, *SHAPES_RANDOM, "--out", str(out), "--device", "cpu",
                            "--workers", "0", "--batch-size", "3"])
    assert status == 2  # notes.png is not an image
    return out


def test_compare_writes_a_and_b_bit_for_bit_as_dataset_alone_and_its_own_files(compared, alone):
    assert _files(compared / "a") == alone[0]
    assert _files(compared / "b") == alone[1]
    assert sorted(p.name for p in compared.iterdir()) == ["a", "b", "compare.csv", "compare.json", "compare.npz",
                                                         "compare.png", "parts"]
    summary = json.loads((compared / "compare.json").read_text())
    arrays = np.load(compared / "compare.npz")
    assert arrays["cka"].shape == (5, 5) and arrays["cka"].dtype == np.float64
    assert arrays["attention_js"].shape == (4, 8) and arrays["mean_attention_distance_diff"].dtype == np.float32
    a = np.load(compared / "a" / "dataset.npz")
    b = np.load(compared / "b" / "dataset.npz")
    np.testing.assert_array_equal(arrays["mean_attention_distance_diff"],
                                  b["mean_attention_distance"] - a["mean_attention_distance"])
    np.testing.assert_array_equal(arrays["logit_lens_accuracy_a"], a["logit_lens_accuracy"])
    assert summary["num_images"] == 5 and summary["skipped"] == []
    assert summary["cka_diagonal"] == [pytest.approx(v) for v in np.diag(arrays["cka"])]
    assert len(summary["heads_most_changed"]) == 10
    assert summary["heads_most_changed"][0]["js"] == pytest.approx(float(arrays["attention_js"].max()))
    rows = (compared / "compare.csv").read_text().splitlines()
    assert rows[0] == ("file,label,predicted_a,predicted_name_a,probability_a,predicted_b,predicted_name_b,"
                       "probability_b,changed,kl,rollout_correlation")
    assert [r.split(",")[0] for r in rows[1:]] == ["circle/a.png", "circle/b.png", "e.png", "square/c.png",
                                                   "square/d.jpg"]
    changed = sum(int(r.split(",")[8]) for r in rows[1:])
    assert summary["changed"] == changed and summary["agreement"] == pytest.approx(1 - changed / 5)
    assert (compared / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_in_two_shards_and_shard_by_shard_gives_the_same_bits(folder, alone, compared, tmp_path, capsys):
    status, _, _ = _run(capsys, "compare", folder, *SHAPES, *SHAPES_RANDOM, "--out", tmp_path / "two", "--device",
                        "cpu", "--workers", "0", "--shards", "2")
    assert status == 2
    assert _files(tmp_path / "two" / "a") == alone[0] and _files(tmp_path / "two" / "b") == alone[1]
    assert _files(tmp_path / "two") == _files(compared)
    said = {}
    for shard in ("2/2", "1/2"):  # one shared folder: the run that finds both shards there writes the results
        status, out, said[shard] = _run(capsys, "compare", folder, *SHAPES, *SHAPES_RANDOM, "--out", tmp_path / "one",
                                        "--device", "cpu", "--workers", "0", "--shard", shard, "--batch-size", "1")
        assert status == 2  # square/notes.png, in shard 2 (sorted last among the six files), said once by each run
    assert "notes.png" in said["2/2"] and said["2/2"].count("\n") == 1
    assert "5 images compared" in out
    assert _files(tmp_path / "one") == _files(compared) and _files(tmp_path / "one" / "a") == alone[0]
    status, out, _ = _run(capsys, "compare", folder, *SHAPES, *SHAPES_RANDOM, "--out", tmp_path / "one", "--device",
                          "cpu", "--workers", "0")  # a rerun: every shard done, nothing run again
    assert "2 of 2 shards already done" in out


def test_compare_into_the_folder_of_another_comparison_says_what_differs_and_writes_nothing(folder, compared, capsys):
    before = {p: p.read_bytes() for p in compared.rglob("*") if p.is_file()}
    refused = f"vit_core: {folder}: {compared / 'parts'} holds parts of another run (it differs in: "
    for args, differs in (((*SHAPES_RANDOM, "--limit", "2"), "the files, --limit"),  # both runs': said once
                          (("--model-b", "vit-lens/shapes-vit"), "model B's --model, model B's the weights")):
        status, _, err = _run(capsys, "compare", folder, *SHAPES, *args, "--out", compared, "--device", "cpu")
        assert status == 2 and err.splitlines() == [f"{refused}{differs}); use another --out, or remove that folder to "
                                                    "start again."]
    status, _, err = _run(capsys, "compare", folder, *SHAPES, "--model-workers", "2", "--out", compared)
    assert status == 2 and err.splitlines() == ["vit_core: --model-workers needs --engine ray"]
    assert {p: p.read_bytes() for p in compared.rglob("*") if p.is_file()} == before


def test_compare_refuses_weights_that_do_not_fit_model_b_and_other_inputs_before_loading(folder, tmp_path, capsys):
    from safetensors.torch import save_file

    tiny = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=1, device="cpu")
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, tmp_path / "tiny.safetensors")
    status, _, err = _run(capsys, "compare", folder, *SHAPES, "--model-b", "vit_shapes_patch8_96", "--weights-b",
                          tmp_path / "tiny.safetensors", "--out", tmp_path / "out", "--device", "cpu")
    assert status == 2 and err.startswith("vit_core: --weights-b ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "parts").exists()
    for args, said in (((*SHAPES, "--model-b", "vit-lens/shapes-vit", "--random-init-b"), "--random-init-b"),
                       ((*SHAPES, "--weights-b", tmp_path / "missing.pt"), "--weights-b"),
                       ((*SHAPES, "--model-b", "vit_nope_patch16"), "--model-b"),
                       ((*SHAPES, "--seed-b", "1"), "--seed-b")):
        status, _, err = _run(capsys, "compare", folder, *args, "--out", tmp_path / "out2")
        assert status == 2 and said in err and len(err.strip().splitlines()) == 1
    status, _, err = _run(capsys, "compare", folder, *SHAPES, "--out", folder / "inside")
    assert status == 2 and "inside FOLDER" in err


def test_two_random_inits_of_one_architecture_under_two_seeds_are_two_models(folder, tmp_path, capsys):
    """--seed-b gives B's random init its own seed: B is the architecture's init under that seed, said as such, and
    the two inits' residual streams differ (CKA below 1 after the first block); under one seed B is A."""
    common = (folder, "--model", "vit_shapes_patch8_96", "--random-init", "--model-b", "vit_shapes_patch8_96",
              "--random-init-b", "--limit", "2", "--device", "cpu", "--workers", "0")
    status, _, err = _run(capsys, "compare", *common, "--seed-b", "1", "--out", tmp_path / "two")
    assert status == 0, err
    b = json.loads((tmp_path / "two" / "b" / "dataset.json").read_text())
    assert b["weights"] == "random init (seed 1)"
    seed_1 = load_model("vit_shapes_patch8_96", pretrained=False, seed=1, device="cpu")
    logits = torch.tensor(run_with_capture(seed_1, load_image(folder / "circle" / "a.png")).logits)  # a copy: read-only
    with open(tmp_path / "two" / "b" / "images.csv", newline="") as table:
        row = next(r for r in csv.DictReader(table) if r["file"] == "circle/a.png")
    assert int(row["predicted"]) == int(logits.argmax())  # B's answer is seed 1's
    assert float(row["probability"]) == pytest.approx(float(logits.softmax(-1).max()), rel=1e-6)
    cka = np.load(tmp_path / "two" / "compare.npz")["cka"]
    assert np.diag(cka)[1:].max() < 1 - 1e-6
    status, _, _ = _run(capsys, "compare", *common, "--out", tmp_path / "one")
    assert status == 0
    np.testing.assert_allclose(np.diag(np.load(tmp_path / "one" / "compare.npz")["cka"]), 1.0, atol=1e-12)


def test_compare_explain_adds_each_models_judge_as_dataset_explain_does_and_counts_the_verdicts_changed(folder, tmp_path,
                                                                                                       capsys):
    explain = ("--explain", "--steps", "2", "--limit", "2", "--device", "cpu", "--workers", "0")
    status, _, _ = _run(capsys, "dataset", folder, *SHAPES, *explain, "--out", tmp_path / "alone")
    assert status == 0
    status, out, _ = _run(capsys, "compare", folder, *SHAPES, *SHAPES_RANDOM, *explain, "--out", tmp_path / "both")
    assert status == 0 and "verdicts against random that changed from A to B" in out
    assert _files(tmp_path / "both" / "a") == _files(tmp_path / "alone")
    summary = json.loads((tmp_path / "both" / "compare.json").read_text())
    a = json.loads((tmp_path / "both" / "a" / "dataset.json").read_text())
    b_rows = (tmp_path / "both" / "b" / "images.csv").read_text().splitlines()
    a_rows = (tmp_path / "both" / "a" / "images.csv").read_text().splitlines()
    changed = summary["explain"]["verdict_changed"]
    assert changed and all(v["images"] == 2 for v in changed.values())
    for key, v in changed.items():  # the count, from the two per-image tables
        ia, ib = a_rows[0].split(",").index(key), b_rows[0].split(",").index(key)
        assert v["changed"] == sum(ra.split(",")[ia] != rb.split(",")[ib] for ra, rb in zip(a_rows[1:], b_rows[1:], strict=True))
    assert summary["explain"]["means"][next(iter(changed))]["a"] == a["explained"][next(iter(changed))]["mean"]
