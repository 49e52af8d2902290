"""Decoding images that people actually upload into plain 8-bit RGB.

Whatever comes in (a phone photo with an EXIF rotation, a transparent PNG, a CMYK JPEG, a 16-bit
scan, an animated GIF), the model gets one RGB picture that looks the way the user saw it, or the
user gets an `ImageError` with one sentence saying what is wrong. Nothing here touches Pillow's
process-wide settings (`LOAD_TRUNCATED_IMAGES`, `MAX_IMAGE_PIXELS`): the server shares them between
every browser session.

Two things keep a class of uploads cheap. A large JPEG is decoded at 1/2, 1/4 or 1/8 of its size by
libjpeg itself (Pillow's `Image.draft`: it skips the fine DCT coefficients, a fraction of the work of
a full decode plus a resize) while its shorter side stays at least `DRAFT_MIN_SIDE` pixels, more than
any model's resize and the dashboard's preview use; the result is deterministic, and the CLI, the
dashboard and the load test's reference all decode this way. And at most `MAX_CONCURRENT_DECODES`
pixel decodes run at once in a process (a decode holds its whole picture in memory: thirty uploads
decoded at once would hold thirty).

Beside this door: `decoding` runs the pixel decodes in worker processes limited in CPU time and memory,
`decode_worker` is such a worker, and `files` reads inputs within bounds and writes results atomically.
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ImageError
from . import decoding
from .files import read_input

_logger = logging.getLogger(__name__)

# Refuse before decoding anything larger: 50 MP is a 8660 x 5770 photo, well above any phone camera,
# and below Pillow's own decompression-bomb warning level (89 MP), so we decide, not a warning filter.
MAX_PIXELS = 50_000_000
# The largest file read from a path: 50 MP of 16-bit RGBA, uncompressed. Only regular files are read
# (vit_core.images.files.read_input): a FIFO or /dev/zero is refused unread.
MAX_FILE_BYTES = MAX_PIXELS * 8
# The longer side at most this many times the shorter: past it, any model's resize of the shorter side to 224 or
# more would make over 50 MP (model.MAX_RESIZED_PIXELS), and the model's crop would refuse it; refused here before
# its pixels are decoded (a 1 x 49,000,000 PNG is 95 KB and 49 MP).
MAX_SIDE_RATIO = 1000
# The only formats Pillow may open here (its JPEG opener also takes MPO, the JPEG variant some
# cameras write). Left to itself Pillow would also open FITS, EPS, PSD, ICO and dozens more, some
# through external programs (EPS: Ghostscript), whatever the file's name says; a file of any other
# format is refused like a non-image.
SUPPORTED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")
UPLOAD_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")

# A JPEG's shorter side stays at least this many pixels when it is decoded at reduced size (Image.draft):
# more than a model's resize of the shorter side (224-384 for the dashboard's list, 518 for DINOv2,
# the largest of timm's ViTs). A 12 MP phone photo (4032 x 3024) decodes at 1/4, 1008 x 756: its
# preview (at most 1024 pixels a side) then needs no resize either, and the decode is several times
# faster than at 1/2 (docs/performance.md, "Photos and files").
DRAFT_MIN_SIDE = 640
# Pixel decodes at once, all threads of the process together: about the CPUs this process may use
# (more run no faster; each holds its decoded picture).
MAX_CONCURRENT_DECODES = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
_decode_slots = threading.BoundedSemaphore(MAX_CONCURRENT_DECODES)

_WHITE = (255, 255, 255)
_EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class DecodedImage:
    image: Image.Image  # mode "RGB", EXIF orientation applied
    source_format: str  # e.g. "PNG"
    source_size: tuple[int, int]  # (width, height) as stored, before EXIF rotation
    notes: tuple[str, ...] = ()  # what was done that a user may want to know ("first of 12 frames")
    reduction: int = 1  # 1, 2, 4 or 8: the JPEG was decoded at 1/reduction of its size (see draft_size)


def _sniff(head: bytes) -> str | None:
    """A user-facing name for common non-image files, from their first bytes."""
    stripped = head.lstrip()
    if stripped[:5].lower() in (b"<?xml", b"<svg ") or b"<svg" in stripped[:512].lower():
        return "an SVG (vector) file; export it as PNG or JPEG first"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive; unpack it and upload one image"
    if head[:5] == b"%PDF-":
        return "a PDF document; export the page as PNG or JPEG first"
    return None


def _read_bytes(source: bytes | str | Path | io.IOBase) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, Path)):
        try:
            return read_input(source, MAX_FILE_BYTES)  # a regular file only, read up to the cap
        except OSError as e:  # the file's name, not its folder: a server's paths are its own business
            raise ImageError(f"Could not read {Path(source).name}: {e.strerror or 'error'}.") from e
    return source.read()


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB the way a viewer would show it.

    Transparency is composited on white (what a browser shows for a PNG on a white page); 16- and
    32-bit integer data is scaled to 8 bits rather than clipped (Pillow's plain `convert("RGB")`
    keeps only values below 256); float data is scaled by its finite values (`_float_to_8_bits`).
    """
    mode = im.mode
    if mode == "RGB":
        return im
    if mode == "P" and "transparency" in im.info or mode == "PA":
        im, mode = im.convert("RGBA"), "RGBA"
    if mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode.startswith("I"):  # "I", "I;16", "I;16B", "I;16L", "I;16N": 16-bit data in PNG/TIFF
        return Image.fromarray(_scaled_to_8_bits(im, sixteen_bit=mode.startswith("I;16")), mode="L").convert("RGB")
    if mode == "F":
        return Image.fromarray(_float_to_8_bits(np.asarray(im, dtype=np.float64)), mode="L").convert("RGB")
    return im.convert("RGB")  # "1", "L", "P", "CMYK", "YCbCr", "LAB", "HSV"


