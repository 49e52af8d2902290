"""Interventions: the prediction after dropping patch tokens, masking patches' pixels or ablating heads.

Each reruns the shared model from the image; hooks live only inside the pass (`vit_core.hooks`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from timm.layers import Attention
from timm.models.vision_transformer import Block

from ..capture import Capture
from ..hooks import forward_hooks_on, register
from ..loading.model import Geometry, LoadedModel
from ..runtime.devices import to_host
from .lens import head_logits
from .passes import InterventionError, model_input, model_pass

Ablation = Literal["zero", "mean"]


def embedded_tokens(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The token sequence that enters `patch_drop`: patch embedding, prefix tokens, position. (B, 3, H, W) -> (B, T, D)"""
    return model._pos_embed(model.patch_embed(x))


def run_from_embedded(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The rest of timm's forward from what enters `patch_drop` (any sequence length): (B, T', D) -> (B, C).

    Where the head reads only the prefix tokens (class-token pooling) and the last block is timm's standard one with
    nothing hooked on it, that block computes only the prefix tokens' rows (`_prefix_rows`): the patch tokens'
    rows of its output never reach the head. The same logits to float rounding, for 7 % less of the linears' work
    in ViT-B/16 and 19 % less in the Shapes ViT (docs/performance.md, "The last block for the head only")."""
    return logits_from_block(model, model.norm_pre(model.patch_drop(tokens)), 0)


def logits_from_block(model: torch.nn.Module, x: torch.Tensor, first: int) -> torch.Tensor:
    """The logits of the token sequence x entering block `first`: blocks first.. and the head, the last block for the
    prefix tokens' rows alone where `last_block_for_the_head_only` (the same logits to float rounding). (B, T, D) ->
    (B, C)"""
    later = list(model.blocks[first:])
    if not later or not last_block_for_the_head_only(model):
        for block in later:
            x = block(x)
        return head_logits(model, x)
    for block in later[:-1]:
        x = block(x)
    return head_logits(model, _prefix_rows(later[-1], x, model.num_prefix_tokens))


def last_block_for_the_head_only(model: torch.nn.Module) -> bool:
    """Whether the model's head reads only its prefix tokens' final rows and its last block can be run for them alone:
    class-token pooling, no attention pool, and a last block of timm's standard Block / Attention with no hook."""
    blocks = getattr(model, "blocks", None)
    if (getattr(model, "global_pool", None) != "token" or getattr(model, "attn_pool", None) is not None
            or getattr(model, "num_prefix_tokens", 0) < 1 or not blocks):
        return False
    last = blocks[-1]
    if type(last) is not Block or type(last.attn) is not Attention:
        return False
    return forward_hooks_on(last) == 0  # a hook (an ablation, a probe) sees the block run whole


def keys_values(block: Block, x: torch.Tensor) -> torch.Tensor:
    """The keys and values of the tokens x (..., D) entering timm's standard `Block`: the last two thirds of its
    attention's qkv of norm1(x), each token's its own. -> (..., 2*H*hd)"""
    attn = block.attn
    weight, bias = attn.qkv.weight, attn.qkv.bias  # rows: q, then k, then v (timm's reshape into (3, H, hd))
    return F.linear(block.norm1(x), weight[attn.attn_dim:], None if bias is None else bias[attn.attn_dim:])


def _prefix_rows(block: Block, x: torch.Tensor, p: int, kv: torch.Tensor | None = None) -> torch.Tensor:
    """timm's `Block.forward` (eval mode, no mask) for the first p rows of its output only: keys and values of every
    token (`keys_values`, or `kv` (B, T, 2*H*hd) where the caller has them), queries, the projection and the MLP of the
    first p. (B, T, D) -> (B, p, D)"""
    attn = block.attn
    b, t, _ = x.shape
    h, hd, width = attn.num_heads, attn.head_dim, attn.attn_dim
    normed = block.norm1(x[:, :p])  # (B, p, D)
    weight, bias = attn.qkv.weight, attn.qkv.bias
    q = F.linear(normed, weight[:width], None if bias is None else bias[:width])  # (B, p, H*hd)
    kv = keys_values(block, x) if kv is None else kv  # (B, T, 2*H*hd)
    q = q.reshape(b, p, h, hd).transpose(1, 2)  # (B, H, p, hd)
    k, v = kv.reshape(b, t, 2, h, hd).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, hd) each
    return _block_from_attention_inputs(block, x[:, :p], q, k, v, normed)  # (B, p, D)


