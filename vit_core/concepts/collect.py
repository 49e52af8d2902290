"""Collecting the residual stream after block L for every patch token of a folder's images, in shards on disk.

The folder is planned, listed and sharded by the dataset engine (`vit_core.dataset.plan_run`: the same sorted
images, the same shards, the same files skipped with their reason), its images decoded by the engine's loader
(DataLoader workers, or the Ray engine's decoding stage). Each forward runs only blocks 0..L and has the engine's
fixed number of images (`forward_images`), so an image's tokens are the same bits whatever its batch, shard or engine.

    DIR/tokens/manifest.json                       the run's inputs: model, weights, layer, the files, --limit, shards
    DIR/tokens/shard-0002-of-0004/tokens-00000.npy  float32 (n * N, D): the patch tokens of n images, row-major by patch
    DIR/tokens/shard-0002-of-0004/images-00000.npy  int64 (n,): those images' indices in the run's sorted list
    DIR/tokens/shard-0002-of-0004/done.json         written last: the chunks, and the images that failed with why

A shard's tokens are cut into chunks of at most `chunk_bytes`; training reads them into memory when all fit in
its memory budget, else maps them from disk one chunk at a time (vit_core.concepts.learn). A shard whose done.json is
there is skipped by a rerun, so a killed collection resumes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import bounded_json
from ..dataset.analyze import consecutive_batches
from ..dataset.listing import Shard, files_digest
from ..dataset.reductions import forward_images, image_loader, padded_forwards
from ..dataset.runs import RunPlan
from ..dataset.workers import ForwardPool, forward_pool, map_forwards, model_workers
from ..explain.interventions import embedded_tokens
from ..explain.passes import model_pass
from ..images.files import OutputFolder
from ..loading.model import LoadedModel
from .sae import ConceptsError

_logger = logging.getLogger(__name__)

TOKENS = "tokens"  # the collection's folder inside DIR
MANIFEST = "manifest.json"
DONE = "done.json"
FORMAT = "vit-lens concept tokens 1"
CHUNK_BYTES = 256 * 2 ** 20  # the largest chunk file: a shard's tokens held in memory before they are written
HELD_OUT_SHARE = 0.1
MAX_JSON_BYTES = 2**20  # manifest.json (the run's inputs); done.json has 4 KB more per image for its failures

Progress = Callable[[int, int], None]  # (images done, images in all)


def check_layer(loaded: LoadedModel, layer: int) -> None:
    if not 0 <= layer < loaded.geometry.num_layers:
        raise ConceptsError(f"--layer {layer}: {loaded.name} has blocks 0..{loaded.geometry.num_layers - 1}.")


def residual_after(loaded: LoadedModel, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual stream after block `layer` (before the final norm: `Capture.tokens[layer + 1]`), running only
    blocks 0..layer. (B, 3, H, W) on the model's device -> (B, T, D). Call inside `model_pass`."""
    return residuals_after(loaded, x, (layer,))[0]


