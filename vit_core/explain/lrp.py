"""AttnLRP and CP-LRP for timm's VisionTransformer family (docs/spec/analyses.md, "AttnLRP and CP-LRP").

AttnLRP is Achtibat et al., ICML 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
Transformers"; CP-LRP (Ali et al., ICML 2022, "XAI for Transformers: Better Explanations through Conservative
Propagation") is the same with the attention pattern held constant. Both are computed as lxt computes them
(its "efficient" mode, Arras et al. 2025): a forward whose backward is modified so that input times gradient is
the LRP relevance. The forward is written out here and reads the model's own parameters, detached: no module of the
model is called, no hook registered, no flag, class or instance patched (lxt 2.1 patches torch's classes
process-wide), so the shared model stays as it was and its `.grad` untouched.

Rule of each op, and its backward here ("g": the gradient arriving at the op's output; R = output * g, its relevance):

- Linear (qkv, proj, fc1, fc2, head) and the patch embedding: the eps-rule (paper Eq. 8), backward W^T (g z / (z + eps
  sign z)), as lxt/explicit/functional.py `linear_epsilon_fn`; or, for the linears a GammaChoice names, zennit's
  generalised gamma-rule (zennit/rules.py `Gamma`, fed R = z g as lxt/efficient/zennit_patches.py does).
- LayerNorm and RMSNorm (norm1, norm2, q_norm, k_norm, norm_pre, norm, fc_norm): the identity rule on 1/std
  (Prop. 3.4) and on the gain, the eps-rule on x - mean: the standard deviation held constant
  (lxt/efficient/patches.py `layer_norm_forward`, lxt/explicit/functional.py `layer_norm`).
- GELU, SiLU, any elementwise activation: the identity rule (Eq. 9), backward g f(x) / x, 0 where x = 0
  (lxt/efficient/rules.py `identity_rule_implicit_fn`, which divides by x + 1e-10 instead).
- softmax: the softmax rule (Prop. 3.1), R_in = x (R - s sum R), which is x times the softmax's own gradient
  (lxt/explicit/functional.py `softmax_fn`).
- q k^T, A v (Prop. 3.3) and multiplicative gates (SwiGLU, gated attention; Prop. 3.2): the uniform rule (Eq. 7),
  half of the gradient to each factor (lxt/efficient/patches.py `wrap_attention_forward`, whose q/4, k/4, v/2 is
  the same split; `gated_mlp_forward`). A factor that is a constant (an attention pool's latent query, LayerScale's
  gain) gives all to the other (lxt/explicit/functional.py `mul2`).
- CP-LRP: the attention pattern A (and a gate) held constant, so all of A v's relevance goes to v
  (lxt/efficient/patches.py `cp_multi_head_attention_forward`, `cp_gated_mlp_forward`).
- additions (residuals, biases, position embedding), means, token pooling, max: linear or winner-take-all, where
  the eps -> 0 rule is the gradient.

An attention pool's latent query (`AttentionPoolLatent`, global_pool "map") is a parameter: its q k^T is a linear map
of k, whose relevance all goes to k (the eps-rule). Biases, the position embedding and the
prefix tokens absorb the relevance a linear rule assigns them, the eps stabiliser some, and the softmax rule the
rest of what enters it: with `shares=True` every such share is summed, and the input relevance plus the shares equals
the explained logit y_c (tests/unit/test_lrp.py).

One forward serves every method and gamma choice: the rules are read at backward time from a `_Rules` object made for
the call, so each (method, gamma choice) is one more backward of the same graph.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from timm.layers import AttentionPoolLatent, DropPath, GluMlp, LayerScale, Mlp, PatchDropout, RmsNorm, SwiGLU
from timm.layers import activations as timm_activations
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import Attention, Block, ResPostBlock, VisionTransformer
from torch.autograd import Function

from ..errors import ViTLensError
from ..runtime import gradient_threads, torch_threads
from ..runtime.devices import to_host
from ..runtime.onednn import linears_on_onednn

LRP_METHODS = ("attnlrp", "cplrp")
EPSILON = 1e-6  # the eps-rule's stabiliser: lxt's `linear_epsilon` default and zennit's
GAMMAS = (0.25, 1.0)  # the gamma values of the candidates offered


class LrpError(ViTLensError):
    """A model (or part of one) that AttnLRP has no rule for here; the message says which part."""


# ----------------------------------------------------------------------------------------------
# Gamma choices


@dataclass(frozen=True)
class GammaChoice:
    """Which linears get the gamma-rule instead of the eps-rule: (module name in the model, gamma) pairs."""

    name: str  # for people and the export: "epsilon", "gamma 0.25, lower half"
    gamma: tuple[tuple[str, float], ...] = ()


EPSILON_ONLY = GammaChoice("epsilon")


def lower_half_linears(model: VisionTransformer) -> list[str]:
    """The MLP linears and the attention output projection of the first max(1, L // 2) blocks, by module name."""
    names = []
    for i, blk in enumerate(model.blocks[: max(1, len(model.blocks) // 2)]):
        modules = dict(blk.named_modules())
        names += [f"blocks.{i}.{child}" for child in ("mlp.fc1", "mlp.fc1_g", "mlp.fc1_x", "mlp.fc2", "attn.proj")
                  if isinstance(modules.get(child), torch.nn.Linear)]
    return names


def gamma_candidates(model: VisionTransformer, gammas: Sequence[float] = GAMMAS) -> tuple[GammaChoice, ...]:
    """The choices offered per image: the eps-rule everywhere, then each gamma on `lower_half_linears`."""
    lower = tuple(lower_half_linears(model))
    return (EPSILON_ONLY, *(GammaChoice(f"gamma {g:g}, lower half", tuple((n, float(g)) for n in lower)) for g in gammas))


# ----------------------------------------------------------------------------------------------
# The rules, as backward functions


@dataclass
class _Rules:
    """What the next backward applies, read by every rule's backward. One per call, never shared between threads."""

    method: str = "attnlrp"
    gamma: dict[str, float] = field(default_factory=dict)  # linear's name -> gamma; others: the eps-rule
    epsilon: float = EPSILON
    shares: dict[str, float] | None = None  # when accounting: relevance absorbed, by kind ("bias", "epsilon", ...)

    def factor(self, role: str) -> float:
        """The share of a product's relevance that goes to the factor `role`.

        AttnLRP: the uniform rule, 1/2 to each of two input-dependent factors (q and k of q k^T, A and v of A v, gate
        and gated); an attention pool's keys get all (their query is a parameter). CP-LRP: the pattern and the gate
        are constants, their factor gets nothing and the other all."""
        if self.method == "attnlrp":
            return 1.0 if role == "pool_key" else 0.5
        return 1.0 if role in ("value", "gated") else 0.0

    def absorb(self, kind: str, amount: torch.Tensor) -> None:
        """Add `amount` (a 0-d tensor) to the share of `kind`; callers compute it only when `shares` is on."""
        if self.shares is not None:
            self.shares[kind] += float(amount)


def _stabilised(z: torch.Tensor, eps: float) -> torch.Tensor:
    """z + eps sign(z), with sign(0) = +1 (zennit's `stabilize`)."""
    return torch.where(z >= 0, z + eps, z - eps)


def _times_weight(s: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """s W: (..., D_out) x (D_out, D_in) -> (..., D_in), as a linear with the transposed weight, which on a CPU runs on
    oneDNN as every pass's linears do (`vit_core.runtime.onednn`; a backward runs outside the caller's function mode)."""
    with linears_on_onednn(s.device):
        return F.linear(s, weight.t())


class _LinearRule(Function):
    """z = x W^T + b; backward: the eps-rule, or the generalised gamma-rule where `rules.gamma` names this linear."""

    @staticmethod
    def forward(ctx, x, weight, bias, name: str, rules: _Rules):
        z = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, bias, z)
        ctx.name, ctx.rules, ctx.positive = name, rules, None
        ctx.set_materialize_grads(False)
        return z

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None, None
        x, weight, bias, z = ctx.saved_tensors
        rules: _Rules = ctx.rules
        gamma = rules.gamma.get(ctx.name, 0.0)
        if gamma:
            magnitude = weight.abs()  # |W|, for both halves of the gamma-rule
            if ctx.positive is None:  # the same for every gamma and method: made at the first backward that needs it
                ctx.positive = _positive_part(x, bias, z, magnitude)
            return _gamma_grad(x, weight, magnitude, bias, z, ctx.positive, g, gamma, rules), None, None, None, None
        ratio = z.abs()
        ratio = ratio.div_(ratio + rules.epsilon)  # z / (z + eps sign z)
        s = ratio.mul_(g)  # (..., D_out): R / (z + eps sign z), R = z g
        if rules.shares is not None:
            rules.absorb("epsilon", (g * z).sum() - (s * z).sum())
            if bias is not None:
                rules.absorb("bias", (s * bias).sum())
        return _times_weight(s, weight), None, None, None, None


def _positive_part(x: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """The positive contributions to z = x W^T + b: x+ W+^T + x- W-^T + b+ = ((z - b) + |x| |W|^T) / 2 + b+.
    (..., D_in) -> (..., D_out)"""
    with linears_on_onednn(x.device):
        positive = F.linear(x.abs(), magnitude)
    positive = positive.add_(z if bias is None else z - bias).mul_(0.5)
    return positive if bias is None else positive.add_(bias.clamp(min=0))


def _gamma_grad(x, weight, magnitude, bias, z, positive, g, gamma: float, rules: _Rules) -> torch.Tensor:
    """zennit's generalised gamma-rule (zennit/rules.py `Gamma`, fed R = z g as lxt's zennit patch feeds it).

    An output with z > 0 shares R among its input contributions in proportion to x+ (W + gamma W+) + x- (W + gamma W-),
    the positive ones boosted, with the bias b + gamma b+ taking its part: the denominator is z + gamma P, P the positive
    contributions (`_positive_part`). An output with z < 0 likewise, with x+ (W + gamma W-) + x- (W + gamma W+) and
    b + gamma b-: the denominator z + gamma (z - P). Returned as the gradient whose product with x is that relevance
    (no division by x): where x > 0, s+ (W + gamma W+) + s- (W + gamma W-), where x < 0 the other pairing; with
    W+- = (W +- |W|) / 2 that is s W + gamma B and s W + gamma (s W - B), B = (s W + (s+ - s-) |W|) / 2."""
    relevance = z * g
    denominator = z + gamma * torch.where(z > 0, positive, z - positive)  # zennit's, for each output's sign
    s = relevance / _stabilised(denominator, rules.epsilon)  # (..., D_out): s+ + s- (z = 0: R = 0, s = 0)
    if rules.shares is not None:
        rules.absorb("epsilon", relevance.sum() - (s * denominator).sum())
        if bias is not None:
            boosted_bias = bias + gamma * torch.where(z > 0, bias.clamp(min=0), bias.clamp(max=0))
            rules.absorb("bias", (s * boosted_bias).sum())
    plain = _times_weight(s, weight)  # s W
    boosted = _times_weight(s * z.sign(), magnitude).add_(plain).mul_(0.5)  # s+ W+ + s- W-
    return plain + gamma * torch.where(x > 0, boosted, plain - boosted)


class _NormRule(Function):
    """LayerNorm (centred) or RMSNorm with its standard deviation held constant: an affine map of x, whose gradient is
    the identity rule's. The forward is torch's own layer norm (F.rms_norm), so the values are the model's."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, centred: bool, rules: _Rules):
        shape = x.shape[-1:]
        if centred:
            y, _, inv_std = torch.native_layer_norm(x, shape, weight, bias, eps)  # F.layer_norm's kernel; 1/std (..., 1)
        else:
            y = F.rms_norm(x, shape, weight, eps)
            inv_std = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(weight, bias, inv_std)
        ctx.centred, ctx.rules = centred, rules
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None, None, None, None
        weight, bias, inv_std = ctx.saved_tensors
        if bias is not None and ctx.rules.shares is not None:
            ctx.rules.absorb("bias", (g * bias).sum())
        gw = g if weight is None else g * weight
        grad = gw * inv_std
        if ctx.centred:  # the mean's subtraction, transposed (it is symmetric)
            grad = grad - grad.mean(dim=-1, keepdim=True)
        return grad, None, None, None, None, None


class _IdentityRule(Function):
    """y = f(x) for an elementwise f; backward g f(x) / x (0 where x = 0): all of y's relevance to x."""

    @staticmethod
    def forward(ctx, x, fn: Callable[[torch.Tensor], torch.Tensor], rules: _Rules):
        y = fn(x)
        ctx.save_for_backward((y / x).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))  # f(x) / x, 0 where x = 0
        ctx.rules = rules
        if rules.shares is not None:
            ctx.accounting = (x, y)
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None, None
        (ratio,) = ctx.saved_tensors
        grad = g * ratio
        if ctx.rules.shares is not None:
            x, y = ctx.accounting
            ctx.rules.absorb("epsilon", (g * y).sum() - (grad * x).sum())
        return grad, None, None


class _SoftmaxRule(Function):
    """s = softmax(x) over the last axis; backward its gradient s (g - sum s g), so that x times it is the softmax
    rule's x (R - s sum R) with R = s g. What that rule does not pass on is the softmax's share."""

    @staticmethod
    def forward(ctx, x, rules: _Rules):
        s = x.softmax(dim=-1)
        ctx.save_for_backward(s)
        ctx.rules = rules
        if rules.shares is not None:
            ctx.logits = x
        ctx.set_materialize_grads(False)
        return s

    @staticmethod
    def backward(ctx, g):
        if g is None:
            return None, None
        (s,) = ctx.saved_tensors
        sg = s * g
        grad = sg - s * sg.sum(dim=-1, keepdim=True)
        if ctx.rules.shares is not None:
            ctx.rules.absorb("softmax", sg.sum() - (grad * ctx.logits).sum())
        return grad, None


class _Share(Function):
    """The identity forward; backward the share `rules.factor(role)` of the gradient (0: none, as a detach)."""

    @staticmethod
    def forward(ctx, x, role: str, rules: _Rules):
        ctx.role, ctx.rules = role, rules
        ctx.set_materialize_grads(False)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        factor = ctx.rules.factor(ctx.role)
        if g is None or factor == 0.0:
            return None, None, None
        return (g if factor == 1.0 else g * factor), None, None


class _AddConstant(Function):
    """x + c for a constant c (a position embedding): its relevance, sum c g, is the constant's share."""

    @staticmethod
    def forward(ctx, x, c, rules: _Rules):
        ctx.save_for_backward(c)
        ctx.rules = rules
        return x + c

    @staticmethod
    def backward(ctx, g):
        if ctx.rules.shares is not None:
            (c,) = ctx.saved_tensors
            ctx.rules.absorb("constants", (g * c).sum())
        return g, None, None


class _Prepend(Function):
    """The prefix tokens (constants) put before the patch tokens: their relevance is the constants' share."""

    @staticmethod
    def forward(ctx, x, prefix, rules: _Rules):
        ctx.save_for_backward(prefix)
        ctx.rules = rules
        return torch.cat([prefix.expand(x.shape[0], -1, -1), x], dim=1)  # (B, P + N, D)

    @staticmethod
    def backward(ctx, g):
        (prefix,) = ctx.saved_tensors
        p = prefix.shape[1]
        if ctx.rules.shares is not None:
            ctx.rules.absorb("constants", (g[:, :p] * prefix).sum())
        return g[:, p:], None, None


# ----------------------------------------------------------------------------------------------
# What has a rule here


_NORMS = (torch.nn.LayerNorm, torch.nn.RMSNorm, RmsNorm)
_ELEMENTWISE = (
    torch.nn.GELU, torch.nn.SiLU, torch.nn.ReLU, torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.Mish, torch.nn.Hardswish,
    torch.nn.Hardsigmoid, torch.nn.ELU, torch.nn.LeakyReLU, torch.nn.Softplus,
    timm_activations.GELU, timm_activations.GELUTanh, timm_activations.QuickGELU, timm_activations.Swish,
    timm_activations.Mish, timm_activations.Sigmoid, timm_activations.Tanh, timm_activations.HardSwish,
    timm_activations.HardSigmoid, timm_activations.HardMish,
)
_PASS_THROUGH = (torch.nn.Identity, torch.nn.Dropout, DropPath, PatchDropout)  # identities in eval mode
_POOLS = ("token", "avg", "max", "avgmax")


def _is_identity(module: torch.nn.Module) -> bool:
    return isinstance(module, _PASS_THROUGH)


def why_unsupported(model: torch.nn.Module) -> str | None:
    """None where AttnLRP and CP-LRP can run on `model` (every part has a rule here), else one sentence for the user
    naming the first part that has none."""
    if not isinstance(model, VisionTransformer):
        return f"AttnLRP runs on timm's VisionTransformer family, not on a {type(model).__name__}."
    pe = model.patch_embed
    proj = getattr(pe, "proj", None)
    if not (isinstance(proj, torch.nn.Conv2d) and tuple(proj.kernel_size) == tuple(proj.stride)
            and tuple(proj.padding) == (0, 0) and tuple(proj.dilation) == (1, 1) and proj.groups == 1
            and getattr(pe, "flatten", True) and not getattr(pe, "dynamic_img_pad", False)):
        return "AttnLRP needs a patch embedding that is one convolution with stride = kernel, which this model lacks."
    if getattr(model, "dynamic_img_size", False):
        return "AttnLRP needs a fixed input size; this model resizes its position embedding per input."
    checks: list[tuple[str, torch.nn.Module, Callable[[torch.nn.Module], bool]]] = [
        ("patch_embed.norm", pe.norm, _is_norm_or_identity), ("norm_pre", model.norm_pre, _is_norm_or_identity),
        ("norm", model.norm, _is_norm_or_identity), ("fc_norm", model.fc_norm, _is_norm_or_identity),
        ("head", model.head, _is_linear_or_identity),
    ]
    if isinstance(model, VisionTransformerDistilled):
        checks.append(("head_dist", model.head_dist, _is_linear_or_identity))
    for i, blk in enumerate(model.blocks):
        if type(blk) not in (Block, ResPostBlock):
            return f"AttnLRP has no rule for block {i}, a {type(blk).__name__}."
        checks += [(f"blocks.{i}.norm1", blk.norm1, _is_norm_or_identity), (f"blocks.{i}.norm2", blk.norm2, _is_norm_or_identity),
                   (f"blocks.{i}.attn", blk.attn, _is_attention), (f"blocks.{i}.mlp", blk.mlp, _is_mlp)]
        checks += [(f"blocks.{i}.{ls}", getattr(blk, ls, torch.nn.Identity()), _is_layer_scale_or_identity)
                   for ls in ("ls1", "ls2")]
    if model.attn_pool is not None:
        checks.append(("attn_pool", model.attn_pool, _is_attention_pool))
    elif not isinstance(model, VisionTransformerDistilled) and model.global_pool not in _POOLS:
        return f"AttnLRP needs a pooled output; this model's global_pool is {model.global_pool!r}."
    for name, module, ok in checks:
        if not ok(module):
            return f"AttnLRP has no rule for {name}, a {type(module).__name__}."
    return None


def _is_norm_or_identity(m: torch.nn.Module) -> bool:
    return _is_identity(m) or (isinstance(m, _NORMS) and len(getattr(m, "normalized_shape", (0,))) == 1)


def _is_linear_or_identity(m: torch.nn.Module) -> bool:
    return _is_identity(m) or type(m) is torch.nn.Linear


def _is_layer_scale_or_identity(m: torch.nn.Module) -> bool:
    return _is_identity(m) or type(m) is LayerScale


def _is_attention(m: torch.nn.Module) -> bool:
    return (type(m) is Attention and type(m.qkv) is torch.nn.Linear and type(m.proj) is torch.nn.Linear
            and all(_is_norm_or_identity(n) for n in (m.q_norm, m.k_norm, m.norm))
            and (getattr(m, "gate", None) is None or type(m.gate) is torch.nn.Linear))


def _is_mlp(m: torch.nn.Module) -> bool:
    if type(m) is Mlp:
        linears = (m.fc1, m.fc2)
    elif type(m) is GluMlp:
        linears = (m.fc1, m.fc2) if m.chunk_dim == -1 else ()
    elif type(m) is SwiGLU:
        linears = (m.fc1_g, m.fc1_x, m.fc2)
    else:
        return False
    return (bool(linears) and all(type(fc) is torch.nn.Linear for fc in linears) and isinstance(m.act, _ELEMENTWISE)
            and _is_norm_or_identity(m.norm))


def _is_attention_pool(m: torch.nn.Module) -> bool:
    return (type(m) is AttentionPoolLatent and type(m.kv) is torch.nn.Linear and _is_linear_or_identity(m.q)
            and _is_linear_or_identity(m.proj) and all(_is_norm_or_identity(n) for n in (m.q_norm, m.k_norm, m.norm))
            and (m.mlp is None or _is_mlp(m.mlp)) and m.pool in ("token", "avg", ""))


# ----------------------------------------------------------------------------------------------
# The forward, op by op


def _p(t: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter read as a constant: never part of the graph, whatever its requires_grad."""
    return None if t is None else t.detach()


class _Forward:
    """timm's VisionTransformer forward in eval mode (dropouts, drop paths and patch dropout are identities), every op
    with its LRP rule. Reads the model's parameters; calls none of its modules' __call__ (so no hook fires)."""

    def __init__(self, model: VisionTransformer, rules: _Rules):
        self.model, self.rules = model, rules
        self.names = {id(m): n for n, m in model.named_modules()}

    # --- single ops

    def linear(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if _is_identity(module):
            return x
        return _LinearRule.apply(x, _p(module.weight), _p(module.bias), self.names[id(module)], self.rules)

    def norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if _is_identity(module):
            return x
        eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps  # nn.RMSNorm's eps=None
        centred = isinstance(module, torch.nn.LayerNorm)
        return _NormRule.apply(x, _p(module.weight), _p(getattr(module, "bias", None)), eps, centred, self.rules)

    def act(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return _IdentityRule.apply(x, module.forward, self.rules)  # forward, not __call__: no hooks

    def share(self, x: torch.Tensor, role: str) -> torch.Tensor:
        return _Share.apply(x, role, self.rules)

    def gated(self, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """gate * x, both input-dependent: the uniform rule (AttnLRP), or the gate held constant (CP-LRP)."""
        return self.share(gate, "gate") * self.share(x, "gated")

    @staticmethod
    def layer_scale(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if _is_identity(module) else x * _p(module.gamma)

    # --- parts

    def patch_embedding(self, x: torch.Tensor) -> torch.Tensor:
        """The patch convolution as the linear it is (stride = kernel): (B, C, H, W) -> (B, N, D)."""
        proj = self.model.patch_embed.proj
        b, c = x.shape[:2]
        (ph, pw), (gh, gw) = proj.kernel_size, self.model.patch_embed.grid_size
        patches = x[:, :, : gh * ph, : gw * pw].reshape(b, c, gh, ph, gw, pw)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * ph * pw)  # (B, N, C ph pw), the weight's order
        weight = _p(proj.weight).reshape(proj.out_channels, -1)  # (D, C, ph, pw) -> (D, C ph pw)
        tokens = _LinearRule.apply(patches, weight, _p(proj.bias), self.names[id(proj)], self.rules)
        return self.norm(self.model.patch_embed.norm, tokens)

    def position(self, x: torch.Tensor) -> torch.Tensor:
        """timm's `_pos_embed`: the prefix tokens (class, distillation, registers) and the position embedding."""
        model = self.model
        prefix = [_p(t) for t in (model.cls_token, getattr(model, "dist_token", None), model.reg_token) if t is not None]
        prefix_tokens = torch.cat(prefix, dim=1) if prefix else None  # (1, P, D)
        pos = _p(model.pos_embed)  # (1, T_pe, D) or None
        if pos is not None and model.no_embed_class:
            x = _AddConstant.apply(x, pos, self.rules)
        if prefix_tokens is not None:
            x = _Prepend.apply(x, prefix_tokens, self.rules)
        if pos is not None and not model.no_embed_class:
            x = _AddConstant.apply(x, pos, self.rules)
        return x

    def attention(self, attn: Attention, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D): softmax(q k^T * scale) v, heads merged, projected."""
        b, t, _ = x.shape
        h, hd = attn.num_heads, attn.head_dim
        qkv = self.linear(attn.qkv, x).reshape(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        q, k, v = qkv.unbind(0)
        q, k = self.norm(attn.q_norm, q), self.norm(attn.k_norm, k)
        logits = self.share(q * attn.scale, "query") @ self.share(k, "key").transpose(-2, -1)  # (B, H, T, T)
        pattern = _SoftmaxRule.apply(logits, self.rules)
        heads = self.share(pattern, "pattern") @ self.share(v, "value")  # (B, H, T, hd)
        merged = self.norm(attn.norm, heads.transpose(1, 2).reshape(b, t, h * hd))  # (B, T, H hd)
        if getattr(attn, "gate", None) is not None:
            merged = self.gated(self.act(torch.nn.Sigmoid(), self.linear(attn.gate, x)), merged)
        return self.linear(attn.proj, merged)

    def mlp(self, mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if type(mlp) is SwiGLU:
            hidden = self.gated(self.act(mlp.act, self.linear(mlp.fc1_g, x)), self.linear(mlp.fc1_x, x))
        elif type(mlp) is GluMlp:
            x1, x2 = self.linear(mlp.fc1, x).chunk(2, dim=-1)
            hidden = self.gated(self.act(mlp.act, x2), x1) if mlp.gate_last else self.gated(self.act(mlp.act, x1), x2)
        else:
            hidden = self.act(mlp.act, self.linear(mlp.fc1, x))
        return self.linear(mlp.fc2, self.norm(mlp.norm, hidden))

    def block(self, blk: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if type(blk) is ResPostBlock:
            x = x + self.norm(blk.norm1, self.attention(blk.attn, x))
            return x + self.norm(blk.norm2, self.mlp(blk.mlp, x))
        x = x + self.layer_scale(blk.ls1, self.attention(blk.attn, self.norm(blk.norm1, x)))
        return x + self.layer_scale(blk.ls2, self.mlp(blk.mlp, self.norm(blk.norm2, x)))

    def attention_pool(self, pool: AttentionPoolLatent, x: torch.Tensor) -> torch.Tensor:
        """timm's AttentionPoolLatent: a learned latent query attends to the tokens. (B, N, D) -> (B, D') or (B, L', D')."""
        b, n, c = x.shape
        if pool.pos_embed is not None:
            x = _AddConstant.apply(x, _p(pool.pos_embed).unsqueeze(0), self.rules)
        h, hd, latent_len = pool.num_heads, pool.head_dim, pool.latent_len
        with torch.no_grad():  # the query is made of parameters only: a constant
            latent = _p(pool.latent)  # (1, L', D_l)
            q = latent if _is_identity(pool.q) else F.linear(latent, _p(pool.q.weight), _p(pool.q.bias))
            q = self.norm(pool.q_norm, q.reshape(1, latent_len, h, hd).transpose(1, 2))  # (1, H, L', hd)
        kv = self.linear(pool.kv, x).reshape(b, n, 2, h, hd).permute(2, 0, 3, 1, 4)  # (2, B, H, N, hd)
        k, v = kv.unbind(0)
        k = self.norm(pool.k_norm, k)
        logits = (q * pool.scale) @ self.share(k, "pool_key").transpose(-2, -1)  # (B, H, L', N)
        pattern = _SoftmaxRule.apply(logits, self.rules)
        out = (self.share(pattern, "pattern") @ self.share(v, "value")).transpose(1, 2).reshape(b, latent_len, c)
        out = self.linear(pool.proj, out)
        if pool.mlp is not None:
            out = out + self.mlp(pool.mlp, self.norm(pool.norm, out))
        if pool.pool == "token":
            return out[:, 0]
        return out.mean(dim=1) if pool.pool == "avg" else out

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """timm's forward_head: pool, fc_norm, head (the distilled model: the mean of its two heads). (B, T, D) -> (B, C)"""
        model = self.model
        if isinstance(model, VisionTransformerDistilled):
            return (self.linear(model.head, x[:, 0]) + self.linear(model.head_dist, x[:, 1])) / 2
        p = model.num_prefix_tokens
        if model.attn_pool is not None:
            pooled = self.attention_pool(model.attn_pool, x if model.pool_include_prefix else x[:, p:])
        elif model.global_pool == "token":
            pooled = x[:, 0]
        else:
            tokens = x if model.pool_include_prefix else x[:, p:]
            mean, top = tokens.mean(dim=1), tokens.amax(dim=1)
            pooled = {"avg": mean, "max": top, "avgmax": 0.5 * (top + mean)}[model.global_pool]
        return self.linear(model.head, self.norm(model.fc_norm, pooled))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised input -> (B, C)."""
        model = self.model
        tokens = self.norm(model.norm_pre, self.position(self.patch_embedding(x)))  # (B, T, D)
        for blk in model.blocks:
            tokens = self.block(blk, tokens)
        return self.head(self.norm(model.norm, tokens))


# ----------------------------------------------------------------------------------------------
# Input relevance


@dataclass(frozen=True)
class InputRelevance:
    """LRP relevance of every input value for the logit y_c, for each (method, gamma choice)."""

    logits: np.ndarray  # (C,): the LRP forward's logits (the model's, within float32 tolerance)
    target: int
    pixels: dict[tuple[str, str], np.ndarray]  # (method, choice name) -> float32 (3, H, W): x * modified gradient
    shares: dict[tuple[str, str], dict[str, float]]  # same keys -> relevance absorbed by kind; empty unless asked


def input_relevance(
    model: VisionTransformer,
    x: torch.Tensor,
    target: int | Callable[[np.ndarray], int],
    *,
    methods: Sequence[str] = LRP_METHODS,
    choices: Sequence[GammaChoice] = (EPSILON_ONLY,),
    epsilon: float = EPSILON,
    shares: bool = False,
) -> InputRelevance:
    """Input relevance (3, H, W) of y_c by AttnLRP and CP-LRP (`methods`), for each gamma choice: one forward, then one
    backward per (method, choice). x: one normalised input (1, 3, H, W) on the model's device. target: c, or a
    function of the logits (C,) that picks it. shares: also sum the relevance each rule absorbs (slower: a
    host sync per op). Raises LrpError where the model has a part without a rule here.

    The caller holds the model's lock and picks the arithmetic (`devices.full_float32`); the model is not changed."""
    reason = why_unsupported(model)
    if reason:
        raise LrpError(reason)
    unknown = [m for m in methods if m not in LRP_METHODS]
    if unknown:
        raise ValueError(f"unknown LRP method(s) {unknown}; known: {LRP_METHODS}")
    rules = _Rules(epsilon=epsilon, shares=defaultdict(float) if shares else None)
    pairs = [(m, choice) for m in methods for choice in choices]
    with torch_threads(gradient_threads()), torch.inference_mode(False), torch.enable_grad():
        leaf = x.detach().clone().requires_grad_(True)  # a normal tensor, even if x was made in inference mode
        logits = _Forward(model, rules).logits(leaf)[0]  # (C,)
        host_logits = to_host(logits)
        c = int(target) if isinstance(target, (int, np.integer)) else int(target(host_logits))
        pixels, absorbed = {}, {}
        for i, (method, choice) in enumerate(pairs):
            rules.method, rules.gamma = method, dict(choice.gamma)
            if shares:
                rules.shares = defaultdict(float)
            (grad,) = torch.autograd.grad(logits[c], leaf, retain_graph=i < len(pairs) - 1)
            pixels[(method, choice.name)] = to_host((leaf * grad)[0])  # (3, H, W)
            if shares:
                absorbed[(method, choice.name)] = dict(rules.shares)
    return InputRelevance(logits=host_logits, target=c, pixels=pixels, shares=absorbed)


def patch_relevance(pixels: np.ndarray, patch_size: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
    """Input relevance summed over colour channels and over each patch's pixels: (C, H, W) -> (gh, gw) float32,
    in float64 sums. Pixels beyond the last whole patch (none for timm's strict input size) are left out."""
    (ph, pw), (gh, gw) = patch_size, grid
    c = pixels.shape[0]
    blocks = pixels[:, : gh * ph, : gw * pw].astype(np.float64).reshape(c, gh, ph, gw, pw)
    return blocks.sum(axis=(0, 2, 4)).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Choosing gamma per image


@dataclass(frozen=True)
class LrpChoice:
    """The gamma choice picked for one method and image, by faithfulness score (insertion AUC - deletion AUC)."""

    name: str  # the GammaChoice's name
    score: float
    scores: dict[str, float]  # every choice's score, in the order offered


def pick_choice(scores: Mapping[str, float]) -> LrpChoice:
    """The choice with the highest score; ties (and NaN scores, which never win) go to the first offered."""
    best = None
    for name, score in scores.items():
        if best is None or (not np.isnan(score) and (np.isnan(scores[best]) or score > scores[best])):
            best = name
    if best is None:
        raise ValueError("no gamma choice to pick from")
    return LrpChoice(name=best, score=float(scores[best]), scores={k: float(v) for k, v in scores.items()})


def choose_per_method(maps: Mapping[tuple[str, str], np.ndarray],
                      scorer: Callable[[dict[str, np.ndarray]], dict[str, float]]) -> dict[str, LrpChoice]:
    """For each method, the choice whose map scores best. maps: (method, choice name) -> (gh, gw); scorer: maps keyed
    "method/choice" -> their scores (one call for all, so that a faithfulness test shares its forwards)."""
    keyed = {f"{method}/{choice}": m for (method, choice), m in maps.items()}
    scores = scorer(keyed) if len(keyed) > len({method for method, _ in maps}) else {k: float("nan") for k in keyed}
    picks = {}
    for method in dict.fromkeys(method for method, _ in maps):
        picks[method] = pick_choice({choice: scores[f"{method}/{choice}"] for m, choice in maps if m == method})
    return picks
