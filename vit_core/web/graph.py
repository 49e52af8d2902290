"""The ONNX graph the static lesson runs in the browser: timm's forward of a ViT, written out from the model's own
modules, with the interventions as inputs and the lesson's intermediates as outputs.

Inputs (B: a batch of perturbed copies of one image, K kept patches, N patches, L blocks, H heads):
  pixels     float32 (B, 3, H, W)  the normalised input, as the model's eval transform makes it
  kept       int64   (B, K)        the patches kept (indices 0..N-1): the keep-mask as the list of its ones
  head_mask  float32 (L, H)        1 = head on, 0 = its output set to 0 (zero ablation)
Outputs (T' = P + K tokens: the prefix tokens, then the kept patches in the order given), those the catalog's lenses
name as their twins in the browser (vit_core.lenses.graph_outputs()):
  logits      float32 (B, C)
  attention   float32 (B, L, H, T', T')  post-softmax, rows = queries (with every patch kept: the capture's `pattern`)
  logit_lens  float32 (B, L+1, C)        the head on the class token of each residual row (row L = logits)
  token_norms float32 (B, L+1, T')       Euclidean norm of every token of each residual row
and any named site asked for (`onnx_graph(loaded, sites=[...])`, vit_core.sites: "the browser needs q.k" is a name),
as an output of that name with the batch axis first ((B, L, ...) for `*`, the block axis second; T' tokens).

Dropping patches is what the library does (analyses.md, "Dropping patches"; vit_core.explain.interventions.keep_tokens):
the dropped tokens leave the sequence after the position embedding and the blocks run on the shorter one. The keep-mask
is given as its list of kept patches, not as N zeros and ones, for that reason and for speed: the deletion test's sets
of one step all keep the same number of patches, so they run as one batch at their own, shorter length (about twice
as fast in the browser as masking keys in a sequence of full length).
"""

from __future__ import annotations

import hashlib
import io
import logging
import warnings

import torch
import torch.nn.functional as F
from timm.layers import Attention, Mlp
from timm.models.vision_transformer import Block

from .. import lenses
from ..errors import ModelError
from ..loading.model import LoadedModel
from ..sites import canonical, site_names

_logger = logging.getLogger(__name__)

INPUT_NAMES = ("pixels", "kept", "head_mask")
OUTPUT_NAMES = lenses.graph_outputs()  # ("logits", "attention", "logit_lens", "token_norms"): the lesson's twins
OUTPUT_SITES = {"logits": "logits", "attention": "blocks.*.attn.pattern"}  # a lesson output that is a site's tensor
# a site's token axes, counted without the batch and block axes: dynamic, as patches are dropped
_TOKEN_AXES = {"embed": (), "norm": (0,), "pre_logits": (), "logits": (), "in": (0,), "out": (0,), "attn.q": (1,),
               "attn.k": (1,), "attn.v": (1,), "attn.pattern": (1, 2), "attn.out": (0,), "mlp.hidden": (0,)}
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


