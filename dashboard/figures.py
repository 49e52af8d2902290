"""Pure figure builders: arrays in, PNG bytes (or one plotly figure) out. No Streamlit here.

Every picture the dashboard shows is built here, so the bytes shown are the bytes downloaded, and
every builder can be tested headless. Most views use PNGs made with PIL or matplotlib's
object-oriented API (no pyplot: it keeps global state and is not thread-safe). Plotly is used only
where a click matters: the image with its patch grid, on which a patch is picked.

Conventions: `crop` is the uint8 (H, W, 3) image the model saw; maps are (gh, gw) float arrays;
patch k sits at row k // gw, column k % gw (see shared/spec/analyses.md).
"""

from __future__ import annotations

import base64
import functools
import io
from typing import Sequence

import matplotlib
import matplotlib.colors
import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

from dashboard.image_choice import mathtext_literal
from vit_core import analyses, explain

ATTENTION_CMAP = "inferno"
OVERLAY_ALPHA = 0.65  # weight of the map's colour over the crop in every overlay
SIMILARITY_CMAP = "viridis"
CROP_DISPLAY_SIDE = 448  # pixels: the model's crop (224 px for most models) is enlarged to about this for display
_FONT_CACHE: dict[int, ImageFont.ImageFont] = {}


# ----------------------------------------------------------------------------------------------
# Small helpers


def _shown_label(label: str, length: int) -> str:
    """A class name for a matplotlib axis or legend: cut to `length` characters, `$` shown as written (not mathtext)."""
    return mathtext_literal(label if len(label) <= length else label[:length - 2] + "...")


def font(size: int = 12) -> ImageFont.ImageFont:
    if size not in _FONT_CACHE:
        _FONT_CACHE[size] = ImageFont.load_default(size=size)
    return _FONT_CACHE[size]


def png_bytes(rgb: np.ndarray) -> bytes:
    """uint8 (H, W, 3) or (H, W) -> PNG bytes (fast compression: these are made on every rerun)."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def jpeg_bytes(rgb: np.ndarray, quality: int = 90) -> bytes:
    """uint8 (H, W, 3) -> JPEG bytes: for pictures shown inside plotly figures, which travel as base64
    in the figure's JSON on every rerun (a 448 px attention overlay: ~26 KB instead of ~130 KB as PNG,
    3 ms to encode instead of ~40 ms). Downloads stay PNG."""
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def encode(rgb: np.ndarray, encoding: str) -> bytes:
    """uint8 (H, W, 3) -> "png" or "jpeg" bytes."""
    return {"png": png_bytes, "jpeg": jpeg_bytes}[encoding](rgb)


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


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
    """(1 - alpha) base + alpha colours, both (H, W, 3), as uint8 (base float32, colours uint8)."""
    return ((1 - alpha) * base + alpha * colours.astype(np.float32)).round().clip(0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------------------------
# The crop with its patch grid


GRID_LINE = (150, 150, 150)  # mid grey: visible on white paper (a drawing) and on dark photos alike


def _enlarged_with_grid(crop: np.ndarray, grid: tuple[int, int],
                        patch_size: tuple[int, int]) -> tuple[Image.Image, ImageDraw.ImageDraw, int]:
    """The crop enlarged for display (by its display scale s) with grey lines between the patches, ready to draw on."""
    gh, gw = grid
    ph, pw = patch_size
    s = display_scale(crop.shape[1])
    im = Image.fromarray(enlarge(crop, s))
    draw = ImageDraw.Draw(im)
    for r in range(1, gh):
        draw.line([(0, r * ph * s), (im.width, r * ph * s)], fill=GRID_LINE, width=1)
    for c in range(1, gw):
        draw.line([(c * pw * s, 0), (c * pw * s, im.height)], fill=GRID_LINE, width=1)
    return im, draw, s


def _patch_box(k: int, gw: int, patch_size: tuple[int, int], s: int) -> list[int]:
    """Patch k's pixel box [x0, y0, x1, y1] (inclusive) in a crop enlarged s times, for ImageDraw."""
    (r, c), (ph, pw) = divmod(int(k), gw), patch_size
    return [c * pw * s, r * ph * s, (c + 1) * pw * s - 1, (r + 1) * ph * s - 1]


