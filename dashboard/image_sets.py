"""The sets of images of the "Many images" page, and one run over a set. No Streamlit here (the page is
dashboard/page_scripts/many_images.py, its widgets dashboard/views/many_images.py).

The set is a batch drawn by the Shapes generator (labels known) or the user's uploads: several image files,
or a .zip whose first-level folders name the classes (as the CLI's class-named subfolders). "Run" hands the
set to `vit_core.dataset` (`analyze_totals`, a chunk at a time, merged) with a progress bar; the result (the
paper's Fig. 7 right for the set, accuracy and logit-lens accuracy per layer, per class and the confusion
counts, the high-norm token rate per layer, each image's row, the files the CLI writes) is kept in the
session, so changing a widget afterwards recomputes nothing.

A set is bounded so that one session can't exhaust a shared server: number of images, bytes per file
and in all, and a zip's members (their number, names and declared sizes) checked before anything is
extracted. A refused set is said in one sentence and the page, and the previous result, stay.

"""

from __future__ import annotations

import hashlib
import io
import struct
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from dashboard.figures.base import png_bytes
from dashboard.figures.concepts import crops_row_image
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB
from dashboard.models import ModelRequest
from vit_core import concepts, dataset
from vit_core.errors import ImageError, ViTLensError
from vit_core.images import load_image
from vit_core.loading.model import LoadedModel
from vit_core.teaching import data as shapes

# Per run: 256 ViT-B/16 images take minutes on a small CPU (docs/performance/2026-11-23.md, "Many images"); the CLI
# (`vit-lens dataset`) has no cap.
MAX_IMAGES = 256
MAX_SET_MB = 100  # all images of one set together: the uploads, or a zip's uncompressed members
MAX_ZIP_MB = 100  # one uploaded file, a zip (a single image is held to MAX_IMAGE_MB), unless the server's cap is lower
MAX_ZIP_MEMBERS = 1000  # entries in a zip, folders and skipped files included
# The zip's directory, as its end record declares it, before zipfile reads it: zipfile walks as many bytes as the
# record says, whatever count it gives. An entry is 46 bytes and its name; 1 KiB each leaves room for long paths.
MAX_ZIP_DIRECTORY_BYTES = MAX_ZIP_MEMBERS * 1024
# One run's wall-clock budget: 256 ViT-B/16 images take about 80 s alone on the development VM and about 200 s on
# the shared 2-core VM under a class's load (docs/performance/2026-11-23.md, "Many images"); only costly files (each decode is
# bounded on its own, not their sum) or a large model reach it. Wall time, not CPU time: a run's decodes and its
# forward's threads are not all on the page's thread, and what the budget bounds is how long it holds the server.
RUN_BUDGET_S = 300.0
# Images analysed between two looks at the budget (and between two chances for a job's stop: process.explanation_job):
# on a CPU 32, each chunk one run of the engine (its W forwards at once: 128 Shapes took 1.8 s in chunks of 32, 2.5-3.0 s
# in chunks of 2, docs/performance/2026-12-07.md), and 18 s of ViT-B/16 beside two busy processes at most; one when
# judged (each image's explanation runs alone and takes seconds on ViT-B/16); on an accelerator one padded forward's worth.
RUN_CHUNK, RUN_CHUNK_JUDGED, RUN_CHUNK_ACCELERATOR = 32, 1, 64
SHAPES_DEFAULT = 128  # images in a Shapes batch: the paper's Fig. 7 right averages over 128 images
_MB = 2**20

SHAPES, UPLOADS = "shapes", "uploads"
SOURCES = {SHAPES: "A batch of drawn Shapes", UPLOADS: "Your images (files or a .zip)"}
_JUNK_PREFIXES = ("__MACOSX/",)  # what archivers add beside the user's files: ignored without a word


class SetError(ViTLensError):
    """A set of images this page refuses as a whole (too many, too large, a suspicious zip): one sentence."""


