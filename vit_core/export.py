"""The analysis of one image as plain arrays: the `.npz` + `.json` format of docs/spec/interface.md.

Used by the command line (`vit-lens analyze`) and the dashboard's download button, so both write exactly the
same thing. `analysis_arrays` computes every array; the dashboard, whose caches hold most of them already,
assembles the same keys from what it holds with `image_arrays` and `model_arrays`.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import IO, Any

import numpy as np
from PIL import Image

from . import analyses, explain
from .capture import Capture
from .model import LoadedModel, patch_embed_weight, pos_embed_rows


def model_arrays(pca: analyses.FilterPCA, pos_similarity: np.ndarray | None) -> dict[str, np.ndarray]:
    """The export's per-model arrays: the filters' principal components (K, C, ph, pw) and explained variance
    (K,), and the position-embedding similarity (gh, gw, gh, gw) at the model's own grid (None: no learned
    position embedding, and no such key)."""
    arrays = {"filters_pca": pca.components, "filters_pca_explained": pca.explained_variance_ratio}
    if pos_similarity is not None:
        arrays["pos_embed_similarity"] = pos_similarity
    return arrays


def image_arrays(cap: Capture, distances: tuple[np.ndarray, np.ndarray], rollout: np.ndarray) -> dict[str, np.ndarray]:
    """The export's per-image arrays: the capture's, `distances` = the mean attention distance (L, H) as defined
    and renormalised over the patches, and `rollout` (gh, gw) with mean fusion over all layers."""
    g = cap.geometry
    mad, mad_renorm = distances
    return {
        "input_image": np.ascontiguousarray(cap.input_image, dtype=np.uint8),
        "logits": np.asarray(cap.logits, dtype=np.float32),
        "probs": np.asarray(cap.probs, dtype=np.float32),
        "pattern": np.asarray(cap.pattern, dtype=np.float32),
        "tokens": np.asarray(cap.tokens, dtype=np.float32),
        "grid": np.asarray(g.grid, dtype=np.int64),
        "patch_size": np.asarray(g.patch_size, dtype=np.int64),
        "num_prefix_tokens": np.asarray(g.num_prefix_tokens, dtype=np.int64),
        "mean_attention_distance": mad,
        "mean_attention_distance_renorm": mad_renorm,
        "rollout": rollout,
    }


def mean_attention_distances(cap: Capture) -> tuple[np.ndarray, np.ndarray]:
    """The mean attention distance (L, H) of `cap`, as defined and renormalised over the patches."""
    g = cap.geometry
    p = g.num_prefix_tokens
    return (analyses.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size),
            analyses.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size, renormalize=True))


def pos_similarity_at_grid(loaded: LoadedModel) -> np.ndarray | None:
    """The position-embedding cosine similarity (gh, gw, gh, gw) at the model's own grid, or None without one."""
    g = loaded.geometry
    pos = pos_embed_rows(loaded)
    return None if pos is None else analyses.pos_embed_similarity(pos, g.num_prefix_tokens, g.no_embed_class, g.grid)


def analysis_arrays(loaded: LoadedModel, cap: Capture) -> dict[str, np.ndarray]:
    """Every array of the export format, keyed as in interface.md, computed from the model and the capture."""
    g = cap.geometry
    rollout = analyses.attention_rollout(cap.pattern, g.num_prefix_tokens, g.grid, has_class_token=g.has_class_token)
    pca = analyses.filters_pca(patch_embed_weight(loaded))
    return image_arrays(cap, mean_attention_distances(cap), rollout) | model_arrays(pca, pos_similarity_at_grid(loaded))


def summary(loaded: LoadedModel, cap: Capture, topk: int = 5) -> dict[str, Any]:
    """The `.json` beside the arrays: model, weights source and the top-k predictions."""
    return {
        "model": loaded.name,
        "weights": loaded.weights,
        "topk": [
            {"index": pred.index, "label": pred.label, "prob": pred.prob}
            for pred in analyses.top_k(cap.logits, loaded.labels, topk)
        ],
    }


