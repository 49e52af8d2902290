"""How far a dictionary can be trusted: whether another seed finds the same features (stability) and whether its
features steer the prediction (the steerable share).

Definitions: docs/spec/analyses.md, "Concepts" ("Stability", "Steerable share"). Shapes: D width, F features,
T tokens (prefix and patches), N patches, C classes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..dataset.analyze import consecutive_batches
from ..dataset.reductions import image_loader
from ..dataset.runs import RunPlan
from ..dataset.workers import forward_pool, map_forwards, pool_width
from ..explain.interventions import (
    block_from_qkv,
    keys_values,
    last_block_for_the_head_only,
    last_block_logits,
    logits_from_block,
    standard_block,
)
from ..explain.passes import model_pass
from ..loading.model import LoadedModel
from .collect import held_out_sources, residual_after
from .sae import Concepts, TopKSAE

STABLE_COSINE = 0.9  # a feature is stable when another seed's dictionary has a column this close to its own
REMOVALS_AT_ONCE = 64  # rows of one image, each with one feature removed, run through the later blocks at once


def decoder_match(first: TopKSAE, second: TopKSAE) -> np.ndarray:
    """float64 (F1,): per feature of `first`, the largest cosine between its decoder column and any column of
    `second` (columns normalised here, so the cosine is exact whatever their stored norm)."""
    a = torch.nn.functional.normalize(first.W_dec.detach().double(), dim=0)  # (D, F1)
    b = torch.nn.functional.normalize(second.W_dec.detach().double(), dim=0)  # (D, F2)
    return (a.T @ b).max(dim=1).values.clamp(-1, 1).numpy()  # (F1, F2) -> (F1,)


def stability_of(match: np.ndarray, alive: np.ndarray) -> dict[str, float]:
    """`stability`: the mean of `match` (F,) over the alive features (bool (F,)); `stable_share`: the share of them
    whose match is above STABLE_COSINE. NaN for both without an alive feature."""
    if not alive.any():
        return {"stability": float("nan"), "stable_share": float("nan")}
    return {"stability": float(match[alive].mean()), "stable_share": float((match[alive] > STABLE_COSINE).mean())}


def logits_after(loaded: LoadedModel, h: torch.Tensor, layer: int) -> torch.Tensor:
    """The logits (B, C) of the residual stream h (B, T, D) after block `layer`: the later blocks, the final norm and
    the head, as the model's own forward runs them, the last block for the class token's row alone where the head
    reads only it (`logits_from_block`: the same logits to float rounding; the keys and values, a quarter of the last
    block's linear work in the Shapes ViT). Call inside `model_pass`."""
    return logits_from_block(loaded.model, h, layer + 1)


def removals_logits(loaded: LoadedModel, h: torch.Tensor, removed: torch.Tensor, changed: torch.Tensor,
                    layer: int) -> torch.Tensor:
    """`logits_after` of the rows `removed` (r, T, D), each h (T, D) with some tokens changed (`changed`, bool (r, T)).
    A removal changes the tokens where its feature fires, a few of them: where the only later block is the last one
    and it runs for the head only, the keys and values of the others are h's, computed once; else the next block
    takes their queries, keys and values from h (`first_block_after_removals`). Call inside `model_pass`."""
    model = loaded.model
    if layer + 1 == len(model.blocks):
        return logits_after(loaded, removed, layer)
    if layer + 2 != len(model.blocks) or not last_block_for_the_head_only(model):
        return logits_after(loaded, first_block_after_removals(loaded, h, removed, changed, layer), layer + 1)
    block = model.blocks[-1]
    kv = keys_values(block, h)[None].repeat(len(removed), 1, 1)  # (r, T, 2 H hd)
    kv[changed] = keys_values(block, removed[changed])  # (M, D) -> (M, 2 H hd): the changed tokens, one linear
    return last_block_logits(model, removed, kv)


def first_block_after_removals(loaded: LoadedModel, h: torch.Tensor, removed: torch.Tensor, changed: torch.Tensor,
                               layer: int) -> torch.Tensor:
    """Block `layer` + 1 run on the rows `removed` (r, T, D), each h (T, D) with the tokens `changed` (bool (r, T))
    changed: where it is timm's standard block, the queries, keys and values of the tokens a row leaves as they are
    are h's, computed once (3/8 of the block's linear work in the Shapes ViT). -> (r, T, D). Call inside `model_pass`."""
    block = loaded.model.blocks[layer + 1]
    if not standard_block(block):
        return block(removed)
    return block_from_qkv(block, removed, qkv_after_removals(block, h, removed, changed))


def qkv_after_removals(block: torch.nn.Module, h: torch.Tensor, removed: torch.Tensor, changed: torch.Tensor
                       ) -> torch.Tensor:
    """The attention's qkv of norm1 (r, T, 3 H hd) of the rows `removed` (r, T, D) entering timm's standard `block`,
    each h (T, D) with the tokens `changed` (bool (r, T)) changed: h's computed once, the changed tokens' alone."""
    qkv = block.attn.qkv(block.norm1(h))[None].repeat(len(removed), 1, 1)  # (r, T, 3 H hd)
    qkv[changed] = block.attn.qkv(block.norm1(removed[changed]))  # (M, D) -> (M, 3 H hd): the changed tokens
    return qkv


def removed_rows(loaded: LoadedModel, concepts: Concepts, h: torch.Tensor, z: torch.Tensor, features: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """h (T, D) repeated once per feature f of `features` (r,), each row with s z_f d_f taken off its patch tokens
    (the spec's "remove this concept"; z (N, F) the codes of h's patches), and the tokens each row changes (where
    z_f > 0; elsewhere the share is 0): (r, T, D), bool (r, T)."""
    p = loaded.geometry.num_prefix_tokens
    shares = concepts.normalisation.scale * z[:, features].T[:, :, None] * concepts.sae.W_dec[:, features].T[:, None, :]
    rows = h[None].repeat(len(features), 1, 1)  # (r, T, D)
    rows[:, p:] = h[None, p:] - shares.to(h.dtype)  # (r, N, D): one feature less on each row
    changed = torch.zeros(rows.shape[:2], dtype=torch.bool)  # (r, T)
    changed[:, p:] = z[:, features].T > 0
    return rows, changed.to(rows.device)


def image_steers(loaded: LoadedModel, concepts: Concepts, h: torch.Tensor, candidates: np.ndarray) -> np.ndarray:
    """Which of the `candidates` (int (m,) features) change this image's top-1 when removed: h (T, D) is its residual
    stream after the concepts' layer, each removal x - s z_f d_f on its patch tokens (the spec's "remove this
    concept"), run REMOVALS_AT_ONCE at a time. -> bool (m,). Call inside `model_pass`."""
    host = h.float().cpu()  # (T, D): the removals are made on the host, once per chunk of candidates
    z = concepts.codes(host[loaded.geometry.num_prefix_tokens:])  # (N, F)
    plain = int(logits_after(loaded, h[None].to(loaded.device), concepts.layer).argmax(-1)[0])
    steers = np.zeros(len(candidates), dtype=bool)
    for first in range(0, len(candidates), REMOVALS_AT_ONCE):
        chosen = torch.as_tensor(candidates[first:first + REMOVALS_AT_ONCE])  # (r,)
        removed, changed = removed_rows(loaded, concepts, host, z, chosen)  # (r, T, D), (r, T)
        top = removals_logits(loaded, h, removed.to(h.dtype).to(loaded.device), changed.to(loaded.device),
                              concepts.layer).argmax(-1).cpu()  # (r,)
        steers[first:first + len(chosen)] = (top != plain).numpy()
    return steers


def steerable(loaded: LoadedModel, concepts: Concepts, plan: RunPlan, alive: np.ndarray, workers: int = 0,
              batch_size: int = 8, progress: Callable[[int, int], None] | None = None,
              forwards: int | None = None, images: int | None = None) -> np.ndarray:
    """bool (F,): the alive features whose removal changes the top-1 of at least one held-out image (the first
    `images` of them: `held_out_sources`) on whose patches they fire (z_f > 0). Every image tries every alive
    feature that fires on it, so images are independent: on a CPU `forwards` of them at once (default
    `model_workers`), each on its own thread at one torch thread, as the dataset engine runs its forwards (the same
    bits whatever their number). progress(images, of) per batch."""
    sources = held_out_sources(plan, images)
    found = np.zeros(len(alive), dtype=bool)
    done = 0
    if progress:
        progress(0, len(sources))

    def one_image(model: LoadedModel, x: torch.Tensor) -> np.ndarray:  # x (1, 3, H, W) -> the features it steers
        with model_pass(model):
            h = residual_after(model, x.to(model.device), concepts.layer)[0]  # (T, D)
            fires = (concepts.codes(h[model.geometry.num_prefix_tokens:].float().cpu()) > 0).any(dim=0).numpy()
            candidates = np.flatnonzero(fires & alive)  # (m,)
            return candidates[image_steers(model, concepts, h, candidates)] if len(candidates) else candidates

    batches = consecutive_batches(0, len(sources), batch_size)
    with forward_pool(loaded, pool_width(loaded.device, len(sources), forwards)) as pool:
        for decoded, x, failed in image_loader(loaded, sources, batch_size, 0 if not sources else workers, batches=batches):
            done += len(decoded) + len(failed)
            if x is not None:
                for steering in map_forwards(pool, loaded, one_image, list(x.split(1))):
                    found[steering] = True
            if progress:
                progress(done, len(sources))
    return found


def steerable_share(found: np.ndarray, alive: np.ndarray) -> float:
    """The share of the alive features (bool (F,)) that steer (`steerable`); NaN without an alive feature."""
    return float(found[alive].mean()) if alive.any() else float("nan")
