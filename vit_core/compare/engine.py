"""Two models over one set of images: each image decoded once for both, each model's forward reduced exactly as
`dataset` reduces it (its `reduce_batch`, so DIR/a and DIR/b are bit for bit what `dataset` writes for each model
alone), and in the same forwards the comparison's per-image values (`PairRecorder`): the tokens' CKA sums, the
attention JS, the KL between the predictions, the rollout correlation.

A run is cut into the shards of `dataset` (vit_core.dataset.runs): each shard's part is written three times, DIR/a/parts,
DIR/b/parts (dataset's own stores and manifests) and DIR/parts (the comparison's), so a killed run resumes and
shards run elsewhere merge. Shapes: F images per forward, L blocks, H heads, T tokens, N patches, D widths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..dataset import (
    BatchValues,
    ExactMoments,
    PartsError,
    PartStore,
    RunPlan,
    Shard,
    Totals,
    consecutive_batches,
    forward_images,
    patch_distances_on,
    reduce_batch,
)
from ..dataset.runs import manifest_differences, manifest_problem, shard_start
from ..dataset.workers import replica
from ..errors import CaptureError, ImageError
from ..hooks import attention_recorded, register, tokens_recorded
from ..images import load_image
from ..loading.model import Geometry, LoadedModel
from ..runtime.devices import describe_device
from .measures import rollout_maps, torch_attention_js, torch_pearson, torch_prediction_kl, torch_rollout_step
from .sums import CompareTotals

_logger = logging.getLogger(__name__)

FORMAT = "vit-lens compare parts 1"
MODELS = ("a", "b")  # DIR/a, DIR/b: each model's `dataset` files

Progress = Callable[[int, int], None]


# ----------------------------------------------------------------------------------------------
# What two models can be compared on


@dataclass(frozen=True)
class Comparable:
    """Which comparisons two geometries allow, and a sentence for each one they don't (`skipped`)."""

    classes: bool  # the same classes (and a head): KL, changed, agreement
    grid: bool  # the same patch grid: CKA over patch tokens, the rollout correlation
    attention: bool  # the same blocks, heads and tokens: the attention JS and the distance difference
    skipped: tuple[tuple[str, str], ...]  # (comparison, why not)


def comparable(a: Geometry, b: Geometry) -> Comparable:
    skipped = []
    classes = a.num_classes == b.num_classes and a.num_classes > 0
    if not classes:
        why = ("one of the models has no classifier head" if not (a.num_classes and b.num_classes)
               else f"A has {a.num_classes} classes and B {b.num_classes}")
        skipped += [(name, f"The predictions can't be compared: {why}.") for name in ("kl", "changed", "agreement")]
    grid = a.grid == b.grid
    if not grid:
        why = f"A's patch grid is {a.grid[0]}x{a.grid[1]} and B's {b.grid[0]}x{b.grid[1]}"
        skipped.append(("rollout_correlation", f"The rollout maps can't be compared point by point: {why}."))
        skipped.append(("cka over patch tokens", f"{why}, so CKA is over each image's mean patch token instead."))
    attention = (a.num_layers, a.num_heads, a.grid, a.prefix_names) == (b.num_layers, b.num_heads, b.grid, b.prefix_names)
    if not attention:
        why = (f"A has {a.num_layers} blocks of {a.num_heads} heads over {a.num_tokens} tokens and B {b.num_layers} "
               f"blocks of {b.num_heads} heads over {b.num_tokens} tokens")
        if (a.num_layers, a.num_heads) != (b.num_layers, b.num_heads):
            skipped.append(("mean_attention_distance_diff", f"There is no head of B for each head of A: {why}."))
        skipped.append(("attention_js", f"The attention rows can't be compared key by key: {why}."))
    return Comparable(classes, grid, attention, tuple(skipped))


