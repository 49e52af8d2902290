"""A folder's run cut into shards: each shard's totals written atomically as a part file, beside a manifest that
names the run's inputs, so a killed run resumes where it stopped and shards run anywhere merge into one result.

    OUT/parts/manifest.json               the inputs: model, weights (and their SHA-256), the files (a digest of
                                          their names and sizes), --limit, --explain, --steps, the shard count
    OUT/parts/shard-0003-of-0016.npz      shard 3's totals (vit_core.dataset.totals), written when it is done

A rerun with the same inputs skips the shards whose part is there (a killed run loses at most the shards in
flight); other inputs are refused with what differs, never mixed. When every shard's part is there, the parts
are merged in shard order into the files of interface.md "Many images" (dataset_files). `merged_result` does
the same for parts gathered from several folders (shards run on several machines).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ViTLensError
from ..export import json_bytes, npz_bytes
from ..images.files import OutputFolder
from ..loading.model import Geometry, LoadedModel
from ..runtime.devices import describe_device
from .analyze import DatasetError, Masks, Progress, class_names, consecutive_batches, reduce_sources
from .listing import Shard, files_digest, folder_labels, list_images, list_not_images, relative_name, shards
from .result import DatasetResult, result_of
from .totals import Totals

_logger = logging.getLogger(__name__)

PARTS = "parts"  # the parts' folder inside OUT
MANIFEST = "manifest.json"
FORMAT = "vit-lens dataset parts 1"
# What a run writes into its output folder (dataset_files' names); parts/ besides.
OUTPUT_NAMES = ("dataset.npz", "dataset.json", "mean_attention_distance.png", "images.csv", "images.parquet", "classes.csv")
SHARD_IMAGES = 1000  # images per shard when the count is not given: a killed CPU run loses minutes, not hours
# The manifest's entries that must agree for parts to mix; the others describe the run (geometry, class names).
INPUTS = {"format": "the parts' format", "model": "--model", "weights": "the weights", "weights_sha256": "the weights",
          "labels_sha256": "--labels", "files_sha256": "the files", "num_images": "the files", "limit": "--limit",
          "explain": "--explain", "steps": "--steps", "tests": "--tests", "masks_sha256": "--masks",
          "shards": "--shards"}  # entry -> what it is for the user


class PartsError(ViTLensError, ValueError):
    """Parts that can't be used together (another run's, missing, twice): one sentence that says what to do."""


# ----------------------------------------------------------------------------------------------
# The plan: which files, which labels, which shards


@dataclass(frozen=True)
class RunPlan:
    """A folder's run: its images (sorted, after --limit), their labels, the other files, and the shards."""

    folder: Path
    paths: tuple[Path, ...]  # the images analysed, sorted by path
    labels: tuple[int | None, ...] | None  # one per image; None when no subfolder names a class
    not_images: tuple[tuple[str, str], ...]  # (name below FOLDER, why): reported by shard 1
    shards: tuple[Shard, ...]

    @property
    def names(self) -> list[str]:
        """Each image's name in the outputs: its path below FOLDER."""
        return [relative_name(self.folder, path) for path in self.paths]

    def sources(self) -> list[tuple[str, Path]]:
        return list(zip(self.names, self.paths, strict=True))


def plan_run(loaded: LoadedModel, folder: Path, *, limit: int | None = None, num_shards: int | None = None,
             outputs: Path | None = None) -> RunPlan:
    """The run over `folder`: its images in sorted order (the first `limit`), labels from class-named subfolders,
    every other file with its reason, cut into `num_shards` shards (default: one per SHARD_IMAGES images).
    `outputs`: the run's output folder; where it lies inside `folder` (`vit-lens dataset .`), the run's own files
    there (OUTPUT_NAMES, parts/) are not listed, so a rerun sees the same files."""
    folder = Path(folder)
    own = _own_outputs(outputs, folder)
    paths = tuple(path for path in list_images(folder) if not own(path))[:limit]
    labels = folder_labels(loaded, folder, paths)
    count = num_shards or default_shards(len(paths))
    return RunPlan(folder, paths, tuple(labels) if labels is not None else None,
                   tuple((relative_name(folder, path), reason) for path, reason in list_not_images(folder) if not own(path)),
                   tuple(shards(len(paths), count)))


def _own_outputs(outputs: Path | None, folder: Path) -> Callable[[Path], bool]:
    """Whether a path under `folder` is one of a run's own files in `outputs` (None, or outside `folder`: none is)."""
    root = Path(outputs).resolve() if outputs is not None else None
    if root is None or not root.is_relative_to(folder.resolve()):
        return lambda path: False
    names = {root / name for name in OUTPUT_NAMES}
    parts = root / PARTS
    return lambda path: (resolved := Path(path).resolve()) in names or resolved.is_relative_to(parts)


