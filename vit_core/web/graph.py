"""The ONNX graph the static lesson runs in the browser: timm's forward of a ViT, written out from the model's own
modules, with the interventions as inputs and the lesson's intermediates as outputs.

Inputs (B: a batch of perturbed copies of one image, K kept patches, N patches, L blocks, H heads):
  pixels     float32 (B, 3, H, W)  the normalised input, as the model's eval transform makes it
  kept       int64   (B, K)        the patches kept (indices 0..N-1): the keep-mask as the list of its ones
  head_mask  float32 (L, H)        1 = head on, 0 = its output set to 0 (zero ablation)
Outputs (T' = P + K tokens: the prefix tokens, then the kept patches in the order given):
  logits      float32 (B, C)
  attention   float32 (B, L, H, T', T')  post-softmax, rows = queries (with every patch kept: the capture's `pattern`)
  logit_lens  float32 (B, L+1, C)        the head on the class token of each residual row (row L = logits)
  token_norms float32 (B, L+1, T')       Euclidean norm of every token of each residual row

Dropping patches is what the library does (analyses.md, "Dropping patches"; vit_core.explain.interventions.keep_tokens):
the dropped tokens leave the sequence after the position embedding and the blocks run on the shorter one. The keep-mask
is given as its list of kept patches, not as N zeros and ones, for that reason and for speed: the deletion test's sets
of one step all keep the same number of patches, so they run as one batch at their own, shorter length (about twice
as fast in the browser as masking keys in a sequence of full length).
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import torch
from timm.layers import Attention
from timm.models.vision_transformer import Block

from ..errors import ModelError
from ..loading.model import LoadedModel

_logger = logging.getLogger(__name__)

INPUT_NAMES = ("pixels", "kept", "head_mask")
OUTPUT_NAMES = ("logits", "attention", "logit_lens", "token_norms")
OPSET = 17  # LayerNormalization is an op from 17 on; onnxruntime-web's CPU (WASM) backend runs every op used here
MAX_ONNX_BYTES = 100 * 2**20  # what a class's browsers load in seconds: ViT-S/16 (88 MB) fits, ViT-B/16 (346 MB) does not


class WebExportError(ModelError):
    """A model or folder the static lesson can't be made from; the message says why, in one sentence."""


def unsupported_reason(loaded: LoadedModel) -> str | None:
    """Why this model's graph can't be written (one sentence), or None when it can: the graph writes timm's
    standard Block and Attention out op by op and reads the class token for the head and the logit lens."""
    model, name = loaded.model, loaded.name
    if not loaded.geometry.has_class_token or getattr(model, "global_pool", None) != "token" \
            or getattr(model, "attn_pool", None) is not None:
        return (f"{name} does not pool a class token for its head, and the static lesson's graph (its logit lens, its "
                "patch dropping) reads the class token: pick a ViT with global_pool='token'.")
    if loaded.geometry.num_classes == 0:
        return f"{name} has no classifier head: the static lesson is about its predictions."
    odd = [type(b).__name__ for b in model.blocks if type(b) is not Block or type(b.attn) is not Attention]
    if odd:
        return (f"{name}'s blocks ({odd[0]}) are not timm's standard Block with Attention, which the static lesson's "
                "graph writes out op by op.")
    return None


def onnx_bytes_estimate(loaded: LoadedModel) -> int:
    """The ONNX file's size before writing it: its float32 weights (the graph's ops add a few kilobytes)."""
    return 4 * sum(p.numel() for p in loaded.model.parameters())


def check_exportable(loaded: LoadedModel, limit: int = MAX_ONNX_BYTES) -> None:
    """Raise WebExportError, in one sentence, for a model the static lesson can't carry."""
    reason = unsupported_reason(loaded)
    if reason:
        raise WebExportError(reason)
    size = onnx_bytes_estimate(loaded)
    if size > limit:
        raise WebExportError(f"{loaded.name}'s graph would be {size / 2**20:.0f} MB, above the {limit / 2**20:.0f} MB a "
                             "class's browsers can load quickly: pick a smaller ViT (vit_tiny_patch16_224 is 22 MB).")


