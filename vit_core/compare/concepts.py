"""One concept dictionary for two models (`compare --concepts-layer L`; docs/spec/analyses.md, "Two models",
"Shared concepts"; files: docs/spec/interface.md, "Two models").

Both models' patch tokens after block L are collected from the same images (each image decoded once for both, by
compare's `pair_loader`; each model's forward as `concepts` collects it, `patch_tokens`), into concepts' token store
per model (DIR/concepts/a/tokens, DIR/concepts/b/tokens: shards kept when done, resumable). Each model's tokens are
normalised by its own statistics, ONE TopK dictionary is trained on their union with `concepts`' trainer, and each
feature's share of its activation mass that comes from A's tokens says whether it is A's only, B's only or shared.
Every sum runs one image at a time in the run's image order, so the shards change no bit.
Shapes: n images, N patches, D width, F features, K top patches kept per feature.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..concepts import CONCEPTS_FILE, SUMMARY_FILE, Concepts, ConceptsError, TrainingSettings, concepts_bytes, train_sae
from ..concepts.collect import TokenStore, manifest_of, patch_tokens
from ..concepts.learn import MEMORY_BUDGET, TOP_ACTIVATIONS, FeatureStatistics, features_json, shuffled_batches, tokens_of
from ..concepts.sae import Normalisation, TopKSAE, normalisation_of
from ..dataset import Shard, consecutive_batches
from ..dataset.runs import RunPlan
from ..dataset.workers import forward_pool, model_workers
from ..loading.model import Geometry
from .engine import MODELS, Pair, Progress, pair_loader

ONLY = 0.95  # share_a >= ONLY: only in A; share_a <= 1 - ONLY: only in B
FOLDER = "concepts"  # DIR/concepts


def concepts_skipped(a: Geometry, b: Geometry, layer: int) -> str | None:
    """Why the two models can't share a dictionary at block `layer` (one sentence), or None."""
    for name, g in (("A", a), ("B", b)):
        if layer >= g.num_layers:
            return f"Block {layer} is beyond model {name}'s blocks 0..{g.num_layers - 1}, so no concepts are shared there."
    if a.embed_dim != b.embed_dim:
        return (f"A's tokens have width {a.embed_dim} and B's {b.embed_dim}: one dictionary can't encode both, so no "
                "concepts are shared.")
    return None


def token_stores(pair: Pair, out: Path, layer: int, limit: int | None) -> tuple[TokenStore, TokenStore]:
    """DIR/concepts/a/tokens and DIR/concepts/b/tokens, their manifests (concepts' own, one per model) written or
    checked: ConceptsError says what differs."""
    stores = tuple(TokenStore(out / FOLDER / side) for side in MODELS)
    for store, loaded, plan in zip(stores, (pair.a, pair.b), (pair.plan_a, pair.plan_b), strict=True):
        store.open(manifest_of(loaded, plan, layer, limit))
    return stores


def collected(stores: Sequence[TokenStore], shards: Sequence[Shard]) -> set[int]:
    return set.intersection(*(store.done(shards) for store in stores))


Items = Sequence[tuple[int, Any, Any]]  # a batch as pair_loader decodes it: (index, A's input or why not, B's likewise)


@contextlib.contextmanager
def pair_token_writers(pair: Pair, layer: int, stores: Sequence[TokenStore], todo: Sequence[Shard]
                       ) -> Iterator[Callable[[Shard, Items], None]]:
    """Inside the block, add(shard, items) collects both models' patch tokens after block `layer` of a decoded batch
    of a shard of `todo` (other shards' batches are left alone): each model's tokens as `concepts` collects them
    (`patch_tokens`, on a forward pool); an image either model can't read is a failure of both stores (the union
    holds the images both read). A shard's two stores are written when its last batch is added."""
    writers = {shard.number: [store.writer(shard) for store in stores] for shard in todo}
    remaining = {shard.number: shard.size for shard in todo}
    for shard in (s for s in todo if s.size == 0):
        for writer in writers[shard.number]:
            writer.finish()
    with forward_pool(pair.a, model_workers(pair.a.device)) as pool_a, \
            forward_pool(pair.b, model_workers(pair.b.device)) as pool_b:

        def add(shard: Shard, items: Items) -> None:
            if shard.number not in writers:
                return
            both = []
            for index, xa, xb in items:
                why = next((x for x in (xa, xb) if isinstance(x, str)), None)
                if why is None:
                    both.append((index, xa, xb))
                for writer in writers[shard.number] if why is not None else ():
                    writer.failures.append((pair.plan_a.names[index], why))
            for writer, loaded, pool, side in zip(writers[shard.number], (pair.a, pair.b), (pool_a, pool_b), (1, 2),
                                                  strict=True):
                if both:
                    tokens = patch_tokens(loaded, torch.stack([item[side] for item in both]), layer, pool)  # (B, N, D)
                    for (index, *_), image_tokens in zip(both, tokens, strict=True):
                        writer.add(index, image_tokens)
            remaining[shard.number] -= len(items)
            if remaining[shard.number] == 0:
                for writer in writers[shard.number]:
                    writer.finish()

        yield add


