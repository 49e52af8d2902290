"""The procedural Shapes dataset: determinism, class coverage, styles, masks and silhouettes that match the drawing."""

import numpy as np
import pytest
from PIL import Image

from vit_core.teaching import data
from vit_core.teaching.data import (
    BACKGROUNDS,
    CLASS_NAMES,
    FILLS,
    IMAGE_SIZE,
    LABELS,
    OTHER,
    Sample,
    Style,
    draw_sample,
    draw_set,
    make_dataset,
    sample_image,
)

N = 108  # 12 per class, "other" included
OTHER_LABEL = LABELS.index(OTHER)


@pytest.fixture(scope="module")
def dataset():
    return draw_set(N, seed=3)


def clean(fill: str, background: str = "plain", extent: float = 0.55, clutter: bool = False) -> Style:
    """A style without photo effects or tremor, so that pixels can be checked against the mask."""
    return Style(fill=fill, wobbly=False, background=background, clutter=clutter, photo=False, extent=extent)


def test_class_names():
    assert len(CLASS_NAMES) == 8 and len(set(CLASS_NAMES)) == 8
    for required in ("circle", "square", "triangle", "cross", "star", "ring", "heart", "arrow"):
        assert required in CLASS_NAMES
    assert LABELS == (*CLASS_NAMES, "other") and OTHER == "other"  # "other" is the LAST label


def test_shapes_and_dtypes(dataset):
    assert dataset.images.shape == (N, IMAGE_SIZE, IMAGE_SIZE, 3) and dataset.images.dtype == np.uint8
    assert dataset.masks.shape == dataset.regions.shape == (N, IMAGE_SIZE, IMAGE_SIZE)
    assert dataset.masks.dtype == dataset.regions.dtype == np.bool_
    assert dataset.labels.shape == (N,) and dataset.labels.dtype == np.int64
    assert len(dataset.styles) == N and all(isinstance(s, Style) for s in dataset.styles)
    s = draw_sample(np.random.default_rng(0), size=48)
    assert isinstance(s, Sample)
    assert s.image.shape == (48, 48, 3) and s.image.dtype == np.uint8
    assert s.mask.shape == (48, 48) and s.mask.dtype == np.bool_
    assert isinstance(s.label, int)
    images, masks, labels = make_dataset(9, seed=1, size=64)
    assert images.shape == (9, 64, 64, 3) and masks.shape == (9, 64, 64) and labels.shape == (9,)


def test_deterministic_under_seed(dataset):
    again = draw_set(N, seed=3)
    for a, b in zip((dataset.images, dataset.masks, dataset.regions, dataset.labels),
                    (again.images, again.masks, again.regions, again.labels), strict=True):
        assert a.tobytes() == b.tobytes()
    assert dataset.styles == again.styles
    other = draw_set(N, seed=4)
    assert not np.array_equal(dataset.images, other.images)
    assert not np.array_equal(dataset.labels, other.labels)
    s1 = draw_sample(np.random.default_rng(11), label=2)
    s2 = draw_sample(np.random.default_rng(11), label=2)
    assert s1.image.tobytes() == s2.image.tobytes() and s1.mask.tobytes() == s2.mask.tobytes()