def graph_sites(loaded: LoadedModel, sites: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """`sites` in our words (aliases resolved, `*` kept), each once, checked on this model: SiteError (one sentence)
    for a name that is no site or a block past its last; WebExportError for `mlp.hidden` of an MLP that isn't timm's
    plain Mlp, which the graph writes out op by op."""
    names = tuple(dict.fromkeys(canonical(name) for name in sites))
    for name in names:
        site_names(name, loaded.geometry.num_layers)
        if name.endswith("mlp.hidden") and any(type(b.mlp) is not Mlp for b in loaded.model.blocks):
            raise WebExportError(f"{loaded.name}'s MLP ({type(loaded.model.blocks[0].mlp).__name__}) is not timm's plain "
                                 "Mlp: the graph can't write out its hidden units (mlp.hidden).")
    return names


class LensGraph(torch.nn.Module):
    """A timm VisionTransformer's eval forward with the lesson's inputs and outputs (module docstring). Wraps the
    model: reads its modules and parameters, changes nothing in it.

    logits_only: the graph of the perturbation tests (the deletion test, the occlusion map), which need the logits
    alone: no attention, lens or norms among the outputs, and the last block computed for the class token only (its
    other rows never reach the head), as the library's perturbed passes do (interventions.run_from_embedded).
    sites: named sites (canonical: `graph_sites`) written out after the lesson's outputs, each under its name."""

    def __init__(self, model: torch.nn.Module, logits_only: bool = False, sites: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.model = model
        self.logits_only = logits_only
        self.sites = sites
        self.parts = {name.split(".", 2)[2] for name in sites if name.startswith("blocks.")}  # what the blocks record

    def forward(self, pixels: torch.Tensor, kept: torch.Tensor, head_mask: torch.Tensor):
        m = self.model
        p = m.num_prefix_tokens
        embed = m.patch_embed(pixels)  # (B, 3, H, W) -> (B, N, D)
        x = m._pos_embed(embed)  # (B, T, D)
        patches = torch.gather(x[:, p:], 1, kept[..., None].expand(-1, -1, x.shape[-1]))  # (B, N, D) -> (B, K, D)
        x = m.norm_pre(m.patch_drop(torch.cat([x[:, :p], patches], dim=1)))  # (B, P + K, D)
        if self.logits_only:
            *before, last = m.blocks
            for layer, block in enumerate(before):
                x, _ = block_forward(block, x, head_mask[layer])
            x, _ = block_forward(last, x, head_mask[len(before)], queries=1)  # (B, 1, D): the class token
            return m.head(m.fc_norm(m.norm(x[:, 0])))  # (B, C)
        rows, patterns, seen = [x], [], []
        for layer, block in enumerate(m.blocks):
            seen.append({})
            x, pattern = block_forward(block, x, head_mask[layer], seen=seen[-1] if self.parts else None)
            rows.append(x)
            patterns.append(pattern)
        residual = torch.stack(rows, dim=1)  # (L+1) x (B, T', D) -> (B, L+1, T', D)
        lens = m.head(m.fc_norm(m.norm(residual[:, :, 0])))  # class token of each row: (B, L+1, D) -> (B, L+1, C)
        attention = torch.stack(patterns, dim=1)  # L x (B, H, T', T') -> (B, L, H, T', T')
        lesson = (lens[:, -1], attention, lens, residual.norm(dim=-1))  # token norms: (B, L+1, T')
        if not self.sites:
            return lesson
        for b, pattern in enumerate(patterns):
            seen[b] |= {"in": rows[b], "out": rows[b + 1], "attn.pattern": pattern}
        final = m.norm(x)  # (B, T', D)
        model_sites = {"embed": embed, "norm": final, "pre_logits": m.fc_norm(final[:, 0]), "logits": lens[:, -1]}

        def site(name: str) -> torch.Tensor:
            if name in model_sites:
                return model_sites[name]
            _, b, part = name.split(".", 2)
            return torch.stack([one[part] for one in seen], dim=1) if b == "*" else seen[int(b)][part]  # (B, L, ...)

        return (*lesson, *(site(name) for name in self.sites))


def block_forward(block: Block, x: torch.Tensor, head_on: torch.Tensor, queries: int | None = None,
                  seen: dict[str, torch.Tensor] | None = None):
    """timm's `Block.forward` in eval mode through the un-fused attention, with silenced heads, for the first `queries`
    rows of its output (None: all). x (B, T, D), head_on (H,) -> (x (B, Q, D), post-softmax pattern (B, H, Q, T)).
    `seen`: filled with the block's sites (vit_core.sites), batch first: attn.q, attn.k, attn.v (B, H, T, hd),
    attn.out (B, Q, D) and mlp.hidden (B, Q, D_mlp), the MLP then written out as timm's Mlp.forward runs it."""
    attn: Attention = block.attn
    b, t, _ = x.shape
    q_rows = t if queries is None else queries
    normed = block.norm1(x)
    if queries is None:
        qkv = attn.qkv(normed).reshape(b, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        q, k, v = qkv.unbind(0)
    else:  # rows q, then k, then v of timm's qkv weight: the queries of the first rows, the keys and values of all
        width, weight, bias = attn.attn_dim, attn.qkv.weight, attn.qkv.bias
        q = F.linear(normed[:, :q_rows], weight[:width], None if bias is None else bias[:width])  # (B, Q, H*hd)
        q = q.reshape(b, q_rows, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, H, Q, hd)
        kv = F.linear(normed, weight[width:], None if bias is None else bias[width:])  # (B, T, 2*H*hd)
        k, v = kv.reshape(b, t, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, hd) each
    q, k = attn.q_norm(q), attn.k_norm(k)
    pattern = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, Q, T), as timm's un-fused path computes it
    heads = (pattern @ v) * head_on[None, :, None, None]  # (B, H, Q, hd): a silenced head gives 0 to `proj`
    out = attn.norm(heads.transpose(1, 2).reshape(b, q_rows, attn.attn_dim))  # (B, Q, H*hd)
    if attn.gate is not None:
        out = out * attn.gate(normed[:, :q_rows]).sigmoid()
    before = x[:, :q_rows]  # sliced first, as the graph always wrote it: the same file, byte for byte
    attended = attn.proj_drop(attn.proj(out))  # (B, Q, D): the attention module's output
    x = before + block.drop_path1(block.ls1(attended))
    if seen is None:
        return x + block.drop_path2(block.ls2(block.mlp(block.norm2(x)))), pattern
    mlp = block.mlp
    hidden = mlp.drop1(mlp.act(mlp.fc1(block.norm2(x))))  # (B, Q, D_mlp)
    seen |= {"attn.q": q, "attn.k": k, "attn.v": v, "attn.out": attended, "mlp.hidden": hidden}
    return x + block.drop_path2(block.ls2(mlp.drop2(mlp.fc2(mlp.norm(hidden))))), pattern


def example_inputs(loaded: LoadedModel, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of the graph's shapes: zero pixels, every patch kept, every head on."""
    g = loaded.geometry
    kept = torch.arange(g.num_patches).expand(batch, -1)  # (B, N)
    return torch.zeros(batch, 3, *g.img_size), kept, torch.ones(g.num_layers, g.num_heads)


def onnx_graph(loaded: LoadedModel, logits_only: bool = False, sites: tuple[str, ...] | list[str] = ()) -> bytes:
    """The model's LensGraph as ONNX bytes (opset OPSET, the batch and kept axes dynamic; `logits_only`: the perturbation
    tests' graph, output "logits" alone; `sites`: named sites written out too, each under its name in our words),
    made on the CPU under the model's lock (the model is shared; nothing in it changes). Raises WebExportError for a
    model it can't carry, SiteError for a name that is no site of this model."""
    check_exportable(loaded)
    names = tuple(name for name in graph_sites(loaded, sites) if name not in OUTPUT_NAMES)  # "logits" is one already
    if names and logits_only:
        raise WebExportError("the logits graph computes the last block for the class token only: ask for sites in the "
                             "full graph.")
    buffer = io.BytesIO()
    outputs = OUTPUT_NAMES[:1] if logits_only else (*OUTPUT_NAMES, *names)
    dynamic = {"pixels": {0: "batch"}, "kept": {0: "batch", 1: "kept"}, "logits": {0: "batch"}, "logit_lens": {0: "batch"},
               "attention": {0: "batch", 3: "tokens", 4: "tokens"}, "token_norms": {0: "batch", 2: "tokens"}}
    for name in names:
        first = 2 if ".*." in name else 1  # the batch axis, and the block axis of `*`
        dynamic[name] = {0: "batch"} | {first + axis: "tokens" for axis in _TOKEN_AXES[name.split(".", 2)[-1]]}
    with loaded.lock, torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        graph = LensGraph(loaded.model, logits_only, names).eval()
        device = loaded.device
        try:
            loaded.model.to("cpu")  # exported on the CPU: the same weights, wherever the model runs
            warnings.simplefilter("ignore")  # the TorchScript exporter's notes on tracing and constant folding, not ours
            torch.onnx.export(graph, example_inputs(loaded), buffer, dynamo=False, opset_version=OPSET,
                              input_names=list(INPUT_NAMES), output_names=list(outputs),
                              dynamic_axes={name: axes for name, axes in dynamic.items() if name in (*INPUT_NAMES, *outputs)})
        finally:
            loaded.model.to(device)
    data = buffer.getvalue()
    _logger.info("exported %s to ONNX%s: %.1f MB", loaded.name, " (logits only)" if logits_only else "", len(data) / 2**20)
    return data


INLINE_BYTES = 1024  # initializers this small (shapes, scales) stay inside their graph


def shared_weights(graphs: dict[str, bytes], location: str) -> tuple[dict[str, bytes], bytes]:
    """Graphs (name -> ONNX bytes) whose initializers move to one external file `location`, each distinct tensor once
    (the same bytes in two graphs: one copy, both pointing at it): -> (the graphs' new bytes, the file's bytes). The
    lesson's two graphs share almost every weight, so the site carries the model once."""
    import onnx
    from onnx.external_data_helper import set_external_data

    blob = io.BytesIO()
    offsets: dict[tuple, tuple[int, int]] = {}
    written = {}
    for name, data in graphs.items():
        model = onnx.load_from_string(data)
        for tensor in model.graph.initializer:
            raw = onnx.numpy_helper.to_array(tensor).tobytes()
            if len(raw) < INLINE_BYTES:
                continue
            key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).digest())
            if key not in offsets:
                blob.seek(0, io.SEEK_END)
                padding = -blob.tell() % 64  # aligned, as onnx's own writer does for memory mapping
                blob.write(b"\0" * padding)
                offsets[key] = (blob.tell(), len(raw))
                blob.write(raw)
            offset, length = offsets[key]
            for field in ("float_data", "int64_data", "int32_data", "double_data"):
                tensor.ClearField(field)
            tensor.raw_data = raw  # onnx's helper wants it there, then it goes
            set_external_data(tensor, location, offset, length)
            tensor.ClearField("raw_data")
        written[name] = model.SerializeToString()
    return written, blob.getvalue()
