"""Hostile inputs at the command line and the dataset engine: each is refused at the edge in one sentence (the CLI:
one line on stderr starting with the command's name, exit status 2) or listed with its reason, never a traceback,
a silent drop, or a number computed from garbage. The bundled teaching model (4 blocks, 8 heads, 9 classes, 144
patches) keeps the runs short."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import drawn_image
from vit_core import __main__ as core_cli
from vit_core import load_model
from vit_core.dataset import PartsError, PartStore, class_of_folder, list_images, list_not_images
from vit_core.errors import ModelError, WeightsError
from vit_core.explain.passes import TargetError, resolve_target
from vit_core.loading import TEACHING_MODEL

TEACHING = ("--model", TEACHING_MODEL, "--device", "cpu")
DATASET = (*TEACHING, "--workers", "0")


def _run(capsys, *args) -> tuple[int, list[str], list[str]]:
    status = core_cli.main([*map(str, args)])
    captured = capsys.readouterr()
    return status, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def _one_line(errors: list[str], *words: str) -> None:
    assert len(errors) == 1 and errors[0].startswith("vit_core: "), errors
    assert "Traceback" not in errors[0] and all(word in errors[0] for word in words), errors


@pytest.fixture(scope="module")
def teaching():
    return load_model(TEACHING_MODEL, device="cpu")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("image") / "one.png"
    drawn_image(0, (96, 96)).save(path)
    return path


# ---------------------------------------------------------------------------------- class indices: ASCII digits


def test_a_folder_or_target_of_unicode_or_endless_digits_names_no_class(teaching):
    assert class_of_folder(teaching, "²") is None and class_of_folder(teaching, "9" * 5000) is None
    assert class_of_folder(teaching, "3") == 3 and class_of_folder(teaching, "0003") == 3
    assert class_of_folder(teaching, "9") is None  # out of range
    logits = np.zeros(9, dtype=np.float32)
    with pytest.raises(TargetError, match="no class is labelled '²'"):
        resolve_target(teaching, logits, "²")
    with pytest.raises(TargetError, match=r"outside 0\.\.8"):
        resolve_target(teaching, logits, "9" * 5000)
    assert resolve_target(teaching, logits, "007") == 7


def test_analyze_with_a_target_of_unicode_digits_is_one_line(image, tmp_path, capsys):
    status, _, errors = _run(capsys, "analyze", image, *TEACHING, "--out", tmp_path, "--explain", "--steps", "2",
                             "--target", "²")
    assert status == 2
    _one_line(errors, "--target", "no class is labelled '²'")  # the bundled model's classes: before it loads


# ---------------------------------------------------------------------------------- the folder's listing


@pytest.fixture(scope="module")
def hostile_folder(tmp_path_factory) -> Path:
    """Images in class folders named '²' and by 200 digits, and entries a listing used to drop without a word."""
    root = tmp_path_factory.mktemp("hostile")
    for index, name in enumerate(("²", "9" * 200, "2")):
        (root / name).mkdir()
        drawn_image(index, (96, 96)).save(root / name / f"{index}.png")
    (root / "notes.txt").write_text("a note")
    (root / "gone.png").symlink_to(root / "nowhere.png")
    os.mkfifo(root / "pipe.png")
    (root / "x.png").mkdir()
    return root


def test_entries_that_are_not_readable_files_are_listed_with_their_reason(hostile_folder):
    skipped = {path.name: reason for path, reason in list_not_images(hostile_folder)}
    assert set(skipped) == {"notes.txt", "gone.png", "pipe.png", "x.png"}
    assert "broken link" in skipped["gone.png"] and "FIFO" in skipped["pipe.png"] and "folder" in skipped["x.png"]
    assert [path.name for path in list_images(hostile_folder)] == ["2.png", "1.png", "0.png"]  # 2/, 999.../, ²/


def test_dataset_over_odd_class_folders_runs_and_lists_every_skipped_entry(hostile_folder, tmp_path, capsys):
    status, _, errors = _run(capsys, "dataset", hostile_folder, *DATASET, "--out", tmp_path)
    assert status == 0 and errors == []
    summary = json.loads((tmp_path / "dataset.json").read_text())
    assert summary["num_images"] == 3 and summary["num_labelled"] == 1  # only "2" names a class
    assert sorted(s["file"] for s in summary["skipped"]) == ["gone.png", "notes.txt", "pipe.png", "x.png"]


# ---------------------------------------------------------------------------------- counts bounded


def test_shards_beyond_the_images_are_refused_at_once(hostile_folder, tmp_path, capsys):
    started = time.perf_counter()
    status, _, errors = _run(capsys, "dataset", hostile_folder, *DATASET, "--out", tmp_path, "--shards", "100000000")
    assert status == 2 and time.perf_counter() - started < 30
    _one_line(errors, "100,000,000 shards for 3 images")
    status, _, errors = _run(capsys, "dataset", hostile_folder, *DATASET, "--out", tmp_path, "--shard", "1/2000")
    assert status == 2
    _one_line(errors, "2,000 shards for 3 images")
    assert not (tmp_path / "parts").exists()


def test_steps_beyond_the_patches_are_refused_after_the_load(image, hostile_folder, tmp_path, capsys):
    status, _, errors = _run(capsys, "analyze", image, *TEACHING, "--out", tmp_path, "--explain", "--steps", "1000000")
    assert status == 2
    _one_line(errors, "--steps 1000000", "144 patches")
    status, _, errors = _run(capsys, "dataset", hostile_folder, *DATASET, "--out", tmp_path, "--explain", "--steps", "145")
    assert status == 2
    _one_line(errors, "--steps 145", "at most 144 steps")
    assert not any(tmp_path.iterdir())


def test_topk_below_one_is_refused_by_the_parser(image, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        core_cli.main(["analyze", str(image), *TEACHING, "--out", str(tmp_path), "--topk", "-3"])
    assert exited.value.code == 2 and "--topk: needs at least 1, got -3" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- weights and model names


@pytest.fixture(scope="module")
def tiny_state() -> dict[str, torch.Tensor]:
    import timm

    torch.manual_seed(0)
    return {k: v.contiguous() for k, v in timm.create_model("vit_tiny_patch16_224", depth=2).state_dict().items()}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_with_nan_or_infinity_are_refused_naming_the_tensor(tiny_state, bad, tmp_path):
    state = {k: v.clone() for k, v in tiny_state.items()}
    state["blocks.1.mlp.fc1.weight"][3, 5] = bad
    save_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(WeightsError, match=r"bad\.safetensors: tensor 'blocks\.1\.mlp\.fc1\.weight' holds NaN or inf"):
        load_model("vit_tiny_patch16_224", weights=tmp_path / "bad.safetensors", depth=2, device="cpu")
    save_file(tiny_state, tmp_path / "good.safetensors")
    load_model("vit_tiny_patch16_224", weights=tmp_path / "good.safetensors", depth=2, device="cpu")


def test_analyze_with_nan_weights_is_one_line(image, tmp_path, capsys):
    import timm

    state = {k: v.contiguous() for k, v in timm.create_model("vit_tiny_patch16_224").state_dict().items()}
    state["head.weight"].fill_(float("nan"))
    save_file(state, tmp_path / "nan.safetensors")
    status, lines, errors = _run(capsys, "analyze", image, "--model", "vit_tiny_patch16_224", "--device", "cpu",
                                 "--weights", tmp_path / "nan.safetensors", "--out", tmp_path)
    assert status == 2 and lines == []  # never "class 0 (nan%)"
    _one_line(errors, "nan.safetensors: tensor 'head.weight' holds NaN or infinite values")


def test_a_weights_file_with_the_teaching_model_is_refused_not_ignored(image, tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelError, match="takes no weights file"):
        load_model(TEACHING_MODEL, weights=weights, device="cpu")
    status, lines, errors = _run(capsys, "analyze", image, *TEACHING, "--weights", weights, "--out", tmp_path)
    assert status == 2 and lines == []
    _one_line(errors, TEACHING_MODEL, "takes no weights file")


@pytest.mark.parametrize("command", ["analyze", "dataset", "concepts", "export-web"])
def test_random_init_with_the_teaching_model_is_refused_not_ignored(command, image, tmp_path, capsys):
    """Issue 53: --random-init gave the bundled weights without a word (and a rerun reused the pretrained run's parts).
    The Shapes ViT has no random init: refused as --weights is, before anything loads."""
    inputs = {"analyze": [image], "dataset": [image.parent], "concepts": [image.parent, "--layer", "1"],
              "export-web": []}[command]
    status, lines, errors = _run(capsys, command, *inputs, "--model", TEACHING_MODEL, "--random-init", "--out",
                                 tmp_path / "out")
    assert status == 2 and lines == []
    _one_line(errors, "--random-init", "comes with its own weights", "vit_tiny_patch16_224")


@pytest.mark.parametrize("content, said", [
    (b"hello, these are not weights\n", "it looks like text"),
    (b"", "it is empty"),
    (b"PK\x03\x04" + b"\0" * 100, "a zip archive without torch.save's records, or damaged"),
])
def test_a_pth_that_is_no_checkpoint_says_what_it_is_not(content, said, tmp_path):
    from vit_core.errors import WeightsError
    from vit_core.loading.weights import read_state_dict

    path = tmp_path / "model.pth"
    path.write_bytes(content)
    with pytest.raises(WeightsError) as caught:
        read_state_dict(path)
    assert str(caught.value) == f"model.pth is not a PyTorch checkpoint ({said})."


@pytest.mark.parametrize("name", ["hf-hub:../../etc/passwd", "hf-hub:", "hf-hub:a/b/c", "hf-hub:owner/na..me"])
def test_a_hub_name_that_is_no_repository_id_is_one_line(name, image, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, _, errors = _run(capsys, "analyze", image, "--model", name, "--device", "cpu", "--out", tmp_path)
    assert status == 2
    _one_line(errors, "is not a Hugging Face hub id")


# ---------------------------------------------------------------------------------- manifests and parts


@pytest.fixture(scope="module")
def parts_run(tmp_path_factory) -> Path:
    """A finished two-shard run over four labelled images: its output folder, with parts/."""
    images = tmp_path_factory.mktemp("images")
    for index in range(4):
        (images / str(index % 2)).mkdir(exist_ok=True)
        drawn_image(index, (96, 96)).save(images / str(index % 2) / f"{index}.png")
    out = tmp_path_factory.mktemp("run")
    assert core_cli.main(["dataset", str(images), *DATASET, "--out", str(out), "--shards", "2"]) == 0
    (out / "images").symlink_to(images)
    return out


def _copy(parts_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(parts_run / "parts", copy / "parts")
    return copy


def _edit_manifest(folder: Path, change) -> None:
    path = folder / "parts" / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _edit_part(folder: Path, change) -> None:
    path = folder / "parts" / "shard-0001-of-0002.npz"
    with np.load(path) as npz:
        arrays = {key: npz[key] for key in npz.files}
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _all_nan(arrays):
    for key, value in arrays.items():
        if value.dtype.kind == "f":
            arrays[key] = np.full_like(value, np.nan)


MANIFESTS = {
    "shards 0": lambda m: m.update(shards=0), "shards -1": lambda m: m.update(shards=-1),
    "shards abc": lambda m: m.update(shards="abc"), "shards []": lambda m: m.update(shards=[]),
    "shards 10**9": lambda m: m.update(shards=10**9), "num_images text": lambda m: m.update(num_images="4"),
    "no geometry": lambda m: m.pop("geometry"), "geometry of text": lambda m: m["geometry"].update(num_layers="4"),
    "geometry without heads": lambda m: m["geometry"].pop("num_heads"), "empty": lambda m: m.clear(),
}
PARTS = {
    "empty": None, "no files_sha256": lambda a: a.pop("files_sha256"), "all NaN": _all_nan,
    "(4, 8) as (4, 1)": lambda a: a.update(distance_total=a["distance_total"][:, :1]),
    "renorm (4, 8) as (4, 1)": lambda a: a.update(distance_renorm_squares=a["distance_renorm_squares"][:, :1]),
    "a row short": lambda a: a.update(rows_file=a["rows_file"][:1]),
    "labels as floats": lambda a: a.update(rows_label=a["rows_label"].astype(np.float64)),
    "count of another": lambda a: a.update(distance_count=np.asarray(7)),
    "hex garbage": lambda a: a.update(distance_total=np.full(a["distance_total"].shape, "zz")),
    "another shard": lambda a: a.update(shard=np.asarray(2)),
}


@pytest.mark.parametrize("what", list(MANIFESTS))
def test_merge_and_a_rerun_refuse_a_malformed_manifest_in_one_line(what, parts_run, tmp_path, capsys):
    folder = _copy(parts_run, tmp_path)
    _edit_manifest(folder, MANIFESTS[what])
    status, _, errors = _run(capsys, "merge", folder, "--out", tmp_path / "merged")
    assert status == 2 and not (tmp_path / "merged" / "dataset.npz").exists()
    _one_line(errors, "manifest.json")
    with pytest.raises(PartsError):
        PartStore(folder).manifest()


def test_a_rerun_into_a_folder_with_a_malformed_manifest_is_one_line(parts_run, tmp_path, capsys):
    folder = _copy(parts_run, tmp_path)
    _edit_manifest(folder, MANIFESTS["shards abc"])
    status, _, errors = _run(capsys, "dataset", parts_run / "images", *DATASET, "--out", folder)
    assert status == 2 and not (folder / "dataset.npz").exists()
    _one_line(errors, "manifest.json", "shards must be a whole number")


@pytest.mark.parametrize("what", list(PARTS))
def test_merge_refuses_a_malformed_part_in_one_line_never_broadcast(what, parts_run, tmp_path, capsys):
    folder = _copy(parts_run, tmp_path)
    if PARTS[what] is None:
        (folder / "parts" / "shard-0001-of-0002.npz").write_bytes(b"")
    else:
        _edit_part(folder, PARTS[what])
    status, _, errors = _run(capsys, "merge", folder, "--out", tmp_path / "merged")
    assert status == 2 and not (tmp_path / "merged" / "dataset.npz").exists()
    _one_line(errors, "shard-0001-of-0002.npz", "run that shard again")


def test_a_rerun_over_a_damaged_part_is_one_line(parts_run, tmp_path, capsys):
    folder = _copy(parts_run, tmp_path)
    _edit_part(folder, PARTS["(4, 8) as (4, 1)"])
    status, lines, errors = _run(capsys, "dataset", parts_run / "images", *DATASET, "--out", folder)
    assert status == 2 and lines[0] == f"2 of 2 shards already done in {folder / 'parts'}: skipped"
    _one_line(errors, "shard-0001-of-0002.npz", "distance_total is not exact sums of shape (4, 8)")


def test_the_untouched_parts_still_merge(parts_run, tmp_path, capsys):
    status, lines, errors = _run(capsys, "merge", _copy(parts_run, tmp_path), "--out", tmp_path / "merged")
    assert status == 0 and errors == [] and lines[0].startswith("4 images analysed")