def patch_grid_image(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                     highlight: int | None = None, show_indices: bool = True) -> np.ndarray:
    """The crop enlarged, with grid lines, patch indices and an optional highlighted patch: uint8."""
    gh, gw = grid
    ph, pw = patch_size
    im, draw, s = _enlarged_with_grid(crop, grid, patch_size)
    if show_indices:
        size = max(7, min(12, int(pw * s * 0.3)))
        f = font(size)
        for k in range(gh * gw):
            r, c = divmod(k, gw)
            x, y = c * pw * s + 2, r * ph * s + 1
            draw.text((x, y), str(k), fill=(255, 255, 255), font=f, stroke_width=1, stroke_fill=(0, 0, 0))
    if highlight is not None:
        draw.rectangle(_patch_box(highlight, gw, patch_size, s), outline=(0, 255, 255), width=3)
    return np.asarray(im)


def clickable_image_figure(display: np.ndarray | bytes, grid: tuple[int, int], patch_size: tuple[int, int],
                           selected: int | None = None, hover_values: np.ndarray | None = None,
                           height: int = 480) -> go.Figure:
    """Plotly figure of an image (already enlarged: an array, or its PNG or JPEG bytes) with one
    invisible marker per patch.

    Clicking a marker selects it; its `customdata` is the patch index k. `selected` gets a cyan
    frame. `hover_values` (gh, gw), e.g. the attention shown, appear in the hover text.
    """
    gh, gw = grid
    ph, pw = patch_size
    data = display if isinstance(display, bytes) else png_bytes(display)
    width, disp_height = image_size(data)
    s = width / (gw * pw)  # display pixels per input pixel
    k = np.arange(gh * gw)
    rows, cols = np.divmod(k, gw)
    xs, ys = (cols + 0.5) * pw * s, (rows + 0.5) * ph * s
    text = [f"patch {i} (row {r}, col {c})" for i, r, c in zip(k, rows, cols, strict=True)]
    if hover_values is not None:
        text = [f"{t}<br>value {v:.4f}" for t, v in zip(text, hover_values.reshape(-1), strict=True)]
    source = _data_uri(data)
    marker_px = 0.9 * height / gh
    patches = go.Scatter(
        x=xs, y=ys, mode="markers", customdata=k, text=text, hovertemplate="%{text}<extra></extra>",
        marker=dict(symbol="square", size=marker_px, color="rgba(255,255,255,0.01)", line=dict(width=0)),
        selected=dict(marker=dict(opacity=0.01)), unselected=dict(marker=dict(opacity=0.01)),
        showlegend=False, name="patches",
    )
    shapes = []
    if selected is not None:
        r, c = divmod(selected, gw)
        shapes.append(dict(type="rect", x0=c * pw * s, x1=(c + 1) * pw * s, y0=r * ph * s, y1=(r + 1) * ph * s,
                           line=dict(color="cyan", width=3)))
    # one constructor call: plotly validates every update, and this figure is rebuilt on every rerun
    fig = go.Figure(data=[go.Image(source=source, hoverinfo="skip"), patches], layout=dict(
        xaxis=dict(visible=False, range=[0, width]), yaxis=dict(visible=False, range=[disp_height, 0], scaleanchor="x"),
        shapes=shapes, height=height, margin=dict(l=0, r=0, t=0, b=0), dragmode=False, clickmode="event+select",
        hoverlabel=dict(bgcolor="white")))
    return fig


# ----------------------------------------------------------------------------------------------
# Mosaics of maps (all heads of a layer) and tiles


