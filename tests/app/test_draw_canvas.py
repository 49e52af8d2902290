"""The Draw canvas is an upload (a student's script can send anything as its value): what the browser sends as the
drawing is checked before
anything decodes it, then decoded on the upload's path; anything else is refused with one sentence and the
previous image stays.

The canvas's value is what a page's script sends; in AppTest it is put in place of the package's `st_canvas`
(the component itself needs a browser): a `CanvasResult` holding the data URL, as the package builds it.
Pillow's `Image.open` is watched: a refused value must never reach it.
"""

from __future__ import annotations

import io
import re
import sys

import pytest
from PIL import Image

from conftest import assert_healthy, run_app
from dashboard import caches, draw, session
from tools.hostile.canvas import canvas_drawing, data_url, hostile_canvas_values, malformed_canvas_values
from vit_core import ImageError

HOSTILE = hostile_canvas_values()
MALFORMED = malformed_canvas_values()


@pytest.fixture
def opened(monkeypatch) -> list[bytes]:
    """The first bytes of every in-memory file Pillow's Image.open is given while the test runs."""
    seen: list[bytes] = []
    real_open = Image.open

    def watching(fp, *args, **kwargs):
        if isinstance(fp, io.BytesIO):
            seen.append(fp.getvalue()[:64])
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", watching)
    return seen


def _payload(url: str) -> bytes:
    import base64

    return base64.b64decode(url.split(",", 1)[1], validate=False)[:64] if "," in url else b""


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_canvas_value_is_refused_before_pillow_sees_it(case, opened):
    with pytest.raises(ImageError) as refused:
        draw.canvas_png(HOSTILE[case])
    message = str(refused.value)
    assert message.endswith(".") and ". " not in message, message  # one sentence
    assert not opened


def test_a_real_drawing_passes_unchanged_and_decodes_like_an_upload():
    import vit_core

    png = canvas_drawing()
    assert draw.canvas_png(data_url(png)) == png
    decoded = vit_core.decode_image(png)
    assert decoded.image.size == (draw.CANVAS_PX, draw.CANVAS_PX) and decoded.source_format == "PNG"


def test_the_byte_cap_is_checked_before_base64_is_decoded():
    over = draw.PNG_DATA_URL + "A" * (draw._MAX_URL_CHARS + 4)
    with pytest.raises(ImageError, match="larger than"):
        draw.canvas_png(over)


class FakeCanvas:
    """`st_canvas` as the browser's value reaches it: a CanvasResult with this data URL (None: nothing drawn)."""

    def __init__(self):
        self.url: str | None = None
        self._told: str | None = None

    def __call__(self, *args, on_change=None, **kwargs):
        from streamlit_drawable_canvas import CanvasResult

        if self.url is not None and self.url != self._told and on_change is not None:
            on_change()  # the component's on_change, as when a stroke is sent
        self._told = self.url
        objects = [{"type": "path"}] if self.url is not None else []
        return CanvasResult({"objects": objects}, self.url, True)


def shown_images(at) -> tuple:
    return tuple(url for im in at.get("image") for url in im.value)


def test_the_app_refuses_a_hostile_drawing_and_keeps_the_previous_image(tiny_env, monkeypatch, opened):
    at = run_app(view="Attention")
    at.toggle(key=session.K_DRAW_ON).set_value(True).run()
    assert_healthy(at)
    canvas = FakeCanvas()
    monkeypatch.setattr(sys.modules["streamlit_drawable_canvas"], "st_canvas", canvas)
    decoded: list[bytes] = []  # what reached the upload's decode path (which may decode in another process)
    real_decode = caches.decode
    monkeypatch.setattr(caches, "decode", lambda name, data: decoded.append(data[:64]) or real_decode(name, data))

    canvas.url = data_url(canvas_drawing())  # a real drawing first: it becomes the image shown
    at.run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    assert any("drawing.png" in m.value for m in at.markdown)
    assert not any("Converted from" in c.value for c in at.caption)  # the paper's alpha is no news to a student
    drawing_shown = shown_images(at)

    for case in ("fits_said_png", "eps_said_png", "png_169mp", "fits"):
        opened.clear()
        decoded.clear()
        canvas.url = HOSTILE[case]
        at.run()
        assert_healthy(at)
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and errors[0].startswith("drawing.png: "), (case, errors)
        sentence = errors[0].removeprefix("drawing.png: ")
        assert re.fullmatch(r"[^.]*(\.\d[^.]*)*\.", sentence), (case, sentence)  # one sentence
        assert _payload(HOSTILE[case]) not in opened, f"{case}: Pillow opened it"
        assert _payload(HOSTILE[case]) not in decoded, f"{case}: sent to the decoder"
        assert shown_images(at) == drawing_shown, case  # the previous image's views

    canvas.url = data_url(canvas_drawing(seed=3))  # and the next real drawing is shown again
    at.run()
    assert_healthy(at)
    assert not at.error and shown_images(at) != drawing_shown