# ----------------------------------------------------------------------------------------------
# The set of images


@dataclass(frozen=True)
class ImageSet:
    """What one run analyses: named image files, their labels (model class indices) when known, and notes."""

    description: str  # for people: "128 drawn Shapes (seed 0)", "3 uploaded files"
    sources: tuple[tuple[str, bytes], ...]  # (name, file bytes)
    labels: tuple[int | None, ...] | None  # one per source, None where unknown; None when none is known
    notes: tuple[str, ...] = ()  # what was skipped
    no_labels_reason: str = ""  # why there are no labels (with labels: "")
    masks: dict[str, np.ndarray] | None = None  # image name -> where the object is (H, W) bool: the Shapes' silhouettes

    def __post_init__(self) -> None:
        assert self.labels is None or len(self.labels) == len(self.sources)


def is_image_name(name: str) -> bool:
    return PurePosixPath(name).suffix.lower().lstrip(".") in IMAGE_TYPES


def _unsafe_member_name(name: str) -> bool:
    """A member name that would land outside a folder it is extracted into: absolute, a drive, or '..'."""
    posix = name.replace("\\", "/")
    return posix.startswith("/") or (len(posix) > 1 and posix[1] == ":") or ".." in PurePosixPath(posix).parts


def zip_members(zip_name: str, data: bytes, images_before: int = 0,
                bytes_before: int = 0) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The image files inside a zip as (path inside the zip, bytes), and the names of the members skipped.

    Everything that can be checked from the zip's directory is checked before a byte is decompressed:
    the number of members, their names (absolute or '..' paths refuse the zip), encryption, each image's
    declared size and their total (a zip bomb declares huge sizes, or lies: a member is read to at most its
    declared size + 1 byte, and one that gives more refuses the zip). Members that are not images (a nested
    zip included: it is not opened) are skipped; the archivers' own files (__MACOSX/, hidden files) ignored.
    `images_before`, `bytes_before`: what the set holds already (other uploads), counted against the same caps.
    Raises SetError.
    """
    check_zip_directory(zip_name, data)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise SetError(f"{zip_name} is not a readable zip file ({e}).") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ZIP_MEMBERS:  # counted again: the end record's count can lie (its directory's size can't)
            raise SetError(f"{zip_name} has {len(infos)} entries; a zip here may have at most {MAX_ZIP_MEMBERS}.")
        unsafe = next((i.filename for i in infos if _unsafe_member_name(i.filename)), None)
        if unsafe is not None:
            raise SetError(f"{zip_name} holds a member named {unsafe!r} that points outside the archive, so it is refused.")
        check_zip_entries(zip_name, data, infos)
        wanted, skipped = [], []
        for info in infos:
            base = PurePosixPath(info.filename).name
            if info.is_dir() or info.filename.startswith(_JUNK_PREFIXES) or base.startswith("."):
                continue
            (wanted if is_image_name(info.filename) else skipped).append(info)
        if images_before + len(wanted) > MAX_IMAGES:
            what = f"{zip_name} holds {len(wanted)}" + (f" (and the other uploads {images_before})" if images_before else "")
            raise SetError(f"{what} images; one run takes at most {MAX_IMAGES}.")
        if any(i.flag_bits & 0x1 for i in wanted):
            raise SetError(f"{zip_name} is encrypted; please upload a zip without a password.")
        big = next((i for i in wanted if i.file_size > MAX_IMAGE_MB * _MB), None)
        if big is not None:
            raise SetError(f"{zip_name}: {big.filename} unpacks to {big.file_size / _MB:,.0f} MB; "
                           f"an image may have at most {MAX_IMAGE_MB} MB.")
        total = sum(i.file_size for i in wanted)
        if bytes_before + total > MAX_SET_MB * _MB:
            what = f"{zip_name} unpacks to {total / _MB:,.0f} MB of images" + (
                f" (and the other uploads hold {bytes_before / _MB:,.0f} MB)" if bytes_before else "")
            raise SetError(f"{what}; a set may have at most {MAX_SET_MB} MB.")
        members = []
        for info in wanted:
            try:
                with archive.open(info) as member:
                    content = member.read(info.file_size + 1)  # never more than declared (+1 to see a lie)
            except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError, ValueError) as e:
                raise SetError(f"{zip_name}: {info.filename} can't be unpacked ({e}).") from None
            if len(content) > info.file_size:
                raise SetError(f"{zip_name}: {info.filename} unpacks to more than its declared size, so the zip is refused.")
            members.append((info.filename, content))
    return members, [i.filename for i in skipped]


_EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries here, entries in all, directory size, offset, comment
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # signature, disk, offset of the zip64 end record, disks
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # signature, size, versions, disks, entries here, in all, size, offset
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # ..., name length, extra length: 30 bytes before the name


def declared_directory(zip_name: str, data: bytes) -> tuple[int, int] | None:
    """(entries, directory bytes) of the directory CPython's zipfile will read, from the end records it reads,
    found as it finds them, before it parses anything; None without an end record (zipfile then refuses the file).

    zipfile takes the file's last 22 bytes as the end record when they start with its signature and declare no
    comment, else the last signature within the final 64 KiB (and 22 bytes); where a zip64 locator stands just
    before that record it reads the zip64 record just before the locator, whatever offset the locator gives. A zip
    on which other readers would see another directory than zipfile's (a locator pointing elsewhere, the
    signature again inside the end record) is a trick to hide its directory: SetError."""
    at = len(data) - _EOCD.size
    if not (at >= 0 and data[at:at + 4] == b"PK\x05\x06" and data[-2:] == b"\0\0"):
        window = max(0, len(data) - _EOCD.size - 0x10000)
        at = data.rfind(b"PK\x05\x06", window)
        if at < 0 or len(data) - at < _EOCD.size:
            return None
    elif data.find(b"PK\x05\x06", at + 1) >= 0:
        raise SetError(f"{zip_name} hides its end record's signature inside that record, so it is refused.")
    _, _, _, here, entries, size, _, _ = _EOCD.unpack_from(data, at)
    locator = at - _ZIP64_LOCATOR.size
    if locator < 0 or data[locator:locator + 4] != b"PK\x06\x07":
        return max(entries, here), size
    record = locator - _ZIP64_EOCD.size  # where zipfile reads it: it assumes no zip64 extensible data
    if record < 0 or data[record:record + 4] != b"PK\x06\x06":
        return max(entries, here), size  # zipfile then keeps the classic record's values
    if _ZIP64_LOCATOR.unpack_from(data, locator)[2] != record:
        raise SetError(f"{zip_name} has a zip64 locator that points away from its zip64 end record, so it is refused.")
    fields = _ZIP64_EOCD.unpack_from(data, record)
    return max(fields[6], fields[7]), fields[8]


def check_zip_directory(zip_name: str, data: bytes) -> None:
    """Refuse a zip whose end record declares more entries, or a larger directory, than a set may have: in
    microseconds, where zipfile would parse a directory of 500,000 entries for seconds and hundreds of MB."""
    declared = declared_directory(zip_name, data)
    if declared is None:
        return  # not a zip: zipfile says so
    entries, size = declared
    if entries > MAX_ZIP_MEMBERS:
        raise SetError(f"{zip_name} has {entries:,} entries; a zip here may have at most {MAX_ZIP_MEMBERS}.")
    if size > MAX_ZIP_DIRECTORY_BYTES:
        raise SetError(f"{zip_name} has a directory of {size / _MB:,.1f} MB; a zip here may have at most "
                       f"{MAX_ZIP_MEMBERS} entries.")


def check_zip_entries(zip_name: str, data: bytes, infos: Sequence[zipfile.ZipInfo]) -> None:
    """Refuse a zip that names a file twice, or whose entries' data overlap (a zip bomb's trick: many entries
    inflating the same compressed bytes). Each entry's range runs from its local header to the end of its
    compressed data, from the directory's offsets and sizes and the local header's own lengths."""
    seen: set[str] = set()
    for info in infos:
        name = info.filename.replace("\\", "/")
        if name in seen:
            raise SetError(f"{zip_name} holds {info.filename!r} twice, so it is refused.")
        seen.add(name)
    ranges = []
    for info in infos:
        start = info.header_offset
        if not 0 <= start <= len(data) - _LOCAL_HEADER.size or data[start:start + 4] != b"PK\x03\x04":
            raise SetError(f"{zip_name} is damaged: the entry {info.filename!r} is not where its directory says.")
        name_length, extra_length = _LOCAL_HEADER.unpack_from(data, start)[-2:]
        ranges.append((start, start + _LOCAL_HEADER.size + name_length + extra_length + info.compress_size, info))
    ranges.sort(key=lambda r: r[0])
    for (_, end, first), (start, _, second) in pairwise(ranges):
        if start < end:
            raise SetError(f"{zip_name}: the entries {first.filename!r} and {second.filename!r} share their data "
                           "(a zip bomb's trick), so it is refused.")


def _without_common_root(paths: Sequence[str]) -> list[PurePosixPath]:
    """Paths inside a zip, with the one folder that holds everything removed (a zip of `myset/` holds
    `myset/circle/a.png`: the class folders are one level down)."""
    parts = [PurePosixPath(p).parts for p in paths]
    if parts and all(len(p) > 2 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    return [PurePosixPath(*p) for p in parts]


def zip_labels(loaded: LoadedModel, paths: Sequence[str], zip_name: str = "This zip") -> list[int | None] | None:
    """Labels from the first-level folders of paths inside a zip, named as the CLI's class folders are
    (a class index, a label name, an ImageNet synset id): `vit_core.dataset.folder_labels` on those paths."""
    root = Path("/zip")  # folder_labels reads only the paths' parts below the root, never the disk
    try:
        return dataset.folder_labels(loaded, root, [root / p for p in _without_common_root(paths)])
    except ValueError as e:  # a folder name the rules misread (int() refuses '²', 5,000 digits): a sentence, no trace
        raise SetError(f"{zip_name} has a class folder whose name can't be read as a class, so it is refused.") from e


def uploaded_set(loaded: LoadedModel, files: Sequence[tuple[str, bytes]]) -> ImageSet:
    """The set made of uploaded files: images as they are, zips unpacked (zip_members), labels from the zips'
    class folders. Raises SetError for a set over the bounds or an unsafe zip; oversized single files are skipped."""
    if not files:
        raise SetError("Upload some images or a .zip first.")
    total = sum(len(data) for _, data in files)
    if total > MAX_SET_MB * _MB:
        raise SetError(f"These uploads hold {total / _MB:,.0f} MB; a set may have at most {MAX_SET_MB} MB.")
    plain = [(name, data) for name, data in files if not name.lower().endswith(".zip")]
    too_large = [name for name, data in plain if len(data) > MAX_IMAGE_MB * _MB]  # skipped, and said
    sources = [(name, data) for name, data in plain if len(data) <= MAX_IMAGE_MB * _MB]
    labels: list[int | None] = [None] * len(sources)
    skipped: list[str] = []  # not images
    for name, data in files:  # each zip checked against what the set holds already, before it is unpacked
        if name.lower().endswith(".zip"):
            members, not_images = zip_members(name, data, len(sources), sum(len(d) for _, d in sources))
            member_labels = zip_labels(loaded, [m for m, _ in members], name) if members else None
            sources += [(f"{name}/{m}", content) for m, content in members]
            labels += member_labels or [None] * len(members)
            skipped += [f"{name}/{m}" for m in not_images]
    if len(sources) > MAX_IMAGES:
        raise SetError(f"These uploads hold {len(sources)} images; one run takes at most {MAX_IMAGES}.")
    notes = []
    if skipped:
        notes.append(f"Skipped {len(skipped)} file(s) that are not images (a zip inside a zip is not opened): "
                     f"{_some(skipped)}.")
    if too_large:
        notes.append(f"Skipped {len(too_large)} image(s) over {MAX_IMAGE_MB} MB: {_some(too_large)}.")
    if not sources:
        whys = ([f"{len(skipped)} file(s) that are not images: {_some(skipped)}"] if skipped else []) + (
            [f"{len(too_large)} image(s) over {MAX_IMAGE_MB} MB: {_some(too_large)}"] if too_large else [])
        raise SetError(f"There is no image in these uploads{' (only ' + '; '.join(whys) + ')' if whys else ''}.")
    known = any(label is not None for label in labels)
    no_labels = "" if known else ("No labels, so no accuracy: labels come from a .zip whose first-level folders "
                                  "name the model's classes (a class index, a class name, or an ImageNet synset "
                                  "id such as n01440764).")
    what = f"{len(sources)} uploaded image{'s' * (len(sources) != 1)}"
    return ImageSet(what, tuple(sources), tuple(labels) if known else None, tuple(notes), no_labels)


def _some(names: Sequence[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def shapes_labels(loaded: LoadedModel) -> dict[int, int] | None:
    """Shapes label -> the model's class index, matched by name; None unless the model knows every Shapes class."""
    model_index = {name.strip().lower(): i for i, name in enumerate(loaded.labels or ())}
    mapping = {k: model_index.get(name) for k, name in enumerate(shapes.LABELS)}
    return None if None in mapping.values() else mapping