def with_names_of(b: LoadedModel, a: LoadedModel) -> LoadedModel:
    """B with A's class names where B has none of its own and as many classes (a random init or a checkpoint of A's
    architecture: its folder labels and tables then read as A's); B itself otherwise."""
    if b.labels is None and a.labels and b.geometry.num_classes == a.geometry.num_classes:
        return dataclasses.replace(b, labels=a.labels)
    return b


# ----------------------------------------------------------------------------------------------
# Decoding once for both


def pair_crops(source: Any, sides: Sequence[int], crop_transforms: Sequence[Callable]) -> list[Any]:
    """One source (bytes or a path) as each model's crop (PIL RGB, the model's input size) or why not: decoded once
    for the models that decode at the same size (`decode_min_side`), then each model's resize and crop, as
    dataset's decoded_crop does for one."""
    decoded: dict[int, Any] = {}
    crops = []
    for side, crop in zip(sides, crop_transforms, strict=True):
        if side not in decoded:
            try:
                decoded[side] = load_image(source, side)  # RGB
            except ImageError as e:
                decoded[side] = str(e)
        image = decoded[side]
        if isinstance(image, str):
            crops.append(image)
            continue
        try:
            crops.append(crop(image))
        except ImageError as e:
            crops.append(str(e))
    return crops


class PairDecoded(Dataset):
    """The sources as both models' inputs: item i is (i, A's input (3, H, W) or why not, B's likewise), each image
    decoded once for both (`pair_crops`); only picklable things, so DataLoader workers can have it."""

    def __init__(self, sources: Sequence[tuple[str, Any]], a: LoadedModel, b: LoadedModel) -> None:
        self.sources = list(sources)
        self.sides = (a.decode_min_side, b.decode_min_side)
        self.crops = (a.crop_transform, b.crop_transform)
        self.tensors = (a.tensor_transform, b.tensor_transform)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str, torch.Tensor | str]:
        inputs = []
        for crop, tensor in zip(pair_crops(self.sources[index][1], self.sides, self.crops), self.tensors, strict=True):
            if isinstance(crop, str):
                inputs.append(crop)
                continue
            try:
                inputs.append(tensor(crop))  # (3, H, W)
            except ImageError as e:
                inputs.append(str(e))
        return index, inputs[0], inputs[1]


def _as_list(items: list) -> list:
    return items


def pair_batch_size(device: torch.device) -> int:
    """Pairs of images per decoded batch: 8 on a CPU, 64 on an accelerator. Not dataset's 32 on a CPU: 16 images of two
    ViT-B/16s in one batch took `compare`'s peak memory from 3.4 to 3.6 GB, and its time is the comparison's products,
    not the model workers' wait at a batch's end."""
    return 8 if device.type == "cpu" else 64


def pair_loader(a: LoadedModel, b: LoadedModel, sources: Sequence[tuple[str, Any]], batches: Sequence[Sequence[int]],
                workers: int) -> DataLoader:
    return DataLoader(PairDecoded(sources, a, b), batch_sampler=[list(x) for x in batches], num_workers=workers,
                      collate_fn=_as_list)


# ----------------------------------------------------------------------------------------------
# What each forward leaves for the comparison


@dataclass
class PairRecorder:
    """One model's forward, recorded for the comparison (on the device): its patch tokens of every residual row, its
    logits, its rollout, and (`patterns`) its attention patterns when the other model's forward is to compare its own
    against them (`against`)."""

    geometry: Geometry
    mean_tokens: bool  # CKA over each image's mean patch token (the grids differ)
    keep_patterns: bool = False
    against: list[torch.Tensor] | None = None  # the other model's patterns, L x (F, H, T, T)
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)  # (L+1) x (F, N or 1, D) float64
    patterns: list[torch.Tensor] = dataclasses.field(default_factory=list)
    js: list[torch.Tensor] = dataclasses.field(default_factory=list)  # L x (F, H) float64
    rollout: torch.Tensor | None = None  # (F, T, T) float64
    logits: torch.Tensor | None = None  # (F, C)

    def pattern(self, pattern: torch.Tensor) -> None:
        if self.keep_patterns:
            self.patterns.append(pattern)
        if self.against is not None:
            self.js.append(torch_attention_js(self.against[len(self.js)], pattern))
        self.rollout = torch_rollout_step(self.rollout, pattern)

    def token(self, tokens: torch.Tensor) -> None:
        patches = tokens[:, self.geometry.num_prefix_tokens:].double()  # (F, T, D) -> (F, N, D)
        self.tokens.append(patches.mean(dim=1, keepdim=True) if self.mean_tokens else patches)

    def output(self, logits: torch.Tensor) -> None:
        self.logits = logits


