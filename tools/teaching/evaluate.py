"""Measure the teaching model: does every view of the dashboard show learned structure?

All figures are computed on freshly drawn held-out images (integer seeds; training chunks use tuple
seeds, see train.py) and written to ``metrics.json`` and ``MODEL_CARD.md`` beside the weights:

* accuracy on ``EVAL_SIZE`` held-out generator images, per class, size band, style and background (and on
  the smaller fixed ``TEST_SIZE`` set the tests use);
* accuracy on ``SECOND_SIZE`` images of the independent second drawer (``tools/teaching/second_drawer.py``, never
  trained on), per size band, style and class; what the model says about a real photograph;
* accuracy on ``PAGE_PHOTOS_SIZE`` phone photos of pen drawings on paper (``tools/teaching/page_photos.py``, never
  trained on), decoded like an upload;
* attention finds the object: share of the attention-rollout map (mean head fusion, all layers,
  class-token row, patch keys) that falls on patches overlapping the object's silhouette; the same for the
  last layer's class-token attention (head mean, patch keys). A uniform map's share (the fraction of
  object patches) is reported beside them as the chance level;
* position embeddings learned the grid: Spearman correlation, over all pairs of distinct patches,
  between the cosine similarity of their position embeddings and minus their grid distance;
* mean attention distance per layer and head (pixels, prefix attention left out, not renormalised),
  its spread across heads, and whether it shows the paper's picture (``mad_picture``).

The definitions of rollout, mean attention distance and position-embedding similarity are the ones
in ``vit_core.analyses`` (one definition in the codebase); only the glue lives here.

Run: ``python -m tools.teaching.evaluate vit_core/assets/shapes_vit`` (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import timm
import timm.data
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer

from vit_core import analyses
from vit_core.hooks import attention_recorded
from vit_core.images import load_image
from vit_core.teaching.data import (
    ASPECT_RANGE,
    CLASS_NAMES,
    EXTENT_RANGE,
    LABELS,
    MIN_COLOUR_DISTANCE,
    MIN_STROKE_PX,
    OTHER,
    draw_set,
    make_dataset,
)
from vit_core.teaching.model import SHAPES_VIT_TIMM_NAME, load_shapes_vit

from . import page_photos, second_drawer
from .train import init_sincos_pos_embed, model_transform, patch_cover, tokens_read

log = logging.getLogger(__name__)

EVAL_SEED = 1_000_003  # held-out set for the reported metrics
EVAL_SIZE = 2_250  # 250 per class
TEST_SEED = 2_000_003  # the smaller fixed set that tests/unit/test_teaching_model.py re-checks
TEST_SIZE = 450
SECOND_SEED = 3_000_017  # the second drawer's set
SECOND_SIZE = 1_024  # 32 per class, size band and style
PAGE_PHOTOS_SEED = 4_000_037  # phone photos of drawings on paper (page_photos.py)
PAGE_PHOTOS_SIZE = 240  # 30 per class
MAD_IMAGES = 256  # images averaged for mean attention distance (the paper used 128)


# ----------------------------------------------------------------------------- model + capture


@torch.inference_mode()
def predict_with_attention(
    model: VisionTransformer, images: np.ndarray, batch_size: int = 250
) -> tuple[np.ndarray, np.ndarray]:
    """Logits (B, C) and attention patterns (B, L, H, T, T) float32 for uint8 images (B, H, W, 3)."""
    all_logits, all_patterns = [], []
    to_input = model_transform(model)
    for start in range(0, len(images), batch_size):
        x = to_input(torch.from_numpy(images[start : start + batch_size]))
        store: list[torch.Tensor] = []
        with attention_recorded(model, store.append):  # the capture's own mechanism, batched
            logits = model(x)
        assert len(store) == len(model.blocks), f"captured {len(store)} patterns for {len(model.blocks)} blocks"
        all_logits.append(logits.float().numpy())
        all_patterns.append(torch.stack(store, dim=1).float().numpy())  # L x (B, H, T, T) -> (B, L, H, T, T)
    return np.concatenate(all_logits), np.concatenate(all_patterns)


@torch.inference_mode()
def predict(model: VisionTransformer, images: np.ndarray, batch_size: int = 250) -> np.ndarray:
    """Predicted class indices (B,) with the model's normal (fused) forward pass."""
    to_input = model_transform(model)
    preds = [
        model(to_input(torch.from_numpy(images[s : s + batch_size]))).argmax(-1).numpy()
        for s in range(0, len(images), batch_size)
    ]
    return np.concatenate(preds)


# ----------------------------------------------------------------------------- metric glue


def object_patches(mask: np.ndarray, patch_size: tuple[int, int]) -> np.ndarray:
    """Patches that overlap the object: (H, W) bool -> (gh, gw) bool."""
    return patch_cover(mask[None], patch_size)[0] > 0


