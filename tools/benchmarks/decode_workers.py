"""What a decode in a worker process (vit_core.images.decoding) costs against the same decode in this process.

    .venv/bin/python -m tools.benchmarks.decode_workers [--repeats 20]

Files drawn here: a 12 MP JPEG photo (4032 x 3024, smooth noise, quality 90; decoded at 1/4, 1008 x 756) and a
small PNG (320 x 240). Each is decoded `--repeats` times each way, interleaved, after one warm-up each (the
worker's start is not counted); the medians of wall time are reported, with the parent's CPU time per decode.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from vit_core.images import decode_here, decode_image


def _files() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    small = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    files = {}
    for name, size, fmt, options in [("12 MP JPEG photo", (4032, 3024), "JPEG", {"quality": 90}),
                                     ("320 x 240 PNG", (320, 240), "PNG", {})]:
        buffer = io.BytesIO()
        small.resize(size, Image.BICUBIC).save(buffer, format=fmt, **options)
        files[name] = buffer.getvalue()
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for name, data in _files().items():
        times: dict[str, list[tuple[float, float]]] = {"in this process": [], "in a worker": []}
        ways = {"in this process": decode_here, "in a worker": decode_image}
        for way in ways.values():
            way(data)  # warm-up (the worker starts here)
        for _ in range(args.repeats):
            for label, way in ways.items():
                wall, cpu = time.perf_counter(), time.process_time()
                way(data)
                times[label].append((time.perf_counter() - wall, time.process_time() - cpu))
        print(f"{name} ({len(data) / 1e3:.0f} KB):")
        for label, samples in times.items():
            print(f"  {label:16s} median wall {statistics.median(s[0] for s in samples) * 1000:7.1f} ms, "
                  f"parent CPU {statistics.median(s[1] for s in samples) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
