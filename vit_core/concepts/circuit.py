"""Concepts traced across layers: which features of one listed block feed which features of the next, by attribution
(a gradient, summed) and by removal (measured), over the held-out images.

Definitions: docs/spec/analyses.md, "Concepts" ("Circuit"). For consecutive listed blocks a < b with dictionaries
(s_a, d_u, z_u) and (s_b, W_enc, z_v), on one image with patch tokens x (N, D) after block a:

    attribution(u -> v) = sum over the tokens t where z_v(t) > 0 of sum over the patch tokens t' of
                          z_u(t') * d pre_v(t) / d z_u(t')
                        = sum_t sum_t' z_u(t') s_a d_u . d pre_v(t) / d x(t')

with x = s_a (W_dec z + b_pre) + mu + e, the reconstruction's error e held constant, run through blocks a+1..b; pre_v
is v's encoder pre-activation. One backward pass per feature v that fires on the image gives its gradient
d (sum_t pre_v(t)) / d x (N, D), ROWS_AT_ONCE such rows at a time, all from one forward (a batched backward). The
removal of u is x - s_a z_u d_u on the patch tokens (the spec's "remove this concept"), run through blocks a+1..b and
encoded at b.

Shapes: T tokens (prefix and patches), N patches, D width, Fa / Fb the two dictionaries' features.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..dataset.analyze import consecutive_batches
from ..dataset.reductions import image_loader
from ..dataset.runs import RunPlan
from ..dataset.workers import forward_pool, map_forwards, pool_width
from ..explain.interventions import attention_heads, block_rows_from_qkv, block_tail, standard_block
from ..explain.passes import eval_mode, model_pass
from ..loading.model import LoadedModel
from ..runtime.devices import full_float32
from .collect import held_out_sources, residuals_after
from .folders import CIRCUIT_EDGES_PER_FEATURE, CIRCUIT_FILE, CIRCUIT_MAX_LAYERS
from .quality import first_block_after_removals, qkv_after_removals, removed_rows
from .sae import Concepts, ConceptsError

CIRCUIT_FORMAT = "vit-lens circuit 1"
EDGES_PER_FEATURE = CIRCUIT_EDGES_PER_FEATURE  # upstream features kept per downstream feature, by |attribution|
ROWS_AT_ONCE = 64  # rows of one image (one per feature) run through the blocks between two layers at once
MAX_LAYERS = CIRCUIT_MAX_LAYERS
CIRCUIT_IMAGES = 64  # held-out images the circuit is measured on, at most: each costs a backward pass per feature


def check_layers(layers: Sequence[int]) -> None:
    """1 to MAX_LAYERS blocks, increasing. Raises ConceptsError in one sentence."""
    if not 1 <= len(layers) <= MAX_LAYERS or any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
        raise ConceptsError(f"--layer {','.join(map(str, layers))}: give 1 to {MAX_LAYERS} blocks in increasing order.")


@contextlib.contextmanager
def gradient_pass(loaded: LoadedModel) -> Iterator[None]:
    """A pass of the shared model with gradients to its inputs: its lock held, eval mode, ViT Lens's float32. The
    parameters are left as they are (shared by the forward pool's replicas): callers ask `torch.autograd.grad` for the
    input's gradient alone, so no parameter's `.grad` is written."""
    with loaded.lock, torch.enable_grad(), eval_mode(loaded.model), full_float32(loaded.device):
        yield


def blocks_between(loaded: LoadedModel, h: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """The residual stream after block b of h (R, T, D) after block a: blocks a+1..b. -> (R, T, D)."""
    for block in loaded.model.blocks[a + 1:b + 1]:
        h = block(h)
    return h


def pre_activations(concepts: Concepts, tokens: torch.Tensor) -> torch.Tensor:
    """Encoder pre-activations (..., F) of tokens (..., D) in the model's units, with gradients."""
    return concepts.sae.pre_activations(concepts.normalisation.apply(tokens))


def _patches(loaded: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    return h[..., loaded.geometry.num_prefix_tokens:, :]  # (..., T, D) -> (..., N, D)


@dataclass(frozen=True)
class ImageAttribution:
    """One image's attributions between two dictionaries."""

    downstream: np.ndarray  # int64 (m,): the features v of layer b that fire on the image (those asked for)
    attribution: np.ndarray  # float64 (m, Fa): attribution(u -> v) on this image
    fires: np.ndarray  # bool (N, Fb): where each feature of layer b fires on the image


def image_attribution(loaded: LoadedModel, upstream: Concepts, downstream: Concepts, h: torch.Tensor,
                      wanted: np.ndarray | None = None) -> ImageAttribution:
    """attribution(u -> v) on one image for every u and every v of `wanted` (bool (Fb,), default all) that fires on
    it: h (T, D) is its residual stream after block a = upstream.layer. One forward of blocks a+1..b, then one
    backward per v, ROWS_AT_ONCE at a time (batched: the forward is the same for every v; `_BlocksGraph`); the sum over
    t' runs over u's k non-zero codes per token only. Call inside `gradient_pass`."""
    a, b = upstream.layer, downstream.layer
    h = h.detach().float()[None].clone().requires_grad_(True)  # (1, T, D): a copy, a capture's may be an inference tensor
    graph = _BlocksGraph(loaded, h, a, b)
    with torch.no_grad():
        z_a = upstream.codes(_patches(loaded, h[0]))  # (N, Fa)
        z_b = downstream.codes(graph.patches_after())  # (N, Fb)
    fires = z_b > 0  # (N, Fb)
    wanted_here = fires.any(dim=0).numpy() & (wanted if wanted is not None else True)
    features = np.flatnonzero(wanted_here)  # (m,)
    values, indices = z_a.topk(upstream.sae.k, dim=-1)  # (N, k): z_a's non-zero entries are among these
    directions = upstream.sae.W_dec.detach()[:, indices].double()  # (D, N, k)
    found = np.zeros((len(features), upstream.sae.num_features))
    encoder = downstream.sae.W_enc.detach() / downstream.normalisation.scale  # (Fb, D): d pre_v / d h_b(t)
    for first in range(0, len(features), ROWS_AT_ONCE):
        chosen = torch.as_tensor(features[first:first + ROWS_AT_ONCE])  # (r,)
        gradient = _patches(loaded, graph.gradient(fires[:, chosen].T, encoder[chosen])).double()  # (r, N, D)
        along = torch.einsum("rnd,dnk->rnk", gradient, directions) * values.double()  # (r, N, k): z_u d_u . grad
        per_feature = torch.zeros((len(chosen), upstream.sae.num_features), dtype=torch.float64)
        per_feature.index_add_(1, indices.reshape(-1), along.reshape(len(chosen), -1))
        found[first:first + len(chosen)] = upstream.normalisation.scale * per_feature.numpy()
    return ImageAttribution(features.astype(np.int64), found, fires.numpy())


class _BlocksGraph:
    """Blocks a+1..b run once on h (1, T, D) after block a, kept for the gradients of many outputs. Where block b is
    timm's standard block, its tail (projection, MLP) is left out of the graph: a gradient that reaches a few of b's
    output tokens only (a feature fires on a few) backs the tail up at those tokens alone (`block_tail` works token by
    token), then the attention and the blocks before it for every token."""

    def __init__(self, loaded: LoadedModel, h: torch.Tensor, a: int, b: int) -> None:
        self.loaded, self.h, self.p = loaded, h, loaded.geometry.num_prefix_tokens
        self.block = loaded.model.blocks[b]
        self.split = standard_block(self.block)
        if not self.split:
            self.after = blocks_between(loaded, h, a, b)  # (1, T, D)
            return
        self.entering = blocks_between(loaded, h, a, b - 1)  # (1, T, D): h itself where b = a + 1
        self.heads = attention_heads(self.block, self.entering)  # (1, T, H*hd)

    def _tail(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        normed = self.block.norm1(x) if self.block.attn.gate is not None else None
        return block_tail(self.block, x, heads, normed)

    def patches_after(self) -> torch.Tensor:
        """The residual stream after block b at the patches: (N, D), no gradient."""
        with torch.no_grad():
            after = self.after if not self.split else self._tail(self.entering, self.heads)
        return _patches(self.loaded, after[0])

    def gradient(self, at: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """For each row i, the gradient with respect to h of the sum over the patches t where at[i, t] (bool (r, N)) of
        direction[i] (r, D) . (the stream after block b at t): (r, T, D)."""
        r, t, d = len(at), self.h.shape[1], self.h.shape[2]
        if not self.split:
            outward = torch.zeros((r, t, d))
            outward[:, self.p:] = at[:, :, None] * direction[:, None, :]  # (r, T, D)
            (gradient,) = torch.autograd.grad(self.after, self.h, outward[:, None], retain_graph=True,
                                              is_grads_batched=True)  # (r, 1, T, D)
            return gradient[:, 0]
        rows, patches = at.nonzero(as_tuple=True)  # (M,), (M,): the (row, patch) pairs that the sums read
        count = len(rows)
        rows, patches = padded(rows, patches)  # (M',) each
        tokens = patches + self.p
        x = self.entering[0, tokens].detach().requires_grad_(True)  # (M', D)
        heads = self.heads[0, tokens].detach().requires_grad_(True)  # (M', H*hd)
        tail = self._tail(x[None], heads[None])[0]  # (M', D)
        outward = direction[rows]  # (M', D)
        outward[count:] = 0  # the padding's pairs add nothing
        into_x, into_heads = torch.autograd.grad(tail, (x, heads), outward)  # (M', D), (M', H*hd)
        rows, tokens = rows[:count], tokens[:count]
        outward_heads = torch.zeros((r, t, self.heads.shape[-1]))
        outward_heads[rows, tokens] = into_heads[:count]
        outward_x = torch.zeros((r, t, d))
        outward_x[rows, tokens] = into_x[:count]
        if self.entering is self.h:  # b = a + 1: the residual reaches h directly
            (gradient,) = torch.autograd.grad(self.heads, self.h, outward_heads[:, None], retain_graph=True,
                                              is_grads_batched=True)  # (r, 1, T, D)
            return gradient[:, 0] + outward_x
        gradient = torch.autograd.grad((self.heads, self.entering), self.h, (outward_heads[:, None], outward_x[:, None]),
                                       retain_graph=True, is_grads_batched=True)[0]  # (r, 1, T, D)
        return gradient[:, 0]


def removal_sums(loaded: LoadedModel, upstream: Concepts, downstream: Concepts, h: torch.Tensor,
                 edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each edge (u, v) of `edges` (int (E, 2)) on one image: the sum of z_v over the tokens where v fires, plain
    and with u removed at block a (h (T, D) after it) -> float64 (E,), (E,). An edge whose u does not fire on the
    image, or whose v does not, has its removed sum equal to the plain one. Block b runs, for each removal, only at
    the patches where one of u's downstream features fires (`patches_after_removals`): the sums read no other.
    Call inside `model_pass`."""
    a, b = upstream.layer, downstream.layer
    z_a = upstream.codes(_patches(loaded, h).float())  # (N, Fa)
    z_b = downstream.codes(_patches(loaded, blocks_between(loaded, h[None], a, b)[0]).float())  # (N, Fb)
    fires = z_b > 0  # (N, Fb)
    plain = (z_b.double() * fires)[:, edges[:, 1]].sum(dim=0).numpy()  # (E,)
    removed = plain.copy()
    by_upstream = {u: np.flatnonzero(edges[:, 0] == u) for u in np.unique(edges[:, 0]).tolist()}  # u -> its edges
    present = (z_a > 0).any(dim=0).numpy()
    needed = {u: fires[:, torch.as_tensor(edges[these, 1])].any(dim=1) for u, these in by_upstream.items()
              if present[u]}  # u -> bool (N,): the patches where one of its downstream features fires
    upstream_here = np.array([u for u, patches in needed.items() if patches.any()], dtype=np.int64)  # (U,)
    for first in range(0, len(upstream_here), ROWS_AT_ONCE):
        chosen = upstream_here[first:first + ROWS_AT_ONCE]  # (r,)
        selected = torch.stack([needed[u] for u in chosen.tolist()])  # (r, N)
        rows, patches = padded(*selected.nonzero(as_tuple=True))  # (M',) each: the (row, patch) pairs, row by row
        after = patches_after_removals(loaded, upstream, b, h, z_a, torch.as_tensor(chosen), rows, patches)  # (M', D)
        z_removed = downstream.codes(after.float())  # (M', Fb)
        ends = selected.sum(dim=1).cumsum(dim=0).tolist()
        for row, u in enumerate(chosen.tolist()):
            these = by_upstream[u]
            columns = torch.as_tensor(edges[these, 1])  # (e,): u's downstream features
            pairs = slice(ends[row - 1] if row else 0, ends[row])
            removed[these] = (z_removed[pairs][:, columns].double() * fires[selected[row]][:, columns]).sum(dim=0).numpy()
    return plain, removed


def padded(rows: torch.Tensor, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The M (row, patch) pairs, then copies of the first up to the next power of two (at least 64): the ragged work
    of a chunk then comes in a few sizes, whose freed memory the C heap reuses (with a new size per chunk a run's RSS
    grew by 60 MB per image). The pairs past M are to be ignored. -> (M',), (M',)"""
    size = max(64, 1 << max(0, len(rows) - 1).bit_length())
    fill = size - len(rows)
    first_row, first_patch = (rows[:1], patches[:1]) if len(rows) else (rows.new_zeros(1), patches.new_zeros(1))
    return torch.cat([rows, first_row.expand(fill)]), torch.cat([patches, first_patch.expand(fill)])


def patches_after_removals(loaded: LoadedModel, upstream: Concepts, b: int, h: torch.Tensor, z: torch.Tensor,
                           features: torch.Tensor, rows: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
    """The residual stream after block b at the (row, patch) pairs `rows`, `patches` (M,) of h (T, D) after block
    a = upstream.layer with one feature of `features` (r,) removed per row (`removed_rows`; z (N, Fa) h's codes there):
    (M, D). The blocks before b run whole (every token's keys and values reach b); b itself, where it is timm's
    standard block, runs its projection and MLP for those pairs alone."""
    a, p = upstream.layer, loaded.geometry.num_prefix_tokens
    removed, changed = removed_rows(loaded, upstream, h, z, features)  # (r, T, D), (r, T)
    rows, tokens = rows.to(removed.device), (patches + p).to(removed.device)
    block = loaded.model.blocks[b]
    if b > a + 1:
        removed = blocks_between(loaded, first_block_after_removals(loaded, h, removed, changed, a), a + 1, b - 1)
    if not standard_block(block):
        return block(removed)[rows, tokens]
    qkv = (qkv_after_removals(block, h, removed, changed) if b == a + 1
           else block.attn.qkv(block.norm1(removed)))  # (r, T, 3 H hd)
    return block_rows_from_qkv(block, removed, qkv, rows, tokens)


def top_upstream(attribution: np.ndarray, alive: np.ndarray, count: int = EDGES_PER_FEATURE) -> np.ndarray:
    """The edges: for each alive feature v (bool (Fb,)) its `count` features u with the largest |attribution(u -> v)|
    (float64 (Fb, Fa)) among those where it is not 0, ties broken by the lower index -> int64 (E, 2) of (u, v), by v then
    by rank."""
    edges = []
    for v in np.flatnonzero(alive).tolist():
        size = np.abs(attribution[v])
        order = np.lexsort((np.arange(len(size)), -size))  # largest first; equal ones by index
        edges += [(u, v) for u in order[:count].tolist() if size[u] > 0]
    return np.array(edges, dtype=np.int64).reshape(-1, 2)


def circuit_sources(plan: RunPlan, images: int = CIRCUIT_IMAGES) -> list:
    """The circuit's images: the first `images` held-out images (`held_out_sources`)."""
    return held_out_sources(plan, images)


def _each_held_out_image(loaded: LoadedModel, plan: RunPlan, images: int,
                         run: Callable[[LoadedModel, torch.Tensor], Any], workers: int, batch_size: int,
                         progress: Callable[[int, int], None] | None, done_before: int, of: int) -> Iterator[Any]:
    """run(model, x (1, 3, H, W)) for each held-out image in order, on the dataset engine's forward pool (each image
    alone at one torch thread, so the result does not depend on the pool's width)."""
    sources = circuit_sources(plan, images)
    batches = consecutive_batches(0, len(sources), batch_size)
    done = done_before
    with forward_pool(loaded, pool_width(loaded.device, len(sources))) as pool:
        for decoded, x, failed in image_loader(loaded, sources, batch_size, 0 if not sources else workers,
                                               batches=batches):
            done += len(decoded) + len(failed)
            if x is not None:
                yield from map_forwards(pool, loaded, run, list(x.split(1)))
            if progress:
                progress(done, of)


@dataclass(frozen=True)
class LayerPair:
    """The circuit between two consecutive listed blocks."""

    upstream: int  # block a
    downstream: int  # block b
    attribution: np.ndarray  # float64 (Fb, Fa), summed over the circuit's images
    alive: np.ndarray  # bool (Fb,): fires on some token of the circuit's images at block b
    edges: np.ndarray  # int64 (E, 2): (u, v)
    plain: np.ndarray  # float64 (E,): sum of z_v over the held-out tokens where v fires
    removed: np.ndarray  # float64 (E,): the same with u removed at block a

    @property
    def removal_effect(self) -> np.ndarray:
        """float64 (E,): 1 - removed / plain (plain > 0 for every edge: v is alive)."""
        return 1.0 - self.removed / self.plain


def layer_pair(loaded: LoadedModel, plan: RunPlan, upstream: Concepts, downstream: Concepts, workers: int = 0,
               batch_size: int = 8, progress: Callable[[int, int], None] | None = None,
               images: int = CIRCUIT_IMAGES) -> LayerPair:
    """The attributions over the circuit's images (`circuit_sources`: first pass), then the edges' removals (second
    pass). progress(images done, of twice the circuit's images)."""
    a, b = upstream.layer, downstream.layer
    count = len(circuit_sources(plan, images))
    total = np.zeros((downstream.sae.num_features, upstream.sae.num_features))
    alive = np.zeros(downstream.sae.num_features, dtype=bool)
    if progress:
        progress(0, 2 * count)

    def attributed(model: LoadedModel, x: torch.Tensor) -> ImageAttribution:
        with gradient_pass(model):
            with torch.no_grad():
                h = residuals_after(model, x.to(model.device), (a,))[0][0]  # (T, D)
            return image_attribution(model, upstream, downstream, h)

    for seen in _each_held_out_image(loaded, plan, images, attributed, workers, batch_size, progress, 0, 2 * count):
        total[seen.downstream] += seen.attribution  # in image order: the same sum whatever the pool
        alive |= seen.fires.any(axis=0)
    edges = top_upstream(total, alive)
    plain, removed = np.zeros(len(edges)), np.zeros(len(edges))

    def measured(model: LoadedModel, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        with model_pass(model):
            h = residuals_after(model, x.to(model.device), (a,))[0][0]  # (T, D)
            return removal_sums(model, upstream, downstream, h, edges)

    if len(edges):
        for image_plain, image_removed in _each_held_out_image(loaded, plan, images, measured, workers, batch_size, progress,
                                                               count, 2 * count):
            plain += image_plain
            removed += image_removed
    elif progress:
        progress(2 * count, 2 * count)
    return LayerPair(a, b, total, alive, edges, plain, removed)


def circuit_of(loaded: LoadedModel, plan: RunPlan, dictionaries: Sequence[Concepts], workers: int = 0,
               progress: Callable[[int, int], None] | None = None, images: int = CIRCUIT_IMAGES) -> list[LayerPair]:
    """Each pair of consecutive dictionaries' circuit, in order. progress(images done, of all passes' images)."""
    pairs = []
    steps = 2 * len(circuit_sources(plan, images)) * (len(dictionaries) - 1)
    for number, (upstream, downstream) in enumerate(zip(dictionaries, dictionaries[1:], strict=False)):
        before = number * steps // max(1, len(dictionaries) - 1)
        pairs.append(layer_pair(loaded, plan, upstream, downstream, workers, images=images,
                                progress=(lambda done, of, before=before: progress(before + done, steps))
                                if progress else None))
    return pairs


def circuit_json(pairs: Sequence[LayerPair], layers: Sequence[int]) -> dict[str, Any]:
    """circuit.json's content (docs/spec/interface.md, "Concepts")."""
    edges = []
    for pair in pairs:
        effect = pair.removal_effect
        for (u, v), attribution, removal in zip(pair.edges.tolist(), pair.attribution[pair.edges[:, 1], pair.edges[:, 0]],
                                                 effect, strict=True):
            edges.append({"from": {"layer": pair.upstream, "feature": u}, "to": {"layer": pair.downstream, "feature": v},
                          "attribution": float(attribution), "removal_effect": float(removal)})
    return {"format": CIRCUIT_FORMAT, "layers": list(layers), "edges": edges}


__all__ = ["CIRCUIT_FILE", "EDGES_PER_FEATURE", "MAX_LAYERS", "ImageCircuit", "LayerPair", "circuit_json", "circuit_of",
           "image_attribution", "image_circuit", "image_removal", "layer_pair", "removal_sums", "top_upstream"]


# ----------------------------------------------------------------------------------------------
# One image's circuit (the Concepts tab)

SHOWN_PER_LAYER = 5  # an image's strongest features shown per block


@dataclass(frozen=True)
class ImageCircuit:
    """One image through the listed blocks: its strongest features at each, joined by their attributions on it."""

    layers: tuple[int, ...]
    strongest: list[np.ndarray]  # per block int64 (S,): the features of the largest total activation, largest first
    totals: list[np.ndarray]  # per block float64 (S,): those totals, sum of z_f over the patches
    maps: list[np.ndarray]  # per block float32 (S, N): their activations per patch
    attribution: list[np.ndarray]  # per consecutive pair float64 (S_b, S_a): attribution(u -> v) on this image
    to_prediction: np.ndarray  # float64 (S_last,): attribution of the last block's features to the top-1's logit
    prediction: int  # the top-1 class


def strongest_of(z: torch.Tensor, count: int) -> np.ndarray:
    """The features (of codes z (N, F)) with the largest total activation over the patches, at most `count`, only
    those that fire, ties by the lower index: int64 (S,)."""
    totals = z.double().sum(dim=0).numpy()  # (F,)
    order = np.lexsort((np.arange(len(totals)), -totals))
    return order[:count][totals[order[:count]] > 0].astype(np.int64)


def image_circuit(loaded: LoadedModel, dictionaries: Sequence[Concepts], x: torch.Tensor,
                  shown: int = SHOWN_PER_LAYER) -> ImageCircuit:
    """The circuit of one image x (1, 3, H, W): at each dictionary's block its `shown` strongest features; between
    consecutive blocks the attribution of each shown u to each shown v on this image (`image_attribution`); from the
    last block to the prediction, each shown feature's z_f times the gradient of the top-1's logit with respect to it,
    summed over the patches (the same attribution with the logit in place of pre_v)."""
    from .quality import logits_after

    layers = tuple(c.layer for c in dictionaries)
    with gradient_pass(loaded):
        with torch.no_grad():
            found = residuals_after(loaded, x.to(loaded.device), layers)
            hs = [h[0].float() for h in found]  # per block (T, D)
            codes = [c.codes(_patches(loaded, h)) for c, h in zip(dictionaries, hs, strict=True)]  # per block (N, F)
            prediction = int(logits_after(loaded, found[-1], layers[-1]).argmax(-1)[0])
        strongest = [strongest_of(z, shown) for z in codes]
        attribution = []
        for i, (upstream, downstream) in enumerate(zip(dictionaries, dictionaries[1:], strict=False)):
            wanted = np.zeros(downstream.sae.num_features, dtype=bool)
            wanted[strongest[i + 1]] = True
            seen = image_attribution(loaded, upstream, downstream, hs[i], wanted)
            rows = {int(v): r for r, v in enumerate(seen.downstream)}
            attribution.append(np.stack([seen.attribution[rows[int(v)]][strongest[i]] for v in strongest[i + 1]])
                               if len(strongest[i + 1]) else np.zeros((0, len(strongest[i]))))
        last, h = dictionaries[-1], hs[-1].detach().clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(logits_after(loaded, h[None], layers[-1])[0, prediction], h)
        along = _patches(loaded, gradient).double() @ last.sae.W_dec.detach()[:, strongest[-1]].double()  # (N, S)
        to_prediction = last.normalisation.scale * (codes[-1][:, strongest[-1]].double() * along).sum(dim=0).numpy()
    return ImageCircuit(layers, strongest, [z[:, s].double().sum(dim=0).numpy() for z, s in zip(codes, strongest, strict=True)],
                        [z[:, s].T.numpy() for z, s in zip(codes, strongest, strict=True)], attribution, to_prediction,
                        prediction)


def image_removal(loaded: LoadedModel, upstream: Concepts, downstream: Concepts, x: torch.Tensor, u: int, v: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """v's activation on each patch of one image x (1, 3, H, W), plain and with u removed at u's block (x - s z_u d_u
    on the patch tokens, the spec's "remove this concept"): float32 (N,), (N,)."""
    with model_pass(loaded):
        h = residuals_after(loaded, x.to(loaded.device), (upstream.layer,))[0][0]  # (T, D)
        z = upstream.codes(_patches(loaded, h).float())  # (N, Fa)
        rows = torch.cat([h[None], removed_rows(loaded, upstream, h, z, torch.tensor([u]))[0]])  # (2, T, D): plain, removed
        after = _patches(loaded, blocks_between(loaded, rows, upstream.layer, downstream.layer)).float()  # (2, N, D)
        plain, removed = (downstream.codes(after[i])[:, v].numpy() for i in range(2))
    return plain, removed