def mass_on(attention_map: np.ndarray, region: np.ndarray) -> float:
    """Share of a non-negative (gh, gw) map that falls inside a (gh, gw) bool region."""
    total = attention_map.sum()
    return float(attention_map[region].sum() / total) if total > 0 else 0.0


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties get the average of the ranks they span (scipy's 'average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # start index of each run of equal values, and the run each sorted element belongs to
    new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
    run_id = np.cumsum(new_run) - 1
    starts = np.flatnonzero(new_run)
    ends = np.concatenate([starts[1:], [len(x)]])
    avg_rank = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = avg_rank[run_id]
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation: Pearson correlation of average ranks."""
    ra, rb = rankdata(a), rankdata(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def pos_embed_spearman_at_init(config: dict) -> float | None:
    """The same Spearman for the embedding training started from (None for timm's random init).

    With the sin-cos start, the grid structure is given, not learned: the card shows both numbers
    so that a reader sees what training kept or changed.
    """
    if config["train"].get("pos_embed_init", "random") != "sincos":
        return None
    model = timm.create_model(SHAPES_VIT_TIMM_NAME, pretrained=False, **config["model_args"])
    init_sincos_pos_embed(model)
    return pos_embed_grid_spearman(model)


def pos_embed_grid_spearman(model: VisionTransformer) -> float:
    """Spearman(cosine similarity of position embeddings, -grid distance) over distinct patch pairs."""
    grid = tuple(model.patch_embed.grid_size)
    pos = model.pos_embed.detach().float().numpy()[0]  # (1, T_pe, D) -> (T_pe, D)
    sim = analyses.pos_embed_similarity(pos, model.num_prefix_tokens, model.no_embed_class, grid)
    n = grid[0] * grid[1]
    sim = sim.reshape(n, n)  # (N, gh, gw) -> (N, N)
    dist = analyses.patch_distances(grid, (1, 1))  # grid steps
    iu = np.triu_indices(n, k=1)  # each unordered pair once
    return spearman(sim[iu], -dist[iu])


# ----------------------------------------------------------------------------- evaluation


def accuracy_by(groups: list[str], correct: np.ndarray) -> dict[str, float]:
    """Accuracy per group name, in first-seen order: groups (N,) names, correct (N,) bool."""
    out: dict[str, list[bool]] = {}
    for g, ok in zip(groups, correct, strict=True):
        out.setdefault(g, []).append(bool(ok))
    return {g: float(np.mean(v)) for g, v in out.items()}


def _sorted_bands(by_band: dict[str, float]) -> dict[str, float]:
    return dict(sorted(by_band.items(), key=lambda kv: float(kv[0].split("-")[0])))


def attention_figures(patterns: np.ndarray, regions: np.ndarray, patch: tuple[int, int], prefix: int,
                      grid: tuple[int, int]) -> dict[str, float]:
    """Rollout and last-layer CLS mass on the object's patches, and the chance level, averaged over images.

    patterns (B, L, H, T, T); regions (B, H_img, W_img) bool: the objects' silhouettes.
    """
    rollout_mass, last_mass, chance = [], [], []
    last = patterns.shape[1] - 1
    for pattern, region_px in zip(patterns, regions, strict=True):
        region = object_patches(region_px, patch)
        rollout_mass.append(mass_on(analyses.attention_rollout(pattern, prefix, grid, fusion="mean"), region))
        last_mass.append(mass_on(analyses.attention_map(pattern, last, None, 0, prefix, grid).map, region))
        chance.append(region.mean())
    return {"rollout_object_mass": float(np.mean(rollout_mass)),
            "last_layer_cls_object_mass": float(np.mean(last_mass)),
            "object_patch_fraction": float(np.mean(chance))}


def mad_picture(mad: np.ndarray, uniform: float) -> dict[str, object]:
    """The paper's picture of mean attention distance, (L, H) pixels: in some layer of the first half, a
    local head (below LOCAL_SHARE of the uniform distance) beside a global one (at least GLOBAL_SHARE), and
    every head of the last layer global."""
    first_half = range((mad.shape[0] + 1) // 2)
    mixed = [layer for layer in first_half
             if mad[layer].min() < LOCAL_SHARE * uniform and mad[layer].max() >= GLOBAL_SHARE * uniform]
    last_global = bool(mad[-1].min() >= GLOBAL_SHARE * uniform)
    return {"mad_mixed_layers_first_half": mixed, "mad_last_layer_all_global": last_global,
            "mad_picture": float(bool(mixed) and last_global)}


def evaluate_generator(model: VisionTransformer, eval_size: int = EVAL_SIZE, mad_images: int = MAD_IMAGES,
                       batch_size: int = 250) -> dict:
    """Accuracy (overall, per class, per size band, style and background) and the attention figures on
    ``eval_size`` held-out generator images (attention captured batch by batch: all of it at once would
    take gigabytes)."""
    grid, patch = tuple(model.patch_embed.grid_size), tuple(model.patch_embed.patch_size)
    prefix, size = model.num_prefix_tokens, model.patch_embed.img_size[0]
    drawn = draw_set(eval_size, seed=EVAL_SEED, size=size)
    labels, other = drawn.labels, LABELS.index(OTHER)
    preds, figures, mads = [], [], []
    for start in range(0, eval_size, batch_size):
        chunk = slice(start, start + batch_size)
        logits, patterns = predict_with_attention(model, drawn.images[chunk])  # (B, C), (B, L, H, T, T)
        preds.append(logits.argmax(-1))
        shape = labels[chunk] != other
        figures.append((attention_figures(patterns[shape], drawn.regions[chunk][shape], patch, prefix, grid),
                        int(shape.sum())))
        mads += [analyses.mean_attention_distance(p, prefix, grid, patch)
                 for p in patterns[shape][: max(0, mad_images - len(mads))]]
    preds = np.concatenate(preds)
    assert (predict(model, drawn.images) == preds).mean() > 0.99, "fused and un-fused attention paths disagree"
    correct = preds == labels
    confusion = np.zeros((len(LABELS),) * 2, dtype=int)
    np.add.at(confusion, (labels, preds), 1)
    shape = labels != other
    shape_styles = [s for s, is_shape in zip(drawn.styles, shape, strict=True) if is_shape]
    weights = np.array([n for _, n in figures], dtype=float)
    mad = analyses.average_over_images(mads)  # (L, H) pixels
    uniform = analyses.uniform_attention_distance(grid, patch)
    return {
        "eval_seed": EVAL_SEED,
        "eval_size": eval_size,
        "accuracy": float(correct.mean()),
        "accuracy_per_class": {name: float(correct[labels == c].mean()) for c, name in enumerate(LABELS)},
        "confusion_matrix": confusion.tolist(),  # rows: true class, columns: predicted
        "accuracy_per_size_band": _sorted_bands(accuracy_by([s.size_band for s in shape_styles], correct[shape])),
        "accuracy_per_style": accuracy_by([s.name for s in shape_styles], correct[shape]),
        "accuracy_per_background": accuracy_by([s.background for s in shape_styles], correct[shape]),
        "accuracy_photographed": float(correct[shape][[s.photo for s in shape_styles]].mean()),
        "shapes_called_other": float((preds[shape] == other).mean()),
        **{key: float(np.average([f[key] for f, _ in figures], weights=weights)) for key in figures[0][0]},
        "mad_images": len(mads),
        "mean_attention_distance_px": mad.round(3).tolist(),  # (L, H)
        "mad_head_spread_px": (mad.max(axis=1) - mad.min(axis=1)).round(3).tolist(),  # (L,)
        "mad_head_std_px": mad.std(axis=1).round(3).tolist(),  # (L,)
        "uniform_attention_distance_px": uniform,
        **mad_picture(mad, uniform),
        "_failures": [(drawn.images[i], LABELS[labels[i]], LABELS[preds[i]]) for i in np.flatnonzero(~correct)],
    }


def evaluate_second_drawer(model: VisionTransformer, drawer: ModuleType, n: int = SECOND_SIZE) -> dict:
    """Accuracy on the independent drawer's images (never trained on), overall, per size band, style and class."""
    size = model.patch_embed.img_size[0]
    images, labels, meta = drawer.make_set(n, seed=SECOND_SEED, size=size)
    assert tuple(drawer.CLASSES) == CLASS_NAMES, (drawer.CLASSES, CLASS_NAMES)
    preds = predict(model, images)
    correct = preds == labels
    by_band = accuracy_by([m["size_band"] for m in meta], correct)
    by_style = accuracy_by([m["style"] for m in meta], correct)
    return {
        "second_drawer_seed": SECOND_SEED,
        "second_drawer_size": n,
        "second_drawer_accuracy": float(correct.mean()),
        "second_drawer_per_size_band": _sorted_bands(by_band),
        "second_drawer_per_style": by_style,
        "second_drawer_per_class": {name: float(correct[labels == c].mean()) for c, name in enumerate(CLASS_NAMES)},
        "second_drawer_worst_group": min([*by_band.values(), *by_style.values()]),
        "second_drawer_called_other": float((preds == LABELS.index(OTHER)).mean()),
        "_failures": [(images[i], LABELS[labels[i]], LABELS[preds[i]]) for i in np.flatnonzero(~correct)],
    }


def eval_transform(model: VisionTransformer) -> Callable[[Image.Image], torch.Tensor]:
    """timm's eval transform of the model's resolved data config (resize, centre crop, normalise): PIL -> (3, H, W)."""
    return timm.data.create_transform(**timm.data.resolve_model_data_config(model), is_training=False)


@torch.inference_mode()
def evaluate_page_photos(model: VisionTransformer, photos: ModuleType, n: int = PAGE_PHOTOS_SIZE) -> dict:
    """Accuracy on phone photos of pen drawings on paper (page_photos.py, never trained on), each decoded
    like an upload (``vit_core.images.load_image``) and preprocessed by timm's eval transform (resize, centre crop)."""
    transform = eval_transform(model)
    jpegs, labels, metas = photos.make_set(n, seed=PAGE_PHOTOS_SEED)
    assert tuple(photos.CLASSES) == CLASS_NAMES, (photos.CLASSES, CLASS_NAMES)
    preds = np.array([int(model(transform(load_image(jpeg))[None]).argmax()) for jpeg in jpegs])
    correct = preds == labels
    on_table = np.array([m["on_table"] for m in metas])
    return {
        "page_photos_seed": PAGE_PHOTOS_SEED,
        "page_photos_size": n,
        "page_photos_accuracy": float(correct.mean()),
        "page_photos_on_table_accuracy": float(correct[on_table].mean()),
        "page_photos_filling_frame_accuracy": float(correct[~on_table].mean()),
        "page_photos_per_class": {name: float(correct[labels == c].mean()) for c, name in enumerate(CLASS_NAMES)},
    }


@torch.inference_mode()
def outside_world(model: VisionTransformer) -> dict:
    """What the model says about a real photograph (matplotlib's bundled portrait of Grace Hopper)."""
    import matplotlib.cbook

    transform = eval_transform(model)
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        photo = Image.open(f).convert("RGB")
    probs = model(transform(photo)[None]).softmax(-1)[0]
    top = int(probs.argmax())
    return {"photo_top_label": LABELS[top], "photo_top_probability": float(probs[top]),
            "photo_other_probability": float(probs[LABELS.index(OTHER)])}


def evaluate(model: VisionTransformer, eval_size: int = EVAL_SIZE, mad_images: int = MAD_IMAGES,
             second_drawer: ModuleType | None = None, page_photos: ModuleType | None = None) -> dict:
    """All metrics of the model card, as a JSON-ready dict (failure examples under "_failures", not saved)."""
    t0 = time.perf_counter()
    metrics = evaluate_generator(model, eval_size, mad_images)
    size = model.patch_embed.img_size[0]
    test_images, _, test_labels = make_dataset(TEST_SIZE, seed=TEST_SEED, size=size)
    metrics.update(test_seed=TEST_SEED, test_size=TEST_SIZE,
                   test_accuracy=float((predict(model, test_images) == test_labels).mean()))
    failures = {"generator": metrics.pop("_failures")}
    if second_drawer is not None:
        second = evaluate_second_drawer(model, second_drawer)
        failures["second drawer"] = second.pop("_failures")
        metrics.update(second)
    if page_photos is not None:
        metrics.update(evaluate_page_photos(model, page_photos))
    metrics.update(outside_world(model))
    metrics["pos_embed_spearman"] = pos_embed_grid_spearman(model)
    metrics["eval_seconds"] = round(time.perf_counter() - t0, 1)
    log.info("accuracy %.4f  second drawer %s  rollout mass %.3f  last-layer CLS mass %.3f  (chance %.3f)  spearman %.3f",
             metrics["accuracy"], metrics.get("second_drawer_accuracy"), metrics["rollout_object_mass"],
             metrics["last_layer_cls_object_mass"], metrics["object_patch_fraction"], metrics["pos_embed_spearman"])
    metrics["_failures"] = failures
    return metrics


def failure_sheet(failures: dict[str, list[tuple[np.ndarray, str, str]]], per_set: int = 8) -> Image.Image | None:
    """Up to ``per_set`` misclassified images of each set side by side, one row per set (None if none)."""
    rows = [np.concatenate([im for im, _, _ in cases[:per_set]], axis=1) for cases in failures.values() if cases]
    if not rows:
        return None
    width = max(r.shape[1] for r in rows)
    rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    return Image.fromarray(np.concatenate(rows, axis=0))


def failure_list(failures: dict[str, list[tuple[np.ndarray, str, str]]], per_set: int = 8) -> str:
    """The card's text for the failure sheet: true -> predicted, in the sheet's order."""
    lines = []
    for name, cases in failures.items():
        if cases:
            shown = ", ".join(f"{true} -> {pred}" for _, true, pred in cases[:per_set])
            lines.append(f"- {name} ({len(cases)} errors; first {min(per_set, len(cases))} shown): {shown}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    """A figure of the model card that has a target: its table label and the minimum it must reach."""

    label: str
    minimum: float
    fmt: str  # how the value and the minimum are printed; "yes/no" for a condition (1.0 = holds)


# The model card's targets, in one place: the metrics table and the "not reached" statement read them here.
TARGETS: dict[str, Target] = {
    "accuracy": Target("accuracy on the generator's held-out images", 0.98, "{:.2%}"),
    "second_drawer_accuracy": Target("accuracy on the second drawer's images", 0.92, "{:.2%}"),
    "second_drawer_worst_group": Target("second drawer, worst size band or style", 0.85, "{:.2%}"),
    "rollout_object_mass": Target(
        "attention rollout mass on object patches (mean fusion, all layers, CLS row)", 0.6, "{:.1%}"),
    "last_layer_cls_object_mass": Target(
        "last layer CLS attention mass on object patches (head mean)", 0.6, "{:.1%}"),
    "pos_embed_spearman_random_start": Target(
        "Spearman(position-embedding cosine similarity, -grid distance), learned from a random start", 0.5, "{:.3f}"),
    "mad_picture": Target("mean attention distance: a local and a global head in a first-half layer, "
                          "every last-layer head global", 1.0, "yes/no"),
}
LOCAL_SHARE = 0.5  # a head is local below this share of the uniform attention distance
GLOBAL_SHARE = 0.75  # and global at or above this share


def _met(value: float | None, target: float) -> str:
    return "yes" if value is not None and value >= target else "**no**"


def _pct_text(fmt: str, value: float) -> str:
    """The target column's text: percentages without decimals ("97 %"), other figures as they are."""
    return f"{value:.0%}".replace("%", " %") if "%" in fmt else f"{value:g}"


def _target_row(key: str, metrics: dict) -> str:
    t = TARGETS[key]
    value = metrics.get(key)
    if t.fmt == "yes/no":
        shown, target = ("yes" if value else "no"), "yes"
    else:
        shown = "n/a" if value is None else t.fmt.format(value)
        target = f">= {_pct_text(t.fmt, t.minimum)}"
    return f"| {t.label} | {shown} | {target} | {_met(value, t.minimum)} |\n"


def _missed(metrics: dict) -> str:
    """A plain statement of the targets this model does not reach (empty when all are met)."""
    missed = [TARGETS[key].label for key in TARGETS if metrics.get(key) is None or metrics[key] < TARGETS[key].minimum]
    if not missed:
        return ""
    return (f"**Targets not reached by this model: {'; '.join(missed)}.** See the metrics above; the recipes tried "
            "and what each traded are listed in `TrainConfig` (`tools/teaching/train.py`).\n\n")


def _mad_table(metrics: dict) -> str:
    mad = np.array(metrics["mean_attention_distance_px"])
    heads = mad.shape[1]
    head_cols = " | ".join(f"head {h}" for h in range(heads))
    lines = [
        f"| layer | {head_cols} | spread (max-min) | std |",
        "|---" * (heads + 3) + "|",
    ]
    for layer, row in enumerate(mad):
        cells = " | ".join(f"{v:.1f}" for v in row)
        spread, std = metrics["mad_head_spread_px"][layer], metrics["mad_head_std_px"][layer]
        lines.append(f"| {layer} | {cells} | {spread:.1f} | {std:.1f} |")
    return "\n".join(lines)


def _accuracy_table(title: str, columns: dict[str, float]) -> str:
    """A one-row markdown table: group names as columns, accuracies as cells."""
    head = " | ".join(columns)
    cells = " | ".join(f"{v:.1%}" for v in columns.values())
    return f"| {title} | {head} |\n|---" + "|---" * len(columns) + f"|\n| accuracy | {cells} |\n"


def _length(t: dict) -> str:
    """How long training ran: a fixed number of steps, or what a wall-clock budget allowed."""
    if t.get("time_budget_s", 0) > 0:
        return f"{t['steps_done']:,} steps (as many as a {t['time_budget_s']:.0f} s training budget allowed)"
    return f"{t['steps_done']:,} steps"


def _token_labelling(t: dict, num_patches: int) -> str:
    """The recipe line for token labelling (empty when the run did not use it)."""
    if not t.get("token_label_weight"):
        return ""
    return (f"- token labelling (Jiang et al. 2021, \"All Tokens Matter\"), weight {t['token_label_weight']}: "
            "besides the class token's label, every patch token is trained through a linear head that exists only "
            "in training to predict which shape covers its patch (soft target: the share of the patch inside the "
            "shape's silhouette on the image's class, the rest on \"background\"), "
            f"{num_patches} targets per image instead of one, read from {_dense_tokens(t.get('token_label_block', -1))}; "
            "the shipped model is the plain ViT without that head. "
            f"Loss of that term {t['first_token_loss']} (first 20 steps) -> {t['final_token_loss']} (last 100);\n")


def _dense_tokens(block: int) -> str:
    """Which tokens a dense training term reads (train.tokens_read), and what reading an earlier block is for."""
    if block < 0:
        return tokens_read(block)
    return f"{tokens_read(block)}, which leaves the later blocks to the class token: nothing asks their heads to stay local"


def _pos_embed_init(t: dict) -> str:
    """The recipe line's words for the position embedding's starting point."""
    if t.get("pos_embed_init") == "sincos":
        return ("initialised from 2D sin-cos values (the class-token row from 0), then trained like every other "
                "weight. From the paper's random start (std 0.02) the same data and recipe (6 layers x 192, "
                "2.9-3.3 M images on the H100) left the embedding with little grid structure (Spearman 0.17-0.21; "
                "its first principal component is the distance to the image border) and no local head in any "
                "layer, so the shipped model starts from sin-cos and the Spearman target \"from a random start\" "
                "is not met")
    rate = t.get("pos_embed_lr_scale", 1.0)
    return ("randomly initialised (trunc normal, std 0.02), as in the paper, and trained like every other weight"
            + (f" at {rate:g}x the learning rate (so that where a patch is can weigh against what it shows; at 1x the "
               "first layer attended almost uniformly)" if rate != 1.0 else "")
            + ": the grid it shows is learned (see DRLoc below)")


def _relative_localisation(t: dict) -> str:
    """The recipe line for DRLoc (empty when the run did not use it)."""
    if not t.get("drloc_weight"):
        return ""
    return (f"- dense relative localisation (DRLoc; Liu et al., NeurIPS 2021, \"Efficient Training of Visual Transformers "
            f"with Small Datasets\"), weight {t['drloc_weight']}: for {t['drloc_pairs']} random pairs of patch tokens "
            f"per image ({_dense_tokens(t.get('drloc_block', -1))}), an MLP that exists only in training predicts their "
            "grid offset (dx, dy) / grid side (L1 loss). "
            "Only the position embedding tells a token where it is, so the embedding has to carry the grid. Without "
            "it, the random start ended with little grid structure (Spearman 0.16-0.21 in three H100 runs: the data "
            "and augmentations are mirror-symmetric, and the embedding learned only the distance to the border). "
            f"Loss of that term {t['first_drloc_loss']} (first 20 steps) -> {t['final_drloc_loss']} (last 100);\n")


def _recipe_flags(t: dict) -> str:
    """The training command's flags that spell out the recipe's defaults."""
    shown = ("seed", "num_train", "steps", "batch_size", "lr", "warmup_steps", "img_size", "embed_dim", "depth",
             "num_heads", "mlp_ratio", "pos_embed_init", "pos_embed_lr_scale", "token_label_weight", "token_label_block",
             "drloc_weight", "drloc_block")
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in t.items() if k in shown)


def _card_intro(config: dict) -> str:
    return f"""# Shapes ViT (`{config['name']}`, timm: `{SHAPES_VIT_TIMM_NAME}`)

The bundled, offline teaching model of ViT Lens: a small plain timm `VisionTransformer` trained in
this repository on procedurally drawn shapes, drawn the ways people draw them. It exists so that
every view of the dashboard shows real learned structure with no network: attention that finds the
object, a position embedding with a 2D grid, heads with different attention distances. It knows 8
shapes and a 9th class, `other`, for anything that is none of them.
"""


def _card_model(config: dict) -> str:
    a, t, pre = config["model_args"], config["train"], config["pretrained_cfg"]
    side, grid = a["img_size"], a["img_size"] // a["patch_size"]
    return f"""## Model

| | |
|---|---|
| architecture | `timm.models.vision_transformer.VisionTransformer`, registered with timm as `{SHAPES_VIT_TIMM_NAME}` |
| input | {side} x {side} RGB, patch {a['patch_size']} -> {grid} x {grid} grid, class token, learned absolute position embedding |
| size | dim {a['embed_dim']}, depth {a['depth']}, {a['num_heads']} heads, mlp ratio {a['mlp_ratio']}, \
{t['num_params']:,} parameters |
| classes | {', '.join(LABELS)} (`labels.txt`, index order) |
| preprocessing | timm eval transform of `pretrained_cfg`: resize to {side} px (bilinear, crop_pct {pre['crop_pct']}), \
ToTensor, Normalize(mean {pre['mean']}, std {pre['std']}) |
| files | `model.safetensors` (float32 state_dict), `config.json` (`model_args`, `pretrained_cfg`, `train`), \
`labels.txt`, `metrics.json`, `failures.png` |

Load: `import vit_core.teaching.model` (registers it), then
`timm.create_model("{SHAPES_VIT_TIMM_NAME}", pretrained=True)` (the bundled weights, offline), or
`vit_core.teaching.model.load_shapes_vit(model_dir)` for any trained directory.
"""


def _card_data(config: dict) -> str:
    side = config["model_args"]["img_size"]
    return f"""## Data (`vit_core/teaching/data.py`)

Each {side} x {side} image holds exactly one of {len(CLASS_NAMES)} shapes ({', '.join(CLASS_NAMES)}), or none (`other`,
1 image in {len(LABELS)}). A shape is drawn filled or as an outline with a thin to thick pen ({MIN_STROKE_PX} px up), with a
steady or a wobbly hand (smooth tremor, outlines that overshoot or miss their start; a star also as a
pentagram, a cross as two strokes, an arrow as a line with a V head), at \
{EXTENT_RANGE[0]:.0%}-{EXTENT_RANGE[1]:.0%} of the image side
(its drawn extent), anywhere, at any rotation, slightly stretched ({ASPECT_RANGE[0]}-{ASPECT_RANGE[1]}), in a pen colour at least
{MIN_COLOUR_DISTANCE:.0f} RGB units from the background's, on a plain, gradient, striped, noisy or paper background, with or
without clutter (thin lines, dots, specks), sometimes photographed (uneven light and tint, grain, blur,
JPEG; half of those show the sheet at an angle on a darker table, its edges and corners in view).
What counts as each shape: a circle is a disc or a THIN outline (stroke at most 8 % of the radius); a ring
is a clearly thick band (18-45 % of the radius: an annulus, one thick stroke or two concentric outlines);
a square has 4 equal sides; every triangle angle is above 35 degrees.
`other`: clutter only, textures, photo-like scenes, selfie-like faces, scribbles, an empty page.
Drawn with PIL on a 4x supersampled canvas and box-downsampled (antialiasing). The generator also
returns the ink mask and the silhouette (the ink and the area it encloses). Everything comes from one
`numpy.random.Generator`: the same seed gives the same bytes.
"""


def _card_recipe(config: dict) -> str:
    a, t = config["model_args"], config["train"]
    cpu = t.get("cpu_extrapolation", {})
    cpu_line = (f"- on a CPU, EXTRAPOLATED (not run): about {cpu['hours']} hours for `{cpu['command']}`: "
                f"{cpu['how']}.\n" if cpu else "")
    return f"""## Training recipe (`tools/teaching/train.py`)

- {t['num_train']:,} training images drawn once into RAM (chunks of {t['chunk_size']:,}, chunk k seeded
  `({hex(0x5EED)}, seed, k)`, so the pool does not depend on the number of processes), seed {t['seed']};
- learned absolute position embedding {_pos_embed_init(t)};
{_token_labelling(t, (a['img_size'] // a['patch_size']) ** 2)}\
{_relative_localisation(t)}\
- augmentation: {t['augmentation']} (no class depends on orientation, mirroring or colour);
- {_length(t)}, batch {t['batch_size']} ({t['images_seen']:,} images, {t['epochs']} epochs), AdamW (lr {t['lr']},
  weight decay {t['weight_decay']} except biases, norms, position embedding and class token),
  {t['warmup_steps']} warmup steps then cosine decay to {t['min_lr']} ({t['schedule']}), label smoothing
  {t['label_smoothing']}, gradient clipping at {t['grad_clip']}, device {t['device']}, precision {t['precision']};
- on one NVIDIA H100 (torch {t['torch_version']}): data generation {t['data_gen_seconds']} s ({t.get('data_note', '')}),
  training {t['train_seconds']} s at {t['train_images_per_second']} images/s ({t.get('train_note', '')}).
  Loss {t['first_loss']} (first 20 steps) -> {t['final_loss']} (last 100 steps, with label smoothing),
  training accuracy {t['final_train_accuracy']:.1%} at the end (augmented batches);
{cpu_line}"""


def _card_metrics(metrics: dict) -> str:
    per_class = ", ".join(f"{k} {v:.1%}" for k, v in metrics["accuracy_per_class"].items())
    second = ""
    if "second_drawer_accuracy" in metrics:
        second = f"""
### The second drawer (`tools/teaching/second_drawer.py`)

{metrics['second_drawer_size']:,} images (seed {metrics['second_drawer_seed']}) of an independent drawer, written without \
reading the
generator: its own primitives (stroke paths with jitter, outlines, fills, plain backgrounds, photos of paper),
balanced over classes, size bands and styles, never used in training. {metrics['second_drawer_called_other']:.1%} of its
shapes were called `other`.

{_accuracy_table('size band', metrics['second_drawer_per_size_band'])}
{_accuracy_table('style', metrics['second_drawer_per_style'])}
{_accuracy_table('class', metrics['second_drawer_per_class'])}"""
    if "page_photos_accuracy" in metrics:
        second += f"""
### Phone photos of drawings on paper (`tools/teaching/page_photos.py`)

{metrics['page_photos_size']} photos (seed {metrics['page_photos_seed']}), 1200 x 900 or 900 x 1200 JPEGs of a pen drawing on a
sheet of paper (drawn at the photo's resolution, so the pen is about a pixel wide or less at the model's input; once or
twice over the line; sometimes marker-filled), the sheet on a table at an angle or filling the frame, uneven light, blur;
each decoded like an upload and centre-cropped by timm's eval transform. Never used in training; its own code.
Accuracy {metrics['page_photos_accuracy']:.1%} (sheet on a table {metrics['page_photos_on_table_accuracy']:.1%}, filling the
frame {metrics['page_photos_filling_frame_accuracy']:.1%}).

{_accuracy_table('class', metrics['page_photos_per_class'])}"""
    spearman = metrics["pos_embed_spearman"]
    start = "sin-cos" if metrics.get("pos_embed_spearman_at_init") is not None else "random"
    return f"""## Metrics (`tools/teaching/evaluate.py`)

On {metrics['eval_size']:,} freshly drawn held-out generator images (seed {metrics['eval_seed']}; training chunks use
tuple seeds, so no evaluation image is a training image) and the second drawer's images:

| metric | value | target | met |
|---|---|---|---|
{''.join(_target_row(key, metrics) for key in TARGETS)}\
| chance level of both masses: share of patches that overlap the object | {metrics['object_patch_fraction']:.1%} | | |
| Spearman of the shipped embedding (started from {start}) \
| {spearman:.3f} | | |
{_init_row(metrics)}\
| accuracy on the fixed test set (seed {metrics['test_seed']}, {metrics['test_size']} images, re-checked by \
`tests/unit/test_teaching_model.py`) | {metrics['test_accuracy']:.2%} | | |

### The generator, per size band, style and background (the 8 shapes; `other` is a class of its own)

{_accuracy_table('size band (extent / side)', metrics['accuracy_per_size_band'])}
{_accuracy_table('style', metrics['accuracy_per_style'])}
{_accuracy_table('background', metrics['accuracy_per_background'])}
Photographed: {metrics['accuracy_photographed']:.1%}. Shapes called `other`: {metrics['shapes_called_other']:.1%}.
Per class (with `other`): {per_class}.
{second}
"Mass on object patches" is the sum of the map over the patches that overlap the object's silhouette
(its ink and the area the ink encloses: the inside of an outline is part of the drawn shape), divided by
its sum over all patches, averaged over the shape images (rollout as in `docs/spec/analyses.md`:
A_l = rownorm(0.5 mean_heads + 0.5 I), R = A_L ... A_1, class-token row restricted to patch keys).
Both masses grow with the object: small shapes cover few patches (see the chance level).

Mean attention distance (pixels; patch queries and keys, attention to the class token left out and
not renormalised; averaged over {metrics['mad_images']} held-out shape images; uniform attention over all
patches would give {metrics['uniform_attention_distance_px']:.1f} px; local: below {LOCAL_SHARE:.0%} of that, \
global: at least {GLOBAL_SHARE:.0%}):
layers with a local and a global head in the first half: {metrics['mad_mixed_layers_first_half'] or 'none'};
every last-layer head global: {'yes' if metrics['mad_last_layer_all_global'] else 'no'}.

{_mad_table(metrics)}
"""


def _init_row(metrics: dict) -> str:
    at_init = metrics.get("pos_embed_spearman_at_init")
    if at_init is None:
        return ""
    return (f"| the same Spearman for the 2D sin-cos values training started from (the grid was given "
            f"as a starting point, not discovered) | {at_init:.3f} | | |\n")


def _card_outside(metrics: dict) -> str:
    return f"""## Outside its world

The model knows 8 shapes. Anything else should land in `other` (trained on clutter, textures,
photo-like scenes, faces, scribbles and empty pages) or get a low top probability; the dashboard says
so in words. A real photograph, matplotlib's portrait of Grace Hopper: top class `{metrics['photo_top_label']}` at
{metrics['photo_top_probability']:.1%} (`other` at {metrics['photo_other_probability']:.1%}). On the generator's `other` images:
{metrics['accuracy_per_class'][OTHER]:.1%} called `other`.
"""


def _card_failures(failures_text: str) -> str:
    return f"""## Known failure modes

`failures.png` (beside this card) shows misclassified held-out images, one row per set, true -> predicted:

{failures_text or '- none'}

What they have in common. Second drawer: its errors are small circles (20-35 % of the side) drawn with a
pen that is thick for their radius (its thinnest pen, 1.2 px at 96 px, is 12 % of a 10 px radius), called
`ring`: the generator keeps a circle's pen under 8 % of the radius and starts a ring's band at 18 %, and
such a circle falls in between. Generator: thin (often wobbly) outlines on striped or cluttered
backgrounds where the clutter's lines cross the shape, faint shapes close to the background's colour, the
smallest shapes (18-35 % of the side: 2-4 patches across), and small drawings on a sheet photographed on a
table, which the page makes smaller still.
"""


def _card_reproduce(config: dict) -> str:
    t = config["train"]
    return f"""## Reproduce

```bash
python -m tools.teaching.train --out vit_core/assets/shapes_vit --device cuda --precision bf16 --gen-workers 16
python -m tools.teaching.evaluate vit_core/assets/shapes_vit         # writes metrics.json, this card, failures.png
python -m pytest tests/unit/test_teaching_data.py tests/unit/test_teaching_model.py -q
```

The defaults of `TrainConfig` are the shipped recipe; spelled out, the first command is
`python -m tools.teaching.train --out vit_core/assets/shapes_vit {_recipe_flags(t)} --device cuda --precision bf16`.
Without a GPU, `--device cpu` runs the same code and the same steps (float32). Data, initialisation,
batch order and the number of steps are fixed, so the same command reproduces the run; GPU kernels,
bf16 and float summation order differ across machines, so a retrain gives close, not bit-identical, weights.
"""


def _card_limitations(config: dict, metrics: dict) -> str:
    return f"""## Limitations

{_missed(metrics)}\
A toy: {len(CLASS_NAMES)} synthetic shapes, one per image, at {config['model_args']['img_size']} px. Its attention
patterns are those of a small model trained for minutes, useful to learn how to read the views, not as
evidence about large ViTs.
"""


def model_card(config: dict, metrics: dict, failures_text: str = "") -> str:
    """MODEL_CARD.md text from config.json and metrics.json (no figure is typed by hand)."""
    sections = [_card_intro(config), _card_model(config), _card_data(config), _card_recipe(config),
                _card_metrics(metrics), _card_outside(metrics), _card_failures(failures_text),
                _card_reproduce(config), _card_limitations(config, metrics)]
    return "\n".join(sections)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Evaluate the Shapes ViT and write its model card.")
    parser.add_argument("model_dir", nargs="?", default="vit_core/assets/shapes_vit")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    model, config = load_shapes_vit(model_dir)
    metrics = evaluate(model, second_drawer=second_drawer, page_photos=page_photos)
    failures = metrics.pop("_failures")
    metrics["pos_embed_spearman_at_init"] = pos_embed_spearman_at_init(config)
    random_start = config["train"].get("pos_embed_init", "random") == "random"
    metrics["pos_embed_spearman_random_start"] = metrics["pos_embed_spearman"] if random_start else None
    (model_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    sheet = failure_sheet(failures)
    if sheet is not None:
        sheet.save(model_dir / "failures.png", optimize=True)
    (model_dir / "MODEL_CARD.md").write_text(model_card(config, metrics, failure_list(failures)))
    print(json.dumps({k: metrics.get(k) for k in TARGETS} | {"object_patch_fraction": metrics["object_patch_fraction"]},
                     indent=1))


if __name__ == "__main__":
    main()