@contextlib.contextmanager
def recorded(model: torch.nn.Module, recorder: PairRecorder) -> Iterator[None]:
    """Inside the block, the model's forwards feed `recorder` (hooks gone on exit, also when a forward raises)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(attention_recorded(model, recorder.pattern))
        stack.enter_context(tokens_recorded(model, recorder.token))
        register(stack, model, model.register_forward_hook(lambda m, i, o: recorder.output(o.detach())))
        yield


def _check(recorder: PairRecorder, name: str) -> None:
    g = recorder.geometry
    if len(recorder.tokens) != g.num_layers + 1 or recorder.logits is None:
        raise CaptureError(f"model {name}'s forward left {len(recorder.tokens)} token rows for {g.num_layers + 1} "
                           "expected: another forward ran on it meanwhile, or its blocks bypass timm's standard path.")


def add_pair(totals: CompareTotals, a: PairRecorder, b: PairRecorder, images: int, files: Sequence[str],
             which: Comparable) -> None:
    """One paired forward's comparison values added (its first `images` rows are real images, the rest padding)."""
    x, y = torch.stack(a.tokens, dim=1), torch.stack(b.tokens, dim=1)  # (F, La+1, n, Da), (F, Lb+1, n, Db)
    la, lb, da, db = x.shape[1], y.shape[1], x.shape[-1], y.shape[-1]
    totals.tokens += images * x.shape[2]
    totals.sum_a.add(x.sum(dim=2), images)  # (F, La+1, Da)
    totals.sum_b.add(y.sum(dim=2), images)
    totals.self_a.add(x.transpose(-1, -2) @ x, images)  # (F, La+1, Da, Da)
    totals.self_b.add(y.transpose(-1, -2) @ y, images)
    for i in range(la):  # a row of A at a time: two ViT-B/16s' whole cross products are 800 MB per image
        cross = x[:, i:i + 1].transpose(-1, -2) @ y  # (F, 1, Da, n) @ (F, Lb+1, n, Db) -> (F, Lb+1, Da, Db)
        totals.cross.add(cross, images, shape=(la, lb, da, db), at=i)
    if which.attention:
        totals.js.add(torch.stack(b.js, dim=1)[:images].cpu().numpy())  # L x (F, H) -> (images, L, H)
    kl = torch_prediction_kl(a.logits, b.logits)[:images].cpu().tolist() if which.classes else [float("nan")] * images
    if which.grid:
        ga, gb = a.geometry, b.geometry
        correlation = torch_pearson(rollout_maps(a.rollout, ga.num_prefix_tokens, ga.has_class_token),
                                    rollout_maps(b.rollout, gb.num_prefix_tokens, gb.has_class_token))
        correlation = correlation[:images].cpu().tolist()
    else:
        correlation = [float("nan")] * images
    totals.file.extend(files)
    totals.kl.extend(kl)
    totals.rollout_correlation.extend(correlation)


@dataclass(frozen=True)
class Explain:
    """`--explain`'s settings: the deletion / insertion steps and the tests (dataset's explained_values)."""

    steps: int
    tests: tuple[str, ...]


def _explained(loaded: LoadedModel, sources: Sequence[tuple[str, Any]], indices: list[int], explain: Explain
               ) -> tuple[dict[int, dict[str, float]], dict[int, str]]:
    """Each image's explained_values for one model, in index order, and why an image can't be explained (it has {}),
    as dataset's reduce_sources does."""
    from ..dataset import explained_values

    out, failed = {}, {}
    for index in indices:
        try:
            out[index] = explained_values(loaded, sources[index][1], explain.steps, tests=explain.tests)
        except ImageError as e:
            out[index], failed[index] = {}, f"No explanation: {e}"
    return out, failed


