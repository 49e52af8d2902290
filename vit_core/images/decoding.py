"""Image decodes in worker processes limited in CPU time and memory: one file can't hold a decode slot for long.

A decoder's cost is not its file's size: a 390 KB progressive JPEG of thousands of scans took 25 s, and a format's
next trick will not be in `images.check_header`'s list. So every file's pixels are decoded (`images.decode_here`,
run by `vit_core.images.decode_worker`) in a worker process that set `RLIMIT_AS` (`DECODE_MEMORY_BYTES`) when it started
and sets `RLIMIT_CPU` before each file to the CPU time it used so far plus `DECODE_CPU_SECONDS` (`cpu_limits`): past
that the kernel stops it (SIGXCPU), the caller gets an ImageError and the worker is replaced. The workers are plain
child processes (`python -m vit_core.images.decode_worker`, not multiprocessing: the server has threads, and DataLoader
workers, which are daemonic, may not have multiprocessing children), started on first use, one per decode in flight
(the slots are `images._decode_slots`), each reused for the next file. The reply is a small JSON header and the raw
RGB bytes, never a pickle: a worker that a file took over can't make the server run anything.

Cost per file: a pipe round trip of the file and its RGB pixels (docs/performance.md, "Photos and files";
tools/benchmarks/decode_workers.py).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from PIL import Image

from ..errors import ImageError

_logger = logging.getLogger(__name__)

# CPU seconds one file may take. The costliest legitimate files: a 50 MP PNG (MAX_PIXELS) decodes in about 1 s here,
# a 50 MP RGBA one with its compositing on white about 2 s; a 12 MP phone photo, drafted, in 0.05 s.
DECODE_CPU_SECONDS = 5
# Address space of a worker: the interpreter, numpy and Pillow (about 0.3 GB), and the largest legitimate picture's
# copies (a 50 MP RGBA PNG: Pillow's RGBA, the white background, the composite and the RGB result, 4 bytes a pixel
# each, then its 3-byte RGB bytes: about 1 GB).
DECODE_MEMORY_BYTES = 2 * 2**30
# Wall-clock seconds before a worker is stopped whatever its CPU time (a worker starved of CPU by a busy server
# is slow, not hostile: this is generous).
DECODE_WALL_SECONDS = 60

REQUEST = struct.Struct("<QI")  # the wire format, both sides: file length, min_side; then the file
REPLY = struct.Struct("<I")  # JSON header length; then width * height * 3 bytes of RGB when ok


Decoded = tuple[Image.Image, str, tuple[int, int], tuple[str, ...], int]  # image, format, source size, notes, reduction


class _WorkerGone(Exception):
    """The worker process ended or stopped answering in the middle of a file."""


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise _WorkerGone
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Worker:
    """One decode worker process and its pipes."""

    def __init__(self) -> None:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "vit_core.images.decode_worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, close_fds=True)

    def decode(self, data: bytes, min_side: int) -> Decoded:
        try:
            self.process.stdin.write(REQUEST.pack(len(data), min_side) + data)
            self.process.stdin.flush()
            deadline = time.monotonic() + DECODE_WALL_SECONDS
            fd = self.process.stdout.fileno()
            header = json.loads(_read_exactly(fd, REPLY.unpack(_read_exactly(fd, REPLY.size, deadline))[0], deadline))
            if not header["ok"]:
                if header.get("restart"):  # out of memory: its heap may be in pieces
                    self.stop()
                raise ImageError(header["message"])
            width, height = header["size"]
            pixels = _read_exactly(fd, width * height * 3, deadline)
        except (BrokenPipeError, _WorkerGone, TimeoutError) as e:
            self.stop()
            raise ImageError(self._why_it_stopped(e)) from None
        image = Image.frombytes("RGB", (width, height), pixels)
        return image, header["format"], tuple(header["source_size"]), tuple(header["notes"]), header["reduction"]

    def _why_it_stopped(self, error: Exception) -> str:
        code = self.process.returncode
        if isinstance(error, TimeoutError) or code in (-signal.SIGXCPU, -signal.SIGKILL):
            return "The image took too long to decode; save it again as an ordinary JPEG or PNG first."
        return "The image is too large to decode; downscale it first."

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_lock = threading.Lock()
_idle: list[_Worker] = []
_owner = os.getpid()  # a forked child (a DataLoader worker) starts its own workers: the pipes are its parent's


def decode_in_worker(data: bytes, min_side: int) -> Decoded:
    """The parts of `images.decode_here(data, min_side)` (image, format, source size, notes, reduction), decoded in a
    worker process, within DECODE_CPU_SECONDS of CPU time and
    DECODE_MEMORY_BYTES of memory; raises ImageError for anything wrong with the file, including its cost.
    The caller holds a decode slot (`images._decode_slots`): there are never more workers than slots."""
    global _owner
    with _lock:
        if os.getpid() != _owner:
            _idle.clear()
            _owner = os.getpid()
        worker = _idle.pop() if _idle else None
    if worker is not None and worker.process.poll() is not None:  # ended while idle (killed from outside)
        worker.stop()
        worker = None
    worker = worker or _Worker()
    try:
        decoded = worker.decode(data, min_side)
    except ImageError:
        if worker.process.poll() is None:  # a refusal: the worker is fine
            _give_back(worker)
        raise
    except BaseException:
        worker.stop()
        raise
    _give_back(worker)
    return decoded


def _give_back(worker: _Worker) -> None:
    with _lock:
        if os.getpid() == _owner:
            _idle.append(worker)


def cpu_limits(used: float, hard: int) -> tuple[int, int]:
    """(soft, hard) RLIMIT_CPU for a worker's next file, having used `used` CPU seconds: the kernel sends SIGXCPU
    (which ends the worker) once DECODE_CPU_SECONDS more are used. Only the soft limit moves: a process that is not
    root may lower its hard limit but never raise it again, so a hard limit moved per file would fail on the second."""
    soft = int(used + DECODE_CPU_SECONDS) + 1
    return (soft if hard == resource.RLIM_INFINITY else min(soft, hard)), hard
