"""Mergeable results (vit_core.dataset.totals, runs): the totals of any split of a set merge into the one-process
result; shards cover every image exactly once; parts are written per shard beside a manifest, a rerun skips the
shards done (also after a kill -9), other inputs are refused; `merge` joins shards run elsewhere; progress lines
off a terminal; the files that are not images are listed with their reason."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import drawn_image, encoded
from support.dataset_folder import IMAGES, labelled_folder
from vit_core import __main__ as core_cli
from vit_core import load_model, loading
from vit_core.dataset import (
    LAYERS,
    ExactMoments,
    ShardError,
    Totals,
    analyze_totals,
    dataset_files,
    dataset_result,
    list_not_images,
    not_image_reason,
    parse_shard,
    shards,
)
from vit_core.dataset.progress import ProgressLines, duration

MODEL = ("--model", "vit_tiny_patch16_224", "--random-init", "--device", "cpu", "--workers", "0")


def sources_with_failures(count: int) -> list[tuple[str, bytes]]:
    drawn = [(f"image{i}.png", encoded(drawn_image(i, (120, 160)))) for i in range(count)]
    return [*drawn[:2], ("broken.png", b"not an image"), *drawn[2:]]


def assert_same_result(got, expected, rows=True):
    """Two results are the same bits: every array of dataset.npz, the counts, the table's rows."""
    a, b = got.arrays(), expected.arrays()
    assert set(a) == set(b)
    for key in b:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key
    assert got.mean_attention_distance_std.tobytes() == expected.mean_attention_distance_std.tobytes()
    assert got.failures == expected.failures and got.not_images == expected.not_images
    assert got.num_labelled == expected.num_labelled and got.totals.confusion == expected.totals.confusion
    if rows:
        ra, rb = got.totals.rows, expected.totals.rows
        assert (ra.file, ra.label, ra.predicted) == (rb.file, rb.label, rb.predicted)
        assert ra.probability == rb.probability


# ---------------------------------------------------------------------------------- merging totals


def test_exact_moments_merge_into_the_same_bits_for_any_split():
    values = np.random.default_rng(1).normal(100, 30, size=(23, 3, 2))
    values[::3] *= 1e-9  # magnitudes far apart: a float64 running sum would lose these bits in one order and not another
    whole = ExactMoments()
    whole.add(values)
    rng = np.random.default_rng(2)
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, 23), size=rng.integers(1, 6), replace=False))
        parts = []
        for chunk in np.split(values, cuts):
            moments = ExactMoments()
            moments.add(chunk)
            parts.append(moments)
        merged = ExactMoments()
        for part in parts:
            merged.merge(part)
        merged.merge(ExactMoments())  # an empty part changes nothing
        assert merged.count == 23
        assert merged.mean.tobytes() == whole.mean.tobytes() and merged.std().tobytes() == whole.std().tobytes()
    np.testing.assert_allclose(whole.mean, values.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(whole.std(), values.std(axis=0), rtol=1e-10)


@pytest.fixture(scope="module")
def small():
    """A 2-block ViT-Ti/16 on 64 x 64 inputs (4 x 4 patches): fast enough to explain every image."""
    return load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, img_size=64)


def test_any_split_merges_into_the_one_process_result(small):
    sources = sources_with_failures(7)
    labels = [0, 1, 1, None, 7, 0, 3, 0]  # the broken file's label (index 2) is never counted
    whole = dataset_result(small, analyze_totals(small, sources, labels, batch_size=3, explain=True, steps=2), len(sources))
    assert whole.num_images == 7 and whole.num_labelled == 6 and [n for n, _ in whole.failures] == ["broken.png"]
    assert {key for key in whole.explained} >= {"deletion_auc_random", "insertion_auc_random", "deletion_auc_rollout"}
    for cuts, batch_size in (([1, 4], 2), ([3], 5), ([2, 3, 5, 6], 1), ([], 8)):
        totals = Totals()
        for start, stop in zip([0, *cuts], [*cuts, len(sources)], strict=True):
            totals.merge(analyze_totals(small, sources[start:stop], labels[start:stop], batch_size=batch_size,
                                        explain=True, steps=2))
        merged = dataset_result(small, totals, len(sources))
        assert_same_result(merged, whole)
        for key, value in whole.explained.items():
            assert merged.explained[key] == value, key
            assert merged.totals.explained[key].std() == whole.totals.explained[key].std(), key


