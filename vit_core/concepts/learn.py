"""From a collection's tokens to the concepts' files: the hold-out, the normalisation, the training, the metrics.

Definitions: docs/spec/analyses.md, "Concepts". Shapes: N patches per image, D width, F features.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..dataset.analyze import consecutive_batches
from ..dataset.reductions import image_loader
from ..dataset.runs import RunPlan
from ..loading.model import LoadedModel
from .collect import TokenChunk, TokenStore, held_out
from .sae import Concepts, ConceptsError, Normalisation, TrainingSettings, normalisation_of, train_sae
from .splice import reconstructed, spliced_logits

_logger = logging.getLogger(__name__)

TOP_ACTIVATIONS = 20  # per feature, in concepts.json
MEMORY_BUDGET = 4 * 2 ** 30  # bytes of training tokens held in memory; beyond, chunks are mapped from disk in turn
ENCODE_TOKENS = 4096  # tokens encoded at a time when the features are measured: (4096, F) float32 codes


def training_bytes(num_features: int, d_model: int, batch_tokens: int) -> int:
    """About the most memory training and measuring F features of width D takes: the encoder and decoder (F, D) with
    their gradients and Adam's two moments (8 F D floats), a minibatch's pre-activations, their gradient and AuxK's
    masked copy (3 B F), and the codes of ENCODE_TOKENS tokens with their top-k (2 x 4096 F); float32."""
    return 4 * num_features * (8 * d_model + 3 * batch_tokens + 2 * ENCODE_TOKENS)


def most_features(d_model: int, batch_tokens: int, memory: int | None = None) -> int:
    """The most features `concepts` trains here: as many as half the machine's memory (the container's limit) holds
    (`training_bytes`), and no more than the app opens (folders.max_features)."""
    from ..runtime import memory_limit_bytes
    from .folders import max_features

    memory = memory or memory_limit_bytes() or 4 * 2**30
    return max(1, min(max_features(d_model, memory), memory // 2 // training_bytes(1, d_model, batch_tokens)))


def features_refused(num_features: int, d_model: int, batch_tokens: int, memory: int | None = None) -> str | None:
    """Why F features of width D can't be trained here (one sentence), or None."""
    bound = most_features(d_model, batch_tokens, memory)
    if num_features <= bound:
        return None
    return (f"--features {num_features:,}: this machine trains at most {bound:,} features of width {d_model} "
            f"({training_bytes(num_features, d_model, batch_tokens) / 2**30:,.1f} GB asked for; the bound is half its "
            "memory, and 64 x the width).")


@dataclass(frozen=True)
class Tokens:
    """A collection's tokens, chunk by chunk, with each row's image and the hold-out."""

    chunks: list[TokenChunk]
    num_patches: int  # N: rows per image
    held_out_images: np.ndarray  # bool (n images of the run,)

    def rows(self, chunk: TokenChunk, held: bool) -> np.ndarray:
        """The chunk's rows of held-out (or of training) images: int64 (r,)."""
        per_row = np.repeat(self.held_out_images[chunk.images], self.num_patches)  # (n N,)
        return np.flatnonzero(per_row == held)

    def count(self, held: bool) -> int:
        return sum(len(self.rows(chunk, held)) for chunk in self.chunks)


def tokens_of(store: TokenStore, plan: RunPlan, num_patches: int, memory_budget: int = MEMORY_BUDGET,
              d_model: int | None = None) -> Tokens:
    """The tokens of every shard of `plan` (all done, checked: TokenStore.chunks), in memory when they fit in
    `memory_budget` bytes, else mapped. Refused (ConceptsError) when fewer than 2 images could be read, or when a
    token is not finite (a NaN or an infinity: the model's weights or an input broke it)."""
    total = 0
    for shard in plan.shards:
        total += sum(p.stat().st_size for p in store.shard_path(shard).glob("tokens-*.npy"))
    width = d_model if d_model is not None else _stored_width(store, plan)
    chunks = store.chunks(plan.shards, mmap=total > memory_budget, num_patches=num_patches, d_model=width)
    readable = sum(len(c.images) for c in chunks)
    if readable == 0:
        raise ConceptsError("None of the images could be read: there are no tokens to learn concepts from.")
    if readable < 2:
        raise ConceptsError(f"Only {readable} of {len(plan.names)} images could be read: learning concepts needs at "
                            "least 2 (one is held out).")
    broken = sum(int((~np.isfinite(np.asarray(c.tokens))).any(axis=1).reshape(-1, num_patches).any(axis=1).sum())
                 for c in chunks)
    if broken:
        raise ConceptsError(f"The tokens of {broken} of {readable} images are not finite (NaN or infinity): the "
                            "model's weights or those images break its forward, so no concepts can be learned.")
    return Tokens(chunks, num_patches, held_out(plan.names))


