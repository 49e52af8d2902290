"""The small labelled folder the shard, merge and Ray tests analyse: images under class folders (and one directly in
the folder, unlabelled), an unreadable image, and files that are not images."""

from __future__ import annotations

from pathlib import Path

from conftest import drawn_image

IMAGES = {"0/a.png": 0, "0/b.png": 0, "1/c.png": 1, "1/d.png": 1, "1/e.png": 1, "f.png": None, "0/g.png": 0}  # -> label


def labelled_folder(root: Path) -> Path:
    """IMAGES drawn into `root` (90 x 120 px each), plus 1/broken.png (not an image under an image's name), notes.txt
    and phone.heic (not image files ViT Lens reads)."""
    for seed, name in enumerate(IMAGES):
        (root / name).parent.mkdir(exist_ok=True)
        drawn_image(seed, (90, 120)).save(root / name)
    (root / "1" / "broken.png").write_text("not an image")
    (root / "notes.txt").write_text("a note")
    (root / "phone.heic").write_bytes(b"\x00\x00\x00\x18ftypheic")
    return root


def shapes_concepts(folder: Path, out: Path, count: int, seed: int, features: int, k: int, epochs: int) -> Path:
    """`count` Shapes drawn with `seed` into class folders under `folder`, and `vit-lens concepts` on them at the
    Shapes ViT's block 2 into `out` (a small autoencoder of `features` features, `k` active, for the app tests)."""
    from PIL import Image

    from vit_core import __main__ as core_cli
    from vit_core.loading import TEACHING_MODEL
    from vit_core.teaching.data import LABELS, draw_set

    drawn = draw_set(count, seed=seed)
    for i, image in enumerate(drawn.images):
        (folder / LABELS[drawn.labels[i]]).mkdir(exist_ok=True)
        Image.fromarray(image).save(folder / LABELS[drawn.labels[i]] / f"{i:02d}.png")
    assert core_cli.main(["concepts", str(folder), "--model", TEACHING_MODEL, "--layer", "2", "--features", str(features),
                          "--k", str(k), "--epochs", str(epochs), "--workers", "0", "--out", str(out)]) == 0
    return out
