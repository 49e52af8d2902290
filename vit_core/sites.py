"""Named sites on timm's own ViT modules: a name for every intermediate a researcher may want, and hooks that record it.

A site is one tensor of the forward, named as in docs/spec/interface.md ("Your own lens"); shapes with the batch axis
removed (T tokens, N patches, D width, H heads, d_head = D / H, D_mlp the MLP's width, C classes):

    embed                  (N, D)          patch_embed's output, before prefix tokens and position
    blocks.{b}.in          (T, D)          the residual stream entering block b
    blocks.{b}.out         (T, D)          the residual stream after block b
    blocks.{b}.attn.q      (H, T, d_head)  queries after the model's q_norm, before the scale
    blocks.{b}.attn.k      (H, T, d_head)  keys after the model's k_norm
    blocks.{b}.attn.v      (H, T, d_head)  values
    blocks.{b}.attn.pattern (H, T, T)      post-softmax attention, rows = queries
    blocks.{b}.attn.out    (T, D)          the attention's output after its projection
    blocks.{b}.mlp.hidden  (T, D_mlp)      the MLP's hidden units after the activation (and gate)
    norm                   (T, D)          after the final norm
    pre_logits             (D',)           the classifier head's input
    logits                 (C,)

`*` as the block index asks for every block. TransformerLens / ViT-Prisma names are aliases of the same arrays
(`MODEL_ALIASES`, `BLOCK_ALIASES`). The sites the default capture records anyway (DEFAULT_SITES) are read from its
fields, so asking for them costs nothing; the others are recorded by `sites_recorded`, with hooks that live only
inside the pass.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from .errors import ViTLensError

if TYPE_CHECKING:  # the names and their checks import no torch: a lens file and `--help` load at once
    import torch

MODEL_SITES = ("embed", "norm", "pre_logits", "logits")
BLOCK_SITES = ("in", "out", "attn.q", "attn.k", "attn.v", "attn.pattern", "attn.out", "mlp.hidden")
DEFAULT_SITES = (*MODEL_SITES, "in", "out", "attn.pattern")  # the capture's own fields: asking for them costs nothing
# TransformerLens / ViT-Prisma hook names -> ours (the same arrays; TransformerLens itself orders q, k, v (T, H, d_head))
MODEL_ALIASES = {"hook_embed": "embed", "ln_final.hook_normalized": "norm"}
BLOCK_ALIASES = {  # blocks.{b}.<alias> -> blocks.{b}.<ours>
    "hook_resid_pre": "in", "hook_resid_post": "out", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k",
    "attn.hook_v": "attn.v", "attn.hook_pattern": "attn.pattern", "hook_attn_out": "attn.out",
    "mlp.hook_post": "mlp.hidden",
}
_BLOCK_NAME = re.compile(r"blocks\.(\d+|\*)\.(.+)")


class SiteError(ViTLensError, LookupError):
    """A site name that doesn't exist on this model, or wasn't recorded by the pass that was asked."""


def canonical(name: str) -> str:
    """`name` in our words, on any model: an alias becomes our name, `*` stays ('blocks.*.attn.hook_q' ->
    'blocks.*.attn.q'). Raises SiteError naming the site when no model has it."""
    name = MODEL_ALIASES.get(name, name)
    if name in MODEL_SITES:
        return name
    match = _BLOCK_NAME.fullmatch(name)
    part = match and BLOCK_ALIASES.get(match.group(2), match.group(2))
    if not match or part not in BLOCK_SITES:
        raise SiteError(f"no site {name!r}: the sites are {', '.join(MODEL_SITES)} and blocks.{{b}}.<{'|'.join(BLOCK_SITES)}> "
                        "(docs/spec/interface.md, \"Your own lens\").")
    return f"blocks.{match.group(1)}.{part}"


def site_names(name: str, num_layers: int) -> list[str]:
    """The canonical names `name` stands for on a model of `num_layers` blocks: one, or one per block for `*`.
    Aliases become our names. Raises SiteError naming the site when it doesn't exist on this model."""
    name = canonical(name)
    if name in MODEL_SITES:
        return [name]
    _, index, part = name.split(".", 2)
    if index == "*":
        return [f"blocks.{b}.{part}" for b in range(num_layers)]
    block = int(index)
    if block >= num_layers:
        raise SiteError(f"no site {name!r} on this model: it has {num_layers} blocks, 0 to {num_layers - 1}.")
    return [f"blocks.{block}.{part}"]


def is_default(name: str) -> bool:
    """Whether the canonical site `name` is one of the default capture's fields (recorded on every pass)."""
    return (name.split(".", 2)[-1] if name.startswith("blocks.") else name) in DEFAULT_SITES


def recorded_sites(names: Iterable[str], num_layers: int) -> tuple[str, ...]:
    """The canonical sites beyond the default capture that `names` ask for, each once, in the order asked.
    Raises SiteError (before any pass) for a name that doesn't exist on this model."""
    wanted = [n for name in names for n in site_names(name, num_layers)]
    return tuple(dict.fromkeys(n for n in wanted if not is_default(n)))


def _split_v(attn: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """qkv's output (B, T, 3*H*d_head) -> v (B, H, T, d_head), as timm's Attention.forward splits it."""
    def v_of(qkv: torch.Tensor) -> torch.Tensor:
        b, t, _ = qkv.shape
        return qkv.reshape(b, t, 3, attn.num_heads, attn.head_dim)[:, :, 2].transpose(1, 2)  # (B, T, H, dh) -> (B, H, T, dh)
    return v_of


def _where(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The module whose output is site `name` (a canonical block site beyond the defaults), and what turns that output
    into the site's tensor (B, ...). Raises SiteError when this model's block has no such module."""
    _, b, part = name.split(".", 2)
    block = model.blocks[int(b)]
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    found = {
        "attn.q": (getattr(attn, "q_norm", None), lambda t: t),  # (B, H, T, dh): after q_norm, before the scale
        "attn.k": (getattr(attn, "k_norm", None), lambda t: t),
        "attn.v": (getattr(attn, "qkv", None), attn is not None and _split_v(attn)),
        "attn.out": (attn, lambda t: t),  # (B, T, D): after proj (and proj_drop, an identity in eval mode)
        "mlp.hidden": (getattr(mlp, "drop1", None), lambda t: t),  # (B, T, D_mlp): after act (and a GLU's gate)
    }[part]
    if found[0] is None or (part == "attn.v" and not hasattr(attn, "head_dim")):
        raise SiteError(f"no site {name!r} on this model: its block {b} ({type(block).__name__}) is not timm's "
                        "standard Block with Attention and Mlp.")
    return found


@contextlib.contextmanager
def sites_recorded(model: torch.nn.Module, names: Iterable[str], keep: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward hands `keep(name, tensor (B, ...))` each canonical site of `names` (none of them a
    default one: `recorded_sites`). Hooks removed on exit, also when the forward raises."""
    from .hooks import register

    with contextlib.ExitStack() as stack:
        for name in names:
            module, of = _where(model, name)
            hook = (lambda n, f: lambda m, i, o: keep(n, f(o).detach()))(name, of)
            register(stack, model, module.register_forward_hook(hook))
        yield
