"""What every view shares: the `ViewContext` a view is drawn from, how a figure is shown and offered, and the
widgets of the "why this prediction" tabs (the target class; the note for a model without a head).

View modules import this one, never each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from dashboard import caches, session
from dashboard.figures.base import image_size, is_jpeg
from dashboard.image_choice import ImageChoice
from dashboard.literal import markdown_literal as md  # class names come from uploaded label files
from dashboard.models import ModelRequest
from vit_core import Capture, LoadedModel, analyses

cached_figure = caches.cached_figure  # cached_figure(builder, source, *settings) -> PNG or JPEG bytes
TARGET_CHOICES = 5  # the target class is picked from the top 5

# The main area's width at 1280 x 720 (a projector) with the sidebar open (300 px) and the page's side margins
# (views.header.PAGE_CSS), and the gap between columns: figures are made as wide as the column they are shown in
# there (`column_px`) and shown at their natural width, so their text keeps its size (figures.base.TEXT_PX).
PAGE_PX = 1280 - 300 - 2 * 24
COLUMN_GAP_PX = 16  # st.columns' default gap ("small", 1rem)


def column_px(weights: list[float], index: int, within: int = PAGE_PX, gap: int = COLUMN_GAP_PX) -> int:
    """The width in pixels of column `index` of st.columns(weights) in a container `within` pixels wide."""
    return int((within - gap * (len(weights) - 1)) * weights[index] / sum(weights))


@dataclass(frozen=True)
class ModelSource:
    """What figures of the model alone (filters, position embedding) are drawn from."""

    request: ModelRequest
    loaded: LoadedModel

    @property
    def cache_key(self) -> str:
        return self.request.key


@dataclass(frozen=True)
class ViewContext:
    request: ModelRequest
    loaded: LoadedModel
    cap: Capture
    image: ImageChoice

    @property
    def cache_key(self) -> str:
        """Names the arrays of this model and image in figure cache keys (the capture is a function of both)."""
        return f"{self.request.key}|{self.image.sha}"

    @property
    def model(self) -> ModelSource:
        return ModelSource(self.request, self.loaded)

    @property
    def stem(self) -> str:
        """A file-name stem for downloads: model and image."""
        model = self.loaded.name.replace("/", "-")
        image = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in Path(self.image.name).stem)[:40]
        return f"{model}_{image}"


def shape(array_or_shape, batch: bool = True) -> str:
    """A shape as PyTorch prints it inside the model, with the batch axis: `[1, 197, 768]`."""
    dims = tuple(getattr(array_or_shape, "shape", array_or_shape))
    return "[" + ", ".join(str(d) for d in ((1,) + dims if batch else dims)) + "]"


def show_picture(shown: bytes, key: str, file_name: str | None = None, caption: str | None = None,
                 width: int | str = "content", png: Callable[[], bytes] | None = None, title: str = "") -> None:
    """Show PNG or JPEG bytes and offer a PNG for download: the shown bytes, or, for a photo-like
    picture shown as JPEG (a fraction of the bytes and encoding time on every control change), the
    lossless PNG that ``png`` makes only when the button is clicked. At its natural width by default ("content":
    never enlarged, shrunk only where the column is narrower), so the figure's text shows at the size it was drawn.
    `title`: bold Markdown under the picture, above the button (for pictures in a row of columns: a name above them
    that wraps in a narrow column would push its picture below the others')."""
    if isinstance(width, int):  # st.image re-encodes (slowly) any picture wider than an int width: never shrink
        width = max(width, image_size(shown)[0])
    st.image(shown, caption=caption, width=width, output_format="JPEG" if is_jpeg(shown) else "PNG")
    if title:
        st.markdown(f"**{title}**")
    st.download_button("PNG", png if png is not None else shown, file_name=f"{file_name}.png", mime="image/png",
                       key=f"dl_{key}", icon=":material/download:", on_click="ignore", type="tertiary")


def no_head(ctx: ViewContext) -> bool:
    """True (with a note) for a model without a classifier head: no class to explain."""
    if ctx.loaded.geometry.num_classes:
        return False
    st.info("This model has no classifier head, so there is no class to explain. Load weights with a head "
            "(or a fine-tuned checkpoint) to use this tab.")
    return True


def target_ui(ctx: ViewContext, container) -> int:
    """The target class, chosen from the top 5 (bound to `?target=`); the top-1 by default."""
    session.keep_target_for(ctx.request.key, ctx.image.sha)
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, TARGET_CHOICES)
    probs = {p.index: p.prob for p in preds}
    return container.selectbox(
        f"Target class (from the top {len(preds)})", [p.index for p in preds], key=session.K_TARGET, bind="query-params",
        format_func=lambda i: f"{i}: {ctx.loaded.label(i)}",
        help="The class whose prediction is explained. " + ", ".join(f"{md(ctx.loaded.label(i))} {p:.1%}"
                                                                   for i, p in probs.items()))
