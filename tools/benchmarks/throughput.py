"""`vit-lens dataset` against the plain batched timm loop a researcher writes instead, on the same folder, quiet and
beside two CPU-bound processes (issue 55).

    .venv/bin/python -m tools.benchmarks.throughput [--quick] [--vit-images 256] [--shapes-images 2000]
                                                    [--repeats 1] [--only vit|shapes] [--before DIR]

Two folders are drawn here: ViT-B/16 (random init) on 400 x 300 JPEGs, and the Shapes ViT on the Shapes generator's
drawings (PNG). For each, in one alternated run (plain, dataset, [before]; quiet, then busy; `--repeats` times):

- plain: a Python process that imports timm, builds the model, and runs timm's own eval transform
  (`timm.data.create_transform` of the model's data config) and `model(x)` on batches of 32 under inference_mode, at
  torch's default threads; the top-1 of each image is all it computes;
- dataset: `python -m vit_core dataset FOLDER --model M --device cpu --out TMP` with its defaults (everything it
  computes: mean attention distances in both conventions, high-norm rates, top-1 and probability, the tables and the
  figure; no labels here);
- before (with `--before DIR`, a checkout of an older ViT Lens, e.g. `git archive be82362 | tar -x -C DIR`): the same
  command run from DIR, for before/after figures from the same minutes;
- busy: two `while True: pass` processes this script starts before and stops after the timings.

`--passes`: the dashboard's own forwards for one image instead (issue 55, item 2), each quiet and beside the busy
processes, in this process, alternated: a capture (`run_with_capture`) at 1 and at 2 torch threads, the Why? tab's
relevance maps (`explain.relevance_maps`: gradient passes at VIT_LENS_GRADIENT_THREADS = 1 and 2), and the judge's
curves (`explain.judge`, its forwards on lanes of one thread). Prints each one's median seconds.

`--pools`: how the W forwards run, in this process (model loaded and warm): the dataset's reduced forwards of N
random inputs on 1 and 2 worker threads (`dataset.forward_pool`), through the pool's trace (its recording included) and
eager (the trace turned off), against 2 worker processes (spawned and warmed before the timing, each with the model
and one worker thread) taking half the images each.

Each timing is a whole process, from its start to its exit (imports and model load included, on both sides). Prints
the seconds, images/s, the ratio of dataset's images/s to plain's, and the load average before each timing. The
issue's targets: dataset >= 0.9x plain quiet, >= 1.0x busy. `--quick`: 32 ViT-B/16 images and 400 Shapes, a few
minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]

# The yardstick: what a researcher writes with timm alone (the model built as `vit-lens dataset` builds it).
PLAIN = r"""
import pathlib, sys
import timm, torch
from PIL import Image
folder, name, batch = pathlib.Path(sys.argv[1]), sys.argv[2], 32
if name == "vit-lens/shapes-vit":  # the bundled weights: loaded as the project loads them, then plain timm
    from vit_core import load_model
    loaded = load_model(name)
    model, config = loaded.model, loaded.data_config
else:
    model = timm.create_model(name, pretrained=False).eval()
    config = timm.data.resolve_data_config(model=model)
transform = timm.data.create_transform(**config)
paths = sorted(p for p in folder.iterdir() if p.suffix in (".jpg", ".png"))
top1 = []
with torch.inference_mode():
    for first in range(0, len(paths), batch):
        x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[first:first + batch]])  # (B, 3, H, W)
        top1 += model(x).argmax(dim=-1).tolist()
