"""The `.npz` export written without holding Python's GIL: for a server whose pages share the GIL with the exports.

The same bytes as `vit_core.export.npz_bytes` (both write through `export.write_npz`); only the copies differ.
"""

from __future__ import annotations

import io
import os
import tempfile
import threading

import numpy as np

from ..export import write_npz


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """`vit_core.export.npz_bytes(arrays)`, copied with the GIL released: written through this thread's scratch
    file (`_scratch_file`) and read back with os.pread."""
    file = _scratch_file()
    write_npz(file, arrays)
    return _read_whole(file.fileno(), file.tell())  # the file may go on past the end: an earlier, larger export


_scratch = threading.local()


def _scratch_file() -> io.FileIO:
    """This thread's scratch file for `npz_bytes`, at its start: unbuffered, in memory where the OS has memfd
    (Linux), else a temporary file; kept for the thread's next export, and closed when the thread ends.

    The dashboard makes a class's exports (29 MB each for ViT-B/16) on low-priority threads (dashboard.server.process)
    while students' pages run Python. Written into an `io.BytesIO`, every array was copied holding the GIL, and a
    low-priority thread preempted mid-copy kept every page waiting: in a 30-session load test `py-spy record --gil`
    found the export holding the GIL in a third of the samples (docs/performance.md, "Exports off the GIL").
    os.write and os.pread copy with the GIL released, and `_read_whole` makes the one `bytes` object Streamlit
    needs straight from the file. The file is kept because writing into a new one's fresh pages made an export 4x slower."""
    file = getattr(_scratch, "file", None)
    if file is None:
        if hasattr(os, "memfd_create"):
            file = open(os.memfd_create("vit-lens-npz", os.MFD_CLOEXEC), "w+b", buffering=0)
        else:
            file = tempfile.TemporaryFile(buffering=0)
        _scratch.file = file
    file.seek(0)
    return file


def _read_whole(fd: int, size: int) -> bytes:
    """The first `size` bytes of the file `fd`, read with the GIL released (os.pread reads into a new bytes object)."""
    data = os.pread(fd, size, 0)
    if len(data) == size:
        return data
    parts = [data]  # one read returns at most about 2 GiB on Linux
    while (done := sum(map(len, parts))) < size:
        if not (part := os.pread(fd, size - done, done)):
            raise OSError(f"the scratch file ended at {done} of {size} bytes")
        parts.append(part)
    return b"".join(parts)
