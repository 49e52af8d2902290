"""A second drawer of the teaching model's 8 shapes, written independently of its training generator.

It is the held-out "how people draw" evaluation set and is never used in training. Its
primitives are its own: every shape is a parametric outline in unit coordinates, sampled as point lists,
bent by a smooth hand tremor, rotated by any angle, scaled to an asked extent and placed anywhere fully
inside the image; then stroked as a polyline with a round pen (a quad per segment, a disc per point) or
filled as a polygon, four times larger than asked and box-downsampled (anti-aliased), ink composited over a plain
background.

API
---
``draw(label, rng, size=64, size_band=None, style=None) -> PIL.Image.Image`` (RGB, size x size)
``render(...)`` -> ``(image, meta)``: the same picture and what was drawn (see ``make_set``).
``make_set(n, seed, size=64) -> (images uint8 (N, size, size, 3), labels int64 (N,), meta list[dict])``:
    item i is class ``i % 8``, size band ``(i // 8) % 4``, style ``(i // 32) % 4`` (so any n that is a
    multiple of 128 is exactly balanced over classes x bands x styles), drawn with its own generator
    ``default_rng([seed, i])``: deterministic, and ``make_set(n)`` is a prefix of ``make_set(m > n)``.
    meta[i]: ``label``, ``size_band``, ``style``, ``extent`` (drawn extent over the image side),
    ``ink`` and ``paper`` (RGB before any photo effect), ``variant`` (which way the shape was drawn).
``size`` may be any side of at least 32 px (64, 96 and 128 are the model's candidates).

Size bands (``SIZE_BANDS``): the shape's extent, max(width, height) of its drawn bounding box (stroke
included) over the image side, uniform in 20-35 %, 35-50 %, 50-70 % or 70-90 %.

Styles (``STYLES``):
- ``outline``: a steady-hand outline, thin to thick stroke (tremor under 1 % of the shape's size).
- ``filled``: a solid filled shape (a ring as a filled annulus, a cross as the plus polygon).
- ``wobbly-outline``: hand-drawn: strong smooth tremor, closed shapes overshoot or miss their start a little,
  and the ways people draw quickly (a star as a pentagram, an arrow as a line with a V head, a cross as
  two crossing strokes).
- ``paper-photo``: a pen drawing (wobbly outline or filled) on paper, photographed: a light gradient,
  paper texture noise, a slight blur and a JPEG round-trip.
Backgrounds of the first three styles: white, off-white, light colours, and about one in five dark with a
light ink; the ink always contrasts (RGB distance >= 150).

What counts as each shape:
- circle: a filled disc, or a single outline drawn with a THIN stroke (at most 9 % of the radius, or the
  thinnest pen, 1.25 % of the image side: 0.8 px at 64 px); a slight oval (aspect >= 0.9) when hand-drawn.
- ring: an annulus whose band is clearly thick: band width 22-40 % of the outer radius and at least 2.5x the
  thickest circle stroke at that size (so at least 2 px at 64 px); drawn as a filled annulus, one thick
  circular stroke, or two concentric thin outlines (inner radius 55-72 % of the outer one).
- square: 4 equal sides at any angle. triangle: 3 corners, each angle above about 35 degrees.
- cross: a plus sign, two equal perpendicular bars (at any rotation, so also an "x").
- star: 5-pointed (inner/outer radius 0.38-0.52), or a pentagram drawn as one stroke.
- heart: the classic parametric heart. arrow: a shaft plus a head (a polygon, or a line with a V head).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("circle", "square", "triangle", "cross", "star", "ring", "heart", "arrow")
SIZE_BANDS = {"20-35%": (0.20, 0.35), "35-50%": (0.35, 0.50), "50-70%": (0.50, 0.70), "70-90%": (0.70, 0.90)}
STYLES = ("outline", "filled", "wobbly-outline", "paper-photo")
SUPERSAMPLE = 4  # draw this many times larger, then box-downsample: exact area coverage (anti-aliasing)
MIN_STROKE = 0.8 / 64  # the thinnest pen, as a fraction of the image side (0.8 px at 64 px)


@dataclass
class Part:
    """One piece of a shape in unit coordinates (about [-1, 1]^2): a stroked polyline or a filled polygon."""

    points: np.ndarray  # (K, 2) x, y; y grows downwards as in the image
    kind: str  # "stroke" | "fill" | "hole" (a hole is filled with the background, after the fills)
    closed: bool = False


# ---------------------------------------------------------------- outlines in unit coordinates


def _circle_points(radius: float = 1.0, aspect: float = 1.0, n: int = 160) -> np.ndarray:
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.stack([radius * np.cos(t), radius * aspect * np.sin(t)], axis=1)  # (n, 2)


def _densify(corners: np.ndarray, closed: bool, step: float = 0.03) -> np.ndarray:
    """Corners (K, 2) -> points every ~step along the edges, so a tremor bends the edges, not just the corners."""
    ends = np.roll(corners, -1, axis=0) if closed else corners[1:]
    starts = corners if closed else corners[:-1]
    pieces = []
    for a, b in zip(starts, ends, strict=True):
        k = max(2, int(np.ceil(np.linalg.norm(b - a) / step)))
        pieces.append(a + (b - a) * np.linspace(0, 1, k, endpoint=False)[:, None])
    if not closed:
        pieces.append(corners[-1:])
    return np.concatenate(pieces)  # (M, 2)


def _regular(n: int, radius: float = 1.0, start: float = -np.pi / 2) -> np.ndarray:
    t = start + 2 * np.pi * np.arange(n) / n
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)  # (n, 2)


def _star_corners(inner_ratio: float) -> np.ndarray:
    outer, inner = _regular(5), _regular(5, inner_ratio, start=-np.pi / 2 + np.pi / 5)
    return np.stack([outer, inner], axis=1).reshape(10, 2)  # alternate outer / inner points


def _pentagram() -> np.ndarray:
    """A star drawn in one stroke: every second point of a pentagon, back to the start."""
    return _regular(5)[[0, 2, 4, 1, 3, 0]]  # (6, 2)


def _heart_points(n: int = 200) -> np.ndarray:
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    x = 16 * np.sin(t) ** 3
    y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
    return np.stack([x, y + 2.5], axis=1) / 16.5  # (n, 2), roughly centred in [-1, 1]


def _plus_corners(half_bar: float) -> np.ndarray:
    b = half_bar
    return np.array([(-b, -1), (b, -1), (b, -b), (1, -b), (1, b), (b, b), (b, 1), (-b, 1),
                     (-b, b), (-1, b), (-1, -b), (-b, -b)])  # (12, 2)


def _arrow_corners(head_len: float, head_half: float, shaft_half: float) -> np.ndarray:
    neck = 1 - head_len
    return np.array([(-1, -shaft_half), (neck, -shaft_half), (neck, -head_half), (1, 0),
                     (neck, head_half), (neck, shaft_half), (-1, shaft_half)])  # (7, 2), pointing to +x


# ---------------------------------------------------------------- what to draw for each class


def _shape_parts(label: str, style: str, rng: np.random.Generator) -> tuple[list[Part], str]:
    """The parts of one shape in unit coordinates and the name of the way it is drawn (the variant)."""
    hand = style in ("wobbly-outline", "paper-photo")
    filled = style == "filled" or (style == "paper-photo" and rng.random() < 0.4)
    aspect = rng.uniform(0.9, 1.0) if hand else 1.0
    if label == "circle":
        pts = _circle_points(aspect=aspect)
        return ([Part(pts, "fill")], "disc") if filled else ([Part(pts, "stroke", True)], "outline")
    if label == "ring":
        inner = rng.uniform(0.60, 0.78)  # band 22-40 % of the outer radius
        if filled:
            return [Part(_circle_points(aspect=aspect), "fill"), Part(_circle_points(inner, aspect), "hole")], "annulus"
        if rng.random() < 0.5:
            return [Part(_circle_points((1 + inner) / 2, aspect), "stroke", True)], "band-stroke"
        inner = rng.uniform(0.55, 0.72)
        outlines = [Part(_circle_points(radius, aspect), "stroke", True) for radius in (1.0, inner)]
        return outlines, "two-outlines"
    if label == "square":
        corners = np.array([(-1, -1), (1, -1), (1, 1), (-1, 1)], float)
        corners[:, 1] *= aspect
        return [Part(_densify(corners, True), "fill" if filled else "stroke", True)], "square"
    if label == "triangle":
        angles = -np.pi / 2 + np.array([0, 2, 4]) * np.pi / 3 + rng.uniform(-0.2, 0.2, 3)
        corners = np.stack([np.cos(angles), np.sin(angles)], axis=1) * rng.uniform(0.85, 1.0, (3, 1))
        return [Part(_densify(corners, True), "fill" if filled else "stroke", True)], "triangle"
    if label == "star":
        if style == "wobbly-outline" and rng.random() < 0.4:
            return [Part(_densify(_pentagram(), False), "stroke")], "pentagram"
        corners = _star_corners(rng.uniform(0.38, 0.52))
        return [Part(_densify(corners, True), "fill" if filled else "stroke", True)], "star"
    if label == "heart":
        return [Part(_heart_points(), "fill" if filled else "stroke", True)], "heart"
    if label == "cross":
        if style == "wobbly-outline" and rng.random() < 0.5:
            bars = [np.array([(-1, 0), (1, 0)], float), np.array([(0, -1), (0, 1)], float)]
            return [Part(_densify(bar, False), "stroke") for bar in bars], "two-strokes"
        corners = _plus_corners(rng.uniform(0.16, 0.32))
        return [Part(_densify(corners, True), "fill" if filled else "stroke", True)], "plus"
    if label == "arrow":
        head_len, head_half = rng.uniform(0.35, 0.6), rng.uniform(0.3, 0.55)
        if not filled and rng.random() < 0.5:
            shaft = np.array([(-1, 0), (1, 0)], float)
            head = np.array([(1 - head_len, -head_half), (1, 0), (1 - head_len, head_half)])
            return [Part(_densify(shaft, False), "stroke"), Part(_densify(head, False), "stroke")], "line-arrow"
        corners = _arrow_corners(head_len, head_half, rng.uniform(0.08, 0.17))
        return [Part(_densify(corners, True), "fill" if filled else "stroke", True)], "block-arrow"
    raise ValueError(f"unknown shape {label!r}; the second drawer knows {CLASSES}")


# ---------------------------------------------------------------- the hand: tremor, rotation, size


def _tremor(n: int, amplitude: float, periodic: bool, rng: np.random.Generator) -> np.ndarray:
    """A smooth random 2-D displacement along a path of n points: (n, 2), about +-amplitude."""
    t = np.linspace(0, 1, n, endpoint=not periodic)[:, None]
    freqs = rng.integers(1, 6, (4, 1, 2)) if periodic else rng.uniform(0.5, 5, (4, 1, 2))
    phases = rng.uniform(0, 2 * np.pi, (4, 1, 2))
    weights = rng.normal(0, 1, (4, 1, 2)) / freqs
    wave = (weights * np.sin(2 * np.pi * freqs * t + phases)).sum(axis=0)  # (n, 2)
    return amplitude * wave / max(np.abs(wave).max(), 1e-9)


def _hand_drawn(part: Part, amplitude: float, wobbly: bool, rng: np.random.Generator) -> Part:
    """Bend a part by a tremor; a wobbly closed stroke overshoots its start a little instead of closing exactly."""
    pts = part.points
    if wobbly and part.closed and part.kind == "stroke":
        extra = int(len(pts) * rng.uniform(0.0, 0.08))
        pts = np.concatenate([pts, pts[: extra + 1]])  # the pen passes its start and lifts off late
        return Part(pts + _tremor(len(pts), amplitude, False, rng), "stroke", closed=False)
    periodic = part.kind != "stroke" or (part.closed and not wobbly)  # a filled outline always closes on itself
    return Part(pts + _tremor(len(pts), amplitude, periodic, rng), part.kind, part.closed)


def _rotate(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return points @ np.array([[c, s], [-s, c]])  # (K, 2)


def _stroke_width_px(label: str, variant: str, extent_px: float, size: int, rng: np.random.Generator) -> float:
    """The pen width in output pixels: thin to thick, relative to the shape; circles thin, ring bands thick."""
    thinnest = MIN_STROKE * size
    if label == "circle":
        return max(thinnest, rng.uniform(0.015, 0.045) * extent_px)  # <= 9 % of the radius
    if variant == "band-stroke":  # the band of a ring, drawn as one thick stroke
        band = rng.uniform(0.11, 0.2) * extent_px  # 22-40 % of the radius
        return max(band, 2.5 * max(thinnest, 0.045 * extent_px))
    if variant == "two-outlines":
        return max(thinnest, rng.uniform(0.015, 0.04) * extent_px)
    if variant == "two-strokes":  # a cross drawn as two bars: the pen is the bar
        return max(1.5 * thinnest, rng.uniform(0.06, 0.2) * extent_px)
    return max(thinnest, rng.uniform(0.015, 0.09) * extent_px)


# ---------------------------------------------------------------- colours and paper


def _luminance(rgb) -> float:
    r, g, b = rgb
    return 0.299 * r + 0.587 * g + 0.114 * b


def _colours(style: str, rng: np.random.Generator) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(paper, ink) RGB: a plain background and an ink that contrasts with it."""
    while True:
        if style == "paper-photo":
            paper = rng.integers(225, 256, 3) - np.array([0, rng.integers(0, 8), rng.integers(0, 20)])
            ink = rng.choice([(20, 20, 25), (25, 40, 150), (170, 25, 30), (70, 70, 75), (20, 90, 40)])
            ink = np.clip(np.array(ink) + rng.integers(-15, 16, 3), 0, 255)
        else:
            kind = rng.choice(["white", "off-white", "light", "dark"], p=[0.3, 0.25, 0.25, 0.2])
            if kind == "white":
                paper = np.array([255, 255, 255])
            elif kind == "off-white":
                paper = rng.integers(230, 256, 3)
            elif kind == "light":
                paper = rng.integers(170, 256, 3)
            else:
                paper = rng.integers(0, 70, 3)
            dark_ink = kind != "dark"
            ink = rng.integers(0, 150, 3) if dark_ink else rng.integers(170, 256, 3)
        paper, ink = tuple(int(v) for v in paper), tuple(int(v) for v in ink)
        if np.linalg.norm(np.subtract(paper, ink)) >= 150 and abs(_luminance(paper) - _luminance(ink)) >= 80:
            return paper, ink


