"""`vit-lens compare --engine ray`: dataset's Ray engine (vit_core.dataset.ray_engine) with two models.

    files (driver) -> PairDecodeStage (CPU actors: a file -> each model's crop, uint8, decoded once for both)
    -> PairStage (both models in each worker, built from their ModelSpecs: per batch, and per shard within it,
       `pair_batch` as the one-process run calls it: each model's values per image, the comparison's sums)
    -> driver: per shard, each model's rows sorted by image and added up as dataset's Ray driver adds them
       (shard_totals), the comparison's sums merged (exact in any order) and its per-image rows put in the run's
       order; the three parts written as run_pair_shards writes them, so the files are the same bits.

A batch's comparison sums travel to the driver once per shard it touches; their size is set by the models (the
widths squared, for every pair of residual rows), not by the batch, so larger batches mean fewer of them. Ray is
imported only inside these functions (an optional dependency).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..dataset.listing import Shard
from ..dataset.ray_engine import ModelSpec, RayPlan, finished_shards, shard_totals, value_columns, worker_device
from ..dataset.reductions import patch_distances_on
from ..dataset.runs import shard_start
from ..dataset.workers import replica
from ..export import npz_bytes
from ..runtime.devices import describe_device
from .engine import MODELS, CompareStore, Explain, Pair, Progress, joined_values, logit_lens_of, pair_batch, pair_crops
from .sums import CompareTotals


class PairDecodeStage:
    """CPU stage: a batch's files -> each model's crop, uint8 (B, H, W, 3) (zeros where that model can't have the
    file), and why not ("" when it can), in the columns "a_crop", "a_error", "b_crop", "b_error"."""

    def __init__(self, sides: Sequence[int], crop_transforms: Sequence[Callable], input_sizes: Sequence[tuple[int, int]]
                 ) -> None:
        self.sides, self.crop_transforms, self.input_sizes = tuple(sides), tuple(crop_transforms), tuple(input_sizes)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(batch["path"])
        crops = [np.zeros((count, *size, 3), dtype=np.uint8) for size in self.input_sizes]  # (B, H, W, 3) per model
        errors: list[list[str]] = [[], []]
        for row, path in enumerate(batch["path"]):
            for side, crop in enumerate(pair_crops(Path(str(path)), self.sides, self.crop_transforms)):
                errors[side].append(crop if isinstance(crop, str) else "")
                if not isinstance(crop, str):
                    crops[side][row] = np.asarray(crop, dtype=np.uint8)  # PIL RGB (H, W) -> (H, W, 3)
        out = {key: batch[key] for key in ("index", "name", "path")}
        for side, name in enumerate(MODELS):
            out[f"{name}_crop"], out[f"{name}_error"] = crops[side], np.array(errors[side], dtype=object)
        return out


class PairStage:
    """Model stage: both models built once per worker from their specs, on the one device Ray gave it; per batch, the
    rows of each shard in it through `pair_batch`. Returns each model's columns as dataset's model stage does
    (value_columns, "error", "explained", "explain_error"), named "a_..." and "b_...", and "compared": on the first
    row of each shard's rows the comparison's sums of those rows (CompareTotals as .npz bytes), b"" on the others."""

    def __init__(self, specs: tuple[ModelSpec, ModelSpec], logit_lens: tuple[bool, bool], explain: Explain | None,
                 starts: Sequence[int], threads: int | None = None) -> None:
        device = worker_device(threads)
        self.models = tuple(spec.load(device) for spec in specs)
        self.own = tuple(replica(loaded) for loaded in self.models)
        self.distances = tuple(patch_distances_on(loaded.geometry, loaded.device) for loaded in self.models)
        self.device = describe_device(self.models[0].device)
        self.logit_lens, self.explain, self.starts = logit_lens, explain, np.asarray(starts)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from PIL import Image

        indices = [int(i) for i in batch["index"]]
        count = len(indices)
        sources = {i: (str(name), Path(str(path))) for i, name, path in zip(indices, batch["name"], batch["path"],
                                                                           strict=True)}
        inputs = [[str(error) or loaded.tensor_transform(Image.fromarray(crop))  # (3, H, W), or why not
                   for error, crop in zip(batch[f"{name}_error"], batch[f"{name}_crop"], strict=True)]
                  for name, loaded in zip(MODELS, self.models, strict=True)]
        items = list(zip(indices, *inputs, strict=True))
        owners = np.searchsorted(self.starts, indices, side="right") - 1  # (B,): each row's shard
        compared = [b""] * count
        rows_of: list[list[int]] = [[], []]  # per model, the rows it has values of, and those values
        values_of: list[list[Any]] = [[], []]
        text: dict[str, list[str]] = {f"{name}_{key}": [""] * count for name in MODELS
                                      for key in ("error", "explained", "explain_error")}
        for owner in np.unique(owners):
            rows = [row for row in range(count) if owners[row] == owner]
            paired = pair_batch(self.models, self.own, sources, [items[row] for row in rows], self.logit_lens,
                                self.distances, self.explain)
            compared[rows[0]] = npz_bytes(paired.compared.arrays())
            for row in rows:
                index = indices[row]
                for side, name in enumerate(MODELS):
                    values = paired.values.get(index, (None, None))[side]
                    if values is not None:
                        rows_of[side].append(row)
                        values_of[side].append(values)
                    text[f"{name}_error"][row] = paired.unread[side].get(index, "")
                    text[f"{name}_explain_error"][row] = paired.unexplained[side].get(index, "")
                    if paired.explained and index in paired.explained[side]:
                        text[f"{name}_explained"][row] = json.dumps(paired.explained[side][index])
        out = {"index": batch["index"], "compared": np.array(compared, dtype=object),
               "device": np.array([self.device] * count, dtype=object)}
        for side, (name, loaded) in enumerate(zip(MODELS, self.models, strict=True)):
            values = joined_values(values_of[side]) if rows_of[side] else None
            columns = value_columns(loaded.geometry, count, rows_of[side], values)
            out |= {f"{name}_{key}": value for key, value in columns.items()}
        return out | {key: np.array(value, dtype=object) for key, value in text.items()}


def _one_model(pieces: list[dict[str, np.ndarray]], name: str) -> list[dict[str, np.ndarray]]:
    """The model stage's rows of one model ("a" or "b"), named as dataset's model stage names them."""
    prefix = f"{name}_"
    return [{"index": piece["index"], "device": piece["device"],
             **{key.removeprefix(prefix): value for key, value in piece.items() if key.startswith(prefix)}}
            for piece in pieces]


def shard_compared(pieces: list[dict[str, np.ndarray]], position: dict[str, int]) -> CompareTotals:
    """A shard's comparison from the model stage's rows: the sums of its pieces merged (exact, in any order), the
    per-image rows in the run's order (`position`: each image's index by name)."""
    totals = CompareTotals()
    for piece in pieces:
        for data in piece["compared"]:
            if len(data):
                with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                    totals.merge_npz(npz)
    order = sorted(range(len(totals.file)), key=lambda k: position[totals.file[k]])
    totals.file = [totals.file[k] for k in order]
    totals.kl = [totals.kl[k] for k in order]
    totals.rollout_correlation = [totals.rollout_correlation[k] for k in order]
    return totals


def run_pair_shards_on_ray(specs: tuple[ModelSpec, ModelSpec], pair: Pair, store: CompareStore, todo: Sequence[Shard],
                           files_sha256: str, *, workers: RayPlan, batch_size: int, explain: Explain | None = None,
                           threads: int | None = None, progress: Progress | None = None) -> None:
    """`engine.run_pair_shards` on the Ray cluster this process is connected to (dataset's `ray_session`): the shards
    `todo` of the pair's plans, each one's three parts written by this process as soon as all its images are back.
    `pair`: the models on this machine, for their transforms and class names (the workers build their own from
    `specs`, A's and B's)."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False  # this command reports progress itself
    plan_a, plan_b = pair.plan_a, pair.plan_b
    device = describe_device(pair.a.device)
    for shard in todo:
        if shard.size == 0:
            store.write(shard, (shard_start(plan_a, shard), shard_start(plan_b, shard)), CompareTotals(), device,
                        files_sha256)
    todo = [shard for shard in todo if shard.size]
    if not todo:
        return
    names = plan_a.names
    logit_lens = logit_lens_of((plan_a.labels, plan_b.labels))
    items = [{"index": i, "name": names[i], "path": os.path.abspath(plan_a.paths[i])}
             for shard in todo for i in range(shard.start, shard.stop)]
    models = (pair.a, pair.b)
    crops = ray.data.from_items(items).map_batches(
        PairDecodeStage, fn_constructor_kwargs={
            "sides": [m.decode_min_side for m in models], "crop_transforms": [m.crop_transform for m in models],
            "input_sizes": [tuple(m.data_config["input_size"][1:]) for m in models]},
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=workers.decoders), num_cpus=1)
    values = crops.map_batches(
        PairStage, fn_constructor_kwargs={"specs": specs, "logit_lens": logit_lens, "explain": explain,
                                          "starts": [shard.start for shard in todo], "threads": threads},
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=workers.model_workers), num_cpus=1,
        num_gpus=workers.gpus_per_worker or None)
    position = {name: i for i, name in enumerate(names)}
    for shard, pieces in finished_shards(values, todo, progress):
        totals_a, devices = shard_totals(plan_a, shard, _one_model(pieces, "a"), logit_lens[0])
        totals_b, _ = shard_totals(plan_b, shard, _one_model(pieces, "b"), logit_lens[1])
        store.write(shard, (totals_a, totals_b), shard_compared(pieces, position), devices, files_sha256)
