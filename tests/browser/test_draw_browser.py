"""End to end in a real browser: a student turns on the Draw input, draws a star with the mouse, and every view shows it.

The server runs the bundled Shapes ViT (`VIT_LENS_MODEL=vit-lens/shapes-vit`), started the load test's way
(`loadtest.start_server`). What the test assumes of the sidebar, where `dashboard.draw.draw_ui` is wired in:
- a toggle, radio option or segmented-control option whose text is exactly "Draw" (clicked by that text);
- the drawing replaces the example image and the header names it with a name containing "drawing" (it reads
  "image drawing.png" with the suggested wiring);
- the canvas is streamlit-drawable-canvas's: the mouse is driven on its `canvas.upper-canvas` (Fabric.js's
  event layer), its Clear button is the one named "Clear";
- with Draw on, the canvas is in the main area beside the crop the model sees and its prediction, and
  after Clear the page says that the example is back.
The browser tests are skipped until the dashboard calls `draw_ui(` (the Draw input is wired in), and when no
chromium is installed; the checks of draw.py's pure helpers always run. Screenshots go to tests/artifacts/
(gitignored).
"""

from __future__ import annotations

import base64
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vit_core
from dashboard.draw import CANVAS_PX, RING_OR_CIRCLE, canvas_png, has_strokes
from dashboard.views import RENAMED, VIEWS
from support.browser import ARTIFACTS, CHROMIUM, no_exception, open_tab, settle

ROOT = Path(__file__).resolve().parents[2]
LABELS = (ROOT / "vit_core" / "assets" / "shapes_vit" / "labels.txt").read_text().split()
WIRED = any("draw_ui(" in path.read_text() for path in (ROOT / "dashboard").rglob("*.py") if path.name != "draw.py")
PREDICTION = re.compile(r"prediction (\w+) \((\d+\.\d)%\)")
DRAWING_SHOWN = re.compile(r"\bimage [^·.\n]*drawing", re.IGNORECASE)  # the header names the image shown

in_browser = pytest.mark.skipif(
    CHROMIUM is None or not WIRED,
    reason="chromium is not installed (apt-get install -y chromium)" if CHROMIUM is None
    else "the dashboard has no Draw input yet (no draw_ui( call in dashboard/**/*.py)")


def test_a_drawing_is_composited_on_white_and_decodes_like_an_upload():
    """The canvas's PNG goes to the upload's decoder as the browser sent it (dashboard.draw.canvas_png checks it
    first), and the decoder puts what is transparent on white."""
    rgba = np.zeros((CANVAS_PX, CANVAS_PX, 4), np.uint8)  # a transparent canvas ...
    rgba[10:20, 5:15] = (200, 0, 0, 255)  # ... an opaque red stroke ...
    rgba[25:30, 5:15] = (0, 0, 0, 128)  # ... and a half-transparent black one
    buffer = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
    sent = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    decoded = vit_core.decode_image(canvas_png(sent))
    rgb = np.asarray(decoded.image)
    assert rgb.shape == (CANVAS_PX, CANVAS_PX, 3)
    assert (rgb[0, 0] == 255).all() and (rgb[15, 10] == (200, 0, 0)).all()
    assert np.abs(rgb[27, 10].astype(int) - 127).max() <= 1  # 50 % black over white


def test_an_empty_or_cleared_canvas_has_no_strokes():
    assert not has_strokes(None) and not has_strokes({"objects": []}) and not has_strokes({"background": "#fff"})
    assert has_strokes({"objects": [{"type": "path"}]})


@pytest.fixture(scope="module")
def server(shapes_server) -> str:
    return shapes_server


def star_path(cx: float, cy: float, radius: float) -> list[tuple[float, float]]:
    """A 5-pointed star outline as a student draws it in one stroke: 10 corners and back, starting at the lower
    right point (a stroke can't start under the canvas's toolbar, which floats over its top right corner)."""
    corners = []
    for k in range(4, 15):
        r = radius if k % 2 == 0 else 0.45 * radius
        angle = -math.pi / 2 + k * math.pi / 5
        corners.append((cx + r * math.cos(angle), cy + r * math.sin(angle)))
    return corners


