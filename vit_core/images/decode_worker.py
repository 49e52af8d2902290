"""A decode worker process (`python -m vit_core.images.decode_worker`): decodes the files its parent (`vit_core.images.decoding`)
sends on stdin, one at a time, within the memory limit it sets at start and the CPU limit it sets before each file,
and answers each with a small JSON header and the raw RGB bytes (never a pickle)."""

from __future__ import annotations

import signal

# Ctrl-C reaches every process of the terminal's group: a worker ends when its parent closes the pipe (the parent's
# exit does), not with a KeyboardInterrupt's traceback of its own. Ignored before the imports, which take a while.
signal.signal(signal.SIGINT, signal.SIG_IGN)

import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

from ..errors import ImageError  # noqa: E402
from . import decode_here  # noqa: E402
from .decoding import DECODE_MEMORY_BYTES, REPLY, REQUEST, cpu_limits  # noqa: E402


def _cpu_seconds_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _reply(out, header: dict, pixels: bytes = b"") -> None:
    encoded = json.dumps(header).encode()
    out.write(REPLY.pack(len(encoded)) + encoded)
    out.write(pixels)
    out.flush()


def _serve() -> None:
    """Decode the files sent on stdin, one at a time, until stdin closes."""
    resource.setrlimit(resource.RLIMIT_AS, (DECODE_MEMORY_BYTES, DECODE_MEMORY_BYTES))
    source, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = source.read(REQUEST.size)
        if len(request) < REQUEST.size:
            return
        length, min_side = REQUEST.unpack(request)
        data = source.read(length)
        resource.setrlimit(resource.RLIMIT_CPU, cpu_limits(_cpu_seconds_used(), resource.getrlimit(resource.RLIMIT_CPU)[1]))
        try:
            decoded = decode_here(data, min_side)
        except ImageError as e:
            _reply(out, {"ok": False, "message": str(e)})
            continue
        except MemoryError:
            _reply(out, {"ok": False, "restart": True, "message": "The image is too large to decode; downscale it first."})
            return  # a fresh worker for the next file
        image = decoded.image
        _reply(out, {"ok": True, "size": image.size, "format": decoded.source_format,
                     "source_size": decoded.source_size, "notes": decoded.notes, "reduction": decoded.reduction},
               image.tobytes())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _serve()
