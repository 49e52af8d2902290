"""The Lenses tab (vit_core.lenses): the built-in attention logits and each lens of the files the server was started
with (`vit-lens dashboard --lens FILE.py`, $VIT_LENS_LENSES), picked by name: one tab, not one per lens, so that the
tab row still fits a projector's 1280 px however many lenses a server has. Each array is drawn by its shape: a (gh, gw) or (N,)
map over the crop, an (L, H) heatmap of blocks and heads, an (L, H, T, T) matrix with layer, head and query controls
(one query's row over the image), (C,) bars with the class labels, anything else a table; every array downloadable.
A lens that declares settings (`@lens(..., settings={"block": -1})`) gets a control for each, and its results are
cached per value (`caches.lens_result`).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import streamlit as st

from dashboard import caches
from dashboard.figures.base import display_scale, enlarge, map_png, overlay, png_bytes
from dashboard.views.context import ViewContext, shape
from dashboard.views.registry import view
from vit_core import lenses
from vit_core.lenses.attention_logits import query_row

BUILT_IN = tuple(lenses.BUILTIN)  # the built-in lenses, offered first
TOP_CLASSES = 10  # a (C,) array's bars: its largest values
SETTINGS_PER_ROW = 4  # a lens's setting controls: as narrow as a number needs, in rows of this many
MATRIX_MAP_SIDE = 228  # pixels: a query's row under the lens picker and the sliders stays within a projector's 720 px


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _image(column, png: bytes, caption: str | None = None) -> None:
    """PNG bytes made by dashboard.figures shown as they are (re-encoding would drop their text-size record)."""
    column.image(png, caption=caption, output_format="PNG")


def _controls(key: str, array: np.ndarray) -> tuple[int, int, int]:
    """Layer, head and query sliders for an (L, H, T, T) array, keyed by the array's name."""
    layers, heads, tokens = array.shape[0], array.shape[1], array.shape[2]
    cols = st.columns(3)
    layer = cols[0].slider("layer", 0, layers - 1, layers - 1, key=f"lens_{key}_layer")
    head = cols[1].slider("head", 0, heads - 1, 0, key=f"lens_{key}_head")
    query = cols[2].slider("query token (0: the first prefix token)", 0, tokens - 1, 0, key=f"lens_{key}_query")
    return layer, head, query


@st.fragment
def _matrix_panel(ctx: ViewContext, key: str, array: np.ndarray, key_norms: np.ndarray | None) -> None:
    """(L, H, T, T): the chosen query's row over the image's patches; with the keys' norms (L, H, T), beside it the
    part the key norms alone explain (analyses.md, "Attention logits")."""
    g = ctx.loaded.geometry
    layer, head, query = _controls(key, array)
    if key_norms is None:
        row = array[layer, head, query, g.num_prefix_tokens:].reshape(g.grid)  # (N,) -> (gh, gw)
        _image(st, map_png(row, f"{key}: block {layer}, head {head}, query {query}", side=MATRIX_MAP_SIDE))
        return
    row, fitted, r2 = query_row(array[layer, head], key_norms[layer, head], query, g.num_prefix_tokens, g.grid)
    lo, hi = float(min(row.min(), fitted.min())), float(max(row.max(), fitted.max()))
    left, right = st.columns(2)
    _image(left, map_png(row, f"logits of query {query}", vmin=lo, vmax=hi, side=MATRIX_MAP_SIDE))
    _image(right, map_png(fitted, "the part the key norms explain", vmin=lo, vmax=hi,
                                side=MATRIX_MAP_SIDE))
    st.caption(f"block {layer}, head {head}, query {query}: the key norms alone explain R² = {r2:.2f} of this row's "
               "variance over the patches (a + b·‖k‖, least squares); the softmax of the whole row is the Attention "
               "tab's pattern.")


