"""Uploaded weights and label files, stored on disk under their digest, the oldest pruned. No Streamlit here.

The model cache keys on the digest (`ModelRequest.weights_id`) and loads from the stored path.
Files are shared by every session; `dashboard.state.save_upload` remembers per session which upload
went where, so a file is hashed and written once per upload, not on every rerun.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

_logger = logging.getLogger(__name__)

UPLOADS_DISK_MB = 4096  # saved weights uploads on disk, all sessions together: the oldest go first


def uploads_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / "vit_lens_uploads"
    folder.mkdir(exist_ok=True)
    return folder


def store(data: bytes, suffix: str, folder: Path | None = None) -> tuple[str, str]:
    """Write `data` as `<digest><suffix>` (once; then prune the oldest others): (path, sha256 hex digest).

    Hashing a few hundred MB costs about a second.
    """
    folder = folder or uploads_folder()
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest[:32]}{suffix.lower()}"
    if not path.exists():  # written whole, then renamed: another session never reads half a file
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as part:
            part.write(data)
        os.replace(part.name, path)
        prune(folder, keep=path)
    return str(path), digest


def prune(folder: Path, keep: Path, max_bytes: int = UPLOADS_DISK_MB * 2**20) -> None:
    """Delete the oldest saved uploads beyond `max_bytes` (a class uploading weights must not fill the disk).

    A model already loaded from a deleted file stays in the cache, and a session that still holds
    the upload writes the file again on its next run (dashboard.state.save_upload).
    """
    try:
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
