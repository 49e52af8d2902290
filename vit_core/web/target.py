"""Where `export-web` may write, and how a lesson replaces the one before it. Standard library only: the command
checks its --out before torch is imported.

A site is written whole into a new folder beside the target (`.NAME.export-PID`), then swapped in by two renames:
the old site (if any) moves aside, the new one takes its name, the old one is deleted. Until the swap the target is
untouched, so a failure (a full disk, a graph that doesn't check, Ctrl-C) leaves the old lesson whole. A target is
replaced only if it is empty or a previous export wrote it (MARKER in it); any other folder, and any folder inside
the checkout's own web/ (the page's sources), is refused in one sentence.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"  # the checkout's web/: the page, and npm's node_modules
MARKER = ".vit-lens-lesson"  # written last into every site: "a previous export wrote this folder"
MARKER_TEXT = "A static lesson written by `vit-lens export-web`; a later export may replace this folder.\n"


def target_refused(out: Path, web_root: Path) -> str | None:
    """Why `out` can't receive a site (one sentence, without the path), or None: a folder inside `web_root` (the
    checkout's web/), a link, a file, or a non-empty folder that no export wrote."""
    resolved = out.resolve()
    if resolved == web_root.resolve() or resolved.is_relative_to(web_root.resolve()):
        return "it is inside the checkout's web/ folder (the page's own sources); write the lesson elsewhere."
    if out.is_symlink():
        return "it is a symbolic link; give the folder itself."
    if out.exists() and not out.is_dir():
        return "it is a file, not a folder."
    try:
        if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
            return (f"it is a folder that export-web did not write (no {MARKER} in it), so nothing in it is replaced; "
                    "give a new or empty folder.")
    except OSError as e:
        return f"it can't be read ({(e.strerror or str(e)).lower()})."
    return None


def staging_folder(out: Path) -> Path:
    """The new, empty folder beside `out` that a site is written into before it is swapped in."""
    staging = out.parent / f".{out.name}.export-{os.getpid()}"
    if staging.exists():  # a killed export of this process id's: never anyone's lesson
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def written_then_swapped(out: Path, write: Callable[[Path], None]) -> None:
    """`write(folder)` into a staging folder beside `out`, MARKER added, then swapped in for `out`. On any failure
    the staging folder is removed and `out` is as it was."""
    staging = staging_folder(out)
    try:
        write(staging)
        (staging / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def swap_in(staging: Path, out: Path) -> None:
    """`staging` renamed to `out`; a site (or empty folder) at `out` moved aside first and deleted after, or put
    back if the second rename fails."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if old.exists():
        shutil.rmtree(old)
    out.rename(old)
    try:
        staging.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