def shapes_set(loaded: LoadedModel, count: int, seed: int) -> ImageSet:
    """`count` images drawn by the Shapes generator (balanced classes, `seed` fixes them), as PNG files."""
    if not 1 <= count <= MAX_IMAGES:
        raise SetError(f"A Shapes batch has 1 to {MAX_IMAGES} images, not {count}.")
    drawn = shapes.draw_set(count, seed)  # images (n, S, S, 3) uint8, labels (n,) indices into shapes.LABELS
    sources = tuple((f"shape_{i:03d}_{shapes.LABELS[label]}.png", png_bytes(img))
                    for i, (img, label) in enumerate(zip(drawn.images, drawn.labels, strict=True)))
    mapping = shapes_labels(loaded)
    no_labels = "" if mapping else ("No accuracy: this model's classes are not the Shapes' classes "
                                    "(choose the bundled Shapes ViT for that).")
    labels = tuple(mapping[int(label)] for label in drawn.labels) if mapping else None
    masks = {name: region for (name, _), region, label in zip(sources, drawn.regions, drawn.labels, strict=True)
             if shapes.LABELS[label] != shapes.OTHER}  # "other" images have no object
    return ImageSet(f"{count} drawn Shapes (seed {seed})", sources, labels, (), no_labels, masks)


