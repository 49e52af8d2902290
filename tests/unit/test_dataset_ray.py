"""The Ray engine (vit_core.dataset.ray_engine) on a local Ray of 2 CPUs, no dashboard, no network: the same parts
and the same result as the one-process run, also when a model worker dies mid-run (Ray restarts it and retries
its batch; every image is counted once); `vit-lens dataset --engine ray` writes the same files, and `vit-lens compare
--engine ray` the same files as `compare` in one process."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.dataset_folder import IMAGES, labelled_folder
from vit_core import __main__ as core_cli
from vit_core.dataset import PartStore, manifest_of, merged_result, plan_run, run_shards

ray = pytest.importorskip("ray", reason='the Ray engine\'s tests need Ray: pip install "vit-lens[ray]"')

from vit_core.dataset.ray_engine import (  # noqa: E402
    ModelSpec,
    RayPlan,
    ReduceStage,
    run_shards_on_ray,
    workers_at_this_niceness,
)

SPEC = ModelSpec("vit_tiny_patch16_224", pretrained=False, kwargs={"depth": 2})  # what each worker builds


@pytest.fixture(scope="module")
def local_ray():
    """One Ray for the module: 2 CPUs, no dashboard; the engine uses it as it is and leaves it running."""
    with workers_at_this_niceness():  # as the engine's own Ray: its workers not starved beside other work
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    # The test module's own classes (CrashOnce) travel by value: Ray's workers can't import this file by name.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


def test_a_local_rays_workers_run_at_the_drivers_niceness(local_ray):
    """Ray's default niceness of 15 leaves its workers a few percent of a core beside any other work on this machine."""
    @ray.remote
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)

    assert ray.get(niceness.remote()) == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return labelled_folder(tmp_path_factory.mktemp("set"))


@pytest.fixture(scope="module")
def loaded():
    return SPEC.load("cpu")


@pytest.fixture(scope="module")
def one_process(loaded, folder, tmp_path_factory):
    """The shards run in this process: what Ray must give."""
    plan = plan_run(loaded, folder, num_shards=3)
    store = PartStore(tmp_path_factory.mktemp("local"))
    manifest = manifest_of(loaded, plan)
    store.open(manifest)
    run_shards(loaded, plan, store, list(plan.shards), manifest["files_sha256"], batch_size=3)
    return merged_result([store])[0]


