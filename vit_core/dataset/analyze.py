"""Analysing a set of images in this process: batches decoded (in DataLoader workers or here), reduced on the
model's device, and added up (`Totals`); `analyze_dataset` is the whole of it for a list of images.

`explained_values` is the one place that says what `--explain` adds per image: a flat dict of named scalars.
Everything after it (the means and spreads, the per-image table's columns, the shards' merge, Ray) treats every
key alike, so another faithfulness test is a change to that function only.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import explain as explanations
from ..errors import ImageError, ViTLensError
from ..export import EXPORT_TESTS
from ..images import MAX_FILE_BYTES, UPLOAD_EXTENSIONS, load_image
from ..images.files import read_input
from ..lenses import Lens
from ..loading.model import LoadedModel
from ..runtime.devices import describe_device
from .reductions import LensedImage, Source, default_batch_size, image_loader, patch_distances_on, reduce_batch
from .result import DatasetResult, result_of
from .totals import ExactMoments, Totals
from .workers import ForwardPool, forward_pool, pool_width

_logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (files done, files in all)


class DatasetError(ViTLensError, ValueError):
    """A set of images that gives nothing to analyse: no images at all, or none that could be read."""


def explained_values(loaded: LoadedModel, source: bytes | Path, steps: int, *, tests: Sequence[str] = EXPORT_TESTS,
                     mask: np.ndarray | None = None) -> dict[str, float]:
    """The named per-image scalars of `--explain` for one image (decoded again here: it needs gradients, one image
    at a time): every relevance method's map (the LRP rule chosen on the image) under each of `tests` beside the
    random baseline, and with `mask` (the object (H, W) bool of the image) the localisation metrics, as
    explain.judgement_scalars names them: <test>_<method>, <test>_random, <test>_random_std, beats_random_<test>_<method>
    (analyses.md, "Which to trust here"); the target the top-1 (as explanations default to). Raises ImageError."""
    image = load_image(source, loaded.decode_min_side)
    relevance = explanations.relevance_maps(loaded, image)
    objects = None if mask is None else explanations.object_patches(loaded, mask, image.size)
    judged = explanations.judge(loaded, image, relevance.maps, relevance.target, mask=objects, steps=steps, tests=tests,
                                reuse=relevance.choice_sets)
    return explanations.judgement_scalars(judged)


@dataclass(frozen=True)
class MaskFolder:
    """Object masks beside a folder of images (`dataset --masks DIR`): the mask of FOLDER/a/b.jpg is DIR/a/b with any
    image suffix (the first in images.UPLOAD_EXTENSIONS' order that exists); an image without one has no localisation
    scores. Picklable, so Ray's workers get it."""

    images: Path
    masks: Path

    def mask_for(self, source: Source) -> np.ndarray | None:
        """The object mask (H, W) bool of the image `source` (its path), None where it has none. Raises ImageError
        (MaskError) for a mask that is there but can't be used."""
        _, where = source
        if not isinstance(where, Path) or not where.resolve().is_relative_to(self.images):
            return None
        stem = self.masks / where.resolve().relative_to(self.images).with_suffix("")
        for extension in UPLOAD_EXTENSIONS:
            for candidate in (stem.with_name(f"{stem.name}.{extension}"), stem.with_name(f"{stem.name}.{extension.upper()}")):
                if candidate.is_file():
                    return explanations.mask_from_file(read_input(candidate, MAX_FILE_BYTES))
        return None


@dataclass(frozen=True)
class MasksByName:
    """Object masks of images given as bytes (the Many images page's Shapes batch: the generator's silhouettes), by
    image name."""

    masks: dict[str, np.ndarray]

    def mask_for(self, source: Source) -> np.ndarray | None:
        return self.masks.get(source[0])


Masks = MaskFolder | MasksByName


def class_names(loaded: LoadedModel) -> tuple[str, ...]:
    """The model's class names in head order, for the tables (`LoadedModel.label`); () without a classifier head."""
    return tuple(loaded.label(i) for i in range(loaded.geometry.num_classes))


def check_labels(loaded: LoadedModel, sources: Sequence[Source], labels: Sequence[int | None] | None) -> None:
    num_classes = loaded.geometry.num_classes
    if labels is not None and len(labels) != len(sources):
        raise ValueError(f"{len(labels)} labels for {len(sources)} images")
    if labels is not None and any(label is not None and not 0 <= label < num_classes for label in labels):
        raise ValueError(f"a label is outside the model's classes 0..{num_classes - 1}")


def consecutive_batches(start: int, stop: int, batch_size: int) -> list[range]:
    """The indices start..stop-1 in batches of `batch_size` (the last one shorter)."""
    return [range(first, min(first + batch_size, stop)) for first in range(start, stop, batch_size)]


def add_lensed_image(totals: Totals, name: str, lensed: LensedImage) -> None:
    """One image's lens arrays added to `totals`' moments (each array as one image's), and a line of `lens_failures`
    for each lens that raised on it: what every engine adds per image, in image order."""
    for key, array in lensed.arrays.items():
        one = ExactMoments()
        one.add(np.asarray(array, dtype=np.float64)[None])  # (...) -> (1, ...): one image
        totals.add_lensed(key, one)
    totals.lens_failures.extend((name, sentence) for sentence in lensed.failed)


def reduce_sources(loaded: LoadedModel, sources: Sequence[Source], labels: Sequence[int | None] | None,
                   batches: Sequence[Sequence[int]], *, workers: int = 0, explain: bool = False,
                   steps: int = explanations.DEFAULT_STEPS, tests: Sequence[str] = EXPORT_TESTS,
                   masks: Masks | None = None, progress: Progress | None = None, lenses: Sequence[Lens] = (),
                   forwards: int | None = None, pool: ForwardPool | None = None) -> Iterator[tuple[list[int], Totals]]:
    """For each batch of `batches` (indices into `sources`, in order): its indices and the totals of its images.

    Decoded by `workers` processes (0: in this one), hooked forwards reduced on the model's device, on a CPU
    `forwards` at once (default `workers.model_workers`: the CPUs this process may use), each at one torch
    thread; the logit lens runs when some label is known. With `explain`, `explained_values` of each image (one at a
    time, after its batch). With `lenses`, each image's lens arrays, read on the same forward, added to the totals'
    moments; a lens that raises is a line of that image in `lens_failures` (its other values kept). A file that
    can't be used is a failure of its totals (and of the explanation alone when only that fails).
    progress(done, total) counts files: a batch's failures at once, each image when its values are in. `pool`: the
    forwards' pool when the caller keeps one across calls (a page's chunks share one trace of the forward); by default
    one of `forwards` workers for this call."""
    logit_lens = labels is not None and any(label is not None for label in labels)
    distance = patch_distances_on(loaded.geometry, loaded.device)
    loader = image_loader(loaded, sources, 0, workers, batches=batches, crops=bool(lenses))
    report = progress or (lambda done, total: None)
    total, done = sum(len(batch) for batch in batches), 0

    def analysed(images: int) -> None:  # each forward's images, as their values come in
        nonlocal done
        done += images
        report(done, total)

    width = pool_width(loaded.device, total, forwards)
    with contextlib.nullcontext(pool) if pool is not None else forward_pool(loaded, width) as pool:
        for batch, decoded in zip(batches, loader, strict=True):
            indices, x, failed = decoded[:3]
            crops = decoded[3] if lenses else None  # uint8 (B', H, W, 3): what each image's capture shows
            totals = Totals()
            for index, reason in failed:
                totals.failures.append((sources[index][0], reason))
                _logger.info("skipped %s: %s", sources[index][0], reason)
            done += len(failed)
            if x is None:
                report(done, total)
                yield list(batch), totals
                continue
            values = reduce_batch(loaded, x, logit_lens, distance, pool=pool, lenses=lenses, crops=crops,
                                  analysed=None if explain else analysed)  # explained: counted below, one by one
            read = indices.tolist()
            explained: list[dict[str, float]] = []
            for index in read if explain else ():
                try:  # decoded again here: a file on disk can change (or vanish) after its batch was read
                    mask = None if masks is None else masks.mask_for(sources[index])
                    explained.append(explained_values(loaded, sources[index][1], steps, tests=tests, mask=mask))
                except ImageError as e:
                    explained.append({})
                    totals.failures.append((sources[index][0], f"No explanation: {e}"))
                done += 1
                report(done, total)
            totals.add_batch([sources[i][0] for i in read], [labels[i] for i in read] if logit_lens else None,
                             values, explained if explain else None)
            for index, lensed in zip(read, values.lensed or (), strict=False):
                add_lensed_image(totals, sources[index][0], lensed)
            yield list(batch), totals


def analyze_dataset(loaded: LoadedModel, sources: Sequence[Source], labels: Sequence[int | None] | None = None, *,
                    batch_size: int | None = None, workers: int = 0, explain: bool = False,
                    steps: int = explanations.DEFAULT_STEPS, tests: Sequence[str] = EXPORT_TESTS,
                    masks: Masks | None = None, progress: Progress | None = None, forwards: int | None = None
                    ) -> DatasetResult:
    """The dataset-level values of `sources` ((name, file bytes or path) each): per image, one hooked forward
    in batches of `batch_size` (default: `default_batch_size` of the model's device) reduced on the model's device,
    then means (and spreads) over images, a per-image table, per-class counts.

    labels: one true class (or None) per source, for accuracy, logit-lens accuracy and the confusion counts (the
    logit lens runs only when some label is known). workers: DataLoader worker processes that decode (0: in this
    process; they are forked on Linux, so a multi-threaded server is safer with 0). explain: also
    `explained_values` per image (`tests`; the localisation metrics where `masks` has the image's mask; one at a
    time: it needs gradients; the image is decoded again in this process), averaged over images. forwards: on a
    CPU, forwards at once, each at one torch thread (default `workers.model_workers`); the values are the same bits
    whatever it is. progress(done, total) in files (see `reduce_sources`). Unreadable images are skipped and
    listed in `failures`. Raises DatasetError when no image could be analysed, CaptureError for a model whose
    attention bypasses timm's standard path.
    """
    if not sources:
        raise DatasetError("There are no images to analyse.")
    totals = analyze_totals(loaded, sources, labels, batch_size=batch_size, workers=workers, explain=explain, steps=steps,
                            tests=tests, masks=masks, progress=progress, forwards=forwards)
    return dataset_result(loaded, totals, len(sources))


def analyze_totals(loaded: LoadedModel, sources: Sequence[Source], labels: Sequence[int | None] | None = None, *,
                   batch_size: int | None = None, workers: int = 0, explain: bool = False,
                   steps: int = explanations.DEFAULT_STEPS, tests: Sequence[str] = EXPORT_TESTS,
                   masks: Masks | None = None, progress: Progress | None = None, forwards: int | None = None,
                   pool: ForwardPool | None = None) -> Totals:
    """`analyze_dataset`'s totals, before they become a result: what a part of a larger set adds (merge them with
    `Totals.merge`, then `dataset_result`); `pool` as `reduce_sources` takes it. No image that could be read is not
    an error here."""
    check_labels(loaded, sources, labels)
    batches = consecutive_batches(0, len(sources), batch_size or default_batch_size(loaded.device))
    totals = Totals()
    for _, batch in reduce_sources(loaded, sources, labels, batches, workers=workers, explain=explain, steps=steps,
                                   tests=tests, masks=masks, progress=progress, forwards=forwards, pool=pool):
        totals.merge(batch)
    return totals


def dataset_result(loaded: LoadedModel, totals: Totals, num_files: int, device: str | None = None) -> DatasetResult:
    """The result of `totals` for `loaded`'s model; DatasetError when none of the `num_files` images was analysed."""
    if totals.num_images == 0:
        failures = totals.failures
        first = f" (first: {failures[0][0]}: {failures[0][1]})" if failures else ""
        raise DatasetError(f"None of the {num_files} images could be read{first}.")
    return result_of(totals, model=loaded.name, weights=loaded.weights, device=device or describe_device(loaded.device),
                     class_names=class_names(loaded))
