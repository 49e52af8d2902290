"""What each hostile input (tools/hostile) costs a ViT Lens tree: the outcome, the wall time and the peak memory.

    .venv/bin/python -m tools.benchmarks.hostile_uploads                      # this tree
    .venv/bin/python -m tools.benchmarks.hostile_uploads --tree /tmp/old      # another checkout (say, before a fix)
    .venv/bin/python -m tools.benchmarks.hostile_uploads --cases scans,aspect  # some of them

Every file is made here, by the generators the tests use too (tools/hostile/), so both trees get the same
bytes; each case then runs in a fresh process with the chosen tree first on its path, doing what a user's path
does with the file (the CLI's decode and capture of a tiny random ViT, load_model with a weights or label file,
the Many images page's zip check, the canvas's check, `vit-lens analyze` on a FIFO). A case is stopped after
--timeout seconds, and its process may take at most --memory-gb of address space (so that an unbounded case
fails with MemoryError rather than taking the machine). Each case's time and memory are its own: measured in that
process after torch and timm are imported, the growth of its peak RSS (decode workers are held to their own
limit, vit_core.images.decoding; a CLI case's figures are those of the `vit-lens analyze` process it waits for, whose
time includes its imports). Results: docs/performance/2026-11-25.md, "Hostile uploads".
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_DECODE = """
from vit_core import load_image, load_model, run_with_capture
loaded = load_model("vit_tiny_patch16_224", pretrained=False, depth=2)
cap = run_with_capture(loaded, load_image(PATH, loaded.decode_min_side))
OUTCOME = f"analysed ({cap.logits.shape[0]} classes)"
"""
_WEIGHTS = """
from vit_core import load_model
load_model("vit_tiny_patch16_224", weights=PATH, depth=2)
OUTCOME = "loaded"
"""
_LABELS = """
from vit_core import load_model
load_model("vit_tiny_patch16_224", pretrained=False, labels=PATH, depth=2)
OUTCOME = "loaded"
"""
_TAG = """
from vit_core import load_model
load_model("vit_base_patch16_224.x", pretrained=False)
OUTCOME = "loaded"
"""
_ZIP = """
try:
    from dashboard.image_sets import zip_members
except ImportError:  # the page's module before the house restructure
    from dashboard.many_images import zip_members
members = zip_members("set.zip", open(PATH, "rb").read())
OUTCOME = f"accepted ({len(members)} members)"
"""
_CANVAS = """
import base64, io
url = open(PATH).read()
try:
    from dashboard.draw import canvas_png
except ImportError:  # before: the canvas package opened the data URL with a bare Image.open
    from PIL import Image
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    image.load()
    OUTCOME = f"decoded by Pillow ({image.format}, {image.size[0]} x {image.size[1]})"
else:
    canvas_png(url)
    OUTCOME = "accepted"
"""
_CLI = """
import resource, subprocess, sys
MODEL = ["--model", "vit_tiny_patch16_224", "--random-init"]
run = subprocess.run([sys.executable, "-m", "vit_core", "analyze", PATH, *MODEL, "--out", OUT_DIR],
                     capture_output=True, text=True, timeout=25)
cli_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024  # the CLI's own peak
OUTCOME = f"exit {run.returncode} (CLI peak {cli_peak} MB): " + (run.stderr.strip().splitlines() or [""])[-1][:160]
"""
_SYMLINK_OUT = """
import os, subprocess, sys
MODEL = ["--model", "vit_tiny_patch16_224", "--random-init"]
run = subprocess.run([sys.executable, "-m", "vit_core", "analyze", PATH, *MODEL, "--out", OUT_DIR],
                     capture_output=True, text=True, timeout=25)
OUTCOME = (f"exit {run.returncode}, {len(os.listdir(os.path.realpath(OUT_DIR)))} files where the link points: "
           + (run.stderr.strip().splitlines() or [""])[-1][:120])
"""


# Around each case: the heavy imports first (torch, timm: seconds and most of a process's memory), then the case,
# timed and its peak-RSS growth measured; an exception is an outcome like any other.
_AROUND = """
import resource, time, traceback
import numpy, torch, timm, PIL.Image, vit_core.loading, vit_core.capture
PATH = {path!r}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    exec(compile({code!r}, "case", "exec"))
    outcome = OUTCOME
except Exception as e:
    outcome = f"{{type(e).__name__}}: {{str(e)[:220]}}"
