"""The catalog's per-image analyses, each one lens over the maths that already computes it (vit_core.analyses,
vit_core.explain). Their order is the export's: `export_keys()` lists the keys of every image's `.npz` from here,
and the lesson's graph writes out the outputs their `browser` twins name (`graph_outputs()`).

Imports nothing heavy at import (numpy and the maths are imported inside each lens), so that `--help`, which lists
the built-in lenses by name, loads at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .declare import lens

if TYPE_CHECKING:
    import numpy as np

    from ..capture import Capture
    from ..loading.model import LoadedModel


@lens("capture", spec="Attention pattern", export="image",
      keys=("input_image", "logits", "probs", "pattern", "tokens", "grid", "patch_size", "num_prefix_tokens"),
      browser={"logits": "graph:logits", "pattern": "graph:attention"})
def capture(cap: Capture) -> dict[str, np.ndarray]:
    """The capture's own arrays: the crop (H, W, 3) uint8, logits and probs (C,), pattern (L, H, T, T), tokens
    (L+1, T, D), float32, and the token geometry: grid and patch_size (2,), num_prefix_tokens (), int64."""
    import numpy as np

    g = cap.geometry
    return {
        "input_image": np.ascontiguousarray(cap.input_image, dtype=np.uint8),
        "logits": np.asarray(cap.logits, dtype=np.float32),
        "probs": np.asarray(cap.probs, dtype=np.float32),
        "pattern": np.asarray(cap.pattern, dtype=np.float32),
        "tokens": np.asarray(cap.tokens, dtype=np.float32),
        "grid": np.asarray(g.grid, dtype=np.int64),
        "patch_size": np.asarray(g.patch_size, dtype=np.int64),
        "num_prefix_tokens": np.asarray(g.num_prefix_tokens, dtype=np.int64),
    }


@lens("mean_attention_distance", spec="Mean attention distance", export="image",
      keys=("mean_attention_distance", "mean_attention_distance_renorm"),
      browser={"mean_attention_distance": "js:A.meanAttentionDistance(att, g)",
               "mean_attention_distance_renorm": "js:A.meanAttentionDistance(att, g, true)"})
def mean_attention_distance(cap: Capture) -> dict[str, np.ndarray]:
    """The mean attention distance (L, H) in pixels, as defined (prefix attention left out) and with each patch row
    renormalised over the patches."""
    from ..analyses import mean_attention_distances

    g = cap.geometry
    plain, renormalised = mean_attention_distances(cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)
    return {"mean_attention_distance": plain, "mean_attention_distance_renorm": renormalised}


@lens("rollout", spec="Attention rollout", export="image", keys=("rollout",),
      settings={"fusion": "mean", "last_layer": None}, browser={"rollout": "js:A.rollout(att, g)"})
def rollout(cap: Capture, fusion: str, last_layer: int | None) -> dict[str, np.ndarray]:
    """The rollout map (gh, gw), unscaled: heads fused by `fusion` (mean, max or min), the layers up to `last_layer`
    (None: all). The export holds the defaults; the lesson's twin computes them (mean fusion only)."""
    from ..analyses import attention_rollout

    g = cap.geometry
    return {"rollout": attention_rollout(cap.pattern, g.num_prefix_tokens, g.grid, fusion=fusion, last_layer=last_layer,
                                         has_class_token=g.has_class_token)}


@lens("logit_lens", spec="Logit lens", export="explain", keys=("logit_lens",), needs_model=True,
      browser={"logit_lens": "graph:logit_lens"})
def logit_lens(cap: Capture, loaded: LoadedModel) -> dict[str, np.ndarray]:
    """The model's head on each of the L+1 rows of the residual stream: (L+1, C) float32. Reads the head's weights."""
    from ..explain.lens import logit_lens as lens_rows

    return {"logit_lens": lens_rows(loaded, cap)}


@lens("token_norms", spec="Token norms and high-norm tokens", export="explain", keys=("token_norms",),
      browser={"token_norms": "graph:token_norms"})
def token_norms(cap: Capture) -> dict[str, np.ndarray]:
    """The Euclidean norm of every token of the L+1 rows of the residual stream: (L+1, T) float32."""
    from ..explain.relevance import token_norms as norms

    return {"token_norms": norms(cap)}