# The share of the finite values clipped at each end when a float image is scaled, as a viewer's auto-contrast does:
# min-max scaling let one pixel of 3e38 turn the rest of the image to one grey.
_FLOAT_CLIP_PERCENT = 0.1


def _float_to_8_bits(values: np.ndarray) -> np.ndarray:
    """A float image (H, W) -> (H, W) uint8: its finite values from the 0.1th to the 99.9th percentile (the nearest
    values the image holds, so an image of a few hundred pixels keeps its own minimum and maximum) scaled to 0..255,
    beyond them clipped. NaN is black, +inf white, -inf black: with them in the range, one NaN made every pixel
    NaN (black) and one inf every finite pixel 0. An image without two distinct finite values: black, and white
    what lies above its one value."""
    finite = values[np.isfinite(values)]  # (n,)
    if finite.size == 0:
        lo = hi = 0.0
    else:
        lo, hi = (float(v) for v in np.percentile(finite, [_FLOAT_CLIP_PERCENT, 100 - _FLOAT_CLIP_PERCENT],
                                                  method="nearest"))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and NaN: mapped below, not warned about
        gray = (values > hi).astype(np.float64) if hi <= lo else (values - lo) / (hi - lo)
    gray = np.nan_to_num(gray, nan=0.0, posinf=1.0, neginf=0.0)
    return np.round(np.clip(gray, 0.0, 1.0) * 255).astype(np.uint8)


_ROWS_AT_ONCE = 256  # rows of a 16-bit image scaled at a time: a few MB in flight, not 8 bytes per pixel


def _scaled_to_8_bits(im: Image.Image, sixteen_bit: bool) -> np.ndarray:
    """A 16- or 32-bit integer image -> (H, W) uint8, in integers, read from the image a band of rows at a time.

    16-bit data (or any with values above 255) is scaled from 0..65535 to 0..255, rounded to nearest
    ((v * 255 + 32767) // 65535); 8-bit values in a 32-bit mode are kept. No full-size copy of the
    source is made (np.asarray of the whole image would be one): a 50 MP scan costs its 8-bit result
    plus one band, where float64 cost 1.2 GB.
    """
    width, height = im.size
    wide = sixteen_bit or im.getextrema()[1] > 255
    gray = np.empty((height, width), dtype=np.uint8)
    for top in range(0, height, _ROWS_AT_ONCE):
        rows = np.asarray(im.crop((0, top, width, min(height, top + _ROWS_AT_ONCE))))  # (rows, W)
        band = np.clip(rows, 0, 65535 if wide else 255).astype(np.uint32)
        if wide:  # in place: one band in flight
            band *= 255
            band += 32767
            band //= 65535
        gray[top: top + _ROWS_AT_ONCE] = band
    return gray


