"""Procedural "Shapes" dataset for the bundled teaching ViT.

Every image holds exactly ONE shape (the class) on a cluttered background: smooth colour noise,
stripes or a gradient, plus distractors that are not shapes (thin lines, dots, salt-and-pepper
specks). Position, size, rotation, aspect ratio and colours are random. Alongside the image the
generator returns the object's pixel mask, so the teaching model can be checked against ground
truth: does attention land on the object?

How an image is drawn (all randomness from one ``numpy.random.Generator``, so a seed fixes the bytes):

1. background at the final resolution (float RGB, numpy);
2. clutter and the object are each drawn as a *coverage* mask with PIL on a canvas ``SUPERSAMPLE``
   times larger, box-downsampled to a coverage in [0, 1] (antialiasing) and alpha-composited;
3. the object goes on top of everything, so its mask is exactly ``coverage >= 0.5``;
4. a little pixel noise, then uint8.

Shapes are unit polygons (bounding box centred at 0, half-extent 1) that get scaled, stretched,
rotated and translated. The ring is an outer polygon with an inner hole, drawn in the same
coverage mask, so the hole shows the background and is not part of the mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

CLASS_NAMES: tuple[str, ...] = (
    "circle",
    "square",
    "triangle",
    "cross",
    "star",
    "ring",
    "heart",
    "arrow",
)

SUPERSAMPLE = 4  # canvas scale for antialiased drawing
OBJECT_FRACTION = (0.55, 0.85)  # unrotated object extent as a fraction of the image side: the outline
# must span enough 8 px patches to be told apart. Measured with the same 800-step pilot (16k images):
# 0.45-0.75 reached 59.6 % held-out accuracy, 0.55-0.85 68.7 %; at 0.32-0.60 a 586k-image run confused
# hearts, circles and squares and stopped at 72.6 %.
ASPECT_RANGE = (0.85, 1.18)  # width / height stretch of the unit shape (mild: a stretched circle is a heart-ish blob)
MIN_COLOUR_DISTANCE = 100.0  # RGB distance between the object and every background colour
RING_HOLE = 0.58  # inner radius of the ring, relative to the outer radius


@dataclass(frozen=True)
class Sample:
    """One generated image with its ground truth."""

    image: np.ndarray  # (H, W, 3) uint8
    mask: np.ndarray  # (H, W) bool, True on object pixels
    label: int  # index into CLASS_NAMES
    bbox: tuple[float, float, float, float]  # placed object's (x0, y0, x1, y1) in pixels


# ----------------------------------------------------------------------------- unit shapes
# Each returns a list of polygons (arrays (K, 2) of x, y; y points down) with a fill value:
# 1 adds to the mask, 0 cuts a hole.


def _regular(n: int, radius: float = 1.0, phase: float = -math.pi / 2) -> np.ndarray:
    t = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)  # (n, 2)


def _normalise(poly: np.ndarray) -> np.ndarray:
    """Centre the polygon's bounding box at 0 and scale its larger half-extent to 1."""
    lo, hi = poly.min(axis=0), poly.max(axis=0)
    return (poly - (lo + hi) / 2) / ((hi - lo).max() / 2)


def _star() -> np.ndarray:
    outer = _regular(5, 1.0)
    inner = _regular(5, 0.45, phase=-math.pi / 2 + math.pi / 5)
    return np.stack([outer, inner], axis=1).reshape(10, 2)  # (5, 2, 2) -> (10, 2) interleaved


def _cross(w: float = 0.34) -> np.ndarray:
    return np.array(
        [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w),
         (w, 1), (-w, 1), (-w, w), (-1, w), (-1, -w), (-w, -w)],
        dtype=float,
    )


def _heart(n: int = 96) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))  # y down
    return np.stack([x, y], axis=1)


def _arrow() -> np.ndarray:
    return np.array(
        [(-1, -0.24), (0.1, -0.24), (0.1, -0.62), (1, 0), (0.1, 0.62), (0.1, 0.24), (-1, 0.24)],
        dtype=float,
    )


def _unit_shape(name: str) -> list[tuple[np.ndarray, int]]:
    """Polygons of a class in unit coordinates, with fill 1 (object) or 0 (hole)."""
    if name == "circle":
        return [(_regular(64), 1)]
    if name == "square":
        return [(np.array([(-1, -1), (1, -1), (1, 1), (-1, 1)], dtype=float), 1)]
    if name == "triangle":
        return [(_normalise(_regular(3)), 1)]
    if name == "cross":
        return [(_cross(), 1)]
    if name == "star":
        return [(_normalise(_star()), 1)]
    if name == "ring":
        return [(_regular(64), 1), (_regular(64, RING_HOLE), 0)]
    if name == "heart":
        return [(_normalise(_heart()), 1)]
    if name == "arrow":
        return [(_arrow(), 1)]
    raise KeyError(f"unknown shape {name!r}; known: {CLASS_NAMES}")


