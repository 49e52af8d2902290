"""Benchmark `vit-lens compare` (vit_core.compare) against the two `dataset` runs it replaces, and the memory of its
CKA sums.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m tools.benchmarks.compare [--model vit_base_patch16_224] [--images 16] [--repeats 3]
                                                 [--device cpu] [--cka-memory-only] [--command] [--floor]

Time: the same in-memory JPEGs (drawn here, 500 x 375 px), one process, no decoding workers. One side runs
`dataset`'s engine twice (`analyze_totals` of model A, then of model B: two random inits, seeds 0 and 1, of --model),
the other `compare_sources` (each image decoded once; both models' dataset reductions plus the comparison: CKA sums
of every pair of residual rows, attention JS, KL, rollout correlation). Interleaved --repeats times after a warm-up;
medians and their ratio (target: compare <= 1.1 x the two dataset runs).

Memory: the CKA sums' arrays for two --model models (FixedSums: an int64 and a uint32 limb per sum) computed from the
geometry (target for two ViT-B/16: under 2 GB), and the process's peak RSS after the runs (ru_maxrss).

--floor: the least compare can cost next to two dataset runs on this machine, whatever its engine: per image, the
float64 products the CKA sums are made of against one forward (`floor`).

--command: the command itself instead, `python -m vit_core compare` over --images drawn Shapes images enlarged to 256 px
(tools.benchmarks.concepts' draw_folder) in a temporary folder, --model at random init (seed 0) against its random init
under seed 1, one process: its wall time and the peak resident memory of its processes (getrusage of the children).
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from vit_core import load_model
from vit_core.compare import compare_sources
from vit_core.dataset import analyze_totals
from vit_core.loading.model import Geometry


def jpegs(count: int, seed: int = 0) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        pixels = (rng.random((375, 500, 3)) * 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        out.append((f"image_{i:04d}.jpg", buffer.getvalue()))
    return out


def cka_bytes(a: Geometry, b: Geometry) -> int:
    """Bytes of the CKA sums held while a run accumulates: cross (La+1, Lb+1, Da, Db), self_a, self_b, the column sums,
    each an int64 and a uint32 limb."""
    la, lb, da, db = a.num_layers + 1, b.num_layers + 1, a.embed_dim, b.embed_dim
    return (8 + 4) * (la * lb * da * db + la * da * da + lb * db * db + la * da + lb * db)


def run_command(model: str, images: int) -> None:
    """`python -m vit_core compare` over `images` drawn images: prints its wall time and its peak RSS."""
    from tools.benchmarks.concepts import draw_folder

    with tempfile.TemporaryDirectory() as temporary:
        folder, out = Path(temporary) / "images", Path(temporary) / "compare"
        folder.mkdir()
        draw_folder(folder, images, side=256)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "vit_core", "compare", str(folder), "--model", model, "--random-init",
                               "--random-init-b", "--seed-b", "1", "--out", str(out)], capture_output=True, text=True)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the command failed ({done.returncode}):\n{done.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # bytes: ru_maxrss is in KiB
    print(f"compare command: {seconds:.1f} s for {images} images; peak RSS {peak / 1e9:.2f} GB ({peak / 2**30:.2f} GiB)")


def floor(model: str, repeats: int) -> None:
    """The least `compare` can cost next to two `dataset` runs on this machine, whatever its engine: per image, the
    products analyses.md's CKA sums are made of (float64, one image: X^T Y for every pair of residual rows and X^T X,
    Y^T Y) against one forward of the model (random init, one 224 px image, torch's threads), medians of `repeats`
    interleaved rounds in one process. floor = (2 forwards + products) / 2 forwards."""
    import torch

    from tools.benchmarks.benchmark import interleaved_times

    loaded = load_model(model, pretrained=False, seed=0, device="cpu")
    g = loaded.geometry
    rows, tokens, width = g.num_layers + 1, g.num_patches, g.embed_dim
    x = torch.randn(1, 3, *g.img_size)
    residual = torch.randn(1, rows, tokens, width, dtype=torch.float64)  # (F, L+1, N, D): one image's patch rows

    def forward() -> None:
        with torch.inference_mode():
            loaded.model(x)

    def products() -> None:
        with torch.inference_mode():
            for _ in range(2):  # X^T X and Y^T Y
                residual.transpose(-1, -2) @ residual
            for i in range(rows):  # a row of A against every row of B, as compare's add_pair makes them
                residual[:, i:i + 1].transpose(-1, -2) @ residual

    times = interleaved_times({"forward": forward, "products": products}, repeats, warmups=1)
    forward_s, products_s = (statistics.median(times[name]) for name in ("forward", "products"))
    multiply_adds = (rows * rows + 2 * rows) * tokens * width * width
    print(f"{model}, one image: a forward {forward_s * 1e3:.0f} ms; the CKA sums' float64 products "
          f"({multiply_adds / 1e9:.1f} G multiply-adds) {products_s * 1e3:.0f} ms; torch threads {torch.get_num_threads()}")
    print(f"floor: (2 forwards + products) / 2 forwards = {(2 * forward_s + products_s) / (2 * forward_s):.2f}x "
          "(target <= 1.1x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cka-memory-only", action="store_true")
    parser.add_argument("--command", action="store_true", help="time the command and its peak RSS instead")
    parser.add_argument("--floor", action="store_true", help="the CKA sums' products against a forward instead")
    args = parser.parse_args()
    if args.command:
        run_command(args.model, args.images)
        return
    if args.floor:
        floor(args.model, args.repeats)
        return

    a = load_model(args.model, pretrained=False, seed=0, device=args.device)
    b = load_model(args.model, pretrained=False, seed=1, device=args.device)
    print(f"CKA sums for two {args.model}: {cka_bytes(a.geometry, b.geometry) / 2**30:.2f} GiB")
    if args.cka_memory_only:
        return
    sources = jpegs(args.images)
    compare_sources(a, b, sources[:1])  # warm-up
    analyze_totals(a, sources[:1])
    times: dict[str, list[float]] = {"two dataset runs": [], "compare": []}
    for _ in range(args.repeats):
        started = time.perf_counter()
        analyze_totals(a, sources)
        analyze_totals(b, sources)
        times["two dataset runs"].append(time.perf_counter() - started)
        started = time.perf_counter()
        compare_sources(a, b, sources)
        times["compare"].append(time.perf_counter() - started)
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{name}: median {median:.2f} s for {args.images} images ({args.images / median:.2f} images/s); runs "
              + ", ".join(f"{s:.2f}" for s in seconds))
    ratio = statistics.median(times["compare"]) / statistics.median(times["two dataset runs"])
    print(f"compare / two dataset runs: {ratio:.2f}x (target <= 1.1x)")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