# ----------------------------------------------------------------------------------------------
# One run and its result


@dataclass(frozen=True)
class ManyRun:
    """A finished run, as the session keeps it: the result, the files to download, and what it was computed with."""

    result: dataset.DatasetResult
    files: dict[str, bytes]  # dataset_files(): dataset.npz, dataset.json, the figure, images.csv (and classes.csv)
    model_key: str  # ModelRequest.key of the model it ran on
    model_name: str
    weights: str
    description: str  # ImageSet.description
    notes: tuple[str, ...]
    no_labels_reason: str
    seconds: float
    stopped: str = ""  # why the run stopped before the end of the set (its budget): one sentence; "" if it did not


def run_set(request: ModelRequest, loaded: LoadedModel, image_set: ImageSet,
            progress: Callable[[int, int], None] | None = None, *, budget_s: float = RUN_BUDGET_S,
            clock: Callable[[], float] = time.monotonic, explain: bool = False) -> ManyRun:
    """The set analysed (batched, reduced on the model's device), and the CLI's files. With `explain`, every image's
    relevance maps judged too (`vit-lens dataset --explain`: the deletion and insertion tests, and for the images whose
    object the set knows, the localisation metrics), so the result says which method to trust over the set.

    The set is analysed in chunks (RUN_CHUNK images, RUN_CHUNK_JUDGED when judged, RUN_CHUNK_ACCELERATOR off the CPU),
    each chunk's totals merged
    into the run's (vit_core.dataset's mergeable totals: the same result as one pass); once `budget_s` seconds of wall
    time are spent the run stops after its current chunk and keeps what it finished, the rest counted as not analysed
    (`ManyRun.stopped`)."""
    start = clock()
    sources, labels = image_set.sources, image_set.labels
    totals = dataset.Totals()
    done = 0
    size = RUN_CHUNK_ACCELERATOR if loaded.device.type != "cpu" else RUN_CHUNK_JUDGED if explain else RUN_CHUNK
    width = dataset.pool_width(loaded.device, len(sources))
    with dataset.forward_pool(loaded, width) as pool:  # one for every chunk: one trace of the forward per run
        for first in range(0, len(sources), size):
            if clock() - start > budget_s:
                break
            chunk = slice(first, first + size)
            report = (lambda d, _, first=first: progress(first + d, len(sources))) if progress else None
            masks = dataset.MasksByName(image_set.masks) if image_set.masks else None
            totals.merge(dataset.analyze_totals(loaded, sources[chunk], labels[chunk] if labels else None,
                                                progress=report, explain=explain, masks=masks, pool=pool))
            done = min(first + size, len(sources))
    stopped = ""
    if done < len(sources):
        stopped = (f"The run stopped after {clock() - start:.0f} s, the time one run may take here: {done} of "
                   f"{len(sources)} images were analysed, the others not; the results below are for those.")
    result = dataset.dataset_result(loaded, totals, done)  # DatasetError when none could be read
    files = dataset.dataset_files(result, loaded.geometry)
    return ManyRun(result, files, request.key, loaded.name, loaded.weights, image_set.description, image_set.notes,
                   image_set.no_labels_reason, clock() - start, stopped)