def _slice(values: BatchValues, start: int, stop: int) -> BatchValues:
    return BatchValues(**{f.name: None if getattr(values, f.name) is None else getattr(values, f.name)[start:stop]
                          for f in dataclasses.fields(BatchValues)})


def paired_values(a: LoadedModel, b: LoadedModel, xa: torch.Tensor, xb: torch.Tensor, logit_lens: tuple[bool, bool],
                  distances: tuple[torch.Tensor, torch.Tensor], files: Sequence[str], which: Comparable,
                  totals: CompareTotals) -> tuple[BatchValues, BatchValues]:
    """Images xa (B, 3, Ha, Wa) and xb (B, 3, Hb, Wb) (the same B images for each model) through dataset's
    `reduce_batch` of each model, one forward's worth (`forward_images`) at a time, with the comparison recorded in the
    same forwards and added to `totals`; each model's per-image values. `a` and `b` are the caller's own `replica`s:
    the recording hooks sit between reduce_batch's passes, which take the model's lock only for each pass, so on a
    shared model another session's forward could land in that gap (and its hooks in ours)."""
    size = forward_images(a.device)
    parts_a, parts_b = [], []
    for first in range(0, len(xa), size):
        images = min(size, len(xa) - first)
        rec_a = PairRecorder(a.geometry, mean_tokens=not which.grid, keep_patterns=which.attention)
        with recorded(a.model, rec_a):
            parts_a.append(reduce_batch(a, xa[first:first + size], logit_lens[0], distances[0]))
        _check(rec_a, "A")
        rec_b = PairRecorder(b.geometry, mean_tokens=not which.grid, against=rec_a.patterns if which.attention else None)
        with recorded(b.model, rec_b):
            parts_b.append(reduce_batch(b, xb[first:first + size], logit_lens[1], distances[1]))
        _check(rec_b, "B")
        add_pair(totals, rec_a, rec_b, images, files[first:first + size], which)
    return joined_values(parts_a), joined_values(parts_b)


def joined_values(parts: list[BatchValues]) -> BatchValues:
    """One row per image of `parts`, in their order."""
    return BatchValues(**{f.name: None if getattr(parts[0], f.name) is None
                          else np.concatenate([getattr(p, f.name) for p in parts])
                          for f in dataclasses.fields(BatchValues)})


# ----------------------------------------------------------------------------------------------
# The loop over a run's batches


@dataclass(frozen=True)
class Pair:
    """The two models and their runs' plans (the same images and shards; each model's own labels)."""

    a: LoadedModel
    b: LoadedModel
    plan_a: RunPlan | None
    plan_b: RunPlan | None

    @property
    def which(self) -> Comparable:
        return comparable(self.a.geometry, self.b.geometry)


Decoded = Callable[[range, Sequence[tuple[int, Any, Any]]], None]  # (batch, its items as pair_loader gives them)


Into = Callable[[range], CompareTotals]  # a batch -> the totals its comparison is added to


def reduce_pairs(pair: Pair, batches: Sequence[range], *, workers: int = 0, progress: Progress | None = None,
                 explain: Explain | None = None, decoded: Decoded | None = None, into: Into | None = None
                 ) -> Iterator[tuple[list[int], Totals, Totals, CompareTotals]]:
    """`reduce_sources_pair` of a folder's run (the plans' images and labels)."""
    yield from reduce_sources_pair(pair.a, pair.b, pair.plan_a.sources(), (pair.plan_a.labels, pair.plan_b.labels),
                                   batches, workers=workers, progress=progress, explain=explain, decoded=decoded,
                                   into=into)


