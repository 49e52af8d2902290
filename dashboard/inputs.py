"""The sidebar's image choice of the One image page: an example, an upload, the camera or a drawing, the input
touched last winning. Small `*_ui` helpers that return plain values; every widget has an explicit key
(`dashboard.session`). The canvas itself can sit in the main area, beside the drawing's result (`canvas_area`);
which input is shown is said in words (`SOURCES`), and an empty canvas says that the example is back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import streamlit as st

import vit_core
from dashboard import caches, draw, examples, ground_truth, session, text
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, ImageChoice
from dashboard.literal import markdown_literal
from vit_core.loading.model import LoadedModel

# What `image_and_source_ui` says the image came from, and how the page says it.
SOURCE_WORDS = {"example": "example", "upload": "your upload", "camera": "camera photo", "draw": "your drawing"}


def image_and_source_ui(model_name: str, canvas_area=None) -> tuple[ImageChoice, str]:
    """Example, upload, camera or drawing: the input touched last wins. A bad file: the previous image, and the refusal
    kept for the page to say in its main area (`refusal_ui`).
    With Draw on, the canvas goes in `canvas_area` (a container of the main area), else where this is called.
    Returns the image and which input it came from (a key of SOURCE_WORDS)."""
    names = examples.example_names()
    default = examples.default_example(model_name)
    example = st.selectbox("Example image", names, index=names.index(default), key=session.K_EXAMPLE,
                           bind="query-params", on_change=session.set_image_source, args=("example",))
    upload = st.file_uploader(f"...or your own image (up to {MAX_IMAGE_MB} MB)", type=list(IMAGE_TYPES),
                              key=session.K_UPLOAD, max_upload_size=MAX_IMAGE_MB, on_change=session.set_image_source,
                              args=("upload",), help=text.UPLOAD_HELP.format(mb=MAX_IMAGE_MB))
    camera = None
    if st.toggle("Take a photo with the camera", key=session.K_CAMERA_ON):
        camera = st.camera_input("Camera", key=session.K_CAMERA, on_change=session.set_image_source, args=("camera",))
    drawing = None
    drawing_on = st.toggle("Draw", key=session.K_DRAW_ON,
                           help="Draw a shape with the mouse or a finger: the canvas opens beside the model's answer")
    canvas_area = canvas_area if canvas_area is not None else st.container()
    if drawing_on:
        with canvas_area:
            drawing = draw.draw_ui(session.K_DRAW, on_change=session.set_image_source, args=("draw",))

    source = session.image_source()
    if isinstance(drawing, draw.MalformedCanvas):
        source = "draw"  # the canvas sent a value, whatever its shape: refused below, in this run only
    from_canvas = source == "draw" and drawing is not None
    shown_example = None
    if source == "upload" and upload is not None:
        name, data, shown = upload.name, upload.getvalue(), "upload"
    elif source == "camera" and camera is not None:
        name, data, shown = "camera photo", camera.getvalue(), "camera"
    elif from_canvas:
        name, data, shown = draw.DRAWING_NAME, None, "draw"  # the browser's data URL, checked before anything decodes it
    else:
        name, data, shown = example, caches.example_bytes(example), "example"
        shown_example = example
        if source == "draw" and drawing_on:  # cleared, or nothing drawn yet: say so, don't switch silently
            canvas_area.info(text.CANVAS_EMPTY.format(example=markdown_literal(example)), icon=":material/undo:")
    session.keep_input_refusal(None)
    try:
        image = caches.decode(name, draw.canvas_png(drawing) if from_canvas else data)
    except vit_core.ImageError as e:
        previous = session.last_good_image()
        if previous is None:
            image, shown = caches.decode(example, caches.example_bytes(example)), "example"
        else:
            image, shown = previous, _source_of(previous, names)
        session.keep_input_refusal(Refusal(name, str(e), image.name))  # said in the main area: refusal_ui
        return image, shown
    session.remember_good_image(image)
    _remember_object(image, shown_example, from_canvas)
    for note in () if from_canvas else image.notes:  # a drawing's only note would be its RGBA -> RGB on white
        st.caption(note)
    return image, shown


@dataclass(frozen=True)
class Refusal:
    """An input the page refused to show (a file that is no image, a drawing that can't be read), and what it shows
    instead."""

    name: str  # the input's name as the user gave it
    reason: str  # why, in a sentence for the user
    still_shown: str  # the name of the image shown instead: the session's previous one, or the example


def refusal_ui() -> None:
    """Where a page calls it in its main area, above its figures: the input the sidebar refused in this script run
    (if any), and the image still shown. Said there, not beside the uploader, because the sidebar is closed on a
    phone and its lower half is below the fold on a laptop: the user would see the old image and no reason."""
    refusal = session.input_refusal()
    if refusal is None:
        return
    st.error(f"{markdown_literal(refusal.name)}: {markdown_literal(refusal.reason)}", icon=":material/block:")
    st.caption(f"Still showing {markdown_literal(refusal.still_shown)}.")


def _source_of(image: ImageChoice, example_names: list[str]) -> str:
    """Which input a kept image (shown again after a refused one) came from, by its name."""
    if image.name == draw.DRAWING_NAME:
        return "draw"
    if image.name == "camera photo":
        return "camera"
    return "example" if image.name in example_names else "upload"


def _remember_object(image: ImageChoice, example: str | None, from_canvas: bool) -> None:
    """Where the object is, when the app knows: a drawing's strokes (widened by the pen's current width) or a shape
    example's generator silhouette. Kept per image for the Why? tab's localisation scores; made once per image and
    pen width, not on every rerun."""
    if from_canvas:
        stroke = session.pen_width(session.K_DRAW, draw.DEFAULT_STROKE_PX)
        where = f"your strokes, widened by the pen's {stroke} px"
        make = partial(ground_truth.drawing_mask, image.preview, stroke)
    elif example is not None:
        where = "the generator's silhouette of the shape"
        make = partial(ground_truth.example_mask, example)
    else:
        return
    known = session.known_object(image.sha)
    if known is not None and known.source == where:
        return
    mask = make()
    if mask is not None and mask.shape == (image.size[1], image.size[0]) and mask.any():
        session.remember_object(image.sha, mask, where)


def shown_caption(image: ImageChoice, source: str) -> None:
    """Which input the image shown came from, in the sidebar under the inputs (the header says it too)."""
    st.caption(f"Shown: **{markdown_literal(image.name)}** ({SOURCE_WORDS[source]})")


def untrained_warning(loaded: LoadedModel) -> None:
    if loaded.weights.startswith("random init"):
        st.warning(text.UNTRAINED, icon=":material/warning:")
