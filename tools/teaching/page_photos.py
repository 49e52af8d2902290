"""Phone photos of the 8 shapes drawn with a pen on a sheet of paper: a held-out check of the teaching model
on what a student uploads after drawing on paper, never used in training.

Each photo is a full-size JPEG (1200 x 900 or 900 x 1200, like a phone's, smaller), so it goes through the
app's own path: ``vit_core.images.load_image`` then timm's eval transform (resize the shorter side, centre
crop). The drawing is made at the photo's resolution, so a pen a few pixels wide ends up under a pixel wide at
the model's 96 px. Its own primitives (not the training generator's): parametric outlines, a pen that
retraces its line once or twice with a shaky hand, a marker fill now and then; the sheet lies on a table at
an angle (its edges and the table in view) or fills the frame; uneven light and tint, blur, JPEG.

API: ``photo(label, rng) -> (jpeg bytes, meta)``; ``make_set(n, seed) -> (list of jpeg bytes, labels (n,), metas)``,
item i of class ``i % 8``, each from its own ``default_rng([seed, i])``.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("circle", "square", "triangle", "cross", "star", "ring", "heart", "arrow")
PENS = ((25, 25, 30), (30, 40, 140), (170, 30, 35), (25, 100, 45))  # black, blue, red, green ballpoint / felt tip


def _closed(points: np.ndarray) -> np.ndarray:
    return np.concatenate([points, points[:1]])


def _outlines(label: str, rng: np.random.Generator) -> list[np.ndarray]:
    """The shape as pen paths in unit coordinates (about -1..1, y down): a list of (n, 2) polylines."""
    t = np.linspace(0, 2 * np.pi, 200, endpoint=False)
    circle = np.stack([np.cos(t), np.sin(t)], 1)
    if label == "circle":
        return [_closed(circle)]
    if label == "ring":  # two concentric circles, the band 25-40 % of the radius
        return [_closed(circle), _closed(circle * rng.uniform(0.6, 0.75))]
    if label == "square":
        return [_closed(np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], float))]
    if label == "triangle":
        a = -np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        return [_closed(np.stack([np.cos(a), np.sin(a)], 1))]
    if label == "star":
        k = np.arange(10)
        r = np.where(k % 2, rng.uniform(0.38, 0.5), 1.0)
        a = -np.pi / 2 + k * np.pi / 5
        return [_closed(np.stack([r * np.cos(a), r * np.sin(a)], 1))]
    if label == "cross":
        w = rng.uniform(0.25, 0.38)
        plus = [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w), (-1, -w), (-w, -w)]
        return [_closed(np.array(plus, float))]
    if label == "heart":
        x = 16 * np.sin(t) ** 3
        y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
        return [_closed(np.stack([x, y + 2.5], 1) / 16.5)]
    if label == "arrow":  # a shaft and a V head
        head = rng.uniform(0.35, 0.55)
        return [np.array([[-1, 0], [1, 0]], float), np.array([[1 - head, -head], [1, 0], [1 - head, head]], float)]
    raise KeyError(label)


def _quad_coeffs(page: np.ndarray, photo: np.ndarray) -> list[float]:
    """PIL PERSPECTIVE coefficients mapping each photo pixel back to the page: page, photo (4, 2) corners."""
    rows, rhs = [], []
    for (u, v), (x, y) in zip(page, photo, strict=True):
        rows += [[x, y, 1, 0, 0, 0, -u * x, -u * y], [0, 0, 0, x, y, 1, -v * x, -v * y]]
        rhs += [u, v]
    return np.linalg.solve(np.array(rows, float), np.array(rhs, float)).tolist()


def photo(label: str, rng: np.random.Generator) -> tuple[bytes, dict]:
    """One phone photo of ``label`` drawn on paper: JPEG bytes and what was drawn."""
    w, h = (1200, 900) if rng.uniform() < 0.6 else (900, 1200)
    short = min(w, h)
    paper = np.array([rng.uniform(225, 250)] * 3) + rng.uniform(-6, 3, 3)
    sheet = paper + rng.normal(0, 4, (h, w, 1)) + rng.normal(0, 1.5, (h, w, 3))
    img = Image.fromarray(np.clip(sheet, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    extent = rng.uniform(0.3, 0.65) * short  # of the centre square the model sees
    centre = np.array([w, h]) / 2 + rng.uniform(-1, 1, 2) * (short - extent) * 0.3
    angle = rng.uniform(0, 2 * np.pi)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    pen = np.array(PENS[rng.integers(len(PENS))]) + rng.normal(0, 8, 3)
    colour = tuple(int(c) for c in np.clip(pen, 0, 255))
    width = int(round(rng.uniform(0.004, 0.012) * short))
    filled = label not in ("arrow", "ring") and rng.uniform() < 0.25  # a marker-filled shape
    passes = 1 if filled else int(rng.integers(1, 3))  # a pen often goes over its line again
    for path in _outlines(label, rng):
        placed = (path @ rot.T) * extent / 2 + centre
        if filled:
            draw.polygon([tuple(p) for p in placed], fill=colour)
        for _ in range(passes):
            shaky = placed + rng.normal(0, 0.004 * extent, placed.shape) + rng.normal(0, 0.01 * extent, 2)
            draw.line([tuple(p) for p in shaky], fill=colour, width=max(1, width), joint="curve")
    on_table = rng.uniform() < 0.7
    if on_table:  # the sheet at an angle on a table: its edges, a corner or two and the table in view
        corners = np.array([[0, 0], [w, 0], [w, h], [0, h]], float)
        inset = rng.uniform(0.02, 0.1, (4, 2)) * [w, h] * np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]])
        table = tuple(int(c) for c in rng.uniform(40, 150) * rng.uniform(0.6, 1.0, 3))
        img = img.transform((w, h), Image.PERSPECTIVE, _quad_coeffs(corners, corners + inset), Image.BICUBIC,
                            fillcolor=table)
    yy, xx = np.mgrid[0:h, 0:w]
    direction = rng.uniform(0, 2 * np.pi)
    ramp = ((xx - w / 2) * math.cos(direction) + (yy - h / 2) * math.sin(direction)) / short  # about -0.8..0.8
    light = 1 - rng.uniform(0.05, 0.3) * (ramp + 0.8) / 1.6  # uneven light
    pixels = np.asarray(img, float) * light[..., None] * rng.uniform(0.85, 1.0, 3)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(rng.uniform(0.6, 2.0)))
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=int(rng.integers(60, 92)))
    return buffer.getvalue(), {"label": label, "on_table": on_table, "filled": filled, "width_px": width,
                               "extent": extent / short, "size": (w, h)}


def make_set(n: int, seed: int) -> tuple[list[bytes], np.ndarray, list[dict]]:
    """n photos, item i of class i % 8, each from default_rng([seed, i])."""
    photos, metas = [], []
    for i in range(n):
        data, meta = photo(CLASSES[i % len(CLASSES)], np.random.default_rng([seed, i]))
        photos.append(data)
        metas.append(meta)
    return photos, np.arange(n) % len(CLASSES), metas
