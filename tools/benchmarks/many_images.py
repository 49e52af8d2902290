"""The Many images page's run (`dashboard.image_sets.run_set`) on its default 128 Shapes, in this checkout.

    .venv/bin/python -m tools.benchmarks.many_images [--images 128] [--chunks 32,8]

Loads the Shapes ViT as the page does, warms it on 4 other drawings, then times the page's whole run (decode, the
engine's forwards, the totals and the files) once per chunk size given, alternated, twice: the chunk is how many
images run between two looks at the run's budget (`image_sets.RUN_CHUNK`). Run it from an older checkout (with
PYTHONPATH at that checkout and without --chunks) for before/after figures; beside two `while True: pass` processes
for the busy ones. The target: 128 Shapes within 20 s beside two busy processes.
"""

from __future__ import annotations

import argparse
import time

from dashboard import image_sets
from dashboard.image_sets import run_set, shapes_set
from dashboard.models import ModelRequest, build_named_model
from vit_core import TEACHING_MODEL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--chunks", default="", help="chunk sizes to compare, e.g. 32,8 (default: the page's own)")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",") if c] or [None]
    loaded = build_named_model(TEACHING_MODEL, False)
    request, image_set = ModelRequest(TEACHING_MODEL), shapes_set(loaded, args.images, 0)
    run_set(request, loaded, shapes_set(loaded, 4, 1))  # warm: the model's first forwards
    for _ in range(2):
        for chunk in chunks:
            if chunk is not None:
                image_sets.RUN_CHUNK = chunk
            started = time.perf_counter()
            run = run_set(request, loaded, image_set)
            label = "the page's chunk" if chunk is None else f"chunk {chunk}"
            print(f"{args.images} Shapes, {label}: {time.perf_counter() - started:.2f} s "
                  f"({run.result.num_images} analysed)", flush=True)


if __name__ == "__main__":
    main()
