"""Shared pieces of the figure builders: encoding, colour maps, overlays, the crop with its patch grid, the
clickable image, mosaics, fonts and heat maps drawn with PIL. No Streamlit here.

The figure builders, one module per family of views (`pipeline`, `embeddings`, `attention`, `prediction`, `why`,
`interventions`, `lens`, `registers`, `many_images`), are pure: arrays in, PNG bytes (or one plotly figure) out,
so the bytes shown are the bytes downloaded, and every builder can be tested headless. Most views use PNGs made
with PIL or matplotlib's object-oriented API (no pyplot: it keeps global state and is not thread-safe). Plotly is
used only where a click matters: the image with its patch grid, on which a patch is picked.

Conventions: `crop` is the uint8 (H, W, 3) image the model saw; maps are (gh, gw) float arrays;
patch k sits at row k // gw, column k % gw (see docs/spec/analyses.md).

Text a projector can show: every figure's text is at least TEXT_PX in the figure's own pixels, and each figure is
made about as wide as the column it is shown in at 1280 px and shown at its natural width (no upscaling:
`views.context.show_picture`), so it reads at 14 px or more on the screen. Every PNG and JPEG made here says the
size of its smallest text in its metadata (TEXT_SIZE_KEY: a PNG tEXt chunk, a JPEG comment; "none" for a picture
without text): matplotlib figures as measured from the drawn figure's text artists, PIL sheets as the font sizes
they drew with. The browser test (tests/browser/test_presenter_browser.py) reads it back from the served bytes.
"""

from __future__ import annotations

import base64
import functools
import io
import struct
import warnings
import zlib
from typing import Sequence

import matplotlib
import matplotlib.colors
import numpy as np
import plotly.graph_objects as go
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin

from dashboard.literal import mathtext_literal

ATTENTION_CMAP = "inferno"
OVERLAY_ALPHA = 0.65  # weight of the map's colour over the crop in every overlay
SIMILARITY_CMAP = "viridis"
CROP_DISPLAY_SIDE = 448  # pixels: the model's crop (224 px for most models) is enlarged to about this for display
_FONT_CACHE: dict[int, ImageFont.ImageFont] = {}

DPI = 100  # matplotlib figures are saved at this many pixels per inch: a figsize of 4.5 in is 450 px wide
TEXT_PX = 15  # the smallest text of any figure, in its own pixels: >= 14 px on screen down to 93 % of its width
TITLE_PX = 16
TEXT_PT = TEXT_PX * 72 / DPI  # the same sizes in points, for matplotlib (10.8 pt, 11.5 pt)
TITLE_PT = TITLE_PX * 72 / DPI
TEXT_SIZE_KEY = "vit-lens-min-text-px"  # PNG tEXt keyword / JPEG comment prefix: the smallest text's size in pixels

# ----------------------------------------------------------------------------------------------
# Small helpers


def shown_label(label: str, length: int) -> str:
    """A class name for a matplotlib axis or legend: cut to `length` characters, `$` shown as written (not mathtext)."""
    return mathtext_literal(label if len(label) <= length else label[:length - 2] + "...")


def font(size: int = 12) -> ImageFont.ImageFont:
    if size not in _FONT_CACHE:
        _FONT_CACHE[size] = ImageFont.load_default(size=size)
    return _FONT_CACHE[size]


def _text_record(text_px: float | None) -> str:
    return "none" if text_px is None else f"{text_px:g}"


def png_bytes(rgb: np.ndarray, text_px: float | None = None) -> bytes:
    """uint8 (H, W, 3) or (H, W) -> PNG bytes (fast compression: these are made on every rerun). `text_px`: the
    size of the smallest text drawn in the picture, in its pixels (None: it has no text), kept in its metadata."""
    info = PngImagePlugin.PngInfo()
    info.add_text(TEXT_SIZE_KEY, _text_record(text_px))
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buffer, format="PNG", compress_level=1, pnginfo=info)
    return buffer.getvalue()


