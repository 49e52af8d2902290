"""Benchmark the analyses over many images (vit_core.dataset): against plain forwards of the same images, the Ray
engine against the one-process run, and a run killed with SIGKILL and resumed.

    .venv/bin/python -m tools.benchmarks.benchmark_dataset [--model vit_base_patch16_224] [--images 128] [--batch-size B]
                                                           [--device auto] [--workers 0] [--dtype float32|bfloat16] [--repeats 3]
    .venv/bin/python -m tools.benchmarks.benchmark_dataset --ray [--images 128] [--repeats 1]
    .venv/bin/python -m tools.benchmarks.benchmark_dataset --kill-resume [--images 128] [--shards 8]

Without --ray or --kill-resume:

Both sides include the data loading: the same in-memory JPEG files (drawn here, 500 x 375 px), decoded and
preprocessed by the same DataLoader (vit_core.dataset.image_loader, same batch size and workers) and sent to
the same device. The plain side runs `model(x)` (timm's default, fused attention) on every batch; the dataset
side runs `analyze_dataset` (un-fused attention, reduced on the device to mean attention distance in both
conventions, high-norm rates; no labels, no explanations). The two are interleaved `--repeats` times after a
warm-up batch each, and the medians are reported. `--dtype bfloat16` wraps both in autocast (for a GPU).

Random init: the arithmetic is that of the pretrained model. Targets: within 1.3x of the plain
forwards on a 2-core CPU with ViT-B/16; on a GPU, >= 0.7x of the plain bf16 forward's throughput at batch 64.

--ray: the same JPEGs written to a temporary folder; the one-process run (`runs.run_shards`, what
`vit-lens dataset` runs: DataLoader decoding in --workers processes, default the CLI's) against the Ray engine on one
local node (`ray_engine.run_shards_on_ray`, what `--engine ray` runs: one model worker with the CPU quota's torch
threads, decoding in the CPUs it leaves). Both from the model loaded in this process to every shard's part written;
the Ray side includes its workers' start and their own model load; Ray's own start (ray.init) is timed apart.
Target: the Ray run within 1.3x of the one-process run on the 2-core CPU.

--kill-resume: `vit-lens dataset` (python -m vit_core) on the folder with --shards N, killed with SIGKILL once some
shard's part is written, then run again: prints the shards it skipped and checks the result equals an uninterrupted run.
"""

from __future__ import annotations

from vit_core.runtime import one_blas_thread

one_blas_thread()  # before numpy loads

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_core import load_model
from vit_core.dataset import (
    PartStore,
    analyze_dataset,
    default_batch_size,
    image_loader,
    manifest_of,
    merged_result,
    plan_run,
    run_shards,
)
from vit_core.runtime import configure_threads, cpu_quota
from vit_core.runtime.devices import describe_device, resolve_device


