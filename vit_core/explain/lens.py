"""The logit lens: what the model would predict after each block, and what each patch token says.

Read through the model's own head path (`forward_head(norm(tokens))`), on the token sequences a capture holds.
"""

from __future__ import annotations

import numpy as np
import torch

from ..capture import Capture
from ..loading.model import LoadedModel
from ..runtime.devices import on_model_device, to_host
from .passes import model_pass


def head_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's own head path on a token sequence: forward_head(norm(tokens)). (B, T, D) -> (B, C)"""
    return model.forward_head(model.norm(tokens))


def logit_lens(loaded: LoadedModel, cap: Capture) -> np.ndarray:
    """What the model would predict after each block: forward_head(norm(tokens[l])) for the L+1 token
    sequences of `cap` (row 0: entering block 0; row l: after block l). -> float32 (L+1, C); row L
    equals cap.logits within float32 tolerance."""
    model = loaded.model
    tokens = on_model_device(model, torch.from_numpy(np.array(cap.tokens, dtype=np.float32)))  # (L+1, T, D)
    with model_pass(loaded):
        return to_host(head_logits(model, tokens))  # (L+1, C)


def patch_logit_lens(loaded: LoadedModel, cap: Capture, layer: int) -> np.ndarray:
    """Every patch token of `layer` (0..L, as in `logit_lens`) through norm, fc_norm and head, without
    pooling: float32 (N, C) logits, patches row-major."""
    model, p = loaded.model, loaded.geometry.num_prefix_tokens
    patches = on_model_device(model, torch.from_numpy(np.array(cap.tokens[layer, p:], dtype=np.float32)))  # (N, D)
    with model_pass(loaded):
        return to_host(model.head(model.fc_norm(model.norm(patches))))  # (N, C)


# ----------------------------------------------------------------------------------------------
