"""`python -m vit_core dataset` (and `vit-lens dataset`): the files of interface.md "Many images", checked
against per-image results of the Python API; failures reported and skipped; --limit, --device, exit codes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from conftest import COMMAND_TIMEOUT, drawn_image
from vit_core import __main__ as core_cli
from vit_core import analyses, load_model, loading, run_with_capture

MODEL = ("--model", "vit_tiny_patch16_224", "--random-init")
L, H = 12, 3  # vit_tiny_patch16_224: 12 blocks of 3 heads, 14 x 14 patches of 16 px, one class token
# Class-named subfolders in the three conventions: an index, a label's first part (ImageNet 0 is "tench,
# Tinca tinca"), an ImageNet synset id (n01443537: goldfish, class 1). Sorted order is this order.
IMAGES = {"0/a.png": 0, "0/b.jpg": 0, "n01443537/d.png": 1, "tench/c.png": 0}
FAILURES = ("unlabelled/notes.png",)  # not an image, under a folder that names no class


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    for seed, name in enumerate(IMAGES):
        (root / name).parent.mkdir(exist_ok=True)
        drawn_image(seed).save(root / name, quality=95)
    (root / "unlabelled").mkdir()
    (root / "unlabelled" / "notes.png").write_text("not an image")
    (root / "readme.txt").write_text("not an image suffix: not listed")
    return root


@pytest.fixture(scope="module")
def per_image(folder):
    """Each image's capture through the Python API: what the dataset values must be the means of."""
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, device="cpu")
    from vit_core.images import load_image

    return loaded, {name: run_with_capture(loaded, load_image(folder / name)) for name in IMAGES}


def _dataset(capsys, *args) -> tuple[int, list[str]]:
    """The command run in this process; its exit status and its stderr lines."""
    status = core_cli.main(["dataset", *map(str, args)])
    return status, capsys.readouterr().err.strip().splitlines()


def _distances(loaded, caps, renormalize=False) -> np.ndarray:
    g = loaded.geometry
    return np.stack([analyses.mean_attention_distance(cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size, renormalize)
                     for cap in caps])  # (images, L, H)


