"""Make the bundled concepts of the Shapes ViT (vit_core/assets/shapes_concepts) from drawings the teaching
generator makes, so that the Concepts tab works out of the box, offline.

    .venv/bin/python -m tools.teaching.make_concepts [--out vit_core/assets/shapes_concepts]

Draws IMAGES pictures with `vit_core.teaching.data.draw_set` (seeded: the same pictures every time), runs
`vit-lens concepts` on them at block LAYER (FEATURES features, K active), then keeps what the tab needs:
concepts.safetensors, concepts.json with its `folder` made relative ("images": under the concepts' own folder) and
each feature's top patches cut to TOP, the contact sheet, and only the drawings those top patches name. A few MB in
all; it ships as package data (pyproject.toml).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from PIL import Image

from vit_core import __main__ as core_cli
from vit_core.concepts import CONCEPTS_FILE, SHEET_FILE, SUMMARY_FILE
from vit_core.teaching.data import LABELS, draw_set
from vit_core.teaching.model import TEACHING_MODEL

OUT = Path(__file__).resolve().parents[2] / "vit_core" / "assets" / "shapes_concepts"
IMAGES, SEED, LAYER, FEATURES, K, EPOCHS, TOP = 162, 53, 2, 384, 16, 8, 8
IMAGE_FOLDER = "images"  # concepts.json's folder, relative to the concepts' folder


def draw_folder(folder: Path) -> None:
    """IMAGES drawings, one sub-folder per label (as a user's folder of shapes)."""
    drawn = draw_set(IMAGES, seed=SEED)
    for i, image in enumerate(drawn.images):
        label = LABELS[int(drawn.labels[i])]
        (folder / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / label / f"{i:03d}.png", optimize=True)


def shipped_summary(summary: dict) -> dict:
    """concepts.json with its folder relative to the concepts' own and each feature's top patches cut to TOP."""
    features = [{**feature, "top": feature["top"][:TOP]} for feature in summary["features"]]
    return {**summary, "folder": IMAGE_FOLDER, "features": features, "seconds": {}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder, run = Path(tmp) / "shapes", Path(tmp) / "run"
        draw_folder(folder)
        status = core_cli.main(["concepts", str(folder), "--model", TEACHING_MODEL, "--layer", str(LAYER),
                                "--features", str(FEATURES), "--k", str(K), "--epochs", str(EPOCHS), "--seed", "0",
                                "--workers", "0", "--out", str(run)])
        if status != 0:
            return status
        summary = shipped_summary(json.loads((run / SUMMARY_FILE).read_text(encoding="utf-8")))
        if args.out.exists():
            shutil.rmtree(args.out)
        (args.out / IMAGE_FOLDER).mkdir(parents=True)
        shutil.copy(run / CONCEPTS_FILE, args.out / CONCEPTS_FILE)
        shutil.copy(run / SHEET_FILE, args.out / SHEET_FILE)
        (args.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        for name in sorted({top["file"] for feature in summary["features"] for top in feature["top"]}):
            (args.out / IMAGE_FOLDER / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / name, args.out / IMAGE_FOLDER / name)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {size / 2 ** 20:.1f} MB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