def _stored_width(store: TokenStore, plan: RunPlan) -> int:
    """D as the first chunk's header declares it (callers that know the model pass it instead)."""
    for shard in plan.shards:
        for path in sorted(store.shard_path(shard).glob("tokens-*.npy")):
            try:
                shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
            except (OSError, ValueError, EOFError):
                continue
            if len(shape) == 2:
                return int(shape[1])
    return 0


def training_batches(tokens: Tokens, normalisation: Normalisation, batch_tokens: int, memory_budget: int
                     ) -> Callable[[int, torch.Generator], Iterator[torch.Tensor]]:
    """The minibatches of one epoch of normalised training tokens (B, D), shuffled by the generator: over all the
    tokens at once when they fit in `memory_budget`, else chunk by chunk (chunks in a shuffled order, rows shuffled
    within each), each chunk read from disk when its turn comes."""
    train_bytes = tokens.count(held=False) * tokens.chunks[0].tokens.shape[1] * 4
    if train_bytes <= memory_budget:
        return shuffled_batches(torch.cat([normalisation.apply(torch.from_numpy(np.asarray(c.tokens[tokens.rows(c, False)])))
                                           for c in tokens.chunks]), batch_tokens)  # (n_train, D)

    def from_disk(epoch: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        for c in torch.randperm(len(tokens.chunks), generator=generator).tolist():
            chunk = tokens.chunks[c]
            rows = normalisation.apply(torch.from_numpy(np.asarray(chunk.tokens[tokens.rows(chunk, False)])))
            order = torch.randperm(len(rows), generator=generator)
            for first in range(0, len(order), batch_tokens):
                yield rows[order[first:first + batch_tokens]]
    return from_disk


def shuffled_batches(everything: torch.Tensor, batch_tokens: int
                     ) -> Callable[[int, torch.Generator], Iterator[torch.Tensor]]:
    """The minibatches (B, D) of one epoch of the normalised tokens `everything` (n, D), held in memory, shuffled by
    the generator."""
    def in_memory(epoch: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        order = torch.randperm(len(everything), generator=generator)
        for first in range(0, len(order), batch_tokens):
            yield everything[order[first:first + batch_tokens]]
    return in_memory


def learned_concepts(loaded: LoadedModel, tokens: Tokens, layer: int, settings: TrainingSettings,
                     memory_budget: int = MEMORY_BUDGET, progress: Callable[[int, int], None] | None = None) -> Concepts:
    """The autoencoder trained on the training images' tokens (the held-out ones never seen). progress(tokens
    trained on, of epochs x training tokens) after each step."""
    train = [np.asarray(c.tokens[tokens.rows(c, False)]) for c in tokens.chunks]
    if sum(len(t) for t in train) == 0:
        raise ConceptsError("Every image is held out: learning concepts needs at least 2 images.")
    normalisation = normalisation_of(train)
    del train
    d_model = tokens.chunks[0].tokens.shape[1]
    batches = training_batches(tokens, normalisation, settings.batch_tokens, memory_budget)
    total, seen = settings.epochs * tokens.count(held=False), [0]
    if progress:
        progress(0, total)  # the stage begins: its rate is counted from here

    def counted(epoch: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
        for x_n in batches(epoch, generator):
            seen[0] += len(x_n)  # counted before its step: train_sae reports the step once it is done
            yield x_n

    sae = train_sae(counted, d_model, tokens.count(held=False), settings,
                    (lambda step: progress(seen[0], total)) if progress else None)
    return Concepts(sae, normalisation, loaded.name, loaded.weights, layer)


# ----------------------------------------------------------------------------------------------
# What the features do


@dataclass(frozen=True)
class FeatureStatistics:
    """Over every token of the folder (training and held-out images)."""

    firing_rate: np.ndarray  # float64 (F,): share of tokens where z_f > 0
    mean_activation: np.ndarray  # float64 (F,): mean z_f over the tokens where it fires (0 where it never does)
    top_activation: np.ndarray  # float32 (K, F): the K highest z_f, highest first
    top_image: np.ndarray  # int64 (K, F): their images (the run's index)
    top_patch: np.ndarray  # int64 (K, F): their patches (row-major index into the grid)


def feature_statistics(concepts: Concepts, tokens: Tokens, top: int = TOP_ACTIVATIONS,
                       progress: Callable[[int, int], None] | None = None) -> FeatureStatistics:
    """Every token encoded once, ENCODE_TOKENS at a time; each feature's K highest activations kept as it goes.
    progress(tokens encoded, of all) after each piece."""
    every = sum(len(chunk.tokens) for chunk in tokens.chunks)
    if progress:
        progress(0, every)
    num_features = concepts.sae.num_features
    fired, total = np.zeros(num_features, dtype=np.int64), np.zeros(num_features, dtype=np.float64)
    best = torch.full((0, num_features), -1.0)  # (<= K, F)
    best_row = torch.zeros((0, num_features), dtype=torch.long)
    base, count = 0, 0
    image_of_block = np.concatenate([c.images for c in tokens.chunks])  # (images with tokens,): block of N rows -> image
    for chunk in tokens.chunks:
        for first in range(0, len(chunk.tokens), ENCODE_TOKENS):
            z = concepts.codes(np.asarray(chunk.tokens[first:first + ENCODE_TOKENS]))  # (b, F)
            fired += (z > 0).sum(dim=0).numpy()
            total += z.sum(dim=0).double().numpy()
            count += len(z)
            values, rows = z.topk(min(top, len(z)), dim=0)  # (m, F)
            merged = torch.cat([best, values])
            merged_rows = torch.cat([best_row, rows + base + first])
            best, order = merged.topk(min(top, len(merged)), dim=0)  # ties: torch's order, deterministic on the CPU
            best_row = merged_rows.gather(0, order)
            if progress:
                progress(count, every)
        base += len(chunk.tokens)
    rows = best_row.numpy()
    return FeatureStatistics(firing_rate=fired / max(count, 1), mean_activation=total / np.maximum(fired, 1),
                             top_activation=best.numpy().astype(np.float32),
                             top_image=image_of_block[rows // tokens.num_patches], top_patch=rows % tokens.num_patches)


def held_out_metrics(concepts: Concepts, tokens: Tokens) -> dict[str, float]:
    """fvu and dead_fraction over the held-out images' tokens (both in normalised units: the scale cancels in fvu),
    and "alive": bool (F,), the features > 0 on some held-out token."""
    error = sum_squares = 0.0
    total = torch.zeros(concepts.sae.d_model, dtype=torch.float64)
    count = 0
    fired = torch.zeros(concepts.sae.num_features, dtype=torch.bool)
    for chunk in tokens.chunks:
        rows = tokens.rows(chunk, held=True)
        for first in range(0, len(rows), ENCODE_TOKENS):
            x_n = concepts.normalisation.apply(torch.from_numpy(np.asarray(chunk.tokens[rows[first:first + ENCODE_TOKENS]])))
            with torch.no_grad():
                z = concepts.sae.encode(x_n)
                error += float((x_n - concepts.sae.decode(z)).double().pow(2).sum())
            fired |= (z > 0).any(dim=0)
            total += x_n.double().sum(dim=0)
            sum_squares += float(x_n.double().pow(2).sum())
            count += len(x_n)
    if count == 0:
        return {"fvu": float("nan"), "dead_fraction": float("nan"), "held_out_tokens": 0, "alive": fired.numpy()}
    variance = sum_squares - float(total.pow(2).sum()) / count  # sum ||x - mean||^2 over the held-out tokens
    return {"fvu": error / variance if variance > 0 else float("nan"),
            "dead_fraction": float((~fired).double().mean()), "held_out_tokens": count, "alive": fired.numpy()}


def splice_metrics(loaded: LoadedModel, concepts: Concepts, plan: RunPlan, workers: int = 0,
                   batch_size: int = 8, progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Over the held-out images: the share whose top-1 is unchanged, and the mean KL(p || p_spliced) in nats, when
    block L's patch tokens are replaced by their reconstruction (prefix tokens untouched). progress(images done, of
    the held-out images) after each batch."""
    mask = held_out(plan.names)
    sources = [source for source, held in zip(plan.sources(), mask, strict=True) if held]
    agree, divergence, count = 0, 0.0, 0
    if sources:
        batches = consecutive_batches(0, len(sources), batch_size)
        done = 0
        if progress:
            progress(0, len(sources))
        for decoded, x, failed in image_loader(loaded, sources, batch_size, workers, batches=batches):
            done += len(decoded) + len(failed)
            if progress:
                progress(done, len(sources))
            if x is None:
                continue
            plain = spliced_logits(loaded, x, concepts.layer, None).log_softmax(-1).double()  # (B, C)
            spliced = spliced_logits(loaded, x, concepts.layer, reconstructed(concepts)).log_softmax(-1).double()
            agree += int((plain.argmax(-1) == spliced.argmax(-1)).sum())
            divergence += float((plain.exp() * (plain - spliced)).sum())
            count += len(x)
    return {"spliced_top1_agreement": agree / count if count else float("nan"),
            "spliced_kl": divergence / count if count else float("nan"), "held_out_images": count}


def features_json(stats: FeatureStatistics, names: Sequence[str], grid: tuple[int, int],
                  steers: np.ndarray | None = None, match: np.ndarray | None = None) -> list[dict[str, Any]]:
    """concepts.json's "features": per feature its index, firing rate, mean activation and top activations
    {file, row, col, activation} (only those > 0: a feature that fires on fewer tokens has fewer); with `steers`
    (bool (F,)) whether it steers, with `match` (float (F,), --stability) its largest cosine to the second seed's."""
    features = []
    for f in range(stats.firing_rate.shape[0]):
        top = [{"file": names[int(stats.top_image[i, f])], "row": int(stats.top_patch[i, f]) // grid[1],
                "col": int(stats.top_patch[i, f]) % grid[1], "activation": round(float(stats.top_activation[i, f]), 6)}
               for i in range(stats.top_activation.shape[0]) if stats.top_activation[i, f] > 0]
        entry = {"index": f, "firing_rate": float(stats.firing_rate[f]),
                 "mean_activation": float(stats.mean_activation[f]), "top": top}
        if steers is not None:
            entry["steers"] = bool(steers[f])
        if match is not None:
            entry["stability"] = round(float(match[f]), 6)
        features.append(entry)
    return features


def strongest_features(features: list[dict[str, Any]], count: int) -> list[int]:
    """The `count` features with the highest mean of their top activations (never-firing features left out)."""
    scored = [(-float(np.mean([t["activation"] for t in f["top"]])), f["index"]) for f in features if f["top"]]
    return [index for _, index in sorted(scored)[:count]]


def summary_of(loaded: LoadedModel, plan: RunPlan, concepts: Concepts, settings: TrainingSettings,
               held: dict[str, float], splice: dict[str, float], features: list[dict[str, Any]],
               failures: list[tuple[str, str]], seconds: dict[str, float], train_tokens: int,
               quality: dict[str, float] | None = None) -> dict[str, Any]:
    """concepts.json (docs/spec/interface.md, "Concepts"); `train_tokens`: the tokens trained on per epoch;
    `quality`: steerable_share, and with --stability stability and stable_share."""
    return {
        "model": loaded.name, "weights": loaded.weights, "layer": concepts.layer,
        "folder": str(plan.folder.resolve()), "images": len(plan.names), "held_out_images": int(held_out(plan.names).sum()),
        "num_features": concepts.sae.num_features, "k": concepts.sae.k, "d_model": concepts.sae.d_model,
        "epochs": settings.epochs, "batch_tokens": settings.batch_tokens, "learning_rate": settings.lr(train_tokens),
        "steps": round(settings.steps(train_tokens), 2), "dead_after": settings.dead_window(train_tokens),
        "seed": settings.seed, "normalisation": {"mean_norm": float(np.linalg.norm(concepts.normalisation.mean)),
                                                  "scale": concepts.normalisation.scale},
        "fvu": held["fvu"], "dead_fraction": held["dead_fraction"], "held_out_tokens": held["held_out_tokens"],
        "spliced_top1_agreement": splice["spliced_top1_agreement"], "spliced_kl": splice["spliced_kl"],
        **(quality or {}),
        "failures": [{"file": name, "reason": reason} for name, reason in failures],
        "seconds": {key: round(value, 2) for key, value in seconds.items()},
        "features": features,
    }


class Stopwatch:
    """Named wall times, for concepts.json's "seconds" and the benchmark."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, name: str, run: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = run()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        return result
