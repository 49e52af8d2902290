"""`vit-lens concepts` against the take-downs of issue 53: F and F x D bounded by the machine's memory before anything
is collected; DIR/tokens checked as `dataset` checks DIR/parts (a damaged manifest, done.json or .npy file, a
pickle, a sparse file declaring 10^8 rows: one sentence each, nothing trained); all-NaN tokens and a single readable
image refused; an unreadable sub-folder listed with its reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vit_core import __main__ as core_cli
from vit_core.concepts.folders import max_features
from vit_core.concepts.learn import ENCODE_TOKENS, features_refused, most_features, training_bytes
from vit_core.loading import TEACHING_MODEL, teaching_model_available

pytestmark = pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are not here")

SMALL = ["--model", TEACHING_MODEL, "--device", "cpu", "--layer", "1", "--features", "32", "--k", "4", "--epochs", "1",
         "--workers", "0"]
SHARD = "shard-0001-of-0001"


def run(capsys, folder: Path, out: Path, *extra: str) -> tuple[int, list[str]]:
    status = core_cli.main(["concepts", str(folder), *SMALL, "--out", str(out), *extra])
    return status, capsys.readouterr().err.strip().splitlines()


def one_line(errors: list[str], *words: str) -> None:
    assert len(errors) == 1 and "Traceback" not in errors[0] and all(w in errors[0] for w in words), errors


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from PIL import Image

    from vit_core.teaching.data import draw_set

    root = tmp_path_factory.mktemp("shapes")
    for i, image in enumerate(draw_set(6, seed=5).images):
        Image.fromarray(image).save(root / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def collected(folder, tmp_path_factory) -> Path:
    """A finished run (its tokens kept), copied by each test before it damages the copy."""
    out = tmp_path_factory.mktemp("run")
    assert core_cli.main(["concepts", str(folder), *SMALL, "--out", str(out)]) == 0
    return out


def test_the_feature_bound_is_half_the_memory_and_what_the_app_opens():
    memory, d, batch = 2**30, 256, 1024
    bound = most_features(d, batch, memory)
    assert training_bytes(bound, d, batch) <= memory // 2 and bound <= max_features(d, memory)
    assert training_bytes(bound + 1, d, batch) > memory // 2 or bound == max_features(d, memory)
    assert training_bytes(1, d, batch) == 4 * (8 * d + 3 * batch + 2 * ENCODE_TOKENS)
    assert features_refused(bound, d, batch, memory) is None
    assert f"at most {bound:,} features of width 256" in features_refused(bound + 1, d, batch, memory)


def test_features_beyond_the_machine_are_refused_before_anything_is_collected(folder, tmp_path, capsys):
    status, errors = run(capsys, folder, tmp_path, "--features", "300000")
    assert status == 2
    one_line(errors, "--features 300,000", "trains at most", "width 256")
    assert not (tmp_path / "tokens").exists()


def damaged_copy(collected: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(collected, out)
    for name in ("concepts.safetensors", "concepts.json", "contact_sheet.png"):
        (out / name).unlink()
    return out


def npy_header_only(path: Path, rows: int, width: int) -> None:
    """A .npy whose header declares (rows, width) float32, its data a sparse hole of that size (no disk used)."""
    from numpy.lib import format as npformat

    with open(path, "wb") as f:
        npformat.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)})
        f.truncate(f.tell() + rows * width * 4)


def pickled(path: Path) -> None:
    np.save(path, np.array([{"run": "code"}], dtype=object), allow_pickle=True)


DAMAGE = {
    "a manifest that is a list": (lambda t: (t / "manifest.json").write_text("[1, 2]"), "manifest.json is damaged"),
    "shards: abc": (lambda t: _edit(t / "manifest.json", shards="abc"), "manifest.json is damaged"),
    "shards: 10^9": (lambda t: _edit(t / "manifest.json", shards=10**9), "at most one shard per image"),
    "done.json edited": (lambda t: _edit(t / SHARD / "done.json", chunks=5, failures="none"), "done.json is damaged"),
    "done.json not JSON": (lambda t: (t / SHARD / "done.json").write_text("{"), "is not a finished shard"),
    "a pickled token file": (lambda t: pickled(t / SHARD / "tokens-00000.npy"), "can't be read as tokens"),
    "a truncated token file": (lambda t: _truncate(t / SHARD / "tokens-00000.npy"), "can't be read as tokens"),
    "tokens of another width": (lambda t: np.save(t / SHARD / "tokens-00000.npy", np.zeros((6 * 144, 128), np.float32)),
                                "of width 256"),
    "float64 tokens": (lambda t: np.save(t / SHARD / "tokens-00000.npy", np.zeros((6 * 144, 256))), "not float32"),
    "10^8 sparse rows": (lambda t: npy_header_only(t / SHARD / "tokens-00000.npy", 10**8, 256), "(100000000, 256)"),
    "an index out of range": (lambda t: np.save(t / SHARD / "images-00000.npy", np.arange(6, dtype=np.int64) + 40),
                              "outside shard 1"),
    "a repeated index": (lambda t: np.save(t / SHARD / "images-00000.npy", np.zeros(6, np.int64)), "or repeated"),
    "images fewer than the shard": (lambda t: _fewer(t / SHARD), "where the shard has 6"),
}


def _edit(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _fewer(shard: Path) -> None:
    np.save(shard / "images-00000.npy", np.arange(5, dtype=np.int64))
    np.save(shard / "tokens-00000.npy", np.load(shard / "tokens-00000.npy")[: 5 * 144])


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_tokens_are_refused_in_one_sentence_and_nothing_is_trained(damage, collected, folder, tmp_path, capsys):
    out = damaged_copy(collected, tmp_path)
    make, said = DAMAGE[damage]
    make(out / "tokens")
    status, errors = run(capsys, folder, out)
    assert status == 2
    one_line(errors, said)
    assert not (out / "concepts.safetensors").exists()


def test_all_nan_tokens_are_refused(collected, folder, tmp_path, capsys):
    out = damaged_copy(collected, tmp_path)
    path = out / "tokens" / SHARD / "tokens-00000.npy"
    np.save(path, np.full(np.load(path).shape, np.nan, np.float32))
    status, errors = run(capsys, folder, out)
    assert status == 2
    one_line(errors, "The tokens of 6 of 6 images are not finite")
    assert not (out / "concepts.safetensors").exists()


def test_a_single_readable_image_is_refused(folder, tmp_path, capsys):
    few = tmp_path / "few"
    few.mkdir()
    shutil.copy(folder / "0.png", few / "0.png")
    for i in range(1, 6):
        (few / f"{i}.png").write_text("not an image")
    status, errors = run(capsys, few, tmp_path / "out")
    assert status == 2
    assert any("Only 1 of 6 images could be read" in e for e in errors), errors
    assert not (tmp_path / "out" / "concepts.safetensors").exists()


def test_an_unreadable_sub_folder_is_listed_with_its_reason(folder, tmp_path, capsys, monkeypatch):
    """Tests run as root here, whom no permission stops: the folder's listing failure is simulated where the
    listing asks (os.scandir), as a user's chmod 000 folder would fail it."""
    import os

    from vit_core.images import listing

    root = tmp_path / "images"
    shutil.copytree(folder, root)
    (root / "locked").mkdir()
    real = os.scandir

    def scandir(path="."):
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(listing.os, "scandir", scandir)
    assert ("locked", "A folder that can't be read (Permission denied); the files in it are left out.") in [
        (p.name, r) for p, r in listing.list_not_images(root)]
    status = core_cli.main(["dataset", str(root), "--model", TEACHING_MODEL, "--device", "cpu", "--workers", "0",
                            "--out", str(tmp_path / "dataset")])
    capsys.readouterr()
    assert status == 0
    skipped = json.loads((tmp_path / "dataset" / "dataset.json").read_text())["skipped"]
    assert {"file": "locked", "reason": "A folder that can't be read (Permission denied); the files in it are left out."
            } in skipped
    status, errors = run(capsys, root, tmp_path / "concepts")
    assert status == 0
    assert errors == ["vit_core: locked: A folder that can't be read (Permission denied); the files in it are left out."]