def _array_panel(ctx: ViewContext, key: str, array: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    """One array, drawn by its shape, and its download."""
    g = ctx.loaded.geometry
    layers, heads, tokens, patches = g.num_layers, g.num_heads, g.num_tokens, g.grid[0] * g.grid[1]
    st.markdown(f"**`{key}`** `{shape(array.shape, batch=False)}` {array.dtype}")
    if array.shape == tuple(g.grid) or array.shape == (patches,):
        amap = array.reshape(g.grid).astype(np.float32)
        left, right = st.columns(2)
        s = display_scale(max(ctx.cap.input_image.shape[:2]), 256)  # a 96 px crop shows about as large as the map
        _image(left, png_bytes(overlay(enlarge(ctx.cap.input_image, s), amap, (g.patch_size[0] * s, g.patch_size[1] * s))),
               caption="over the crop")
        _image(right, map_png(amap, key))
    elif array.shape == (layers, heads):
        _image(st, map_png(array.astype(np.float32), f"{key}: rows = blocks, columns = heads"))
    elif array.shape == (layers, heads, tokens, tokens):
        norms = arrays.get(key.rsplit(".", 1)[0] + ".key_norms") if key.endswith(".scores") else None
        _matrix_panel(ctx, key, array, norms if norms is not None and norms.shape == (layers, heads, tokens) else None)
    elif array.ndim == 1 and g.num_classes and array.shape == (g.num_classes,):
        top = np.argsort(-array, kind="stable")[:TOP_CLASSES]
        st.bar_chart({"class": [ctx.loaded.label(int(c)) for c in top], key: array[top]}, x="class", y=key,
                     horizontal=True)
    else:
        st.dataframe(array.reshape(1, -1) if array.ndim < 2 else array.reshape(-1, array.shape[-1])[:1000])
    st.download_button(f"{key}.npy", _npy(array), file_name=f"{ctx.stem}_{key}.npy", key=f"lens_download_{key}")


def _none_or_number(typed: str) -> Any:
    """A setting whose default is None, as typed: empty is None, else an int, a float or the text itself."""
    typed = typed.strip()
    for kind in (int, float):
        try:
            return kind(typed) if typed else None
        except ValueError:
            pass
    return typed


def settings_ui(one: lenses.Lens) -> dict[str, Any]:
    """A control for each setting `one` declares, by its default's type (a toggle for a bool, a number for an int or
    a float, a text for a str or None), keyed by the lens and the setting; returns the values chosen."""
    if not one.settings:
        return {}
    columns = st.columns(SETTINGS_PER_ROW)
    chosen: dict[str, Any] = {}
    for i, (name, default) in enumerate(one.settings):
        place, key = columns[i % len(columns)], f"lens_{one.name}_setting_{name}"
        if isinstance(default, bool):
            chosen[name] = place.toggle(name, value=default, key=key)
        elif isinstance(default, int):
            chosen[name] = int(place.number_input(name, value=default, step=1, key=key))
        elif isinstance(default, float):
            chosen[name] = float(place.number_input(name, value=default, key=key))
        elif isinstance(default, str):
            chosen[name] = place.text_input(name, value=default, key=key)
        else:  # None: the lens's own default, unless a number or a text is typed
            chosen[name] = _none_or_number(place.text_input(name, value="", key=key, placeholder="None (its default)"))
    return chosen


def lens_view(ctx: ViewContext, one: lenses.Lens) -> None:
    arrays, failure = caches.lens_result(ctx.request, ctx.loaded, ctx.image, ctx.cap, one, settings_ui(one))
    if failure:
        st.error(failure)
        return
    where = f"the built-in lens `{one.name}`" if one.name in BUILT_IN else f"lens `{one.name}` from `{one.source}`"
    st.caption(f"{where}; sites: {', '.join(f'`{s}`' for s in one.sites) or 'the default capture'}. "
               "Each array is drawn by its shape (docs/spec/interface.md, \"Your own lens\").")
    for key, array in arrays.items():
        _array_panel(ctx, key, array, arrays)


@view("Lenses", family="research", order=50)
def lenses_view(ctx: ViewContext) -> None:
    """The Lenses tab: a lens picked by name (the built-in attention logits first, then each lens of the server's lens
    files), drawn by its arrays' shapes; or the sentence saying why the server's lens files can't be loaded."""
    found, failure = caches.page_lenses((*BUILT_IN, *lenses.configured()))
    if failure:
        st.error(failure)
        return
    names = [one.name for one in found]
    chosen = st.pills("lens", names, default=names[0], key="lens_choice",
                      help="a lens is one function of the capture (vit_core.lenses); the server's own lens files add "
                           "theirs (vit-lens dashboard --lens FILE.py)") or names[0]
    lens_view(ctx, found[names.index(chosen)])
