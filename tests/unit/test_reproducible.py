"""Same input, same numbers: with default settings, each pair below is computed in separate processes and compared
byte for byte (every array's dtype, shape and bytes; the tables and JSON as text). The processes differ where a
user's runs would: torch's thread count, the shard split, the batch size.

The Ray engine's pair is in test_dataset_ray.py (its workers are processes of their own), the dashboard's .npz
against `analyze` in tests/app/test_dashboard_downloads.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, drawn_image
from support.dataset_folder import labelled_folder

SHAPES = ("--model", "vit-lens/shapes-vit", "--device", "cpu")


def vit_lens(*args, threads: int | None = None) -> subprocess.CompletedProcess:
    """`python -m vit_core ARGS` in a process of its own, with the default settings (and `threads` torch threads)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIT_LENS_")}
    if threads is not None:
        env["VIT_LENS_THREADS"] = str(threads)
    result = subprocess.run([sys.executable, "-m", "vit_core", *map(str, args)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 2), result.stderr  # 2: some file was skipped, as the folder below has
    return result


def npz_contents(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    with np.load(path) as npz:
        return {key: (npz[key].dtype.str, npz[key].shape, npz[key].tobytes()) for key in npz.files}


def assert_same_npz(a: Path, b: Path) -> None:
    got, expected = npz_contents(a), npz_contents(b)
    assert got.keys() == expected.keys()
    different = [key for key in expected if got[key] != expected[key]]
    assert not different, f"{a} and {b} differ in {different}"


def test_analyze_twice_at_other_thread_counts_writes_the_same_bytes(tmp_path):
    """The capture, the relevance maps (gradient passes at one fixed thread count: runtime.gradient_threads), the
    faithfulness tests (perturbed forwards at one thread each, in batches of one shape) and the verdicts."""
    drawn_image(7, (150, 200)).save(tmp_path / "photo.png")
    for threads in (1, 2):
        vit_lens("analyze", tmp_path / "photo.png", *SHAPES, "--explain", "--tests", "all", "--out", tmp_path / f"t{threads}",
                 threads=threads)
    assert_same_npz(tmp_path / "t1" / "photo.npz", tmp_path / "t2" / "photo.npz")
    assert (tmp_path / "t1" / "photo.json").read_text() == (tmp_path / "t2" / "photo.json").read_text()


def _dataset_files(out: Path) -> dict[str, str]:
    """dataset.json (without the device line, which names the processes), images.csv and classes.csv."""
    summary = json.loads((out / "dataset.json").read_text())
    summary.pop("device", None)
    return {"dataset.json": json.dumps(summary, sort_keys=True), "images.csv": (out / "images.csv").read_text(),
            "classes.csv": (out / "classes.csv").read_text()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return labelled_folder(tmp_path_factory.mktemp("set"))


def test_dataset_in_one_process_in_shards_and_at_another_batch_size_writes_the_same_bytes(folder, tmp_path):
    """One process; two shards run apart into one folder (the last writes the results); another batch size and
    thread count. Per-image values don't depend on their batch (dataset.forward_images), and the totals are exact
    sums (dataset.ExactMoments), so every file is the same."""
    whole, sharded, other_batch = tmp_path / "whole", tmp_path / "sharded", tmp_path / "batch3"
    vit_lens("dataset", folder, *SHAPES, "--explain", "--out", whole)
    for shard in ("2/2", "1/2"):
        vit_lens("dataset", folder, *SHAPES, "--explain", "--out", sharded, "--shard", shard)
    vit_lens("dataset", folder, *SHAPES, "--explain", "--out", other_batch, "--batch-size", "3", threads=1)
    for run in (sharded, other_batch):
        assert_same_npz(run / "dataset.npz", whole / "dataset.npz")
        assert _dataset_files(run) == _dataset_files(whole)
    with np.load(whole / "dataset.npz") as npz:
        assert int(npz["num_images"]) == 7 and any(key.startswith("deletion_auc_") for key in npz.files)


def test_a_gradient_pass_is_the_same_bits_whatever_the_callers_thread_count(image):
    """torch's softmax backward splits its sums by thread count (on the Shapes ViT, Chefer's input moved at 1 against
    2 threads): the pass takes the machine's count, not the caller's."""
    import torch

    from vit_core import capture, load_model
    from vit_core.explain import relevance
    from vit_core.runtime import torch_threads

    loaded = load_model("vit-lens/shapes-vit")
    x = capture.preprocess(loaded, image)[1]
    passes = []
    for threads in (1, 2):
        with torch_threads(threads):
            passes.append(relevance._gradient_pass(loaded, x, None))
            assert torch.get_num_threads() == threads, "the caller's count is restored"
    assert passes[0].pattern_grad.tobytes() == passes[1].pattern_grad.tobytes()
    assert passes[0].last_norm1_grad.tobytes() == passes[1].last_norm1_grad.tobytes()


LENS_FILE = """
import numpy as np
from vit_core.lenses import lens

@lens("qk", sites=["blocks.*.attn.q", "blocks.*.attn.k"])
def qk(cap):
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head)
    return {"first_row": (q @ k.swapaxes(-1, -2))[:, :, 0], "crop_mean": cap.input_image.mean(axis=(0, 1))}
"""


def test_dataset_at_one_two_and_three_forwards_at_once_writes_the_same_bytes(folder, tmp_path):
    """`--model-workers W` runs W forwards at once, each on its own thread at one torch thread, on copies of the
    model's modules that share its weights (dataset.workers): every file, a lens's arrays included (read on the same
    forwards), is the same whatever W."""
    lens_file = tmp_path / "lab.py"
    lens_file.write_text(LENS_FILE)
    runs = {}
    for forwards in (1, 2, 3):
        runs[forwards] = tmp_path / f"w{forwards}"
        vit_lens("dataset", folder, *SHAPES, "--lens", lens_file, "--batch-size", "5", "--model-workers", forwards,
                 "--out", runs[forwards])
    for forwards in (2, 3):
        assert_same_npz(runs[forwards] / "dataset.npz", runs[1] / "dataset.npz")
        assert _dataset_files(runs[forwards]) == _dataset_files(runs[1])
    with np.load(runs[1] / "dataset.npz") as npz:
        assert int(npz["num_images"]) == 7 and "qk.first_row" in npz.files
