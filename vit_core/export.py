"""The analysis of one image as plain arrays: the `.npz` + `.json` format of docs/spec/interface.md.

Used by the command line (`vit-lens analyze`) and the dashboard's download button, so both write exactly the
same thing. `analysis_arrays` computes every array; the dashboard, whose caches hold most of them already,
assembles the same keys from what it holds with `image_arrays` and `model_arrays`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import zipfile
from typing import IO, Any, Iterator, Mapping, Sequence

import numpy as np
from PIL import Image

from . import analyses, explain, lenses
from .capture import Capture
from .loading.model import LoadedModel, patch_embed_weight, pos_embed_rows


def model_arrays(pca: analyses.FilterPCA, pos_similarity: np.ndarray | None) -> dict[str, np.ndarray]:
    """The export's per-model arrays: the filters' principal components (K, C, ph, pw) and explained variance
    (K,), and the position-embedding similarity (gh, gw, gh, gw) at the model's own grid (None: no learned
    position embedding, and no such key)."""
    arrays = {"filters_pca": pca.components, "filters_pca_explained": pca.explained_variance_ratio}
    if pos_similarity is not None:
        arrays["pos_embed_similarity"] = pos_similarity
    return arrays


def image_arrays(cap: Capture, distances: tuple[np.ndarray, np.ndarray] | None = None, rollout: np.ndarray | None = None,
                 *, computed: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> dict[str, np.ndarray]:
    """The export's per-image arrays: the keys of every catalog lens with export "image" (vit_core.lenses,
    `export_keys()`), each lens's dict with its default settings, in the catalog's order. `computed` (lens name ->
    its dict) gives what a caller holds already (the dashboard's caches); `distances` (the mean attention distance
    (L, H) as defined and renormalised) and `rollout` ((gh, gw), mean fusion over all layers) are the same for
    those two lenses."""
    given = dict(computed or {})
    if distances is not None:
        given["mean_attention_distance"] = dict(zip(("mean_attention_distance", "mean_attention_distance_renorm"),
                                                    distances, strict=True))
    if rollout is not None:
        given["rollout"] = {"rollout": rollout}
    arrays: dict[str, np.ndarray] = {}
    for one in lenses.catalog():
        if one.export == "image":
            arrays |= given[one.name] if one.name in given else lenses.results_of(one, cap)
    return arrays


def mean_attention_distances(cap: Capture) -> tuple[np.ndarray, np.ndarray]:
    """The mean attention distance (L, H) of `cap`, as defined and renormalised over the patches."""
    g = cap.geometry
    p = g.num_prefix_tokens
    return analyses.mean_attention_distances(cap.pattern, p, g.grid, g.patch_size)


def pos_similarity_at_grid(loaded: LoadedModel) -> np.ndarray | None:
    """The position-embedding cosine similarity (gh, gw, gh, gw) at the model's own grid, or None without one."""
    g = loaded.geometry
    pos = pos_embed_rows(loaded)
    return None if pos is None else analyses.pos_embed_similarity(pos, g.num_prefix_tokens, g.no_embed_class, g.grid)


def analysis_arrays(loaded: LoadedModel, cap: Capture) -> dict[str, np.ndarray]:
    """Every array of the export format, keyed as in interface.md, computed from the model and the capture."""
    pca = analyses.filters_pca(patch_embed_weight(loaded))
    return image_arrays(cap) | model_arrays(pca, pos_similarity_at_grid(loaded))