def stroke(page, points: list[tuple[float, float]]) -> None:
    """One pen stroke with the mouse: press, move through the points in small steps, release."""
    page.mouse.move(*points[0])
    page.mouse.down()
    for x, y in points[1:]:
        page.mouse.move(x, y, steps=8)
    page.mouse.up()


def main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def draw_star(page) -> re.Match:
    """Turn on Draw, draw a star on the canvas; the dashboard's prediction line for it."""
    settle(page)
    no_exception(page)
    page.locator('[data-testid="stSidebar"]').get_by_text("Draw", exact=True).first.click()
    settle(page)
    canvas = page.locator("canvas.upper-canvas").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    assert box is not None and box["width"] >= 150 and box["height"] >= 150, box
    assert not DRAWING_SHOWN.search(main_text(page))  # nothing drawn yet: still the example

    stroke(page, star_path(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, 0.38 * box["width"]))
    settle(page)
    no_exception(page)
    page.screenshot(path=str(ARTIFACTS / "draw_star.png"), full_page=True)
    main = page.locator('[data-testid="stMain"]')
    assert main.locator("canvas.upper-canvas").count() == 1  # in the main area, not the sidebar
    box = main.locator("canvas.upper-canvas").bounding_box()
    result = main.get_by_text("What the model sees", exact=True).bounding_box()
    assert result is not None and result["x"] > box["x"] + box["width"] and result["y"] < box["y"] + box["height"]
    text = main_text(page)
    assert DRAWING_SHOWN.search(text), text[:500]  # the drawing replaced the example
    found = PREDICTION.search(text)
    assert found is not None, text[:500]
    return found


@pytest.fixture(scope="module")
def drawn_star(page) -> re.Match:
    return draw_star(page)


@in_browser
def test_a_drawing_goes_through_the_same_path_and_every_view_renders(page, drawn_star):
    label, percent = drawn_star.group(1), float(drawn_star.group(2))
    assert label in LABELS and 0 < percent <= 100, drawn_star.group(0)
    for name in VIEWS:
        open_tab(page, name)
        no_exception(page)
        panel = page.locator('[role="tabpanel"]:visible')
        # (the Concepts tab too: the Shapes ViT's bundled concepts are chosen for it out of the box)
        assert panel.locator('[data-testid="stImage"], [data-testid="stPlotlyChart"]').count() > 0, f"{name}: no figure"
        assert DRAWING_SHOWN.search(main_text(page))
        page.screenshot(path=str(ARTIFACTS / f"draw_view_{name.lower().replace(' ', '_')}.png"), full_page=True)


@in_browser
def test_the_drawn_star_is_recognised(drawn_star):
    """The bundled model recognises the 8 shapes as people draw them."""
    assert drawn_star.group(1) == "star", f"a star drawn on the canvas was classified {drawn_star.group(0)}"


@in_browser
def test_the_maps_of_a_drawing_are_judged_against_its_strokes(page, drawn_star):
    """In the Why? tab the drawing's strokes, widened by the pen, are the object: its patches are shown first,
    and judging the maps adds the localisation metrics to the table."""
    open_tab(page, RENAMED["Why?"])
    no_exception(page)
    panel = page.locator('[role="tabpanel"]:visible')
    assert "Object (ground truth)" in panel.inner_text() and "your strokes, widened by the pen" in panel.inner_text()
    panel.get_by_role("button", name=re.compile("^Judge the")).click()
    settle(page)
    no_exception(page)
    table = panel.locator("table").first.inner_text()
    for column in ("Deletion (drop)", "SaCo", "Pointing game", "Relevance mass", "Rank accuracy"):
        assert column in table, table
    assert "random" in table and "AttnLRP" in table and "CP-LRP" in table
    page.screenshot(path=str(ARTIFACTS / "draw_why_judged.png"), full_page=True)


