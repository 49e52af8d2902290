"""The concept lens: TopK sparse-autoencoder features of a timm ViT's residual stream, learned from a folder of images.

Definitions: docs/spec/analyses.md, "Concepts"; files and the command: docs/spec/interface.md, "Concepts".

- `collect`: the residual stream after block L of every patch token, through the dataset engine (its listing,
  shards and loader), written to disk in chunks per shard; the deterministic held-out tenth of the images;
- `ray_collect`: the same collection on Ray Data (the dataset engine's decoding stage);
- `sae`: the TopK autoencoder (Gao et al. 2024), its normalisation, training, and concepts.safetensors;
- `learn`: from the tokens to the trained autoencoder and its metrics (fvu, dead_fraction, the spliced model's
  agreement and KL, each feature's firing rate, mean activation and top patches);
- `splice`: the autoencoder spliced into the model (reconstruction, or one concept removed);
- `image`: one image's strongest features and reconstruction error, from its capture;
- `sets`: a set of images' strongest features, their top patches in the set, its reconstruction error, and one
  concept removed over the set (the share of top-1s unchanged, the mean KL);
- `crops`: the top patches as pictures, and the contact sheet;
- `circuit`: the features of consecutive listed blocks joined by attribution and measured removal (circuit.json).

    from vit_core.concepts import load_concepts, image_concepts, logits_with_concept_removed
    concepts = load_concepts("out/concepts.safetensors")
    seen = image_concepts(concepts, cap)       # cap = run_with_capture(loaded, image)
    logits = logits_with_concept_removed(loaded, cap, concepts, int(seen.strongest[0]))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..dataset.runs import RunPlan
from ..loading.model import LoadedModel
from .collect import TokenStore, collect_shards, held_out, patch_tokens, residual_after
from .crops import SHEET_CROPS, SHEET_FEATURES, contact_sheet_png, image_crop, patch_crop, top_crops
from .folders import load_concepts
from .image import SHOWN_FEATURES, ImageConcepts, image_concepts
from .learn import (
    MEMORY_BUDGET,
    Stopwatch,
    feature_statistics,
    features_json,
    held_out_metrics,
    learned_concepts,
    splice_metrics,
    strongest_features,
    summary_of,
    tokens_of,
)
from .sae import (
    Concepts,
    ConceptsError,
    Normalisation,
    TopKSAE,
    TrainingSettings,
    concepts_bytes,
    read_summary,
    topk_codes,
    train_sae,
)
from .sets import (
    SET_CROPS,
    SET_FEATURES,
    SetConcepts,
    removal_agreement,
    set_concepts,
    set_logits_with_concept_removed,
    set_tokens,
)
from .splice import concept_removed, logits_spliced, logits_with_concept_removed, reconstructed, spliced, spliced_logits

CONCEPTS_FILE, SUMMARY_FILE, SHEET_FILE = "concepts.safetensors", "concepts.json", "contact_sheet.png"

__all__ = [
    "CONCEPTS_FILE", "MEMORY_BUDGET", "SET_CROPS", "SET_FEATURES", "SHEET_FILE", "SHOWN_FEATURES", "SUMMARY_FILE",
    "Concepts", "ConceptsError", "ImageConcepts", "SetConcepts", "image_crop", "removal_agreement", "set_concepts",
    "set_logits_with_concept_removed", "set_tokens",
    "Normalisation", "TokenStore", "TopKSAE", "TrainingSettings", "collect_shards", "concept_removed", "concepts_bytes",
    "concepts_files", "concepts_path", "contact_sheet_png", "held_out", "image_concepts", "load_concepts", "logits_spliced",
    "logits_with_concept_removed", "patch_crop", "patch_tokens", "read_summary", "reconstructed", "residual_after",
    "spliced", "spliced_logits", "top_crops", "topk_codes", "train_sae",
]


# The stages after the collection, in their order, each with what its progress counts (concepts_files' `progress`).
STAGES = {"training": "tokens", "stability": "tokens", "metrics": "images", "steering": "images", "features": "tokens",
          "sheet": "features", "circuit": "images"}


def concepts_files(loaded: LoadedModel, plan: RunPlan, store: TokenStore, layer: int, settings: TrainingSettings, *,
                   memory_budget: int = MEMORY_BUDGET, workers: int = 0,
                   progress: Callable[[str, int, int], None] | None = None,
                   collect_seconds: float | None = None, stability: bool = False,
                   steering_images: int | None = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every shard's tokens (all collected) -> the autoencoder trained, measured and drawn: the files of
    docs/spec/interface.md "Concepts" (name -> bytes) and concepts.json's content (without its features, for a
    summary line). `stability`: a second autoencoder trained at seed + 1 and compared. `steering_images`: the
    steerable share over the first that many held-out images (default all). progress(stage, done, of) as each stage
    goes: STAGES names them and their units."""
    import json
    from dataclasses import replace

    from .quality import decoder_match, stability_of, steerable, steerable_share

    def stage(name: str) -> Callable[[int, int], None] | None:
        return (lambda done, of: progress(name, done, of)) if progress else None

    clock = Stopwatch()
    if collect_seconds is not None:  # this run's collection, for concepts.json's "seconds"
        clock.seconds["collect"] = collect_seconds
    tokens = clock.time("load", lambda: tokens_of(store, plan, loaded.geometry.num_patches, memory_budget,
                                                  loaded.geometry.embed_dim))
    concepts = clock.time("train", lambda: learned_concepts(loaded, tokens, layer, settings, memory_budget,
                                                            stage("training")))
    held = clock.time("held_out", lambda: held_out_metrics(concepts, tokens))
    quality, match = {}, None
    if stability:
        seeded = replace(settings, seed=settings.seed + 1)
        second = clock.time("stability", lambda: learned_concepts(loaded, tokens, layer, seeded, memory_budget,
                                                                  stage("stability")))
        match = decoder_match(concepts.sae, second.sae)
        quality |= stability_of(match, held["alive"])
    splice = clock.time("splice", lambda: splice_metrics(loaded, concepts, plan, workers, progress=stage("metrics")))
    steers = clock.time("steering", lambda: steerable(loaded, concepts, plan, held["alive"], workers,
                                                      progress=stage("steering"), images=steering_images))
    quality = {"steerable_share": steerable_share(steers, held["alive"]),
               "steering_images": min(steering_images or len(plan.names), int(held_out(plan.names).sum())), **quality}
    stats = clock.time("features", lambda: feature_statistics(concepts, tokens, progress=stage("features")))
    features = features_json(stats, plan.names, loaded.geometry.grid, steers, match)
    cache: dict = {}
    strongest = strongest_features(features, SHEET_FEATURES)
    sheet_done = stage("sheet")
    if sheet_done:
        sheet_done(0, len(strongest))

    def sheet_row(number: int, f: int) -> tuple[int, list]:
        row = (f, [crop for crop, _ in top_crops(loaded, plan.folder, features[f]["top"], SHEET_CROPS, cache)])
        if sheet_done:
            sheet_done(number + 1, len(strongest))
        return row

    rows = clock.time("sheet", lambda: [sheet_row(number, f) for number, f in enumerate(strongest)])
    sheet = contact_sheet_png(rows)
    summary = summary_of(loaded, plan, concepts, settings, held, splice, features, store.failures(plan.shards),
                         clock.seconds, tokens.count(held=False), quality)
    files = {CONCEPTS_FILE: concepts_bytes(concepts), SUMMARY_FILE: json.dumps(summary, indent=1).encode(),
             SHEET_FILE: sheet}
    return files, {key: value for key, value in summary.items() if key != "features"}


def concepts_path(path: str | Path) -> Path:
    """The concepts.safetensors a path names: the file itself, or the one in a folder."""
    path = Path(path)
    return path / CONCEPTS_FILE if path.is_dir() else path