def summary(loaded: LoadedModel, cap: Capture, topk: int = 5) -> dict[str, Any]:
    """The `.json` beside the arrays: model, weights source and the top-k predictions (none for a model without a
    classifier head, whose outputs are pooled features, not classes: then `"classifier_head": false`)."""
    head = bool(loaded.geometry.num_classes)
    return {
        "model": loaded.name,
        "weights": loaded.weights,
        "classifier_head": head,
        "topk": [
            {"index": pred.index, "label": pred.label, "prob": pred.prob}
            for pred in analyses.top_k(cap.logits, loaded.labels, topk)
        ] if head else [],
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


def json_number(value: float) -> float | None:
    """A float for the `.json`, None for NaN (strict JSON has no NaN)."""
    return None if math.isnan(value) else float(value)


def judgement_arrays(judgement: explain.Judgement, objects: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The arrays of interface.md's "Explanations in the export" for the tests beyond the token-dropping curves, for
    the tests that ran: pixel_deletion_<name> / pixel_insertion_<name> (S,) float32, and srg_<name>, saco_<name>,
    pointing_game_<name>, relevance_mass_<name>, relevance_rank_<name> float64 (), for every method and "random"
    (the random baseline's mean); `object_patches` (gh, gw) bool when given."""
    arrays: dict[str, np.ndarray] = {}
    if judgement.pixel_curves is not None:
        for name in judgement.pixel_curves.deletion:  # the methods, then "random"
            arrays[f"pixel_deletion_{name}"] = np.asarray(judgement.pixel_curves.deletion[name], dtype=np.float32)  # (S,)
            arrays[f"pixel_insertion_{name}"] = np.asarray(judgement.pixel_curves.insertion[name], dtype=np.float32)
    for test in ("srg", "saco", *explain.LOCALISATION_METRICS):
        result = judgement.results.get(test)
        if result is not None:
            for method, value in result.values.items():
                arrays[f"{test}_{method}"] = np.asarray(value, dtype=np.float64)
            arrays[f"{test}_{explain.RANDOM}"] = np.asarray(result.random_mean, dtype=np.float64)
    if objects is not None:
        arrays["object_patches"] = np.asarray(objects, dtype=bool)
    return arrays


def judgement_summary(judgement: explain.Judgement) -> dict[str, Any]:
    """The `.json`'s "tests" (test -> its convention, direction, each method's score, the random mean and std),
    "verdicts" (test -> method -> {"verdict", "gain", "threshold"}), "random_baseline" (how many seeded random
    orders, and the seed) and, with a mask, "localisation" (method or
    "random" -> {"pointing_game", "relevance_mass", "relevance_rank"}). NaN is written as null."""
    tests = {t: {"convention": r.convention, "higher_is_better": r.higher_is_better,
                 "values": {m: json_number(v) for m, v in r.values.items()},
                 "random_mean": json_number(r.random_mean), "random_std": json_number(r.random_std)}
             for t, r in judgement.results.items()}
    verdicts = {t: {m: {"verdict": v.label, "gain": json_number(v.gain), "threshold": json_number(v.threshold)}
                    for m, v in by_method.items()} for t, by_method in judgement.verdicts().items()}
    part: dict[str, Any] = {"tests": tests, "verdicts": verdicts,
                            "random_baseline": {"orders": judgement.random_orders, "seed": judgement.seed}}
    located = [t for t in explain.LOCALISATION_METRICS if t in judgement.results]
    if located:
        names = [*judgement.methods, explain.RANDOM]
        part["localisation"] = {n: {t: json_number(judgement.results[t].values[n] if n != explain.RANDOM
                                               else judgement.results[t].random_mean) for t in located} for n in names}
    return part


EXPORT_TESTS = ("deletion_auc", "insertion_auc")  # what `analyze --explain` runs unless asked for more


def explanation_export(
    loaded: LoadedModel, cap: Capture, image: Image.Image, target: int | str | None = None, steps: int = explain.DEFAULT_STEPS,
    *, mask: np.ndarray | None = None, tests: Sequence[str] = EXPORT_TESTS,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The `--explain` additions of interface.md ("Explanations in the export") for `image` (the image
    `cap` was captured from): the arrays (target, relevance_<method>, logit_lens, token_norms,
    deletion_<name>, insertion_<name>) and the `.json`'s "target" and "faithfulness" (plus
    "unsupported": method -> why it has no map), "tests" and "verdicts". `tests`: the faithfulness tests to run
    (explain.FAITHFULNESS_TESTS; the deletion and insertion curves by default), their arrays added
    (`judgement_arrays`). `mask`: the object mask (H, W) bool of `image` (`explain.mask_from_file`): adds the
    localisation metrics and "localisation". Target None: top-1. Raises explain.TargetError, explain.MaskError."""
    relevance = explain.relevance_maps(loaded, image, target, cap=cap)
    objects = None if mask is None else explain.object_patches(loaded, mask, image.size)
    judgement = explain.judge(loaded, image, relevance.maps, relevance.target, mask=objects, steps=steps, tests=tests,
                              reuse=relevance.choice_sets)
    faith = judgement.curves
    arrays = explanation_arrays(relevance, explain.logit_lens(loaded, cap), explain.token_norms(cap), faith)
    arrays |= judgement_arrays(judgement, objects)
    summary_part = {"target": relevance.target}
    if faith is not None:
        summary_part["faithfulness"] = faithfulness_summary(faith.deletion_auc, faith.insertion_auc)
    summary_part |= {"unsupported": dict(relevance.unsupported)} | judgement_summary(judgement)
    summary_part["gamma_choice"] = {method: {"name": pick.name, "score": json_number(pick.score),
                                             "scores": {name: json_number(v) for name, v in pick.scores.items()}}
                                    for method, pick in relevance.gamma_choice.items()}  # AttnLRP, CP-LRP: the gamma rule used
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


@contextlib.contextmanager
def npz_member(npz: np.lib.npyio.NpzFile, key: str) -> Iterator[tuple[tuple[int, ...], np.dtype, IO[bytes]]]:
    """One array of an open .npz to be read a piece at a time (`read_piece`): its shape, its dtype and its stored
    data as a file at the data's start. Raises KeyError for a missing key, ValueError for what isn't a plain
    C-ordered array."""
    with npz.zip.open(f"{key}.npy") as file:
        version = np.lib.format.read_magic(file)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(file)
        if fortran_order or dtype.hasobject:
            raise ValueError(f"{key} is not a C-ordered array of numbers")
        yield tuple(shape), dtype, file


def read_piece(file: IO[bytes], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The next values of an array stored in `file` (`npz_member`) as a piece of `shape` (C order; read-only).
    Raises ValueError where the file ends before them."""
    size = math.prod(shape) * dtype.itemsize
    data = file.read(size)
    if len(data) != size:
        raise ValueError("the array's data ends early")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def json_bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8")
