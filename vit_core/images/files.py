"""Reading the CLI's inputs within bounds, and writing its result files so that a reader never sees half of one.

`read_input` reads a regular file of at most a given size: a FIFO would block the read forever, a device
(`/dev/zero`) never end it, so anything else is refused from its `stat` before a byte is read.

`OutputFolder.write` writes to a temporary file in the output folder, flushes it to the disk (fsync) and
only then renames it over the final name (`os.replace`, atomic on POSIX and Windows within one file
system). A crash, a full disk or a kill at any moment leaves either the previous file or the new one under
the final name, never a truncated .npz that `np.load` would choke on. The temporary file is named
`.<name>.<random>.part` and removed when the write fails. The folder is opened once, refusing a symlink
(O_NOFOLLOW), and every write is relative to that open folder and never follows a symlink: a result lands
in the folder the user named, not where a link (the folder, or a name inside it) points.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from ..errors import ImageError

PART_SUFFIX = ".part"  # the temporary files' suffix, so that a leftover from a killed process is recognisable
# os.open(dir_fd=...) and os.replace(src_dir_fd=...) where the system has them (POSIX); elsewhere by path.
_AT_FOLDER = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY") and hasattr(os, "O_NOFOLLOW")


def read_input(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (a symlink to one is fine), at most `max_bytes`.
    Raises ImageError with one sentence for a folder, a FIFO, a device or a larger file, OSError if it can't be read."""
    path = Path(path)
    status = os.stat(path)  # before opening: opening a device can have effects of its own
    _check_input(status, max_bytes)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))  # a FIFO put here
    with os.fdopen(fd, "rb") as f:  # since the stat opens at once and fails the fstat instead of waiting for a writer
        _check_input(os.fstat(f.fileno()), max_bytes)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew since
        raise ImageError(f"larger than the {max_bytes:,} bytes an input may have, so it was skipped.")
    return data


def _check_input(status: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise ImageError("not a regular file (a folder, a FIFO or a device), so it was skipped.")
    if status.st_size > max_bytes:
        raise ImageError(f"{status.st_size:,} bytes, more than the {max_bytes:,} an input may have, so it was skipped.")


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


class OutputFolder:
    """The folder results are written into, opened once: `write(name, data)` puts one file in it atomically.

    Raises OSError naming the folder if it is a symlink (ELOOP) or not a folder. Close it (or use `with`)."""

    def __init__(self, path: str | Path, *, follow_symlink: bool = False) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        if not follow_symlink and self.path.is_symlink():  # said the same way where O_NOFOLLOW is missing
            raise OSError(errno.ELOOP, "is a symbolic link; name the folder it points to", str(self.path))
        if _AT_FOLDER:
            flags = os.O_RDONLY | os.O_DIRECTORY | (0 if follow_symlink else os.O_NOFOLLOW)
            self._fd = os.open(self.path, flags)  # from here on, the folder itself: a link put in its place later is not followed
        elif not self.path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(self.path))

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def write(self, name: str, data: bytes) -> Path:
        """Write `data` to the file `name` in this folder, all at once or not at all; returns its path.

        The new file gets the permissions a plain `open(path, "wb")` would give it. A symlink under `name` is
        replaced, never followed. Raises OSError naming the final path (the folder is read-only, the name is a
        folder, the disk is full, ...) after removing the temporary file; the previous file is then untouched."""
        return self.write_with(name, lambda out: out.write(data))

    def write_with(self, name: str, fill: Callable[[BinaryIO], object]) -> Path:
        """`write`, the file's bytes written by `fill(file)` (a seekable binary file at its start): a large file
        streamed into place, never whole in memory."""
        assert name and "/" not in name and os.sep not in name and name not in (".", ".."), name
        final = self.path / name
        temporary = f".{name}.{secrets.token_hex(4)}{PART_SUFFIX}"
        at = {"dir_fd": self._fd} if self._fd is not None else {}
        where = temporary if self._fd is not None else str(self.path / temporary)
        try:
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_BINARY", 0), 0o666, **at)  # 0o666 less the umask, as open(path, "wb")
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), str(final)) from e
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
                out.flush()
                if hasattr(os, "fchmod"):  # a umask set by another thread since: the same mode as a plain open
                    os.fchmod(out.fileno(), 0o666 & ~_process_umask())
                os.fsync(out.fileno())  # the bytes are on the disk before the name points at them
            if self._fd is not None:
                os.replace(temporary, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            else:
                os.replace(where, final)
        except OSError as e:  # named after the final path: the temporary name means nothing to the user
            self._unlink(temporary)
            raise OSError(e.errno, e.strerror or str(e), str(final)) from e  # errno picks the subclass
        except BaseException:
            self._unlink(temporary)
            raise
        self._fsync()
        return final

    def _unlink(self, temporary: str) -> None:
        try:
            if self._fd is not None:
                os.unlink(temporary, dir_fd=self._fd)
            else:
                os.unlink(self.path / temporary)
        except OSError:
            pass

    def _fsync(self) -> None:
        """Make the rename itself durable (POSIX); best effort: some systems can't sync a folder."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError:
                pass


def write_atomically(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` all at once or not at all (OutputFolder.write in `path`'s folder); returns the path."""
    path = Path(path)
    try:
        folder = OutputFolder(path.parent, follow_symlink=True)
    except OSError as e:  # the folder is missing or not one: said of the file
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    with folder:
        return folder.write(path.name, data)