def test_dataset_writes_the_interface_files_equal_to_per_image_means_and_reports_failures(folder, per_image, tmp_path,
                                                                                          capsys):
    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path / "out", "--device", "cpu", "--batch-size", "3",
                              "--workers", "0")
    assert status == 2
    assert len(errors) == 1 and "notes.png" in errors[0] and "Traceback" not in "".join(errors)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "classes.csv", "dataset.json", "dataset.npz", "images.csv", "mean_attention_distance.png", "parts"]
    assert sorted(p.name for p in (tmp_path / "out" / "parts").iterdir()) == ["manifest.json", "shard-0001-of-0001.npz"]

    arrays = np.load(tmp_path / "out" / "dataset.npz")
    expected = {"num_images": (np.int64, ()), "mean_attention_distance": (np.float32, (L, H)),
                "mean_attention_distance_std": (np.float32, (L, H)), "mean_attention_distance_renorm": (np.float32, (L, H)),
                "high_norm_rate": (np.float32, (L + 1,)), "accuracy": (np.float64, ()),
                "logit_lens_accuracy": (np.float32, (L + 1,)), "class_images": (np.int64, (1000,)),
                "class_correct": (np.int64, (1000,)), "confusion": (np.int64, (arrays["confusion"].shape[0], 3))}
    assert set(arrays.files) == set(expected)
    for key, (dtype, shape) in expected.items():
        assert arrays[key].dtype == dtype and arrays[key].shape == shape, key

    loaded, caps = per_image
    distances = _distances(loaded, caps.values())
    assert int(arrays["num_images"]) == len(IMAGES)
    np.testing.assert_allclose(arrays["mean_attention_distance"], distances.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(arrays["mean_attention_distance_std"], distances.std(axis=0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(arrays["mean_attention_distance_renorm"],
                               _distances(loaded, caps.values(), renormalize=True).mean(axis=0), rtol=1e-4)
    from vit_core import explain

    rates = [analyses.high_norm_rate(explain.token_norms(cap), loaded.geometry.num_prefix_tokens) for cap in caps.values()]
    np.testing.assert_allclose(arrays["high_norm_rate"], np.mean(rates, axis=0), atol=1e-6)
    top1 = {name: int(np.argmax(cap.logits)) for name, cap in caps.items()}
    assert float(arrays["accuracy"]) == pytest.approx(np.mean([top1[n] == label for n, label in IMAGES.items()]))

    summary = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert summary["model"] == "vit_tiny_patch16_224" and summary["weights"] == "random init (seed 0)"
    assert summary["device"] == "CPU" and summary["num_images"] == len(IMAGES)
    assert len(summary["failures"]) == 1 and "notes.png" in summary["failures"][0]
    # every skipped file, with its reason: the text file (not an image) and the .png that is not one
    assert summary["num_skipped"] == 2 and [s["file"] for s in summary["skipped"]] == ["readme.txt", "unlabelled/notes.png"]
    assert summary["skipped"][0]["reason"].startswith("Not an image (a .txt file)")

    # the per-image table: one row per analysed image in sorted order, true and predicted class, probability
    with open(tmp_path / "out" / "images.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["file"] for row in rows] == sorted(IMAGES)
    probs = {name: float(np.max(analyses.softmax(cap.logits))) for name, cap in caps.items()}
    for row in rows:
        assert int(row["label"]) == IMAGES[row["file"]] and int(row["predicted"]) == top1[row["file"]]
        assert row["predicted_name"] == loaded.label(top1[row["file"]]) and row["label_name"] == loaded.label(int(row["label"]))
        assert float(row["probability"]) == pytest.approx(probs[row["file"]], rel=1e-4)
        assert int(row["correct"]) == int(top1[row["file"]] == IMAGES[row["file"]])
    # per class: images and correct ones; the confusion cells (true, predicted, images) add up to the labelled images
    with open(tmp_path / "out" / "classes.csv", newline="") as f:
        classes = {int(row["class"]): row for row in csv.DictReader(f)}
    assert set(classes) == {0, 1} and int(classes[0]["images"]) == 3 and int(classes[1]["images"]) == 1
    for label, row in classes.items():
        hits = sum(top1[n] == label for n, t in IMAGES.items() if t == label)
        assert int(row["correct"]) == hits and float(row["accuracy"]) == pytest.approx(hits / int(row["images"]))
        assert int(arrays["class_images"][label]) == int(row["images"]) and int(arrays["class_correct"][label]) == hits
    cells = {(t, p): n for t, p, n in arrays["confusion"].tolist()}
    expected_cells: dict = {}
    for name, label in IMAGES.items():
        expected_cells[label, top1[name]] = expected_cells.get((label, top1[name]), 0) + 1
    assert cells == expected_cells
    assert (tmp_path / "out" / "mean_attention_distance.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_limit_takes_the_first_images_in_sorted_order(folder, per_image, tmp_path, capsys):
    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path, "--device", "cpu", "--limit", "2", "--workers", "0")
    assert status == 0 and errors == []  # notes.png comes after the first two: not read, no failure
    arrays = np.load(tmp_path / "dataset.npz")
    loaded, caps = per_image
    assert int(arrays["num_images"]) == 2
    np.testing.assert_allclose(arrays["mean_attention_distance"],
                               _distances(loaded, [caps["0/a.png"], caps["0/b.jpg"]]).mean(axis=0), rtol=1e-4)
    assert json.loads((tmp_path / "dataset.json").read_text())["failures"] == []


def test_explain_adds_the_mean_aucs_of_every_method_and_the_random_baseline(folder, per_image, tmp_path, capsys):
    from vit_core import explain
    from vit_core.images import load_image

    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path, "--device", "cpu", "--limit", "1", "--explain",
                              "--steps", "3", "--workers", "0")
    assert status == 0, errors
    arrays = np.load(tmp_path / "dataset.npz")
    loaded, _ = per_image
    image = load_image(folder / "0" / "a.png")
    relevance = explain.relevance_maps(loaded, image)
    faith = explain.faithfulness(loaded, image, relevance.maps, relevance.target, steps=3)
    assert set(faith.deletion_auc) >= {"raw_attention", "rollout", "chefer", "gradcam", "random"}
    for name in faith.deletion_auc:
        assert arrays[f"deletion_auc_{name}"].dtype == np.float64 and arrays[f"deletion_auc_{name}"].shape == ()
        assert float(arrays[f"deletion_auc_{name}"]) == pytest.approx(faith.deletion_auc[name], abs=1e-5)
        assert float(arrays[f"insertion_auc_{name}"]) == pytest.approx(faith.insertion_auc[name], abs=1e-5)
    assert set(json.loads((tmp_path / "dataset.json").read_text())["faithfulness"]) == set(faith.deletion_auc)


def object_mask(size: tuple[int, int], box: tuple[int, int, int, int]) -> Image.Image:
    """A black-and-white mask of `size` (width, height), the box (left, top, right, bottom) white."""
    mask = Image.new("L", size, 0)
    ImageDraw.Draw(mask).rectangle(box, fill=255)
    return mask


def test_masks_add_every_methods_localisation_and_the_folders_verdicts(folder, per_image, tmp_path, capsys):
    """--masks DIR: the mask of FOLDER/0/a.png is DIR/0/a.png; an image without one has no localisation scores. The
    means are explain.judge's over the images that have each key, and dataset.json says which method to trust."""
    from vit_core import explain
    from vit_core.images import load_image

    masks = tmp_path / "masks"
    (masks / "0").mkdir(parents=True)
    image = load_image(folder / "0" / "a.png")
    object_mask(image.size, (40, 30, 200, 180)).save(masks / "0" / "a.png")
    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path / "out", "--device", "cpu", "--limit", "2",
                              "--explain", "--steps", "3", "--workers", "0", "--masks", masks, "--tests", "all")
    assert status == 0, errors
    arrays = np.load(tmp_path / "out" / "dataset.npz")
    loaded, _ = per_image
    expected = {}
    for name, mask in (("0/a.png", explain.mask_from_file(masks / "0" / "a.png")), ("0/b.jpg", None)):
        picture = load_image(folder / name)
        relevance = explain.relevance_maps(loaded, picture)
        objects = None if mask is None else explain.object_patches(loaded, mask, picture.size)
        judged = explain.judge(loaded, picture, relevance.maps, relevance.target, mask=objects, steps=3,
                               tests=explain.FAITHFULNESS_TESTS)
        for key, value in explain.judgement_scalars(judged).items():
            expected.setdefault(key, []).append(value)
    assert {"pointing_game_chefer", "relevance_mass_attnlrp", "relevance_rank_random", "saco_cplrp", "srg_gradcam",
            "pixel_deletion_auc_rollout"} <= set(expected)
    assert len(expected["relevance_mass_chefer"]) == 1 and len(expected["deletion_auc_chefer"]) == 2  # one mask
    for key, values in expected.items():
        assert float(arrays[key]) == pytest.approx(np.mean(values), abs=1e-5), key
    trust = json.loads((tmp_path / "out" / "dataset.json").read_text())["which_to_trust"]
    folder_judged = explain.folder_judgement({key: float(np.mean(values)) for key, values in expected.items()})
    assert set(trust["methods"]) == set(folder_judged.methods)
    for row in folder_judged.rows():
        for t in folder_judged.tests:
            assert trust["methods"][row["method"]][t]["rank"] == pytest.approx(row[f"{t}_rank"])
    assert set(trust["agreement"]) == {f"{a} vs {b}" for a, b in folder_judged.agreement}


def test_analyze_with_a_mask_adds_the_localisation_and_a_bad_mask_is_one_line(folder, per_image, tmp_path, capsys):
    from vit_core import explain
    from vit_core.images import load_image

    image = load_image(folder / "0" / "a.png")
    object_mask(image.size, (40, 30, 200, 180)).save(tmp_path / "mask.png")
    status = core_cli.main(["analyze", str(folder / "0" / "a.png"), *MODEL, "--out", str(tmp_path / "out"), "--device",
                            "cpu", "--explain", "--steps", "3", "--mask", str(tmp_path / "mask.png")])
    assert status == 0, capsys.readouterr().err
    arrays = np.load(tmp_path / "out" / "a.npz")
    loaded, _ = per_image
    objects = explain.object_patches(loaded, explain.mask_from_file(tmp_path / "mask.png"), image.size)
    np.testing.assert_array_equal(arrays["object_patches"], objects)
    relevance = explain.relevance_maps(loaded, image)
    for method, relevance_map in relevance.maps.items():
        assert float(arrays[f"pointing_game_{method}"]) == explain.pointing_game(relevance_map, objects)
        assert float(arrays[f"relevance_mass_{method}"]) == pytest.approx(explain.relevance_mass(relevance_map, objects))
    described = json.loads((tmp_path / "out" / "a.json").read_text())
    assert set(described["localisation"]) == {*relevance.maps, "random"}

    grey = np.full((image.size[1], image.size[0]), 128, np.uint8)
    Image.fromarray(grey).save(tmp_path / "grey.png")
    status = core_cli.main(["analyze", str(folder / "0" / "a.png"), *MODEL, "--out", str(tmp_path / "out2"), "--device",
                            "cpu", "--explain", "--steps", "3", "--mask", str(tmp_path / "grey.png")])
    errors = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(errors) == 1 and "grey.png" in errors[0] and "grey" in errors[0]
    status = core_cli.main(["analyze", str(folder / "0" / "a.png"), str(folder / "0" / "b.jpg"), *MODEL, "--explain",
                            "--mask", str(tmp_path / "mask.png")])
    errors = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and errors == ["vit_core: --mask: 1 mask(s) for 2 image(s); give one per image, in the same order"]


def test_steps_without_explain_and_a_missing_folder_are_one_line_and_exit_2(folder, tmp_path, capsys):
    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path / "out", "--steps", "3")
    assert status == 2 and errors == ["vit_core: --steps, --tests and --masks need --explain"]
    status, errors = _dataset(capsys, tmp_path / "nowhere", *MODEL, "--out", tmp_path / "out")
    assert status == 2 and len(errors) == 1 and "nowhere" in errors[0] and "not a folder" in errors[0]
    status, errors = _dataset(capsys, tmp_path, *MODEL, "--out", tmp_path / "out", "--device", "cpu")  # no images at all
    assert status == 2 and len(errors) == 1 and "no images" in errors[0]
    assert not (tmp_path / "out" / "dataset.npz").exists()


@pytest.mark.parametrize("command", ["analyze", "dataset"])
@pytest.mark.parametrize("device", ["tpu", "cuda:7"])
def test_a_bad_or_missing_device_is_one_line_and_exit_2_before_any_load(command, device, folder, tmp_path, capsys,
                                                                        monkeypatch):
    loads = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))  # where the CLI takes it from
    target = folder / "0" / "a.png" if command == "analyze" else folder
    status = core_cli.main([command, str(target), *MODEL, "--out", str(tmp_path / "out"), "--device", device])
    errors = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(errors) == 1 and errors[0].startswith("vit_core: --device:") and repr(device) in errors[0]
    assert loads == [] and not (tmp_path / "out").exists()