# ----------------------------------------------------------------------------------------------
# The set through a `vit-lens concepts` run's autoencoder (the page's Concepts section)


@dataclass(frozen=True)
class SetRemoval:
    """One concept removed over the set (vit_core.concepts.removal_agreement)."""

    agreement: float  # share of the set's images whose top-1 is unchanged
    kl: float  # mean KL(p || p_removed) over the set's images, in nats
    images: int


@dataclass(frozen=True)
class SetConceptsRun:
    """The concepts found in a set, as the session keeps them, with the removals asked for since."""

    seen: concepts.SetConcepts
    crops: tuple[bytes, ...]  # per shown feature: its top patches in this set, side by side (PNG)
    model_key: str  # ModelRequest.key of the model it ran on
    concepts_key: str  # dashboard.caches.loaded_concepts's key of the concepts
    set_digest: str  # set_digest of the set
    description: str  # ImageSet.description
    images: int  # the set's images that could be read
    skipped: tuple[str, ...]  # "name: why" of those that could not
    seconds: float
    removed: dict[int, SetRemoval] = field(default_factory=dict)  # feature -> its removal over the set
    plain_logits: np.ndarray | None = None  # float32 (n, C): the plain model's, from the first removal (for the next)


def set_digest(image_set: ImageSet) -> str:
    """The SHA-256 of the set's names and bytes: the same set drawn or uploaded again has the same digest."""
    digest = hashlib.sha256()
    for name, data in image_set.sources:
        digest.update(hashlib.sha256(name.encode()).digest() + hashlib.sha256(data).digest())
    return digest.hexdigest()


