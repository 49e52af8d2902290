"""Forward hooks on a shared timm ViT that can't leak: registered inside a context manager, gone on its exit.

Every hook ViT Lens puts on a model goes through `register`, which keeps its handle until the `ExitStack` it
belongs to closes, also when the forward raises; `recording_hooks_on(model)` counts the ones still there (0
outside a pass). The capture, the explanations and the dataset reductions all record through these context
managers. The one model flag they change (`attn.fused_attn`: timm's fused SDPA path never materialises the
attention matrix, so a hook on `attn_drop` would see nothing) is restored the same way.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Callable, Iterator

import torch
from torch.utils.hooks import RemovableHandle

_live_handles: weakref.WeakKeyDictionary[torch.nn.Module, set[RemovableHandle]] = weakref.WeakKeyDictionary()
_live_handles_lock = threading.Lock()

CAPTURED_KEYS = ("pattern", "tokens", "patch_embeddings", "final_tokens", "pre_logits")  # what intermediates_kept hands over


def register(stack: contextlib.ExitStack, model: torch.nn.Module, handle: RemovableHandle) -> None:
    """Note `handle` as one of `model`'s recording hooks, removed (and forgotten) when `stack` closes."""
    with _live_handles_lock:
        _live_handles.setdefault(model, set()).add(handle)

    def remove() -> None:
        handle.remove()
        with _live_handles_lock:
            _live_handles[model].discard(handle)

    stack.callback(remove)


def recording_hooks_on(model: torch.nn.Module) -> int:
    """Hooks the recording context managers registered on `model` (or its modules) and have not
    removed yet: 0 outside a pass, also after a forward that raised."""
    with _live_handles_lock:
        return len(_live_handles.get(model, ()))


def forward_hooks_on(module: torch.nn.Module) -> int:
    """The forward hooks and pre-hooks on `module` and every module inside it, whoever registered them. torch offers
    no public way to list a module's hooks, so this is the one place in ViT Lens that reads its private
    `_forward_hooks` / `_forward_pre_hooks` dictionaries."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def foreign_hooks(model: torch.nn.Module) -> bool:
    """Whether a module of `model` carries a forward hook or pre-hook that none of these context managers
    registered (someone's own probe)."""
    return forward_hooks_on(model) > recording_hooks_on(model)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside the block; each module's own mode restored on exit. A model already in eval mode (as loaded:
    every pass's case) is left untouched: `model.eval()` and `model.train()` each walk every module through
    nn.Module's slow `__setattr__`, which on a small model costs a tenth of its forward."""
    training = [module for module in model.modules() if module.training]
    if not training:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        for module in training:  # not model.train(): a module that was in eval mode inside a training one stays so
            module.training = True


@contextlib.contextmanager
def attention_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, every attention block runs timm's un-fused path and hands its post-softmax
    pattern (B, H, T, T) to `record`; the hooks and the `fused_attn` flags are restored on exit,
    also when the forward raises. (The un-fused path computes softmax(q k^T * scale) and passes it
    through `attn_drop`, an identity in eval mode.)"""
    with contextlib.ExitStack() as stack:
        for blk in model.blocks:
            stack.callback(setattr, blk.attn, "fused_attn", blk.attn.fused_attn)  # restored on exit
            blk.attn.fused_attn = False
            register(stack, model, blk.attn.attn_drop.register_forward_hook(lambda m, i, o: record(o.detach())))
        yield


@contextlib.contextmanager
def tokens_recorded(model: torch.nn.Module, record: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward hands `record` the token sequence (B, T, D) entering block 0, then after
    each block (before the final norm): L+1 calls in order. Hooks removed on exit, also when the forward raises."""
    with contextlib.ExitStack() as stack:
        register(stack, model, model.blocks[0].register_forward_pre_hook(lambda m, args: record(args[0])))
        for blk in model.blocks:
            register(stack, model, blk.register_forward_hook(lambda m, i, o: record(o)))
        yield


@contextlib.contextmanager
def intermediates_kept(model: torch.nn.Module, keep: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Inside the block, a forward pass in eval mode hands `keep(key, tensor)` every intermediate a capture
    needs (keys: CAPTURED_KEYS); mode and hooks restored on exit."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        stack.enter_context(attention_recorded(model, lambda pattern: keep("pattern", pattern)))
        stack.enter_context(tokens_recorded(model, lambda tokens: keep("tokens", tokens)))
        hooks = [  # (how to register, the hook): each handle is in the stack as soon as it exists
            (model.patch_embed.register_forward_hook, lambda m, i, o: keep("patch_embeddings", o)),
            (model.norm.register_forward_hook, lambda m, i, o: keep("final_tokens", o)),
            (model.head.register_forward_pre_hook, lambda m, args: keep("pre_logits", args[0])),
        ]
        for register_hook, hook in hooks:
            register(stack, model, register_hook(hook))
        yield