def collect_pair_tokens(pair: Pair, layer: int, stores: Sequence[TokenStore], todo: Sequence[Shard], *,
                        batch_size: int, workers: int = 0, progress: Progress | None = None) -> None:
    """`pair_token_writers` of the shards `todo` on their own: each image decoded once for both models (for shards
    whose comparison was run before --concepts-layer was asked for)."""
    batches, owner = [], {}
    for shard in todo:
        for batch in consecutive_batches(shard.start, shard.stop, batch_size):
            owner[batch.start] = shard
            batches.append(batch)
    total, done = sum(shard.size for shard in todo), 0
    with pair_token_writers(pair, layer, stores, todo) as add:
        for batch, items in zip(batches, pair_loader(pair.a, pair.b, pair.plan_a.sources(), batches, workers),
                                strict=True):
            add(owner[batch.start], items)
            done += len(batch)
            if progress:
                progress(done, total)


# ----------------------------------------------------------------------------------------------
# The dictionary and the shares


@dataclass(frozen=True)
class ModelTokens:
    """One model's collected tokens, every image both models read, in the run's order."""

    tokens: np.ndarray  # float32 (n N, D)
    images: np.ndarray  # int64 (n,): each block of N rows' image (index into the run's sorted files)
    num_patches: int


def model_tokens(store: TokenStore, plan: RunPlan, num_patches: int, d_model: int) -> ModelTokens:
    """A store's every shard (all collected, checked by concepts' `tokens_of`) as one array in image order."""
    found = tokens_of(store, plan, num_patches, MEMORY_BUDGET, d_model)
    return ModelTokens(np.concatenate([np.asarray(c.tokens) for c in found.chunks]),
                       np.concatenate([c.images for c in found.chunks]), num_patches)


def union_dictionary(a: ModelTokens, b: ModelTokens, settings: TrainingSettings
                     ) -> tuple[TopKSAE, Normalisation, Normalisation]:
    """ONE TopK dictionary trained (concepts' `train_sae`) on A's tokens normalised by A's statistics followed by B's
    normalised by B's, every token of both (no hold-out: no held-out metric is reported); the two normalisations."""
    if a.tokens.nbytes + b.tokens.nbytes > MEMORY_BUDGET // 2:  # the tokens, and their normalised copy
        raise ConceptsError(f"The two models' tokens take {(a.tokens.nbytes + b.tokens.nbytes) / 2**30:.1f} GiB; "
                            f"--concepts-layer trains on at most {MEMORY_BUDGET / 2**31:.0f} GiB of them: give --limit.")
    norms = normalisation_of([a.tokens]), normalisation_of([b.tokens])  # one chunk each: no shard changes the sums
    everything = torch.cat([norm.apply(torch.from_numpy(side.tokens)) for norm, side in zip(norms, (a, b), strict=True)])
    sae = train_sae(shuffled_batches(everything, settings.batch_tokens), a.tokens.shape[1], len(everything), settings)
    return sae, norms[0], norms[1]


@dataclass(frozen=True)
class Activity:
    """What one model's tokens make the dictionary's features do."""

    mass: np.ndarray  # float64 (F,): sum of z_f over the model's tokens
    statistics: FeatureStatistics  # firing rate, mean activation, the K largest z_f with their image and patch