assert len(top1) == len(paths)
"""

CASES = {  # name -> (model, dataset options)
    "vit": ("vit_base_patch16_224", ["--random-init"]),
    "shapes": ("vit-lens/shapes-vit", []),
}


def draw_photos(folder: Path, count: int, size: tuple[int, int] = (400, 300)) -> None:
    """`count` different 400 x 300 JPEGs: smooth gradients with a few rectangles."""
    import numpy as np
    from PIL import Image

    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    for i in range(count):
        rng = np.random.default_rng(i)
        image = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + y) / 17.0 + i)], axis=-1) * 200  # (H, W, 3)
        for _ in range(4):
            top, left = rng.integers(0, h - 60), rng.integers(0, w - 60)
            image[top:top + 60, left:left + 60] = rng.integers(0, 256, size=3)
        Image.fromarray(image.astype(np.uint8)).save(folder / f"photo{i:04d}.jpg", quality=90)


def draw_shapes(folder: Path, count: int) -> None:
    """`count` drawings of the Shapes generator (seed 0), as PNG files."""
    from PIL import Image

    from vit_core.teaching import data as shapes

    drawn = shapes.draw_set(count, 0)  # images (n, S, S, 3) uint8
    for i, image in enumerate(drawn.images):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        (folder / f"shape{i:04d}.png").write_bytes(buffer.getvalue())


def environment(pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIT_LENS_") and k != "OMP_NUM_THREADS"}
    return env | {"PYTHONPATH": str(pythonpath), "HF_HUB_OFFLINE": "1"}


def timed(command: list[str], env: dict[str, str]) -> float:
    """Wall seconds of `command` as a whole process; raises when it fails."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` CPU-bound Python loops for the block, stopped after."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(1.0)  # let them take their cores
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def one_image_passes(models: list[str], repeats: int, processes: int) -> None:
    """The dashboard's own passes on one drawn image, quiet and busy, alternated; medians printed."""
    import numpy as np
    from PIL import Image

    from vit_core.runtime import configure_threads

    configure_threads()
    image = Image.fromarray((np.random.default_rng(0).random((300, 400, 3)) * 255).astype(np.uint8))
    rows = [row for name in models for row in _model_passes(name, image, repeats, processes)]
    print(f"\n{'model':22} {'machine':7} {'pass':40} {'seconds':>8}")
    for name, condition, label, seconds in sorted(rows, key=lambda r: (r[0], r[2], r[1])):
        print(f"{name:22} {condition:7} {label:40} {seconds:8.3f}")


