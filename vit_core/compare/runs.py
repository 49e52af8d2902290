"""A comparison's run over a folder: both models' plans (dataset's `plan_run`: the same images and shards, each
model's own labels), the manifests, the shards to do, and the files once every shard is done."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..dataset import (
    DatasetError,
    DatasetResult,
    PartsError,
    Shard,
    Totals,
    class_names,
    consecutive_batches,
    dataset_files,
    manifest_of,
    merged_result,
    plan_run,
    result_of,
)
from ..images.files import OutputFolder
from ..loading.model import LoadedModel
from ..runtime.devices import describe_device
from .engine import (
    MODELS,
    CompareStore,
    Explain,
    Pair,
    Progress,
    merged_compare,
    pair_batch_size,
    pair_manifest,
    reduce_sources_pair,
)
from .files import ConceptsOutcome, compare_files
from .sums import CompareTotals

NO_IMAGES = "There are no images to analyse."


@dataclass(frozen=True)
class CompareRun:
    pair: Pair
    store: CompareStore
    manifest: dict[str, Any]

    @property
    def shards(self) -> tuple[Shard, ...]:
        return self.pair.plan_a.shards

    @property
    def files_sha256(self) -> str:
        return self.manifest["a"]["files_sha256"]


def plan_compare(a: LoadedModel, b: LoadedModel, folder: Path, out: Path, *, limit: int | None = None,
                 num_shards: int | None = None, weights: tuple[Path | None, Path | None] = (None, None),
                 labels: tuple[Path | None, Path | None] = (None, None), explain: Explain | None = None) -> CompareRun:
    """The run's plan and its manifests opened in `out` (written, or checked against those there: PartsError says what
    differs). Raises DatasetError without images, ShardError for more shards than images."""
    store = CompareStore(out)
    found = store.manifest()
    resumed = (found or {}).get("shards")
    plans = [plan_run(loaded, folder, limit=limit, num_shards=num_shards, outputs=out / side, resumed_shards=resumed)
             for loaded, side in zip((a, b), MODELS, strict=True)]
    if not plans[0].paths:
        raise DatasetError(NO_IMAGES)
    settings = {"explain": True, "steps": explain.steps, "tests": explain.tests} if explain else {}
    manifests = [manifest_of(loaded, plan, weights_file=w, labels_file=lab, limit=limit, **settings)
                 for loaded, plan, w, lab in zip((a, b), plans, weights, labels, strict=True)]
    manifest = pair_manifest(*manifests)
    store.open(manifest)
    return CompareRun(Pair(a, b, plans[0], plans[1]), store, manifest)


def finished(run: CompareRun) -> tuple[DatasetResult, DatasetResult, CompareTotals]:
    """Every shard's parts merged: A's and B's dataset results and the comparison's totals. Raises PartsError, DatasetError."""
    results = [merged_result([store])[0] for store in run.store.stores]
    return results[0], results[1], merged_compare(run.store, run.shards, run.files_sha256)


def write_files(run: CompareRun, out: OutputFolder, table: str = "csv", concepts: ConceptsOutcome | None = None
                ) -> tuple[DatasetResult, DatasetResult, dict[str, bytes]]:
    """DIR/a and DIR/b (dataset's files of each model) and the comparison's files in `out` (compare.json with
    `concepts`, --concepts-layer's outcome); the two results and the comparison's files. Raises OSError for a file
    that can't be written."""
    a, b, totals = finished(run)
    for side, result, loaded in zip(MODELS, (a, b), (run.pair.a, run.pair.b), strict=True):
        with OutputFolder(out.path / side) as folder:
            for name, data in dataset_files(result, loaded.geometry, table).items():
                folder.write(name, data)
    files = compare_files(a, b, totals, run.pair.which, concepts)
    for name, data in files.items():
        out.write(name, data)
    return a, b, files


def todo_of(run: CompareRun, shard: tuple[int, int] | None) -> tuple[list[Shard], list[Shard]]:
    """(the shards asked for, those of them not done yet)."""
    asked = [run.shards[shard[0] - 1]] if shard else list(run.shards)
    done = run.store.done(run.shards)
    return asked, [s for s in asked if s.number not in done]


def compare_sources(a: LoadedModel, b: LoadedModel, sources: Sequence[tuple[str, Any]],
                    labels: tuple[Sequence[int | None] | None, Sequence[int | None] | None] = (None, None), *,
                    batch_size: int | None = None, progress: Progress | None = None
                    ) -> tuple[DatasetResult, DatasetResult, CompareTotals]:
    """Two models over `sources` ((name, bytes or path) each) in this process (a notebook, the dashboard's Compare
    tab): A's and B's dataset results and the comparison's totals. Raises DatasetError when no image could be read."""
    if not sources:
        raise DatasetError(NO_IMAGES)
    batches = consecutive_batches(0, len(sources), batch_size or pair_batch_size(a.device))
    totals, compared = (Totals(), Totals()), CompareTotals()
    for _, ta, tb, _ in reduce_sources_pair(a, b, sources, labels, batches, progress=progress,
                                            into=lambda batch: compared):  # every batch's comparison into one
        totals[0].merge(ta)
        totals[1].merge(tb)
    if not compared.file:
        first = totals[0].failures[0] if totals[0].failures else ("", "")
        raise DatasetError(f"None of the {len(sources)} images could be read by both models ({first[0]}: {first[1]}).")
    device = describe_device(a.device)
    results = tuple(result_of(t, model=m.name, weights=m.weights, device=device, class_names=class_names(m))
                    for t, m in zip(totals, (a, b), strict=True))
    return results[0], results[1], compared


__all__ = ["compare_sources", "CompareRun", "PartsError", "finished", "plan_compare", "todo_of", "write_files"]
