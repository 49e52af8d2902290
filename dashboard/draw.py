"""The Draw input: a canvas where a student draws with mouse or finger, with colour, stroke width and clear.

The canvas is `streamlit-drawable-canvas` (a Fabric.js component whose frontend ships inside its wheel, served
by this Streamlit server: nothing is fetched from the network). The drawing is an upload like any other: what
the browser sends is a `data:` URL that a student's own script can fill with any file, of any size. So
`draw_ui` hands back that URL as sent, never the package's decoded array (`CanvasResult.image_data` opens
whatever came with a bare `Image.open`: FITS, EPS through Ghostscript, a 169 MP PNG), and `canvas_png` lets
through only a PNG of the canvas's own size, within `MAX_CANVAS_BYTES`, checked from its first bytes; the
caller then decodes it on the upload's path (`dashboard.caches.decode` -> `vit_core.images`).
"""

from __future__ import annotations

import base64
import binascii
import importlib.metadata
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import streamlit as st

from dashboard import session
from vit_core import TEACHING_MODEL
from vit_core.errors import ImageError

CANVAS_PX = 232  # fits the sidebar's default width (240 px of content); the model resizes what it gets anyway
PAPER = "#ffffff"
DEFAULT_INK = "#000000"
# The bundled Shapes ViT tells a circle from a ring by the stroke alone (vit_core/teaching/data.py, its model card):
# a circle is a disc or a thin outline, the pen at most 8 % of the radius; a ring is a thick band, 18-45 % of the
# radius. The default pen keeps a circle thin down to a third of the canvas across (a radius of CANVAS_PX / 6): with
# the former 12 px felt pen a student's circle read "ring". 3 px here are 1.2 px at the model's 96 px input, above
# the thinnest pen it was trained on (0.9 px).
CIRCLE_MAX_STROKE = 0.08  # a circle's outline, as a fraction of its radius
RING_BAND = (0.18, 0.45)  # a ring's band, as fractions of its radius
SMALLEST_CIRCLE_RADIUS = CANVAS_PX / 6
DEFAULT_STROKE_PX = int(CIRCLE_MAX_STROKE * SMALLEST_CIRCLE_RADIUS)  # 3
DRAWING_NAME = "drawing.png"

