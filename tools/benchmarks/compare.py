"""Benchmark `vit-lens compare` (vit_core.compare) against the two `dataset` runs it replaces, and the memory of its
CKA sums.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m tools.benchmarks.compare [--model vit_base_patch16_224] [--images 16] [--repeats 3]
                                                 [--device cpu] [--cka-memory-only]

Time: the same in-memory JPEGs (drawn here, 500 x 375 px), one process, no decoding workers. One side runs
`dataset`'s engine twice (`analyze_totals` of model A, then of model B: two random inits, seeds 0 and 1, of --model),
the other `compare_sources` (each image decoded once; both models' dataset reductions plus the comparison: CKA sums
of every pair of residual rows, attention JS, KL, rollout correlation). Interleaved --repeats times after a warm-up;
medians and their ratio (target: compare <= 1.1 x the two dataset runs).

Memory: the CKA sums' arrays for two --model models (FixedSums: two int64 limbs per sum) computed from the geometry
(target for two ViT-B/16: under 2 GB), and the process's peak RSS after the runs (ru_maxrss).
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import time

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
    each two int64 limbs."""
    la, lb, da, db = a.num_layers + 1, b.num_layers + 1, a.embed_dim, b.embed_dim
    return 2 * 8 * (la * lb * da * db + la * da * da + lb * db * db + la * da + lb * db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cka-memory-only", action="store_true")
    args = parser.parse_args()

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
