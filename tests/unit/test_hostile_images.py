"""Hostile images (tools/hostile/images.py): each refused or decoded within a bounded time and
memory, and whatever Pillow raises on them reaches the caller as one ImageError."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import COMMAND_TIMEOUT, REPO, encoded
from tools.hostile import images as hostile
from vit_core import ImageError, decode_image, run_with_capture
from vit_core.dataset import DecodedImages


def test_a_picture_the_models_resize_would_enlarge_past_the_cap_is_refused_by_its_crop(tiny):
    """Finding 1: 10,000 x 10 is within the decode's limits, but the model's resize would make 248,000 x 248
    (61 MP): refused before the resize, in every path through the crop."""
    picture = decode_image(hostile.gray_png(10_000, 10)).image
    assert tiny.crop_transform.resized_size(picture.size) == (248_000, 248)
    with pytest.raises(ImageError, match="10000 x 10 pixels: the model would enlarge it to 248000 x 248"):
        run_with_capture(tiny, picture)
    items = DecodedImages([("wide.png", hostile.gray_png(10_000, 10))], tiny.crop_transform, tiny.tensor_transform)
    index, reason = items[0]
    assert index == 0 and "enlarge it to" in reason


@pytest.mark.parametrize("data", [hostile.gray_png(400_000, 10), hostile.png_header_only(1, 49_000_000)],
                         ids=["400000x10", "1x49000000"])
def test_extreme_aspect_ratios_are_refused_before_their_pixels_are_decoded(data):
    started = time.perf_counter()
    with pytest.raises(ImageError, match="crop it closer to a square"):
        decode_image(data)
    assert time.perf_counter() - started < 10  # loosely: a worker's start and the header


def test_the_resized_size_is_timms():
    from vit_core import load_model

    loaded = load_model("vit_tiny_patch16_224", pretrained=False, depth=1)
    resize = loaded.crop_transform.crop.transforms[0]
    for size in [(400, 300), (300, 400), (401, 299), (5000, 10), (7, 3)]:
        assert loaded.crop_transform.resized_size(size) == resize(Image.new("L", size)).size


def _no_decoding(monkeypatch) -> None:
    """Refused from the bytes alone: no decode worker (Pillow) gets the file. Observed, not timed: a busy machine's
    clock would say nothing about where the refusal came from."""
    from vit_core.images import decoding

    def decoded(*args, **kwargs):
        raise AssertionError("the file reached a decode worker")

    monkeypatch.setattr(decoding, "decode_in_worker", decoded)


def test_a_progressive_jpeg_of_thousands_of_scans_is_refused_from_its_markers(monkeypatch):
    """Finding 2: 3,000 scans (before: decoded, 6 ms a scan on a large picture; 25-76 s for the attacker's)."""
    data = hostile.many_scan_jpeg(3000)
    _no_decoding(monkeypatch)
    with pytest.raises(ImageError, match="more than 100 progressive scans"):
        decode_image(data)


def test_an_ordinary_progressive_jpeg_decodes():
    rng = np.random.default_rng(0)
    data = encoded(Image.fromarray(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)), "JPEG", progressive=True)
    assert decode_image(data).image.size == (96, 64)


def _entropy_end_by_regex(data: bytes, start: int) -> int | None:
    """vit_core.images._entropy_end as it was, a regular expression's search: the reference the numpy walk must agree
    with (the start of the fill bytes before the marker, where numpy gives their last; the walk reads the same marker
    from either)."""
    import re

    found = re.compile(rb"\xff+[^\x00\xd0-\xd7\xff]").search(data, start)
    return None if found is None else found.start()


def _jpeg_like(rng: np.random.Generator) -> bytes:
    """Bytes in a JPEG's shape with its awkward cases: scans whose data holds stuffed 0xFF00 and restart markers, runs of
    fill bytes before a marker, scans longer than numpy's window (64 KiB) and across its edges, a scan that runs to the
    end of the file; one in ten scans holds a stray 0xFF before a byte of any value, as a damaged file would."""
    out = [b"\xff\xd8"]
    for _ in range(int(rng.integers(1, 12))):
        out.append(b"\xff\xc4\x00\x04\x01\x02")  # a DHT of 2 bytes
        out.append(b"\xff" * int(rng.integers(0, 3)) + b"\xff\xda\x00\x03\x01")  # SOS, maybe after fill bytes
        size = int(rng.choice([0, 1, 7, 1000, 65534, 65535, 65536, 70000, 140000]))
        scan = rng.integers(0, 255, size, dtype=np.uint8)  # no 0xFF but those put in below
        escapes = np.flatnonzero(rng.random(size) < 0.002)
        pieces, last = [], 0
        for at in escapes:
            pieces += [scan[last:at].tobytes(), b"\xff\x00" if rng.random() < 0.5 else bytes([0xFF, 0xD0 + at % 8])]
            last = at
        pieces.append(scan[last:].tobytes())
        if rng.random() < 0.1:
            pieces.insert(int(rng.integers(0, len(pieces) + 1)), bytes([0xFF, int(rng.integers(0, 256))]))
        out.append(b"".join(pieces))
        if rng.random() < 0.1:
            return b"".join(out)  # no end: the walk stops where the data does
    out.append(b"\xff" * int(rng.integers(1, 4)) + b"\xd9")
    return b"".join(out)