def set_pictures(loaded: LoadedModel, image_set: ImageSet) -> tuple[list[Image.Image], list[str]]:
    """The set's images decoded (at most MAX_IMAGES), and "name: why" of those that can't be."""
    pictures, skipped = [], []
    for name, data in image_set.sources[:MAX_IMAGES]:
        try:
            pictures.append(load_image(data, loaded.decode_min_side))
        except ImageError as e:
            skipped.append(f"{name}: {e}")
    if not pictures:
        raise SetError("None of the set's images could be read.")
    return pictures, skipped


def set_concepts_run(request: ModelRequest, loaded: LoadedModel, image_set: ImageSet, found: concepts.Concepts,
                     concepts_key: str, progress: Callable[[int, int], None] | None = None) -> SetConceptsRun:
    """The set's patch tokens after the concepts' block (forwards of blocks 0..L), its strongest features with their
    top patches in the set as crops, and its reconstruction error (vit_core.concepts.set_concepts)."""
    start = time.monotonic()
    pictures, skipped = set_pictures(loaded, image_set)
    seen = concepts.set_concepts(found, concepts.set_tokens(loaded, pictures, found.layer, progress))
    grid_w, patch_size = loaded.geometry.grid[1], loaded.geometry.patch_size
    model_crops: dict[int, np.ndarray] = {}
    rows = []
    for j in range(len(seen.strongest)):
        crops = []
        for i, p, activation in zip(seen.top_image[j].tolist(), seen.top_patch[j].tolist(), seen.top_activation[j],
                                    strict=True):
            if activation <= 0:
                break
            if i not in model_crops:
                model_crops[i] = concepts.image_crop(loaded, pictures[i])
            crops.append(concepts.patch_crop(model_crops[i], patch_size, p // grid_w, p % grid_w))
        rows.append(png_bytes(crops_row_image(crops)))
    return SetConceptsRun(seen, tuple(rows), request.key, concepts_key, set_digest(image_set), image_set.description,
                          len(pictures), tuple(skipped), time.monotonic() - start)


def set_concept_removed(loaded: LoadedModel, image_set: ImageSet, found: concepts.Concepts, kept: SetConceptsRun,
                        feature: int, progress: Callable[[int, int], None] | None = None) -> SetConceptsRun:
    """Feature `feature` removed at the concepts' block on every image of the set (whose concepts are `kept`): the
    share of top-1s unchanged and the mean KL, added to `kept`'s removals (two forwards per image the first time, one
    after: the plain logits are kept)."""
    pictures, _ = set_pictures(loaded, image_set)
    plain, removed = concepts.set_logits_with_concept_removed(loaded, pictures, found, feature, progress,
                                                              plain=kept.plain_logits)
    agreement, kl = concepts.removal_agreement(plain, removed)
    return replace(kept, removed={**kept.removed, feature: SetRemoval(agreement, kl, len(pictures))},
                   plain_logits=plain)


def limits_text(upload_mb: int) -> str:
    """The page's limits in one sentence; `upload_mb`: the largest file the uploader takes (upload_limit_mb)."""
    return (f"At most {MAX_IMAGES} images and {MAX_SET_MB} MB per set; an image up to {min(MAX_IMAGE_MB, upload_mb)} MB, "
            f"a .zip up to {upload_mb} MB (at most {MAX_ZIP_MEMBERS} entries); a run stops after "
            f"{RUN_BUDGET_S / 60:.0f} minutes with what it finished. For larger sets use `vit-lens dataset FOLDER` "
            "on your own machine.")


def upload_limit_mb(server_mb: float) -> int:
    """The largest file the page's uploader takes: its own cap, or the server's (Streamlit's server.maxUploadSize,
    which answers 413 above it) where that is lower, as in class mode."""
    return max(1, min(MAX_ZIP_MB, int(server_mb)))