@in_browser
def test_clear_empties_the_canvas_and_the_example_comes_back(page, drawn_star):
    page.locator('[data-testid="stMain"]').get_by_role("button", name="Clear").click()
    settle(page)
    no_exception(page)
    assert not DRAWING_SHOWN.search(main_text(page))
    assert PREDICTION.search(main_text(page)) is not None
    assert "The canvas is empty, so the page shows the example" in main_text(page)  # said, not switched silently


@in_browser
def test_a_drawing_on_a_high_density_screen_is_accepted(page, server):
    """The canvas sends its own CANVAS_PX x CANVAS_PX whatever the screen's pixel ratio (Fabric.js's toDataURL with
    multiplier 1 and no retina scaling), which is all dashboard.draw.canvas_png lets through: a student on a phone
    or a laptop's high-density screen (2 device pixels per CSS pixel) must not be refused."""
    dense = page.context.browser.new_page(viewport={"width": 1600, "height": 1800}, device_scale_factor=2)
    try:
        dense.goto(server)
        found = draw_star(dense)
        assert not dense.locator('[data-testid="stAlertContentError"]').count(), main_text(dense)[:500]
        assert found.group(1) in LABELS
    finally:
        dense.close()


def circle_path(cx: float, cy: float, radius: float, corners: int = 48) -> list[tuple[float, float]]:
    """A circle as a student draws it in one stroke, starting and ending at its lowest point (a stroke can't start
    under the canvas's toolbar, over its top right corner)."""
    angles = [math.pi / 2 + 2 * math.pi * k / corners for k in range(corners + 1)]
    return [(cx + radius * math.cos(a), cy + radius * math.sin(a)) for a in angles]


def draw_circle(page, pen_px: int | None = None) -> str:
    """On a fresh page of the module's server: turn on Draw, set the pen to `pen_px` (None: the default), draw a circle
    across most of the canvas; the main area's text once the prediction is shown."""
    settle(page)
    page.locator('[data-testid="stSidebar"]').get_by_text("Draw", exact=True).first.click()
    settle(page)
    if pen_px is not None:
        slider = page.locator('[data-testid="stSlider"]').filter(has_text="Stroke width")
        value = slider.locator('[data-testid="stSliderThumbValue"]')
        slider.get_by_role("slider").focus()
        for _ in range(pen_px - int(value.inner_text())):
            page.keyboard.press("ArrowRight")
        settle(page)
        assert int(value.inner_text()) == pen_px
    canvas = page.locator("canvas.upper-canvas").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    stroke(page, circle_path(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, 0.38 * box["width"]))
    settle(page)
    no_exception(page)
    return main_text(page)


THICKNESS = RING_OR_CIRCLE.split(":")[0]  # the sentence's start, as the page shows it (without its Markdown)


@pytest.fixture
def fresh_page(page, server):
    """A page of its own on the module's server (a session of its own), at 1280 x 720."""
    fresh = page.context.browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        fresh.goto(server)
        yield fresh
    finally:
        fresh.close()


@in_browser
def test_a_circle_drawn_with_the_default_pen_reads_circle(fresh_page):
    """The default pen is thin enough for the model card's circle (an outline at most 8 % of the radius): with the
    former 12 px pen the same circle read "ring (90.8 %)"."""
    text = draw_circle(fresh_page)
    fresh_page.screenshot(path=str(ARTIFACTS / "draw_circle_default_pen.png"))
    found = PREDICTION.search(text)
    assert found is not None and found.group(1) == "circle", found and found.group(0)
    assert THICKNESS not in text


@in_browser
def test_a_thick_circle_read_as_ring_says_that_the_stroke_decides(fresh_page):
    text = draw_circle(fresh_page, pen_px=12)
    fresh_page.screenshot(path=str(ARTIFACTS / "draw_circle_thick_pen.png"))
    found = PREDICTION.search(text)
    assert found is not None and found.group(1) == "ring", found and found.group(0)
    assert THICKNESS in text