_UNIT_SHAPES = {name: _unit_shape(name) for name in CLASS_NAMES}


# ----------------------------------------------------------------------------- drawing helpers


def _downsample(canvas: Image.Image, size: int) -> np.ndarray:
    """Box-average a supersampled 'L' canvas to a float coverage map (size, size) in [0, 1]."""
    assert canvas.size == (size * SUPERSAMPLE, size * SUPERSAMPLE), canvas.size
    small = canvas.reduce(SUPERSAMPLE)  # box filter in C: (H*s, W*s) -> (H, W), uint8
    return np.asarray(small, dtype=np.float32) * np.float32(1 / 255)


def _composite(img: np.ndarray, coverage: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """Alpha-blend a flat colour over img with per-pixel coverage. img (H, W, 3) float."""
    c = coverage[..., None]  # (H, W) -> (H, W, 1)
    return img + (colour.astype(np.float32) - img) * c


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, size=3)


def _background(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """A textured background (H, W, 3) float and the colours it is made of."""
    c1 = _random_colour(rng)
    c2 = np.clip(c1 + rng.uniform(-90, 90, size=3), 0, 255)
    kind = rng.integers(3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5  # pixel centres
    if kind == 0:  # smooth colour noise: a coarse random field, bicubic-upsampled
        k = int(rng.integers(3, 9))
        coarse = rng.uniform(0, 1, size=(k, k, 3))
        up = np.asarray(
            Image.fromarray((coarse * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC),
            dtype=np.float32,
        ) / 255.0
        bg = c1 * (1 - up) + c2 * up
    elif kind == 1:  # stripes with a random angle, period and sharpness
        theta = rng.uniform(0, math.pi)
        period = rng.uniform(4, 16) * size / 64
        phase = rng.uniform(0, 2 * math.pi)
        wave = np.sin(2 * math.pi * (xx * math.cos(theta) + yy * math.sin(theta)) / period + phase)
        t = np.clip(0.5 + 0.5 * rng.uniform(1, 4) * wave, 0, 1)[..., None]  # (H, W, 1)
        bg = c1 * (1 - t) + c2 * t
    else:  # linear gradient in a random direction
        theta = rng.uniform(0, 2 * math.pi)
        proj = (xx - size / 2) * math.cos(theta) + (yy - size / 2) * math.sin(theta)
        t = np.clip(proj / size + 0.5, 0, 1)[..., None]  # (H, W, 1)
        bg = c1 * (1 - t) + c2 * t
    return bg.astype(np.float32), [c1, c2]


def _draw_clutter(rng: np.random.Generator, img: np.ndarray, size: int) -> np.ndarray:
    """Thin lines and small dots in a few random colours: edges that are not a shape."""
    ss = size * SUPERSAMPLE
    for _ in range(int(rng.integers(1, 4))):  # colour groups
        canvas = Image.new("L", (ss, ss), 0)
        draw = ImageDraw.Draw(canvas)
        for _ in range(int(rng.integers(1, 4))):  # lines, ~1 px wide, may cross the image
            pts = rng.uniform(-0.1, 1.1, size=4) * ss
            width = int(round(rng.uniform(0.6, 1.3) * SUPERSAMPLE))
            draw.line([(pts[0], pts[1]), (pts[2], pts[3])], fill=255, width=max(width, 1))
        for _ in range(int(rng.integers(3, 16))):  # dots, radius 0.5-1.5 px
            x, y = rng.uniform(0, ss, size=2)
            r = rng.uniform(0.5, 1.5) * SUPERSAMPLE
            draw.ellipse([x - r, y - r, x + r, y + r], fill=255)
        img = _composite(img, _downsample(canvas, size), _random_colour(rng))
    # specks: isolated single pixels of random colour (salt and pepper)
    n_specks = int(rng.integers(0, size * size // 60))
    idx = rng.integers(0, size, size=(n_specks, 2))
    img[idx[:, 0], idx[:, 1]] = rng.uniform(0, 255, size=(n_specks, 3))
    return img


def _object_colour(rng: np.random.Generator, avoid: list[np.ndarray]) -> np.ndarray:
    """A random colour at least MIN_COLOUR_DISTANCE from every background colour."""
    for _ in range(50):
        c = _random_colour(rng)
        if min(np.linalg.norm(c - a) for a in avoid) >= MIN_COLOUR_DISTANCE:
            return c
    return 255.0 - np.mean(avoid, axis=0)  # fallback: the complement of the background


def _place(rng: np.random.Generator, name: str, size: int) -> tuple[list[tuple[np.ndarray, int]], tuple]:
    """Scale, stretch, rotate and translate the unit shape into pixel coordinates."""
    half = rng.uniform(*OBJECT_FRACTION) * size / 2
    aspect = math.exp(rng.uniform(math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])))
    sx, sy = half * min(1.0, aspect), half * min(1.0, 1.0 / aspect)  # larger side stays = half
    angle = rng.uniform(0, 2 * math.pi)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    polys = [((p * [sx, sy]) @ rot.T, fill) for p, fill in _UNIT_SHAPES[name]]
    pts = np.concatenate([p for p, _ in polys])
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    margin = 1.0
    if (hi - lo).max() > size - 2 * margin:  # a rotated large shape may not fit: shrink it
        k = (size - 2 * margin) / (hi - lo).max()
        polys, lo, hi = [(p * k, f) for p, f in polys], lo * k, hi * k
    # translate so that the bounding box lands uniformly inside the image (max(): a shrunk shape fits
    # exactly, and rounding can leave the interval a hair below empty)
    ox = rng.uniform(margin - lo[0], max(margin - lo[0], size - margin - hi[0]))
    oy = rng.uniform(margin - lo[1], max(margin - lo[1], size - margin - hi[1]))
    polys = [(p + [ox, oy], f) for p, f in polys]
    bbox = (float(lo[0] + ox), float(lo[1] + oy), float(hi[0] + ox), float(hi[1] + oy))
    return polys, bbox


def _object_coverage(polys: list[tuple[np.ndarray, int]], size: int) -> np.ndarray:
    ss = size * SUPERSAMPLE
    canvas = Image.new("L", (ss, ss), 0)
    draw = ImageDraw.Draw(canvas)
    for poly, fill in polys:
        draw.polygon([tuple(xy) for xy in poly * SUPERSAMPLE], fill=255 * fill)
    return _downsample(canvas, size)


# ----------------------------------------------------------------------------- public API


def draw_sample(rng: np.random.Generator, size: int = 64, label: int | None = None) -> Sample:
    """Draw one image with one shape of class ``label`` (random if None) and its mask."""
    if label is None:
        label = int(rng.integers(len(CLASS_NAMES)))
    assert 0 <= label < len(CLASS_NAMES), label
    bg, bg_colours = _background(rng, size)
    img = _draw_clutter(rng, bg, size)
    polys, bbox = _place(rng, CLASS_NAMES[label], size)
    coverage = _object_coverage(polys, size)
    img = _composite(img, coverage, _object_colour(rng, bg_colours))
    img = img + rng.normal(0, rng.uniform(0, 8), size=img.shape).astype(np.float32)  # sensor noise
    image = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return Sample(image=image, mask=coverage >= 0.5, label=int(label), bbox=bbox)


def make_dataset(
    n: int, seed: int | Sequence[int], size: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n samples with balanced classes in random order, reproducible from ``seed``.

    ``seed`` is anything ``numpy.random.default_rng`` takes: an int, or a sequence of ints such as
    ``(tag, seed, chunk)`` so that training can draw independent chunks in parallel processes.

    Returns images (n, H, W, 3) uint8, masks (n, H, W) bool, labels (n,) int64.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(CLASS_NAMES)).astype(np.int64)
    images = np.empty((n, size, size, 3), dtype=np.uint8)
    masks = np.empty((n, size, size), dtype=bool)
    for i, label in enumerate(labels):
        s = draw_sample(rng, size, int(label))
        images[i], masks[i] = s.image, s.mask
    return images, masks, labels


def sample_image(class_name: str, seed: int = 0, size: int = 64) -> Image.Image:
    """An example image of ``class_name`` for the dashboard (same seed, same image)."""
    if class_name not in CLASS_NAMES:
        raise KeyError(f"unknown shape {class_name!r}; known: {', '.join(CLASS_NAMES)}")
    label = CLASS_NAMES.index(class_name)
    rng = np.random.default_rng([seed, label])  # independent stream per class
    return Image.fromarray(draw_sample(rng, size, label).image)
