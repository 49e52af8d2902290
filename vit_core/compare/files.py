"""The comparison's files (docs/spec/interface.md, "Two models"): compare.csv, compare.npz, compare.json and
compare.png, from the two models' dataset results and the comparison's merged totals. Pure: results in, bytes out.
Shapes: L blocks, H heads; a residual row i is the embeddings (0) or the tokens after block i - 1."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dataset import LAYERS, DatasetResult, csv_bytes
from ..export import json_bytes, json_number, npz_bytes
from .engine import Comparable
from .sums import FRACTION_BITS, CompareTotals

MOST_CHANGED = 10  # heads in compare.json's heads_most_changed


@dataclass(frozen=True)
class ConceptsOutcome:
    """--concepts-layer's outcome for compare.json: its "concepts" (layer, lists, counts), or why it was skipped."""

    summary: dict[str, Any] | None = None
    skipped: str | None = None


def _rows_by_file(result: DatasetResult) -> dict[str, tuple[int, int, float]]:
    rows = result.totals.rows
    return {f: (t, p, pr) for f, t, p, pr in zip(rows.file, rows.label, rows.predicted, rows.probability, strict=True)}


def compare_table(a: DatasetResult, b: DatasetResult, totals: CompareTotals, which: Comparable) -> dict[str, np.ndarray]:
    """compare.csv's columns, one row per image both models analysed, in the run's order: file, label (A's numbering,
    -1 unknown), predicted_a, predicted_name_a, probability_a, the same of B, changed (1 when the top-1 differs; empty
    where the classes differ), kl (nats), rollout_correlation (empty where the grids differ)."""
    rows_a, rows_b = _rows_by_file(a), _rows_by_file(b)
    label = [rows_a[f][0] for f in totals.file]
    pa, pb = [rows_a[f][1] for f in totals.file], [rows_b[f][1] for f in totals.file]
    return {
        "file": np.asarray(totals.file, dtype=object),
        "label": np.asarray(label, dtype=np.int64),
        "predicted_a": np.asarray(pa, dtype=np.int64),
        "predicted_name_a": np.asarray([a.class_name(p) for p in pa], dtype=object),
        "probability_a": np.asarray([rows_a[f][2] for f in totals.file], dtype=np.float32),
        "predicted_b": np.asarray(pb, dtype=np.int64),
        "predicted_name_b": np.asarray([b.class_name(p) for p in pb], dtype=object),
        "probability_b": np.asarray([rows_b[f][2] for f in totals.file], dtype=np.float32),
        "changed": np.asarray([int(x != y) if which.classes else "" for x, y in zip(pa, pb, strict=True)], dtype=object),
        "kl": np.asarray(totals.kl, dtype=np.float64),
        "rollout_correlation": np.asarray(totals.rollout_correlation, dtype=np.float64),
    }


def compare_arrays(a: DatasetResult, b: DatasetResult, totals: CompareTotals, which: Comparable) -> dict[str, np.ndarray]:
    """compare.npz: num_images, cka float64 (La+1, Lb+1); where the attention compares, attention_js float64 (L, H) and
    mean_attention_distance_diff float32 (L, H) = B - A; with labels, logit_lens_accuracy_a / _b float32 (L+1,)."""
    arrays = {"num_images": np.asarray(len(totals.file), dtype=np.int64), "cka": totals.cka()}
    if which.attention and totals.js.count:
        arrays["attention_js"] = totals.js.mean
    if a.mean_attention_distance.shape == b.mean_attention_distance.shape:
        arrays["mean_attention_distance_diff"] = (b.mean_attention_distance - a.mean_attention_distance).astype(np.float32)
    for side, result in (("a", a), ("b", b)):
        if result.logit_lens_accuracy is not None:
            arrays[f"logit_lens_accuracy_{side}"] = np.asarray(result.logit_lens_accuracy, dtype=np.float32)
    return arrays


def heads_most_changed(js: np.ndarray, count: int = MOST_CHANGED) -> list[dict[str, Any]]:
    """The `count` heads with the largest attention JS, largest first (ties: the earlier block, then head)."""
    order = sorted(np.ndindex(js.shape), key=lambda bh: (-js[bh], bh))[:count]
    return [{"block": int(b), "head": int(h), "js": float(js[b, h])} for b, h in order]