def reduce_sources_pair(a: LoadedModel, b: LoadedModel, sources: Sequence[tuple[str, Any]],
                        labels: tuple[Sequence[int | None] | None, Sequence[int | None] | None], batches: Sequence[range],
                        *, workers: int = 0, progress: Progress | None = None, explain: Explain | None = None,
                        decoded: Decoded | None = None, into: Into | None = None
                        ) -> Iterator[tuple[list[int], Totals, Totals, CompareTotals]]:
    """For each batch (indices into `sources`, (name, bytes or path) each, in order): its indices, A's and B's totals
    (as `dataset`'s reduce_sources makes them: the same bits) and the comparison's totals over the images both models
    could read. `labels`: each model's true class per source (or None). `explain`: each model's `--explain` scalars
    of each image too (dataset's explained_values, as `dataset --explain` adds them). `decoded(batch, items)`: called
    with each batch's decoded inputs first (what else is made of the same decoding: --concepts-layer's tokens).
    `into(batch)`: the totals each batch's comparison is added to, and yielded (a shard's: two ViT-B/16s' sums are
    1.3 GiB, too large for a batch's own beside them); without it, a batch's own."""
    logit_lens = logit_lens_of(labels)
    distances = (patch_distances_on(a.geometry, a.device), patch_distances_on(b.geometry, b.device))
    own = (replica(a), replica(b))  # hooks and fused_attn flags of our own, the weights shared (see paired_values)
    report = progress or (lambda done, total: None)
    total, done = sum(len(batch) for batch in batches), 0
    for batch, items in zip(batches, pair_loader(a, b, sources, batches, workers), strict=True):
        if decoded:
            decoded(batch, items)
        paired = pair_batch((a, b), own, sources, items, logit_lens, distances, explain, into(batch) if into else None)
        totals = (Totals(), Totals())
        for side in range(2):  # failures first, as reduce_sources reports them
            totals[side].failures.extend((sources[i][0], why) for i, why in paired.unread[side].items())
            totals[side].failures.extend((sources[i][0], why) for i, why in paired.unexplained[side].items())
        for index in sorted(paired.values):  # rows in the run's order, one image at a time: the sums are exact
            for side in range(2):
                values = paired.values[index][side]
                if values is not None:
                    label = [labels[side][index]] if logit_lens[side] else None
                    totals[side].add_batch([sources[index][0]], label, values,
                                           [paired.explained[side][index]] if paired.explained else None)
        done += len(batch)
        report(done, total)
        compared = paired.compared
        del paired  # held across the yield, it would keep a finished shard's sums while the next shard's are made
        yield list(batch), totals[0], totals[1], compared
        del compared


def logit_lens_of(labels: tuple[Sequence[int | None] | None, Sequence[int | None] | None]) -> tuple[bool, bool]:
    """Whether each model's logit lens runs: some label is known (as dataset's reduce_sources decides)."""
    return tuple(ls is not None and any(x is not None for x in ls) for ls in labels)


@dataclass
class PairedBatch:
    """One batch through both models. Per image (its index into the sources): each model's values as one row (None
    where that model couldn't read it), why a model couldn't read it or explain it, each model's --explain scalars
    (`explained` None without --explain); and the comparison's sums over the images both models read."""

    values: dict[int, tuple[BatchValues | None, BatchValues | None]]
    unread: tuple[dict[int, str], dict[int, str]]
    unexplained: tuple[dict[int, str], dict[int, str]]
    explained: tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]] | None
    compared: CompareTotals