class LensGraph(torch.nn.Module):
    """A timm VisionTransformer's eval forward with the lesson's inputs and outputs (module docstring). Wraps the
    model: reads its modules and parameters, changes nothing in it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor, kept: torch.Tensor, head_mask: torch.Tensor):
        m = self.model
        p = m.num_prefix_tokens
        x = m._pos_embed(m.patch_embed(pixels))  # (B, 3, H, W) -> (B, T, D)
        patches = torch.gather(x[:, p:], 1, kept[..., None].expand(-1, -1, x.shape[-1]))  # (B, N, D) -> (B, K, D)
        x = m.norm_pre(m.patch_drop(torch.cat([x[:, :p], patches], dim=1)))  # (B, P + K, D)
        rows, patterns = [x], []
        for layer, block in enumerate(m.blocks):
            x, pattern = block_forward(block, x, head_mask[layer])
            rows.append(x)
            patterns.append(pattern)
        residual = torch.stack(rows, dim=1)  # (L+1) x (B, T', D) -> (B, L+1, T', D)
        lens = m.head(m.fc_norm(m.norm(residual[:, :, 0])))  # class token of each row: (B, L+1, D) -> (B, L+1, C)
        attention = torch.stack(patterns, dim=1)  # L x (B, H, T', T') -> (B, L, H, T', T')
        return lens[:, -1], attention, lens, residual.norm(dim=-1)  # token norms: (B, L+1, T')


def block_forward(block: Block, x: torch.Tensor, head_on: torch.Tensor):
    """timm's `Block.forward` in eval mode through the un-fused attention, with silenced heads.
    x (B, T, D), head_on (H,) -> (x (B, T, D), post-softmax pattern (B, H, T, T))."""
    attn: Attention = block.attn
    b, t, _ = x.shape
    normed = block.norm1(x)
    qkv = attn.qkv(normed).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    pattern = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, T, T), as timm's un-fused path computes it
    heads = (pattern @ v) * head_on[None, :, None, None]  # (B, H, T, hd): a silenced head gives 0 to `proj`
    out = attn.norm(heads.transpose(1, 2).reshape(b, t, attn.attn_dim))  # (B, T, H*hd)
    if attn.gate is not None:
        out = out * attn.gate(normed).sigmoid()
    x = x + block.drop_path1(block.ls1(attn.proj_drop(attn.proj(out))))
    return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x)))), pattern


def example_inputs(loaded: LoadedModel, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of the graph's shapes: zero pixels, every patch kept, every head on."""
    g = loaded.geometry
    kept = torch.arange(g.num_patches).expand(batch, -1)  # (B, N)
    return torch.zeros(batch, 3, *g.img_size), kept, torch.ones(g.num_layers, g.num_heads)


def onnx_graph(loaded: LoadedModel) -> bytes:
    """The model's LensGraph as ONNX bytes (opset OPSET, the batch axis dynamic), made on the CPU under the model's
    lock (the model is shared; nothing in it changes). Raises WebExportError for a model it can't carry."""
    check_exportable(loaded)
    buffer = io.BytesIO()
    dynamic = {"pixels": {0: "batch"}, "kept": {0: "batch", 1: "kept"}, "logits": {0: "batch"}, "logit_lens": {0: "batch"},
               "attention": {0: "batch", 3: "tokens", 4: "tokens"}, "token_norms": {0: "batch", 2: "tokens"}}
    with loaded.lock, torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        graph = LensGraph(loaded.model).eval()
        device = loaded.device
        try:
            loaded.model.to("cpu")  # exported on the CPU: the same weights, wherever the model runs
            warnings.simplefilter("ignore")  # the TorchScript exporter's notes on tracing and constant folding, not ours
            torch.onnx.export(graph, example_inputs(loaded), buffer, dynamo=False, opset_version=OPSET,
                              input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES), dynamic_axes=dynamic)
        finally:
            loaded.model.to(device)
    data = buffer.getvalue()
    _logger.info("exported %s to ONNX: %.1f MB", loaded.name, len(data) / 2**20)
    return data


def write_onnx(loaded: LoadedModel, path: str | Path) -> Path:
    """`onnx_graph(loaded)` written to `path`."""
    path = Path(path)
    path.write_bytes(onnx_graph(loaded))
    return path
