"""The dataset-level result and the files of interface.md "Many images": dataset.npz, dataset.json, the figure,
the per-image table (images.csv or images.parquet) and, with labels, the per-class table (classes.csv).

Layer numbering, the same in every array, table and figure: blocks are numbered from 0 as in `model.blocks`. A
per-block array (L, ...) has row b for block b; a residual-stream array (L + 1, ...) has row 0 for the embeddings
entering block 0 and row b + 1 for the tokens after block b (`LAYERS`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import analyses, explain
from ..export import faithfulness_summary, json_bytes, json_number, npz_bytes
from ..loading.model import Geometry
from .totals import NO_LABEL, Totals, confusion_array

LAYERS = ("blocks are numbered from 0 as in model.blocks; per-block arrays (L, ...) have row b for block b; "
          "residual-stream arrays (L + 1, ...) have row 0 for the embeddings entering block 0 and row b + 1 "
          "for the tokens after block b")
TABLE_FORMATS = ("csv", "parquet")
_DELETION, _INSERTION = "deletion_auc_", "insertion_auc_"
_SPREAD = "_random_std"  # the random orders' spread on an image, also a per-image scalar


@dataclass(frozen=True)
class DatasetResult:
    """The dataset-level values of analyses.md "Over many images" (shapes: L blocks, H heads, C classes), and
    the totals they come from (`totals`: merge two results' totals for the result of both)."""

    model: str
    weights: str
    device: str  # devices.describe_device of the device that ran it (several, joined, for a merged run)
    num_images: int  # images analysed (the failures not counted)
    mean_attention_distance: np.ndarray  # float32 (L, H), pixels: mean over images, default convention
    mean_attention_distance_std: np.ndarray  # float32 (L, H): population standard deviation over images (ddof 0)
    mean_attention_distance_renorm: np.ndarray  # float32 (L, H): mean over images, renormalised convention
    high_norm_rate: np.ndarray  # float32 (L+1,): mean over images of each image's high-norm patch share
    accuracy: float | None  # top-1 over the labelled images; None without labels
    logit_lens_accuracy: np.ndarray | None  # float32 (L+1,): top-1 of each logit-lens row over the labelled images
    explained: dict[str, float]  # each named per-image scalar (deletion_auc_<method>, ...) -> mean over images
    failures: tuple[tuple[str, str], ...]  # (image name, one sentence why it was skipped)
    num_labelled: int = 0  # images with a known label among the analysed ones
    not_images: tuple[tuple[str, str], ...] = ()  # (file, why): files under the folder that are not images
    class_names: tuple[str, ...] = ()  # the model's class names, for the tables ("class 7" where it has none)
    totals: Totals = field(default_factory=Totals, repr=False, compare=False)

    @property
    def deletion_auc(self) -> dict[str, float]:
        """method (then "random") -> mean deletion AUC over images; {} without explanations."""
        return {key[len(_DELETION):]: value for key, value in self.explained.items()
                if key.startswith(_DELETION) and not key.endswith(_SPREAD)}

    @property
    def insertion_auc(self) -> dict[str, float]:
        return {key[len(_INSERTION):]: value for key, value in self.explained.items()
                if key.startswith(_INSERTION) and not key.endswith(_SPREAD)}

    def which_to_trust(self) -> explain.FolderJudgement | None:
        """The methods over the images: mean score, rank and share of images beating random under each test that ran,
        and how far the tests agree (explain.folder_judgement); None without explanations."""
        return explain.folder_judgement(self.explained) if self.explained else None

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """Every file left out, with its reason: the files that are not images, then the images that failed."""
        return self.not_images + self.failures

    def class_name(self, index: int) -> str:
        return self.class_names[index] if 0 <= index < len(self.class_names) else f"class {index}"

    def class_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(images, correct): int64 (C,) each, per true class over the labelled images."""
        num_classes = max(len(self.class_names), 1 + max((max(t, p) for t, p in self.totals.confusion), default=-1))
        images, correct = np.zeros(num_classes, dtype=np.int64), np.zeros(num_classes, dtype=np.int64)
        for (true, predicted), count in self.totals.confusion.items():
            images[true] += count
            correct[true] += count if true == predicted else 0
        return images, correct

    def arrays(self) -> dict[str, np.ndarray]:
        """dataset.npz as interface.md's table: num_images, the distances, high_norm_rate; with labels accuracy,
        logit_lens_accuracy, class_images, class_correct and confusion; each explained key's mean."""
        arrays = {
            "num_images": np.asarray(self.num_images, dtype=np.int64),
            "mean_attention_distance": np.asarray(self.mean_attention_distance, dtype=np.float32),
            "mean_attention_distance_std": np.asarray(self.mean_attention_distance_std, dtype=np.float32),
            "mean_attention_distance_renorm": np.asarray(self.mean_attention_distance_renorm, dtype=np.float32),
            "high_norm_rate": np.asarray(self.high_norm_rate, dtype=np.float32),
        }
        if self.accuracy is not None:
            images, correct = self.class_counts()
            arrays["accuracy"] = np.asarray(self.accuracy, dtype=np.float64)
            arrays["logit_lens_accuracy"] = np.asarray(self.logit_lens_accuracy, dtype=np.float32)
            arrays["class_images"], arrays["class_correct"] = images, correct
            arrays["confusion"] = confusion_array(self.totals.confusion)
        for key, value in self.explained.items():
            arrays[key] = np.asarray(value, dtype=np.float64)
        for key, moments in self.totals.lensed.items():  # each lens array's mean and spread over images, rounded once
            arrays[key] = moments.mean.astype(np.float32)
            arrays[f"{key}_std"] = moments.std().astype(np.float32)
        return arrays

    def summary(self) -> dict[str, Any]:
        """dataset.json: the model, its weights, the device, the scalars, every skipped file with its reason."""
        moments = self.totals.explained
        return {
            "model": self.model,
            "weights": self.weights,
            "device": self.device,
            "num_images": self.num_images,
            "num_labelled": self.num_labelled,
            "accuracy": self.accuracy,
            "faithfulness": faithfulness_summary(self.deletion_auc, self.insertion_auc),
            "explained": {key: {"mean": value, "std": float(moments[key].std()) if key in moments else None,
                                "images": moments[key].count if key in moments else None}
                          for key, value in self.explained.items()},
            "which_to_trust": _trust_summary(self.which_to_trust()),
            "mean_attention_distance_std": "population standard deviation over images (ddof 0)",
            "layers": LAYERS,
            "num_skipped": len(self.skipped),
            "skipped": [{"file": name, "reason": reason} for name, reason in self.skipped],
            "failures": [f"{name}: {reason}" for name, reason in self.failures],
            **({"lenses": {"means": list(self.totals.lensed), "shape_varies": sorted(self.totals.lens_varying),
                           "failures": [f"{name}: {reason}" for name, reason in self.totals.lens_failures]}}
               if self.totals.lensed or self.totals.lens_varying or self.totals.lens_failures else {}),
        }


def _trust_summary(folder: explain.FolderJudgement | None) -> dict[str, Any] | None:
    """dataset.json's "which_to_trust": per method and test its mean, rank and share of images beating random, and
    Kendall's tau-b between every two tests' rankings ("a vs b"); NaN as null."""
    if folder is None:
        return None
    return {
        "methods": {row["method"]: {t: {"mean": json_number(row[t]), "rank": json_number(row[f"{t}_rank"]),
                                        "beats_random_share": json_number(row[f"{t}_beats_share"])} for t in folder.tests}
                    for row in folder.rows()},
        "random": {t: json_number(folder.means[t].get(explain.RANDOM, float("nan"))) for t in folder.tests},
        "agreement": {f"{a} vs {b}": json_number(tau) for (a, b), tau in folder.agreement.items()},
    }


def result_of(totals: Totals, *, model: str, weights: str, device: str, class_names: tuple[str, ...] = ()) -> DatasetResult:
    """The dataset values of `totals` (at least one image analysed): means and the distance's std over images,
    accuracies over the labelled images. Its arrays are read-only, so a cache can hand it to every session."""
    assert totals.num_images, "no image analysed"
    labelled = totals.labelled
    result = DatasetResult(
        model=model, weights=weights, device=device, num_images=totals.num_images,
        mean_attention_distance=totals.distance.mean.astype(np.float32),
        mean_attention_distance_std=totals.distance.std().astype(np.float32),
        mean_attention_distance_renorm=totals.distance_renorm.mean.astype(np.float32),
        high_norm_rate=totals.high_norm_rate.mean.astype(np.float32),
        accuracy=totals.correct / labelled if labelled else None,
        logit_lens_accuracy=(totals.lens_correct / labelled).astype(np.float32) if labelled else None,
        explained={key: float(moments.mean) for key, moments in totals.explained.items()},
        failures=tuple(totals.failures), num_labelled=labelled, not_images=tuple(totals.not_images),
        class_names=tuple(class_names), totals=totals,
    )
    for value in vars(result).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    return result


def merge_results(results: list[DatasetResult]) -> DatasetResult:
    """One result of the results of consecutive parts of a set, as one run over the whole set gives it (within
    float tolerance): their totals merged in order."""
    totals = Totals()
    for result in results:
        totals.merge(result.totals)
    first = results[0]
    devices = ", ".join(dict.fromkeys(r.device for r in results))
    return result_of(totals, model=first.model, weights=first.weights, device=devices, class_names=first.class_names)


# ----------------------------------------------------------------------------------------------
# Tables


def image_table(result: DatasetResult) -> dict[str, np.ndarray]:
    """The per-image table as columns (one row per analysed image, in the run's order): file, label and
    label_name (the true class; -1 and "" when unknown), predicted and predicted_name, probability (of the
    predicted class), correct (1 / 0; -1 when the label is unknown), then each explained key (NaN where missing)."""
    rows = result.totals.rows
    label = np.asarray(rows.label, dtype=np.int64)
    predicted = np.asarray(rows.predicted, dtype=np.int64)
    columns = {
        "file": np.asarray(rows.file, dtype=object),
        "label": label,
        "label_name": np.asarray(["" if t == NO_LABEL else result.class_name(t) for t in rows.label], dtype=object),
        "predicted": predicted,
        "predicted_name": np.asarray([result.class_name(p) for p in rows.predicted], dtype=object),
        "probability": np.asarray(rows.probability, dtype=np.float32),
        "correct": np.where(label == NO_LABEL, -1, (label == predicted).astype(np.int64)),
    }
    for key in rows.explained_keys():
        columns[key] = rows.explained_column(key)
    return columns


def class_table(result: DatasetResult) -> dict[str, np.ndarray]:
    """Per true class that has labelled images: class, name, images, correct, accuracy (correct / images)."""
    images, correct = result.class_counts()
    present = np.flatnonzero(images)
    return {
        "class": present.astype(np.int64),
        "name": np.asarray([result.class_name(int(c)) for c in present], dtype=object),
        "images": images[present],
        "correct": correct[present],
        "accuracy": correct[present] / images[present],
    }


def csv_bytes(columns: dict[str, np.ndarray]) -> bytes:
    """A table as CSV (UTF-8, a header row; floats in full precision, NaN as an empty cell)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in zip(*columns.values(), strict=True):
        writer.writerow([_cell(value) for value in row])
    return buffer.getvalue().encode("utf-8")


def _cell(value: Any) -> Any:
    """A float as its shortest exact text in its own precision (numpy's str), NaN as ""; anything else as it is."""
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else str(value)
    return value


def parquet_bytes(columns: dict[str, np.ndarray]) -> bytes:
    """A table as Parquet (pyarrow, which comes with Streamlit)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    table = pa.table({name: (values.tolist() if values.dtype == object else values) for name, values in columns.items()})
    pq.write_table(table, buffer)
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------
# Files


def dataset_files(result: DatasetResult, geometry: Geometry, table: str = "csv") -> dict[str, bytes]:
    """The files of interface.md's `dataset` command: name -> bytes. dataset.npz, dataset.json, the paper's
    Fig. 7 (right) for the set (`vit_core.plots.attention_distance_png`, as the dashboard draws it: every head's mean
    attention distance over the images, a dot each, its std over the images as an error bar, against the block),
    the per-image table images.<table> (csv or parquet) and, with labels, classes.csv."""
    from ..plots import attention_distance_png  # here, not at the top: the reductions need no plotting library

    assert table in TABLE_FORMATS, table
    figure = attention_distance_png(result.mean_attention_distance,
                                    analyses.uniform_attention_distance(geometry.grid, geometry.patch_size),
                                    spread=result.mean_attention_distance_std,
                                    title=f"{result.model}: mean over {result.num_images} images, bars: std over images")
    images = image_table(result)
    files = {
        "dataset.npz": npz_bytes(result.arrays()),
        "dataset.json": json_bytes(result.summary()),
        "mean_attention_distance.png": figure,
        f"images.{table}": csv_bytes(images) if table == "csv" else parquet_bytes(images),
    }
    if result.accuracy is not None:
        files["classes.csv"] = csv_bytes(class_table(result))
    return files
