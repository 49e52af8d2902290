"""A folder's files: the images a run analyses and every other file with the reason it is skipped.

A folder's files are listed sorted by path: the images (a suffix of images.UPLOAD_EXTENSIONS) in that order, and every
other file with its reason (a `notes.txt`, a phone's `.heic` photo), never dropped without a word; so is an entry that
can't be read as a file (a broken link, a FIFO, a folder named like an image). No torch here: the command line lists a
folder before it imports the model's packages, so an empty folder is answered at once (vit_core.dataset.listing cuts the
list into shards and reads labels).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from . import UPLOAD_EXTENSIONS

# Photo formats that cameras and phones write and that ViT Lens can't decode: named in the skip reason.
_UNREADABLE_PHOTOS = {"heic": "HEIC", "heif": "HEIF", "avif": "AVIF", "dng": "DNG (raw)", "cr2": "CR2 (raw)",
                      "nef": "NEF (raw)", "arw": "ARW (raw)"}


def _visible_entries(folder: Path) -> list[tuple[Path, str | None]]:
    """Every visible entry under `folder` (recursively; hidden files and folders, ".name", left out), sorted by path,
    each with None where it is a file that can be read, else why it can't: a broken link, a FIFO or a folder named
    like an image would otherwise vanish from the listing without a word. Plain folders are walked, not listed, except
    one that can't be read (its files would vanish as silently)."""
    entries = []
    for path in sorted(folder.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        try:
            mode = path.stat().st_mode  # follows a link: its target is what would be read
        except OSError as e:
            if path.is_symlink():
                entries.append((path, "A link whose target can't be reached (a broken link); nothing to read."))
            else:
                entries.append((path, f"It can't be read ({e.strerror or e})."))
            continue
        if stat.S_ISREG(mode):
            entries.append((path, None))
        elif stat.S_ISDIR(mode):
            if is_image_path(path) or path.is_symlink():  # a link to a folder is not followed
                what = "A link to a folder" if path.is_symlink() else "A folder"
                entries.append((path, f"{what}, not an image file; ViT Lens reads regular files only."))
            else:
                why = _unlistable(path)
                if why:
                    entries.append((path, why))
        else:
            entries.append((path, "Not a regular file (a FIFO, socket or device); ViT Lens reads regular files only."))
    return entries


def _unlistable(folder: Path) -> str | None:
    """Why the files in `folder` can't be listed (one sentence), or None: rglob leaves such a folder out silently."""
    try:
        with os.scandir(folder):
            return None
    except OSError as e:
        return f"A folder that can't be read ({e.strerror or e}); the files in it are left out."


def _visible_files(folder: Path) -> list[Path]:
    """Every regular file under `folder` (recursively), hidden files and folders (".name") left out, sorted by path."""
    return [path for path, unreadable in _visible_entries(folder) if unreadable is None]


def is_image_path(path: str | Path) -> bool:
    """A file name ViT Lens tries to decode: its suffix is one of images.UPLOAD_EXTENSIONS, any case."""
    return PurePosixPath(str(path)).suffix.lower().lstrip(".") in UPLOAD_EXTENSIONS


def list_images(folder: Path) -> list[Path]:
    """Every file under `folder` (recursively) whose suffix is one of the image formats ViT Lens reads
    (images.UPLOAD_EXTENSIONS, any case), sorted by path. Hidden files and folders (".name") are left out."""
    return [path for path in _visible_files(Path(folder)) if is_image_path(path)]


def not_image_reason(path: str | Path) -> str:
    """Why a listed file that is not an image is skipped: one sentence for the user."""
    suffix = PurePosixPath(str(path)).suffix.lower().lstrip(".")
    if suffix in _UNREADABLE_PHOTOS:
        return (f"A {_UNREADABLE_PHOTOS[suffix]} photo, which ViT Lens can't read: convert it to JPEG or PNG "
                "(or set the camera to save JPEG).")
    what = f"a .{suffix} file" if suffix else "a file without a suffix"
    return f"Not an image ({what}); ViT Lens reads {', '.join(UPLOAD_EXTENSIONS)}."


def list_not_images(folder: Path) -> list[tuple[Path, str]]:
    """Every other visible file under `folder` (what `list_images` leaves out), sorted, with the reason it is skipped;
    entries that can't be read as files (a broken link, a FIFO, a folder named like an image) too."""
    return [(path, unreadable or not_image_reason(path)) for path, unreadable in _visible_entries(Path(folder))
            if unreadable is not None or not is_image_path(path)]


def has_images(folder: Path, at_least: int = 1) -> bool:
    """Whether `folder` holds `at_least` image files that `list_images` would list; the walk stops as soon as it has
    found them, so a large folder costs a moment, not a listing."""
    found = 0
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]  # list_images leaves hidden ones out
        for name in files:
            if not name.startswith(".") and is_image_path(name) and os.path.isfile(os.path.join(root, name)):
                found += 1
                if found >= at_least:
                    return True
    return False