def test_all_classes_appear_balanced(dataset):
    counts = np.bincount(dataset.labels, minlength=len(LABELS))
    assert counts.tolist() == [N // len(LABELS)] * len(LABELS)
    rng = np.random.default_rng(0)
    seen = {draw_sample(rng, size=32).label for _ in range(200)}  # label=None draws every class
    assert seen == set(range(len(LABELS)))


def test_styles_cover_how_people_draw():
    styles = [data.random_style(np.random.default_rng(i)) for i in range(400)]
    assert {s.fill for s in styles} == set(FILLS)
    assert {s.wobbly for s in styles} == {True, False}
    assert {s.background for s in styles} == set(BACKGROUNDS)
    assert {s.clutter for s in styles} == {True, False} and {s.photo for s in styles} == {True, False}
    extents = np.array([s.extent for s in styles])
    assert extents.min() < 0.22 and extents.max() > 0.88  # 20-90 % of the side
    assert {s.size_band for s in styles} == set(data.SIZE_BANDS)


def test_requested_label_is_drawn():
    rng = np.random.default_rng(5)
    for label in range(len(LABELS)):
        assert draw_sample(rng, label=label).label == label


def test_other_has_no_object(dataset):
    other = dataset.labels == OTHER_LABEL
    assert other.sum() == N // len(LABELS)
    assert not dataset.masks[other].any() and not dataset.regions[other].any()


def test_mask_size_reasonable(dataset):
    shapes = dataset.labels != OTHER_LABEL
    for mask, region, style in zip(dataset.masks[shapes], dataset.regions[shapes],
                                   [s for s, keep in zip(dataset.styles, shapes, strict=True) if keep], strict=True):
        assert mask.mean() > 0.001, "every object's ink is visible"
        assert (region >= mask).all(), "the silhouette holds the ink"
        assert region.mean() < 0.85, "the object never fills the image"
        ys, xs = np.nonzero(region)
        extent = max(xs.max() - xs.min() + 1, ys.max() - ys.min() + 1) / region.shape[0]
        # the drawn extent is the asked one, plus the pen's width (up to 13 % of the extent) and rounding; a sheet
        # photographed on a table shows the drawing smaller (the page covers 70-100 % of the frame's side)
        lowest = 0.6 * style.extent if style.on_table else style.extent - 0.03
        assert lowest <= extent <= style.extent * 1.2 + 0.04, (extent, style)


def test_mask_bbox_is_where_the_object_was_placed():
    rng = np.random.default_rng(7)
    for i in range(40):
        s = draw_sample(rng, label=i % len(CLASS_NAMES), style=clean("filled", extent=rng.uniform(0.2, 0.9)))
        x0, y0, x1, y1 = s.bbox
        assert 0 <= x0 < x1 <= IMAGE_SIZE and 0 <= y0 < y1 <= IMAGE_SIZE
        ys, xs = np.nonzero(s.mask)
        # pixel (x, y) covers [x, x+1): mask pixels lie inside the placed box, and reach its edges
        assert xs.min() >= np.floor(x0) - 1 and xs.max() + 1 <= np.ceil(x1) + 1
        assert ys.min() >= np.floor(y0) - 1 and ys.max() + 1 <= np.ceil(y1) + 1
        assert abs(xs.min() - x0) <= 2.5 and abs(xs.max() + 1 - x1) <= 2.5
        assert abs(ys.min() - y0) <= 2.5 and abs(ys.max() + 1 - y1) <= 2.5


def _ring_around(mask: np.ndarray, width: int = 2) -> np.ndarray:
    """Pixels within `width` steps of the mask but outside it (4-neighbour dilation)."""
    grown = mask.copy()
    for _ in range(width):
        g = grown.copy()
        g[1:] |= grown[:-1]
        g[:-1] |= grown[1:]
        g[:, 1:] |= grown[:, :-1]
        g[:, :-1] |= grown[:, 1:]
        grown = g
    return grown & ~mask


def test_mask_matches_drawing():
    rng = np.random.default_rng(3)
    for i in range(64):
        label = i % len(CLASS_NAMES)
        style = clean("filled", background=BACKGROUNDS[i % len(BACKGROUNDS)], clutter=bool(i % 2))
        s = draw_sample(rng, label=label, style=style)
        img, m = s.image.astype(np.float32), s.mask
        inside = img[m]  # (k, 3)
        # the object is one flat colour: small spread inside the mask (noise + antialiased rim)
        assert np.median(inside.std(axis=0)) < 30
        # and it differs from the background right around it
        around = img[_ring_around(m, 2)]
        dist = np.linalg.norm(inside.mean(axis=0) - around.mean(axis=0))
        assert dist > 40, (CLASS_NAMES[label], style, dist)


def _centre(mask: np.ndarray) -> tuple[int, int]:
    ys, xs = np.nonzero(mask)
    return int(round((ys.min() + ys.max()) / 2)), int(round((xs.min() + xs.max()) / 2))


def test_ring_has_a_hole_and_an_outline_encloses_its_inside():
    ring, circle = CLASS_NAMES.index("ring"), CLASS_NAMES.index("circle")
    for seed in range(6):
        for fill in FILLS:
            s = draw_sample(np.random.default_rng(seed), label=ring, style=clean(fill))
            assert not s.mask[_centre(s.mask)] and not s.region[_centre(s.mask)], "the centre of a ring is background"
            c = draw_sample(np.random.default_rng(seed), label=circle, style=clean(fill))
            assert c.region[_centre(c.mask)], "the inside of a circle is part of its silhouette"
            assert c.mask[_centre(c.mask)] == (fill == "filled"), "an outline has no ink inside"


def test_a_circle_outline_is_thin_and_a_ring_band_thick():
    """The rule that tells them apart: a circle's pen stays under 8 % of its radius, a ring's band is 18-45 %."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        extent_px = rng.uniform(0.18, 0.92) * IMAGE_SIZE
        assert data._stroke_width("circle", extent_px, rng) <= max(data.MIN_STROKE_PX, 0.04 * extent_px)


def test_photographs_are_blurred_and_compressed():
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    sharp = draw_sample(rng_a, label=0, style=clean("filled"))
    photo = draw_sample(rng_b, label=0, style=Style("filled", False, "plain", False, True, 0.55))
    assert not photo.style.on_table  # this seed's photograph fills the frame (the sheet on a table: test below)
    assert sharp.mask.tobytes() == photo.mask.tobytes()  # the same drawing
    assert not np.array_equal(sharp.image, photo.image)


def test_sample_image():
    for name in CLASS_NAMES:
        im = sample_image(name, seed=0)
        assert isinstance(im, Image.Image) and im.size == (IMAGE_SIZE, IMAGE_SIZE) and im.mode == "RGB"
    assert sample_image("star", seed=0, size=64).size == (64, 64)
    a, b = sample_image("star", seed=1), sample_image("star", seed=1)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != sample_image("star", seed=2).tobytes()
    with pytest.raises(KeyError):
        sample_image("dodecahedron")
    with pytest.raises(KeyError):
        sample_image(OTHER)  # the examples are shapes


def test_a_shape_as_large_as_the_image_is_still_placed():
    """A rotated shape asked at the full side is shrunk to fit exactly; rounding must not leave an empty
    interval for its position (numpy raised "high - low < 0" for about one image in ten thousand)."""
    for seed in range(300):
        rng = np.random.default_rng(seed)
        for name in CLASS_NAMES:
            parts = data._shape_parts(name, "filled", False, rng)
            _, (x0, y0, x1, y1) = data._place(rng, name, parts, 64, rng.uniform(0.98, 1.0))
            assert 0 < x0 <= x1 < 64 and 0 < y0 <= y1 < 64


def test_a_photographed_page_lies_on_a_table_and_its_masks_move_with_it():
    """_page_on_table warps the picture and its ink / silhouette maps by one perspective map, onto a table."""
    tables = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        s = draw_sample(rng, label=seed % len(CLASS_NAMES), style=clean("filled", extent=0.5))
        inner = s.mask & ~_ring_around(~s.mask, 1)  # ink pixels whose 4 neighbours are ink too: no antialiasing
        ink_colour = np.median(s.image[inner], axis=0)  # the flat pen colour of the clean drawing (plus sensor noise)
        paper_colour = np.median(s.image[~s.region], axis=0)
        maps = np.stack([inner, s.region], axis=-1).astype(np.float32)
        img, warped = data._page_on_table(s.image.astype(np.float32), maps, rng)
        ink, region = warped[..., 0], warped[..., 1]
        assert img.shape == s.image.shape and warped.shape == maps.shape
        assert ink.max() > 0.99 and (region >= ink - 1e-5).all()
        # where the warped map says "all ink", the warped picture shows the pen's colour
        assert np.abs(img[ink > 0.999] - ink_colour).mean() < 6
        neither = (np.abs(img - ink_colour).max(-1) > 40) & (np.abs(img - paper_colour).max(-1) > 40)
        tables += neither.mean() > 0.02  # some of the frame is table
    assert tables >= 8


def test_a_photograph_on_a_table_keeps_bbox_and_masks_together():
    on_table = 0
    for seed in range(40):
        s = draw_sample(np.random.default_rng(seed), label=seed % len(CLASS_NAMES),
                        style=Style("filled", False, "paper", False, True, 0.5))
        ys, xs = np.nonzero(s.region)
        x0, y0, x1, y1 = s.bbox
        assert abs(xs.min() - x0) <= 2.5 and abs(xs.max() + 1 - x1) <= 2.5
        assert abs(ys.min() - y0) <= 2.5 and abs(ys.max() + 1 - y1) <= 2.5
        on_table += s.style.on_table
    assert 10 <= on_table <= 30  # PAGE_ON_TABLE_P = 0.5 of the photographs