def pair_batch(models: tuple[LoadedModel, LoadedModel], own: tuple[LoadedModel, LoadedModel], sources: Any,
               items: Sequence[tuple[int, Any, Any]], logit_lens: tuple[bool, bool],
               distances: tuple[torch.Tensor, torch.Tensor], explain: Explain | None,
               compared: CompareTotals | None = None) -> PairedBatch:
    """A batch of decoded items ((index, A's input (3, H, W) or why not, B's likewise), in index order) through both
    models: the images both read in paired forwards on `own` (the caller's replicas, `paired_values`), the comparison
    recorded (added to `compared`, default a batch's own); an image only one model read by that model alone.
    `sources[index]`: the image's (name, bytes or path)."""
    unread: tuple[dict[int, str], dict[int, str]] = ({}, {})
    for index, *inputs in items:
        for side, x in enumerate(inputs):
            if isinstance(x, str):
                unread[side][index] = x
                _logger.info("skipped %s for model %s: %s", sources[index][0], "AB"[side], x)
    compared = CompareTotals() if compared is None else compared
    values: dict[int, tuple[BatchValues | None, BatchValues | None]] = {}
    both = [(i, xa, xb) for i, xa, xb in items if i not in unread[0] and i not in unread[1]]
    if both:
        va, vb = paired_values(*own, torch.stack([x for _, x, _ in both]), torch.stack([x for _, _, x in both]),
                               logit_lens, distances, [sources[i][0] for i, _, _ in both],
                               comparable(models[0].geometry, models[1].geometry), compared)
        values |= {i: (_slice(va, k, k + 1), _slice(vb, k, k + 1)) for k, (i, _, _) in enumerate(both)}
    for side, loaded in enumerate(models):  # an image only one model could read: that model's alone
        alone = [(i, inputs[side]) for i, *inputs in items if i in unread[1 - side] and i not in unread[side]]
        if alone:
            v = reduce_batch(loaded, torch.stack([x for _, x in alone]), logit_lens[side], distances[side])
            for k, (i, _) in enumerate(alone):
                values[i] = tuple(_slice(v, k, k + 1) if s == side else None for s in range(2))
    explained, unexplained = None, ({}, {})
    if explain:
        (ea, fa), (eb, fb) = (_explained(loaded, sources, sorted(i for i in values if values[i][side] is not None), explain)
                              for side, loaded in enumerate(models))
        explained, unexplained = (ea, eb), (fa, fb)
    return PairedBatch(values, unread, unexplained, explained, compared)


# ----------------------------------------------------------------------------------------------
# The comparison's parts on disk: three of dataset's PartStore, DIR/a/parts and DIR/b/parts each model's, DIR/parts the
# comparison's own (its manifest names both runs; its part holds the comparison's sums)


def pair_manifest(manifest_a: dict[str, Any], manifest_b: dict[str, Any]) -> dict[str, Any]:
    """The comparison's manifest: its format and the two runs' manifests."""
    return {"format": FORMAT, "a": manifest_a, "b": manifest_b, "shards": manifest_a["shards"]}


class PairParts(PartStore):
    """DIR/parts: the comparison's manifest (`pair_manifest`) and each shard's CompareTotals, kept as dataset's are."""

    command = "compare"

    @property
    def start_again(self) -> Path:
        return self.path.parent  # DIR: the two models' parts go with the comparison's

    def problem(self, manifest: Any) -> str | None:
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return f"its format is not {FORMAT!r}"
        for side in MODELS:
            problem = manifest_problem(manifest.get(side))
            if problem:
                return f"model {side.upper()}'s run: {problem}"
        return None

    def differences(self, wanted: dict[str, Any], found: dict[str, Any]) -> list[str]:
        """What differs in both models' runs (the files, --limit, ...), then in one model's ("model B's the weights")."""
        each = [manifest_differences(wanted[side], found[side]) for side in MODELS]
        both = [what for what in each[0] if what in each[1]]
        return both + [f"model {side.upper()}'s {what}" for side, whats in zip(MODELS, each, strict=True)
                       for what in whats if what not in both]