def _photograph(img: np.ndarray, rng: np.random.Generator) -> Image.Image:
    """A drawing on paper as a phone would photograph it: light gradient, paper grain, slight blur, JPEG."""
    size = img.shape[0]
    yy, xx = np.mgrid[0:size, 0:size] / size
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * (xx - 0.5) + np.sin(angle) * (yy - 0.5)) + 0.5  # (size, size), about 0..1
    light = 1.0 - rng.uniform(0.03, 0.14) * ramp
    fibres = np.array(Image.fromarray(rng.normal(128, 40, (8, 8)).clip(0, 255).astype(np.uint8)).resize(
        (size, size), Image.Resampling.BICUBIC), float) - 128  # low-frequency paper texture
    grain = rng.normal(0, rng.uniform(1.5, 4.0), (size, size, 1)) + fibres[..., None] * rng.uniform(0.03, 0.08)
    photo = (img * light[..., None] + grain).clip(0, 255).astype(np.uint8)
    blurred = Image.fromarray(photo).filter(ImageFilter.GaussianBlur(rng.uniform(0.25, 0.6) * size / 64))
    buffer = io.BytesIO()
    blurred.save(buffer, format="JPEG", quality=int(rng.integers(55, 91)))
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


# ---------------------------------------------------------------- drawing


