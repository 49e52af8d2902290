"""The per-image values of a batch, computed on the model's device: decoding, then one hooked forward reduced as it goes.

Why here and not with a capture: one image's capture keeps every attention pattern (L, H, T, T) on the host, which
is fine for one picture and ruinous for a folder (32 images of ViT-B/16: about 700 MB per batch, and copying it off
a GPU costs more than the forward itself). Here each batch runs hooked forwards, and the hooks reduce on the
device, layer by layer, as the pass goes: the pattern to mean attention distance (B, H) in both conventions, the
tokens to their high-norm rate (B,) and their logit-lens top-1 (B,). Only those small arrays reach the host; the
patterns are dropped as soon as their block is done. Every forward has the same number of images
(`forward_images`), so an image's values don't depend on its batch.

Images are decoded (in DataLoader worker processes, or a Ray stage) with vit_core.images (the same checks as one
upload) and the model's own eval transform. Shapes: B images, L blocks, H heads, T = P + N tokens, C classes.
Blocks are numbered from 0 as in `model.blocks`; a residual-stream array has L + 1 rows: row 0 the embeddings
entering block 0, row b + 1 the tokens after block b.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from .. import analyses, explain
from ..errors import CaptureError, ImageError
from ..hooks import attention_recorded, foreign_hooks, intermediates_kept, tokens_recorded
from ..images import DRAFT_MIN_SIDE, load_image
from ..lenses import Lens, LensError, arrays_of, sites_of
from ..loading.model import Geometry, LoadedModel
from ..runtime.devices import full_float32
from ..runtime.tracing import exact_trace
from ..sites import recorded_sites, sites_recorded
from .workers import ForwardPool, map_forwards, replica

Source = tuple[str, "bytes | Path"]  # (image name, raw file bytes or a path)


# ----------------------------------------------------------------------------------------------
# Decoding in worker processes


class DecodedImages(Dataset):
    """The sources as model inputs: item i is (i, float32 (3, H, W) normalised input) or (i, the reason it
    could not be read). Holds only picklable things (the sources and the two transforms, not the model),
    so DataLoader workers can have it."""

    def __init__(self, sources: Sequence[Source], crop_transform: Callable, tensor_transform: Callable,
                 min_side: int = DRAFT_MIN_SIDE, crops: bool = False):
        self.sources = list(sources)
        self.crop_transform, self.tensor_transform = crop_transform, tensor_transform
        self.min_side = min_side  # a large JPEG's decode keeps this shorter side (LoadedModel.decode_min_side)
        self.crops = crops  # each item's input paired with its crop, uint8 (H, W, 3): what a lens's capture shows

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | tuple[torch.Tensor, np.ndarray] | str]:
        _, source = self.sources[index]
        crop = decoded_crop(source, self.crop_transform, self.min_side)
        if isinstance(crop, str):
            return index, crop
        x = self.tensor_transform(crop)  # (3, H, W), as capture.preprocess
        return index, (x, np.asarray(crop, dtype=np.uint8)) if self.crops else x


def decoded_crop(source: bytes | Path, crop_transform: Callable, min_side: int = DRAFT_MIN_SIDE) -> Image.Image | str:
    """One file as the model's crop (PIL RGB, the model's input size), or the reason it can't be used: the same
    hostile-input checks as one upload (vit_core.images), then the model's resize and crop."""
    try:
        image = load_image(source, min_side)  # RGB
        return crop_transform(image)  # refuses what the model's resize would enlarge too far
    except ImageError as e:
        return str(e)


def collate_decoded(items: list[tuple[int, torch.Tensor | str]]
                    ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[int, str]]]:
    """A batch of DecodedImages items -> (indices (B,) int64, inputs (B, 3, H, W) or None when every
    image failed, failures [(index, reason)]): the failures kept aside, the rest stacked."""
    good = [(i, x) for i, x in items if isinstance(x, torch.Tensor)]
    failures = [(i, x) for i, x in items if not isinstance(x, torch.Tensor)]
    indices = torch.tensor([i for i, _ in good], dtype=torch.long)
    inputs = torch.stack([x for _, x in good]) if good else None  # B x (3, H, W) -> (B, 3, H, W)
    return indices, inputs, failures


