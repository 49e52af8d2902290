"""Patch occlusion (analyses.md, "Patch occlusion"): how much the target's probability falls when one patch alone
is dropped, for every patch. Forward passes only, so it is also what the static lesson computes in the browser
(web/src/why.js), and what tests/browser/test_web_lesson_browser.py compares the page's map with."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ..capture import Capture
from ..loading.model import LoadedModel
from ..runtime.devices import to_host
from .interventions import embedded_tokens, keep_tokens, run_from_embedded
from .passes import model_input, model_pass

OCCLUSION_BATCH = 16  # perturbed inputs per forward (the sets of one length: all but one patch)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (B, C) -> (B, C). Not rounded to float32: the map is a difference of two
    probabilities, both near 1 for a confident model, where float32's steps (6e-8) would be most of it."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def occlusion_map(loaded: LoadedModel, image: Image.Image | Capture, target: int) -> np.ndarray:
    """M[k] = p_c(image) - p_c(image with patch k dropped), token dropping, c = `target` -> float64 (gh, gw), unscaled
    (positive: the patch helped class c; negative: it held c back)."""
    g = loaded.geometry
    n = g.num_patches
    x = model_input(loaded, image)  # (1, 3, H, W)
    everything = torch.arange(n)
    sets = torch.stack([everything[everything != k] for k in range(n)])  # (N, N-1): every patch but one
    probs = []
    with model_pass(loaded):
        tokens = embedded_tokens(loaded.model, x)  # (1, T, D)
        full = probabilities(to_host(run_from_embedded(loaded.model, tokens)))[0, target]
        for start in range(0, n, OCCLUSION_BATCH):
            kept = keep_tokens(tokens, sets[start:start + OCCLUSION_BATCH], g.num_prefix_tokens)  # (b, P + N - 1, D)
            logits = run_from_embedded(loaded.model, kept)
            probs.append(probabilities(to_host(logits))[:, target])  # (b, C) -> (b,)
    return (full - np.concatenate(probs)).reshape(g.grid)  # float64: the page's map is compared with it
