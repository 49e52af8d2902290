"""What a student's script can send as the Draw canvas's value instead of a drawing.

The browser sends the canvas as a `data:` URL; nothing stops a script from putting any file in it. Opened with a
bare `Image.open`, a FITS file is decoded, an EPS makes Pillow look for Ghostscript (which would run the student's
PostScript), and a 684 KB PNG of 169 MP takes a server about 6 GB for tens of seconds.
Used by tests/app/test_draw_canvas.py and the load test's attacker (tools/loadtest, --attacker).
"""

from __future__ import annotations

import base64
import io

from PIL import Image

from .images import png_header_only

CANVAS_DATA_URL = "data:image/png;base64,"


def data_url(data: bytes, mime: str = "image/png") -> str:
    """`data` as the canvas's frontend sends a drawing (it always says image/png; a script may say anything)."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def fits_file(side: int = 4) -> bytes:
    """A minimal FITS image (astronomy's format, one Pillow opens): 8-bit grey, side x side."""
    def card(key: str, value: str) -> bytes:
        return f"{key:<8}= {value:>20}".ljust(80).encode("ascii")

    header = card("SIMPLE", "T") + card("BITPIX", "8") + card("NAXIS", "2") + card("NAXIS1", str(side))
    header += card("NAXIS2", str(side)) + b"END".ljust(80)
    pixels = bytes(range(side * side))
    return header.ljust(2880, b" ") + pixels.ljust(-(-len(pixels) // 2880) * 2880, b"\0")


def eps_file() -> bytes:
    """An EPS file: Pillow opens it and, to load its pixels, runs Ghostscript on it (arbitrary PostScript)."""
    return (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\n"
            b"newpath 0 0 moveto 8 8 lineto stroke\nshowpage\n%%EOF\n")


def huge_png(side: int = 13_000) -> bytes:
    """A PNG whose header claims side x side (169 MP by default) over a few bytes of pixels."""
    return png_header_only(side, side)


def canvas_drawing(side: int = 232, seed: int = 0) -> bytes:
    """What the canvas sends for a real drawing: an RGBA PNG of side x side, white paper and a dark stroke."""
    im = Image.new("RGBA", (side, side), (255, 255, 255, 255))
    for k in range(side // 4, 3 * side // 4):
        for w in range(-3, 4):
            im.putpixel((k, min(side - 1, max(0, k + w + seed % 7))), (20, 20, 20, 255))
    buffer = io.BytesIO()
    im.save(buffer, format="PNG")
    return buffer.getvalue()


def hostile_canvas_values() -> dict[str, str]:
    """id -> a data URL the canvas must refuse without decoding it."""
    return {
        "fits": data_url(fits_file(), "image/fits"),
        "fits_said_png": data_url(fits_file()),
        "eps": data_url(eps_file(), "application/postscript"),
        "eps_said_png": data_url(eps_file()),
        "png_169mp": data_url(huge_png()),
        "png_twice_the_canvas": data_url(png_header_only(464, 464)),
        "not_base64": CANVAS_DATA_URL + "%%%%",
    }


def malformed_canvas_values() -> dict[str, dict]:
    """id -> a whole component value (what the frontend stores per canvas) not of the package's shape
    ({"drawing": {"raw": {...}, "data": "data:..."}, "backgroundFit": {...} or None}): `st_canvas` reads it with
    `.get` and `[]`, so each raised AttributeError, KeyError or TypeError on every rerun until it was refused."""
    url = data_url(canvas_drawing())
    raw = {"objects": [{"type": "path"}]}
    return {
        "drawing_string": {"drawing": "a drawing", "backgroundFit": None},
        "drawing_list": {"drawing": [raw, url], "backgroundFit": None},
        "raw_list": {"drawing": {"raw": [{"type": "path"}], "data": url}, "backgroundFit": None},
        "objects_string": {"drawing": {"raw": {"objects": "path"}, "data": url}, "backgroundFit": None},
        "data_dict": {"drawing": {"raw": raw, "data": {"url": url}}, "backgroundFit": None},
        "background_fit_empty": {"drawing": {"raw": raw, "data": url}, "backgroundFit": {}},
        "background_fit_list": {"drawing": {"raw": raw, "data": url}, "backgroundFit": [1, 2]},
    }