def _model_passes(name: str, image, repeats: int, processes: int) -> list[tuple[str, str, str, float]]:
    from vit_core import explain, load_model, run_with_capture
    from vit_core.runtime import torch_threads

    loaded = load_model(name, pretrained=name == "vit-lens/shapes-vit")
    relevance = explain.relevance_maps(loaded, image)  # warm-up, and the maps the judge reads
    passes = {
        "capture, 1 thread": lambda: _with_threads(torch_threads, 1, lambda: run_with_capture(loaded, image)),
        "capture, 2 threads": lambda: _with_threads(torch_threads, 2, lambda: run_with_capture(loaded, image)),
        "relevance maps, gradient threads 1": lambda: _gradient(1, lambda: explain.relevance_maps(loaded, image)),
        "relevance maps, gradient threads 2": lambda: _gradient(2, lambda: explain.relevance_maps(loaded, image)),
        "judge (lanes of 1 thread)": lambda: explain.judge(loaded, image, relevance.maps, relevance.target, steps=10),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for condition in ("quiet", "busy"):
            with busy(processes) if condition == "busy" else contextlib.nullcontext():
                for label, run in passes.items():
                    started = time.perf_counter()
                    run()
                    times.setdefault((condition, label), []).append(time.perf_counter() - started)
                    print(f"  {name} {condition} {label}: {times[(condition, label)][-1]:.3f} s", flush=True)
    return [(name, condition, label, statistics.median(seconds)) for (condition, label), seconds in times.items()]


_child_model = None


def _child_start(name: str) -> None:
    global _child_model
    from vit_core import load_model
    from vit_core.runtime import configure_threads

    configure_threads()
    _child_model = load_model(name, pretrained=name == "vit-lens/shapes-vit")


def _child_forwards(x) -> float:
    """In a spawned worker: the reduced forwards of x at one worker thread; returns the seconds."""
    from vit_core.dataset import forward_pool, reduce_batch

    started = time.perf_counter()
    with forward_pool(_child_model, 1) as pool:
        reduce_batch(_child_model, x, False, pool=pool)
    return time.perf_counter() - started


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """Inside the block, a pool's forwards run eager: no trace of them is recorded (dataset.reductions.traced_reductions)."""
    from vit_core.dataset import reductions

    recorded = reductions.traced_reductions
    reductions.traced_reductions = lambda *args: None
    try:
        yield
    finally:
        reductions.traced_reductions = recorded


def threads_or_processes(models: list[str], images: int, repeats: int) -> None:
    """1 and 2 worker threads in this process against 2 worker processes, alternated; medians printed."""
    import multiprocessing

    import torch

    from vit_core import load_model
    from vit_core.dataset import forward_pool, reduce_batch
    from vit_core.runtime import configure_threads

    configure_threads()
    for name in models:
        loaded = load_model(name, pretrained=name == "vit-lens/shapes-vit")
        x = torch.randn(images, 3, *loaded.data_config["input_size"][1:], generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {}
        with multiprocessing.get_context("spawn").Pool(2, initializer=_child_start, initargs=(name,)) as children:
            children.map(_child_forwards, [x[:2], x[:2]])  # warm: each child's first forwards
            for _ in range(repeats):
                for workers in (1, 2):
                    for how in ("traced", "eager"):
                        started = time.perf_counter()
                        with forward_pool(loaded, workers) as pool, _eager() if how == "eager" else contextlib.nullcontext():
                            reduce_batch(loaded, x, False, pool=pool)
                        times.setdefault(f"{workers} thread(s), {how}", []).append(time.perf_counter() - started)
                started = time.perf_counter()
                children.map(_child_forwards, [x[: images // 2], x[images // 2:]], chunksize=1)
                times.setdefault("2 processes", []).append(time.perf_counter() - started)
        for label, seconds in times.items():
            print(f"{name:22} {images} images, {label:22} {statistics.median(seconds):7.2f} s  "
                  f"({images / statistics.median(seconds):6.1f} images/s; load {os.getloadavg()[0]:.1f})", flush=True)


def _with_threads(torch_threads, threads: int, run) -> None:
    with torch_threads(threads):
        run()


def _gradient(threads: int, run) -> None:
    os.environ["VIT_LENS_GRADIENT_THREADS"] = str(threads)  # read by runtime.gradient_threads at each pass
    try:
        run()
    finally:
        os.environ.pop("VIT_LENS_GRADIENT_THREADS", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32 ViT-B/16 images and 400 Shapes")
    parser.add_argument("--vit-images", type=int, default=256)
    parser.add_argument("--shapes-images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=1, help="alternated rounds; medians reported")
    parser.add_argument("--only", choices=sorted(CASES), help="one model only")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the busy timings")
    parser.add_argument("--before", type=Path, help="a checkout of an older ViT Lens: its `dataset` timed alongside")
    parser.add_argument("--passes", action="store_true", help="the dashboard's own passes on one image instead")
    parser.add_argument("--pools", type=int, metavar="N", help="N images' forwards on threads against processes instead")
    args = parser.parse_args()
    if args.pools:
        models = [CASES[args.only][0]] if args.only else [model for model, _ in CASES.values()]
        return threads_or_processes(models, args.pools, max(args.repeats, 3))
    if args.passes:
        models = [CASES[args.only][0]] if args.only else [model for model, _ in CASES.values()]
        return one_image_passes(models, max(args.repeats, 3), args.busy)
    if args.quick:
        args.vit_images, args.shapes_images = 32, 400
    counts = {"vit": args.vit_images, "shapes": args.shapes_images}
    sides = {"plain": None, "dataset": REPO} | ({"before": args.before.resolve()} if args.before else {})
    print(f"{os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.1f}; {args.repeats} round(s); "
          f"busy = {args.busy} CPU-bound processes", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vit-lens-throughput-") as tmp:
        root = Path(tmp)
        for case in [args.only] if args.only else list(CASES):
            model, options = CASES[case]
            folder = root / case
            folder.mkdir()
            (draw_photos if case == "vit" else draw_shapes)(folder, counts[case])
            times: dict[tuple[str, str], list[float]] = {}
            loads: dict[tuple[str, str], list[float]] = {}
            for round_ in range(args.repeats):
                for condition in ("quiet", "busy"):
                    with busy(args.busy) if condition == "busy" else contextlib.nullcontext():
                        for side, checkout in sides.items():
                            load = os.getloadavg()[0]
                            if checkout is None:
                                command = [sys.executable, "-c", PLAIN, str(folder), model]
                                env = environment(REPO)
                            else:
                                out = root / f"out-{case}-{side}-{condition}-{round_}"
                                command = [sys.executable, "-m", "vit_core", "dataset", str(folder), "--model", model,
                                           *options, "--device", "cpu", "--out", str(out)]
                                env = environment(checkout)
                            seconds = timed(command, env)
                            times.setdefault((condition, side), []).append(seconds)
                            loads.setdefault((condition, side), []).append(load)
                            print(f"  {case} {condition} round {round_ + 1} {side}: {seconds:.1f} s "
                                  f"({counts[case] / seconds:.1f} images/s; load {load:.1f})", flush=True)
            for condition in ("quiet", "busy"):
                plain = statistics.median(times[(condition, "plain")])
                for side in sides:
                    seconds = statistics.median(times[(condition, side)])
                    rows.append((f"{model} x {counts[case]}", condition, side, seconds, counts[case] / seconds,
                                 plain / seconds, statistics.median(loads[(condition, side)])))
    print(f"\n{'model x images':32} {'machine':7} {'side':8} {'seconds':>8} {'images/s':>9} {'x plain':>8} {'load':>6}")
    for name, condition, side, seconds, rate, ratio, load in rows:
        print(f"{name:32} {condition:7} {side:8} {seconds:8.1f} {rate:9.1f} {ratio:8.2f} {load:6.1f}")


if __name__ == "__main__":
    main()