def default_shards(num_images: int) -> int:
    return max(1, math.ceil(num_images / SHARD_IMAGES))


def _sha256_of_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_of(loaded: LoadedModel, plan: RunPlan, *, weights_file: str | Path | None = None,
                labels_file: str | Path | None = None, limit: int | None = None, explain: bool = False,
                steps: int | None = None, tests: Sequence[str] | None = None, masks: Path | None = None) -> dict[str, Any]:
    """The manifest of a run: the inputs (INPUTS: what makes two runs' parts mixable) and what a merge needs
    without the model (its geometry and class names)."""
    return {
        "format": FORMAT,
        "model": loaded.name,
        "weights": loaded.weights,
        "weights_sha256": _sha256_of_file(weights_file) if weights_file else None,
        "labels_sha256": _sha256_of_file(labels_file) if labels_file else None,
        "files_sha256": files_digest(plan.folder, plan.paths),
        "num_images": len(plan.paths),
        "limit": limit,
        "explain": explain,
        "steps": steps if explain else None,
        "tests": list(tests) if explain and tests else None,
        "masks_sha256": _masks_digest(masks) if explain and masks else None,
        "shards": len(plan.shards),
        "folder": str(plan.folder),
        "geometry": dataclasses.asdict(loaded.geometry),
        "class_names": list(class_names(loaded)),
    }


def _masks_digest(masks: Path) -> str:
    """Names a folder of masks by its files' relative paths, sizes and modification times (not their bytes: a rerun
    must not read every mask again to know the parts are its own)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(masks).rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(masks)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _differences(wanted: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What differs between two manifests' inputs, as the user names it ("--explain", "the files")."""
    return list(dict.fromkeys(INPUTS[key] for key in INPUTS if wanted.get(key) != found.get(key)))


def geometry_of(manifest: dict[str, Any]) -> Geometry:
    """The model's geometry as the manifest keeps it (JSON lists back to tuples)."""
    fields = {key: tuple(value) if isinstance(value, list) else value for key, value in manifest["geometry"].items()}
    return Geometry(**fields)


# ----------------------------------------------------------------------------------------------
# The parts on disk


class PartStore:
    """OUT/parts: the manifest and one part file per finished shard, each written atomically (vit_core.images.files)."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / PARTS

    @classmethod
    def found_in(cls, folder: Path) -> PartStore:
        """The store of a `dataset` run's output folder, or of its parts/ folder itself."""
        folder = Path(folder)
        return cls(folder.parent) if (folder / MANIFEST).is_file() else cls(folder)

    def manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise PartsError(f"{self.path / MANIFEST} can't be read ({e}); remove {self.path} to start again.") from None

    def open(self, manifest: dict[str, Any]) -> None:
        """Write the manifest, or check that the one there names the same inputs. Raises PartsError with what differs."""
        found = self.manifest()
        if found is not None:
            differs = _differences(manifest, found)
            if differs:
                raise PartsError(f"{self.path} holds parts of another run (it differs in: {', '.join(differs)}); "
                                 "use another --out, or remove that folder to start again.")
            return
        self.path.mkdir(parents=True, exist_ok=True)
        with OutputFolder(self.path) as out:
            out.write(MANIFEST, json_bytes(manifest))

    def part_path(self, shard: Shard) -> Path:
        return self.path / f"{shard.name}.npz"

    def done(self, all_shards: Sequence[Shard]) -> set[int]:
        """The numbers of the shards whose part is there."""
        return {shard.number for shard in all_shards if self.part_path(shard).is_file()}

    def write(self, shard: Shard, totals: Totals, device: str, files_sha256: str) -> None:
        arrays = {**totals.arrays(), "shard": np.asarray(shard.number), "shards": np.asarray(shard.count),
                  "device": np.asarray(device), "files_sha256": np.asarray(files_sha256)}
        with OutputFolder(self.path) as out:
            out.write(self.part_path(shard).name, npz_bytes(arrays))
        _logger.info("%s: %d images -> %s", shard.name, totals.num_images, self.part_path(shard))

    def read(self, shard: Shard, files_sha256: str) -> tuple[Totals, str]:
        """A part's totals and the device that made them. Raises PartsError for a part of another run."""
        path = self.part_path(shard)
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {key: npz[key] for key in npz.files}
        except (OSError, ValueError, KeyError) as e:
            raise PartsError(f"{path} can't be read ({e}); remove it and run that shard again.") from None
        if str(arrays["files_sha256"]) != files_sha256 or int(arrays["shards"]) != shard.count:
            raise PartsError(f"{path} belongs to another run; remove it and run that shard again.")
        return Totals.from_arrays(arrays), str(arrays["device"])