def test_the_jpeg_walk_skips_entropy_coded_data_as_the_regular_expression_did(monkeypatch):
    """The numpy walk (vit_core.images._entropy_end) finds the same scans and segments as the regular expression it
    replaced, on 200 JPEG-like byte strings, real JPEGs and the hostile ones."""
    from vit_core import images
    from vit_core.images import jpeg_scans_and_segments

    def by_regex(data: bytes) -> tuple[int, int]:
        with monkeypatch.context() as patched:
            patched.setattr(images, "_entropy_end", _entropy_end_by_regex)
            return jpeg_scans_and_segments(data)

    rng = np.random.default_rng(28)
    picture = Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8))
    real = [encoded(picture, "JPEG"), encoded(picture, "JPEG", progressive=True), hostile.many_scan_jpeg(3000),
            hostile.many_segment_jpeg(5000)]
    made = [_jpeg_like(rng) for _ in range(200)]
    for data in real + made:
        assert jpeg_scans_and_segments(data) == by_regex(data)
    assert jpeg_scans_and_segments(real[1])[0] > 1  # a progressive file: several scans, each skipped
    assert sum(jpeg_scans_and_segments(data)[0] > 5 for data in made) > 25  # walks past many scans (36 of 200)


def test_a_jpeg_of_many_empty_segments_is_refused_before_pillow_opens_it(monkeypatch):
    """Finding 5: 500,000 empty APP0 segments (2 MB; before: about 1 s in Image.open, 6.3 M took 14.7 s)."""
    _no_decoding(monkeypatch)
    with pytest.raises(ImageError, match="more than 2000 header segments"):
        decode_image(hostile.many_segment_jpeg(500_000))


def test_a_tiff_of_many_frames_is_counted_in_linear_time():
    """Finding 3: 40,000 frames (before: 30 s in Pillow's n_frames, outside the decode limit)."""
    data = hostile.many_frame_tiff(40_000)
    started = time.perf_counter()
    decoded = decode_image(data)
    assert time.perf_counter() - started < 15  # generous for a busy machine; the quadratic count took 30 s quiet
    assert decoded.image.size == (1, 1)
    assert any("more than 10000 frames" in note for note in decoded.notes)
    assert any("first of its 3 frames" in note for note in decode_image(hostile.many_frame_tiff(3)).notes)


@pytest.mark.parametrize("data", [hostile.damaged_second_frame_gif(), hostile.many_frame_tiff(2, damaged_last=True)],
                         ids=["gif", "tiff"])
def test_a_damaged_later_frame_leaves_the_first_one(data):
    """Finding 4: before, IndexError (GIF) and TypeError (TIFF) escaped from the frame count (now read over the
    bytes: the GIF's is found damaged, the TIFF's empty directory is counted; frame 0 is decoded either way)."""
    decoded = decode_image(data)
    assert decoded.image.size in ((8, 8), (1, 1))
    assert any("Animated file: using" in note for note in decoded.notes)


def test_anything_pillow_raises_is_an_image_error(monkeypatch):
    from vit_core import images

    def broken(*_args, **_kwargs):
        raise SyntaxError("bad tile")

    monkeypatch.setattr(images, "_pixels", broken)
    with pytest.raises(ImageError, match=r"damaged \(SyntaxError"):
        images.decode_here(encoded(Image.new("RGB", (4, 4)), "PNG"))


def test_a_worker_stopped_by_its_cpu_limit_is_an_image_error_and_is_replaced():
    """A worker killed by SIGXCPU (its CPU budget spent) in the middle of a file answers 'took too long'; a worker
    that ended while idle is replaced before the next file."""
    from vit_core.images import decoding

    small = encoded(Image.new("RGB", (8, 8), (1, 2, 3)), "PNG")
    worker = decoding._Worker()
    worker.process.send_signal(signal.SIGXCPU)
    worker.process.wait(10)
    with pytest.raises(ImageError, match="took too long to decode"):
        worker.decode(small, 0)
    decode_image(small)  # a worker is idle now
    with decoding._lock:
        idle = list(decoding._idle)
    for each in idle:
        each.process.kill()
        each.process.wait(10)
    assert tuple(np.asarray(decode_image(small).image)[0, 0]) == (1, 2, 3)


_PEAK = """
import resource, sys
from tools.hostile import images as hostile
from vit_core import ImageError, decode_image
from vit_core.images import decoding
data = hostile.{maker}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decode_image(data)
except ImageError:
    pass
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
workers = [open(f"/proc/{{w.process.pid}}/status").read() for w in decoding._idle]
peaks = [int(line.split()[1]) * 1024 for status in workers for line in status.splitlines() if line.startswith("VmHWM")]
print(grown, max(peaks, default=0))
"""


@pytest.mark.parametrize("maker", ["gray_png(400_000, 10)", "many_scan_jpeg(3000)", "many_segment_jpeg(500_000)",
                                   "many_frame_tiff(40_000)"])
def test_hostile_files_cost_little_memory(maker):
    """Peak memory of the process (its growth: a child's peak starts at its parent's) and of its decode worker,
    each well under a GB (before: 9.8 GB for 400,000 x 10 through the model's resize)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _PEAK.format(maker=maker)], capture_output=True, text=True,
                         check=True, timeout=COMMAND_TIMEOUT, env=env).stdout.split()
    grown, worker = (int(v) for v in out)
    assert grown < 300 * 2**20 and worker < 300 * 2**20, f"+{grown / 2**20:.0f} MB, worker {worker / 2**20:.0f} MB"


def test_a_workers_cpu_limit_moves_only_its_soft_limit_so_a_server_that_is_not_root_can_set_it_per_file():
    import resource

    from vit_core.images import decoding

    budget = decoding.DECODE_CPU_SECONDS
    assert decoding.cpu_limits(0.2, resource.RLIM_INFINITY) == (budget + 1, resource.RLIM_INFINITY)
    assert decoding.cpu_limits(30.7, resource.RLIM_INFINITY) == (30 + budget + 1, resource.RLIM_INFINITY)
    assert decoding.cpu_limits(30.7, 20) == (20, 20)  # never above a hard limit someone else set