def draft_size(size: tuple[int, int], min_side: int) -> tuple[int, int] | None:
    """The size to ask `Image.draft` for so that a JPEG of `size` (w, h) decodes at the smallest of
    libjpeg's scales (1/2, 1/4, 1/8) whose shorter side is still >= min_side; None: decode at full size.

    draft picks the largest scale s with w // s >= asked w and h // s >= asked h, and gives
    (ceil(w / s), ceil(h / s)): asking for (w, h) * min_side / min(w, h) keeps both sides above it.
    """
    w, h = size
    if min_side <= 0 or min(w, h) < 2 * min_side:  # not even 1/2 would do
        return None
    factor = min_side / min(w, h)
    return max(1, math.ceil(w * factor)), max(1, math.ceil(h * factor))


def decode_image(source: bytes | str | Path | io.IOBase | Image.Image, min_side: int = DRAFT_MIN_SIDE) -> DecodedImage:
    """Decode an image file (bytes, path or file object) or normalise a PIL image to RGB.

    A file is checked from its bytes first (`check_header`: a JPEG's scans and segments), then decoded in one of
    `vit_core.images.decoding`'s worker processes, limited in CPU time and memory, at most MAX_CONCURRENT_DECODES at once.
    A large JPEG is decoded at reduced size, its shorter side at least `min_side` pixels (0: full size; see
    `draft_size`); other formats and PIL images keep their size. Raises ImageError with a user-facing sentence for
    an empty, unreadable, damaged, oversized or too costly file; nothing else escapes for a file's content.
    Animated files give their first frame.
    """
    if isinstance(source, Image.Image):
        im = ImageOps.exif_transpose(source)
        return DecodedImage(to_rgb(im), source.format or "PIL", source.size)
    data = _read_bytes(source)
    if not data:
        raise ImageError("The file is empty.")
    check_header(data)
    with _decode_slots:  # at most MAX_CONCURRENT_DECODES pictures in flight, each in a worker of its own
        return DecodedImage(*decoding.decode_in_worker(data, min_side))


def decode_here(data: bytes, min_side: int = DRAFT_MIN_SIDE) -> DecodedImage:
    """`decode_image` of a file's bytes in this process, without its time and memory limits (what a decode worker
    runs). Raises ImageError and nothing else for anything in the file (MemoryError aside)."""
    try:
        return _decode_here(data, min_side)
    except (ImageError, MemoryError):
        raise
    except Exception as e:  # Pillow's decoders raise anything on damaged data (TypeError, IndexError, ...)
        raise ImageError(f"The image file is damaged ({type(e).__name__} while reading it).") from e


def _decode_here(data: bytes, min_side: int) -> DecodedImage:
    try:
        im = Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as e:
        if isinstance(e, Image.DecompressionBombError):
            raise ImageError(f"The image is too large to open safely (over {MAX_PIXELS // 1_000_000} MP).") from e
        what = _sniff(data[:1024])
        if what:
            raise ImageError(f"This is {what}.") from e
        raise ImageError(
            "This file is not an image ViT Lens can read. Use JPEG, PNG, WebP, BMP, GIF or TIFF."
        ) from e

    width, height = im.size
    if width * height > MAX_PIXELS:
        raise ImageError(
            f"The image is {width} x {height} pixels ({width * height / 1e6:.0f} MP); the limit is "
            f"{MAX_PIXELS // 1_000_000} MP. Downscale it first."
        )
    if width < 1 or height < 1:
        raise ImageError("The image has no pixels.")
    if max(width, height) > MAX_SIDE_RATIO * min(width, height):
        raise ImageError(f"This image is {width} x {height} pixels: a model would enlarge it to more than "
                         f"{MAX_PIXELS // 1_000_000} MP before cropping; crop it closer to a square first.")

    notes = []
    frames = frame_count(im, data)  # never Pillow's n_frames: quadratic in a TIFF's frames; frame 0 is all we use
    if frames is None:
        notes.append("Animated file: using its first frame (a later one is damaged).")
    elif frames > MAX_COUNTED_FRAMES:
        notes.append(f"Animated file: using the first of its more than {MAX_COUNTED_FRAMES} frames.")
    elif frames > 1:
        notes.append(f"Animated file: using the first of its {frames} frames.")
    reduction = 1
    asked = draft_size((width, height), min_side) if im.format == "JPEG" else None  # (not MPO: several frames)
    if asked is not None and im.draft(None, asked) is not None:
        reduction = max(1, round(width / im.size[0]))
    if reduction > 1:
        notes.append(f"Decoded at 1/{reduction} of its {width} x {height} pixels ({im.size[0]} x {im.size[1]}): "
                     f"still more than the model's crop and the preview use.")
    rgb = _pixels(im, notes)
    _logger.debug("decoded %s %sx%s %s -> RGB %s", im.format, width, height, im.mode, rgb.size)
    return DecodedImage(rgb, im.format or "unknown", (width, height), tuple(notes), reduction)


