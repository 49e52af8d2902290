"""Writing result files so that a reader never sees half of one.

`write_atomically` writes to a temporary file in the destination's folder, flushes it to the disk
(fsync) and only then renames it over the final name (`os.replace`, atomic on POSIX and Windows
within one file system). A crash, a full disk or a kill at any moment leaves either the previous
file or the new one under the final name, never a truncated .npz that `np.load` would choke on.
The temporary file is named `.<name>.<random>.part` and removed when the write fails.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PART_SUFFIX = ".part"  # the temporary files' suffix, so that a leftover from a killed process is recognisable


def _process_umask() -> int:
    """The process's umask, read without changing it where the system allows (os.umask sets it, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` all at once or not at all; returns the path.

    The new file gets the permissions a plain `open(path, "wb")` would give it (mkstemp makes 0600).
    Raises OSError naming `path` (the folder is missing or read-only, the name is a folder, the disk
    is full, ...) after removing the temporary file; the previous file under `path` is then untouched.
    """
    path = Path(path)
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PART_SUFFIX)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if hasattr(os, "fchmod"):  # POSIX (and Windows from Python 3.13)
                os.fchmod(out.fileno(), 0o666 & ~_process_umask())
            os.fsync(out.fileno())  # the bytes are on the disk before the name points at them
        os.replace(temporary, path)
    except OSError as e:  # named after the final path: the temporary name means nothing to the user
        Path(temporary).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e  # errno picks the subclass (IsADirectoryError, ...)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); best effort: some systems can't open or sync a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
