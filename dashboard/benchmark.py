"""Server-side timings of the dashboard with AppTest (no browser, no network).

    .venv/bin/python -m dashboard.benchmark [--model vit_base_patch16_224] [--repeats 3]

Uses a RANDOM-INIT model (VIT_LENS_RANDOM_INIT=1): the same compute as the pretrained one, no
download. Prints, in milliseconds:
- new image: upload -> forward pass + the open view rendered, for each view;
- every view with the capture cached (what switching tabs costs), and their sum;
- control changes (layer, head, query, fusion, patch, resolution, ...), capture cached.
AppTest reruns the whole script on every change (sidebar, header and the open view), so the
control timings are an upper bound of what a fragment-only rerun costs in the browser.
Targets on a 2-core CPU: control change < 300 ms; new image shows all views < 2 s.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ("Pipeline", "Patches", "Filters", "Positions", "Attention", "Distance", "Prediction")
CONTROLS = [
    ("Attention", "slider", "layer", [0, 5]),
    ("Attention", "selectbox", "head", [3, -1]),
    ("Attention", "selectbox", "query", [20, 0]),
    ("Attention", "radio", "fusion", ["max", "mean"]),
    ("Attention", "slider", "rollout_layer", [3, 7]),
    ("Patches", "number_input", "patch", [3, 40]),
    ("Positions", "number_input", "pos_patch", [3, 40]),
    ("Positions", "select_slider", "pos_res", ["first", "last"]),
    ("Distance", "toggle", "mad_renorm", [True, False]),
    ("Prediction", "slider", "topk", [10, 5]),
]


def _png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, size=(300, 400, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def _timed(at) -> float:
    started = time.perf_counter()
    at.run()
    seconds = time.perf_counter() - started
    assert not at.exception, [e.value for e in at.exception]
    return seconds * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["VIT_LENS_MODEL"] = args.model
    os.environ["VIT_LENS_RANDOM_INIT"] = "1"
    sys.path.insert(0, str(ROOT))
    from streamlit.testing.v1 import AppTest

    app = str(ROOT / "dashboard" / "app.py")
    at = AppTest.from_file(app, default_timeout=300)
    print(f"model {args.model} (random init: same compute as pretrained), torch threads from the CPU quota")
    print(f"first run (imports, model build, first forward): {_timed(at):.0f} ms")
    for view in VIEWS:  # warm every view once (matplotlib fonts, caches)
        at.session_state["view"] = view
        _timed(at)

    print("\nnew image (upload -> forward pass + the open view), ms:")
    seed = 100
    new_image = {}
    for view in VIEWS:
        at.session_state["view"] = view
        times = []
        for _ in range(args.repeats):
            seed += 1
            at.file_uploader(key="upload").set_value((f"bench{seed}.png", _png(seed), "image/png"))
            times.append(_timed(at))
        new_image[view] = statistics.median(times)
        print(f"  {view:<11} {new_image[view]:7.0f}")

    print("\nevery view, capture cached (a tab switch), ms:")
    cached = {}
    for view in VIEWS:
        times = []
        for _ in range(args.repeats):
            at.session_state["view"] = view
            times.append(_timed(at))
        cached[view] = statistics.median(times)
        print(f"  {view:<11} {cached[view]:7.0f}")
    forward = min(new_image.values()) - min(cached.values())
    print(f"  sum of all views {sum(cached.values()):.0f}; new image + all views: about "
          f"{new_image['Pipeline'] + sum(v for k, v in cached.items() if k != 'Pipeline'):.0f}")

    print("\ncontrol change (full-script AppTest rerun, capture cached), ms:")
    for view, widget, key, values in CONTROLS:
        at.session_state["view"] = view
        _timed(at)
        element = getattr(at, widget)(key=key)
        if values == ["first", "last"]:
            values = [int(element.options[0].split(" x")[0]), int(element.options[-1].split(" x")[0])]
        times = []
        for i in range(args.repeats * 2):
            getattr(at, widget)(key=key).set_value(values[i % 2])
            times.append(_timed(at))
        print(f"  {view + ' ' + key:<24} median {statistics.median(times):5.0f}  max {max(times):5.0f}")
    print(f"\n(forward pass alone, roughly: {forward:.0f} ms)")


if __name__ == "__main__":
    main()
