"""Which explanation to trust on the Shapes ViT: every method under every test, beside random, on the dashboard's
eight shape examples (ground truth: the generator's silhouettes) and on three shapes drawn as a student draws them on
the canvas (black strokes of the default pen on the 232 px paper; ground truth: the strokes widened by the pen).

    python -m tools.teaching.judge_examples [--steps S] [--out FILE.md]

Prints, per image, the Why? tab's own table (dashboard.views.why.trust_table: each score with its verdict, the random
row as mean ± std) and its sentence on where the tests agree; then, over the eleven images, each method's mean score
and rank under each test and Kendall's tau-b between the tests' rankings (explain.summarise).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from vit_core.runtime import one_blas_thread

one_blas_thread()

from dashboard import draw, examples, ground_truth  # noqa: E402
from dashboard.views import many_images  # noqa: E402
from dashboard.views.why import agreement_sentence, trust_table  # noqa: E402
from vit_core import analyses, explain, load_model, run_with_capture  # noqa: E402
from vit_core.loading import TEACHING_MODEL  # noqa: E402


def _polygon(points: list[tuple[float, float]], side: int = draw.CANVAS_PX) -> Image.Image:
    """A closed outline drawn with the canvas's default pen (black, DEFAULT_STROKE_PX, round joints) on white paper."""
    canvas = Image.new("RGB", (side, side), draw.PAPER)
    pen = ImageDraw.Draw(canvas)
    scaled = [(x * side, y * side) for x, y in points]
    pen.line(scaled + scaled[:1], fill=draw.DEFAULT_INK, width=draw.DEFAULT_STROKE_PX, joint="curve")
    r = draw.DEFAULT_STROKE_PX / 2
    for x, y in scaled:  # round ends and corners, as a felt pen leaves them
        pen.ellipse([x - r, y - r, x + r, y + r], fill=draw.DEFAULT_INK)
    return canvas


def drawn_shapes() -> dict[str, Image.Image]:
    """A star, a triangle and a heart as a student draws them with a mouse: a little off-centre, not quite regular."""
    star = [(0.5 + (0.36 if k % 2 == 0 else 0.15) * math.sin(k * math.pi / 5),
             0.52 - (0.36 if k % 2 == 0 else 0.15) * math.cos(k * math.pi / 5)) for k in range(10)]
    triangle = [(0.48, 0.16), (0.86, 0.8), (0.14, 0.78)]
    heart = [(0.5 + 0.022 * 16 * math.sin(t) ** 3,
              0.47 - 0.022 * (13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)))
             for t in np.linspace(0, 2 * math.pi, 48, endpoint=False)]
    return {"drawn star": _polygon(star), "drawn triangle": _polygon(triangle), "drawn heart": _polygon(heart)}


def images_with_objects() -> list[tuple[str, Image.Image, np.ndarray, str]]:
    """(name, picture, object mask (H, W) bool, where the mask comes from) for the eight examples and three drawings."""
    found = []
    for name in examples.example_names():
        mask = ground_truth.example_mask(name)
        if mask is not None:
            found.append((name, Image.open(io.BytesIO(examples.example_bytes(name))).convert("RGB"), mask,
                          "silhouette"))
    for name, picture in drawn_shapes().items():
        found.append((name, picture, ground_truth.drawing_mask(picture, draw.DEFAULT_STROKE_PX), "strokes + pen"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=explain.DEFAULT_STEPS)
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) here")
    args = parser.parse_args(argv)
    loaded = load_model(TEACHING_MODEL)
    lines: list[str] = [f"Shapes ViT ({loaded.name}), {args.steps} steps, {explain.RANDOM_ORDERS} random orders", ""]
    judgements = []
    for name, picture, mask, source in images_with_objects():
        start = time.perf_counter()
        cap = run_with_capture(loaded, picture)
        relevance = explain.relevance_maps(loaded, cap, cap=cap)
        objects = explain.object_patches(loaded, mask, picture.size)
        judged = explain.judge(loaded, cap, relevance.maps, relevance.target, mask=objects, steps=args.steps,
                               reuse=relevance.choice_sets)
        judgements.append(judged)
        methods = list(relevance.maps)
        picks = ", ".join(f"{m}: {c.name}" for m, c in relevance.gamma_choice.items())
        p = float(analyses.softmax(cap.logits)[relevance.target])
        lines += [f"### {name}: predicted {loaded.label(relevance.target)}, p = {p:.3f}; "
                  f"object ({source}) {int(objects.sum())} of {objects.size} patches; LRP rules chosen: {picks}; "
                  f"{time.perf_counter() - start:.1f} s", "",
                  trust_table(judged, methods), "", agreement_sentence(judged, methods), ""]
        print("\n".join(lines[-7:]), flush=True)
    folder = explain.summarise(judgements)
    lines += ["### Over the eleven images", "", "Mean (rank among the methods, share of images beating random):", "",
              many_images.trust_table(folder), "", "Kendall's tau-b between the tests' rankings of the methods:", "",
              many_images.agreement_table(folder)]
    print("\n".join(lines[-(len(folder.methods) + len(folder.tests) + 12):]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
