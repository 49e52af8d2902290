"""Finding a folder's images, their true labels, and cutting the list into shards.

A folder's files are listed once, sorted by path: the images (a suffix of images.UPLOAD_EXTENSIONS) in that order
are what a run analyses, and every other file is reported as skipped with its reason (a `notes.txt`, a phone's
`.heic` photo), never dropped without a word; so is an entry that can't be read as a file (a broken link, a FIFO, a
folder named like an image). Shard i of N is a contiguous slice of the sorted images, so any N
covers every image exactly once (no padding, as torch's DistributedSampler would add).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import ViTLensError
from ..images.listing import is_image_path as is_image_path  # re-exported: the dataset package's listing
from ..images.listing import list_images as list_images
from ..images.listing import list_not_images as list_not_images
from ..images.listing import not_image_reason as not_image_reason
from ..loading.model import LoadedModel

_SYNSET = re.compile(r"^n\d{8}$")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(ViTLensError, ValueError):
    """A `--shard I/N` that names no shard: one sentence."""


# ----------------------------------------------------------------------------------------------
# Files (listed by vit_core.images.listing, which the command line reads before torch is imported)


def relative_name(folder: Path, path: Path) -> str:
    """A file's name in the outputs: its path below FOLDER with '/' (the same on every machine that mounts FOLDER)."""
    return Path(path).relative_to(folder).as_posix()


def files_digest(folder: Path, paths: Sequence[Path]) -> str:
    """SHA-256 over the files' names below `folder` and their sizes: two runs over the same files agree, a file added,
    removed, renamed or rewritten to another size changes it (contents are not read: a folder can hold terabytes)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{relative_name(folder, path)}\0{Path(path).stat().st_size}\n".encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# Labels from folder names


def _class_names(loaded: LoadedModel) -> dict[str, int]:
    """Lower-case names -> class index: each label and its first comma-separated part, the first class
    that has a name winning (as explain.resolve_target reads a target given by name)."""
    names: dict[str, int] = {}
    for index, label in enumerate(loaded.labels or ()):
        whole = label.strip().lower()
        for name in (whole, whole.split(",")[0].strip()):
            names.setdefault(name, index)
    return names


def _synsets(loaded: LoadedModel) -> dict[str, int]:
    """ImageNet synset ids (n01440764) -> class index for a model with an ImageNet head, else {}."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(loaded.model)
    if not subset:
        return {}
    return {synset: index for index, synset in enumerate(ImageNetInfo(subset).label_names())}


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and other digits that int() refuses."""
    return text.isascii() and text.isdigit()


def class_index(digits: str, num_classes: int) -> int | None:
    """The class index ASCII `digits` name, or None outside 0..num_classes-1. The length is checked before int():
    int() refuses more than 4,300 digits, and so many are out of range anyway."""
    if len(digits.lstrip("0")) > len(str(num_classes)):
        return None
    index = int(digits)
    return index if index < num_classes else None


def class_of_folder(loaded: LoadedModel, name: str, names: dict[str, int] | None = None,
                    synsets: dict[str, int] | None = None) -> int | None:
    """The class a folder name stands for: a class index ("0".."C-1"), a label name (the whole name or its
    first comma-separated part, case-insensitive), or an ImageNet synset id; None when it names none."""
    num_classes = loaded.geometry.num_classes
    wanted = name.strip().lower()
    if is_decimal(wanted):
        return class_index(wanted, num_classes)
    names = _class_names(loaded) if names is None else names
    if wanted in names:
        return names[wanted]
    if _SYNSET.match(wanted):
        synsets = _synsets(loaded) if synsets is None else synsets
        return synsets.get(wanted)
    return None


def folder_labels(loaded: LoadedModel, folder: Path, paths: Sequence[Path]) -> list[int | None] | None:
    """True labels from the first-level subfolder each of `paths` lies in (ImageNet's folder layout):
    FOLDER/<class>/.../image. A file directly in `folder`, or in a subfolder that names no class, gets None.
    Returns None when no subfolder names a class (the images are then unlabelled)."""
    folder = Path(folder)
    names, synsets = _class_names(loaded), _synsets(loaded)
    known: dict[str, int | None] = {}
    labels: list[int | None] = []
    for path in paths:
        parts = Path(path).relative_to(folder).parts
        if len(parts) < 2:
            labels.append(None)
            continue
        if parts[0] not in known:
            known[parts[0]] = class_of_folder(loaded, parts[0], names, synsets)
        labels.append(known[parts[0]])
    return labels if any(label is not None for label in labels) else None


# ----------------------------------------------------------------------------------------------
# Shards


@dataclass(frozen=True)
class Shard:
    """Shard `number` (1..`count`) of a run: the images [start, stop) of its sorted list."""

    number: int
    count: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def name(self) -> str:
        """Its part file's stem: shard-0003-of-0016."""
        return f"shard-{self.number:04d}-of-{self.count:04d}"


def shards(num_images: int, count: int) -> list[Shard]:
    """The `count` shards of `num_images` sorted images: shard i (1-based) holds images floor((i-1) n / N) up to
    floor(i n / N), so sizes differ by at most one, every image is in exactly one shard, and none is repeated
    (a shard is empty when N > n)."""
    if count < 1:
        raise ShardError(f"A run has at least 1 shard, not {count}.")
    edges = [i * num_images // count for i in range(count + 1)]
    return [Shard(i + 1, count, edges[i], edges[i + 1]) for i in range(count)]


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard I/N` -> (I, N), 1 <= I <= N. Raises ShardError with one sentence otherwise."""
    match = _SHARD.match(text)
    if not match:
        raise ShardError(f"--shard takes I/N, e.g. 3/16 (the third of 16 shards), not {text!r}.")
    number, count = int(match.group(1)), int(match.group(2))
    if not 1 <= number <= count:
        raise ShardError(f"--shard {number}/{count}: I runs from 1 to N.")
    return number, count
