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

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import ViTLensError
from ..export import json_bytes, write_npz
from ..images.files import OutputFolder
from ..lenses import Lens
from ..loading.model import Geometry, LoadedModel
from ..runtime.devices import describe_device
from .analyze import DatasetError, Masks, Progress, class_names, consecutive_batches, reduce_sources
from .listing import Shard, ShardError, files_digest, folder_labels, list_images, list_not_images, relative_name, shards
from .result import DatasetResult, result_of
from .totals import NO_LABEL, Totals, array_scalar, moments_problem, moments_shape

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
          "shards": "--shards", "lenses": "--lens"}  # entry -> what it is for the user


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
             outputs: Path | None = None, resumed_shards: int | None = None) -> RunPlan:
    """The run over `folder`: its images in sorted order (the first `limit`), labels from class-named subfolders,
    every other file with its reason, cut into `num_shards` shards (default: one per SHARD_IMAGES images).
    `outputs`: the run's output folder; where it lies inside `folder` (`vit-lens dataset .`), the run's own files
    there (OUTPUT_NAMES, parts/) are not listed, so a rerun sees the same files. `num_shards` is at most the
    images (ShardError). `resumed_shards`: the count of the parts already in the output folder, used when
    `num_shards` is None; its manifest bounds it, so a rerun over other files is told what differs instead."""
    folder = Path(folder)
    own = _own_outputs(outputs, folder)
    paths = tuple(path for path in list_images(folder) if not own(path))[:limit]
    labels = folder_labels(loaded, folder, paths)
    count = num_shards or resumed_shards or default_shards(len(paths))
    if num_shards and count > max(1, len(paths)):  # beyond that a shard is empty: refused before N Shard objects and N part files
        raise ShardError(f"{count:,} shards for {len(paths):,} images: a run has at most one shard per image "
                         f"({max(1, len(paths)):,} here).")
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
                steps: int | None = None, tests: Sequence[str] | None = None, masks: Path | None = None,
                lenses: Sequence[Lens] = ()) -> dict[str, Any]:
    """The manifest of a run: the inputs (INPUTS: what makes two runs' parts mixable; `lenses` by name, source and
    the SHA-256 of their file) and what a merge needs without the model (its geometry and class names)."""
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
        "lenses": [{"name": one.name, "source": one.source, "sha256": one.sha256} for one in lenses] or None,
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


