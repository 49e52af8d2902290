"""What students upload from their phones: every file drawn here, each with what the app must do with it.

A case is either refused (`refused`: a regex of the sentence the user reads) or analysed
(`crop`: checks on the 224 x 224 crop the model saw, uint8 (H, W, 3), e.g. orientation and colours).
Used by tests/live/test_classroom.py (through the dashboard); vit_core's own decoding is in test_images.py.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

from .images import encoded, png_header_only

RED, WHITE, BLACK, GREEN = (220, 30, 30), (255, 255, 255), (0, 0, 0), (10, 200, 30)


@dataclass(frozen=True)
class Case:
    id: str
    filename: str  # what the phone calls it (extensions lie)
    data: bytes
    refused: str | None = None  # regex of the message, if the app must refuse it
    crop: Callable[[np.ndarray], None] | None = None  # asserts on the crop the model saw, if analysed
    note: str | None = None  # a caption the app must show (what it did to the file)


def noise(seed: int, size=(64, 64)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8))


# ---------------------------------------------------------------------------------- checks on the crop


def close_to(colour, tol: int = 12):
    def check(crop: np.ndarray) -> None:
        diff = np.abs(crop.astype(int) - colour).max()
        assert diff <= tol, f"crop differs from {colour} by up to {diff}"
    return check


def halves(first, second, axis: int, tol: int = 40):
    """The crop's first half (top: axis 0, left: axis 1) is `first`, the other `second` (away from the edge)."""
    def check(crop: np.ndarray) -> None:
        n = crop.shape[axis]
        a = np.take(crop, range(0, n // 2 - 16), axis=axis).reshape(-1, 3).mean(0)
        b = np.take(crop, range(n // 2 + 16, n), axis=axis).reshape(-1, 3).mean(0)
        assert np.abs(a - first).max() <= tol, f"first half {a.round()} is not {first}"
        assert np.abs(b - second).max() <= tol, f"second half {b.round()} is not {second}"
    return check


def ramp_left_to_right(crop: np.ndarray) -> None:
    """A 16-bit horizontal ramp: grey, increasing, with many levels (not clipped to a handful)."""
    row = crop[crop.shape[0] // 2, :, 0].astype(int)
    assert np.all(np.diff(row) >= 0), "the ramp is not increasing"
    assert row[0] < 40 and row[-1] > 215, (row[0], row[-1])
    assert len(np.unique(crop[..., 0])) > 150
    assert np.array_equal(crop[..., 0], crop[..., 2])  # grey


def mean_colour_like(reference: np.ndarray, tol: float = 12):
    """For a photo: the crop's mean colour is that of the centre square of side 0.9 x the short side
    (timm's centre crop at crop_pct 0.9)."""
    def check(crop: np.ndarray) -> None:
        h, w = reference.shape[:2]
        side = round(0.9 * min(h, w))
        top, left = (h - side) // 2, (w - side) // 2
        middle = reference[top: top + side, left: left + side].reshape(-1, 3).mean(0)
        got = crop.reshape(-1, 3).mean(0)
        assert np.abs(got - middle).max() <= tol, (got.round(), middle.round())
    return check


# ---------------------------------------------------------------------------------- the corpus


def corpus() -> list[Case]:
    cases: list[Case] = []
    add = cases.append

    add(Case("empty", "IMG_0001.jpg", b"", refused="empty"))
    add(Case("text_named_jpg", "notes.jpg", b"Remember: homework due Friday!\n" * 20, refused="not an image"))
    photo = encoded(noise(1, (96, 96)), "JPEG", quality=90)
    add(Case("truncated_jpeg", "IMG_0002.jpg", photo[: len(photo) // 2], refused="damaged or truncated|not an image"))
    drawing = encoded(noise(2, (96, 96)), "PNG")
    add(Case("truncated_png", "drawing.png", drawing[: len(drawing) // 2], refused="damaged or truncated|not an image"))
    add(Case("decompression_bomb", "bomb.png", png_header_only(20000, 20000), refused="MP"))
    add(Case("svg", "logo.png", b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
                                b'<rect width="10" height="10" fill="red"/></svg>', refused="SVG"))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("a.png", drawing)
    add(Case("zip", "photos.jpg", buffer.getvalue(), refused="zip"))

    # Formats Pillow would open if asked to open anything (FITS has had a gzip-bomb CVE; EPS runs Ghostscript):
    # ViT Lens opens only the formats it offers, whatever the file is called.
    cards = ["SIMPLE  =                    T", "BITPIX  =                    8", "NAXIS   =                    2",
             "NAXIS1  =                    4", "NAXIS2  =                    3", "END"]
    fits = "".join(card.ljust(80) for card in cards).ljust(2880).encode("ascii") + bytes(range(12)).ljust(2880, b"\0")
    add(Case("fits_named_png", "photo.png", fits, refused="not an image ViT Lens can read"))
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto 10 10 lineto stroke\n%%EOF\n"
    add(Case("eps_named_png", "poster.png", eps, refused="not an image ViT Lens can read"))

    add(Case("cmyk_jpeg", "print.jpg", encoded(Image.new("RGB", (64, 64), RED).convert("CMYK"), "JPEG", quality=95),
             crop=close_to(RED, tol=30), note="Converted from CMYK"))
    ramp = np.tile(np.linspace(0, 65535, 256), (256, 1)).astype(np.uint16)  # (256, 256): dark left, bright right
    add(Case("png_16bit", "scan16.png", encoded(Image.fromarray(ramp), "PNG"), crop=ramp_left_to_right))
    palette = Image.new("P", (64, 64), 0)
    palette.putpalette([*RED, 0, 0, 255] + [0] * 762)  # index 0 red, index 1 blue (transparent)
    palette.paste(1, (32, 0, 64, 64))
    add(Case("palette_transparency", "sticker.png", encoded(palette, "PNG", transparency=1),
             crop=halves(RED, WHITE, axis=1, tol=8), note="on white"))
    la = Image.new("LA", (64, 64), (0, 0))  # black, fully transparent on the right
    la.paste((0, 255), (0, 0, 32, 64))  # opaque black on the left
    add(Case("la", "mask.png", encoded(la, "PNG"), crop=halves(BLACK, WHITE, axis=1, tol=8), note="on white"))
    frames = [Image.new("RGB", (64, 64), c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    animated = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    add(Case("animated_gif", "party.gif", animated,
             crop=close_to((255, 0, 0), tol=8), note="first of its 3 frames"))
    stored = np.zeros((60, 120, 3), dtype=np.uint8)  # stored landscape: left half red, right half black
    stored[:, :60] = RED
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": shown portrait, red on top
    add(Case("exif_rotated", "IMG_0003.jpg", encoded(Image.fromarray(stored), "JPEG", exif=exif, quality=95),
             crop=halves(RED, BLACK, axis=0), note="EXIF"))
    add(Case("one_pixel", "dot.png", encoded(Image.new("RGB", (1, 1), GREEN), "PNG"), crop=close_to(GREEN, tol=2)))
    # The model resizes the shorter side to 248 px: 4000 x 10 becomes 99,200 x 248 (25 MP) and is analysed; 10,000 x 10
    # would become 61 MP, more than a decode may hold (vit_core.loading.model: the resize is checked before it is made).
    add(Case("very_wide", "panorama.png", encoded(Image.new("RGB", (4000, 10), GREEN), "PNG"), crop=close_to(GREEN, tol=2)))
    add(Case("too_wide_for_the_resize", "strip.png", encoded(Image.new("RGB", (10000, 10), GREEN), "PNG"),
             refused=r"10000 x 10 pixels.*248000 x 248 before cropping"))
    blocks = np.random.default_rng(3).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    big = np.asarray(Image.fromarray(blocks).resize((6000, 4500), Image.NEAREST))  # 27 MP, a legal phone photo
    add(Case("huge_photo", "IMG_0004.jpg", encoded(Image.fromarray(big), "JPEG", quality=80), crop=mean_colour_like(big)))
    return cases