def test_analyze_names_its_device_in_the_json(folder, tmp_path, capsys):
    status = core_cli.main(["analyze", str(folder / "0" / "a.png"), *MODEL, "--out", str(tmp_path), "--device", "cpu"])
    assert status == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "a.json").read_text())["device"] == "CPU"


def test_an_output_that_cannot_be_written_is_one_line_and_the_other_files_are_written(folder, tmp_path, capsys):
    (tmp_path / "dataset.json").mkdir()
    status, errors = _dataset(capsys, folder, *MODEL, "--out", tmp_path, "--device", "cpu", "--limit", "1", "--workers", "0")
    assert status == 2 and len(errors) == 1 and "dataset.json" in errors[0] and "Is a directory" in errors[0]
    assert (tmp_path / "dataset.npz").is_file() and (tmp_path / "mean_attention_distance.png").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_progress_is_shown_on_a_terminal(folder, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    status = core_cli.main(["dataset", str(folder), *MODEL, "--out", str(tmp_path), "--device", "cpu", "--limit", "3",
                            "--batch-size", "2", "--workers", "0"])
    assert status == 0
    assert "3/3" in terminal.getvalue() and "100%" in terminal.getvalue()


def _installed_command() -> Path:
    """The `vit-lens` script pip installed beside this interpreter (the project is installed into the test venv)."""
    script = Path(sys.executable).parent / "vit-lens"
    assert script.is_file(), f"{script} missing: install the project (pip install -e .)"
    return script


@pytest.mark.live  # the installed `vit-lens` command, with worker processes
def test_installed_vit_lens_dataset_decodes_in_worker_processes_with_no_bar_off_a_terminal(folder, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    help_text = subprocess.run([_installed_command(), "dataset", "--help"], capture_output=True, text=True, timeout=120,
                               env=env)
    assert help_text.returncode == 0 and help_text.stdout.startswith("usage: vit-lens dataset")
    assert all(option in help_text.stdout for option in ("--batch-size", "--device", "--limit", "--workers", "--explain"))

    result = subprocess.run([_installed_command(), "dataset", folder, *MODEL, "--out", tmp_path, "--device", "cpu",
                             "--workers", "2", "--batch-size", "2"], capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "notes.png" in result.stderr  # the one failure, no progress bar
    assert int(np.load(tmp_path / "dataset.npz")["num_images"]) == len(IMAGES)


def test_a_run_whose_reader_has_left_writes_every_file_and_ends_with_status_0(tmp_path):
    """`vit-lens dataset ... | head -1`: head leaves after the first progress line. The run ended with "Broken pipe",
    status 2 and only parts/ written; the rest of what it prints is now dropped and the run finishes. Here the pipe's
    reader is gone before the command starts, so every write it makes meets the closed pipe."""
    images = tmp_path / "images"
    images.mkdir()
    for index in range(6):
        drawn_image(index, (64, 64)).save(images / f"{index}.png")
    reader, writer = os.pipe()
    os.close(reader)
    try:
        result = subprocess.run([sys.executable, "-m", "vit_core", "dataset", images, *MODEL, "--out", tmp_path / "out",
                                 "--device", "cpu", "--workers", "0"], stdout=writer, stderr=writer,
                                timeout=COMMAND_TIMEOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    finally:
        os.close(writer)
    assert result.returncode == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"dataset.npz", "dataset.json", "images.csv"}
    assert int(np.load(tmp_path / "out" / "dataset.npz")["num_images"]) == 6


def test_a_file_larger_than_any_input_is_one_line_and_the_other_images_are_analysed(tmp_path, capsys):
    """The decoder reads each listed file as a regular file of at most images.MAX_FILE_BYTES (files.read_input):
    a larger one (sparse here: nothing written) is a failure in one line, refused from its size, unread."""
    from vit_core.images import MAX_FILE_BYTES

    images = tmp_path / "images"
    images.mkdir()
    drawn_image(1).save(images / "a.png")
    with open(images / "b.png", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    status, errors = _dataset(capsys, images, *MODEL, "--out", tmp_path / "out", "--device", "cpu", "--workers", "0")
    assert status == 2 and len(errors) == 1, errors
    assert errors[0].endswith(f"b.png: {MAX_FILE_BYTES + 1:,} bytes, more than the {MAX_FILE_BYTES:,} an input may "
                              "have, so it was skipped."), errors
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["num_images"] == 1


# ---------------------------------------------------------------------------------- the command's manners


def _after_the_count(stdout: str) -> list[str]:
    """The lines after "N images analysed -> DIR" (the progress lines come before it)."""
    lines = stdout.splitlines()
    ends = [i for i, line in enumerate(lines) if " images analysed" in line]
    assert len(ends) == 1, lines
    return lines[ends[0] + 1:]


def test_a_labelled_run_ends_with_its_accuracy_and_the_logit_lens_best_layer(folder, tmp_path, capsys):
    status = core_cli.main(["dataset", str(folder), *MODEL, "--out", str(tmp_path), "--device", "cpu", "--workers", "0"])
    assert status == 2  # notes.png
    tail = _after_the_count(capsys.readouterr().out)
    arrays = np.load(tmp_path / "dataset.npz")
    with open(tmp_path / "images.csv", newline="") as f:
        correct = sum(int(row["correct"]) for row in csv.DictReader(f) if row["label"] != "")
    lens = arrays["logit_lens_accuracy"]  # row 0: the embeddings, row b + 1: after block b
    best = int(np.argmax(lens))
    where = "on the embeddings" if best == 0 else f"after block {best - 1}"
    assert tail == [f"top-1 accuracy {float(arrays['accuracy']):.1%} ({correct} of {len(IMAGES)} labelled images); "
                    f"logit lens best {where} ({float(lens[best]):.1%})"]


def test_an_explained_run_ends_with_which_to_trust_and_an_unlabelled_one_without_accuracy(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    for seed in range(2):
        drawn_image(seed).save(tmp_path / "images" / f"{seed}.png")  # no class folders: no labels
    status = core_cli.main(["dataset", str(tmp_path / "images"), *MODEL, "--out", str(tmp_path / "out"), "--device",
                            "cpu", "--workers", "0", "--explain", "--steps", "2"])
    assert status == 0
    tail = _after_the_count(capsys.readouterr().out)
    trust = json.loads((tmp_path / "out" / "dataset.json").read_text())["which_to_trust"]["methods"]
    share = {m: np.mean([trust[m][t]["beats_random_share"] for t in ("deletion_auc", "insertion_auc")]) for m in trust}
    assert len(tail) == 1 and tail[0].startswith("which to trust, images where the map beats random (mean over "
                                                 "deletion_auc, insertion_auc): ")
    printed = [item.rsplit(" ", 1) for item in tail[0].split(": ", 1)[1].split(", ")]
    assert [m for m, _ in printed] == sorted(share, key=lambda m: -share[m])  # most often better than random first
    assert all(text == f"{share[m]:.0%}" for m, text in printed)


def test_ctrl_c_ends_a_run_in_one_line_with_exit_130_and_a_rerun_finishes_it(tmp_path):
    """Ctrl-C reaches the terminal's whole process group: the command, its DataLoader worker and their decode
    workers. It printed 97 lines of tracebacks; now one line, exit status 130, and the parts done stay for a rerun."""
    import signal
    import time

    images = tmp_path / "images"
    for index in range(36):
        (images / str(index % 3)).mkdir(parents=True, exist_ok=True)
        drawn_image(index, (64, 64)).save(images / str(index % 3) / f"{index}.png")
    out = tmp_path / "out"
    command = [_installed_command(), "dataset", images, *MODEL, "--out", out, "--device", "cpu", "--shards", "18",
               "--batch-size", "2", "--workers", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)  # its own process group, as a terminal's foreground job has
    try:
        deadline = time.monotonic() + 240
        while not list((out / "parts").glob("shard-*.npz")) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert run.poll() is None, "the run ended before a shard was done: nothing to interrupt"
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("shard-*.npz")}
    assert run.returncode == 130, stderr
    assert 1 <= len(kept) < 18, "interrupted after the first shard and before the last"
    assert stderr == f"vit-lens: interrupted; {len(kept)} of 18 shards kept in {out / 'parts'}, rerun to finish\n"
    assert not (out / "dataset.npz").exists()

    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert f"{len(kept)} of 18 shards already done in {out / 'parts'}: skipped" in again.stdout
    assert {name: (out / "parts" / name).stat().st_mtime_ns for name in kept} == kept  # not analysed again
    assert int(np.load(out / "dataset.npz")["num_images"]) == 36