def mosaic(tiles: Sequence[np.ndarray], titles: Sequence[str], cols: int, pad: int = 6, title_height: int = 18) -> np.ndarray:
    """Equal-sized uint8 tiles on a white sheet, each with a caption above: uint8 (H, W, 3)."""
    th, tw = tiles[0].shape[:2]
    rows = -(-len(tiles) // cols)
    sheet = Image.new("RGB", (cols * (tw + pad) + pad, rows * (th + title_height + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    f = font(13)
    for i, (tile, title) in enumerate(zip(tiles, titles, strict=True)):
        r, c = divmod(i, cols)
        x, y = pad + c * (tw + pad), pad + r * (th + title_height + pad)
        draw.text((x, y), title, fill=(0, 0, 0), font=f)
        sheet.paste(Image.fromarray(tile), (x, y + title_height))
    return np.asarray(sheet)


def head_maps_mosaic(crop: np.ndarray, maps: np.ndarray, patch_size: tuple[int, int], titles: Sequence[str],
                     query_patch: int | None = None, grid: tuple[int, int] | None = None, cols: int | None = None,
                     tile_side: int = 160) -> np.ndarray:
    """Each map (n, gh, gw) overlaid on the crop, in one sheet (one PNG, not n charts).

    Each tile is min-max scaled on its own (display only); the query patch gets a cyan frame.
    """
    n = maps.shape[0]
    cols = cols or min(n, 6)
    height, width = crop.shape[:2]
    ph, pw = patch_size
    side = (tile_side, round(tile_side * height / width))  # (width, height) of a tile
    factor = side[0] / width
    # Work at tile size: shrink the crop once, and look up each tile pixel's patch, instead of
    # overlaying every map at full size and shrinking n images (same picture, a third of the time).
    resample = Image.Resampling.BILINEAR if factor < 1 else Image.Resampling.NEAREST
    base = np.asarray(Image.fromarray(crop).resize(side, resample), dtype=np.float32)  # (th, tw, 3)
    patch_row = ((np.arange(side[1]) + 0.5) / factor // ph).astype(int)  # (th,) patch row of each tile row
    patch_col = ((np.arange(side[0]) + 0.5) / factor // pw).astype(int)  # (tw,)
    tiles = []
    for amap in maps:
        colours = colorize(amap)[patch_row[:, None], patch_col[None, :]]  # (gh, gw, 3) -> (th, tw, 3)
        im = Image.fromarray(tint(base, colours))
        if query_patch is not None and grid is not None:
            r, c = divmod(query_patch, grid[1])
            ImageDraw.Draw(im).rectangle([c * pw * factor, r * ph * factor, (c + 1) * pw * factor - 1,
                                          (r + 1) * ph * factor - 1], outline=(0, 255, 255), width=2)
        tiles.append(np.asarray(im))
    return mosaic(tiles, titles, cols)


# ----------------------------------------------------------------------------------------------
# Patches


def patch_pixels_image(patch: np.ndarray, side: int = 192) -> np.ndarray:
    """One (ph, pw, 3) uint8 patch enlarged so its pixels are visible."""
    return enlarge(patch, max(1, side // patch.shape[1]))


def vector_png(vector: np.ndarray, title: str, channels: int | None = 3, height: float = 2.2) -> bytes:
    """A long vector as a line plot; with `channels`, entries are coloured R, G, B in turn."""
    fig = Figure(figsize=(9, height))
    ax = fig.add_subplot()
    idx = np.arange(vector.shape[0])
    if channels == 3:
        for ch, colour in enumerate(("#d62728", "#2ca02c", "#1f77b4")):
            ax.plot(idx[ch::3], vector[ch::3], ".", ms=2.5, color=colour, label="RGB"[ch])
        ax.legend(loc="upper right", fontsize=8, ncols=3, markerscale=3)
    else:
        ax.plot(idx, vector, lw=0.8, color="#444")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, len(vector))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return figure_png(fig)


TOKEN_MATRIX_SIDES = (384, 240)  # pixels: the (T, D) matrix is shown at most this wide and tall (box-averaged down)


def token_matrix_png(tokens: np.ndarray, title: str, num_prefix_tokens: int) -> bytes:
    """A (T, D) token matrix as a heat strip: one row per token (prefix tokens on top, marked off beside it),
    symmetric colour scale at the 99th percentile of |values|, with its colour bar. Drawn with PIL (a
    matplotlib figure cost ~100 ms on every new image); wider or taller than TOKEN_MATRIX_SIDES, neighbouring
    entries' colours are averaged (a box filter), not skipped."""
    t, d = tokens.shape
    lim = float(np.percentile(np.abs(tokens), 99)) or 1.0
    colours = Image.fromarray(colorize(tokens, "RdBu_r", -lim, lim))  # (T, D, 3)
    size = (min(d, TOKEN_MATRIX_SIDES[0]), min(t, TOKEN_MATRIX_SIDES[1]))
    if size != (d, t):
        colours = colours.resize(size, Image.Resampling.BOX)
    return heatmap_png(np.asarray(colours), (t, d), title, f"{d} features", f"{t} tokens",
                       colorbar=("RdBu_r", -lim, lim, "value"), line_above_row=num_prefix_tokens or None)


# ----------------------------------------------------------------------------------------------
# Heat maps with their axes, drawn with PIL: the same title, ticks at cell centres, axis labels and colour
# bar as matplotlib's imshow + colorbar, in a few milliseconds instead of 50-150 ms of savefig (which took
# a sixth of the server's Python time when 30 students uploaded at once: see the README, "Serving a class").

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
    above, tick marks with indices at cell centres, axis labels, and optionally a colour bar (cmap, vmin, vmax,
    label) on the right, black marks on both sides between rows `line_above_row` - 1 and `line_above_row`, a
    red frame around cell (row, col) `framed_cell`. PNG bytes."""
    rows, cols = shape
    h, w = picture.shape[:2]
    small, medium = font(10), font(11)
    left, top, bottom = 48, 24, 34
    right = 78 if colorbar else 10
    width = max(left + w + right, int(medium.getlength(title)) + 12)
    sheet = Image.new("RGB", (width, top + h + bottom), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    sheet.paste(Image.fromarray(np.ascontiguousarray(picture)), (left, top))
    draw.rectangle([left - 1, top - 1, left + w, top + h], outline=INK)
    sx, sy = w / cols, h / rows
    for c in nice_ticks(0, cols - 1):
        x = left + (c + 0.5) * sx
        draw.line([(x, top + h), (x, top + h + 3)], fill=INK)
        draw.text((x, top + h + 5), str(int(c)), fill=INK, font=small, anchor="mt")
    for r in nice_ticks(0, rows - 1):
        y = top + (r + 0.5) * sy
        draw.line([(left - 4, y), (left - 1, y)], fill=INK)
        draw.text((left - 6, y), str(int(r)), fill=INK, font=small, anchor="rm")
    draw.text((width / 2, 4), title, fill=INK, font=medium, anchor="mt")
    if xlabel:
        draw.text((left + w / 2, top + h + 19), xlabel, fill=INK, font=small, anchor="mt")
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
        _draw_colorbar(sheet, draw, left + w + 12, top, h, *colorbar)
    return png_bytes(np.asarray(sheet))


def _draw_colorbar(sheet: Image.Image, draw: ImageDraw.ImageDraw, x: int, top: int, height: int, cmap: str,
                   vmin: float, vmax: float, label: str) -> None:
    """A vertical colour bar of `cmap` from vmin (bottom) to vmax (top), 12 px wide, ticks and label on its right."""
    small = font(10)
    values = np.linspace(vmax, vmin, height, dtype=np.float64)[:, None].repeat(12, axis=1)  # (height, 12)
    sheet.paste(Image.fromarray(colorize(values, cmap, vmin, vmax)), (x, top))
    draw.rectangle([x - 1, top - 1, x + 12, top + height], outline=INK)
    span = (vmax - vmin) or 1.0
    for v in nice_ticks(vmin, vmax):
        y = top + (vmax - v) / span * (height - 1)
        draw.line([(x + 12, y), (x + 15, y)], fill=INK)
        draw.text((x + 17, y), _label(v), fill=INK, font=small, anchor="lm")
    if label:
        text = _rotated_text(label, small)
        sheet.paste(text, (x + 56, top + (height - text.height) // 2))


# ----------------------------------------------------------------------------------------------
# Embedding filters


def filters_grid_png(images: np.ndarray, titles: Sequence[str], cols: int, title: str, tile_side: int = 64) -> bytes:
    """(k, ph, pw, 3) filter images, min-max scaled each on its own for display, in one sheet."""
    scaled = analyses.minmax_scale(images, axis=(1, 2, 3))  # (k, ph, pw, 3) in [0, 1]
    s = max(1, tile_side // images.shape[2])
    tiles = [enlarge((im * 255).round().astype(np.uint8), s) for im in scaled]
    sheet = mosaic(tiles, titles, cols)
    head = Image.new("RGB", (sheet.shape[1], 24), (255, 255, 255))
    ImageDraw.Draw(head).text((6, 4), title, fill=(0, 0, 0), font=font(15))
    return png_bytes(np.concatenate([np.asarray(head), sheet], axis=0))


def explained_variance_png(ratio: np.ndarray) -> bytes:
    fig = Figure(figsize=(6, 2.4))
    ax = fig.add_subplot()
    k = np.arange(1, len(ratio) + 1)
    ax.bar(k, ratio * 100, color="#4c72b0")
    ax.plot(k, np.cumsum(ratio) * 100, "o-", ms=3, color="#dd8452", label="cumulative")
    ax.set_xlabel("principal component", fontsize=9)
    ax.set_ylabel("% of variance", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    return figure_png(fig)


# ----------------------------------------------------------------------------------------------
# Position embeddings


def similarity_tiles_png(similarity: np.ndarray, grid: tuple[int, int], highlight: int | None = None,
                         title: str = "") -> bytes:
    """The paper's Fig. 7 (center): tile (r, c) is patch (r, c)'s cosine similarity map, (N, gh, gw).

    Drawn as one image (tiles separated by a blank line) so even 28 x 28 tiles stay one cheap PNG.
    """
    gh, gw = grid
    sheet = np.full((gh * (gh + 1), gw * (gw + 1)), np.nan, dtype=np.float32)
    for k in range(gh * gw):
        r, c = divmod(k, gw)
        sheet[r * (gh + 1):r * (gh + 1) + gh, c * (gw + 1):c * (gw + 1) + gw] = similarity[k]
    fig = Figure(figsize=(6.4, 6.4 * gh / gw + 0.4))
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps[SIMILARITY_CMAP].with_extremes(bad="white")
    im = ax.imshow(sheet, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    if highlight is not None:
        r, c = divmod(highlight, gw)
        ax.add_patch(matplotlib.patches.Rectangle((c * (gw + 1) - 0.8, r * (gh + 1) - 0.8), gw + 0.6, gh + 0.6,
                                                  fill=False, edgecolor="red", lw=1.5))
    step = max(1, gw // 7)
    ax.set_xticks([c * (gw + 1) + gw / 2 - 0.5 for c in range(0, gw, step)], [str(c) for c in range(0, gw, step)])
    ax.set_yticks([r * (gh + 1) + gh / 2 - 0.5 for r in range(0, gh, step)], [str(r) for r in range(0, gh, step)])
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="cosine similarity")
    return figure_png(fig)


MAP_DISPLAY_SIDE = 252  # pixels: a (gh, gw) map is enlarged, each cell a square block, to about this


def map_png(amap: np.ndarray, title: str, cmap: str = SIMILARITY_CMAP, vmin: float | None = None,
            vmax: float | None = None, highlight: int | None = None, label: str = "") -> bytes:
    """One (gh, gw) map, enlarged (each cell a block of pixels, no smoothing), with a colour bar (vmin / vmax,
    else the map's own range) and an optional framed cell. Drawn with PIL (see heatmap_png)."""
    gh, gw = amap.shape
    lo = float(np.nanmin(amap)) if vmin is None else vmin
    hi = float(np.nanmax(amap)) if vmax is None else vmax
    scale = max(1, round(MAP_DISPLAY_SIDE / max(gh, gw)))
    picture = enlarge(colorize(amap, cmap, lo, hi), scale)  # (gh, gw, 3) -> (gh*s, gw*s, 3)
    cell = None if highlight is None else divmod(int(highlight), gw)
    return heatmap_png(picture, (gh, gw), title, colorbar=(cmap, lo, hi, label), framed_cell=cell)


# ----------------------------------------------------------------------------------------------
# Attention distance and prediction


def attention_distance_png(mad: np.ndarray, uniform: float, mad_average: np.ndarray | None = None,
                           num_images: int = 1, title: str = "") -> bytes:
    """Paper Fig. 7 (right): mean attention distance per head (a dot each) against depth.

    mad, mad_average: (L, H) in pixels. Dots of this image; crosses: the average over images.
    """
    num_layers, num_heads = mad.shape
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)
    jitter = rng.uniform(-0.12, 0.12, size=(num_layers, num_heads))
    layers = np.arange(num_layers)[:, None] + jitter
    colours = matplotlib.colormaps["tab20"](np.arange(num_heads) % 20)
    for h in range(num_heads):
        ax.scatter(layers[:, h], mad[:, h], s=18, color=colours[h], label=f"head {h}" if num_heads <= 16 else None)
    if mad_average is not None and num_images > 1:
        ax.scatter(np.arange(num_layers)[:, None].repeat(num_heads, 1), mad_average, marker="x", s=16,
                   color="black", alpha=0.6, label=f"average of {num_images} images")
    ax.axhline(uniform, color="grey", ls="--", lw=1)
    ax.text(num_layers - 0.5, uniform, " uniform attention", va="bottom", ha="right", fontsize=8, color="grey")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(np.arange(num_layers))
    ax.set_ylim(bottom=0, top=max(float(np.nanmax(mad)), uniform) * 1.15)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if num_heads <= 16:
        ax.legend(fontsize=7, ncols=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure_png(fig)


def top_k_png(labels: Sequence[str], probs: Sequence[float]) -> bytes:
    """Horizontal bars, best on top."""
    fig = Figure(figsize=(6, 0.45 * len(labels) + 0.8))
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1]
    ax.barh(y, np.asarray(probs) * 100, color="#4c72b0")
    ax.set_yticks(y, [_shown_label(label, 40) for label in labels], fontsize=9)
    for yi, p in zip(y, probs, strict=True):
        ax.text(p * 100 + 1, yi, f"{p * 100:.1f}%", va="center", fontsize=8)
    ax.set_xlim(0, 110)
    ax.set_xlabel("probability (%)")
    ax.grid(axis="x", alpha=0.3)
    return figure_png(fig)


def logits_png(logits: np.ndarray, marked: Sequence[int], marked_labels: Sequence[str]) -> bytes:
    """Every logit against its class index, the top classes marked."""
    fig = Figure(figsize=(9, 2.8))
    ax = fig.add_subplot()
    idx = np.arange(len(logits))
    if len(logits) > 50:
        ax.plot(idx, logits, lw=0.6, color="#555")
    else:
        ax.bar(idx, logits, color="#888")
    for i, label in zip(marked, marked_labels, strict=True):
        ax.plot([i], [logits[i]], "o", color="#d62728", ms=4)
        ax.annotate(mathtext_literal(label[:20]), (i, logits[i]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("class index")
    ax.set_ylabel("logit")
    ax.set_xlim(-0.5, len(logits) - 0.5)
    ax.grid(alpha=0.3)
    return figure_png(fig)


# ----------------------------------------------------------------------------------------------
# "Why this prediction": faithfulness curves, logit lens, interventions

METHOD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
RANDOM_COLOUR = "#7f7f7f"


def faithfulness_curves_png(deletion: dict[str, np.ndarray], insertion: dict[str, np.ndarray],
                            random_deletion_std: np.ndarray, random_insertion_std: np.ndarray, title: str = "") -> bytes:
    """Deletion (left) and insertion (right) curves: p_c against the share of patches dropped / kept.

    deletion, insertion: name -> (S,) probabilities, one entry per method plus "random" (the mean of the
    random orders, drawn grey with a band of +- one standard deviation `random_*_std` (S,)). The x positions
    are the spec's (explain.deletion_x, insertion_x): deletion k / S for k = 0..S-1, insertion k / S for k = 1..S.
    """
    fig = Figure(figsize=(10, 3.4))
    axes = fig.subplots(1, 2, sharey=True)
    panels = ((axes[0], deletion, random_deletion_std, explain.deletion_x, "dropped (most relevant first)"),
              (axes[1], insertion, random_insertion_std, explain.insertion_x, "kept (most relevant first)"))
    for ax, curves, std, x_of, what in panels:
        methods = [name for name in curves if name != explain.RANDOM]
        for i, name in enumerate(methods):
            y = curves[name]
            x = x_of(len(y))  # (S,)
            ax.plot(x, y, "o-", ms=3, lw=1.4, color=METHOD_COLOURS[i % len(METHOD_COLOURS)], label=mathtext_literal(name))
        if explain.RANDOM in curves:
            y = curves[explain.RANDOM]
            x = x_of(len(y))  # (S,)
            ax.fill_between(x, y - std, y + std, color=RANDOM_COLOUR, alpha=0.25, lw=0)
            ax.plot(x, y, "--", lw=1.4, color=RANDOM_COLOUR, label="random (mean ± std)")
        ax.set_xlabel(f"share of patches {what}", fontsize=9)
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("probability of the target class", fontsize=9)
    axes[0].set_title("deletion: lower is more faithful", fontsize=10)
    axes[1].set_title("insertion: higher is more faithful", fontsize=10)
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    if title:
        fig.suptitle(mathtext_literal(title), fontsize=10)
    return figure_png(fig)


def lens_row_name(row: int) -> str:
    """Row l of the logit lens (0..L): the embeddings entering block 0, then the tokens after block l - 1."""
    return "the embeddings" if row == 0 else f"after block {row - 1}"


def logit_lens_strip_png(probs: np.ndarray, labels: Sequence[str], title: str = "") -> bytes:
    """The logit lens as a layer x class strip: probs (L+1, K), row l = the probabilities if the model
    stopped after block l (row 0: the embeddings), for K chosen classes; every cell is written out."""
    rows, cols = probs.shape
    fig = Figure(figsize=(min(14.0, 1.6 + 0.95 * cols), 0.9 + 0.32 * rows))
    ax = fig.add_subplot()
    im = ax.imshow(probs, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for r in range(rows):
        for c in range(cols):
            p = probs[r, c]
            ax.text(c, r, f"{p:.0%}" if p >= 0.005 else "", ha="center", va="center", fontsize=7,
                    color="white" if p > 0.6 else "black")
    ax.set_xticks(np.arange(cols), [_shown_label(label, 18) for label in labels],
                  rotation=30, ha="right", fontsize=8)
    ax.set_yticks(np.arange(rows), [lens_row_name(row).removeprefix("the ") for row in range(rows)], fontsize=7)
    ax.set_title(mathtext_literal(title), fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02, label="probability")
    return figure_png(fig)


def patch_lens_png(crop: np.ndarray, classes: np.ndarray, probs: np.ndarray, labels: dict[int, str],
                   patch_size: tuple[int, int], title: str = "", max_legend: int = 8) -> bytes:
    """The per-patch logit lens over the crop: each patch coloured by its top-1 class, the colour's
    strength its probability (pale: unsure); the number in each patch is that probability in percent.

    classes: int (gh, gw) top-1 class per patch; probs: float (gh, gw) its probability; labels: class -> name
    for the legend. The `max_legend` most frequent classes get their own colour, the rest are grey.
    """
    gh, gw = classes.shape
    counts = np.bincount(classes.reshape(-1))
    frequent = [int(c) for c in np.argsort(-counts, kind="stable")[:max_legend] if counts[c] > 0]
    palette = matplotlib.colormaps["tab10"](np.arange(10))[:, :3]
    colours = np.full((gh, gw, 3), 0.6)
    for i, c in enumerate(frequent):
        colours[classes == c] = palette[i % 10]
    strength = (0.3 + 0.7 * np.clip(probs, 0, 1))[..., None]  # (gh, gw, 1): unsure patches stay pale
    shade = 1 - strength * (1 - colours)  # blend towards white
    base = crop.astype(np.float32).mean(axis=-1, keepdims=True) / 255.0  # (H, W, 1): the crop in grey, under the colours
    tinted = 0.2 * base + 0.8 * map_to_pixels(shade, patch_size)  # (H, W, 3)
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.add_subplot()
    ax.imshow(tinted, interpolation="nearest")
    ph, pw = patch_size
    if gh * gw <= 400:  # numbers stay legible up to a 20 x 20 grid
        for r in range(gh):
            for c in range(gw):
                ax.text((c + 0.5) * pw - 0.5, (r + 0.5) * ph - 0.5, f"{probs[r, c] * 100:.0f}", ha="center", va="center",
                        fontsize=max(4, min(8, 110 // max(gh, gw))), color="black")
    ax.set_xticks([])
    ax.set_yticks([])
    handles = [matplotlib.patches.Patch(color=palette[i % 10],
                                        label=f"{_shown_label(labels.get(c, f'class {c}'), 24)} ({counts[c]})")
               for i, c in enumerate(frequent)]
    if int(counts.sum()) > sum(int(counts[c]) for c in frequent):
        handles.append(matplotlib.patches.Patch(color=(0.6, 0.6, 0.6), label="rarer classes"))
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), title="top-1 (patches)",
              title_fontsize=8)
    ax.set_title(mathtext_literal(title), fontsize=10)
    return figure_png(fig)


def removed_patches_image(crop: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int],
                          patches: Sequence[int], mode: str) -> np.ndarray:
    """The crop enlarged for display with the chosen patches shown removed: "drop" blacks them out with a red
    cross (the token is gone), "mask" paints them the normalisation mean (grey: the model sees the mean input).
    uint8 (H*s, W*s, 3)."""
    im, draw, s = _enlarged_with_grid(crop, grid, patch_size)
    for k in patches:
        box = _patch_box(k, grid[1], patch_size, s)
        if mode == "mask":
            draw.rectangle(box, fill=(124, 116, 104), outline=(255, 255, 0), width=2)  # about ImageNet's mean colour
        else:
            draw.rectangle(box, fill=(0, 0, 0))
            draw.line([box[0], box[1], box[2], box[3]], fill=(220, 40, 40), width=2)
            draw.line([box[0], box[3], box[2], box[1]], fill=(220, 40, 40), width=2)
    return np.asarray(im)


def prediction_change_png(labels: Sequence[str], before: Sequence[float], after: Sequence[float], title: str = "") -> bytes:
    """Horizontal bars of each class's probability before (grey) and after (blue) an intervention, first on top."""
    n = len(labels)
    fig = Figure(figsize=(6, 0.5 * n + 1.0))
    ax = fig.add_subplot()
    y = np.arange(n)[::-1]
    ax.barh(y + 0.2, np.asarray(before) * 100, height=0.38, color="#bbbbbb", label="original")
    ax.barh(y - 0.2, np.asarray(after) * 100, height=0.38, color="#4c72b0", label="after the intervention")
    for yi, b, a in zip(y, before, after, strict=True):
        ax.text(b * 100 + 1, yi + 0.2, f"{b * 100:.1f}%", va="center", fontsize=7, color="#555")
        ax.text(a * 100 + 1, yi - 0.2, f"{a * 100:.1f}%", va="center", fontsize=7)
    ax.set_yticks(y, [_shown_label(label, 24) for label in labels], fontsize=9)
    ax.set_xlim(0, 115)
    ax.set_xlabel("probability (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(mathtext_literal(title), fontsize=10)
    return figure_png(fig)


# ----------------------------------------------------------------------------------------------
# Token norms, high-norm patches and registers (Darcet et al., ICLR 2024)

HIGH_NORM_FRAME = (60, 255, 60)  # bright green: stands out on every colour of the inferno map (cyan means "selected")
PREFIX_COLOURS = {"CLS": "#1f77b4", "DIST": "#9467bd"}  # registers: REGISTER_COLOUR
REGISTER_COLOUR = "#2ca02c"
HIGH_NORM_COLOUR = "#d62728"


def norm_map_image(crop: np.ndarray, norm_map: np.ndarray, high_norm: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """The patch tokens' norms over the crop (min-max scaled for display), each high-norm patch framed:
    crop uint8 (H, W, 3), norm_map float (gh, gw), high_norm bool (gh, gw) -> uint8 (H*s, W*s, 3), enlarged."""
    s = display_scale(crop.shape[1])
    im = Image.fromarray(enlarge(overlay(crop, norm_map, patch_size), s))
    draw = ImageDraw.Draw(im)
    width = max(2, s + 1)
    for k in np.flatnonzero(high_norm):  # (gh, gw) -> patch indices, row-major
        draw.rectangle(_patch_box(k, high_norm.shape[1], patch_size, s), outline=HIGH_NORM_FRAME, width=width)
    return np.asarray(im)


def _prefix_colour(name: str) -> str:
    return REGISTER_COLOUR if name.startswith("REG") else PREFIX_COLOURS.get(name, "#555555")


def token_norms_png(patch_norms: np.ndarray, fence: float, prefix_norms: np.ndarray, prefix_names: Sequence[str],
                    title: str = "") -> bytes:
    """Why a patch is marked: the histogram of one layer's patch-token norms (N,), those above the fence
    (Q3 + 3 IQR) in red, the fence as a dashed line, and each prefix token's norm (P,) as a labelled line."""
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot()
    values = [*patch_norms.tolist(), *prefix_norms.tolist(), float(fence)]
    bins = np.linspace(min(values), max(values), 41) if max(values) > min(values) else 41
    high = patch_norms > fence
    ax.hist(patch_norms[~high], bins=bins, color="#888888", label=f"patches ({int((~high).sum())})")
    if high.any():
        ax.hist(patch_norms[high], bins=bins, color=HIGH_NORM_COLOUR, label=f"high-norm patches ({int(high.sum())})")
    ax.axvline(fence, color="black", ls="--", lw=1.2, label=f"fence Q3 + 3 IQR = {fence:.3g}")
    for i, (name, norm) in enumerate(zip(prefix_names, prefix_norms.tolist(), strict=True)):
        colour = _prefix_colour(name)
        ax.axvline(norm, color=colour, lw=1.6)
        ax.annotate(name, (norm, 1), xycoords=("data", "axes fraction"), xytext=(2, -10 - 11 * (i % 8)),
                    textcoords="offset points", fontsize=8, color=colour)
    ax.set_xlabel("token norm ||x||", fontsize=9)
    ax.set_ylabel("number of patches", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(mathtext_literal(title), fontsize=10)
    return figure_png(fig)


def high_norm_rate_png(rate: np.ndarray, title: str = "") -> bytes:
    """The share of high-norm patch tokens per row of the residual stream, rate (L+1,): row 0 = the
    embeddings entering block 0, row l = after block l - 1 (as `lens_row_name`)."""
    rows = np.arange(len(rate))
    fig = Figure(figsize=(6, 2.6))
    ax = fig.add_subplot()
    ax.plot(rows, rate * 100, "o-", ms=4, color=HIGH_NORM_COLOUR)
    step = max(1, len(rows) // 13)
    ax.set_xticks(rows[::step], ["emb" if r == 0 else str(r - 1) for r in rows[::step]])
    ax.set_xlabel("tokens after block (emb = the embeddings entering block 0)", fontsize=9)
    ax.set_ylabel("high-norm patches (%)", fontsize=9)
    ax.set_ylim(bottom=0, top=max(1.0, float(rate.max()) * 100 * 1.2))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(mathtext_literal(title), fontsize=10)
    return figure_png(fig)