def ray_run(loaded, folder, out: Path, reducer=ReduceStage):
    plan = plan_run(loaded, folder, num_shards=3)
    store = PartStore(out)
    manifest = manifest_of(loaded, plan)
    store.open(manifest)
    seen = []
    run_shards_on_ray(SPEC, loaded, plan, store, list(plan.shards), manifest["files_sha256"],
                      workers=RayPlan(model_workers=1, gpus_per_worker=0, decoders=1), batch_size=2, threads=1,
                      reducer=reducer, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (8, 8) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    return merged_result([store])[0], store


def assert_same(got, expected):
    a, b = got.arrays(), expected.arrays()
    assert set(a) == set(b)
    for key in b:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key  # the same bits: Ray's workers are processes of their own
    assert got.mean_attention_distance_std.tobytes() == expected.mean_attention_distance_std.tobytes()
    rows, expected_rows = got.totals.rows, expected.totals.rows
    assert rows.file == expected_rows.file == sorted(IMAGES)  # every image once, in the folder's order
    assert rows.label == expected_rows.label and rows.predicted == expected_rows.predicted
    assert rows.probability == expected_rows.probability
    assert got.failures == expected.failures and got.not_images == expected.not_images
    assert got.totals.confusion == expected.totals.confusion


def test_ray_gives_the_one_process_result(local_ray, loaded, folder, one_process, tmp_path):
    result, store = ray_run(loaded, folder, tmp_path)
    assert_same(result, one_process)
    assert sorted(p.name for p in store.path.iterdir()) == ["manifest.json", *(f"shard-000{i}-of-0003.npz" for i in (1, 2, 3))]
    assert [name for name, _ in result.failures] == ["1/broken.png"] and result.device == "CPU"


class CrashOnce(ReduceStage):
    """A model worker whose process dies (os._exit, as a lost node's would) the first time it gets image 5's batch."""

    marker = ""  # set by the test: a file that says the crash happened

    def __call__(self, batch):
        if 5 in batch["index"] and not os.path.exists(self.marker):
            Path(self.marker).write_text(json.dumps([int(i) for i in batch["index"]]))
            os._exit(1)
        return super().__call__(batch)


def test_a_worker_killed_mid_run_is_retried_and_no_image_counts_twice(local_ray, loaded, folder, one_process, tmp_path):
    marker = tmp_path / "crashed"
    crash = type("CrashOnceHere", (CrashOnce,), {"marker": str(marker)})
    result, _ = ray_run(loaded, folder, tmp_path / "out", reducer=crash)
    assert 5 in json.loads(marker.read_text())  # the worker died on that batch, after others were done
    assert result.num_images == len(IMAGES) and len(result.totals.rows) == len(IMAGES)
    assert_same(result, one_process)


def test_the_command_with_engine_ray_writes_the_same_files(local_ray, folder, tmp_path, capsys):
    common = [str(folder), "--model", "vit_tiny_patch16_224", "--random-init", "--device", "cpu", "--limit", "4",
              "--batch-size", "2"]
    assert core_cli.main(["dataset", *common, "--out", str(tmp_path / "local"), "--workers", "0"]) == 2  # broken.png
    assert core_cli.main(["dataset", *common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all("broken.png" in line for line in errors)
    with np.load(tmp_path / "local" / "dataset.npz") as local, np.load(tmp_path / "ray" / "dataset.npz") as on_ray:
        assert set(local.files) == set(on_ray.files)
        for key in local.files:
            assert on_ray[key].tobytes() == local[key].tobytes(), key
    tables = {}
    for engine in ("local", "ray"):
        with open(tmp_path / engine / "images.csv", newline="") as f:
            tables[engine] = list(csv.DictReader(f))
    assert tables["ray"] == tables["local"]
    assert ray.is_initialized()  # the module's Ray, used as it was and left running


LENS_FILE = """
import numpy as np
from vit_core.lenses import lens

@lens("qk", sites=["blocks.*.attn.q", "blocks.*.attn.k"])
def qk(cap):
    q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")  # (L, H, T, d_head)
    return {"first_row": (q @ k.swapaxes(-1, -2))[:, :, 0], "crop_mean": cap.input_image.mean(axis=(0, 1))}

@lens("picky")
def picky(cap):
    if cap.logits.argmax() % 2:
        raise ValueError("not this class")
    return {"top": cap.logits.max()}
"""


def test_lenses_on_ray_give_the_one_process_bits_and_the_manifest_has_the_files_sha256(local_ray, folder, tmp_path,
                                                                                        capsys):
    """`dataset --lens FILE --engine ray`: each model worker loads the file (by its absolute path) and reads the lenses
    on the batch's own forward; the driver adds them up in image order, so dataset.npz is the local run's, bit for bit,
    and a lens that raised is the same lines."""
    lens_file = tmp_path / "researcher" / "lab.py"
    lens_file.parent.mkdir()
    lens_file.write_text(LENS_FILE)
    common = [str(folder), "--model", "vit_tiny_patch16_224", "--random-init", "--device", "cpu", "--limit", "5",
              "--batch-size", "2", "--lens", str(lens_file)]
    assert core_cli.main(["dataset", *common, "--out", str(tmp_path / "local"), "--workers", "0"]) == 2
    local_err = capsys.readouterr().err
    assert core_cli.main(["dataset", *common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 2
    ray_err = capsys.readouterr().err
    assert sorted(ray_err.splitlines()) == sorted(local_err.splitlines())
    with np.load(tmp_path / "local" / "dataset.npz") as local, np.load(tmp_path / "ray" / "dataset.npz") as on_ray:
        assert set(local.files) == set(on_ray.files) and "qk.first_row" in local.files and "qk.crop_mean" in local.files
        for key in local.files:
            assert on_ray[key].tobytes() == local[key].tobytes(), key
    manifest = json.loads((tmp_path / "ray" / "parts" / "manifest.json").read_text())
    assert {one["sha256"] for one in manifest["lenses"]} == {hashlib.sha256(lens_file.read_bytes()).hexdigest()}


def test_explanations_on_ray_equal_the_one_process_ones(local_ray, folder, tmp_path):
    """--explain on Ray: each image's named scalars (explained_values) computed in the model worker, a column each."""
    small = ModelSpec("vit_tiny_patch16_224", pretrained=False, kwargs={"depth": 2, "img_size": 64})  # 4 x 4 patches
    loaded = small.load("cpu")
    results = {}
    for engine in ("local", "ray"):
        plan = plan_run(loaded, folder, limit=4, num_shards=2)  # 0/a, 0/b, 0/g and 1/broken
        store = PartStore(tmp_path / engine)
        manifest = manifest_of(loaded, plan, explain=True, steps=2)
        store.open(manifest)
        if engine == "local":
            run_shards(loaded, plan, store, list(plan.shards), manifest["files_sha256"], batch_size=2, explain=True, steps=2)
        else:
            run_shards_on_ray(small, loaded, plan, store, list(plan.shards), manifest["files_sha256"], batch_size=2,
                              workers=RayPlan(1, 0, 1), explain=True, steps=2, threads=1)
        results[engine] = merged_result([store])[0]
    local, on_ray = results["local"], results["ray"]
    assert on_ray.num_images == 3 and list(on_ray.explained) == list(local.explained)
    assert "deletion_auc_random" in on_ray.explained and "insertion_auc_chefer" in on_ray.explained
    assert on_ray.explained == local.explained  # the same bits: gradient and perturbed passes at one thread
    assert on_ray.totals.rows.explained == local.totals.rows.explained
    assert on_ray.failures == local.failures


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_compare_on_ray_writes_the_bytes_of_compare_in_one_process(local_ray, folder, tmp_path, capsys):
    """`compare --engine ray`: both models in each model worker, a batch's rows of each shard reduced together, the
    driver adding up each shard's rows in image order: compare.npz, .csv, .json, .png and DIR/a, DIR/b are the
    one-process run's bytes. Shards of 2 and 3 images in batches of 3: a batch crosses the shards' edge."""
    common = [str(folder), "--model", "vit-lens/shapes-vit", "--model-b", "vit_shapes_patch8_96", "--random-init-b",
              "--device", "cpu", "--limit", "5", "--batch-size", "3", "--shards", "2"]
    assert core_cli.main(["compare", *common, "--out", str(tmp_path / "local"), "--workers", "0"]) == 2  # 1/broken.png
    local_err = capsys.readouterr().err
    assert core_cli.main(["compare", *common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 2
    said = capsys.readouterr()
    # The fixture's Ray logs Ray Data's own lines to this process's stderr (the command's Ray sends them to its log).
    own = [line for line in said.err.splitlines() if line.startswith("vit_core: ")]
    assert own == local_err.splitlines() and "broken.png" in own[0] and "4 images compared" in said.out
    assert sorted(_files(tmp_path / "ray")) == ["compare.csv", "compare.json", "compare.npz", "compare.png"]
    assert _files(tmp_path / "ray") == _files(tmp_path / "local")
    for side in ("a", "b"):
        assert _files(tmp_path / "ray" / side) == _files(tmp_path / "local" / side), side
    assert (tmp_path / "ray" / "parts" / "ray.log").is_file()
    assert ray.is_initialized()  # the module's Ray, used as it was and left running


def test_compare_explain_on_ray_gives_the_one_process_judges(local_ray, folder, tmp_path, capsys):
    """`compare --explain --engine ray`: each model's judge per image computed in the model worker, its scalars carried
    to the driver as text: DIR/a, DIR/b and compare.json are the one-process run's bytes."""
    common = [str(folder), "--model", "vit-lens/shapes-vit", "--model-b", "vit_shapes_patch8_96", "--random-init-b",
              "--device", "cpu", "--limit", "2", "--explain", "--steps", "2"]
    assert core_cli.main(["compare", *common, "--out", str(tmp_path / "local"), "--workers", "0"]) == 0
    assert core_cli.main(["compare", *common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 0
    assert "verdicts against random that changed from A to B" in capsys.readouterr().out
    assert "explain" in json.loads((tmp_path / "ray" / "compare.json").read_text())
    for side in ("", "a", "b"):
        assert _files(tmp_path / "ray" / side) == _files(tmp_path / "local" / side), side


def test_what_ray_prints_in_the_process_goes_to_the_log_and_the_commands_own_lines_to_the_terminal(tmp_path):
    """ray_output_to: file descriptor 2 (where Ray's C++ core writes) and Ray's loggers into the log for the block;
    the stream it yields, and the descriptor after the block, reach the former stderr."""
    script = f"""
import logging, os, sys
from pathlib import Path
from vit_core.dataset.ray_engine import ray_output_to

lines = sys.stdout  # the command's progress lines: a stream taken before the block
with ray_output_to(Path({str(tmp_path / "parts" / "ray.log")!r})) as console:
    os.write(2, b"core_worker.cc: a C++ error line\\n")
    logging.getLogger("ray.some.module").warning("a Ray warning")  # no handler: logging's last resort, on stderr
    print("(raylet) Task failed; it will be retried")  # Ray's error listener prints on sys.stdout
    print("the command's bar", file=console)
    print("the command's progress line", file=lines, flush=True)
print("the command's failure", file=sys.stderr)
print("the command's result")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "the command's bar\nthe command's failure\n"
    assert result.stdout == "the command's progress line\nthe command's result\n"
    assert (tmp_path / "parts" / "ray.log").read_text().splitlines() == [
        "core_worker.cc: a C++ error line", "a Ray warning", "(raylet) Task failed; it will be retried"]


def test_vit_lens_dataset_on_ray_prints_only_its_own_lines(folder, tmp_path):
    """Ray's start-up lines ("Token authentication is enabled ...") and its C++ core's error lines ("core_worker.cc:
    ... the actor restart will fail") printed among the command's: they go to DIR/parts/ray.log."""
    command = [Path(sys.executable).parent / "vit-lens", "dataset", folder, "--model", "vit_tiny_patch16_224",
               "--random-init", "--device", "cpu", "--limit", "4", "--batch-size", "2", "--engine", "ray", "--out", tmp_path]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 2  # 1/broken.png
    failures = json.loads((tmp_path / "dataset.json").read_text())["failures"]
    assert len(failures) == 1 and failures[0].startswith("1/broken.png: ")
    assert result.stderr.splitlines() == [f"vit-lens: {failures[0]}"]  # that failure's line, and nothing of Ray's
    assert (tmp_path / "parts" / "ray.log").is_file()
    ends = result.stdout.splitlines()[-2:]
    assert ends[0].startswith("3 images analysed") and ends[0].endswith(f" -> {tmp_path}")
    assert ends[1].startswith("top-1 accuracy ")