# ----------------------------------------------------------------------------------------------
# What the bytes show before any decode: linear walks, bounded by the caps


# A progressive JPEG's scans, each a pass over every block of the picture (about 6 ms each for a large one):
# libjpeg's progressive default writes 10 (6 for grey), mozjpeg's optimised ones a few more, a camera 1.
# 100 is ten times libjpeg's default; the thousands of a hostile file cost minutes.
MAX_JPEG_SCANS = 100
# A JPEG's segments (APPn, DQT, DHT, SOF, SOS, ...), which Pillow's opener reads one by one in Python (6.3 M empty
# ones took 14.7 s in Image.open): a photo has a few dozen; an ICC profile split in 255 APP2 chunks and extended
# XMP are the most a file legitimately carries.
MAX_JPEG_SEGMENTS = 2000
# Frames counted for the "first of its N frames" note; past this the note says "more than".
MAX_COUNTED_FRAMES = 10_000

_MARKER_AT = re.compile(rb"\xff+(.)", re.DOTALL)  # a marker, after any fill bytes
_WINDOW = 1 << 16  # bytes of entropy-coded data looked at per step of _entropy_end: bounded memory, whatever the file


def _entropy_end(data: bytes, start: int) -> int | None:
    """The first position from `start` of a 0xFF byte followed by a marker that ends entropy-coded data (not 0x00, a
    restart marker RSTn or another 0xFF fill byte), or None. Looked for a window at a time with numpy: a regular
    expression's walk takes 10 ms a megabyte, on the page's thread, before a photo's forward (docs/performance.md,
    "Photos and files")."""
    b = np.frombuffer(data, dtype=np.uint8)
    while start < len(b) - 1:
        stop = min(len(b) - 1, start + _WINDOW)
        this, after = b[start:stop], b[start + 1:stop + 1]
        ends = (this == 0xFF) & (after != 0x00) & (after != 0xFF) & ((after < 0xD0) | (after > 0xD7))
        first = int(ends.argmax())
        if ends[first]:
            return start + first
        start = stop
    return None


def jpeg_scans_and_segments(data: bytes) -> tuple[int, int]:
    """(scans, segments) of the JPEG in `data` up to its first EOI, each counted to one past its cap at most.

    One pass over the bytes (the entropy-coded data skipped by numpy, a window at a time); every step counts a
    segment, so the walk ends after at most MAX_JPEG_SEGMENTS + 1 steps, whatever the file. A damaged structure
    ends the walk: Pillow's decoder then says what is wrong.
    """
    scans = segments = 0
    pos = 2  # after SOI
    while scans <= MAX_JPEG_SCANS and segments <= MAX_JPEG_SEGMENTS:
        found = _MARKER_AT.match(data, pos)
        if found is None:
            break
        marker, pos = found.group(1)[0], found.end()
        segments += 1
        if marker == 0xD9:  # EOI: what follows (an MPO's other pictures) is not decoded
            break
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # TEM, SOI, RSTn: no length
            continue
        if pos + 2 > len(data):
            break
        length = (data[pos] << 8) | data[pos + 1]
        if marker == 0xDA:
            scans += 1
            after = _entropy_end(data, pos + length)  # the last fill byte before the next marker
            if after is None:
                break
            pos = after
        else:
            pos += length
    return scans, segments


def check_header(data: bytes) -> None:
    """Refuse, from the bytes alone, a file whose structure makes its decode far costlier than its size says
    (raises ImageError): a JPEG with more scans or segments than any camera or encoder writes."""
    if data[:2] == b"\xff\xd8":
        scans, segments = jpeg_scans_and_segments(data)
        if scans > MAX_JPEG_SCANS:
            raise ImageError(f"This JPEG has more than {MAX_JPEG_SCANS} progressive scans (a camera writes 1 to about "
                             f"10), which would take minutes to decode; save it again as an ordinary JPEG first.")
        if segments > MAX_JPEG_SEGMENTS:
            raise ImageError(f"This JPEG has more than {MAX_JPEG_SEGMENTS} header segments (a photo has a few "
                             f"dozen); save it again as an ordinary JPEG first.")