class CompareStore:
    """A comparison's three stores of parts; a shard's comparison part is written after its a and b parts, so a shard
    is done when its three parts are there."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.parts = PairParts(self.out)
        self.stores = tuple(PartStore(self.out / side) for side in MODELS)

    @property
    def path(self) -> Path:
        return self.parts.path

    def manifest(self) -> dict[str, Any] | None:
        return self.parts.manifest()

    def open(self, manifest: dict[str, Any]) -> None:
        """Write the manifests (the comparison's, and dataset's in a/ and b/), or check the ones there, the comparison's
        first. Raises PartsError with what differs."""
        there = self.parts.check(manifest)
        for side, store in zip(MODELS, self.stores, strict=True):
            store.open(manifest[side])
        if not there:
            self.parts.open(manifest)

    def part_path(self, shard: Shard) -> Path:
        return self.parts.part_path(shard)

    def done(self, all_shards: Sequence[Shard]) -> set[int]:
        """The shards whose three parts are there."""
        return set.intersection(*(store.done(all_shards) for store in (self.parts, *self.stores)))

    def write(self, shard: Shard, totals: tuple[Totals, Totals], compared: CompareTotals, device: str,
              files_sha256: str) -> None:
        for store, one in zip(self.stores, totals, strict=True):
            store.write(shard, one, device, files_sha256)
        self.parts.write_part(shard, compared.arrays(), device, files_sha256)

    def merge_into(self, totals: CompareTotals, shard: Shard, files_sha256: str) -> None:
        """Add a shard's part to `totals`, its sums read a chunk at a time (`CompareTotals.merge_npz`). Raises
        PartsError for a part of another run or a damaged one."""
        with self.parts.opened_part(shard, files_sha256) as (npz, _):
            try:
                totals.merge_npz(npz)
            except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
                raise PartsError(f"{self.part_path(shard)} is damaged ({e or type(e).__name__}); remove it and run that "
                                 "shard again.") from None


def run_pair_shards(pair: Pair, store: CompareStore, todo: Sequence[Shard], files_sha256: str, *, batch_size: int,
                    workers: int = 0, progress: Progress | None = None, explain: Explain | None = None,
                    decoded: Callable[[Shard, Sequence[tuple[int, Any, Any]]], None] | None = None) -> None:
    """Analyse the shards `todo` with both models in this process; each shard's three parts written when it is done.
    `decoded(shard, items)`: each batch's decoded inputs, before the batch is analysed (so before its shard's parts
    are written)."""
    device = describe_device(pair.a.device)
    owner, batches = {}, []
    for shard in todo:
        for batch in consecutive_batches(shard.start, shard.stop, batch_size):
            owner[batch.start] = shard.number
            batches.append(batch)
    pending = {s.number: (s, shard_start(pair.plan_a, s), shard_start(pair.plan_b, s), CompareTotals()) for s in todo}
    remaining = {s.number: s.size for s in todo}
    for shard in todo:
        if shard.size == 0:
            _, ta, tb, tc = pending.pop(shard.number)
            store.write(shard, (ta, tb), tc, device, files_sha256)
    shard_of = {shard.number: shard for shard in todo}
    each = (lambda batch, items: decoded(shard_of[owner[batch.start]], items)) if decoded else None

    def into(batch: range) -> CompareTotals:  # each batch's comparison straight into its shard's sums
        return pending[owner[batch.start]][3]

    for indices, ta, tb, compared in reduce_pairs(pair, batches, workers=workers, progress=progress, explain=explain,
                                                  decoded=each, into=into):
        del compared  # pending[number]'s: gone with it once written, not kept until the next shard's sums are made
        number = owner[indices[0]]
        pending[number][1].merge(ta)
        pending[number][2].merge(tb)
        remaining[number] -= len(indices)
        if remaining[number] == 0:
            shard, sa, sb, sc = pending.pop(number)
            store.write(shard, (sa, sb), sc, device, files_sha256)
            del sc


def merged_compare(store: CompareStore, all_shards: Sequence[Shard], files_sha256: str) -> CompareTotals:
    """Every shard's part added, in shard order, into one CompareTotals (each read a chunk at a time into its sums)."""
    totals = CompareTotals()
    for shard in all_shards:
        store.merge_into(totals, shard, files_sha256)
    return totals


def js_moments_mean(js: ExactMoments) -> np.ndarray | None:
    return js.mean if js.count else None
