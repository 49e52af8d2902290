"""Every kind of image people upload: decoded correctly or refused with a sentence, drawn here."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
import pytest
from PIL import Image

from conftest import COMMAND_TIMEOUT, encoded
from vit_core import ImageError, decode_image, run_with_capture
from vit_core.images import decode_here


def solid(color, size=(32, 24), mode="RGB") -> Image.Image:
    return Image.new(mode, size, color)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (a decompression bomb needs no real pixels)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")


# ---------------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "empty"),
        (b"just some text, named photo.jpg", "not an image"),
        (b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>', "SVG"),
        (b"%PDF-1.4 ...", "PDF"),
    ],
)
def test_non_images_are_refused_with_a_sentence(data, message):
    with pytest.raises(ImageError, match=message):
        decode_image(data)


def fits_image(width: int = 4, height: int = 3) -> bytes:
    """A minimal FITS file (astronomy's format, one that Pillow opens): 80-character header cards in a
    2880-byte block, then the 8-bit pixels in another."""
    cards = ["SIMPLE  =                    T", "BITPIX  =                    8", "NAXIS   =                    2",
             f"NAXIS1  = {width:>20}", f"NAXIS2  = {height:>20}", "END"]
    header = "".join(card.ljust(80) for card in cards).ljust(2880).encode("ascii")
    return header + bytes(range(width * height)).ljust(2880, b"\0")


def test_a_format_pillow_reads_but_vit_lens_does_not_offer_is_refused():
    data = fits_image()
    assert Image.open(io.BytesIO(data)).format == "FITS"  # Pillow alone would decode it, whatever its name
    with pytest.raises(ImageError, match="not an image ViT Lens can read. Use JPEG, PNG"):
        decode_image(data)  # e.g. uploaded as "photo.png"


def test_zip_is_refused():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("a.png", encoded(solid("red"), "PNG"))
    with pytest.raises(ImageError, match="zip"):
        decode_image(buffer.getvalue())


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_files_are_refused(fmt):
    rng = np.random.default_rng(0)
    data = encoded(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)), fmt)
    with pytest.raises(ImageError, match="damaged or truncated|not an image"):
        decode_image(data[: len(data) // 2])


def test_decompression_bomb_is_refused_before_decoding():
    with pytest.raises(ImageError, match="MP"):
        decode_image(png_header_only(20000, 20000))  # 400 MP claimed in a 60-byte file


def test_missing_file_is_an_image_error(tmp_path):
    with pytest.raises(ImageError, match="Could not read"):
        decode_image(tmp_path / "nope.png")


# ---------------------------------------------------------------------------------- decoded correctly


def test_cmyk_jpeg_keeps_its_colour():
    red = solid((220, 30, 30)).convert("CMYK")
    decoded = decode_image(encoded(red, "JPEG", quality=95))
    assert decoded.image.mode == "RGB"
    r, g, b = np.asarray(decoded.image).reshape(-1, 3).mean(0)
    assert r > 180 and g < 80 and b < 80


def test_16bit_png_is_scaled_not_clipped():
    ramp = (np.linspace(0, 65535, 256 * 4).reshape(4, 256)).astype(np.uint16)
    data = encoded(Image.fromarray(ramp), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    pixels = np.asarray(decode_image(data).image)[..., 0]
    assert pixels.min() == 0 and pixels.max() == 255
    assert len(np.unique(pixels)) > 200  # a plain convert("RGB") leaves a handful of levels


def test_16bit_conversion_is_exact_and_in_integers():
    """Rounded to nearest from 0..65535 to 0..255, without a float64 copy of the image (8 bytes a pixel)."""
    import tracemalloc

    from vit_core.images import to_rgb

    values = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    assert np.array_equal(np.asarray(to_rgb(Image.fromarray(values)))[..., 0],
                          np.round(values.astype(np.float64) * 255 / 65535).astype(np.uint8))
    big = Image.fromarray(np.random.default_rng(0).integers(0, 65536, (2000, 2000), dtype=np.uint16))  # 4 MP
    tracemalloc.start()
    to_rgb(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # The file's own 2 bytes a pixel, the 8-bit result's 1 and a band; float64 alone took 8.
    assert peak < 6 * 2000 * 2000, f"{peak / 4e6:.1f} bytes per pixel in flight"


def test_a_failure_after_the_pixels_are_read_is_an_image_error(monkeypatch):
    from PIL import ImageOps

    def damaged(_im):
        raise OSError("broken EXIF block")

    monkeypatch.setattr(ImageOps, "exif_transpose", damaged)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: exif_transpose runs (an upright image skips it)
    with pytest.raises(ImageError, match="damaged"):
        decode_here(encoded(solid((1, 2, 3)), "JPEG", exif=exif))  # in this process: the monkeypatch holds


def test_a_missing_file_is_named_without_its_folder(tmp_path):
    with pytest.raises(ImageError) as refused:
        decode_image(tmp_path / "nope.png")
    assert "nope.png" in str(refused.value) and str(tmp_path) not in str(refused.value)


def test_palette_png_with_transparency_is_composited_on_white():
    im = Image.new("P", (20, 10), 0)
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)  # index 0 red, index 1 blue
    im.paste(1, (10, 0, 20, 10))
    data = encoded(im, "PNG", transparency=1)  # the blue half is transparent
    pixels = np.asarray(decode_image(data).image)
    assert tuple(pixels[5, 2]) == (255, 0, 0)
    assert tuple(pixels[5, 15]) == (255, 255, 255)


def test_la_and_rgba_composite_on_white():
    la = Image.new("LA", (4, 4), (0, 0))  # black, fully transparent
    assert tuple(np.asarray(decode_image(encoded(la, "PNG")).image)[0, 0]) == (255, 255, 255)
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 128))  # black at half opacity -> mid grey
    assert abs(int(np.asarray(decode_image(encoded(rgba, "PNG")).image)[0, 0, 0]) - 127) <= 1


def test_one_bit_and_grayscale():
    one_bit = Image.new("1", (8, 8), 1)
    assert tuple(np.asarray(decode_image(encoded(one_bit, "PNG")).image)[0, 0]) == (255, 255, 255)
    gray = Image.new("L", (8, 8), 77)
    assert tuple(np.asarray(decode_image(encoded(gray, "PNG")).image)[0, 0]) == (77, 77, 77)


def test_animated_gif_gives_its_first_frame():
    frames = [solid(c) for c in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    decoded = decode_image(data)
    r, g, b = np.asarray(decoded.image)[0, 0]
    assert r > 200 and g < 50 and b < 50
    assert any("first of its 3 frames" in note for note in decoded.notes)


def test_exif_rotated_jpeg_is_turned_upright():
    im = np.zeros((20, 40, 3), dtype=np.uint8)
    im[:, :20] = (255, 0, 0)  # stored: left half red, 40 wide x 20 high
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    decoded = decode_image(encoded(Image.fromarray(im), "JPEG", exif=exif, quality=95))
    assert decoded.image.size == (20, 40)  # displayed portrait
    pixels = np.asarray(decoded.image)
    assert pixels[5, 10, 0] > 200 and pixels[35, 10, 0] < 50  # red is now the top half
    assert any("EXIF" in note for note in decoded.notes)


@pytest.mark.parametrize("orientation", [0, 9, 300])
def test_an_exif_orientation_outside_1_to_8_is_ignored_without_a_note(orientation):
    """1 is upright and 2-8 the turns and flips; other values name none, so nothing is turned and nothing said."""
    im = np.zeros((20, 40, 3), dtype=np.uint8)
    im[:, :20] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = orientation
    decoded = decode_here(encoded(Image.fromarray(im), "JPEG", exif=exif, quality=95))
    assert decoded.image.size == (40, 20)
    assert not any("EXIF" in note or "Rotated" in note for note in decoded.notes), decoded.notes


def float_tiff(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(values.astype(np.float32), mode="F").save(buffer, format="TIFF")
    return buffer.getvalue()


GRADIENT = np.tile(np.linspace(0.0, 1.0, 64), (64, 1))  # (64, 64): black on the left, white on the right


@pytest.mark.parametrize("odd,shown", [(np.nan, 0), (np.inf, 255), (-np.inf, 0), (3e38, 255), (-3e38, 0)])
def test_a_float_tiff_is_scaled_by_its_finite_values_and_one_extreme_pixel_flattens_nothing(odd, shown):
    """One NaN or inf pixel made the whole image black, one 3e38 pixel its gradient one grey: now the finite values
    set the range (its 0.1 % extremes clipped), NaN and -inf are black, +inf white."""
    values = GRADIENT.copy()
    values[0, 0] = odd
    decoded = decode_here(float_tiff(values))
    gray = np.asarray(decoded.image)[..., 0].astype(int)  # (64, 64)
    assert gray[0, 0] == shown
    expected = np.round(GRADIENT[1:] * 255)  # the rows without the odd pixel: the plain gradient
    assert np.abs(gray[1:] - expected).max() <= 1
    assert gray[1:, 0].max() == 0 and gray[1:, -1].min() == 255


def test_a_float_tiff_of_no_finite_value_is_black_and_a_flat_one_stays_flat():
    assert np.asarray(decode_here(float_tiff(np.full((8, 8), np.nan))).image).max() == 0
    flat = np.full((8, 8), 2.5)
    flat[3, 3] = np.inf
    gray = np.asarray(decode_here(float_tiff(flat)).image)[..., 0]
    assert gray[3, 3] == 255 and np.delete(gray.ravel(), 3 * 8 + 3).max() == 0


def test_a_small_float_image_keeps_its_own_minimum_and_maximum():
    values = np.arange(16, dtype=np.float64).reshape(4, 4)  # too few pixels for the clipping to take one
    gray = np.asarray(decode_image(float_tiff(values)).image)[..., 0]
    assert gray.min() == 0 and gray.max() == 255 and gray[0, 1] == 17


@pytest.mark.parametrize("size", [(1, 1), (4000, 10), (10, 4000)])  # resized to 99,200 x 248: 25 MP
def test_extreme_aspect_ratios_reach_the_model(tiny, size):
    decoded = decode_image(encoded(Image.new("RGB", size, (10, 200, 30)), "PNG"))
    cap = run_with_capture(tiny, decoded.image)
    assert cap.input_image.shape == (224, 224, 3)
    assert np.isfinite(cap.logits).all()
    # A uniform image stays uniform, whatever the aspect ratio
    assert np.abs(cap.input_image.astype(int) - (10, 200, 30)).max() <= 2


def test_huge_but_legal_photo_decodes(tiny):
    rng = np.random.default_rng(1)
    small = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    big = Image.fromarray(small).resize((6000, 4500), Image.NEAREST)  # 27 MP
    data = encoded(big, "JPEG", quality=80)
    assert decode_image(data, min_side=0).image.size == (6000, 4500)  # full size on request
    decoded = decode_image(data)  # by default at 1/4: its shorter side 1125 >= DRAFT_MIN_SIDE
    assert decoded.image.size == (1500, 1125) and decoded.reduction == 4 and decoded.source_size == (6000, 4500)
    assert any("1/4" in note and "6000 x 4500" in note for note in decoded.notes)
    assert run_with_capture(tiny, decoded.image).input_image.shape == (224, 224, 3)


# ---------------------------------------------------------------------------------- large JPEGs: reduced decode


@pytest.mark.parametrize("size, min_side, expected", [
    ((4032, 3024), 1024, (2016, 1512)),  # a 12 MP phone photo: 1/4 would leave 756 < 1024
    ((3024, 4032), 1024, (1512, 2016)),  # portrait: the same scale
    ((8000, 6000), 1024, (2000, 1500)),  # 48 MP: 1/4
    ((8000, 6000), 256, (1000, 750)),  # 1/8, libjpeg's smallest
    ((2000, 1500), 1024, (2000, 1500)),  # 1/2 would be 750 < 1024: full size
    ((4032, 3024), 0, (4032, 3024)),  # 0: full size
])
def test_large_jpegs_decode_at_the_smallest_scale_that_keeps_min_side(size, min_side, expected):
    from vit_core.images import draft_size

    asked = draft_size(size, min_side)
    data = encoded(Image.new("RGB", size, (90, 140, 200)), "JPEG", quality=70)  # encoded once, up to 48 MP
    im = Image.open(io.BytesIO(data))
    if asked is not None:
        im.draft(None, asked)
    assert im.size == expected
    assert min(expected) >= min(min_side, min(size))
    decoded = decode_image(data, min_side=min_side)
    assert decoded.image.size == expected and decoded.reduction == size[0] // expected[0]


def test_a_reduced_decode_is_deterministic_and_close_to_the_full_one(tiny):
    """The same bytes give the same pixels every time (sessions and the load test's reference agree), and the
    model's crop from the reduced decode is close to the crop from the full-size one (it is a downscale either way)."""
    rng = np.random.default_rng(3)
    small = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    photo = encoded(Image.fromarray(small).resize((4032, 3024), Image.BICUBIC), "JPEG", quality=90)
    first, second = decode_image(photo), decode_image(photo)
    assert first.reduction == 4 and np.array_equal(np.asarray(first.image), np.asarray(second.image))
    reduced = run_with_capture(tiny, first.image).input_image.astype(int)
    full = run_with_capture(tiny, decode_image(photo, min_side=0).image).input_image.astype(int)
    assert np.abs(reduced - full).mean() < 2.0


def test_exif_rotated_large_jpeg_is_reduced_and_turned_upright():
    im = np.zeros((2400, 4000, 3), dtype=np.uint8)
    im[:, :2000] = (255, 0, 0)  # stored landscape, left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    decoded = decode_image(encoded(Image.fromarray(im), "JPEG", exif=exif, quality=90))
    assert decoded.reduction == 2 and decoded.image.size == (1200, 2000)  # upright portrait, at 1/2
    pixels = np.asarray(decoded.image)
    assert pixels[100, 600, 0] > 200 and pixels[1900, 600, 0] < 50  # red is the top half


def test_pixel_decodes_at_once_are_limited(monkeypatch):
    """However many sessions upload at the same moment, at most MAX_CONCURRENT_DECODES pictures are
    decoded at once (each holds its full picture in memory)."""
    import threading

    from vit_core import images
    from vit_core.images import decoding

    monkeypatch.setattr(images, "_decode_slots", threading.BoundedSemaphore(2))
    busy, peak, lock, release = [0], [0], threading.Lock(), threading.Event()
    real_decode = decoding.decode_in_worker

    def slow_decode(data, min_side):
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        release.wait(0.2)  # keep the slot a moment, so that the other threads pile up behind it
        try:
            return real_decode(data, min_side)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(decoding, "decode_in_worker", slow_decode)
    data = encoded(solid((1, 2, 3)), "PNG")
    threads = [threading.Thread(target=decode_image, args=(data,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


def test_the_decode_limit_follows_the_cpus_this_process_may_use():
    import os

    from vit_core import images

    assert images.MAX_CONCURRENT_DECODES == len(os.sched_getaffinity(0))


_PEAK_OF_A_16_BIT_DECODE = """
import resource, sys
from vit_core import decode_image
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
image = decode_image(data).image
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(image.size[0], image.size[1], (after - before) * 1024)
"""


def test_a_big_16_bit_png_decodes_in_bounded_memory(tmp_path):
    """A 24 MP 16-bit PNG, decoded in a child process: its peak memory is the file's 16-bit pixels (2 bytes a
    pixel), the 8-bit grey (1), the RGB result (Pillow keeps 4) and a band: about 7 bytes a pixel. A float64
    copy alone was 8 more; a copy of the 16-bit pixels (exif_transpose of an upright image) 2 more."""
    import subprocess
    import sys

    width, height = 6000, 4000
    ramp = (np.arange(width, dtype=np.uint32) * 65535 // (width - 1)).astype(np.uint16)
    path = tmp_path / "scan16.png"
    Image.fromarray(np.broadcast_to(ramp, (height, width)).copy()).save(path, compress_level=1)
    out = subprocess.run([sys.executable, "-c", _PEAK_OF_A_16_BIT_DECODE, str(path)], capture_output=True, text=True,
                         check=True, timeout=COMMAND_TIMEOUT).stdout.split()
    w, h, grown = (int(v) for v in out)
    assert (w, h) == (width, height)
    pixels = width * height
    assert grown < 8 * pixels, f"{grown / pixels:.1f} bytes a pixel at the peak"


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "TIFF"])
def test_other_formats(fmt):
    decoded = decode_image(encoded(solid((0, 128, 255)), fmt, **({"lossless": True} if fmt == "WEBP" else {})))
    assert tuple(np.asarray(decoded.image)[0, 0]) == (0, 128, 255)
    assert decoded.source_format == fmt


def test_a_model_with_a_large_input_gets_a_large_jpeg_decoded_no_smaller_than_its_resize():
    """The reduced JPEG decode keeps the shorter side at least what the model resizes it to, so no model's
    input is upsampled from a draft: 640 px for the usual 224-384 inputs, the model's resize above that."""
    from vit_core import load_model
    from vit_core.images import DRAFT_MIN_SIDE

    usual = load_model("vit_tiny_patch16_224", pretrained=False, depth=1)
    large = load_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=896)
    assert usual.decode_min_side == DRAFT_MIN_SIDE
    assert large.decode_min_side >= 896 > DRAFT_MIN_SIDE
    photo = encoded(Image.new("RGB", (4032, 3024), (90, 140, 200)), "JPEG", quality=70)
    assert decode_image(photo, usual.decode_min_side).image.size == (1008, 756)  # 1/4
    assert decode_image(photo, large.decode_min_side).image.size == (2016, 1512)  # 1/2: 756 would be < 896