# The frontend sends `canvas.toDataURL({format: "png", multiplier: 1})`: Fabric.js renders it at multiplier x
# its retina scaling only when `enableRetinaScaling` is asked for, which it is not, so the PNG is the canvas's
# own CANVAS_PX x CANVAS_PX whatever the device's pixel ratio (frontend/build/index-*.js of 0.13.0).
PNG_DATA_URL = "data:image/png;base64,"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A 232 x 232 RGBA PNG is at most about 216 KB (stored, uncompressed: 232 rows of 1 + 232 x 4 bytes, plus
# chunk and zlib framing); a browser's compresses to a few KB. Twice the uncompressed size leaves room for
# any encoder's extra chunks.
MAX_CANVAS_BYTES = 2 * CANVAS_PX * (1 + 4 * CANVAS_PX) + 4096
_MAX_URL_CHARS = len(PNG_DATA_URL) + 4 * -(-MAX_CANVAS_BYTES // 3)  # base64: 4 characters per 3 bytes
SUPPORTED_CANVAS = "0.13."  # the package versions whose CanvasResult keeps the data URL in `_image_data_url`


RING, CIRCLE = "ring", "circle"
RING_OR_CIRCLE = (f"The stroke's thickness decides between ring and circle: this model calls a thin outline (at most "
                  f"{100 * CIRCLE_MAX_STROKE:.0f} % of the radius) a circle and a thick band ({100 * RING_BAND[0]:.0f}-"
                  f"{100 * RING_BAND[1]:.0f} % of the radius) a ring, so a thinner pen (**Stroke width**) or a larger "
                  "circle reads as a circle.")


def thickness_note(model_name: str, top_labels: Sequence[str]) -> str | None:
    """The one sentence for an image the bundled Shapes ViT calls "ring" with "circle" second (`top_labels`: its
    classes, most likely first): what tells the two apart. None for anything else."""
    if model_name != TEACHING_MODEL or tuple(top_labels[:2]) != (RING, CIRCLE):
        return None
    return RING_OR_CIRCLE


@dataclass(frozen=True)
class MalformedCanvas:
    """A canvas value not of the package's shape ({"drawing": {"raw": {...}, "data": "data:..."}, "backgroundFit":
    {...} or None}): `draw_ui` hands it back instead of a drawing, and `canvas_png` refuses it with `reason`."""

    reason: str = ("The canvas sent a value of the wrong shape, so it was not opened and the canvas starts again "
                   "empty.")


def has_strokes(json_data: dict | None) -> bool:
    """Whether the canvas's Fabric.js JSON holds anything drawn (a cleared or fresh canvas holds no objects)."""
    return bool(json_data and json_data.get("objects"))


def canvas_png(data_url: str) -> bytes:
    """The PNG bytes of a canvas value (the data URL the browser sent), checked before anything decodes them.

    Raises ImageError (one sentence for the student) unless it is a base64 `data:image/png` URL of at most
    MAX_CANVAS_BYTES whose bytes start with PNG's signature and an IHDR of CANVAS_PX x CANVAS_PX pixels.
    Pillow is not involved: the caller decodes what passes as an uploaded file (caches.decode)."""
    if isinstance(data_url, MalformedCanvas):
        raise ImageError(data_url.reason)
    if not isinstance(data_url, str) or not data_url.startswith(PNG_DATA_URL):
        raise ImageError("The drawing did not arrive as a PNG image, so it was not opened.")
    if len(data_url) > _MAX_URL_CHARS:
        raise ImageError(f"The drawing is larger than a {CANVAS_PX} x {CANVAS_PX} canvas can make "
                         f"(over {MAX_CANVAS_BYTES // 1024} KB), so it was not opened.")
    try:
        data = base64.b64decode(data_url[len(PNG_DATA_URL):], validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError("The drawing's data is damaged (not valid base64), so it was not opened.") from e
    if not data.startswith(PNG_SIGNATURE) or data[8:16] != b"\x00\x00\x00\x0dIHDR" or len(data) < 24:
        raise ImageError("The drawing is not a PNG image, so it was not opened.")
    width, height = struct.unpack(">II", data[16:24])
    if (width, height) != (CANVAS_PX, CANVAS_PX):
        raise ImageError(f"The drawing is {width} x {height} pixels, not the canvas's {CANVAS_PX} x {CANVAS_PX}, "
                         f"so it was not opened.")
    return data


@cache
def _check_canvas_version() -> None:
    version = importlib.metadata.version("streamlit-drawable-canvas")
    if not version.startswith(SUPPORTED_CANVAS):
        raise RuntimeError(f"dashboard/draw.py reads streamlit-drawable-canvas {SUPPORTED_CANVAS}x's CanvasResult; "
                           f"{version} is installed (pyproject.toml pins {SUPPORTED_CANVAS}*)")


def _data_url(result: Any) -> str | None:
    """The data URL the browser sent, as sent (the package's one private attribute this project reads).

    CanvasResult's public accessors are `image_data`, which opens the value with a bare `Image.open` (any
    format Pillow knows, any size), and `image_bytes`, which base64-decodes it whatever its length."""
    _check_canvas_version()
    return result._image_data_url


def draw_ui(key: str, on_change: Callable[..., None] | None = None,
            args: tuple = ()) -> str | MalformedCanvas | None:
    """The canvas with its controls; the drawing as the browser sent it (a data URL, unchecked: see
    `canvas_png`), or None while nothing is drawn. A value of the wrong shape: MalformedCanvas, and a fresh, empty
    canvas in its place.

    `on_change(*args)` runs when the student finishes a stroke (like a file uploader's on_change), so the
    caller can make the drawing the image the dashboard shows."""
    # Imported here, not at the top: the package declares its component when imported, which needs a running
    # Streamlit (server or AppTest); importing this module from plain Python or pytest must stay possible.
    from streamlit_drawable_canvas import st_canvas

    ink_col, width_col = st.columns([1, 3], vertical_alignment="bottom")
    ink = ink_col.color_picker("Colour", DEFAULT_INK, key=f"{key}_ink")
    stroke = width_col.slider("Stroke width", 1, 40, DEFAULT_STROKE_PX, key=session.stroke_key(key))
    # The canvas's own toolbar (undo, redo, delete) floats over its top right corner, where a stroke can't start;
    # a little space keeps it off the slider above.
    st.space("small")
    # background_color paints the paper into the PNG the browser sends; a transparent pixel would still be
    # composited on white by the decoder (vit_core.images.to_rgb).
    def canvas() -> tuple[dict | None, object]:
        result = st_canvas(stroke_width=stroke, stroke_color=ink, background_color=PAPER, width=CANVAS_PX,
                           height=CANVAS_PX, drawing_mode="freedraw", return_image_data=True,
                           key=f"{key}_canvas_{session.canvas_generation(key)}",
                           on_change=(lambda: on_change(*args)) if on_change is not None else None)
        return result.json_data, _data_url(result)

    slot = st.empty()  # where a fresh canvas replaces one whose value was refused, in the same run
    with slot:
        value = _well_formed(canvas)
    if value is None:
        # The component keeps its value per key and sends it again on every rerun (after Draw is switched off and on
        # too): a new key is a fresh, empty canvas, so the refusal is said once and the session draws on.
        session.clear_canvas(key)
        with slot:
            _well_formed(canvas)
    # No tooltip on Clear: it would float over the canvas's bottom edge and swallow the next stroke.
    st.button("Clear", key=f"{key}_clear", on_click=session.clear_canvas, args=(key,), icon=":material/ink_eraser:")
    if value is None:
        return MalformedCanvas()
    json_data, url = value
    return url if has_strokes(json_data) else None


def _well_formed(canvas: Callable[[], tuple[object, object]]) -> tuple[dict | None, object] | None:
    """The canvas's Fabric.js JSON and data URL, or None when the value the browser sent is not of the package's
    shape. A student's script can send any JSON as the component's value; `st_canvas` reads it with `.get` and `[]`
    (a `drawing` that is a string, a `backgroundFit` of `{}`: AttributeError, KeyError, TypeError), and the
    drawing's JSON must be a dict of objects and its URL a string (what the string holds is `canvas_png`'s to check)."""
    try:
        json_data, url = canvas()
    except (AttributeError, KeyError, TypeError):
        return None
    if json_data is not None and not (isinstance(json_data, dict) and isinstance(json_data.get("objects", []), list)):
        return None
    if url is not None and not isinstance(url, str):
        return None
    return json_data, url