def frame_count(im: Image.Image, data: bytes) -> int | None:
    """How many frames the file has, counted to MAX_COUNTED_FRAMES + 1 at most, in time linear in what it counts;
    None when a later frame is damaged. TIFF and GIF directories are walked here over the bytes (Pillow's n_frames
    is quadratic in a TIFF's frames, and raises whatever a damaged frame makes it); other formats state their
    count in their header."""
    if im.format == "TIFF":
        return _tiff_frames(data)
    if im.format == "GIF":
        return _gif_frames(data)
    try:
        return int(getattr(im, "n_frames", 1))
    except Exception:  # noqa: BLE001 - a damaged frame table: frame 0 is still what we decode
        return None


def _tiff_frames(data: bytes) -> int | None:
    """The length of a TIFF's chain of image directories (classic or BigTIFF), None if it is damaged."""
    order = "<" if data[:2] == b"II" else ">"
    big = data[2:4] in (b"\x00+", b"+\x00")
    offset_format, count_format, entry_size = (order + "Q", order + "Q", 20) if big else (order + "I", order + "H", 12)
    offset = struct.unpack_from(offset_format, data, 8 if big else 4)[0]
    seen: set[int] = set()
    try:
        while offset and len(seen) <= MAX_COUNTED_FRAMES:
            if offset in seen:
                return None  # a loop
            seen.add(offset)
            entries = struct.unpack_from(count_format, data, offset)[0]
            offset = struct.unpack_from(offset_format, data, offset + struct.calcsize(count_format) + entries * entry_size)[0]
    except struct.error:
        return None  # a directory past the end of the file
    return len(seen)


def _gif_frames(data: bytes) -> int | None:
    """The number of image descriptors in a GIF, found by skipping its blocks; None if they are damaged."""
    try:
        pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # header, screen descriptor, colour table
        frames = 0
        while frames <= MAX_COUNTED_FRAMES:
            kind = data[pos]
            if kind == 0x3B:  # trailer
                return frames
            if kind == 0x21:  # extension: label, then sub-blocks
                pos += 2
            elif kind == 0x2C:  # image: descriptor, local colour table, LZW code size, then sub-blocks
                frames += 1
                flags = data[pos + 9]
                pos += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1
            else:
                return None
            while data[pos]:
                pos += data[pos] + 1
            pos += 1
        return frames
    except IndexError:  # cut short: in frame 0, Pillow's decode says so; past it, a later frame is damaged
        return frames if frames <= 1 else None


def _pixels(im: Image.Image, notes: list[str]) -> Image.Image:
    """Decode `im`'s pixels, turn them upright and into RGB (appending to `notes` what a user may want to know)."""
    try:
        im.load()
    except (OSError, ValueError, SyntaxError) as e:  # Pillow raises all three for damaged data
        raise ImageError(f"The image file is damaged or truncated ({e}).") from e
    try:  # the EXIF block and the mode conversion read more of the file: damaged data can still surface here
        # 1 is upright and 2-8 the turns and flips; anything else names none (exif_transpose then turns nothing),
        # so it is ignored without a note
        rotated = im.getexif().get(_EXIF_ORIENTATION, 1) in range(2, 9)
        if rotated:
            notes.append("Rotated according to the camera's EXIF orientation.")
        transposed = ImageOps.exif_transpose(im) if rotated else im  # (exif_transpose copies even when upright)
        if im.mode not in ("RGB", "L"):
            on_white = "A" in im.mode or "transparency" in im.info
            notes.append(f"Converted from {im.mode} to RGB" + (" on white." if on_white else "."))
        return to_rgb(transposed)
    except (OSError, ValueError, SyntaxError, TypeError, struct.error) as e:  # Pillow's ways of saying "damaged"
        raise ImageError(f"The image file is damaged ({type(e).__name__} while reading it after its pixels).") from e


def load_image(source: bytes | str | Path | io.IOBase | Image.Image, min_side: int = DRAFT_MIN_SIDE) -> Image.Image:
    """`decode_image(source, min_side).image`: an RGB PIL image, or ImageError."""
    return decode_image(source, min_side).image