def merged_result(stores: Sequence[PartStore]) -> tuple[DatasetResult, Geometry, dict[str, Any]]:
    """Every shard's part, found in `stores` (one folder, or the folders of shards run elsewhere), merged in shard
    order: the result, the model's geometry and the manifest. Raises PartsError when the stores hold different runs,
    a shard twice, or not every shard (naming which are missing), DatasetError when no image was analysed."""
    manifests = [(store, store.manifest()) for store in stores]
    missing_manifest = [str(store.path) for store, manifest in manifests if manifest is None]
    if missing_manifest:
        raise PartsError(f"No {MANIFEST} in {', '.join(missing_manifest)}: not the output of a `dataset` run.")
    first = manifests[0][1]
    for store, manifest in manifests[1:]:
        differs = _differences(first, manifest)
        if differs:
            raise PartsError(f"{store.path} holds parts of another run than {manifests[0][0].path} "
                             f"(it differs in: {', '.join(differs)}).")
    all_shards = shards(first["num_images"], first["shards"])
    holder: dict[int, PartStore] = {}
    for store in stores:
        for number in sorted(store.done(all_shards)):
            if number in holder and holder[number].path.resolve() != store.path.resolve():
                raise PartsError(f"Shard {number}/{first['shards']} is in both {holder[number].path} and {store.path}: "
                                 "name each shard's folder once.")
            holder[number] = store
    missing = [shard.number for shard in all_shards if shard.number not in holder]
    if missing:
        raise PartsError(f"{len(missing)} of {first['shards']} shards are not done yet: {_numbers(missing)}; run them "
                         "(the same command with --shard I/N) and merge again.")
    totals, devices = Totals(), []
    for shard in all_shards:
        part, device = holder[shard.number].read(shard, first["files_sha256"])
        totals.merge(part)
        devices.append(device)
    if totals.num_images == 0:
        first_failure = f" (first: {totals.failures[0][0]}: {totals.failures[0][1]})" if totals.failures else ""
        raise DatasetError(f"None of the {first['num_images']} images could be read{first_failure}.")
    result = result_of(totals, model=first["model"], weights=first["weights"], device=", ".join(dict.fromkeys(devices)),
                       class_names=tuple(first["class_names"]))
    return result, geometry_of(first), first


def _numbers(numbers: list[int], shown: int = 12) -> str:
    return ", ".join(map(str, numbers[:shown])) + (", ..." if len(numbers) > shown else "")


# ----------------------------------------------------------------------------------------------
# Running shards in this process


def run_shards(loaded: LoadedModel, plan: RunPlan, store: PartStore, todo: Sequence[Shard], files_sha256: str, *,
               batch_size: int, workers: int = 0, explain: bool = False, steps: int | None = None,
               tests: Sequence[str] | None = None, masks: Masks | None = None, progress: Progress | None = None) -> None:
    """Analyse the shards `todo` of `plan` in this process and write each one's part as soon as it is done.
    One DataLoader serves them all (its batches stop at the shards' edges), so worker processes start once."""
    sources, labels = plan.sources(), plan.labels
    device = describe_device(loaded.device)
    pending = {shard.number: (shard, shard_start(plan, shard)) for shard in todo}
    owner = {}  # the first index of each batch -> its shard's number
    batches = []
    for shard in todo:
        for batch in consecutive_batches(shard.start, shard.stop, batch_size):
            owner[batch.start] = shard.number
            batches.append(batch)
    remaining = {shard.number: shard.size for shard in todo}
    for shard, totals in [pending[shard.number] for shard in todo if shard.size == 0]:
        store.write(shard, totals, device, files_sha256)  # nothing to analyse: done at once
    kwargs = ({"steps": steps} if steps is not None else {}) | ({"tests": tests} if tests is not None else {})
    for indices, batch in reduce_sources(loaded, sources, labels, batches, workers=workers, explain=explain,
                                         masks=masks, progress=progress, **kwargs):
        number = owner[indices[0]]
        shard, totals = pending[number]
        totals.merge(batch)
        remaining[number] -= len(indices)
        if remaining[number] == 0:
            store.write(shard, totals, device, files_sha256)
            del pending[number]


def shard_start(plan: RunPlan, shard: Shard) -> Totals:
    """A shard's totals before its images: shard 1 reports the files that are not images."""
    return Totals(not_images=list(plan.not_images) if shard.number == 1 else [])