def test_totals_travel_as_arrays_and_come_back_the_same(small):
    sources = sources_with_failures(3)
    totals = analyze_totals(small, sources, [1, None, 0, 2], batch_size=2, explain=True, steps=2)
    totals.not_images.append(("notes.txt", "Not an image."))
    buffer = io.BytesIO()
    np.savez(buffer, **totals.arrays())
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as npz:  # no pickle: numbers and unicode only
        back = Totals.from_arrays({key: npz[key] for key in npz.files})
    assert back.rows == totals.rows and back.failures == totals.failures and back.not_images == totals.not_images
    assert back.confusion == totals.confusion and back.labelled == totals.labelled and back.correct == totals.correct
    np.testing.assert_array_equal(back.lens_correct, totals.lens_correct)
    for name in ("distance", "distance_renorm", "high_norm_rate"):
        a, b = getattr(back, name), getattr(totals, name)
        assert a.count == b.count
        np.testing.assert_array_equal(a.total, b.total)
        np.testing.assert_array_equal(a.squares, b.squares)
        assert a.mean.tobytes() == b.mean.tobytes() and a.std().tobytes() == b.std().tobytes()
    assert list(back.explained) == list(totals.explained)


def test_per_class_counts_and_confusion_equal_a_loop_over_the_table(small):
    sources = [(f"i{i}.png", encoded(drawn_image(i, (70, 90)))) for i in range(9)]
    labels = [0, 0, 1, 1, 2, None, 5, 5, 5]
    result = dataset_result(small, analyze_totals(small, sources, labels, batch_size=4), len(sources))
    rows = result.totals.rows
    cells: Counter = Counter()
    for label, predicted in zip(rows.label, rows.predicted, strict=True):
        if label >= 0:
            cells[label, predicted] += 1
    assert result.totals.confusion == cells
    arrays = result.arrays()
    assert {(t, p): n for t, p, n in arrays["confusion"].tolist()} == dict(cells)
    for c in range(small.geometry.num_classes):
        mine = [p for t, p in zip(rows.label, rows.predicted, strict=True) if t == c]
        assert arrays["class_images"][c] == len(mine) and arrays["class_correct"][c] == sum(p == c for p in mine)
    assert float(arrays["accuracy"]) == pytest.approx(sum(n for (t, p), n in cells.items() if t == p) / 8)
    table = list(csv.DictReader(io.StringIO(dataset_files(result, small.geometry)["classes.csv"].decode())))
    assert [int(row["class"]) for row in table] == [0, 1, 2, 5]
    assert [int(row["images"]) for row in table] == [2, 2, 1, 3]


# ---------------------------------------------------------------------------------- shards


@pytest.mark.parametrize("count", [1, 3, 7, 10, 13])
def test_shards_cover_every_image_exactly_once(count):
    for n in (0, 1, 9, 10, 101):
        parts = shards(n, count)
        assert [s.number for s in parts] == list(range(1, count + 1)) and all(s.count == count for s in parts)
        covered = [i for s in parts for i in range(s.start, s.stop)]
        assert covered == list(range(n))  # in order, none twice, none dropped
        sizes = [s.size for s in parts]
        assert max(sizes) - min(sizes) <= 1


def test_parse_shard():
    assert parse_shard("3/16") == (3, 16) and parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/4", "5/4", "3", "a/b", "-1/4"):
        with pytest.raises(ShardError):
            parse_shard(bad)


# ---------------------------------------------------------------------------------- files that are not images