def _pen_stroke(pen: ImageDraw.ImageDraw, pts: np.ndarray, width: float) -> None:
    """A round pen along a polyline (K, 2): a quad per segment and a disc per point (round joints and caps).

    Drawn by hand because ImageDraw.line's curved joints leave spikes on thick, densely sampled paths."""
    r = max(width, 1.0) / 2
    for x, y in pts:
        pen.ellipse((x - r, y - r, x + r, y + r), fill=255)
    for a, b in zip(pts[:-1], pts[1:], strict=True):
        d = b - a
        length = np.hypot(*d)
        if length < 1e-9:
            continue
        normal = np.array([-d[1], d[0]]) / length * r
        pen.polygon([tuple(a + normal), tuple(b + normal), tuple(b - normal), tuple(a - normal)], fill=255)


def _ink_coverage(parts: list[Part], width_px: float, size: int) -> np.ndarray:
    """Parts in output pixel coordinates -> ink coverage (size, size) in [0, 1], anti-aliased."""
    big = size * SUPERSAMPLE
    mask = Image.new("L", (big, big), 0)
    pen = ImageDraw.Draw(mask)
    for kind in ("fill", "hole", "stroke"):
        for part in (p for p in parts if p.kind == kind):
            pts = part.points * SUPERSAMPLE
            if kind in ("fill", "hole"):
                pen.polygon([tuple(xy) for xy in pts], fill=255 if kind == "fill" else 0)
            else:
                _pen_stroke(pen, np.concatenate([pts, pts[:1]]) if part.closed else pts, width_px * SUPERSAMPLE)
    return np.asarray(mask.resize((size, size), Image.Resampling.BOX), float) / 255.0


