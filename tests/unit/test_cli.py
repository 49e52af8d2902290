"""`python -m vit_core analyze`: the export format of interface.md, and failures that don't stop the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import COMMAND_TIMEOUT, REPO, drawn_image
from vit_core import ImageError, analyses, load_model, loading, run_with_capture
from vit_core.images import MAX_FILE_BYTES


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "vit_core", "analyze", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT)


def test_analyze_writes_the_interface_format_and_reports_failures(tmp_path):
    drawn_image(3).save(tmp_path / "scene.png")
    (tmp_path / "notes.jpg").write_text("not an image")
    result = run_cli(tmp_path / "scene.png", tmp_path / "notes.jpg", tmp_path / "missing.png",
                     "--model", "vit_tiny_patch16_224", "--random-init", "--out", tmp_path / "out", "--topk", "3", cwd=tmp_path)

    assert result.returncode == 2
    errors = result.stderr.strip().splitlines()
    # the missing file is said first, before the model loads, naming it once; the unreadable one when its turn comes
    assert errors[0] == f"vit_core: {tmp_path / 'missing.png'}: No such file or directory."
    assert len(errors) == 2 and "notes.jpg" in errors[1]
    assert "Traceback" not in result.stderr

    arrays = np.load(tmp_path / "out" / "scene.npz")
    L, H, T, D, N = 12, 3, 197, 192, 196
    expected = {
        "input_image": (np.uint8, (224, 224, 3)), "logits": (np.float32, (1000,)), "probs": (np.float32, (1000,)),
        "pattern": (np.float32, (L, H, T, T)), "tokens": (np.float32, (L + 1, T, D)), "grid": (np.int64, (2,)),
        "patch_size": (np.int64, (2,)), "num_prefix_tokens": (np.int64, ()),
        "mean_attention_distance": (np.float32, (L, H)), "mean_attention_distance_renorm": (np.float32, (L, H)),
        "rollout": (np.float32, (14, 14)), "pos_embed_similarity": (np.float32, (N, 14, 14)),
        "filters_pca": (np.float32, (28, 16, 16, 3)), "filters_pca_explained": (np.float32, (28,)),
    }
    assert set(arrays.files) == set(expected)
    for key, (dtype, shape) in expected.items():
        assert arrays[key].dtype == dtype and arrays[key].shape == shape, key

    # The same numbers as the Python API on the same image and model.
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0)
    cap = run_with_capture(loaded, drawn_image(3))
    np.testing.assert_allclose(arrays["logits"], cap.logits, atol=1e-5)
    np.testing.assert_allclose(arrays["rollout"], analyses.attention_rollout(cap.pattern, 1, (14, 14)), atol=1e-6)
    assert arrays["grid"].tolist() == [14, 14] and int(arrays["num_prefix_tokens"]) == 1

    summary = json.loads((tmp_path / "out" / "scene.json").read_text())
    assert summary["model"] == "vit_tiny_patch16_224" and summary["weights"] == "random init (seed 0)"
    assert len(summary["topk"]) == 3
    best = int(np.argmax(arrays["probs"]))
    assert summary["topk"][0]["index"] == best and summary["topk"][0]["label"] == loaded.labels[best]
    assert summary["topk"][0]["prob"] == np.float32(arrays["probs"][best]).item()
    # One line per image done on stdout: the image, its top-1 with its probability, where the results went.
    out = tmp_path / "out"
    assert result.stdout.splitlines() == [f"{tmp_path / 'scene.png'}: {loaded.labels[best]} "
                                          f"({float(arrays['probs'][best]):.1%}) -> {out / 'scene.npz'}, {out / 'scene.json'}"]


def test_unsupported_model_is_one_line_and_exit_2(tmp_path):
    drawn_image(0).save(tmp_path / "a.png")
    result = run_cli(tmp_path / "a.png", "--model", "resnet50", "--random-init", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not a Vision Transformer" in result.stderr


def test_vit_lens_offers_vit_cores_own_subcommands_and_the_dashboard(capsys):
    from dashboard import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: vit-lens") and "analyze" in out and "dashboard" in out
    from vit_core import __main__ as core_cli

    with pytest.raises(SystemExit):
        cli.main(["analyze", "--help"])
    ours = capsys.readouterr().out.split()
    with pytest.raises(SystemExit):
        core_cli.main(["analyze", "--help"])
    theirs = capsys.readouterr().out.replace("python -m vit_core", "vit-lens").split()
    assert ours == theirs  # the very same parser (word by word: argparse wraps the usage by the program name's length)


HEAVY = ("torch", "timm", "numpy", "PIL", "streamlit")


@pytest.mark.parametrize("command", [
    "from dashboard import cli; cli.main(['--help'])",
    "from dashboard import cli; cli.main(['analyze', '--help'])",
    "from vit_core import __main__ as core_cli; core_cli.main(['dataset', '--help'])",
    "from vit_core import __main__ as core_cli; core_cli.main(['concepts', '--help'])",
    "from vit_core import __main__ as core_cli; core_cli.main(['compare', '--help'])",
])
def test_help_answers_without_importing_torch_or_timm(command):
    """`vit-lens --help` took 7-10 s on 2 cores: it imported timm (and torch) before argparse ran."""
    script = f"""
import sys
import textwrap
try:
    {command}
except SystemExit as done:
    assert done.code == 0, done.code