def activity(concepts: Concepts, side: ModelTokens, top: int = TOP_ACTIVATIONS) -> Activity:
    """Each image's N tokens encoded on their own (the same bits whatever the shards), their codes' float64 sums
    added in image order; each feature's `top` largest z_f over the model's tokens, ties by the earlier token."""
    n = len(side.images)
    num_features = concepts.sae.num_features
    mass, fired = np.zeros(num_features), np.zeros(num_features, dtype=np.int64)
    best, best_row = torch.zeros((0, num_features)), torch.zeros((0, num_features), dtype=torch.long)
    for i in range(n):
        rows = slice(i * side.num_patches, (i + 1) * side.num_patches)
        z = concepts.codes(side.tokens[rows])  # (N, F)
        mass += z.numpy().astype(np.float64).sum(axis=0)
        fired += (z > 0).sum(dim=0).numpy()
        values, order = torch.sort(z, dim=0, descending=True, stable=True)  # (N, F)
        merged = torch.cat([best, values[:top]])  # the earlier images' first: a stable sort keeps their ties first
        merged_rows = torch.cat([best_row, order[:top] + i * side.num_patches])
        best, kept = torch.sort(merged, dim=0, descending=True, stable=True)
        best, best_row = best[:top], merged_rows.gather(0, kept[:top])
    count = max(n * side.num_patches, 1)
    rows = best_row.numpy()
    statistics = FeatureStatistics(fired / count, mass / np.maximum(fired, 1), best.numpy(),
                                   side.images[rows // side.num_patches], rows % side.num_patches)
    return Activity(mass, statistics)


def shares(mass_a: np.ndarray, mass_b: np.ndarray) -> np.ndarray:
    """share_a (F,) float64: mass_a / (mass_a + mass_b), NaN for a dead feature (no activation on either side)."""
    total = mass_a + mass_b
    return np.divide(mass_a, total, out=np.full(len(total), np.nan), where=total > 0)


def feature_lists(share_a: np.ndarray) -> dict[str, list[int]]:
    """The alive features by share_a: only_a (>= ONLY), only_b (<= 1 - ONLY), shared (between), each sorted."""
    alive = ~np.isnan(share_a)
    only_a = alive & (np.nan_to_num(share_a) >= ONLY)
    only_b = alive & (np.nan_to_num(share_a, nan=1.0) <= 1 - ONLY)
    return {"only_a": np.flatnonzero(only_a).tolist(), "only_b": np.flatnonzero(only_b).tolist(),
            "shared": np.flatnonzero(alive & ~only_a & ~only_b).tolist()}


def shared_concepts(pair: Pair, layer: int, stores: Sequence[TokenStore], settings: TrainingSettings
                    ) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The dictionary trained on both models' collected tokens: DIR/concepts' files (path below DIR -> bytes) and
    compare.json's "concepts" (the layer, the three lists and their counts)."""
    import json

    g = pair.a.geometry
    sides = [model_tokens(store, plan, loaded.geometry.num_patches, g.embed_dim)
             for store, plan, loaded in zip(stores, (pair.plan_a, pair.plan_b), (pair.a, pair.b), strict=True)]
    sae, norm_a, norm_b = union_dictionary(*sides, settings)
    dictionaries = [Concepts(sae, norm, loaded.name, loaded.weights, layer)
                    for norm, loaded in zip((norm_a, norm_b), (pair.a, pair.b), strict=True)]
    seen = [activity(concepts, side) for concepts, side in zip(dictionaries, sides, strict=True)]
    share_a = shares(seen[0].mass, seen[1].mass)
    lists = feature_lists(share_a)
    tops = [features_json(s.statistics, pair.plan_a.names, loaded.geometry.grid)
            for s, loaded in zip(seen, (pair.a, pair.b), strict=True)]
    listed = {f: name for name, features in lists.items() for f in features}
    features = [{"index": f, "list": listed[f], "share_a": float(share_a[f]), "mass_a": float(seen[0].mass[f]),
                 "mass_b": float(seen[1].mass[f]), "a": _without_index(tops[0][f]), "b": _without_index(tops[1][f])}
                for f in sorted(listed)]
    counts = {name: len(features) for name, features in lists.items()} | {"dead": int(np.isnan(share_a).sum())}
    summary = {"layer": layer, **lists, "counts": counts}
    train_tokens = sum(len(side.tokens) for side in sides)
    content = {**summary, "num_features": settings.num_features, "k": settings.k, "d_model": g.embed_dim,
               "epochs": settings.epochs, "batch_tokens": settings.batch_tokens, "seed": settings.seed,
               "learning_rate": settings.lr(train_tokens), "tokens_a": len(sides[0].tokens),
               "tokens_b": len(sides[1].tokens), "only": ONLY, "features": features}
    files = {f"{FOLDER}/{side}/{CONCEPTS_FILE}": concepts_bytes(concepts)
             for side, concepts in zip(MODELS, dictionaries, strict=True)}
    files[f"{FOLDER}/{SUMMARY_FILE}"] = json.dumps(content, indent=1).encode()
    return files, summary


def _without_index(feature: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in feature.items() if key != "index"}

