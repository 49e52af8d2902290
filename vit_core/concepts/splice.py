"""Splicing an autoencoder into the model: block L's patch-token outputs replaced, the prefix tokens untouched.

`spliced(loaded, layer, replace)` is a forward hook on block L that lives only inside the context (vit_core.hooks);
`replace` maps the patch tokens (B, N, D) to what the next block sees. Two replacements are defined here:

- the reconstruction x^ (the spliced model: how much of the model's behaviour the features carry);
- a concept removed: x - s z_f d_f, the token less feature f's share of the reconstruction (the reconstruction's
  error stays, so only the feature's contribution goes; "remove this concept" in the Concepts tab).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import numpy as np
import torch

from ..explain.passes import model_input, model_pass
from ..hooks import register
from ..loading.model import LoadedModel
from ..runtime.devices import to_host
from .sae import Concepts

Replacement = Callable[[torch.Tensor], torch.Tensor]  # patch tokens (B, N, D) -> (B, N, D)


@contextlib.contextmanager
def spliced(loaded: LoadedModel, layer: int, replace: Replacement) -> Iterator[None]:
    """Inside the block, block `layer`'s output has its patch tokens replaced by `replace(patch tokens)`; the hook is
    removed on exit, also when the forward raises."""
    p = loaded.geometry.num_prefix_tokens

    def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        patches = output[:, p:]  # (B, N, D)
        return torch.cat([output[:, :p], replace(patches).to(output.dtype)], dim=1)  # (B, T, D)

    with contextlib.ExitStack() as stack:
        register(stack, loaded.model, loaded.model.blocks[layer].register_forward_hook(hook))
        yield


def reconstructed(concepts: Concepts) -> Replacement:
    """Patch tokens -> their reconstruction x^ (computed on the host's CPU copy of the autoencoder)."""
    def replace(patches: torch.Tensor) -> torch.Tensor:
        b, n, d = patches.shape
        flat = patches.reshape(b * n, d).float().cpu()  # (B, N, D) -> (B N, D)
        return concepts.reconstruction(concepts.codes(flat)).reshape(b, n, d).to(patches.device)
    return replace


def concept_removed(concepts: Concepts, feature: int) -> Replacement:
    """Patch tokens -> the tokens less feature `feature`'s share of their reconstruction, s z_f d_f."""
    def replace(patches: torch.Tensor) -> torch.Tensor:
        b, n, d = patches.shape
        flat = patches.reshape(b * n, d).float().cpu()  # (B N, D)
        share = concepts.share(concepts.codes(flat), feature)  # (B N, D)
        return (flat - share).reshape(b, n, d).to(patches.device)
    return replace


def spliced_logits(loaded: LoadedModel, x: torch.Tensor, layer: int, replace: Replacement | None) -> torch.Tensor:
    """The logits (B, C) of x (B, 3, H, W) with block `layer` spliced by `replace` (None: the plain model), on the host."""
    with model_pass(loaded), (spliced(loaded, layer, replace) if replace else contextlib.nullcontext()):
        return loaded.model(x.to(loaded.device)).float().cpu()


def logits_with_concept_removed(loaded: LoadedModel, image, concepts: Concepts, feature: int) -> np.ndarray:
    """The logits (C,) float32 of an image (PIL or a Capture) with feature `feature` removed at the concepts' layer."""
    x = model_input(loaded, image)  # (1, 3, H, W)
    return to_host(spliced_logits(loaded, x, concepts.layer, concept_removed(concepts, feature))[0])


def logits_spliced(loaded: LoadedModel, image, concepts: Concepts) -> np.ndarray:
    """The logits (C,) float32 of an image (PIL or a Capture) with the concepts' layer replaced by its reconstruction."""
    x = model_input(loaded, image)
    return to_host(spliced_logits(loaded, x, concepts.layer, reconstructed(concepts))[0])