print(",".join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ") and "--help" in result.stdout
    assert result.stderr.strip() == "", f"--help imported {result.stderr.strip()}"


def test_the_parsers_defaults_are_the_defining_modules_values():
    """The parser spells its defaults out (so that --help imports nothing heavy): they must stay the modules' own."""
    from vit_core import __main__ as core_cli
    from vit_core import dataset, explain, export, loading
    from vit_core.runtime import devices

    assert core_cli.DEFAULT_MODEL == loading.DEFAULT_MODEL
    assert core_cli.TEACHING_MODEL == loading.TEACHING_MODEL
    assert core_cli.DEVICE_CHOICES == devices.DEVICE_CHOICES
    assert core_cli.DEFAULT_STEPS == explain.DEFAULT_STEPS
    assert core_cli.FAITHFULNESS_TESTS == explain.FAITHFULNESS_TESTS
    assert core_cli.EXPORT_TESTS == export.EXPORT_TESTS
    assert core_cli.TABLE_FORMATS == dataset.TABLE_FORMATS
    from vit_core.concepts import circuit

    assert (core_cli.MAX_LAYERS, core_cli.CIRCUIT_IMAGES) == (circuit.MAX_LAYERS, circuit.CIRCUIT_IMAGES)


def test_a_model_without_a_classifier_head_says_so_instead_of_naming_features_as_classes(tmp_path, capsys, monkeypatch):
    """DINOv2 (num_classes 0) printed its strongest pooled feature as if it were a class."""
    from vit_core import __main__ as core_cli

    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: real(*a, **k, num_classes=0, depth=1))
    drawn_image(1).save(tmp_path / "scene.png")
    status = core_cli.main(["analyze", str(tmp_path / "scene.png"), "--model", "vit_tiny_patch16_224", "--random-init",
                            "--out", str(tmp_path / "out")])
    assert status == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{tmp_path / 'scene.png'}: no classifier head (the model outputs 192 pooled features, not classes) "
                     f"-> {tmp_path / 'out' / 'scene.npz'}, {tmp_path / 'out' / 'scene.json'}"]
    summary = json.loads((tmp_path / "out" / "scene.json").read_text())
    assert summary["classifier_head"] is False and summary["topk"] == [], "no pooled feature listed as a class"


def test_vit_lens_dashboard_hands_every_option_to_streamlit(monkeypatch):
    from dashboard import cli, serve

    seen = []
    monkeypatch.setattr(serve, "main", lambda argv, whole_process: seen.append((argv, whole_process)))
    assert cli.main(["dashboard", "--server.port", "8502", "--client.toolbarMode=minimal"]) == 0
    # called from inside another program (this test), the server must not replace that program's process
    assert seen == [(["--server.port", "8502", "--client.toolbarMode=minimal"], False)]