def manifest_differences(wanted: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What differs between two manifests' inputs, as the user names it ("--explain", "the files")."""
    return list(dict.fromkeys(INPUTS[key] for key in INPUTS if wanted.get(key) != found.get(key)))


# ----------------------------------------------------------------------------------------------
# Checking what a manifest and a part hold: files that travel between machines, read back as data, never trusted

_GEOMETRY_FIELDS = {field.name: field.type for field in dataclasses.fields(Geometry)}


def _is_count(value: Any, least: int = 0) -> bool:
    """A JSON whole number >= least (JSON's true and false are not numbers)."""
    return type(value) is int and value >= least


def _is_optional(value: Any, kind: type) -> bool:
    return value is None or type(value) is kind


def manifest_problem(manifest: Any) -> str | None:
    """What makes `manifest` unusable, in a few words, or None: every entry of `manifest_of` of its type, the shard
    count from 1 to the images (at least 1), and the geometry and class names of a model."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") != FORMAT:
        return f"its format is not {FORMAT!r}"
    strings = ("model", "weights", "files_sha256", "folder")
    wrong = [key for key in strings if type(manifest.get(key)) is not str]
    wrong += [key for key in ("weights_sha256", "labels_sha256", "masks_sha256") if not _is_optional(manifest.get(key), str)]
    wrong += [key for key in ("explain",) if type(manifest.get(key)) is not bool]
    if wrong:
        return f"{', '.join(wrong)} missing or not of its type"
    images = manifest.get("num_images")
    if not _is_count(images):
        return "num_images is not a whole number >= 0"
    if not _is_count(manifest.get("shards"), 1) or manifest["shards"] > max(1, images):
        return f"shards must be a whole number from 1 to the {max(1, images)} images, not {manifest.get('shards')!r:.40}"
    if manifest.get("limit") is not None and not _is_count(manifest["limit"], 1):
        return "limit is not a whole number >= 1"
    if manifest.get("steps") is not None and not _is_count(manifest["steps"], 2):
        return "steps is not a whole number >= 2"
    tests = manifest.get("tests")
    if tests is not None and not (isinstance(tests, list) and all(type(t) is str for t in tests)):
        return "tests is not a list of names"
    lenses = manifest.get("lenses")
    if lenses is not None and not (isinstance(lenses, list) and all(
            isinstance(one, dict) and all(type(one.get(k)) is str for k in ("name", "source", "sha256")) for one in lenses)):
        return "lenses is not a list of {name, source, sha256}"
    names = manifest.get("class_names")
    if not (isinstance(names, list) and all(type(n) is str for n in names)):
        return "class_names is not a list of names"
    return _geometry_problem(manifest.get("geometry"), len(names))


def _geometry_problem(geometry: Any, num_names: int) -> str | None:
    """What makes a manifest's geometry no model's, or None."""
    if not isinstance(geometry, dict) or set(geometry) != set(_GEOMETRY_FIELDS):
        return f"its geometry must have exactly {', '.join(_GEOMETRY_FIELDS)}"
    for key in ("img_size", "patch_size", "grid"):
        value = geometry[key]
        if not (isinstance(value, list) and len(value) == 2 and all(_is_count(v, 1) for v in value)):
            return f"geometry {key} is not two whole numbers >= 1"
    if not (isinstance(geometry["prefix_names"], list) and all(type(n) is str for n in geometry["prefix_names"])):
        return "geometry prefix_names is not a list of names"
    if type(geometry["no_embed_class"]) is not bool or type(geometry["has_pos_embed"]) is not bool:
        return "geometry no_embed_class and has_pos_embed must be true or false"
    if not all(_is_count(geometry[key], 1) for key in ("num_layers", "num_heads", "embed_dim")):
        return "geometry num_layers, num_heads and embed_dim must be whole numbers >= 1"
    if not _is_count(geometry["num_classes"]):
        return "geometry num_classes is not a whole number >= 0"
    if geometry["num_classes"] and num_names != geometry["num_classes"]:
        return f"{num_names} class names for {geometry['num_classes']} classes"
    return None


def part_problem(arrays: dict[str, np.ndarray], geometry: Geometry, shard: Shard) -> str | None:
    """What makes a part's arrays (Totals.arrays) unusable for a shard of a run with this `geometry`, or None: every
    array of its type and shape (L blocks, H heads, C classes, n analysed images), the counts consistent, and the
    analysed and failed images together the shard's size. A shape that differs is refused, never broadcast."""
    layers, heads, classes = geometry.num_layers, geometry.num_heads, geometry.num_classes
    for prefix, shape in (("distance", (layers, heads)), ("distance_renorm", (layers, heads)),
                          ("high_norm_rate", (layers + 1,))):
        problem = moments_problem(arrays, prefix, shape)
        if problem:
            return problem
    n = array_scalar(arrays["distance_count"], int)
    if any(array_scalar(arrays.get(f"{prefix}_count"), int) != n for prefix in ("distance_renorm", "high_norm_rate")):
        return "its arrays count different numbers of images"
    for key, kinds, length in (("rows_file", "U", n), ("rows_label", "iu", n), ("rows_predicted", "iu", n),
                               ("rows_probability", "f", n), ("rows_explained", "f", n), ("rows_explained_keys", "U", None),
                               ("explained_keys", "U", None), ("failure_file", "U", None), ("failure_reason", "U", None),
                               ("not_image_file", "U", None), ("not_image_reason", "U", None)):
        value, ndim = arrays.get(key), 2 if key == "rows_explained" else 1  # rows_explained: (n, K)
        if not isinstance(value, np.ndarray) or value.dtype.kind not in kinds or value.ndim != ndim:
            return f"{key} is missing or not of its type"
        if length is not None and len(value) != length:
            return f"{key} has {len(value)} rows for {n} images"
    if arrays["rows_explained"].shape[1] != len(arrays["rows_explained_keys"]):
        return "rows_explained has not one column per key"
    if len(arrays["failure_file"]) != len(arrays["failure_reason"]) or \
            len(arrays["not_image_file"]) != len(arrays["not_image_reason"]):
        return "its skipped files and their reasons differ in number"
    if n + len(arrays["failure_file"]) != shard.size:
        return f"{n} images analysed and {len(arrays['failure_file'])} failed in a shard of {shard.size}"
    probability = arrays["rows_probability"]
    if not ((probability >= 0) & (probability <= 1)).all():  # NaN fails both
        return "rows_probability holds values outside 0..1"
    predicted, label = arrays["rows_predicted"], arrays["rows_label"]
    top = max(classes, 1) if classes else None  # without a head, top-1 indexes the pooled features
    if (predicted < 0).any() or (top is not None and (predicted >= top).any()):
        return "rows_predicted holds classes the model doesn't have"
    if (label < NO_LABEL).any() or (label >= max(classes, 1)).any():
        return "rows_label holds classes the model doesn't have"
    labelled, correct = array_scalar(arrays.get("labelled"), int), array_scalar(arrays.get("correct"), int)
    if labelled is None or correct is None or not 0 <= correct <= labelled <= n:
        return "labelled and correct are not counts of its images"
    confusion = arrays.get("confusion")
    if (not isinstance(confusion, np.ndarray) or confusion.dtype.kind not in "iu" or confusion.ndim != 2
            or confusion.shape[1] != 3 or (confusion < 0).any() or confusion[:, 2].sum() != labelled):
        return "confusion is not (true, predicted, images) rows over its labelled images"
    lens = arrays.get("lens_correct")
    if lens is not None and (lens.dtype.kind not in "iu" or lens.shape != (layers + 1,) or (lens < 0).any()
                             or (lens > labelled).any()):
        return f"lens_correct is not {layers + 1} counts of its labelled images"
    for i in range(len(arrays["explained_keys"])):
        problem = moments_problem(arrays, f"explained{i}", ())
        if problem:
            return problem
    lensed = arrays.get("lensed_keys", np.array([], dtype=str))
    if not isinstance(lensed, np.ndarray) or lensed.dtype.kind != "U" or lensed.ndim != 1:
        return "lensed_keys is not a list of names"
    files, reasons = (arrays.get(key, np.array([], dtype=str)) for key in ("lens_failure_file", "lens_failure_reason"))
    if not all(isinstance(v, np.ndarray) and v.dtype.kind == "U" and v.ndim == 1 for v in (files, reasons)) \
            or len(files) != len(reasons):
        return "lens_failure_file and lens_failure_reason are not one reason per file"
    for i in range(len(lensed)):  # a lens array's shape is the lens's own: its total's, checked against the rest
        problem = moments_problem(arrays, f"lensed{i}", moments_shape(arrays, f"lensed{i}"))
        if problem:
            return problem
    return None


def geometry_of(manifest: dict[str, Any]) -> Geometry:
    """The model's geometry as the manifest keeps it (JSON lists back to tuples)."""
    fields = {key: tuple(value) if isinstance(value, list) else value for key, value in manifest["geometry"].items()}
    return Geometry(**fields)


# ----------------------------------------------------------------------------------------------
# The parts on disk


class PartStore:
    """OUT/parts: the manifest and one part file per finished shard, each written atomically (vit_core.images.files).
    Another command keeps its parts the same way in a subclass that says what its manifest is (`problem`, `differences`)
    and writes its own arrays (`write_part`, `read_part`)."""

    command = "dataset"  # whose runs' parts these are, as the messages name it

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / PARTS

    @classmethod
    def found_in(cls, folder: Path) -> PartStore:
        """The store of a `dataset` run's output folder, or of its parts/ folder itself."""
        folder = Path(folder)
        return cls(folder.parent) if (folder / MANIFEST).is_file() else cls(folder)

    @property
    def start_again(self) -> Path:
        """The folder to remove to start the run again."""
        return self.path

    def problem(self, manifest: Any) -> str | None:
        """What makes a manifest read back unusable, in a few words, or None."""
        return manifest_problem(manifest)

    def differences(self, wanted: dict[str, Any], found: dict[str, Any]) -> list[str]:
        """What differs between two manifests' inputs, as the user names it."""
        return manifest_differences(wanted, found)

    def manifest(self) -> dict[str, Any] | None:
        """The manifest there, checked (`problem`), or None where there is none. Raises PartsError."""
        try:
            manifest = json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as e:
            raise PartsError(f"{self.path / MANIFEST} can't be read ({e}); remove {self.start_again} to start again.") from None
        problem = self.problem(manifest)
        if problem:
            raise PartsError(f"{self.path / MANIFEST} is not a `{self.command}` run's manifest ({problem}); remove "
                             f"{self.start_again} to start again.")
        return manifest

    def check(self, manifest: dict[str, Any]) -> bool:
        """Whether a manifest is there; PartsError, with what differs, when it names other inputs than `manifest`."""
        found = self.manifest()
        if found is None:
            return False
        differs = self.differences(manifest, found)
        if differs:
            raise PartsError(f"{self.path} holds parts of another run (it differs in: {', '.join(differs)}); "
                             "use another --out, or remove that folder to start again.")
        return True

    def open(self, manifest: dict[str, Any]) -> None:
        """Write the manifest, or check that the one there names the same inputs. Raises PartsError with what differs."""
        if self.check(manifest):
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
        self.write_part(shard, totals.arrays(), device, files_sha256)
        _logger.info("%s: %d images -> %s", shard.name, totals.num_images, self.part_path(shard))

    def write_part(self, shard: Shard, arrays: dict[str, np.ndarray], device: str, files_sha256: str) -> None:
        """A shard's arrays written atomically with what ties them to their run: the shard, the count of shards, the
        device that made them and the files' digest (`read_part` checks them); streamed into the file (`write_npz`),
        so a large part is never a second time in memory as bytes."""
        arrays = {**arrays, "shard": np.asarray(shard.number), "shards": np.asarray(shard.count),
                  "device": np.asarray(device), "files_sha256": np.asarray(files_sha256)}
        with OutputFolder(self.path) as out:
            out.write_with(self.part_path(shard).name, lambda file: write_npz(file, arrays))

    def read_part(self, shard: Shard, files_sha256: str) -> tuple[dict[str, np.ndarray], str]:
        """A part's arrays and the device that made them, checked to be this run's `shard` (not their contents).
        Raises PartsError for a part of another run, or one that can't be read."""
        with self.opened_part(shard, files_sha256) as (npz, device):
            try:
                return {key: npz[key] for key in npz.files}, device
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
                raise PartsError(f"{self.part_path(shard)} can't be read ({e or type(e).__name__}); remove it and run "
                                 "that shard again.") from None

    @contextlib.contextmanager
    def opened_part(self, shard: Shard, files_sha256: str) -> Iterator[tuple[np.lib.npyio.NpzFile, str]]:
        """A part opened, its arrays read only when asked for (a large one a piece at a time: export.npz_member), and
        the device that made it; checked to be this run's `shard` (not its contents). Raises PartsError for a part
        of another run, or one that can't be read."""
        path = self.part_path(shard)
        try:
            npz = np.load(path, allow_pickle=False)
            own = {key: npz[key] if key in npz.files else None for key in ("files_sha256", "shards", "shard", "device")}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # EOFError: a 0-byte file
            raise PartsError(f"{path} can't be read ({e or type(e).__name__}); remove it and run that shard again.") from None
        with npz:
            if any(array_scalar(value, str if key in ("files_sha256", "device") else int) is None
                   for key, value in own.items()):
                raise PartsError(f"{path} is not a shard's part (it lacks its run's digest, shard or device); remove it "
                                 "and run that shard again.")
            if (str(own["files_sha256"]) != files_sha256 or int(own["shards"]) != shard.count
                    or int(own["shard"]) != shard.number):
                raise PartsError(f"{path} belongs to another run; remove it and run that shard again.")
            yield npz, str(own["device"])

    def read(self, shard: Shard, files_sha256: str, geometry: Geometry | None = None) -> tuple[Totals, str]:
        """A part's totals and the device that made them, its arrays checked against the model's `geometry` (default:
        the manifest's) and the shard's size (`part_problem`). Raises PartsError for a part of another run, or one
        that is damaged."""
        if geometry is None:
            manifest = self.manifest()
            if manifest is None:
                raise PartsError(f"No {MANIFEST} in {self.path}: not the output of a `dataset` run.")
            geometry = geometry_of(manifest)
        arrays, device = self.read_part(shard, files_sha256)
        problem = part_problem(arrays, geometry, shard)
        if problem:
            raise PartsError(f"{self.part_path(shard)} is damaged ({problem}); remove it and run that shard again.")
        return Totals.from_arrays(arrays), device


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
        differs = manifest_differences(first, manifest)
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
        part, device = holder[shard.number].read(shard, first["files_sha256"], geometry_of(first))
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
               tests: Sequence[str] | None = None, masks: Masks | None = None, progress: Progress | None = None,
               lenses: Sequence[Lens] = (), forwards: int | None = None) -> None:
    """Analyse the shards `todo` of `plan` in this process and write each one's part as soon as it is done.
    One DataLoader serves them all (its batches stop at the shards' edges), so worker processes start once;
    `forwards` at once on a CPU (`reduce_sources`)."""
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
                                         masks=masks, progress=progress, lenses=lenses, forwards=forwards, **kwargs):
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