def standard_block(block: torch.nn.Module) -> bool:
    """Whether `block` is timm's standard Block / Attention with no hook on it: one `block_from_qkv` can run."""
    return type(block) is Block and type(block.attn) is Attention and forward_hooks_on(block) == 0


def block_from_qkv(block: Block, x: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
    """timm's `Block.forward` (eval mode, no mask) of x (B, T, D) with its attention's qkv of norm1(x) (B, T, 3*H*hd)
    given (where the caller has most of its rows already). -> (B, T, D)"""
    q, k, v = _split_qkv(block.attn, qkv)  # (B, H, T, hd) each
    normed = block.norm1(x) if block.attn.gate is not None else None  # only a gated attention reads it again
    return _block_from_attention_inputs(block, x, q, k, v, normed)  # (B, T, D)


def _split_qkv(attn: Attention, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, T, hd) each of the attention's qkv (B, T, 3*H*hd), as timm's `Attention.forward` splits it."""
    b, t, _ = qkv.shape
    return qkv.reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def _block_from_attention_inputs(block: Block, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 normed: torch.Tensor | None) -> torch.Tensor:
    """timm's `Block.forward` (eval mode, no mask) from its attention's q (B, H, R, hd), k and v (B, H, T, hd) before
    the q/k norms, for the R rows x (B, R, D) whose norm1 is `normed` (read by a gated attention only). -> (B, R, D)"""
    return block_tail(block, x, _attention_heads(block, q, k, v), normed)


def _attention_heads(block: Block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """timm's `Attention.forward` up to its projection's input, from q (B, H, R, hd), k and v (B, H, T, hd) before the
    q/k norms: (B, R, H*hd)."""
    attn = block.attn
    b, _, r, _ = q.shape
    q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.fused_attn:
        heads = F.scaled_dot_product_attention(q, k, v)  # (B, H, R, hd)
    else:
        heads = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
    return attn.norm(heads.transpose(1, 2).reshape(b, r, attn.attn_dim))  # (B, R, H*hd)


def block_tail(block: Block, x: torch.Tensor, out: torch.Tensor, normed: torch.Tensor | None) -> torch.Tensor:
    """The rest of timm's `Block.forward` after the attention's heads `out` (B, R, H*hd) of the rows x (B, R, D):
    the gate (of norm1(x), `normed`), projection, residual and MLP, each token on its own. -> (B, R, D)"""
    attn = block.attn
    if attn.gate is not None:
        out = out * attn.gate(normed).sigmoid()
    y = x + block.drop_path1(block.ls1(attn.proj_drop(attn.proj(out))))
    return y + block.drop_path2(block.ls2(block.mlp(block.norm2(y))))  # (B, R, D)


def attention_heads(block: Block, x: torch.Tensor) -> torch.Tensor:
    """The input of timm's standard `Block`'s attention projection for x (B, T, D) entering it: (B, T, H*hd)."""
    return _attention_heads(block, *_split_qkv(block.attn, block.attn.qkv(block.norm1(x))))


def block_rows_from_qkv(block: Block, x: torch.Tensor, qkv: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor
                        ) -> torch.Tensor:
    """timm's `Block.forward` (eval mode, no mask) of x (B, T, D) with its qkv of norm1(x) (B, T, 3*H*hd) given, at the
    M (row, token) pairs `rows`, `tokens` (M,) only: every token's attention is cheap next to the projection and MLP,
    which run for those pairs alone. -> (M, D)"""
    out = _attention_heads(block, *_split_qkv(block.attn, qkv))[rows, tokens][None]  # (1, M, H*hd)
    chosen = x[rows, tokens][None]  # (1, M, D)
    normed = block.norm1(chosen) if block.attn.gate is not None else None
    return block_tail(block, chosen, out, normed)[0]  # (M, D)


def last_block_logits(model: torch.nn.Module, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The logits of x (B, T, D) entering the last block, where `last_block_for_the_head_only`: that block for the
    prefix rows alone from the keys and values `kv` (B, T, 2*H*hd) of x's tokens (`keys_values`), then the head."""
    return head_logits(model, _prefix_rows(model.blocks[-1], x, model.num_prefix_tokens, kv))


def keep_tokens(tokens: torch.Tensor, kept_patches: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """The prefix tokens and the kept patches, in the order given.
    tokens (1 or B, T, D), kept_patches (B, K) patch indices 0..N-1 (on any device) -> (B, P + K, D) on the tokens' device."""
    batch = kept_patches.shape[0]
    tokens = tokens.expand(batch, -1, -1)
    kept_patches = kept_patches.to(tokens.device)
    prefix = torch.arange(num_prefix_tokens, device=tokens.device).expand(batch, -1)  # (B, P)
    index = torch.cat([prefix, kept_patches + num_prefix_tokens], dim=1)
    return torch.gather(tokens, 1, index[..., None].expand(-1, -1, tokens.shape[-1]))  # (B, P + K, D)


def mask_patches(x: torch.Tensor, patches: Iterable[int], geometry: Geometry) -> torch.Tensor:
    """The normalised input with the pixels of `patches` set to 0 (the normalisation mean). (B, 3, H, W), a copy."""
    (_, gw), (ph, pw) = geometry.grid, geometry.patch_size
    masked = x.clone()
    for k in patches:
        row, col = divmod(int(k), gw)
        masked[:, :, row * ph:(row + 1) * ph, col * pw:(col + 1) * pw] = 0
    return masked


@contextlib.contextmanager
def heads_ablated(model: torch.nn.Module, heads: Iterable[tuple[int, int]], ablation: Ablation = "zero") -> Iterator[None]:
    """Inside the block, head h of layer l (its slice of `attn @ v`, i.e. of the (B, T, H*hd) input of
    `attn.proj`) is set to 0 ("zero") or to its mean over the sequence's tokens ("mean"). Hooks removed
    on exit."""
    if ablation not in ("zero", "mean"):
        raise InterventionError(f"unknown ablation {ablation!r}; use 'zero' or 'mean'")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(int(layer), []).append(int(head))

    def hook_for(attn: torch.nn.Module, chosen: list[int]) -> Callable:
        head_dim = attn.head_dim

        def ablate(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            out = args[0].clone()  # (B, T, H*hd)
            for h in chosen:
                part = out[..., h * head_dim:(h + 1) * head_dim]
                out[..., h * head_dim:(h + 1) * head_dim] = 0 if ablation == "zero" else part.mean(dim=1, keepdim=True)
            return (out, *args[1:])

        return ablate

    with contextlib.ExitStack() as stack:
        for layer, chosen in by_layer.items():
            if not 0 <= layer < len(model.blocks):
                raise InterventionError(f"layer {layer} is outside 0..{len(model.blocks) - 1}")
            attn = model.blocks[layer].attn
            if not all(0 <= h < attn.num_heads for h in chosen):
                raise InterventionError(f"a head of layer {layer} is outside 0..{attn.num_heads - 1}")
            register(stack, model, attn.proj.register_forward_pre_hook(hook_for(attn, chosen)))
        yield


def predict_intervened(loaded: LoadedModel, image: Image.Image | Capture, *, drop: Iterable[int] = (), mask: Iterable[int] = (),
                       ablate: Iterable[tuple[int, int]] = (), ablation: Ablation = "zero") -> np.ndarray:
    """The logits (C,) float32 after an intervention, any combination of: `drop` patch tokens (indices
    0..N-1) after the position embedding; `mask` patches in pixel space (normalised input 0); `ablate`
    heads given as (layer, head), by `ablation` "zero" or "mean". No intervention: the plain logits.
    Raises InterventionError (a ValueError) for patches or heads the model lacks, or no patch left to pool."""
    model, geometry = loaded.model, loaded.geometry
    dropped, masked = set(int(k) for k in drop), [int(k) for k in mask]
    if not all(0 <= k < geometry.num_patches for k in dropped | set(masked)):
        raise InterventionError(f"a patch index is outside 0..{geometry.num_patches - 1}")
    if len(dropped) == geometry.num_patches and not geometry.has_class_token:
        raise InterventionError("keep at least one patch: this model pools its patch tokens (it has no class token)")
    kept = torch.tensor([k for k in range(geometry.num_patches) if k not in dropped], dtype=torch.long)[None]  # (1, K)
    x = model_input(loaded, image)  # (1, 3, H, W)
    x = mask_patches(x, masked, geometry)
    with model_pass(loaded), heads_ablated(model, ablate, ablation):
        tokens = keep_tokens(embedded_tokens(model, x), kept, geometry.num_prefix_tokens)
        return to_host(run_from_embedded(model, tokens)[0])  # (1, C) -> (C,)


# ----------------------------------------------------------------------------------------------
# Faithfulness: deletion and insertion curves