def residuals_after(loaded: LoadedModel, x: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
    """The residual stream after each of the increasing blocks `layers`, from one pass through blocks 0..max(layers):
    (B, 3, H, W) -> one (B, T, D) per layer, each the same bits as `residual_after` of that layer alone."""
    model = loaded.model
    tokens = model.norm_pre(model.patch_drop(embedded_tokens(model, x)))  # (B, T, D), entering block 0
    found = []
    for number, block in enumerate(model.blocks[:max(layers) + 1]):
        tokens = block(tokens)
        if number in layers:
            found.append(tokens)
    return found


def patch_tokens(loaded: LoadedModel, x: torch.Tensor, layer: int, pool: ForwardPool | None = None) -> np.ndarray:
    """The patch tokens after block `layer` of a batch x (B, 3, H, W): float32 (B, N, D) on the host. Forwards of
    `forward_images` images each (a short one padded with zero images), so an image's bits don't depend on its batch;
    on `pool`'s workers, several at once (the dataset engine's `forward_pool`), else one after another here."""
    return patch_tokens_of_layers(loaded, x, (layer,), pool)[0]


def patch_tokens_of_layers(loaded: LoadedModel, x: torch.Tensor, layers: Sequence[int],
                           pool: ForwardPool | None = None, analysed: Callable[[int], None] | None = None
                           ) -> list[np.ndarray]:
    """`patch_tokens` after each of the increasing blocks `layers`, from one forward per chunk: one float32 (B, N, D)
    per layer. analysed(n), in this thread, as each forward's n images are done (a progress bar's step)."""
    count, p = len(x), loaded.geometry.num_prefix_tokens
    forwards = padded_forwards(x, forward_images(loaded.device))

    def tokens_of(model: LoadedModel, forward: tuple[slice, torch.Tensor]) -> list[torch.Tensor]:
        chunk = forward[1]
        with model_pass(model):
            found = residuals_after(model, chunk.to(model.device), layers)
            return [h[:, p:].float().cpu() for h in found]  # per layer (F, N, D)

    done = map_forwards(pool, loaded, tokens_of, forwards,
                        None if analysed is None else lambda i: analysed(forwards[i][0].stop - forwards[i][0].start))
    return [torch.cat([per_chunk[i] for per_chunk in done])[:count].numpy() for i in range(len(layers))]


# ----------------------------------------------------------------------------------------------
# The hold-out: a deterministic tenth of the images, by name


def held_out(names: Sequence[str], share: float = HELD_OUT_SHARE) -> np.ndarray:
    """bool (n,): the images whose names' SHA-256 are the lowest round(share * n) (at least 1 of 2 or more images).
    A function of the names alone: the same images whatever the shards, the engine or the machine."""
    n = len(names)
    count = min(n - 1, max(1, round(share * n))) if n >= 2 else 0
    order = sorted(range(n), key=lambda i: hashlib.sha256(names[i].encode()).hexdigest())
    mask = np.zeros(n, dtype=bool)
    mask[order[:count]] = True
    return mask


def held_out_sources(plan: RunPlan, images: int | None = None) -> list:
    """The run's held-out images (`held_out`) as its sources, the first `images` of them in its sorted order (default
    all): what the steerable share and the circuit are measured on."""
    mask = held_out(plan.names)
    return [source for source, held in zip(plan.sources(), mask, strict=True) if held][:images]


# ----------------------------------------------------------------------------------------------
# The shards' token parts on disk


def manifest_of(loaded: LoadedModel, plan: RunPlan, layer: int, limit: int | None) -> dict[str, Any]:
    return {"format": FORMAT, "model": loaded.name, "weights": loaded.weights, "layer": layer,
            "files_sha256": files_digest(plan.folder, plan.paths), "num_images": len(plan.paths), "limit": limit,
            "shards": len(plan.shards), "folder": str(plan.folder.resolve())}


class TokenStore:
    """DIR/tokens: the manifest and one folder of chunks per shard, done.json written last."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / TOKENS

    def manifest(self) -> dict[str, Any] | None:
        """The manifest there (None if none), checked: an object whose shards and num_images are counts, no more
        shards than images. Raises ConceptsError in one sentence."""
        path = self.path / MANIFEST
        try:
            if path.stat().st_size > MAX_JSON_BYTES:
                raise ValueError(f"{path.stat().st_size:,} bytes")
            found = bounded_json.loads(path.read_text(encoding="utf-8"), 4)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ConceptsError(f"{path} can't be read ({e}); remove {self.path} to start again.") from None
        images = found.get("num_images") if isinstance(found, dict) else None
        shards = found.get("shards") if isinstance(found, dict) else None
        if not (_is_count(images) and _is_count(shards) and 1 <= shards <= max(1, images)):
            raise ConceptsError(f"{path} is damaged (its shards and num_images must be counts, at most one shard per "
                                f"image); remove {self.path} to start again.")
        return found

    def open(self, manifest: dict[str, Any]) -> None:
        """Write the manifest, or check the one there names the same run. Raises ConceptsError with what differs."""
        found = self.manifest()
        if found is not None:
            differs = [key for key in manifest if key != "folder" and found.get(key) != manifest[key]]
            if differs:
                raise ConceptsError(f"{self.path} holds the tokens of another run (it differs in: {', '.join(differs)}); "
                                    "use another --out, or remove that folder to start again.")
            return
        self.path.mkdir(parents=True, exist_ok=True)
        with OutputFolder(self.path) as out:
            out.write(MANIFEST, json.dumps(manifest, indent=1).encode())

    def shard_path(self, shard: Shard) -> Path:
        return self.path / shard.name

    def done(self, all_shards: Sequence[Shard]) -> set[int]:
        return {shard.number for shard in all_shards if (self.shard_path(shard) / DONE).is_file()}

    def writer(self, shard: Shard, chunk_bytes: int = CHUNK_BYTES) -> ShardWriter:
        return ShardWriter(self.shard_path(shard), chunk_bytes)

    def finished(self, shard: Shard) -> dict[str, Any]:
        """The shard's done.json, checked: an object with its chunk count (at most one per image) and its failures
        ([file, reason] pairs, at most one per image). Raises ConceptsError in one sentence."""
        path = self.shard_path(shard) / DONE
        damaged = f"; remove {path.parent} to collect that shard again."
        try:
            if path.stat().st_size > MAX_JSON_BYTES + 4096 * shard.size:
                raise ValueError(f"{path.stat().st_size:,} bytes")
            done = bounded_json.loads(path.read_text(encoding="utf-8"), 4)
        except (OSError, ValueError) as e:
            raise ConceptsError(f"{path.parent} is not a finished shard ({e}){damaged}") from None
        failures = done.get("failures") if isinstance(done, dict) else None
        if not (isinstance(done, dict) and _is_count(done.get("chunks")) and done["chunks"] <= shard.size
                and isinstance(failures, list) and len(failures) <= shard.size
                and all(isinstance(f, list) and len(f) == 2 and all(isinstance(x, str) for x in f) for f in failures)):
            raise ConceptsError(f"{path} is damaged (it must name its chunks and its failed files){damaged}")
        return done

    def chunks(self, all_shards: Sequence[Shard], mmap: bool, num_patches: int, d_model: int) -> list[TokenChunk]:
        """Every shard's chunks in shard order (each shard must be done), in memory or mapped from disk, each checked
        as `dataset` checks its parts: .npy files read with allow_pickle=False, float32 (n N, D) tokens of n images,
        int64 image indices inside the shard, each image once, the images and the failures adding up to the shard's
        size. Raises ConceptsError in one sentence."""
        chunks = []
        for shard in all_shards:
            folder, done = self.shard_path(shard), self.finished(shard)
            seen: set[int] = set()
            for i in range(done["chunks"]):
                images = _npy(folder / f"images-{i:05d}.npy", np.int64, 1, 128 + 8 * shard.size, mmap=False)
                inside = images.size == 0 or (shard.start <= int(images.min()) and int(images.max()) < shard.stop)
                if not inside or len(set(images.tolist()) | seen) != len(seen) + len(images):
                    raise ConceptsError(f"{folder / f'images-{i:05d}.npy'} is damaged (image indices outside shard "
                                        f"{shard.number} or repeated); remove {folder} to collect that shard again.")
                seen |= set(images.tolist())
                path = folder / f"tokens-{i:05d}.npy"
                tokens = _npy(path, np.float32, 2, None, mmap=True)
                if tokens.shape != (len(images) * num_patches, d_model):
                    raise ConceptsError(f"{path} is damaged (it holds {tokens.shape} tokens where {len(images)} images "
                                        f"of {num_patches} patches of width {d_model} make "
                                        f"{(len(images) * num_patches, d_model)}); remove {folder} to collect that "
                                        "shard again.")
                chunks.append(TokenChunk(tokens if mmap else np.array(tokens), images))
            if len(seen) + len(done["failures"]) != shard.size:
                raise ConceptsError(f"{folder} is damaged ({len(seen)} images and {len(done['failures'])} failures, "
                                    f"where the shard has {shard.size}); remove it to collect that shard again.")
        return chunks

    def failures(self, all_shards: Sequence[Shard]) -> list[tuple[str, str]]:
        return [tuple(pair) for shard in all_shards for pair in self.finished(shard)["failures"]]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _npy(path: Path, dtype: type, ndim: int, max_bytes: int | None, mmap: bool) -> np.ndarray:
    """A .npy file of `dtype` and `ndim` dimensions, never unpickled, refused in one sentence otherwise: mapped (its
    header checked against the file's size by numpy, nothing read), or read whole when it has at most `max_bytes`."""
    try:
        if max_bytes is not None and path.stat().st_size > max_bytes:
            raise ValueError(f"{path.stat().st_size:,} bytes, more than it may have")
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ConceptsError(f"{path} can't be read as tokens ({str(e)[:200]}); remove {path.parent} to collect that "
                            "shard again.") from None
    if array.dtype != dtype or array.ndim != ndim:
        raise ConceptsError(f"{path} is damaged (it holds {array.dtype} of {array.ndim} dimensions, not "
                            f"{np.dtype(dtype)} of {ndim}); remove {path.parent} to collect that shard again.")
    return array


@dataclass(frozen=True)
class TokenChunk:
    tokens: np.ndarray  # float32 (n * N, D), in memory or mapped
    images: np.ndarray  # int64 (n,): the run's image index of each block of N rows


class ShardWriter:
    """A shard's tokens written as chunks of at most `chunk_bytes` as they come, done.json last."""

    def __init__(self, folder: Path, chunk_bytes: int) -> None:
        self.folder, self.chunk_bytes = folder, chunk_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        self.pending: list[tuple[int, np.ndarray]] = []  # (image index, (N, D))
        self.pending_bytes, self.chunks = 0, 0
        self.failures: list[tuple[str, str]] = []

    def add(self, index: int, tokens: np.ndarray) -> None:
        self.pending.append((index, tokens))
        self.pending_bytes += tokens.nbytes
        if self.pending_bytes >= self.chunk_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        tokens = np.concatenate([t for _, t in self.pending]).astype(np.float32, copy=False)  # n x (N, D) -> (n N, D)
        images = np.array([i for i, _ in self.pending], dtype=np.int64)
        with OutputFolder(self.folder) as out:
            out.write(f"tokens-{self.chunks:05d}.npy", _npy_bytes(tokens))
            out.write(f"images-{self.chunks:05d}.npy", _npy_bytes(images))
        self.chunks += 1
        self.pending, self.pending_bytes = [], 0

    def finish(self) -> None:
        self._flush()
        with OutputFolder(self.folder) as out:
            out.write(DONE, json.dumps({"chunks": self.chunks, "failures": self.failures}).encode())


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array))
    return buffer.getvalue()


