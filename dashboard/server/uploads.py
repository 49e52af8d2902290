"""Uploaded weights and label files, stored on disk under their digest, the oldest pruned. No Streamlit here.

The model cache keys on the digest (`ModelRequest.weights_id`) and loads from the stored path.
Files are shared by every session; `dashboard.session.save_upload` remembers per session which upload
went where, so a file is hashed and written once per upload, not on every rerun.

The folder is this server process's own (`tempfile.mkdtemp`: mode 0700, a fresh random name), not a
fixed name under /tmp: files there are trusted by their name (the digest), so no other OS user may
read them or plant one. It is removed when the process exits.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_logger = logging.getLogger(__name__)

UPLOADS_DISK_MB = 4096  # saved weights uploads on disk, all sessions together: the oldest go first
STALE_PART_S = 600.0  # a `.part` file this old was left by a write that died (a write takes seconds)

_folder: Path | None = None
_folder_lock = threading.Lock()


def uploads_folder() -> Path:
    """This process's private folder for saved uploads (created on first use, removed at exit)."""
    global _folder
    with _folder_lock:
        if _folder is None or not _folder.is_dir():
            _folder = Path(tempfile.mkdtemp(prefix="vit_lens_uploads_"))
            atexit.register(shutil.rmtree, _folder, ignore_errors=True)
        return _folder


def store(data: bytes, suffix: str, folder: Path | None = None) -> tuple[str, str]:
    """Write `data` as `<digest><suffix>` (once; then prune the oldest others): (path, sha256 hex digest).

    Hashing a few hundred MB costs about a second.
    """
    folder = folder or uploads_folder()
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest[:32]}{suffix.lower()}"
    if not path.exists():  # written whole, then renamed: another session never reads half a file
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as part:
            try:
                part.write(data)
                part.close()
                os.replace(part.name, path)
            except BaseException:  # a full disk, an interrupted rerun: no half-written .part stays behind
                Path(part.name).unlink(missing_ok=True)
                raise
        prune(folder, keep=path)
    return str(path), digest


def prune(folder: Path, keep: Path, max_bytes: int = UPLOADS_DISK_MB * 2**20) -> None:
    """Delete the oldest saved uploads beyond `max_bytes` (a class uploading weights must not fill the disk).

    A model already loaded from a deleted file stays in the cache, and a session that still holds
    the upload writes the file again on its next run (dashboard.session.save_upload).
    """
    try:
        now = time.time()
        for part in folder.glob("*.part"):  # left by a process killed mid-write
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink(missing_ok=True)
        files = sorted((f for f in folder.iterdir() if f.is_file() and f != keep and f.suffix != ".part"),
                       key=lambda f: f.stat().st_mtime)
        total = keep.stat().st_size + sum(f.stat().st_size for f in files)
        for f in files:
            if total <= max_bytes:
                break
            total -= f.stat().st_size
            f.unlink(missing_ok=True)
    except OSError as e:  # another session pruning at the same time: harmless
        _logger.debug("pruning uploads: %s", e)


# -- What the server takes in, before any script has looked at it.
#
# Streamlit keeps every file a browser PUTs in memory, by session, until that session ends, whether or not a script
# ever reads it, and checks a PUT only against one server-wide size (server.maxUploadSize), not against the cap the
# page states for the widget it came from. The limits below (their numbers made by dashboard.upload_limits, above
# this wing) are enforced at the PUT by streamlit_internals' bounded upload manager, installed by
# process.prepare_process: each file by what its name says it is, each session and the whole server by bytes held.

UPLOADS_TOTAL_SHARE = 8  # all sessions' held uploads together: an eighth of the memory (the captures get a quarter)
MIN_UPLOADS_TOTAL_MB, MAX_UPLOADS_TOTAL_MB = 512, 4096


@dataclass(frozen=True)
class UploadLimits:
    """The upload limits one server enforces, in bytes; `server_mb` is the server-wide cap on one PUT's body."""

    image_bytes: int
    zip_bytes: int
    labels_bytes: int
    weights_bytes: int  # 0: weights uploads are off, and a weights file is refused
    session_bytes: int
    total_bytes: int
    server_mb: int
    image_suffixes: tuple[str, ...] = ()  # ".png", ...: what the image uploaders take, where a weights suffix could be

    def file_cap(self, name: str) -> int:
        """The largest file called `name` that some uploader of the app takes (by its suffix, as the uploaders
        accept files by their names' suffixes: a file no uploader takes gets the image cap, the smallest but one)."""
        from vit_core.loading.weights import WEIGHT_SUFFIXES

        suffix = Path(name).suffix.lower()
        if suffix == ".zip":
            return self.zip_bytes
        if suffix in (".txt", ".json"):
            return self.labels_bytes
        if suffix in WEIGHT_SUFFIXES and suffix not in self.image_suffixes:
            return self.weights_bytes
        return self.image_bytes
