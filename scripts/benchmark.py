"""Benchmark the core: plain timm forward vs run_with_capture vs capture + all analyses.

    .venv/bin/python scripts/benchmark.py [--model vit_base_patch16_224] [--repeats 15]

Measured in one run on the same image, interleaved so that machine noise hits each variant alike;
medians are reported. Pretrained weights are not needed (nor available offline): a random init of
the same architecture costs exactly the same arithmetic. Targets (issue 2): capture within 1.15x of
the plain fused forward, capture + all analyses within 1.3x. "All analyses" are the per-image
ones of the export (attention distance in both conventions, rollout, probabilities); the per-model
ones (filter PCA, position similarity) are computed once per model and reported separately.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads: see vit_core/__init__.py

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit_core import load_model, preprocess, run_with_capture  # noqa: E402
from vit_core.export import analysis_arrays, model_arrays  # noqa: E402
from vit_core.runtime import bf16_supported, configure_threads  # noqa: E402


def sample_image():
    import matplotlib.cbook
    from PIL import Image

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        return Image.open(f).convert("RGB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    threads = configure_threads()
    loaded = load_model(args.model, pretrained=False)
    image = sample_image()
    started = time.perf_counter()
    model_arrays(loaded)  # filter PCA + position similarity: once per model, cached
    per_model_seconds = time.perf_counter() - started

    def plain():
        _, x = preprocess(loaded, image)
        with torch.inference_mode():
            loaded.model(x)

    def capture():
        run_with_capture(loaded, image)

    def capture_and_analyses():
        analysis_arrays(loaded, run_with_capture(loaded, image))

    variants = {"plain timm forward (fused attention)": plain, "run_with_capture": capture,
                "run_with_capture + all analyses": capture_and_analyses}
    for fn in variants.values():  # warm-up: allocator, oneDNN kernels
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)

    base = statistics.median(times["plain timm forward (fused attention)"])
    g = loaded.geometry
    print(f"{args.model} (random init), batch 1, {g.img_size[0]}x{g.img_size[1]}, {g.num_tokens} tokens, "
          f"CPU, torch {torch.__version__}, {threads} threads, median of {args.repeats}")
    print(f"{'':40s} {'median ms':>10s} {'p90 ms':>8s} {'ratio':>6s}")
    for name, samples in times.items():
        median = statistics.median(samples)
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        print(f"{name:40s} {median * 1e3:10.1f} {p90 * 1e3:8.1f} {median / base:6.2f}")
    print(f"once per model (filter PCA, position-embedding similarity): {per_model_seconds * 1e3:.0f} ms")
    report_bf16(loaded, image, args.repeats, statistics.median(times["run_with_capture"]))


def report_bf16(loaded, image, repeats: int, fp32_seconds: float) -> None:
    """The opt-in bf16 fast mode: speed-up and largest attention error against fp32, or why not."""
    if not bf16_supported():
        print("bf16 fast mode: not offered, this CPU has no native bf16 (avx512_bf16 / amx_bf16)")
        return
    reference = run_with_capture(loaded, image)
    fast = run_with_capture(loaded, image, bf16=True)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run_with_capture(loaded, image, bf16=True)
        samples.append(time.perf_counter() - started)
    bf16_seconds = statistics.median(samples)
    error = float(abs(fast.pattern - reference.pattern).max())
    print(f"bf16 fast mode: {bf16_seconds * 1e3:.1f} ms, {fp32_seconds / bf16_seconds:.2f}x faster than fp32 capture, "
          f"largest attention error {error:.2e}, top-1 {'same' if fast.logits.argmax() == reference.logits.argmax() else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
