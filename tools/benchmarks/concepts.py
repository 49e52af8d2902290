"""Benchmark the concept lens (vit_core.concepts): `vit-lens concepts` end to end, the Concepts tab's work for one
image, and the peak memory of a large run.

    .venv/bin/python -m tools.benchmarks.concepts shapes [--images 2000] [--features 2048] [--k 32] [--epochs 4]
    .venv/bin/python -m tools.benchmarks.concepts vit-b [--images 1000] [--expansion 8] [--k 32] [--epochs 1] [--layer 6]

shapes: the bundled Shapes ViT over --images drawn Shapes images (vit_core.teaching.data, written as PNG into a
temporary folder), layer 2, through the command itself (`python -m vit_core concepts`, default workers): the
collection and the training (and the metrics, the contact sheet) timed by the command's own stages (concepts.json's
"seconds"), and the wall time of the whole command. Then the tab's work for one drawn image with those concepts: its
features from a capture (`image_concepts`, what the tab computes; the capture itself is the page's and is timed
apart) and one concept removed (a forward with the splice). Target: the command within 5 minutes on 2 cores; the
tab's features within 0.3 s.

vit-b: vit_base_patch16_224 at random init (seed 0) over --images drawn Shapes images enlarged to 256 px, layer 6,
--expansion x 768 features: wall time of the command and its peak resident memory (the largest of the command's
process and its decoding workers, from getrusage of the children).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image


def draw_folder(folder: Path, count: int, side: int | None = None) -> None:
    from vit_core.teaching.data import LABELS, draw_set

    for first in range(0, count, 250):  # in chunks: a drawn set is held in memory
        drawn = draw_set(min(250, count - first), seed=(46, first))
        for i, (image, label) in enumerate(zip(drawn.images, drawn.labels, strict=True)):
            (folder / LABELS[label]).mkdir(exist_ok=True)
            picture = Image.fromarray(image)
            if side:
                picture = picture.resize((side, side), Image.Resampling.BICUBIC)
            picture.save(folder / LABELS[label] / f"{first + i:05d}.png")


def run_command(args: list[str]) -> tuple[float, int]:
    """`python -m vit_core concepts ARGS`: its wall time (s) and the peak resident memory (MiB) of its processes."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vit_core", "concepts", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the command failed ({done.returncode}):\n{done.stderr[-2000:]}")
    print(done.stdout.strip().splitlines()[-1])
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024


def tab_timings(out: Path, repeats: int = 7) -> dict[str, float]:
    import torch

    from vit_core import load_model, run_with_capture
    from vit_core.concepts import image_concepts, load_concepts, logits_with_concept_removed
    from vit_core.teaching.data import sample_image

    torch.set_num_threads(2)
    loaded = load_model("vit-lens/shapes-vit", device="cpu")
    concepts = load_concepts(out)
    image = sample_image("star", seed=3)
    capture, features, removal = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        cap = run_with_capture(loaded, image)
        capture.append(time.perf_counter() - started)
        started = time.perf_counter()
        seen = image_concepts(concepts, cap)
        features.append(time.perf_counter() - started)
        started = time.perf_counter()
        logits_with_concept_removed(loaded, cap, concepts, int(seen.strongest[0]))
        removal.append(time.perf_counter() - started)
    return {"capture_s": statistics.median(capture), "features_s": statistics.median(features),
            "removal_s": statistics.median(removal)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=("shapes", "vit-b"))
    parser.add_argument("--images", type=int)
    parser.add_argument("--features", type=int)
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--layer", type=int)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder, out = Path(temporary) / "images", Path(temporary) / "concepts"
        folder.mkdir()
        if args.which == "shapes":
            images, features, epochs, layer = args.images or 2000, args.features or 2048, args.epochs or 4, args.layer or 2
            draw_folder(folder, images)
            command = [str(folder), "--model", "vit-lens/shapes-vit"]
        else:
            images, epochs, layer = args.images or 1000, args.epochs or 1, args.layer if args.layer is not None else 6
            features = args.features or args.expansion * 768
            draw_folder(folder, images, side=256)
            command = [str(folder), "--model", "vit_base_patch16_224", "--random-init"]
        seconds, peak_mib = run_command([*command, "--layer", str(layer), "--features", str(features), "--k", str(args.k),
                                         "--epochs", str(epochs), "--out", str(out)])
        summary = json.loads((out / "concepts.json").read_text())
        result = {"which": args.which, "images": images, "features": features, "k": args.k, "epochs": epochs,
                  "layer": layer, "command_s": round(seconds, 1), "peak_rss_mib": peak_mib,
                  "stages_s": summary["seconds"], "fvu": round(summary["fvu"], 4),
                  "dead_fraction": round(summary["dead_fraction"], 4),
                  "spliced_top1_agreement": summary["spliced_top1_agreement"], "spliced_kl": round(summary["spliced_kl"], 4),
                  "tokens_mib": round(sum(p.stat().st_size for p in (out / "tokens").rglob("tokens-*.npy")) / 2 ** 20)}
        if args.which == "shapes":
            result |= {key: round(value, 4) for key, value in tab_timings(out).items()}
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