def jpeg_bytes(rgb: np.ndarray, quality: int = 90, text_px: float | None = None) -> bytes:
    """uint8 (H, W, 3) -> JPEG bytes: for pictures shown inside plotly figures, which travel as base64
    in the figure's JSON on every rerun (a 448 px attention overlay: ~26 KB instead of ~130 KB as PNG,
    3 ms to encode instead of ~40 ms). Downloads stay PNG. `text_px` as for `png_bytes` (a JPEG comment)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buffer, format="JPEG", quality=quality,
                                                    comment=f"{TEXT_SIZE_KEY}={_text_record(text_px)}".encode())
    return buffer.getvalue()


def encode(rgb: np.ndarray, encoding: str, text_px: float | None = None) -> bytes:
    """uint8 (H, W, 3) -> "png" or "jpeg" bytes (`text_px`: its smallest text, see `png_bytes`)."""
    return {"png": png_bytes, "jpeg": jpeg_bytes}[encoding](rgb, text_px=text_px)


def smallest_text_pt(fig: Figure) -> float | None:
    """The font size (points) of the smallest text a drawn figure shows: titles, labels, tick labels, legends,
    annotations. None when it shows none. Tick labels exist only once the figure was drawn (savefig draws it)."""
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else None


def _with_png_text(png: bytes, keyword: str, value: str) -> bytes:
    """PNG bytes with one more tEXt chunk, before the image data (where readers find it without decoding the
    pixels): no re-encoding."""
    body = keyword.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    at = png.index(b"IDAT") - 4  # the first image-data chunk starts with its 4-byte length
    return png[:at] + chunk + png[at:]


def fit_width(fig: Figure, width_px: int, dpi: int = DPI) -> None:
    """Narrow the figure until everything it draws (labels and legends outside the axes too) is at most `width_px`
    pixels wide: the axes give up the room, the text keeps its size. The figure is drawn to be measured."""
    canvas = FigureCanvasAgg(fig)  # object-oriented, no pyplot: what savefig draws with
    fig.set_dpi(dpi)
    for _ in range(3):
        # savefig's tight bounding box, and the pad it adds on both sides (pad_inches, 0.1 in)
        drawn = (fig.get_tightbbox(canvas.get_renderer()).width + 2 * 0.1) * dpi
        if drawn <= width_px:
            return
        fig.set_figwidth(max(fig.get_figwidth() - (drawn - width_px + 2) / dpi, 1.0))


def figure_png(fig: Figure, dpi: int = DPI, width_px: int | None = None) -> bytes:
    """A matplotlib figure as PNG bytes (at most `width_px` wide: `fit_width`), with the size of its smallest text in
    pixels (as drawn at `dpi`) in the PNG's metadata (TEXT_SIZE_KEY)."""
    if width_px is not None:
        fit_width(fig, width_px, dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    smallest = smallest_text_pt(fig)
    return _with_png_text(buffer.getvalue(), TEXT_SIZE_KEY, _text_record(None if smallest is None else
                                                                          round(smallest * dpi / 72, 2)))


def legible(fig: Figure, width_px: int, height_px: int) -> Figure:
    """A figure drawn elsewhere (vit_core.plots, for files) made for the screen: `width_px` x `height_px` at DPI,
    every text at least TEXT_PT (tick labels, axis labels, legends, titles, annotations)."""
    fig.set_size_inches(width_px / DPI, height_px / DPI)
    for ax in fig.axes:
        ax.tick_params(labelsize=TEXT_PT)
    for text in fig.findobj(Text):
        if text.get_fontsize() < TEXT_PT:
            text.set_fontsize(TEXT_PT)
    return fig


def recorded_text_px(data: bytes) -> float | None:
    """The smallest text's size in pixels that a picture made here records (None: it has no text). Raises
    KeyError for a picture without the record (not made by these builders)."""
    im = Image.open(io.BytesIO(data))
    if im.format == "JPEG":
        comment = im.info.get("comment", b"").decode("latin-1")
        if not comment.startswith(TEXT_SIZE_KEY + "="):
            raise KeyError(TEXT_SIZE_KEY)
        value = comment.split("=", 1)[1]
    else:
        value = im.info[TEXT_SIZE_KEY]
    return None if value == "none" else float(value)


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of PNG or JPEG bytes."""
    return Image.open(io.BytesIO(data)).size


def is_jpeg(data: bytes) -> bool:
    """JPEG bytes (its start-of-image marker), as opposed to the PNGs every other builder makes."""
    return data[:3] == b"\xff\xd8\xff"


def _data_uri(data: bytes) -> str:
    """A data URI for PNG or JPEG bytes, with the right media type."""
    kind = "jpeg" if is_jpeg(data) else "png"
    return f"data:image/{kind};base64," + base64.b64encode(data).decode("ascii")


def display_scale(crop_side: int, target: int = CROP_DISPLAY_SIDE) -> int:
    """Integer enlargement so a crop of `crop_side` pixels shows at about `target` pixels."""
    return max(1, round(target / crop_side))


def enlarge(array: np.ndarray, scale: int | tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour enlargement of the first two axes: every entry becomes a block of
    scale x scale (or sy x sx) entries. (h, w, ...) -> (h*sy, w*sx, ...)."""
    sy, sx = (scale, scale) if isinstance(scale, int) else scale
    if (sy, sx) == (1, 1):
        return array
    return np.repeat(np.repeat(array, sy, axis=0), sx, axis=1)


def colorize(values: np.ndarray, cmap: str = ATTENTION_CMAP, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """Float array -> uint8 RGB through a matplotlib colormap; min-max scaled unless vmin/vmax given
    (a constant array gets the colormap's low end; NaN its "bad" colour)."""
    norm = matplotlib.colors.Normalize(vmin, vmax, clip=True)
    return _colormap(cmap)(norm(np.ma.masked_invalid(values)), bytes=True)[..., :3]


def colorize_each(maps: np.ndarray, cmap: str = ATTENTION_CMAP) -> np.ndarray:
    """Float maps (n, ...) -> uint8 RGB (n, ..., 3), each min-max scaled on its own: `colorize` of every map, the
    same bytes, in one pass (a head sheet colours 13 maps on every control change; one by one, matplotlib's masked
    normalisation was a third of the sheet's time: docs/performance.md, "The figures")."""
    maps = np.asarray(maps)
    if not np.issubdtype(maps.dtype, np.floating):
        maps = maps.astype(np.float32)  # as matplotlib's Normalize promotes integers
    axes = tuple(range(1, maps.ndim))
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN map: matplotlib colours it "bad" too
        lo = np.nanmin(maps, axis=axes, keepdims=True)  # (n, 1, ...)
        hi = np.nanmax(maps, axis=axes, keepdims=True)
        # Normalize's arithmetic: the extremes as Python floats, their difference in double, cast to the maps' dtype
        span = (hi.astype(np.float64) - lo.astype(np.float64)).astype(maps.dtype)
        normed = np.where(span > 0, (maps - lo) / np.where(span > 0, span, 1), 0).astype(maps.dtype)
    normed[np.isnan(maps)] = np.nan  # the colormap's "bad" colour, as a masked value gets in colorize
    return _colormap(cmap)(normed, bytes=True)[..., :3]


@functools.lru_cache(maxsize=None)
def _colormap(name: str) -> matplotlib.colors.Colormap:
    """matplotlib.colormaps[name] hands out a fresh copy that builds its lookup table on first use
    (~1 ms); a mosaic colours 13 maps per control change. Read-only after that, so shared."""
    return matplotlib.colormaps[name]


def map_to_pixels(amap: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) -> (gh*ph, gw*pw): each patch value fills its patch (no smoothing, no invention)."""
    return enlarge(amap, patch_size)


def overlay(crop: np.ndarray, amap: np.ndarray, patch_size: tuple[int, int], alpha: float = OVERLAY_ALPHA,
            cmap: str = ATTENTION_CMAP) -> np.ndarray:
    """The crop darkened and tinted by a per-patch map, min-max scaled for display: uint8 (H, W, 3)."""
    colours = map_to_pixels(colorize(amap, cmap), patch_size)  # colour per patch, then spread to its pixels
    return tint(crop.astype(np.float32), colours, alpha)


def tint(base: np.ndarray, colours: np.ndarray, alpha: float = OVERLAY_ALPHA) -> np.ndarray:
    """(1 - alpha) base + alpha colours as uint8: base (H, W, 3) float32, colours (..., H, W, 3) uint8 (several maps'
    colours at once tint the same base)."""
    return ((1 - alpha) * base + alpha * colours.astype(np.float32)).round().clip(0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# The crop with its patch grid


GRID_LINE = (150, 150, 150)  # mid grey: visible on white paper (a drawing) and on dark photos alike
GRID_LINE_CSS = "rgba(150, 150, 150, 0.9)"


def resized_crop(crop: np.ndarray, side: int) -> tuple[Image.Image, float]:
    """The crop at `side` pixels wide (its height in proportion), and the scale s (display pixels per crop pixel).
    Drawing the grid on this, at the size it is shown, keeps every line: lines drawn on a larger picture that the
    browser then shrinks are lost one in two. Enlarged by repeating pixels (sharp patch edges), shrunk by area."""
    height, width = crop.shape[:2]
    s = side / width
    resample = Image.Resampling.NEAREST if s >= 1 else Image.Resampling.BOX
    return Image.fromarray(crop).resize((side, max(1, round(height * s))), resample), s


def enlarged_with_grid(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                       side: int | None = None) -> tuple[Image.Image, ImageDraw.ImageDraw, float]:
    """The crop enlarged for display (by its display scale s; or to `side` pixels wide, the size it is shown at)
    with grey lines between the patches, ready to draw on, and s."""
    gh, gw = grid
    ph, pw = patch_size
    if side is None:
        s = display_scale(crop.shape[1])
        im = Image.fromarray(enlarge(crop, s))
    else:
        im, s = resized_crop(crop, side)
    draw = ImageDraw.Draw(im)
    for r in range(1, gh):
        draw.line([(0, round(r * ph * s)), (im.width, round(r * ph * s))], fill=GRID_LINE, width=1)
    for c in range(1, gw):
        draw.line([(round(c * pw * s), 0), (round(c * pw * s), im.height)], fill=GRID_LINE, width=1)
    return im, draw, s


def patch_box(k: int, gw: int, patch_size: tuple[int, int], s: float) -> list[int]:
    """Patch k's pixel box [x0, y0, x1, y1] (inclusive) in a crop enlarged s times, for ImageDraw."""
    (r, c), (ph, pw) = divmod(int(k), gw), patch_size
    return [round(c * pw * s), round(r * ph * s), round((c + 1) * pw * s) - 1, round((r + 1) * ph * s) - 1]


NUMBER_CELL_PX = 30  # patch numbers are written in a clickable grid only where a patch shows at least this wide


def clickable_image_figure(display: np.ndarray | bytes, grid: tuple[int, int], patch_size: tuple[int, int],
                           selected: int | None = None, hover_values: np.ndarray | None = None,
                           height: int = 480, grid_lines: bool = False, numbers: bool = False,
                           validate: bool = False) -> go.Figure:
    """Plotly figure of an image (already enlarged: an array, or its PNG or JPEG bytes) with one
    invisible marker per patch.

    Clicking a marker selects it; its `customdata` is the patch index k. `selected` gets a cyan
    frame. `hover_values` (gh, gw), e.g. the attention shown, appear in the hover text. `grid_lines`: the lines
    between patches as vector shapes, and `numbers`: each patch's number written on it (TEXT_PX, where a patch
    shows at least NUMBER_CELL_PX wide at this height; always in the hover text): both drawn by the browser at
    the size the figure is shown, so no line is lost and no number blurs whatever the screen.

    `validate`: plotly's check of every property as it is set. Off by default: this function fixes every property,
    the check was 3.5 of the 5 ms the figure took to build, and it runs on every control change of the Attention
    tab (docs/performance.md, "The figures"); a test builds the figure both ways
    and compares what the browser gets.
    """
    checked = {} if validate else {"_validate": False}  # plotly's own switch (BaseFigure, BasePlotlyType)
    gh, gw = grid
    ph, pw = patch_size
    data = display if isinstance(display, bytes) else png_bytes(display)
    width, disp_height = image_size(data)
    s = width / (gw * pw)  # display pixels per input pixel
    k = np.arange(gh * gw)
    rows, cols = np.divmod(k, gw)
    xs, ys = (cols + 0.5) * pw * s, (rows + 0.5) * ph * s
    hover = [f"patch {i} (row {r}, col {c})" for i, r, c in zip(k, rows, cols, strict=True)]
    if hover_values is not None:
        hover = [f"{t}<br>value {v:.4f}" for t, v in zip(hover, hover_values.reshape(-1), strict=True)]
    source = _data_uri(data)
    marker_px = 0.9 * height / gh
    written = numbers and height / max(gh, gw) >= NUMBER_CELL_PX
    number_font = dict(size=TEXT_PX, color="white", shadow="0px 0px 3px black")
    patches = go.Scatter(
        x=xs, y=ys, mode="markers+text" if written else "markers", customdata=k, hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", text=[str(i) for i in k] if written else None,
        textposition="middle center", textfont=number_font,
        marker=dict(symbol="square", size=marker_px, color="rgba(255,255,255,0.01)", line=dict(width=0)),
        selected=dict(marker=dict(opacity=0.01), textfont=dict(color="white")),
        unselected=dict(marker=dict(opacity=0.01), textfont=dict(color="white")),
        showlegend=False, name="patches", **checked,
    )
    shapes = []
    if grid_lines:
        line = dict(color=GRID_LINE_CSS, width=1)
        shapes += [dict(type="line", x0=0, x1=width, y0=r * ph * s, y1=r * ph * s, line=line) for r in range(1, gh)]
        shapes += [dict(type="line", x0=c * pw * s, x1=c * pw * s, y0=0, y1=disp_height, line=line) for c in range(1, gw)]
    if selected is not None:
        r, c = divmod(selected, gw)
        shapes.append(dict(type="rect", x0=c * pw * s, x1=(c + 1) * pw * s, y0=r * ph * s, y1=(r + 1) * ph * s,
                           line=dict(color="cyan", width=3)))
    # one constructor call: with its checks on, plotly checks every update, and this figure is rebuilt on every rerun
    layout = dict(
        xaxis=dict(visible=False, range=[0, width]), yaxis=dict(visible=False, range=[disp_height, 0], scaleanchor="x"),
        height=height, margin=dict(l=0, r=0, t=0, b=0), dragmode=False, clickmode="event+select",
        hoverlabel=dict(bgcolor="white", font=dict(size=TEXT_PX)))
    if shapes:  # (plotly's check drops an empty list; unchecked it would be sent)
        layout["shapes"] = shapes
    return go.Figure(data=[go.Image(source=source, hoverinfo="skip", **checked), patches], layout=layout, **checked)


# ----------------------------------------------------------------------------------------------
# Mosaics of maps and tiles


def fit_tiles(n: int, box: tuple[int, int], aspect: float = 1.0, pad: int = 6, title_height: int = TEXT_PX + 5,
              max_cols: int | None = None) -> tuple[int, int]:
    """(cols, tile width) of the largest tiles (height = width x `aspect`, a caption above each) that lay out n of
    them within `box` (width, height) pixels in the fewest columns that reach that size."""
    width, height = box
    best = (1, 1)
    for cols in range(1, (max_cols or n) + 1):
        rows = -(-n // cols)
        tile = min((width - pad) // cols - pad, int(((height - pad) // rows - pad - title_height) / aspect))
        if tile > best[1]:
            best = (cols, tile)
    return best


def mosaic(tiles: Sequence[np.ndarray], titles: Sequence[str], cols: int, pad: int = 6,
           text_px: int = TEXT_PX) -> np.ndarray:
    """Equal-sized uint8 tiles on a white sheet, each with a caption above (`text_px` pixels): uint8 (H, W, 3)."""
    th, tw = tiles[0].shape[:2]
    rows = -(-len(tiles) // cols)
    title_height = text_px + 5
    sheet = Image.new("RGB", (cols * (tw + pad) + pad, rows * (th + title_height + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    f = font(text_px)
    for i, (tile, title) in enumerate(zip(tiles, titles, strict=True)):
        r, c = divmod(i, cols)
        x, y = pad + c * (tw + pad), pad + r * (th + title_height + pad)
        draw.text((x, y), title, fill=(0, 0, 0), font=f)
        sheet.paste(Image.fromarray(tile), (x, y + title_height))
    return np.asarray(sheet)


# ----------------------------------------------------------------------------------------------
# Heat maps with their axes, drawn with PIL: the same title, ticks at cell centres, axis labels and colour
# bar as matplotlib's imshow + colorbar, in a few milliseconds instead of savefig's tens to hundreds (docs/performance.md,
# "The figures").

INK = (0, 0, 0)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values (multiples of 1, 2 or 5 x 10^k) from lo to hi, about `count` of them."""
    if not np.isfinite(lo) or not np.isfinite(hi) or hi <= lo:
        return [float(lo)] if np.isfinite(lo) else []
    raw = (hi - lo) / max(1, count - 1)
    magnitude = 10 ** np.floor(np.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = np.ceil(lo / step - 1e-9) * step
    return [float(v) for v in np.arange(first, hi + step * 1e-9, step)]


def _label(value: float) -> str:
    return f"{value:.3g}" if value else "0"


def _rotated_text(text: str, f: ImageFont.ImageFont) -> Image.Image:
    """`text` written bottom to top (an axis label on the left or right), black on white."""
    left, top, right, bottom = f.getbbox(text)
    im = Image.new("RGB", (right - left + 2, bottom - top + 2), (255, 255, 255))
    ImageDraw.Draw(im).text((1 - left, 1 - top), text, fill=INK, font=f)
    return im.rotate(90, expand=True)


def heatmap_png(picture: np.ndarray, shape: tuple[int, int], title: str, xlabel: str = "", ylabel: str = "",
                colorbar: tuple[str, float, float, str] | None = None, line_above_row: int | None = None,
                framed_cell: tuple[int, int] | None = None) -> bytes:
    """A (rows, cols) array already coloured at display size (`picture`, uint8 (h, w, 3)) as a chart: the title
    above (none if ""), tick marks with indices at cell centres, axis labels, and optionally a colour bar (cmap,
    vmin, vmax, label) on the right, black marks on both sides between rows `line_above_row` - 1 and
    `line_above_row`, a red frame around cell (row, col) `framed_cell`. Every text TEXT_PX or more; the margins
    are as wide as their labels. PNG bytes."""
    rows, cols = shape
    h, w = picture.shape[:2]
    small, medium = font(TEXT_PX), font(TITLE_PX)
    row_ticks, col_ticks = nice_ticks(0, rows - 1), nice_ticks(0, cols - 1)
    widest_row = max((small.getlength(str(int(r))) for r in row_ticks), default=0)
    label_h = TEXT_PX + 3  # a rotated label's width
    left = round(4 + (label_h + 4 if ylabel else 0) + widest_row + 10)
    top = TITLE_PX + 12 if title else TEXT_PX // 2 + 4
    tick_text = TEXT_PX + 4
    bottom = 6 + tick_text + (tick_text if xlabel else 0) + 4
    bar = _colorbar_layout(*colorbar, small) if colorbar is not None else None
    last_tick_half = small.getlength(str(int(col_ticks[-1]))) / 2 if col_ticks else 0
    right = bar[0] if bar else round(last_tick_half) + 6
    width = max(left + w + right, int(medium.getlength(title)) + 12)
    sheet = Image.new("RGB", (width, top + h + bottom), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    sheet.paste(Image.fromarray(np.ascontiguousarray(picture)), (left, top))
    draw.rectangle([left - 1, top - 1, left + w, top + h], outline=INK)
    sx, sy = w / cols, h / rows
    for c in col_ticks:
        x = left + (c + 0.5) * sx
        draw.line([(x, top + h), (x, top + h + 3)], fill=INK)
        draw.text((x, top + h + 5), str(int(c)), fill=INK, font=small, anchor="mt")
    for r in row_ticks:
        y = top + (r + 0.5) * sy
        draw.line([(left - 4, y), (left - 1, y)], fill=INK)
        draw.text((left - 6, y), str(int(r)), fill=INK, font=small, anchor="rm")
    if title:
        draw.text((width / 2, 4), title, fill=INK, font=medium, anchor="mt")
    if xlabel:
        draw.text((left + w / 2, top + h + 5 + tick_text), xlabel, fill=INK, font=small, anchor="mt")
    if ylabel:
        label = _rotated_text(ylabel, small)
        sheet.paste(label, (4, top + (h - label.height) // 2))
    if line_above_row is not None:  # marks outside the frame: a line across would hide a row at 1 px a row
        y = top + round(line_above_row * sy)
        draw.line([(left - 8, y), (left - 2, y)], fill=INK, width=1)
        draw.line([(left + w + 1, y), (left + w + 6, y)], fill=INK, width=1)
    if framed_cell is not None:
        r, c = framed_cell
        draw.rectangle([left + c * sx, top + r * sy, left + (c + 1) * sx - 1, top + (r + 1) * sy - 1],
                       outline=(255, 0, 0), width=2)
    if colorbar is not None:
        _draw_colorbar(sheet, draw, left + w + 12, top, h, *colorbar, small, bar[1])
    return png_bytes(np.asarray(sheet), text_px=TEXT_PX)


COLORBAR_PX = 12  # a colour bar's width


def _colorbar_layout(cmap: str, vmin: float, vmax: float, label: str, f: ImageFont.ImageFont) -> tuple[int, int]:
    """(room it takes right of the map, x of its label from the bar's left): bar, ticks, tick labels, label."""
    widest = max((f.getlength(_label(v)) for v in nice_ticks(vmin, vmax)), default=0)
    label_x = round(COLORBAR_PX + 5 + widest + 6)
    return 12 + label_x + (TEXT_PX + 3 + 4 if label else 0), label_x


def _draw_colorbar(sheet: Image.Image, draw: ImageDraw.ImageDraw, x: int, top: int, height: int, cmap: str,
                   vmin: float, vmax: float, label: str, f: ImageFont.ImageFont, label_x: int) -> None:
    """A vertical colour bar of `cmap` from vmin (bottom) to vmax (top), 12 px wide, ticks and label on its right."""
    values = np.linspace(vmax, vmin, height, dtype=np.float64)[:, None].repeat(COLORBAR_PX, axis=1)  # (height, 12)
    sheet.paste(Image.fromarray(colorize(values, cmap, vmin, vmax)), (x, top))
    draw.rectangle([x - 1, top - 1, x + COLORBAR_PX, top + height], outline=INK)
    span = (vmax - vmin) or 1.0
    for v in nice_ticks(vmin, vmax):
        y = top + (vmax - v) / span * (height - 1)
        draw.line([(x + COLORBAR_PX, y), (x + COLORBAR_PX + 3, y)], fill=INK)
        draw.text((x + COLORBAR_PX + 5, y), _label(v), fill=INK, font=f, anchor="lm")
    if label:
        text = _rotated_text(label, f)
        sheet.paste(text, (x + label_x, top + max(0, (height - text.height) // 2)))


MAP_DISPLAY_SIDE = 252  # pixels: a (gh, gw) map is enlarged, each cell a square block, to about this


def map_png(amap: np.ndarray, title: str, cmap: str = SIMILARITY_CMAP, vmin: float | None = None,
            vmax: float | None = None, highlight: int | None = None, label: str = "",
            side: int = MAP_DISPLAY_SIDE) -> bytes:
    """One (gh, gw) map, enlarged to about `side` pixels (each cell a block of pixels, no smoothing), with a colour
    bar (vmin / vmax, else the map's own range) and an optional framed cell. Drawn with PIL (see heatmap_png)."""
    gh, gw = amap.shape
    lo = float(np.nanmin(amap)) if vmin is None else vmin
    hi = float(np.nanmax(amap)) if vmax is None else vmax
    scale = max(1, round(side / max(gh, gw)))
    picture = enlarge(colorize(amap, cmap, lo, hi), scale)  # (gh, gw, 3) -> (gh*s, gw*s, 3)
    cell = None if highlight is None else divmod(int(highlight), gw)
    return heatmap_png(picture, (gh, gw), title, colorbar=(cmap, lo, hi, label), framed_cell=cell)