def test_analyze_explain_writes_the_explanation_keys(tmp_path):
    drawn_image(5).save(tmp_path / "scene.png")
    result = run_cli(tmp_path / "scene.png", "--model", "vit_tiny_patch16_224", "--random-init", "--out", tmp_path / "out",
                     "--explain", "--target", "7", "--steps", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    arrays = np.load(tmp_path / "out" / "scene.npz")
    L, T, C = 12, 197, 1000
    methods = ["raw_attention", "rollout", "chefer", "gradcam", "attnlrp", "cplrp"]
    expected = {"target": (np.int64, ()), "logit_lens": (np.float32, (L + 1, C)), "token_norms": (np.float32, (L + 1, T)),
                **{f"relevance_{m}": (np.float32, (14, 14)) for m in methods},
                **{f"{curve}_{m}": (np.float32, (3,)) for curve in ("deletion", "insertion") for m in [*methods, "random"]}}
    assert "pattern" in arrays.files  # the base keys stay
    for key, (dtype, shape) in expected.items():
        assert arrays[key].dtype == dtype and arrays[key].shape == shape, key
    assert int(arrays["target"]) == 7
    np.testing.assert_allclose(arrays["relevance_rollout"], arrays["rollout"])
    np.testing.assert_allclose(arrays["logit_lens"][-1], arrays["logits"], atol=1e-5)
    np.testing.assert_allclose(arrays["token_norms"], np.linalg.norm(arrays["tokens"], axis=-1), rtol=1e-5)

    # The same numbers as the Python API on the same image and model.
    from vit_core import explain

    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0)
    relevance = explain.relevance_maps(loaded, drawn_image(5), target=7)
    faith = explain.faithfulness(loaded, drawn_image(5), relevance.maps, 7, steps=3)
    for m in methods:
        np.testing.assert_allclose(arrays[f"relevance_{m}"], relevance.maps[m], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(arrays[f"deletion_{m}"], faith.deletion[m], atol=1e-6)
    np.testing.assert_allclose(arrays["insertion_random"], faith.insertion["random"], atol=1e-6)

    summary = json.loads((tmp_path / "out" / "scene.json").read_text())
    assert summary["target"] == 7 and set(summary["faithfulness"]) == {*methods, "random"}
    for name, aucs in summary["faithfulness"].items():
        assert aucs["deletion_auc"] == pytest.approx(faith.deletion_auc[name], abs=1e-6)
        assert aucs["insertion_auc"] == pytest.approx(faith.insertion_auc[name], abs=1e-6)
    assert summary["unsupported"] == {}
    for method, pick in summary["gamma_choice"].items():  # the gamma choice of each LRP map, as the Python API picks it
        assert pick["name"] == relevance.gamma_choice[method].name and pick["score"] == max(pick["scores"].values())
    assert set(summary["gamma_choice"]) == {"attnlrp", "cplrp"}


def test_analyze_explain_with_a_target_the_model_lacks_is_one_line_and_exit_2(tmp_path):
    drawn_image(0).save(tmp_path / "a.png")
    result = run_cli(tmp_path / "a.png", "--model", "vit_tiny_patch16_224", "--random-init", "--out", tmp_path,
                     "--explain", "--target", "1000", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "outside 0..999" in result.stderr
    result = run_cli(tmp_path / "a.png", "--model", "vit_tiny_patch16_224", "--random-init", "--target", "3", cwd=tmp_path)
    assert result.returncode == 2 and "--target, --steps, --mask and --tests need --explain" in result.stderr


# Same stems, atomic writes, an OSError on one image.

def _analyze_in_process(capsys, *args) -> tuple[int, list[str]]:
    """`python -m vit_core analyze ...` run in this process (monkeypatches reach it); exit status and stderr lines."""
    from vit_core import __main__ as core_cli

    status = core_cli.main(["analyze", *map(str, args), "--model", "vit_tiny_patch16_224", "--random-init"])
    return status, capsys.readouterr().err.strip().splitlines()


def _mean_colour(npz_path) -> list[int]:
    return np.load(npz_path)["input_image"].reshape(-1, 3).mean(axis=0).round().astype(int).tolist()


def test_inputs_that_share_a_stem_keep_their_own_results_under_the_documented_names(tmp_path, capsys):
    import hashlib
    import os

    colours = {"a/photo.jpg": (200, 30, 30), "b/photo.png": (30, 200, 30), "c/photo.jpg": (30, 30, 200),
               "c/Photo.png": (200, 200, 30), "c/alone.png": (90, 90, 90)}
    for name, colour in colours.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        Image.new("RGB", (64, 48), colour).save(tmp_path / name, quality=100)
    status, errors = _analyze_in_process(capsys, *(tmp_path / n for n in colours), "--out", tmp_path / "out")
    assert status == 0 and errors == []

    def expected_name(name):  # the module docstring's rule, written again: stem, or stem-<sha256(abspath)[:8]>
        stem = Path(name).stem
        if stem.lower() != "photo":
            return stem
        return f"{stem}-{hashlib.sha256(os.path.abspath(tmp_path / name).encode()).hexdigest()[:8]}"

    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(f"{expected_name(n)}{ext}" for n in colours for ext in (".npz", ".json"))
    for name, colour in colours.items():
        assert np.abs(np.subtract(_mean_colour(tmp_path / "out" / f"{expected_name(name)}.npz"), colour)).max() <= 2, name
        assert json.loads((tmp_path / "out" / f"{expected_name(name)}.json").read_text())["image"] == str(tmp_path / name)


def test_output_names_are_deterministic_and_the_same_file_twice_is_one_name(tmp_path, monkeypatch):
    from vit_core.__main__ import output_names

    monkeypatch.chdir(tmp_path)
    inputs = [Path("x/photo.jpg"), Path("y/photo.jpg"), Path("x/../x/photo.jpg"), Path("scene.png")]
    names = output_names(inputs)
    assert names == output_names(inputs) and names[0] == names[2] != names[1] and names[3] == "scene"
    assert all(n.startswith("photo-") and len(n) == len("photo-") + 8 for n in names[:3])
    assert output_names([Path("x/photo.jpg")]) == ["photo"]


def test_an_output_that_cannot_be_written_is_one_line_and_the_batch_carries_on(tmp_path, capsys):
    for name in ("a", "b", "c"):
        drawn_image(len(name)).save(tmp_path / f"{name}.png")
    (tmp_path / "folder.png").mkdir()  # a folder given as an image
    (tmp_path / "out" / "b.npz").mkdir(parents=True)  # b's result can't be written under its name
    status, errors = _analyze_in_process(capsys, tmp_path / "a.png", tmp_path / "b.png", tmp_path / "folder.png",
                                         tmp_path / "c.png", "--out", tmp_path / "out")
    assert status == 2
    assert len(errors) == 2 and "folder.png" in errors[0]  # a folder is said first, before the model loads
    assert "b.png" in errors[1] and "b.npz" in errors[1] and "Is a directory" in errors[1]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.json", "a.npz", "b.npz", "c.json", "c.npz"]
    assert (tmp_path / "out" / "b.npz").is_dir() and not list((tmp_path / "out" / "b.npz").iterdir())


def test_an_output_folder_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys):
    drawn_image(0).save(tmp_path / "a.png")
    (tmp_path / "taken").write_text("a file where the output folder should be")
    status, errors = _analyze_in_process(capsys, tmp_path / "a.png", "--out", tmp_path / "taken" / "out")
    assert status == 2 and len(errors) == 1 and "--out" in errors[0] and "taken" in errors[0]


def test_a_write_that_fails_midway_leaves_the_previous_result_whole(tmp_path, capsys, monkeypatch):
    import errno

    from vit_core.images import files

    drawn_image(1).save(tmp_path / "scene.png")
    assert _analyze_in_process(capsys, tmp_path / "scene.png", "--out", tmp_path / "out")[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    drawn_image(2).save(tmp_path / "scene.png")  # a new image under the same name: its results would replace the old

    def disk_full_after_half(fd, *args):  # the data is half written when the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full_after_half)
    status, errors = _analyze_in_process(capsys, tmp_path / "scene.png", "--out", tmp_path / "out")
    assert status == 2 and len(errors) == 1 and "No space left on device" in errors[0] and "scene.npz" in errors[0]
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before  # no .part left, old files whole
    np.load(tmp_path / "out" / "scene.npz")["logits"]


def test_write_atomically_replaces_whole_files_with_a_plain_files_permissions(tmp_path):
    from vit_core.images.files import write_atomically

    target = tmp_path / "r.bin"
    assert write_atomically(target, b"first") == target and target.read_bytes() == b"first"
    write_atomically(target, b"second, longer")
    assert target.read_bytes() == b"second, longer"
    (tmp_path / "plain.bin").write_bytes(b"x")
    assert target.stat().st_mode == (tmp_path / "plain.bin").stat().st_mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.bin", "r.bin"]
    with pytest.raises(FileNotFoundError) as error:
        write_atomically(tmp_path / "missing" / "r.bin", b"x")
    assert error.value.filename == str(tmp_path / "missing" / "r.bin")


def test_a_bad_setting_is_one_line_and_exit_2_before_any_load(tmp_path):
    result = subprocess.run([sys.executable, "-m", "vit_core", "analyze", "x.png", "--model", "test-tiny"],
                            capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd=tmp_path,
                            env={**os.environ, "VIT_LENS_ONEDNN_LINEAR": "sometimes"})
    assert result.returncode == 2
    assert result.stderr.strip() == "vit_core: VIT_LENS_ONEDNN_LINEAR='sometimes': use auto, on or off."


# ---------------------------------------------------------------------------------- hostile inputs and outputs


def test_inputs_that_are_not_regular_files_are_one_line_each_and_the_others_go_on(tmp_path):
    """A FIFO hung `analyze` and /dev/zero was read without limit: each is refused from its stat, unread."""
    drawn_image(3).save(tmp_path / "scene.png")
    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "folder.png").mkdir()
    result = run_cli(tmp_path / "pipe.png", "/dev/zero", tmp_path / "folder.png", tmp_path / "scene.png",
                     "--model", "vit_tiny_patch16_224", "--random-init", "--out", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2
    folder, *errors = result.stderr.strip().splitlines()  # the folder is answered before the model loads
    assert folder == (f"vit_core: {tmp_path / 'folder.png'}: a folder; analyze reads image files (for every image in a "
                      f"folder: vit-lens dataset {tmp_path / 'folder.png'})")
    assert [line.split(": ", 2)[1] for line in errors] == [str(tmp_path / "pipe.png"), "/dev/zero"]
    assert all(line.endswith("not a regular file (a folder, a FIFO or a device), so it was skipped.") for line in errors)
    assert (tmp_path / "out" / "scene.npz").is_file()


def test_inputs_are_read_up_to_a_cap(tmp_path, monkeypatch):
    from vit_core.images.files import read_input

    (tmp_path / "big.png").write_bytes(bytes(1000))
    with pytest.raises(ImageError, match=r"^1,000 bytes, more than the 999 an input may have, so it was skipped\.$"):
        read_input(tmp_path / "big.png", 999)
    assert read_input(tmp_path / "big.png", 1000) == bytes(1000)
    with (tmp_path / "sparse.png").open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # no disk: refused from its size, unread
    with pytest.raises(ImageError, match=r"^400,000,001 bytes, more than the 400,000,000 an input"):
        read_input(tmp_path / "sparse.png", MAX_FILE_BYTES)


def test_an_out_folder_that_is_a_symlink_is_refused_in_one_line(tmp_path):
    drawn_image(3).save(tmp_path / "scene.png")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    result = run_cli(tmp_path / "scene.png", "--model", "vit_tiny_patch16_224", "--random-init", "--out",
                     tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"vit_core: --out: {tmp_path / 'out'}: is a symbolic link; name the folder it points to."
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_writes_stay_in_the_output_folder_opened(tmp_path):
    """A result's name that is a symlink is replaced, not followed; the folder swapped for a link after it was
    opened still receives the writes (they are relative to the open folder)."""
    from vit_core.images.files import OutputFolder

    (tmp_path / "out").mkdir()
    (tmp_path / "secret").write_bytes(b"keep")
    (tmp_path / "out" / "r.json").symlink_to(tmp_path / "secret")
    with OutputFolder(tmp_path / "out") as out:
        out.write("r.json", b"{}")
        (tmp_path / "out").rename(tmp_path / "moved")
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
        out.write("s.json", b"{}")
    assert (tmp_path / "secret").read_bytes() == b"keep" and (tmp_path / "moved" / "r.json").read_bytes() == b"{}"
    assert (tmp_path / "moved" / "s.json").is_file() and list((tmp_path / "elsewhere").iterdir()) == []


def test_a_bad_pretrained_tag_is_one_line(tmp_path):
    drawn_image(3).save(tmp_path / "scene.png")
    result = run_cli(tmp_path / "scene.png", "--model", "vit_tiny_patch16_224.x", "--random-init", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("vit_core: vit_tiny_patch16_224.x: timm has no pretrained tag 'x' for "
                                    "vit_tiny_patch16_224 (its tags are ")
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------- the command's manners


def test_a_missing_image_is_answered_without_loading_a_model_named_once_under_the_commands_name(tmp_path):
    """`vit-lens analyze nope.jpg` loaded the model (9 s) to say "vit_core: nope.jpg: nope.jpg: No such file ...".
    Here the answer comes before torch, timm or numpy are even imported."""
    script = f"""
import sys
import textwrap
from dashboard import cli
status = cli.main(['analyze', 'nope.jpg', '--weights', 'ft.safetensors'])
print(status, ",".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.split() == ["2"], f"imported {result.stdout}"  # exit status 2, nothing heavy imported
    assert result.stderr == "vit-lens: --weights ft.safetensors: No such file or directory.\n"
    (tmp_path / "ft.safetensors").write_bytes(b"")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.split() == ["2"], f"imported {result.stdout}"
    assert result.stderr == "vit-lens: nope.jpg: No such file or directory.\n"


def test_missing_images_and_masks_are_said_first_and_the_others_analysed(tmp_path, capsys, monkeypatch):
    from vit_core import __main__ as core_cli

    loads = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k, depth=1))
    assert core_cli.main(["analyze", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--model",
                          "vit_tiny_patch16_224", "--random-init"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"vit_core: {tmp_path / n}.png: No such file or directory." for n in "ab"]
    assert loads == []  # nothing to analyse: no model loaded

    drawn_image(1).save(tmp_path / "b.png")
    drawn_image(2).save(tmp_path / "c.png")
    mask = Image.new("L", drawn_image(1).size, 0)
    mask.paste(255, (10, 10, 60, 60))  # the object: a white square
    mask.save(tmp_path / "b-mask.png")
    status = core_cli.main(["analyze", *(str(tmp_path / f"{n}.png") for n in "abc"), "--model", "vit_tiny_patch16_224",
                            "--random-init", "--out", str(tmp_path / "out"), "--explain", "--steps", "2",
                            "--mask", str(tmp_path / "a.png"), str(tmp_path / "b-mask.png"), str(tmp_path / "no-mask.png")])
    captured = capsys.readouterr()
    assert status == 2 and len(loads) == 1
    assert captured.err.splitlines() == [f"vit_core: {tmp_path / 'a.png'}: No such file or directory.",
                                         f"vit_core: {tmp_path / 'c.png'}: --mask {tmp_path / 'no-mask.png'}: "
                                         "No such file or directory."]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["b.json", "b.npz"]  # b, with its mask
    assert "relevance_mass_chefer" in np.load(tmp_path / "out" / "b.npz").files


def test_offline_the_message_names_the_option_that_picks_the_bundled_model(tmp_path, capsys, monkeypatch):
    from vit_core import OfflineError
    from vit_core import __main__ as core_cli
    from vit_core.loading.create import _offline_message

    def offline(name, **kwargs):
        raise OfflineError(_offline_message(name))

    monkeypatch.setattr(loading, "load_model", offline)
    drawn_image(0).save(tmp_path / "a.png")
    assert core_cli.main(["analyze", str(tmp_path / "a.png"), "--out", str(tmp_path / "out")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 1 and errors[0].startswith("vit_core: vit_base_patch16_224: Pretrained weights for")
    assert errors[0].endswith("Add --model vit-lens/shapes-vit to use it.")


def test_the_readmes_command_line_examples_work_offline():
    """The README's first examples name the bundled model: without it the default ViT-B/16 needs the network."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Python and the command line", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.startswith("vit-lens ")]
    assert commands and all("--model vit-lens/shapes-vit" in line for line in commands), commands


def test_trust_line_counts_the_tests_each_map_beats_random_under_best_first():
    from vit_core.__main__ import trust_line
    from vit_core.explain.perturbation import BEATS, TIED, WORSE

    verdicts = {"deletion_auc": {"rollout": {"verdict": TIED}, "chefer": {"verdict": BEATS}, "gradcam": {"verdict": WORSE}},
                "insertion_auc": {"rollout": {"verdict": BEATS}, "chefer": {"verdict": BEATS}, "gradcam": {"verdict": TIED}}}
    assert trust_line(verdicts) == ("which to trust, tests where the map beats random of 2 (deletion_auc, insertion_auc): "
                                    "chefer 2, rollout 1, gradcam 0 (worse than random: deletion_auc)")


def test_analyze_explain_prints_the_which_to_trust_line_of_its_verdicts(tmp_path, capsys):
    from vit_core import __main__ as core_cli

    drawn_image(5).save(tmp_path / "scene.png")
    assert core_cli.main(["analyze", str(tmp_path / "scene.png"), "--model", "vit-lens/shapes-vit", "--out",
                          str(tmp_path / "out"), "--explain", "--steps", "3", "--tests", "all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = json.loads((tmp_path / "out" / "scene.json").read_text())["verdicts"]
    assert set(verdicts) == {"deletion_auc", "insertion_auc", "pixel_deletion_auc", "pixel_insertion_auc", "srg", "saco"}
    assert len(lines) == 2 and lines[0].startswith(f"{tmp_path / 'scene.png'}: ")
    assert lines[1] == "  " + core_cli.trust_line(verdicts)


def test_ctrl_c_during_analyze_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    from vit_core import __main__ as core_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loading, "load_model", interrupted)
    drawn_image(0).save(tmp_path / "a.png")
    assert core_cli.main(["analyze", str(tmp_path / "a.png"), "--model", "vit-lens/shapes-vit"]) == 130
    assert capsys.readouterr().err == "vit_core: interrupted\n"


def _fake_venv_repository(root: Path) -> Path:
    """tools/setup and tools/dashboard copied into `root` beside this pyproject.toml, with a .venv whose python and
    vit-lens only write down how they were called: what the scripts would install or start, without doing it."""
    tools = Path(__file__).resolve().parents[2] / "tools"
    (root / "tools").mkdir()
    for name in ("setup", "dashboard"):
        (root / "tools" / name).write_text((tools / name).read_text())
    for name in ("pyproject.toml", "requirements.txt"):
        (root / name).write_text((tools.parent / name).read_text())
    (root / ".venv" / "bin").mkdir(parents=True)
    for name in ("python", "vit-lens"):
        (root / ".venv" / "bin" / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{root}/calls"\n')
        (root / ".venv" / "bin" / name).chmod(0o755)
    return root


@pytest.mark.parametrize("stamp, installs", [("test", False), ("runtime", False), (None, True)])
def test_tools_dashboard_installs_only_when_no_set_up_of_this_pyproject_is_done(tmp_path, stamp, installs):
    """tools/test's set-up (the test extra, which includes the runtime) is enough for tools/dashboard."""
    root = _fake_venv_repository(tmp_path)
    digest = subprocess.run("cat pyproject.toml requirements.txt | sha256sum", shell=True, cwd=root,
                            capture_output=True, text=True, check=True).stdout[:12]
    if stamp:
        (root / ".venv" / f".installed-{digest}-{stamp}").touch()
    result = subprocess.run(["bash", "tools/dashboard", "--server.port", "8502"], cwd=root, capture_output=True,
                            text=True, timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, result.stderr
    calls = (root / "calls").read_text().splitlines()
    assert calls[-1] == "vit-lens dashboard --server.port 8502"
    assert any("pip install --quiet -c .venv/constraints.txt -e ." in call for call in calls) == installs, calls


def test_the_set_up_installs_requirements_txts_pins():
    """requirements.txt is the truth for versions: tools/setup installs under its pins (constraints), so the .venv it
    made has every pinned package that is installed at its pin (the set-up had installed newer ones: 8 differed)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    setup = (REPO / "tools" / "setup").read_text()
    assert "grep -v '^-e ' requirements.txt > .venv/constraints.txt" in setup
    assert 'pip install --quiet -c .venv/constraints.txt -e "' in setup
    stamps = list((Path(sys.prefix)).glob(".installed-*"))
    if Path(sys.prefix) != REPO / ".venv" or not stamps:
        pytest.skip("not the .venv tools/setup made")
    digest = subprocess.run("cat pyproject.toml requirements.txt | sha256sum", shell=True, cwd=REPO,
                            capture_output=True, text=True, check=True).stdout[:12]
    if not any(stamp.name.startswith(f".installed-{digest}-") for stamp in stamps):
        pytest.skip("the .venv was set up for another pyproject.toml or requirements.txt: bash tools/setup")
    differ = []
    for raw in (REPO / "requirements.txt").read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        pin = Requirement(line)
        if pin.marker is not None and not pin.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = metadata.version(pin.name)
        except metadata.PackageNotFoundError:  # an extra's package that this set-up didn't ask for
            continue
        if not pin.specifier.contains(installed, prereleases=True):
            differ.append(f"{pin.name} {installed}, pinned {pin.specifier}")
    assert differ == [], differ


@pytest.mark.live  # starts the real dashboard server
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_vit_lens_dashboard_stops_quietly_with_the_servers_status(tmp_path, stop):
    """Ctrl-C (the terminal's whole process group) or SIGTERM: Streamlit's "Stopping...", exit status 0, and none of
    the ~30 "nanobind: leaked ..." lines that triton's bindings printed at the interpreter's teardown."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VIT_LENS_MODEL": "vit-lens/shapes-vit"}
    out, err = (tmp_path / "stdout").open("w"), (tmp_path / "stderr").open("w")
    server = subprocess.Popen([Path(sys.executable).parent / "vit-lens", "dashboard", "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true"], cwd=tmp_path, env=env,
                              stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "warm-up done" not in (tmp_path / "stderr").read_text():  # the model loaded, its forward traced
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=10) as health:
            assert health.status == 200
        os.killpg(server.pid, getattr(signal, stop))
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        out.close()
        err.close()
    stderr = (tmp_path / "stderr").read_text()
    assert "nanobind" not in stderr and "leaked" not in stderr and "Traceback" not in stderr, stderr
    assert "Stopping..." in (tmp_path / "stdout").read_text()


@pytest.mark.parametrize("stops, status, stderr", [
    ("raise SystemExit(0)", 0, ""),
    ("raise SystemExit('vit-lens dashboard: unknown device')", 1, "vit-lens dashboard: unknown device\n"),
    ("raise KeyboardInterrupt", 130, "vit-lens dashboard: interrupted\n"),  # Ctrl-C before Streamlit takes it
])
def test_the_dashboard_process_ends_with_the_servers_status_and_its_message(stops, status, stderr):
    """The whole `vit-lens dashboard` process (the server replaced by a stand-in that stops as the real one can):
    the quiet end after the exit handlers keeps the status and the one-line message."""
    script = f"""
import atexit, sys
from dashboard import cli
from dashboard import serve

def stand_in(argv, whole_process):
    assert whole_process and argv == ["--server.port", "8502"]
    atexit.register(print, "an exit handler of the server's ran")  # registered later: runs before the quiet end
    {stops}

serve.main = stand_in
sys.argv = ["vit-lens", "dashboard", "--server.port", "8502"]
sys.exit(cli.main())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (status, stderr)
    assert result.stdout == "an exit handler of the server's ran\n"


@pytest.mark.parametrize("argv, line", [
    (["dataset", "nope"], "vit-lens: nope: not a folder"),
    (["dataset", ".", "--labels", "nope.txt"], "vit-lens: --labels nope.txt: No such file or directory."),
    (["merge", "nope", "--out", "merged"], "vit-lens: nope: not a folder"),
])
def test_dataset_and_merge_refuse_a_missing_path_before_importing_torch(tmp_path, argv, line):
    script = f"""
import sys
import textwrap
from dashboard import cli
status = cli.main({argv!r})
print(status, ",".join(m for m in {HEAVY!r} if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.split() == ["2"], f"imported {result.stdout}"
    assert result.stderr == line + "\n"


def _refused_before_torch(argv: list, cwd: Path) -> tuple[int, list[str], str]:
    """`vit-lens ARGV` in a fresh process: its exit status, stderr's lines, and which of torch and timm it imported."""
    script = f"""
import sys
import textwrap
from dashboard import cli
status = cli.main({[str(a) for a in argv]!r})
print(status, ",".join(m for m in ("torch", "timm") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd)
    status, _, imported = result.stdout.strip().partition(" ")
    return int(status), result.stderr.strip().splitlines(), imported


def test_mistakes_that_need_no_model_are_answered_before_torch_with_a_hint(tmp_path):
    """An empty folder, an --out that is a file, a mistyped --target of the bundled model, a model name timm doesn't
    know (with the closest names), a folder given to analyze: one line each, before torch is imported (5-15 s)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "one").mkdir()
    drawn_image(1).save(tmp_path / "one" / "a.png")
    drawn_image(2).save(tmp_path / "x.png")
    (tmp_path / "file").write_text("")
    cases = [
        (["dataset", "empty"], "vit-lens: empty: There are no images to analyse."),
        (["concepts", "one", "--layer", "1", "--out", "c"],
         "vit-lens: one: learning concepts needs at least 2 images (one is held out)."),
        (["analyze", "x.png", "--out", "file"], "vit-lens: --out file: a file, not a folder."),
        (["dataset", "one", "--out", "file/results"], "vit-lens: --out file/results: "
                                                      f"{tmp_path / 'file'} is a file, not a folder."),
        (["analyze", "x.png", "--model", "vit-lens/shapes-vit", "--explain", "--target", "squre"],
         "vit-lens: --target: no class is labelled 'squre'. Did you mean square?"),
        (["analyze", "x.png", "--model", "shapes-vit"],
         "vit-lens: shapes-vit: timm has no model called 'shapes-vit'. Did you mean vit-lens/shapes-vit?"),
        (["dataset", "one", "--model", "vit_bse_patch16_224"], "vit-lens: vit_bse_patch16_224: timm has no model "
                                                               "called 'vit_bse_patch16_224'. Did you mean "),
        (["analyze", "one"], "vit-lens: one: a folder; analyze reads image files (for every image in a folder: "
                             "vit-lens dataset one)"),
    ]
    for argv, line in cases:
        status, errors, imported = _refused_before_torch(argv, tmp_path)
        assert (status, imported) == (2, ""), (argv, errors, imported)
        assert len(errors) == 1 and errors[0].startswith(line), (argv, errors)
    assert "vit_base_patch16_224" in _refused_before_torch(cases[6][0], tmp_path)[1][0]


def test_timms_names_read_from_its_source_are_its_registry():
    """vit_core.arguments reads timm's names without importing it: the same set as timm's own registry (current and
    deprecated names), so no name timm knows is refused before the import."""
    import timm.models._registry as registry

    from vit_core import arguments

    assert arguments.timm_model_names() == set(registry._model_entrypoints)
    assert all(arguments.model_refused(name) is None for name in ("vit_base_patch16_224.augreg2_in21k_ft_in1k",
                                                                   "vit_base_patch16_224_in21k", "hf-hub:timm/x",
                                                                   arguments.TEACHING_MODEL))


def test_a_mistyped_target_or_model_gets_the_closest_names_after_loading_too(tiny):
    """Where the classes are known only once the model loads (ImageNet's), resolve_target and the loader hint alike."""
    from vit_core.errors import ModelError
    from vit_core.explain import TargetError, resolve_target
    from vit_core.loading.names import _check_name

    logits = np.zeros(len(tiny.labels), dtype=np.float32)  # ImageNet's classes
    name = tiny.label(3).split(",")[0].strip().lower()  # "tiger shark"
    with pytest.raises(TargetError, match=rf"^no class is labelled '{name[:-1]}x'\. Did you mean {name}"):
        resolve_target(tiny, logits, name[:-1] + "x")
    with pytest.raises(ModelError, match=r"Did you mean vit-lens/shapes-vit\?$"):
        _check_name("shapes-vit")


def test_no_triton_is_imported_on_a_machine_without_a_gpu(tmp_path):
    """triton compiles GPU kernels only, yet `import timm` imported it (through torchvision and torch._dynamo), and
    its bindings printed about forty "nanobind: leaked ..." lines at every exit: the entry points stop the import
    where no GPU driver is there. Here the driver files looked for are made absent by naming paths that aren't."""
    script = f"""
import sys
import textwrap
from vit_core.runtime import no_triton_without_a_gpu
assert no_triton_without_a_gpu(({str(tmp_path / "no-driver")!r},))
import vit_core
from PIL import Image
loaded = vit_core.load_model("vit-lens/shapes-vit")
vit_core.run_with_capture(loaded, Image.new("RGB", (64, 64)))
print(",".join(sorted(name for name, module in sys.modules.items() if name.startswith("triton") and module)))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and "nanobind" not in result.stderr, (result.stdout, result.stderr)
    from vit_core.runtime import no_triton_without_a_gpu

    assert not no_triton_without_a_gpu((str(tmp_path),))  # a driver there (any path that exists): triton stays


def test_the_command_imports_no_triton_on_this_cpu_machine(tmp_path):
    from vit_core.runtime import GPU_DRIVER_FILES

    if any(Path(path).exists() for path in GPU_DRIVER_FILES):
        pytest.skip("a GPU driver is there: triton may be needed")
    drawn_image(0).save(tmp_path / "a.png")
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "vit_core", "analyze", "a.png", "--model",
                             "vit-lens/shapes-vit", "--out", "out"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = [line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    assert "triton._C.libtriton" not in loaded and "triton.language" not in loaded


def readme_command_lines() -> list[tuple[int, str]]:
    """(line number, command) of every line of README.md's code blocks (fenced or indented) that runs `vit-lens`,
    its comment left out."""
    import re

    found, fenced = [], False
    for number, line in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        command = line.split(" #", 1)[0].strip()
        if (fenced or line.startswith("    ")) and re.match(r"(\.venv/bin/)?vit-lens\s", command):
            found.append((number, command))
    return found


def test_every_vit_lens_line_of_the_readme_runs_as_written_after_its_set_up():
    """The set-up puts `vit-lens` in .venv/bin, not on the PATH (`vit-lens: command not found`): the README activates
    .venv before its first bare `vit-lens`, the command is the one pyproject installs there, and every line parses
    with the command's own parser (optional [...] parts left out)."""
    import re
    import shlex

    import tomllib

    from vit_core import __main__ as core_cli

    lines = readme_command_lines()
    assert len(lines) >= 10, lines
    text = (REPO / "README.md").read_text().splitlines()
    activated = next(number for number, line in enumerate(text, 1) if line.startswith("source .venv/bin/activate"))
    bare = [number for number, command in lines if command.startswith("vit-lens ")]
    assert activated < min(bare), f"README line {min(bare)} runs vit-lens before the README activates .venv"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["vit-lens"] == "dashboard.cli:main"
    if (Path(sys.prefix) / "bin" / "activate").is_file():  # a virtual environment: the command is in its bin/
        assert (Path(sys.prefix) / "bin" / "vit-lens").is_file()
    parser, commands = core_cli.build_parser(prog="vit-lens")
    commands.add_parser("dashboard", add_help=False)
    for number, command in lines:
        while re.search(r"\[[^\[\]]*\]", command):
            command = re.sub(r"\[[^\[\]]*\]", "", command)  # the optional parts, innermost first
        argv = shlex.split(command)[1:]
        if argv[:1] == ["dashboard"]:
            continue  # Streamlit's options: dashboard.cli hands them to `streamlit run`
        try:
            parser.parse_args(argv)
        except SystemExit as e:  # --help exits 0; a line the parser refuses exits 2
            assert e.code == 0, f"README line {number}: {command}"


def test_the_workers_help_gives_the_rule_and_its_value_here(capsys):
    """"default 1: the CPUs ... less one, at most 8" read as a contradiction on 2 CPUs: the rule, then the value."""
    from vit_core import __main__ as core_cli

    for command in ("dataset", "concepts", "compare"):
        with pytest.raises(SystemExit):
            core_cli.main([command, "--help"])
        said = " ".join(capsys.readouterr().out.split())
        assert (f"(default: one fewer than the CPUs this process may use, at most 8; {core_cli.default_workers()} "
                "here)") in said, said


def test_the_commands_process_ends_after_its_exit_handlers_its_output_and_any_thread_still_working(tmp_path):
    """exit_process skips only Python's teardown of its modules: atexit handlers run, buffered output arrives, the
    status is the command's, and a non-daemon thread still writing is waited for (Python's own exit then)."""
    script = tmp_path / "ends.py"
    script.write_text(textwrap.dedent(f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from vit_core.__main__ import exit_process
        atexit.register(lambda: Path({str(tmp_path / "handler")!r}).write_text("ran"))
        sys.stdout.write("buffered, not yet flushed")
        if sys.argv[1] == "thread":
            threading.Thread(target=lambda: (time.sleep(0.5), Path({str(tmp_path / "thread")!r}).write_text("done"))).start()
        exit_process(3)
        print("never here")
    """))
    for case in ("alone", "thread"):
        done = subprocess.run([sys.executable, str(script), case], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},  # stdout buffered
                                   "PYTHONPATH": str(REPO)})
        assert (done.returncode, done.stdout) == (3, "buffered, not yet flushed"), done.stderr
        assert (tmp_path / "handler").read_text() == "ran"
        (tmp_path / "handler").unlink()
    assert (tmp_path / "thread").read_text() == "done"
