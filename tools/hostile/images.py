"""Image files made to cost a decoder as much as possible for their size: drawn here, at test time, small.

Each generator says what its file costs a decode that trusts it (their figures against ViT Lens's bounded decode:
docs/performance/2026-11-25.md, "Hostile uploads"). Used by tests/unit/test_hostile_images.py, tools/benchmarks/hostile_uploads.py
and the load test's attacker (tools/loadtest/attacker.py).
"""

from __future__ import annotations

import io
import re
import struct
import zlib

import numpy as np
from PIL import Image


def encoded(picture: Image.Image | np.ndarray, fmt: str = "PNG", **save_options) -> bytes:
    """The file bytes of a picture (a PIL image or a uint8 array) in format `fmt` (Pillow's save options)."""
    image = picture if isinstance(picture, Image.Image) else Image.fromarray(picture)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save_options)
    return buffer.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height over a few bytes of pixels (a decompression bomb needs no real ones)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
            + _png_chunk(b"IEND", b""))


def gray_png(width: int, height: int) -> bytes:
    """A complete 8-bit grey PNG of width x height, all zero, compressed as it is written (a 1 x 49,000,000 one is
    about 100 KB and never held whole): extreme aspect ratios (400,000 x 10 is 12 KB)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = b"\x00" * (width + 1)  # filter byte 0, then the row
    squeeze = zlib.compressobj(9)
    rows_at_once = max(1, 1_000_000 // len(row))
    parts = [squeeze.compress(row * min(rows_at_once, height - top)) for top in range(0, height, rows_at_once)]
    idat = b"".join(parts) + squeeze.flush()
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def _jpeg_segments(data: bytes) -> list[bytes]:
    """A JPEG cut at its markers: [SOI, APPn/DQT/SOF/DHT... each whole, SOS with its entropy-coded data, ..., EOI]."""
    segments, pos = [data[:2]], 2
    while pos < len(data):
        marker = data[pos + 1]
        if marker == 0xD9:
            segments.append(data[pos:pos + 2])
            break
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        end = pos + 2 + length
        if marker == 0xDA:  # the scan runs to the next marker that is not a stuffed 0xFF00 or a restart
            while not (data[end] == 0xFF and data[end + 1] not in (0x00, *range(0xD0, 0xD8))):
                end += 1
        segments.append(data[pos:end])
        pos = end
    return segments


def many_scan_jpeg(scans: int, size: tuple[int, int] = (1024, 768)) -> bytes:
    """A progressive JPEG of `scans` scans: Pillow's own progressive file of a noisy picture, its last
    smallest scan after the DC one repeated. libjpeg decodes every one (a warning at most), about 6 ms
    each at this size; a camera writes 1 (baseline) or about 10 (libjpeg's progressive default)."""
    ramp = np.linspace(0, 255, size[0] * size[1] * 3).reshape(size[1], size[0], 3)
    picture = Image.fromarray(ramp.astype(np.uint8))  # smooth: its refinement scans are a few hundred bytes
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", progressive=True, quality=90)
    segments = _jpeg_segments(buffer.getvalue())
    sos = [s for s in segments if s[1] == 0xDA]
    ac_refinements = [s for s in sos if s[4 + 2 * s[4] + 1] >= 1 and s[4 + 2 * s[4] + 3] >> 4]  # Ss >= 1, Ah > 0
    smallest = min(ac_refinements, key=len)
    return b"".join(segments[:-1]) + smallest * max(0, scans - len(sos)) + segments[-1]


def many_segment_jpeg(segments: int) -> bytes:
    """A small JPEG with `segments` empty APP0 segments after its SOI (Pillow reads each in Python: 6.3 M
    of them take seconds in Image.open). Four bytes each."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, format="JPEG")
    data = buffer.getvalue()
    return data[:2] + b"\xff\xe0\x00\x02" * segments + data[2:]


def many_frame_tiff(frames: int, damaged_last: bool = False) -> bytes:
    """A little-endian TIFF of `frames` 1 x 1 grey frames sharing one pixel (Pillow's n_frames walks them
    in quadratic time; 40,000 frames are 4 MB). `damaged_last`: the last frame's directory has no entries, no
    dimensions (a damaged later frame: Pillow's frame count raises TypeError "Missing dimensions")."""
    entry = struct.Struct("<HHII")
    tags = [(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 8), (278, 3, 1, 1), (279, 4, 1, 1)]  # width, height, bits, no compression, grey, the pixel at 8
    first_ifd, ifd_size = 10, 2 + entry.size * len(tags) + 4  # after the header (8) and the pixel, padded to even
    out = [b"II*\x00" + struct.pack("<I", first_ifd), b"\x80\x00"]
    for k in range(frames):
        next_ifd = first_ifd + (k + 1) * ifd_size if k + 1 < frames else 0
        if damaged_last and k == frames - 1:
            out.append(struct.pack("<HI", 0, 0))
        else:
            out.append(struct.pack("<H", len(tags)) + b"".join(entry.pack(*t) for t in tags) + struct.pack("<I", next_ifd))
    return b"".join(out)


def damaged_second_frame_gif() -> bytes:
    """A two-frame GIF cut 10 bytes into its second frame's image descriptor (Pillow's frame count raises
    IndexError, outside a decode's usual error handling; cut 1-8 bytes in, struct.error)."""
    frames = [Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    data = buffer.getvalue()
    second = [m.start() for m in re.finditer(b"\x21\xf9\x04", data)][1] + 8  # after its graphic control extension
    assert data[second] == 0x2C, "an image descriptor"
    return data[:second + 10]