def collate_with_crops(items: list[tuple[int, tuple[torch.Tensor, np.ndarray] | str]]
                       ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[int, str]], np.ndarray | None]:
    """collate_decoded of DecodedImages(crops=True) items, and the crops uint8 (B, H, W, 3) (None when every image
    failed)."""
    indices, inputs, failures = collate_decoded([(i, x if isinstance(x, str) else x[0]) for i, x in items])
    crops = [x[1] for _, x in items if not isinstance(x, str)]
    return indices, inputs, failures, np.stack(crops) if crops else None  # B x (H, W, 3) -> (B, H, W, 3)


def image_loader(loaded: LoadedModel, sources: Sequence[Source], batch_size: int, workers: int,
                 batches: Sequence[Sequence[int]] | None = None, crops: bool = False) -> DataLoader:
    """The batches of `sources` as collate_decoded gives them (with `crops`: as collate_with_crops), decoded by
    `workers` processes (0: in this one) with the model's own transforms; pinned host memory when the model is on a
    GPU. `batches`: the indices of each batch, in order (default: consecutive batches of `batch_size`), so that a
    run's batches can stop at its shards' edges while one set of worker processes serves them all."""
    decoded = DecodedImages(sources, loaded.crop_transform, loaded.tensor_transform, loaded.decode_min_side, crops)
    pin, collate = loaded.device.type == "cuda", collate_with_crops if crops else collate_decoded
    if batches is not None:
        return DataLoader(decoded, batch_sampler=[list(b) for b in batches], num_workers=workers,
                          collate_fn=collate, pin_memory=pin)
    return DataLoader(decoded, batch_size=batch_size, num_workers=workers, collate_fn=collate, pin_memory=pin)


# ----------------------------------------------------------------------------------------------
# Reductions on the device (torch versions of analyses.py's definitions, batched)


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float64 for the norm quartiles, as analyses.high_norm_fence computes them; Apple's MPS has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def attention_sums(pattern: torch.Tensor, distance: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """What mean attention distance needs of one layer's pattern, per patch query: pattern (B, H, T, T), distance
    (N, N) pixels float32 -> float32 (B, H, 2, N): [..., 0, i] sum_j a_ij d_ij, [..., 1, i] sum_j a_ij, over patch keys
    j. Each row contiguous: a strided mean would sum in another order, and another last bit."""
    p = num_prefix_tokens
    patch_to_patch = pattern[:, :, p:, p:].float()  # (B, H, N, N): a view when the pattern is float32 already
    return torch.stack([(patch_to_patch * distance).sum(dim=-1), patch_to_patch.sum(dim=-1)], dim=-2)


def distances_of_sums(sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention distance in both conventions of analyses.mean_attention_distance from `attention_sums`
    (..., 2, N) -> ((...) prefix attention left out, (...) each patch row renormalised over patch keys), float32."""
    per_query, row_mass = sums[..., 0, :], sums[..., 1, :]  # (..., N)
    return per_query.mean(dim=-1), (per_query / row_mass.clamp_min(1e-12)).mean(dim=-1)