def compare_summary(a: DatasetResult, b: DatasetResult, totals: CompareTotals, which: Comparable,
                    arrays: dict[str, np.ndarray], concepts: ConceptsOutcome | None = None) -> dict[str, Any]:
    """compare.json: the models, the images, agreement and changed, accuracies, kl_mean, heads_most_changed, the CKA
    diagonal, what CKA was over, and `skipped`: each comparison these two models can't have, with its reason; with
    `concepts` (--concepts-layer) its "concepts" lists, or its reason among `skipped`."""
    concepts = concepts or ConceptsOutcome()
    table = compare_table(a, b, totals, which)
    changed = [f for f, c in zip(table["file"], table["changed"], strict=True) if c == 1]
    n = len(totals.file)
    cka = arrays["cka"]
    return {
        "model_a": {"model": a.model, "weights": a.weights}, "model_b": {"model": b.model, "weights": b.weights},
        "device": a.device,
        "num_images": n,
        "agreement": (n - len(changed)) / n if which.classes and n else None,
        "changed": len(changed) if which.classes else None,
        "changed_files": changed,
        "accuracy_a": a.accuracy, "accuracy_b": b.accuracy,
        "kl_mean": totals.kl_mean(),
        "heads_most_changed": heads_most_changed(arrays["attention_js"]) if "attention_js" in arrays else None,
        "cka_diagonal": [json_number(float(cka[i, i])) for i in range(min(cka.shape))],
        "cka_over": "patch tokens" if which.grid else "each image's mean patch token",
        "cka_sums": f"each image's float64 sums rounded to multiples of 2**-{FRACTION_BITS}, added exactly",
        "layers": LAYERS,
        "skipped": [{"comparison": name, "reason": reason} for name, reason in which.skipped]
                   + ([{"comparison": "concepts", "reason": concepts.skipped}] if concepts.skipped else []),
        **({"concepts": concepts.summary} if concepts.summary else {}),
        **({"explain": explain_summary(a, b, totals)} if a.explained or b.explained else {}),
    }


def explain_summary(a: DatasetResult, b: DatasetResult, totals: CompareTotals) -> dict[str, Any]:
    """With --explain: each judge scalar's mean over images for A and B (`<test>_<method>`, `beats_random_...`), and
    per verdict (`beats_random_<test>_<method>`) the images, of those both models judged, where it differs."""
    keys = list(dict.fromkeys([*a.explained, *b.explained]))
    rows_a = {f: row for f, row in zip(a.totals.rows.file, a.totals.rows.explained, strict=True)}
    rows_b = {f: row for f, row in zip(b.totals.rows.file, b.totals.rows.explained, strict=True)}
    changed = {}
    for key in (k for k in keys if k.startswith("beats_random_")):
        judged = [f for f in totals.file if key in rows_a.get(f, {}) and key in rows_b.get(f, {})]
        changed[key] = {"images": len(judged), "changed": sum(rows_a[f][key] != rows_b[f][key] for f in judged)}
    return {"means": {key: {"a": json_number(a.explained.get(key, float("nan"))),
                            "b": json_number(b.explained.get(key, float("nan")))} for key in keys},
            "verdict_changed": changed}


def compare_png(arrays: dict[str, np.ndarray], title: str = "") -> bytes:
    """The CKA heatmap (A's residual rows down, B's across), the per-head distance difference B - A and the attention
    JS (blocks down, heads across) side by side; a panel whose array is missing says why in its place."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(13, 4.2))
    panels = (("cka", "linear CKA (rows: A's residual, columns: B's)", "viridis", (0, 1)),
              ("mean_attention_distance_diff", "mean attention distance, B - A (px)", "RdBu_r", None),
              ("attention_js", "attention JS divergence (nats)", "magma", (0, None)))
    for k, (key, name, cmap, limits) in enumerate(panels):
        ax = fig.add_subplot(1, 3, k + 1)
        ax.set_title(name, fontsize=9)
        if key not in arrays:
            ax.text(0.5, 0.5, "not comparable\n(see compare.json)", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        values = np.asarray(arrays[key], dtype=np.float64)
        low, high = limits or (None, None)
        if key == "mean_attention_distance_diff":
            bound = float(np.nanmax(np.abs(values))) or 1.0
            low, high = -bound, bound
        image = ax.imshow(values, cmap=cmap, vmin=low, vmax=high, aspect="auto", interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046)
        for axis in (ax.xaxis, ax.yaxis):  # rows, blocks and heads are whole numbers
            axis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("B's residual row" if key == "cka" else "head")
        ax.set_ylabel("A's residual row" if key == "cka" else "block")
    fig.suptitle(title.replace("$", r"\$"), fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, facecolor="white")
    return buffer.getvalue()


def compare_files(a: DatasetResult, b: DatasetResult, totals: CompareTotals, which: Comparable,
                  concepts: ConceptsOutcome | None = None) -> dict[str, bytes]:
    """name -> bytes of the comparison's four files."""
    arrays = compare_arrays(a, b, totals, which)
    summary = compare_summary(a, b, totals, which, arrays, concepts)
    title = f"A: {a.model} ({a.weights})  vs  B: {b.model} ({b.weights}), {len(totals.file)} images"
    return {"compare.csv": csv_bytes(compare_table(a, b, totals, which)), "compare.npz": npz_bytes(arrays),
            "compare.json": json_bytes(summary), "compare.png": compare_png(arrays, title)}
