"""The independent second drawer (tools/teaching/second_drawer.py): deterministic, balanced, and it draws what it says."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tools.teaching import second_drawer as drawer

LABELS = Path(__file__).resolve().parents[2] / "vit_core" / "assets" / "shapes_vit" / "labels.txt"


def ink_mask(image: np.ndarray, meta: dict) -> np.ndarray:
    """(H, W, 3) uint8 -> (H, W) bool: pixels at least 40 % of the way from the paper colour to the ink colour.

    Projecting onto the paper -> ink direction ignores the paper's gradient, grain and JPEG noise, which are
    far smaller than the ink's contrast (the drawer keeps paper and ink >= 150 apart)."""
    paper, ink = np.array(meta["paper"], float), np.array(meta["ink"], float)
    toward_ink = ((image.astype(float) - paper) @ (ink - paper)) / ((ink - paper) @ (ink - paper))
    return toward_ink > 0.4


def drawn_extent_px(mask: np.ndarray) -> int:
    rows, cols = np.nonzero(mask)
    return int(max(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1))


def test_classes_are_the_first_eight_labels_of_the_teaching_model():
    assert drawer.CLASSES == tuple(LABELS.read_text().split()[:8])


def test_make_set_is_deterministic_and_a_prefix_of_a_larger_set():
    images, labels, meta = drawer.make_set(40, seed=3)
    again, labels_again, meta_again = drawer.make_set(40, seed=3)
    assert images.dtype == np.uint8 and images.shape == (40, 64, 64, 3) and labels.shape == (40,)
    assert np.array_equal(images, again) and np.array_equal(labels, labels_again) and meta == meta_again
    larger = drawer.make_set(72, seed=3)[0]
    assert np.array_equal(larger[:40], images)
    other = drawer.make_set(40, seed=4)[0]
    assert all(not np.array_equal(a, b) for a, b in zip(images, other, strict=True))


def test_draw_is_deterministic_for_a_generator_state():
    first = drawer.draw("star", np.random.default_rng(11), size=96)
    second = drawer.draw("star", np.random.default_rng(11), size=96)
    assert first.size == (96, 96) and first.mode == "RGB"
    assert np.array_equal(np.asarray(first), np.asarray(second))


def test_make_set_is_balanced_over_classes_size_bands_and_styles():
    _, labels, meta = drawer.make_set(256, seed=0, size=64)
    assert Counter(labels.tolist()) == {k: 32 for k in range(8)}
    assert Counter(m["size_band"] for m in meta) == {band: 64 for band in drawer.SIZE_BANDS}
    assert Counter(m["style"] for m in meta) == {style: 64 for style in drawer.STYLES}
    cells = Counter((m["label"], m["size_band"], m["style"]) for m in meta)
    assert len(cells) == 8 * 4 * 4 and set(cells.values()) == {2}
    assert all(drawer.CLASSES[k] == m["label"] for k, m in zip(labels, meta, strict=True))


@pytest.mark.parametrize("size", [64, 96, 128])
def test_each_shape_is_fully_inside_the_image_at_its_size_band(size):
    images, _, meta = drawer.make_set(128, seed=size, size=size)
    tolerance = max(2.5, 0.025 * size)  # anti-aliased edges, sharp star tips lost to the photo's blur
    for image, m in zip(images, meta, strict=True):
        mask = ink_mask(image, m)
        assert not (mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any()), m  # fully inside
        extent = drawn_extent_px(mask)
        lo, hi = drawer.SIZE_BANDS[m["size_band"]]
        assert lo * size - tolerance <= extent <= hi * size + tolerance, (extent / size, m)
        assert abs(extent - m["extent"] * size) <= tolerance, (extent / size, m)


def test_a_ring_band_is_clearly_thicker_than_a_circle_outline():
    """The documented rule: circle strokes <= 9 % of the radius (or the thinnest pen), ring bands 22-40 % and
    at least 2.5x the thickest circle stroke at that size."""
    _, _, meta = drawer.make_set(1024, seed=5, size=64)
    thinnest = drawer.MIN_STROKE * 64
    circles = [m for m in meta if m["label"] == "circle" and m["variant"] == "outline"]
    bands = [m for m in meta if m["variant"] == "band-stroke"]
    assert circles and bands
    for m in circles:
        radius = m["extent"] * 64 / 2
        assert m["stroke_px"] <= max(thinnest, 0.09 * radius) + 1e-9, m
    for m in bands:
        radius = m["extent"] * 64 / 2
        thickest_circle_stroke = max(thinnest, 0.09 * radius)
        assert m["stroke_px"] >= max(0.22 * radius, 2.5 * thickest_circle_stroke) - 1e-9, m
        assert m["stroke_px"] <= max(0.40 * radius, 2.5 * thinnest) + 1e-9, m


def test_every_class_and_style_draws_ink_in_every_band():
    for label in drawer.CLASSES:
        for style in drawer.STYLES:
            for band in drawer.SIZE_BANDS:
                image, meta = drawer.render(label, np.random.default_rng([1, len(label)]), 64, band, style)
                assert ink_mask(np.asarray(image), meta).sum() >= 10, meta


def test_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="unknown shape"):
        drawer.draw("other", np.random.default_rng(0))