def test_the_canvas_sits_beside_the_drawings_result_and_clear_says_the_example_is_back(tiny_env, monkeypatch):
    """With Draw on, the canvas is in the main area (not the sidebar), beside the crop the model sees and
    its prediction; the header names the input shown; after Clear the page says the example is back."""
    at = run_app(view="Attention")
    at.toggle(key=session.K_DRAW_ON).set_value(True).run()
    assert_healthy(at)
    canvas = FakeCanvas()
    monkeypatch.setattr(sys.modules["streamlit_drawable_canvas"], "st_canvas", canvas)
    at.run()
    clear = f"{session.K_DRAW}_clear"
    assert [b.key for b in at.main.get("button") if b.key == clear] == [clear]
    assert not [b.key for b in at.sidebar.get("button") if b.key == clear]
    assert not any("canvas is empty" in i.value for i in at.info)  # nothing drawn yet: the example, nothing to say

    canvas.url = data_url(canvas_drawing())
    at.run()
    assert_healthy(at)
    main = [m.value for m in at.main.get("markdown")]
    assert any("image **drawing.png** (your drawing)" in m for m in main), main
    assert "**What the model sees**" in main and any(m.startswith("**Prediction: ") for m in main)
    assert at.main.get("progress"), "the top classes beside the canvas"

    canvas.url = None  # Clear: a fresh, empty canvas
    at.button(key=clear).click().run()
    assert_healthy(at)
    assert any("canvas is empty" in i.value and "the example" in i.value for i in at.main.info), [i.value for i in at.info]
    assert any("(example)" in m.value and m.value.startswith("Model **") for m in at.markdown)


class FakeComponent:
    """The canvas component's `out` as the frontend's stored value reaches the package's `st_canvas`: `values` maps a
    widget key to the whole value the browser sent (no entry: the component's default, a fresh canvas)."""

    def __init__(self):
        self.values: dict[str, object] = {}
        self.keys: list[str] = []  # every key the page asked for, in order
        self._told: dict[str, object] = {}

    def __call__(self, *, key, default, on_drawing_change, **kwargs):
        self.keys.append(key)
        value = self.values.get(key, default)
        if key in self.values and self._told.get(key) is not value:
            on_drawing_change()  # as when the browser sends a new value
        self._told[key] = value
        return value


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_canvas_value_of_the_wrong_shape_is_refused_once_and_the_canvas_starts_afresh(case, tiny_env, monkeypatch):
    at = run_app(view="Attention")
    at.toggle(key=session.K_DRAW_ON).set_value(True).run()  # imports the package
    assert_healthy(at)
    component = FakeComponent()
    monkeypatch.setattr(sys.modules["streamlit_drawable_canvas"], "out", component)
    at.run()
    component.values[component.keys[-1]] = {"drawing": {"raw": {"objects": [{"type": "path"}]},
                                                        "data": data_url(canvas_drawing())}, "backgroundFit": None}
    at.run()
    assert_healthy(at)
    assert not at.error and any("drawing.png" in m.value for m in at.markdown)
    drawing_shown = shown_images(at)

    refused_key = component.keys[-1]
    component.values[refused_key] = MALFORMED[case]
    at.run()
    assert_healthy(at)
    errors = [e.value for e in at.main.error]
    assert len(errors) == 1 and errors[0].startswith("drawing.png: "), errors
    assert re.fullmatch(r"[^.]*\.", errors[0].removeprefix("drawing.png: ")), errors  # one sentence
    assert shown_images(at) == drawing_shown  # the previous image stays
    assert component.keys[-1] != refused_key  # a fresh canvas took the refused one's place in the same run

    at.run()  # the next rerun: the fresh canvas, nothing refused again
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    at.toggle(key=session.K_DRAW_ON).set_value(False).run()
    assert_healthy(at)
    at.toggle(key=session.K_DRAW_ON).set_value(True).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    component.values[component.keys[-1]] = {"drawing": {"raw": {"objects": [{"type": "path"}]},
                                                        "data": data_url(canvas_drawing(seed=3))}, "backgroundFit": None}
    at.run()  # and the next drawing is shown
    assert_healthy(at)
    assert not at.error and shown_images(at) != drawing_shown