def render(label: str, rng: np.random.Generator, size: int = 64, size_band: str | None = None,
           style: str | None = None) -> tuple[Image.Image, dict]:
    """One drawn shape and what was drawn. size_band / style default to a random one from rng."""
    assert size >= 32, "the second drawer draws images of at least 32 px"
    size_band = size_band if size_band is not None else str(rng.choice(list(SIZE_BANDS)))
    style = style if style is not None else str(rng.choice(STYLES))
    assert size_band in SIZE_BANDS and style in STYLES, (size_band, style)
    lo, hi = SIZE_BANDS[size_band]
    extent_px = rng.uniform(lo, hi) * size

    parts, variant = _shape_parts(label, style, rng)
    wobbly = style in ("wobbly-outline", "paper-photo")
    amplitude = rng.uniform(0.025, 0.06) if wobbly else rng.uniform(0.0, 0.008)
    angle = rng.uniform(0, 2 * np.pi)
    parts = [_hand_drawn(p, amplitude, wobbly, rng) for p in parts]
    parts = [Part(_rotate(p.points, angle), p.kind, p.closed) for p in parts]

    has_stroke = any(p.kind == "stroke" for p in parts)
    width_px = _stroke_width_px(label, variant, extent_px, size, rng) if has_stroke else 0.0
    pts = np.concatenate([p.points for p in parts])
    low, high = pts.min(axis=0), pts.max(axis=0)
    scale = (extent_px - width_px) / (high - low).max()  # the stroke adds half its width on each side
    box = (high - low) * scale + width_px  # (2,) drawn width, height in px
    margin = max(1.5, 0.02 * size)  # fully inside, with a little paper around it
    corner = np.array([rng.uniform(margin, size - margin - b) for b in box])  # top-left of the drawn box
    offset = corner + width_px / 2 - low * scale
    parts = [Part(p.points * scale + offset, p.kind, p.closed) for p in parts]

    paper, ink = _colours(style, rng)
    coverage = _ink_coverage(parts, width_px, size)[..., None]  # (size, size, 1)
    img = np.array(paper, float) * (1 - coverage) + np.array(ink, float) * coverage  # (size, size, 3)
    image = _photograph(img, rng) if style == "paper-photo" else Image.fromarray(img.round().astype(np.uint8))
    meta = dict(label=label, size_band=size_band, style=style, variant=variant, extent=float(extent_px / size),
                ink=ink, paper=paper, stroke_px=float(width_px))
    return image, meta


def draw(label: str, rng: np.random.Generator, size: int = 64, size_band: str | None = None,
         style: str | None = None) -> Image.Image:
    """One shape of class `label` as people draw it: an RGB image of size x size."""
    return render(label, rng, size, size_band, style)[0]


def make_set(n: int, seed: int, size: int = 64) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """n drawn shapes balanced over classes x size bands x styles (see the module docstring)."""
    images, labels, metas = np.zeros((n, size, size, 3), np.uint8), np.zeros(n, np.int64), []
    bands = list(SIZE_BANDS)
    for i in range(n):
        label, band, style = CLASSES[i % 8], bands[(i // 8) % 4], STYLES[(i // 32) % 4]
        image, meta = render(label, np.random.default_rng([seed, i]), size, band, style)
        images[i], labels[i] = np.asarray(image), i % 8
        metas.append(meta)
    return images, labels, metas
