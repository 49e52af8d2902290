"""The Draw input: a canvas where a student draws with mouse or finger, with colour, stroke width and clear.

The canvas is `streamlit-drawable-canvas` (a Fabric.js component whose frontend ships inside its wheel, served
by this Streamlit server: nothing is fetched from the network). `draw_ui` hands back PNG bytes, so a drawing goes
through exactly the decode and capture path of an uploaded file.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import streamlit as st
from PIL import Image

from dashboard import session

CANVAS_PX = 232  # fits the sidebar's default width (240 px of content); the model resizes what it gets anyway
PAPER = "#ffffff"
DEFAULT_INK = "#000000"
DEFAULT_STROKE_PX = 12  # about 5 px at the teaching model's 96 px input (12 x 96 / 232): a felt pen, not a hairline


def png_on_white(rgba: np.ndarray) -> bytes:
    """(H, W, 4) uint8 RGBA from the canvas -> PNG bytes of the drawing composited on white (RGB)."""
    assert rgba.ndim == 3 and rgba.shape[2] == 4 and rgba.dtype == np.uint8, (rgba.shape, rgba.dtype)
    alpha = rgba[..., 3:].astype(np.float32) / 255.0  # (H, W, 1)
    rgb = rgba[..., :3].astype(np.float32) * alpha + 255.0 * (1.0 - alpha)  # (H, W, 3)
    buffer = io.BytesIO()
    Image.fromarray(rgb.round().astype(np.uint8), "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def has_strokes(json_data: dict | None) -> bool:
    """Whether the canvas's Fabric.js JSON holds anything drawn (a cleared or fresh canvas holds no objects)."""
    return bool(json_data and json_data.get("objects"))


def draw_ui(key: str, on_change: Callable[..., None] | None = None, args: tuple = ()) -> bytes | None:
    """The canvas with its controls; the drawing as PNG bytes on white, or None while nothing is drawn.

    `on_change(*args)` runs when the student finishes a stroke (like a file uploader's on_change), so the
    caller can make the drawing the image the dashboard shows."""
    # Imported here, not at the top: the package declares its component when imported, which needs a running
    # Streamlit (server or AppTest); importing this module from plain Python or pytest must stay possible.
    from streamlit_drawable_canvas import st_canvas

    ink_col, width_col = st.columns([1, 3], vertical_alignment="bottom")
    ink = ink_col.color_picker("Colour", DEFAULT_INK, key=f"{key}_ink")
    stroke = width_col.slider("Stroke width", 1, 40, DEFAULT_STROKE_PX, key=f"{key}_stroke")
    # The canvas's own toolbar (undo, redo, delete) floats over its top right corner, where a stroke can't start;
    # a little space keeps it off the slider above.
    st.space("small")
    result = st_canvas(stroke_width=stroke, stroke_color=ink, background_color=PAPER, width=CANVAS_PX,
                       height=CANVAS_PX, drawing_mode="freedraw", return_image_data=True,
                       key=f"{key}_canvas_{session.canvas_generation(key)}",
                       on_change=(lambda: on_change(*args)) if on_change is not None else None)
    # No tooltip on Clear: it would float over the canvas's bottom edge and swallow the next stroke.
    st.button("Clear", key=f"{key}_clear", on_click=session.clear_canvas, args=(key,), icon=":material/ink_eraser:")
    if not has_strokes(result.json_data) or result.image_data is None:
        return None
    return png_on_white(np.asarray(result.image_data))