def collect_shards(loaded: LoadedModel, plan: RunPlan, layer: int, store: TokenStore, todo: Sequence[Shard], *,
                   batch_size: int, workers: int = 0, chunk_bytes: int = CHUNK_BYTES,
                   progress: Progress | None = None) -> None:
    """The patch tokens after block `layer` of the shards `todo` of `plan`, in this process: decoded by the dataset
    engine's loader (`workers` processes, batches that stop at the shards' edges), each shard written when done."""
    collect_layers(loaded, plan, (layer,), (store,), todo, batch_size=batch_size, workers=workers,
                   chunk_bytes=chunk_bytes, progress=progress)


def collect_layers(loaded: LoadedModel, plan: RunPlan, layers: Sequence[int], stores: Sequence[TokenStore],
                   todo: Sequence[Shard], *, batch_size: int, workers: int = 0, chunk_bytes: int = CHUNK_BYTES,
                   progress: Progress | None = None) -> None:
    """`collect_shards` for several increasing blocks at once: one decoding and one forward per image, the tokens
    after block layers[i] written to stores[i] (each the layout of a single block's collection)."""
    for layer in layers:
        check_layer(loaded, layer)
    sources, names = plan.sources(), plan.names
    batches, owner = [], {}
    for shard in todo:
        for batch in consecutive_batches(shard.start, shard.stop, batch_size):
            owner[batch.start] = shard
            batches.append(batch)
    writers = {shard.number: [store.writer(shard, chunk_bytes) for store in stores] for shard in todo}
    remaining = {shard.number: shard.size for shard in todo}
    for shard in todo:
        if shard.size == 0:
            for writer in writers[shard.number]:
                writer.finish()
    total, done = sum(shard.size for shard in todo), 0

    def analysed(images: int) -> None:  # each forward's images, as their tokens come in; a batch's failures with them
        nonlocal done
        done += images
        if progress:
            progress(done, total)

    loader = image_loader(loaded, sources, 0, workers, batches=batches)
    with forward_pool(loaded, model_workers(loaded.device)) as pool:
        for batch, (indices, x, failed) in zip(batches, loader, strict=True):
            shard = owner[batch.start]
            for writer in writers[shard.number]:
                writer.failures += [(names[i], reason) for i, reason in failed]
            done += len(failed)
            if x is None:  # every file of the batch failed: they are counted now
                analysed(0)
            else:
                for writer, tokens in zip(writers[shard.number], patch_tokens_of_layers(loaded, x, layers, pool, analysed),
                                          strict=True):
                    for index, image_tokens in zip(indices.tolist(), tokens, strict=True):
                        writer.add(index, image_tokens)
            remaining[shard.number] -= len(batch)
            if remaining[shard.number] == 0:
                for writer, store in zip(writers[shard.number], stores, strict=True):
                    writer.finish()
                    _logger.info("%s: %d images -> %s", shard.name, shard.size, store.shard_path(shard))