def attention_distances(pattern: torch.Tensor, distance: torch.Tensor,
                        num_prefix_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention distance of every image and head of one layer, in both conventions of
    analyses.mean_attention_distance: pattern (B, H, T, T), distance (N, N) pixels float32 ->
    ((B, H) prefix attention left out, (B, H) each patch row renormalised over patch keys), float32."""
    return distances_of_sums(attention_sums(pattern, distance, num_prefix_tokens))


def token_norms(tokens: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of every token, as explain.token_norms (float64, then float32 where the device has
    float64): (B, T, D) -> float32 (B, T)."""
    return torch.linalg.vector_norm(tokens.to(_exact_dtype(tokens.device)), dim=-1).float()


def high_norm_rates(norms: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Share of patch tokens above Q3 + 3 IQR of their row's patch norms (analyses.high_norm_rate, one
    layer of one image per row): norms float32 (..., T) -> float32 (...). Quartiles by linear interpolation in
    float64 (float32 on MPS), as numpy's, so the fence equals analyses.high_norm_fence."""
    patch_norms = norms[..., num_prefix_tokens:]  # (..., N)
    exact = _exact_dtype(norms.device)
    quartiles = torch.quantile(patch_norms.to(exact), torch.tensor([0.25, 0.75], dtype=exact, device=norms.device), dim=-1)
    q1, q3 = quartiles  # (2, ...) -> (...), (...)
    fence = (q3 + analyses.HIGH_NORM_IQR_FACTOR * (q3 - q1)).float()  # (...)
    return (patch_norms > fence[..., None]).float().mean(dim=-1)


def patch_distances_on(geometry: Geometry, device: torch.device) -> torch.Tensor:
    """analyses.patch_distances of the model's grid as float32 (N, N) pixels on `device`: made once per run."""
    return torch.from_numpy(analyses.patch_distances(geometry.grid, geometry.patch_size)).float().to(device)


@dataclass
class _BatchReductions:
    """What the hooks of one forward left, all on the device; lists in layer order. Each hook keeps the least it
    must (the pattern and the tokens are gone after their block), and `reduced` finishes all layers at once: a few
    operators per forward rather than a dozen per layer, which a small model's forward would feel."""

    attention_sums: list[torch.Tensor] = field(default_factory=list)  # L x (B, H, 2, N): attention_sums
    norms: list[torch.Tensor] = field(default_factory=list)  # (L+1) x (B, T): token_norms
    lens_top1: list[torch.Tensor] = field(default_factory=list)  # (L+1) x (B,), only when asked for

    def reduced(self, num_prefix_tokens: int) -> dict[str, torch.Tensor]:
        """The per-image values, keyed as BatchValues' fields: distance and distance_renorm (B, L, H), high_norm_rate
        (B, L+1), and lens_top1 (B, L+1) when it was recorded."""
        distance, renormalised = distances_of_sums(torch.stack(self.attention_sums, dim=1))  # (B, L, H, 2, N) -> (B, L, H)
        values = {"distance": distance, "distance_renorm": renormalised,
                  "high_norm_rate": high_norm_rates(torch.stack(self.norms, dim=1), num_prefix_tokens)}  # (B, L+1)
        if self.lens_top1:
            values["lens_top1"] = torch.stack(self.lens_top1, dim=1)  # (L+1) x (B,) -> (B, L+1)
        return values


@contextlib.contextmanager
def reductions_recorded(loaded: LoadedModel, store: _BatchReductions, distance: torch.Tensor, logit_lens: bool) -> Iterator[None]:
    """Inside the block, a forward of `loaded.model` reduces as it goes: each block's attention pattern to
    what its mean attention distances need, the tokens entering block 0 and after each block to their norms
    and (with `logit_lens`) the top-1 class of the model's head path on them (explain.logit_lens); `store.reduced`
    finishes them. Hooks and the attention flags are removed / restored on exit, also when the forward raises."""
    model, p = loaded.model, loaded.geometry.num_prefix_tokens

    def reduce_pattern(pattern: torch.Tensor) -> None:
        store.attention_sums.append(attention_sums(pattern, distance, p))

    def reduce_tokens(tokens: torch.Tensor) -> None:
        store.norms.append(token_norms(tokens))
        if logit_lens:
            store.lens_top1.append(explain.head_logits(model, tokens).argmax(dim=-1))  # (B, C) -> (B,)

    with contextlib.ExitStack() as stack:
        stack.enter_context(attention_recorded(model, reduce_pattern))
        stack.enter_context(tokens_recorded(model, reduce_tokens))
        yield


@dataclass(frozen=True)
class LensedImage:
    """What the lenses gave on one image."""

    arrays: dict[str, np.ndarray]  # <lens>.<key> -> its array on this image (vit_core.lenses.arrays_of)
    failed: tuple[str, ...] = ()  # the sentences of the lenses that raised on it


@dataclass(frozen=True)
class BatchValues:
    """The per-image values of one batch, on the host: the small arrays the device sent back."""

    distance: np.ndarray  # float32 (B, L, H), pixels
    distance_renorm: np.ndarray  # float32 (B, L, H)
    high_norm_rate: np.ndarray  # float32 (B, L+1)
    top1: np.ndarray  # int64 (B,): the predicted class
    probability: np.ndarray  # float32 (B,): its softmax probability
    lens_top1: np.ndarray | None  # int64 (B, L+1), None when the logit lens was not asked for
    lensed: tuple[LensedImage, ...] | None = None  # B of them when lenses were asked for, read on the same forward


def forward_images(device: torch.device) -> int:
    """Images in every hooked forward on `device`, whatever the batch size: a matrix product's library picks its
    algorithm (and so its order of summation) by the product's shape, so an image's last bits would depend on how
    many images shared its forward (a batch of 8 and one of 1 gave ViT-B/16's head probabilities 3e-9 apart).
    One shape for every forward makes them a function of the image alone, whichever batch, shard or engine it was
    in. One image on a CPU, where one is as fast per image as eight (and `workers.model_workers` run at once); 64
    on an accelerator, where a batch is most of the speed (a shorter batch is padded with zero images, whose values
    are dropped)."""
    return 1 if device.type == "cpu" else 64


def padded_forwards(x: torch.Tensor, size: int) -> list[tuple[slice, torch.Tensor]]:
    """x (B, ...) as forwards of `size` images each: (the rows of x it holds, its input (size, ...)), a short last one
    padded with zero images after the real ones, so that every forward has the same shape (`forward_images`)."""
    forwards = []
    for first in range(0, len(x), size):
        rows = slice(first, min(first + size, len(x)))
        chunk = x[rows]
        if len(chunk) < size:
            chunk = torch.cat([chunk, chunk.new_zeros((size - len(chunk), *chunk.shape[1:]))])
        forwards.append((rows, chunk))
    return forwards


def lensed_image(lenses: Sequence[Lens], cap) -> LensedImage:
    """Every lens's arrays on the capture `cap`, and the sentences of those that raised: one lens failing leaves the
    others' arrays."""
    arrays, failed = {}, []
    for one in lenses:
        try:
            arrays |= arrays_of(one, cap)
        except LensError as e:
            failed.append(str(e))
    return LensedImage(arrays, tuple(failed))


def _lensed(loaded: LoadedModel, lenses: Sequence[Lens], sites: tuple[str, ...], crops: np.ndarray, x: torch.Tensor,
            logits: torch.Tensor, store: dict[str, list[torch.Tensor]], seconds: float) -> list[LensedImage]:
    """The lenses on each real image of one forward: its capture (`capture.capture_of_pass`) cut out of the forward's
    (F, ...) tensors, row i for the crop crops[i] (uint8 (H, W, 3)) and input x[i] (x (F, 3, H, W) on the host)."""
    from ..capture import capture_of_pass

    lensed = []
    for i in range(len(crops)):
        one = {key: [t[i:i + 1] for t in tensors] for key, tensors in store.items()}  # (F, ...) -> (1, ...)
        cap = capture_of_pass(loaded, crops[i].copy(), x[i:i + 1], logits[i:i + 1], one, seconds, sites)
        lensed.append(lensed_image(lenses, cap))
    return lensed


def _reduce_forward(loaded: LoadedModel, x: torch.Tensor, logit_lens: bool, distance: torch.Tensor,
                    lenses: Sequence[Lens] = (), crops: np.ndarray | None = None) -> dict[str, torch.Tensor | list]:
    """One hooked forward of x (F, 3, H, W) on the model's device, reduced there: the per-image values, on the
    device, keyed as BatchValues' fields. With `lenses`, the same forward also records what a capture holds and
    the sites they read, and "lensed" is the lenses on each of the images of `crops` ((F', H, W, 3), F' <= F: the
    real images, before any padding)."""
    geometry, model = loaded.geometry, loaded.model
    store = _BatchReductions()
    kept: dict[str, list[torch.Tensor]] = {}
    sites = recorded_sites(sites_of(lenses), geometry.num_layers) if lenses else ()

    def keep(key: str, tensor: torch.Tensor) -> None:
        kept.setdefault(key, []).append(tensor.detach())

    with contextlib.ExitStack() as stack:
        stack.enter_context(loaded.lock)
        stack.enter_context(torch.inference_mode())
        stack.enter_context(explain.eval_mode(model))
        stack.enter_context(full_float32(loaded.device))
        stack.enter_context(reductions_recorded(loaded, store, distance, logit_lens))
        if lenses:
            stack.enter_context(intermediates_kept(model, keep))
            stack.enter_context(sites_recorded(model, sites, keep))
        started = time.perf_counter()
        logits = model(x.to(loaded.device, non_blocking=True))  # (F, C)
        seconds = time.perf_counter() - started
    if len(store.attention_sums) != geometry.num_layers:
        raise CaptureError(f"expected one attention pattern per block ({geometry.num_layers}), got "
                           f"{len(store.attention_sums)}: this model's attention does not run through timm's standard path.")
    assert len(store.norms) == geometry.num_layers + 1, f"{len(store.norms)} token reductions"
    values: dict[str, torch.Tensor | list] = {
        **store.reduced(geometry.num_prefix_tokens),
        "top1": logits.argmax(dim=-1),  # (F,): the first maximum, as np.argmax
        "probability": logits.float().softmax(dim=-1).amax(dim=-1),  # (F,)
    }
    if lenses:
        values["lensed"] = _lensed(loaded, lenses, sites, crops, x, logits, kept, seconds)
    return values


# A run's forwards go through a trace where it pays: the workers' turns at the GIL between operators weigh in a short
# forward (two workers, per image: the Shapes ViT 7.5 -> 5.7 ms, ViT-Ti/16 26.0 -> 18.0, ViT-S/16 65.6 -> 60.8;
# recording took 0.5-1 s), not in a long one (ViT-B/16: the same 463 ms at one thread, and 3.1 s to record).
TRACED_FORWARD_MACS = 1e10  # LoadedModel.multiply_adds


class _ReducedForward(torch.nn.Module):
    """`_reduce_forward` of one model and the run's options as a module of (x, distance), its values' tensors in
    the order of `keys` (those of its last forward): what torch.jit.trace records."""

    def __init__(self, loaded: LoadedModel, logit_lens: bool) -> None:
        super().__init__()
        self.model = loaded.model  # a submodule, so that the trace reads its parameters in place, not as constants
        self.loaded, self.logit_lens = loaded, logit_lens
        self.keys: tuple[str, ...] = ()

    def forward(self, x: torch.Tensor, distance: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = _reduce_forward(self.loaded, x, self.logit_lens, distance)
        self.keys = tuple(values)
        return tuple(values.values())


TracedForward = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]  # (x, distance) -> _reduce_forward's values


def traced_reductions(loaded: LoadedModel, x: torch.Tensor, logit_lens: bool, distance: torch.Tensor
                      ) -> TracedForward | None:
    """`_reduce_forward` without lenses, as a TorchScript trace recorded on x (F, 3, H, W) at this thread's torch
    threads: valid for inputs of x's shape, the same values bit for bit (vit_core.runtime.tracing.exact_trace). None
    where the model stays eager: a hook that someone else put on it (a trace would drop it), tracing failing, or
    the trace's values differing from the eager forward's.

    Why: a forward is hundreds of operators each called from Python, and W workers take turns at the GIL between
    them; the trace runs them all in C++ without it (TRACED_FORWARD_MACS; docs/performance.md). Recording and
    checking it costs about seven forwards, once per run."""
    if foreign_hooks(loaded.model):
        return None
    module = _ReducedForward(replica(loaded), logit_lens)  # a replica: its hooks fire only here, on its own modules
    with torch.inference_mode():
        graph = exact_trace(module, (x, distance), f"{loaded.name}: the dataset's forward")
    if graph is None:
        return None
    keys = module.keys

    def traced(x: torch.Tensor, distance: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.inference_mode():
            return dict(zip(keys, graph(x, distance), strict=True))

    return traced


def reduce_batch(loaded: LoadedModel, x: torch.Tensor, logit_lens: bool, distance: torch.Tensor | None = None, *,
                 pool: ForwardPool | None = None, lenses: Sequence[Lens] = (), crops: np.ndarray | None = None,
                 analysed: Callable[[int], None] | None = None) -> BatchValues:
    """The batch x (B, 3, H, W) through hooked forwards of `forward_images` images each on the model's device,
    reduced there; only the per-image values come back, and each image's are the same bits whatever else was in
    its batch. The forwards run on `pool`'s workers, several at once (`workers.ForwardPool`; without lenses, for a
    model under TRACED_FORWARD_MACS, through the pool's one trace of the forward: `traced_reductions`), or without a
    pool one at a time, each under `loaded.lock`; inside inference_mode, in full float32 on a GPU (as a capture: results equal the
    CPU's within float32 tolerance; an autocast around the call still runs in bfloat16); eval mode restored after.
    With `lenses` (and `crops`, uint8 (B, H, W, 3), the images' crops), each image's lens arrays from the same
    forward (`BatchValues.lensed`). analysed(n), in this thread, as each forward's n images are done, in order (a
    progress bar's step). Raises SiteError (before any forward) for a site a lens reads that this model hasn't."""
    device, count = loaded.device, len(x)
    if distance is None:
        distance = patch_distances_on(loaded.geometry, device)
    if lenses:
        if crops is None or len(crops) != count:
            raise ValueError("lenses need the crop of every image of the batch")
        recorded_sites(sites_of(lenses), loaded.geometry.num_layers)  # a site this model hasn't: said before any pass
    forwards = padded_forwards(x, forward_images(device))
    traced = None
    if pool is not None and not lenses and loaded.multiply_adds < TRACED_FORWARD_MACS:  # one trace per run, on its first forward
        first = forwards[0][1]
        traced = pool.once(("reductions", logit_lens, tuple(first.shape)),
                           lambda: traced_reductions(loaded, first, logit_lens, distance))

    def reduced(model: LoadedModel, forward: tuple[slice, torch.Tensor]) -> dict[str, torch.Tensor | list]:
        rows, chunk = forward
        if traced is not None:
            return traced(chunk, distance)
        return _reduce_forward(model, chunk, logit_lens, distance, lenses, crops[rows] if lenses else None)

    parts = map_forwards(pool, loaded, reduced, forwards,
                         None if analysed is None else lambda i: analysed(forwards[i][0].stop - forwards[i][0].start))
    keys = [key for key in parts[0] if key != "lensed"]
    host = {key: torch.cat([part[key] for part in parts])[:count].cpu().numpy() for key in keys}  # one copy each
    return BatchValues(
        distance=host["distance"].astype(np.float32), distance_renorm=host["distance_renorm"].astype(np.float32),
        high_norm_rate=host["high_norm_rate"].astype(np.float32), top1=host["top1"].astype(np.int64),
        probability=host["probability"].astype(np.float32),
        lens_top1=host["lens_top1"].astype(np.int64) if logit_lens else None,
        lensed=tuple(one for part in parts for one in part["lensed"]) if lenses else None,
    )


def default_batch_size(device: torch.device) -> int:
    """Images per decoded batch (how many are read, and whose values reach the host, at a time): 32 on a CPU, 64 on an
    accelerator. The forwards inside a batch take `forward_images` each, so the batch size moves no result. On a CPU
    the model workers wait at each batch's end for its last forward and for the next batch: with 8 images they were
    idle a tenth of the Shapes ViT's run, with 32 a thirtieth (docs/performance.md)."""
    return 32 if device.type == "cpu" else 64