seconds = time.perf_counter() - started
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print("measured", f"{{seconds:.2f}}", f"{{grown:.0f}}", " ".join(outcome.split()))
"""


def _cases(scratch: Path) -> dict[str, tuple[str, Path]]:
    """Case name -> (the code a fresh process runs on PATH, the file), every file made now."""
    from tools.hostile import archives as hostile_archives
    from tools.hostile import canvas as hostile_canvas
    from tools.hostile import images as hostile_images

    def write(name: str, data: bytes | str) -> Path:
        path = scratch / name
        (path.write_text if isinstance(data, str) else path.write_bytes)(data)
        return path

    fifo = scratch / "fifo.png"
    os.mkfifo(fifo)
    link = scratch / "out-link"
    (scratch / "elsewhere").mkdir()
    link.symlink_to(scratch / "elsewhere")
    return {
        "aspect": (_DECODE, write("wide.png", hostile_images.gray_png(40_000, 10))),
        "one-by-49M": (_DECODE, write("tall.png", hostile_images.png_header_only(1, 49_000_000))),
        "scans": (_DECODE, write("scans.jpg", hostile_images.many_scan_jpeg(2_000, (2048, 1536)))),
        "segments": (_DECODE, write("segments.jpg", hostile_images.many_segment_jpeg(1_000_000))),
        "tiff-frames": (_DECODE, write("frames.tif", hostile_images.many_frame_tiff(20_000))),
        "gif-damaged": (_DECODE, write("damaged.gif", hostile_images.damaged_second_frame_gif())),
        "header-nested": (_WEIGHTS, write("nested.safetensors", hostile_archives.nested_header(100_000))),
        "header-1e400": (_WEIGHTS, write("huge.safetensors", hostile_archives.overflowing_shape())),
        "header-99MB": (_WEIGHTS, hostile_archives.sparse_safetensors(scratch / "long.safetensors", 99_000_000)),
        "labels-nested": (_LABELS, write("labels.json", hostile_archives.nested_labels(100_000))),
        "tag": (_TAG, write("none", b"")),
        "zip-500k": (_ZIP, write("set.zip", hostile_archives.zip_of_many_entries(500_000))),
        "canvas-fits": (_CANVAS, write("fits.url", hostile_canvas.data_url(hostile_canvas.fits_file(), "image/png"))),
        "canvas-169MP": (_CANVAS, write("huge.url", hostile_canvas.data_url(hostile_canvas.huge_png()))),
        "cli-fifo": (_CLI.replace("OUT_DIR", repr(str(scratch / "out"))), fifo),
        "cli-dev-zero": (_CLI.replace("OUT_DIR", repr(str(scratch / "out"))), Path("/dev/zero")),
        "cli-symlink-out": (_SYMLINK_OUT.replace("OUT_DIR", repr(str(link))),
                            write("small.png", hostile_images.gray_png(64, 48))),
    }


def run_case(code: str, path: Path, tree: Path, timeout: float, memory_gb: float) -> tuple[str, float, float]:
    """(outcome, seconds, growth of peak RSS in MB) of `code` on `path` in a fresh process of `tree`, after its imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1"}
    limit = int(memory_gb * 2**30)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _AROUND.format(path=str(path), code=code)], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limited)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"still running after {timeout:.0f} s (stopped)", time.perf_counter() - started, float("nan")
    lines = out.strip().splitlines()
    if proc.returncode == 0 and lines and lines[-1].startswith("measured "):  # the case's own time and memory growth
        _, seconds, grown, outcome = lines[-1].split(" ", 3)
        return outcome, float(seconds), float(grown)
    last = (err.strip().splitlines() or ["?"])[-1]
    return f"died: {last[:200]}", time.perf_counter() - started, float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the ViT Lens checkout to measure (default: this one)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a case may take")
    parser.add_argument("--memory-gb", type=float, default=6.0, help="address space a case's process may take")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vit-lens-hostile-") as scratch:
        cases = _cases(Path(scratch))
        chosen = args.cases.split(",") if args.cases else list(cases)
        print(f"tree: {args.tree.resolve()}")
        for name in chosen:
            code, path = cases[name]
            outcome, seconds, grown = run_case(code, path, args.tree, args.timeout, args.memory_gb)
            print(f"{name:16s} {seconds:6.2f} s  +{grown:6.0f} MB  {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
