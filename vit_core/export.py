"""The analysis of one image as plain arrays: the `.npz` + `.json` format of spec/interface.md.

Used by the command line (`python -m vit_core analyze`) and the dashboard's download button, so
both write exactly the same thing.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
import weakref
import zipfile
from typing import Any

import numpy as np
import torch
from PIL import Image

from . import analyses, explain
from .capture import Capture, to_host
from .loading import LoadedModel

PCA_COMPONENTS = 28  # the paper's Fig. 7 (left) shows 28


def patch_embed_weight(loaded: LoadedModel) -> np.ndarray:
    """The patch-embedding Conv2d weight: (D, C, ph, pw) float32."""
    return to_host(loaded.model.patch_embed.proj.weight)


def patch_embed_bias(loaded: LoadedModel) -> np.ndarray | None:
    bias = loaded.model.patch_embed.proj.bias
    return None if bias is None else to_host(bias)


def pos_embed_rows(loaded: LoadedModel) -> np.ndarray | None:
    """The learned absolute position embedding (T_pe, D), or None if the model has none."""
    pos = getattr(loaded.model, "pos_embed", None)
    if pos is None or not isinstance(pos, torch.nn.Parameter):
        return None
    return to_host(pos)[0]  # (1, T_pe, D) -> (T_pe, D)


# Per-model analyses depend on the weights only: computed once per loaded model, not per image.
_model_arrays: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, np.ndarray]] = weakref.WeakKeyDictionary()


def model_arrays(loaded: LoadedModel) -> dict[str, np.ndarray]:
    """The export's per-model arrays (filter PCA, position-embedding similarity), cached per model."""
    cached = _model_arrays.get(loaded.model)
    if cached is None:
        g = loaded.geometry
        pca = analyses.filters_pca(patch_embed_weight(loaded), k=PCA_COMPONENTS)
        cached = {"filters_pca": pca.components, "filters_pca_explained": pca.explained_variance_ratio}
        pos = pos_embed_rows(loaded)
        if pos is not None:
            cached["pos_embed_similarity"] = analyses.pos_embed_similarity(pos, g.num_prefix_tokens, g.no_embed_class, g.grid)
        for array in cached.values():
            array.setflags(write=False)
        _model_arrays[loaded.model] = cached
    return cached


def analysis_arrays(loaded: LoadedModel, cap: Capture) -> dict[str, np.ndarray]:
    """Every array of the export format, keyed as in interface.md."""
    g = cap.geometry
    p = g.num_prefix_tokens
    arrays = {
        "input_image": np.ascontiguousarray(cap.input_image, dtype=np.uint8),
        "logits": np.asarray(cap.logits, dtype=np.float32),
        "probs": np.asarray(cap.probs, dtype=np.float32),
        "pattern": np.asarray(cap.pattern, dtype=np.float32),
        "tokens": np.asarray(cap.tokens, dtype=np.float32),
        "grid": np.asarray(g.grid, dtype=np.int64),
        "patch_size": np.asarray(g.patch_size, dtype=np.int64),
        "num_prefix_tokens": np.asarray(p, dtype=np.int64),
        "mean_attention_distance": analyses.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size),
        "mean_attention_distance_renorm": analyses.mean_attention_distance(
            cap.pattern, p, g.grid, g.patch_size, renormalize=True
        ),
        "rollout": analyses.attention_rollout(cap.pattern, p, g.grid, has_class_token=g.has_class_token),
    }
    return {**arrays, **model_arrays(loaded)}


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


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz file in memory, as `np.savez` writes it: stored, not compressed (float attention and tokens
    barely compress, ViT-B/16: 27 MB instead of 31, and zlib spends 2 s of CPU on them, on a server that 30
    students share), and copied without holding Python's GIL (see `_scratch_file`)."""
    file = _scratch_file()
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
        for name, value in arrays.items():
            array = np.asarray(value, order="C")  # C-ordered data (copied only if not), 0-d kept 0-d
            if array.dtype.hasobject:
                raise ValueError(f"{name}: an object array can't be exported without pickle")
            with npz.open(f"{name}.npy", "w", force_zip64=True) as entry:  # force_zip64 as np.savez (gh-10776)
                np.lib.format.write_array_header_1_0(entry, np.lib.format.header_data_from_array_1_0(array))
                entry.write(array.data)  # zlib's CRC and one write(2), straight from the array's memory
    return _read_whole(file.fileno(), file.tell())  # the file may go on past the end: an earlier, larger export


_scratch = threading.local()


def _scratch_file() -> io.FileIO:
    """This thread's scratch file for `npz_bytes`, at its start: unbuffered, in memory where the OS has memfd
    (Linux), else a temporary file; kept for the thread's next export, and closed when the thread ends.

    The dashboard makes a class's exports (29 MB each for ViT-B/16) on low-priority threads (dashboard/process.py)
    while students' pages run Python. Written into an `io.BytesIO`, every array was copied holding the GIL, and a
    low-priority thread preempted mid-copy kept every page waiting: in a 30-session load test `py-spy record --gil`
    found the export holding the GIL in 35 % of the samples where anyone held it. os.write and os.pread copy with
    the GIL released, and `_read_whole` makes the one `bytes` object Streamlit needs straight from the file. The
    file is kept because writing into a new one's fresh pages made an export 4x slower (16 -> 64 ms, ViT-B/16)."""
    file = getattr(_scratch, "file", None)
    if file is None:
        if hasattr(os, "memfd_create"):
            file = open(os.memfd_create("vit-lens-npz", os.MFD_CLOEXEC), "w+b", buffering=0)
        else:
            file = tempfile.TemporaryFile(buffering=0)
        _scratch.file = file
    file.seek(0)
    return file


def _read_whole(fd: int, size: int) -> bytes:
    """The first `size` bytes of the file `fd`, read with the GIL released (os.pread reads into a new bytes object)."""
    data = os.pread(fd, size, 0)
    if len(data) == size:
        return data
    parts = [data]  # one read returns at most about 2 GiB on Linux
    while (done := sum(map(len, parts))) < size:
        if not (part := os.pread(fd, size - done, done)):
            raise OSError(f"the scratch file ended at {done} of {size} bytes")
        parts.append(part)
    return b"".join(parts)


def json_bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8")