def test_files_that_are_not_images_are_listed_with_their_reason(tmp_path):
    for name in ("a.png", "notes.txt", "IMG_0001.HEIC", "Makefile", ".hidden.txt", "sub/b.jpg", "sub/raw.dng"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    listed = [(p.relative_to(tmp_path).as_posix(), reason) for p, reason in list_not_images(tmp_path)]
    assert [name for name, _ in listed] == ["IMG_0001.HEIC", "Makefile", "notes.txt", "sub/raw.dng"]
    assert dict(listed)["IMG_0001.HEIC"].startswith("A HEIC photo, which ViT Lens can't read: convert it to JPEG or PNG")
    assert dict(listed)["notes.txt"] == not_image_reason("notes.txt")
    assert not_image_reason("notes.txt").startswith("Not an image (a .txt file); ViT Lens reads jpg")
    assert "without a suffix" in dict(listed)["Makefile"]


# ---------------------------------------------------------------------------------- the command: shards, merge, resume




@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return labelled_folder(tmp_path_factory.mktemp("set"))


def _run(capsys, *args) -> tuple[int, list[str], list[str]]:
    status = core_cli.main([*map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def _outputs(folder: Path) -> dict:
    with np.load(folder / "dataset.npz") as npz:
        arrays = {key: npz[key] for key in npz.files}
    with open(folder / "images.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"arrays": arrays, "json": json.loads((folder / "dataset.json").read_text()), "rows": rows,
            "classes": (folder / "classes.csv").read_text()}


def assert_same_outputs(got: dict, expected: dict) -> None:
    """Two runs' files are the same: dataset.npz's arrays bit for bit, dataset.json, every row of the tables."""
    assert set(got["arrays"]) == set(expected["arrays"])
    for key, value in expected["arrays"].items():
        assert got["arrays"][key].tobytes() == value.tobytes(), key
    assert got["json"] == expected["json"]
    assert got["rows"] == expected["rows"]
    assert got["classes"] == expected["classes"]


@pytest.fixture(scope="module")
def one_process(folder, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("whole")
    status = core_cli.main(["dataset", str(folder), *MODEL, "--out", str(out), "--batch-size", "3"])
    assert status == 2  # broken.png
    return out, _outputs(out)


def test_the_one_process_run_lists_every_skipped_file_and_keeps_its_part(one_process):
    out, outputs = one_process
    summary = outputs["json"]
    assert summary["num_images"] == len(IMAGES) and summary["num_skipped"] == 3
    assert [s["file"] for s in summary["skipped"]] == ["notes.txt", "phone.heic", "1/broken.png"]
    assert summary["layers"] == LAYERS and "row b + 1 for the tokens after block b" in LAYERS
    assert [r["file"] for r in outputs["rows"]] == sorted(IMAGES)
    manifest = json.loads((out / "parts" / "manifest.json").read_text())
    assert manifest["shards"] == 1 and manifest["num_images"] == len(IMAGES) + 1  # broken.png is listed, then fails


def test_shards_run_apart_and_merged_equal_the_one_process_run(folder, one_process, tmp_path, capsys):
    _, expected = one_process
    outs = [tmp_path / f"shard{i}" for i in (1, 2, 3)]
    for i, out in enumerate(outs, start=1):
        status, lines, errors = _run(capsys, "dataset", folder, *MODEL, "--out", out, "--shard", f"{i}/3", "--batch-size", "2")
        assert status == (2 if i == 2 else 0), errors  # 1/broken.png is the 4th of 8 images: in shard 2 (images 2..4)
        assert lines[-1].startswith(f"1 of 3 shards done in {out / 'parts'}")
        assert sorted(p.name for p in (out / "parts").iterdir()) == ["manifest.json", f"shard-000{i}-of-0003.npz"]
        assert not (out / "dataset.npz").exists()
    status, lines, errors = _run(capsys, "merge", *outs[::-1], "--out", tmp_path / "merged")  # any order
    assert status == 2 and len(errors) == 1 and "broken.png" in errors[0]
    assert lines[0] == f"{len(IMAGES)} images analysed, 3 files skipped (listed in dataset.json) -> {tmp_path / 'merged'}"
    assert len(lines) == 2 and lines[1].startswith("top-1 accuracy ") and "of 6 labelled images" in lines[1]
    assert_same_outputs(_outputs(tmp_path / "merged"), expected)

    status, _, errors = _run(capsys, "merge", outs[0], outs[2], "--out", tmp_path / "partial")
    assert status == 2 and errors == ["vit_core: merge: 1 of 3 shards are not done yet: 2; run them (the same command "
                                      "with --shard I/N) and merge again."]
    status, _, errors = _run(capsys, "merge", outs[0], outs[0] / "parts", outs[1], outs[2], "--out", tmp_path / "again")
    assert status == 2 and len(errors) == 1 and "broken.png" in errors[0]  # one folder named twice: its shard once
    copy = outs[1] / "parts" / "shard-0001-of-0003.npz"
    copy.write_bytes((outs[0] / "parts" / "shard-0001-of-0003.npz").read_bytes())
    status, _, errors = _run(capsys, "merge", *outs, "--out", tmp_path / "twice")
    assert status == 2 and errors == [f"vit_core: merge: Shard 1/3 is in both {outs[0] / 'parts'} and {outs[1] / 'parts'}: "
                                      "name each shard's folder once."]
    status, _, errors = _run(capsys, "merge", tmp_path / "merged", "--out", tmp_path / "nothing")
    assert status == 2 and errors == [f"vit_core: merge: No manifest.json in {tmp_path / 'merged' / 'parts'}: not the "
                                      "output of a `dataset` run."]


def test_shards_sharing_one_folder_write_the_results_when_the_last_is_done(folder, one_process, tmp_path, capsys):
    _, expected = one_process
    _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--shard", "2/2")
    assert not (tmp_path / "dataset.npz").exists()
    _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--shard", "1/2")
    assert_same_outputs(_outputs(tmp_path), expected)


def test_a_rerun_skips_the_shards_done_and_other_inputs_are_refused(folder, one_process, tmp_path, capsys, monkeypatch):
    _, expected = one_process
    out = tmp_path / "out"
    _run(capsys, "dataset", folder, *MODEL, "--out", out, "--shards", "4")
    for name in ("shard-0004-of-0004.npz", "../dataset.npz"):  # as if the run had died in its last shard
        (out / "parts" / name).unlink()

    import vit_core.dataset.analyze as analyze

    calls = []
    original = analyze.reduce_batch
    monkeypatch.setattr(analyze, "reduce_batch", lambda loaded, x, *a, **k: calls.append(len(x)) or original(loaded, x, *a, **k))
    status, lines, errors = _run(capsys, "dataset", folder, *MODEL, "--out", out)  # the same command, no --shards
    assert status == 2 and len(errors) == 1 and "broken.png" in errors[0]
    assert lines[0] == f"3 of 4 shards already done in {out / 'parts'}: skipped"
    assert sum(calls) == 2  # shard 4 only: images 6 and 7 of 8
    assert_same_outputs(_outputs(out), expected)

    status, lines, errors = _run(capsys, "dataset", folder, *MODEL, "--out", out)  # all done: only merged again
    assert lines[0] == f"4 of 4 shards already done in {out / 'parts'}: skipped" and sum(calls) == 2

    for other, differs in ((("--explain", "--steps", "2"), "--explain, --steps, --tests"),
                           (("--limit", "3"), "the files, --limit"), (("--shards", "2"), "--shards")):
        status, _, errors = _run(capsys, "dataset", folder, *MODEL, "--out", out, *other)
        assert status == 2 and errors == [f"vit_core: {folder}: {out / 'parts'} holds parts of another run (it differs "
                                          f"in: {differs}); use another --out, or remove that folder to start again."]


def test_an_output_folder_inside_the_images_is_not_analysed_on_a_rerun(folder, tmp_path, capsys):
    import shutil

    inside = tmp_path / "set"
    shutil.copytree(folder, inside)
    for _ in range(2):
        status, lines, errors = _run(capsys, "dataset", inside, *MODEL, "--out", inside / "results", "--limit", "2")
        assert status == 0, errors
    assert lines[0] == f"1 of 1 shards already done in {inside / 'results' / 'parts'}: skipped"
    summary = json.loads((inside / "results" / "dataset.json").read_text())
    assert [s["file"] for s in summary["skipped"]] == ["notes.txt", "phone.heic"]  # not results/dataset.json etc.


def test_bad_shards_and_ray_options_without_ray_are_one_line(folder, tmp_path, capsys, monkeypatch):
    status, _, errors = _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--shard", "5/4")
    assert status == 2 and errors == ["vit_core: --shard 5/4: I runs from 1 to N."]
    status, _, errors = _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--gpus-per-worker", "1")
    assert status == 2 and errors == ["vit_core: --gpus-per-worker needs --engine ray"]
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError: as without the extra
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded before saying Ray is missing"))
    status, _, errors = _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--engine", "ray")
    assert status == 2 and len(errors) == 1 and errors[0].endswith(': pip install "vit-lens[ray]"')


def test_a_run_killed_mid_way_resumes_and_gives_the_same_result(folder, one_process, tmp_path):
    """kill -9 while a shard is in flight (the first one's part is written): the rerun skips the shards done."""
    _, expected = one_process
    command = [sys.executable, "-m", "vit_core", "dataset", str(folder), *MODEL, "--out", str(tmp_path), "--shards", "8",
               "--batch-size", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "parts").glob("shard-*.npz")) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
    run.wait()
    done = sorted(p.name for p in (tmp_path / "parts").glob("shard-*.npz"))
    assert 1 <= len(done) < 8 and not (tmp_path / "dataset.npz").exists(), done  # killed mid-way
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 2, again.stderr  # broken.png
    assert again.stdout.splitlines()[0] == f"{len(done)} of 8 shards already done in {tmp_path / 'parts'}: skipped"
    assert_same_outputs(_outputs(tmp_path), expected)


# ---------------------------------------------------------------------------------- progress off a terminal


def test_progress_lines_every_few_percent_with_rate_and_time_left():
    stream, now = io.StringIO(), [0.0]
    lines = ProgressLines(stream, "images", percent=10, every_s=60, clock=lambda: now[0])
    for done in range(1, 201):
        now[0] = done * 0.5  # 2 images/s
        lines.update(done, 200)
    written = stream.getvalue().splitlines()
    assert len(written) == 10  # at 10 %, 20 %, ..., 100 %
    assert written[0] == "images: 20 of 200 files (10%), 2.0 images/s, about 1 min 30 s left"
    assert written[-1] == "images: 200 of 200 files (100%), 2.0 images/s, done in 1 min 40 s"


def test_progress_lines_also_once_a_minute_when_slow():
    stream, now = io.StringIO(), [0.0]
    lines = ProgressLines(stream, "images", percent=5, every_s=60, clock=lambda: now[0])
    for done in range(1, 6):  # 1,000 files at one every 45 s: 5 % takes 37 minutes
        now[0] = done * 45.0
        lines.update(done, 1000)
    assert [line.split("%)")[0] for line in stream.getvalue().splitlines()] == ["images: 2 of 1,000 files (0",
                                                                               "images: 4 of 1,000 files (0"]
    assert duration(7384) == "2 h 03 min" and duration(59.6) == "1 min 00 s"


def test_the_command_writes_progress_lines_when_stdout_is_not_a_terminal(folder, tmp_path, capsys):
    status, lines, _ = _run(capsys, "dataset", folder, *MODEL, "--out", tmp_path, "--batch-size", "2")
    progress = [line for line in lines if line.startswith("images: ")]
    assert progress[-1].startswith(f"images: {len(IMAGES) + 1} of {len(IMAGES) + 1} files (100%)")
    assert 2 <= len(progress) <= 21 and all("images/s" in line for line in progress)


# ---------------------------------------------------------------------------------- Ray's worker counts (no Ray needed)


class FakeCluster:
    def __init__(self, **resources):
        self.resources = resources

    def cluster_resources(self):
        return self.resources


def test_ray_worker_counts_follow_the_cluster_and_refuse_what_it_cannot_give():
    from vit_core.dataset.ray_engine import RayPlan, RayRunError, ray_plan

    assert ray_plan(FakeCluster(CPU=2.0)) == RayPlan(model_workers=1, gpus_per_worker=0.0, decoders=1)
    assert ray_plan(FakeCluster(CPU=64.0, GPU=8.0)) == RayPlan(8, 1.0, 56)
    assert ray_plan(FakeCluster(CPU=64.0, GPU=8.0), gpus_per_worker=0.5) == RayPlan(16, 0.5, 48)
    assert ray_plan(FakeCluster(CPU=16.0, GPU=1.0), decoders=4) == RayPlan(1, 1.0, 4)
    with pytest.raises(RayRunError, match="2 model workers of 1 GPUs each, but the Ray cluster has 1 GPUs"):
        ray_plan(FakeCluster(CPU=16.0, GPU=1.0), model_workers=2)
    with pytest.raises(RayRunError, match="model workers of 1 GPUs each, but the Ray cluster has 0 GPUs"):
        ray_plan(FakeCluster(CPU=16.0), gpus_per_worker=1)
    with pytest.raises(RayRunError, match="need 3 CPUs .one each., but the Ray cluster has 2"):
        ray_plan(FakeCluster(CPU=2.0), decoders=2)