def explanation_arrays(relevance: explain.Relevance, lens: np.ndarray, token_norms: np.ndarray,
                       faith: explain.Faithfulness | None) -> dict[str, np.ndarray]:
    """The arrays of interface.md's "Explanations in the export" from results already computed: target,
    relevance_<method> (gh, gw), logit_lens (L+1, C), token_norms (L+1, T), and deletion_<name> /
    insertion_<name> (S,) of every method and "random" when `faith` is given."""
    arrays: dict[str, np.ndarray] = {"target": np.asarray(relevance.target, dtype=np.int64)}
    for method, relevance_map in relevance.maps.items():
        arrays[f"relevance_{method}"] = np.asarray(relevance_map, dtype=np.float32)  # (gh, gw)
    arrays["logit_lens"] = lens  # (L+1, C)
    arrays["token_norms"] = token_norms  # (L+1, T)
    if faith is not None:
        for name in faith.deletion:  # the methods, then "random"
            arrays[f"deletion_{name}"] = np.asarray(faith.deletion[name], dtype=np.float32)  # (S,)
            arrays[f"insertion_{name}"] = np.asarray(faith.insertion[name], dtype=np.float32)  # (S,)
    return arrays


def faithfulness_summary(deletion_auc: dict[str, float], insertion_auc: dict[str, float]) -> dict[str, dict[str, float]]:
    """The `.json`'s "faithfulness": name (the methods, then "random") -> {"deletion_auc", "insertion_auc"}."""
    return {name: {"deletion_auc": deletion_auc[name], "insertion_auc": insertion_auc[name]} for name in deletion_auc}


def explanation_export(
    loaded: LoadedModel, cap: Capture, image: Image.Image, target: int | str | None = None, steps: int = explain.DEFAULT_STEPS
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The `--explain` additions of interface.md ("Explanations in the export") for `image` (the image
    `cap` was captured from): the arrays (target, relevance_<method>, logit_lens, token_norms,
    deletion_<name>, insertion_<name>) and the `.json`'s "target" and "faithfulness" (plus
    "unsupported": method -> why it has no map). Target None: top-1. Raises explain.TargetError."""
    relevance = explain.relevance_maps(loaded, image, target, cap=cap)
    faith = explain.faithfulness(loaded, image, relevance.maps, relevance.target, steps=steps)
    arrays = explanation_arrays(relevance, explain.logit_lens(loaded, cap), explain.token_norms(cap), faith)
    summary_part = {
        "target": relevance.target,
        "faithfulness": faithfulness_summary(faith.deletion_auc, faith.insertion_auc),
        "unsupported": dict(relevance.unsupported),
    }
    return arrays, summary_part


def write_npz(file: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    """An .npz file written into `file` from its current position, as `np.savez` writes it: stored, not compressed
    (float attention and tokens barely compress, and zlib would spend seconds of CPU on them on a shared server).
    Refuses object arrays, which np.load could only read with pickle."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
        for name, value in arrays.items():
            array = np.asarray(value, order="C")  # C-ordered data (copied only if not), 0-d kept 0-d
            if array.dtype.hasobject:
                raise ValueError(f"{name}: an object array can't be exported without pickle")
            with npz.open(f"{name}.npy", "w", force_zip64=True) as entry:  # force_zip64 as np.savez (gh-10776)
                np.lib.format.write_array_header_1_0(entry, np.lib.format.header_data_from_array_1_0(array))
                entry.write(array.data)  # zlib's CRC and one write, straight from the array's memory


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The `.npz` of `arrays` in memory (`write_npz`). A server writes it with `vit_core.serving.npz_bytes`,
    which gives the same bytes without holding the GIL."""
    buffer = io.BytesIO()
    write_npz(buffer, arrays)
    return buffer.getvalue()


def json_bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8")