def drawn_jpegs(count: int, size: tuple[int, int] = (375, 500)) -> list[tuple[str, bytes]]:
    """`count` different photo-sized JPEG files: smooth gradients with a few rectangles, like the tests' images."""
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    files = []
    for i in range(count):
        rng = np.random.default_rng(i)
        image = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + y) / 17.0 + i)], axis=-1) * 200
        for _ in range(4):
            top, left = rng.integers(0, h - 60), rng.integers(0, w - 60)
            image[top:top + 60, left:left + 60] = rng.integers(0, 256, size=3)
        buffer = io.BytesIO()
        Image.fromarray(image.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
        files.append((f"image{i:04d}.jpg", buffer.getvalue()))
    return files


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_forwards(loaded, sources, batch_size: int, workers: int) -> float:
    """Seconds for decoding + preprocessing + `model(x)` of every source, batched as analyze_dataset batches."""
    device = loaded.device
    loader = image_loader(loaded, sources, batch_size, workers)
    started = time.perf_counter()
    with torch.inference_mode():
        for _, x, failed in loader:
            assert not failed and x is not None
            loaded.model(x.to(device, non_blocking=True))  # (B, C)
    synchronize(device)
    return time.perf_counter() - started


def dataset_pass(loaded, sources, batch_size: int, workers: int) -> float:
    started = time.perf_counter()
    result = analyze_dataset(loaded, sources, batch_size=batch_size, workers=workers)
    assert result.num_images == len(sources) and not result.failures
    synchronize(loaded.device)  # analyze_dataset already waits for each batch's values: for symmetry
    return time.perf_counter() - started


def written_folder(sources: list[tuple[str, bytes]], root: Path) -> Path:
    for name, data in sources:
        (root / name).write_bytes(data)
    return root


def local_run(loaded, folder: Path, out: Path, batch_size: int, workers: int) -> float:
    """Seconds for `vit-lens dataset`'s one-process path over `folder` into `out`: every shard's part written."""
    plan = plan_run(loaded, folder, num_shards=1)
    store = PartStore(out)
    manifest = manifest_of(loaded, plan)
    store.open(manifest)
    started = time.perf_counter()
    run_shards(loaded, plan, store, list(plan.shards), manifest["files_sha256"], batch_size=batch_size, workers=workers)
    return time.perf_counter() - started


def ray_run(ray, spec, loaded, folder: Path, out: Path, batch_size: int) -> float:
    """Seconds for `--engine ray`'s run on the Ray this process started: workers' start, their model load, the run."""
    from vit_core.dataset.ray_engine import ray_plan, run_shards_on_ray

    plan = plan_run(loaded, folder, num_shards=1)
    store = PartStore(out)
    manifest = manifest_of(loaded, plan)
    store.open(manifest)
    workers = ray_plan(ray)
    started = time.perf_counter()
    run_shards_on_ray(spec, loaded, plan, store, list(plan.shards), manifest["files_sha256"], workers=workers,
                      batch_size=batch_size, threads=max(1, cpu_quota() // workers.model_workers))
    return time.perf_counter() - started


def compare_ray(args, loaded, sources) -> None:
    from vit_core.dataset.ray_engine import ModelSpec, ray_session

    spec = ModelSpec(args.model, pretrained=False)
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        (root / "images").mkdir()
        folder = written_folder(sources, root / "images")
        started = time.perf_counter()
        with ray_session() as ray:
            ray_start = time.perf_counter() - started
            print(f"Ray start (ray.init, {ray.cluster_resources().get('CPU', 0):g} CPUs): {ray_start:.1f} s")
            local, on_ray = [], []
            for repeat in range(args.repeats):
                local.append(local_run(loaded, folder, root / f"local{repeat}", args.batch_size, args.workers))
                on_ray.append(ray_run(ray, spec, loaded, folder, root / f"ray{repeat}", args.batch_size))
                print(f"  repeat {repeat + 1}: one process {local[-1]:.2f} s, Ray {on_ray[-1]:.2f} s")
            a, b = merged_result([PartStore(root / "local0")])[0], merged_result([PartStore(root / "ray0")])[0]
            assert a.num_images == b.num_images == len(sources)
            drift = float(np.abs(a.mean_attention_distance - b.mean_attention_distance).max())
    local_s, ray_s = statistics.median(local), statistics.median(on_ray)
    print(f"one process: {local_s:8.2f} s  {len(sources) / local_s:8.1f} images/s  (median of {args.repeats})")
    print(f"Ray, 1 node: {ray_s:8.2f} s  {len(sources) / ray_s:8.1f} images/s  (Ray's start, {ray_start:.1f} s, apart)")
    print(f"time ratio Ray / one process: {ray_s / local_s:.2f}x; largest difference in mean attention distance: "
          f"{drift:.2e} px")


def kill_resume(args, loaded, sources) -> None:
    """A real `vit-lens dataset` killed with SIGKILL mid-run and run again, checked against an uninterrupted run."""
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        (root / "images").mkdir()
        folder = written_folder(sources, root / "images")
        command = [sys.executable, "-m", "vit_core", "dataset", str(folder), "--model", args.model, "--random-init",
                   "--device", args.device, "--shards", str(args.shards), "--batch-size", str(args.batch_size)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        started = time.perf_counter()
        whole = subprocess.run([*command, "--out", str(root / "whole")], capture_output=True, text=True, env=env)
        print(f"uninterrupted run: {time.perf_counter() - started:.1f} s, exit {whole.returncode}")
        run = subprocess.Popen([*command, "--out", str(root / "killed")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
        parts = root / "killed" / "parts"
        while len(list(parts.glob("shard-*.npz"))) < max(1, args.shards // 3) and run.poll() is None:
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        run.wait()
        done = sorted(p.name for p in parts.glob("shard-*.npz"))
        print(f"killed (SIGKILL) with {len(done)} of {args.shards} shards written: {', '.join(done)}")
        started = time.perf_counter()
        again = subprocess.run([*command, "--out", str(root / "killed")], capture_output=True, text=True, env=env)
        print(f"rerun: {time.perf_counter() - started:.1f} s, exit {again.returncode}; its first line: "
              f"{again.stdout.splitlines()[0]!r}")
        a, b = (np.load(root / name / "dataset.npz") for name in ("whole", "killed"))
        worst = max(float(np.abs(a[key] - b[key]).max()) for key in a.files)
        tables = [[row.split(",")[:4] for row in (root / name / "images.csv").read_text().splitlines()]
                  for name in ("whole", "killed")]
        summary = json.loads((root / "killed" / "dataset.json").read_text())
        print(f"resumed result: {summary['num_images']} images; largest difference from the uninterrupted run over "
              f"dataset.npz: {worst:.2e}; the tables' files, labels and top-1 equal: {tables[0] == tables[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--batch-size", type=int, help="default: vit_core.dataset.default_batch_size of the device")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes that decode (both sides)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="bfloat16: both sides under torch.autocast (meant for a GPU)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timings of each side; medians reported")
    parser.add_argument("--ray", action="store_true", help="the Ray engine on this machine against the one-process run")
    parser.add_argument("--kill-resume", action="store_true", help="a `vit-lens dataset` killed mid-run and resumed")
    parser.add_argument("--shards", type=int, default=8, help="with --kill-resume: the run's shards")
    args = parser.parse_args()

    device = resolve_device(args.device)
    threads = configure_threads() if device.type == "cpu" else torch.get_num_threads()
    loaded = load_model(args.model, pretrained=False, seed=0, device=device)
    args.batch_size = args.batch_size or default_batch_size(device)
    sources = drawn_jpegs(args.images)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16"
                else contextlib.nullcontext())
    print(f"{args.model} (random init) on {describe_device(device)}, {args.dtype}, {threads} torch threads, "
          f"{args.images} images of 500 x 375 px (JPEG), batch {args.batch_size}, {args.workers} workers")
    if args.ray:
        return compare_ray(args, loaded, sources)
    if args.kill_resume:
        return kill_resume(args, loaded, sources)
    plain, reduced = [], []
    with autocast:
        plain_forwards(loaded, sources[:args.batch_size], args.batch_size, args.workers)  # warm-up
        dataset_pass(loaded, sources[:args.batch_size], args.batch_size, args.workers)
        for repeat in range(args.repeats):
            plain.append(plain_forwards(loaded, sources, args.batch_size, args.workers))
            reduced.append(dataset_pass(loaded, sources, args.batch_size, args.workers))
            print(f"  repeat {repeat + 1}: plain forwards {plain[-1]:.2f} s, analyze_dataset {reduced[-1]:.2f} s")
    plain_s, reduced_s = statistics.median(plain), statistics.median(reduced)
    print(f"plain forwards:  {plain_s:8.2f} s  {args.images / plain_s:8.1f} images/s  (median of {args.repeats})")
    print(f"analyze_dataset: {reduced_s:8.2f} s  {args.images / reduced_s:8.1f} images/s")
    print(f"time ratio analyze_dataset / plain: {reduced_s / plain_s:.2f}x  "
          f"(throughput {plain_s / reduced_s:.2f}x of the plain forward's)")


if __name__ == "__main__":
    main()
