"""One image through the concepts (the Concepts tab): its features from the capture's own tokens (no forward pass),
each as a map over the patches, and its reconstruction error. Definitions: docs/spec/analyses.md, "Concepts"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..capture import Capture
from .sae import Concepts, ConceptsError

SHOWN_FEATURES = 4  # the Concepts tab's strongest features of an image

@dataclass(frozen=True)
class ImageConcepts:
    """What the concepts see in one image. N patches, F features."""

    codes: np.ndarray  # float32 (N, F): z of each patch token after block L
    strongest: np.ndarray  # int64 (K,): the features with the largest total activation over the image, largest first
    maps: np.ndarray  # float32 (K, gh, gw): each of those features' activation per patch
    error: float  # the image's FVU: sum ||x - x^||^2 / sum ||x - mean x||^2 over its patch tokens
    relative_error: float  # sum ||x - x^||^2 / sum ||x||^2 over its patch tokens


def image_concepts(concepts: Concepts, cap: Capture, count: int = SHOWN_FEATURES) -> ImageConcepts:
    """The image's `count` strongest features (by the sum of their activation over its patches) and its error."""
    g = cap.geometry
    if concepts.sae.d_model != g.embed_dim or not 0 <= concepts.layer < g.num_layers:
        raise ConceptsError(f"These concepts were learned for width {concepts.sae.d_model}, block {concepts.layer}: "
                            f"not this model's ({g.embed_dim}, blocks 0..{g.num_layers - 1}).")
    x = np.asarray(cap.tokens[concepts.layer + 1, g.num_prefix_tokens:], dtype=np.float32)  # (N, D)
    z = concepts.codes(x)  # (N, F)
    reconstruction = concepts.reconstruction(z).numpy().astype(np.float64)  # (N, D)
    squared_error = float(((x - reconstruction) ** 2).sum())
    spread = float(((x - x.mean(axis=0)) ** 2).sum())
    totals = z.sum(dim=0).numpy()  # (F,)
    order = np.lexsort((np.arange(len(totals)), -totals))  # largest first, ties by index
    strongest = np.array([f for f in order[:count] if totals[f] > 0], dtype=np.int64)
    codes = z.numpy()
    maps = codes[:, strongest].T.reshape(len(strongest), *g.grid)  # (N, K) -> (K, gh, gw)
    return ImageConcepts(codes, strongest, maps.astype(np.float32), squared_error / spread if spread > 0 else float("nan"),
                         squared_error / max(float((x.astype(np.float64) ** 2).sum()), 1e-30))
