"""The token collection on Ray Data (`vit-lens concepts --engine ray`): the dataset engine's decoding stage and
model-spec workers (vit_core.dataset.ray_engine), with a model stage that returns patch tokens instead of reductions.

    files (driver) -> DecodeStage (CPU actors) -> TokenStage (one model per worker: crops -> tokens after block L)
    -> driver: per shard, sorted by image, checked to hold each image once, written as the shard's chunks

Ray is imported only inside these functions (an optional dependency: `pip install "vit-lens[ray]"`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..dataset.listing import Shard
from ..dataset.ray_engine import ModelSpec, RayPlan, RayRunError, decoded_crops, worker_device
from ..dataset.runs import RunPlan
from ..loading.model import LoadedModel
from .collect import CHUNK_BYTES, Progress, TokenStore, check_layer, patch_tokens


class TokenStage:
    """Model stage: the model built once per worker from its spec; per batch the patch tokens after block `layer`
    (float32 (B, N, D), zeros where the file failed)."""

    def __init__(self, spec: ModelSpec, layer: int, threads: int | None = None) -> None:
        self.loaded, self.layer = spec.load(worker_device(threads)), layer

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch
        from PIL import Image

        g = self.loaded.geometry
        errors = [str(e) for e in batch["error"]]
        good = [row for row in range(len(errors)) if not errors[row]]
        tokens = np.zeros((len(errors), g.num_patches, g.embed_dim), dtype=np.float32)  # (B, N, D)
        if good:
            x = torch.stack([self.loaded.tensor_transform(Image.fromarray(batch["crop"][row])) for row in good])
            tokens[good] = patch_tokens(self.loaded, x, self.layer)
        return {"index": batch["index"], "tokens": tokens, "error": np.array(errors, dtype=object)}


def collect_shards_on_ray(spec: ModelSpec, loaded: LoadedModel, plan: RunPlan, layer: int, store: TokenStore,
                          todo: Sequence[Shard], *, workers: RayPlan, batch_size: int, threads: int | None = None,
                          chunk_bytes: int = CHUNK_BYTES, progress: Progress | None = None) -> None:
    """`collect.collect_shards` on the Ray cluster this process is connected to (`ray_engine.ray_session`)."""
    import ray.data

    check_layer(loaded, layer)
    ray.data.DataContext.get_current().enable_progress_bars = False
    for shard in todo:
        if shard.size == 0:
            store.writer(shard, chunk_bytes).finish()
    todo = [shard for shard in todo if shard.size]
    if not todo:
        return
    crops = decoded_crops(ray, loaded, plan, todo, batch_size, workers)
    tokens = crops.map_batches(
        TokenStage, fn_constructor_kwargs={"spec": spec, "layer": layer, "threads": threads}, batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=workers.model_workers), num_cpus=1,
        num_gpus=workers.gpus_per_worker or None)
    starts = np.array([shard.start for shard in todo])
    received: dict[int, list[dict[str, np.ndarray]]] = {shard.number: [] for shard in todo}
    count = {shard.number: 0 for shard in todo}
    total, done = sum(shard.size for shard in todo), 0
    try:
        for batch in tokens.iter_batches(batch_size=None, batch_format="numpy"):
            owners = np.searchsorted(starts, batch["index"], side="right") - 1  # (B,): positions in `todo`
            for position in np.unique(owners):
                shard, rows = todo[position], owners == position
                received[shard.number].append({key: value[rows] for key, value in batch.items()})
                count[shard.number] += int(rows.sum())
                if count[shard.number] == shard.size:
                    _write_shard(plan, shard, received.pop(shard.number), store, chunk_bytes)
            done += len(batch["index"])
            if progress:
                progress(done, total)
    except ray.exceptions.RayError as e:
        raise RayRunError(f"Ray could not finish the collection: {str(e).splitlines()[0]}") from None
    if received:
        raise RayRunError(f"Ray returned too few images for shards {sorted(received)}; run the command again.")


def _write_shard(plan: RunPlan, shard: Shard, pieces: list[dict[str, np.ndarray]], store: TokenStore,
                 chunk_bytes: int) -> None:
    rows = {key: np.concatenate([piece[key] for piece in pieces]) for key in pieces[0]}
    order = np.argsort(rows["index"], kind="stable")
    if not np.array_equal(rows["index"][order], np.arange(shard.start, shard.stop)):
        raise RayRunError(f"Ray returned the images of {shard.name} other than once each; run the command again.")
    writer = store.writer(shard, chunk_bytes)
    names = plan.names
    for row in order:
        index, error = int(rows["index"][row]), str(rows["error"][row])
        if error:
            writer.failures.append((names[index], error))
        else:
            writer.add(index, rows["tokens"][row])
    writer.finish()
