"""The built-in example images: a photo, a scene the app draws itself, and the teaching shapes. No Streamlit here.

`example_bytes` makes the file bytes of an example (`dashboard.caches` caches them per name).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from vit_core.loading import TEACHING_MODEL
from vit_core.teaching.data import CLASS_NAMES, IMAGE_SIZE, sample_image

GRACE_HOPPER = "Grace Hopper (photo)"
SYNTHETIC_SCENE = "Synthetic scene (drawn by the app)"
SHAPE_PREFIX = "Shape: "
# The shape examples are drawn by the training generator with this seed, at the teaching model's input
# size. The model gets all eight right (tests/test_teaching_model.py checks it through the app's path).
SHAPE_EXAMPLE_SEED = 2
SHAPE_EXAMPLE_SIDE = IMAGE_SIZE


def synthetic_scene(size: int = 448) -> bytes:
    """A simple scene the app draws itself: sky, sun, hills, a house and a tree (PNG bytes)."""
    im = Image.new("RGB", (size, size))
    sky = np.linspace([120, 180, 250], [220, 235, 255], size).astype(np.uint8)  # (size, 3): one colour per row
    im.paste(Image.fromarray(np.ascontiguousarray(np.broadcast_to(sky[:, None, :], (size, size, 3)))))
    d = ImageDraw.Draw(im)
    u = size / 100
    d.ellipse([75 * u, 8 * u, 92 * u, 25 * u], fill=(255, 210, 60))
    d.ellipse([-30 * u, 55 * u, 70 * u, 130 * u], fill=(90, 160, 80))
    d.ellipse([40 * u, 60 * u, 140 * u, 130 * u], fill=(70, 140, 60))
    d.rectangle([20 * u, 52 * u, 48 * u, 78 * u], fill=(200, 70, 60))
    d.polygon([(16 * u, 53 * u), (34 * u, 36 * u), (52 * u, 53 * u)], fill=(110, 60, 40))
    d.rectangle([30 * u, 64 * u, 38 * u, 78 * u], fill=(80, 50, 30))
    d.rectangle([70 * u, 55 * u, 74 * u, 75 * u], fill=(100, 70, 40))
    d.ellipse([62 * u, 38 * u, 82 * u, 60 * u], fill=(40, 120, 50))
    return _png(im.filter(ImageFilter.GaussianBlur(0.6)))


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def example_names() -> list[str]:
    return [GRACE_HOPPER, SYNTHETIC_SCENE] + [f"{SHAPE_PREFIX}{s}" for s in CLASS_NAMES]


def example_bytes(name: str) -> bytes:
    """The file bytes of a built-in example image."""
    if name == GRACE_HOPPER:
        import matplotlib.cbook

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            return f.read()
    if name.startswith(SHAPE_PREFIX):
        return _png(sample_image(name.removeprefix(SHAPE_PREFIX), seed=SHAPE_EXAMPLE_SEED, size=SHAPE_EXAMPLE_SIDE))
    return synthetic_scene()


def default_example(model_name: str) -> str:
    """The photo, or for the teaching model its first shape."""
    names = example_names()
    if model_name == TEACHING_MODEL and len(names) > 2:
        return names[2]
    return names[0]
