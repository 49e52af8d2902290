"""Model B of the Compare tab, and the comparison over a set: how they are built (dashboard.caches keeps them, as it
keeps every cached result; B's capture of the image on screen goes through `caches.shared_capture` too).

B is chosen like A: by name from the model list, "random init of A" in one click (A's architecture with random
weights: the Shapes ViT's is `vit_shapes_patch8_96`; the tiny test model's, another seed), or a weights file of A's
architecture (a fine-tuned or earlier checkpoint of A) where the server takes uploads; B keeps A's class names when it
has none of its own.
"""

from __future__ import annotations

from pathlib import Path

import vit_core
from dashboard import caches, image_sets, models
from dashboard.models import TEST_TINY, ModelRequest
from vit_core import LoadedModel
from vit_core.compare import CompareTotals, compare_sources, with_names_of
from vit_core.dataset import DatasetResult
from vit_core.loading import TEACHING_MODEL
from vit_core.serving import shared_model
from vit_core.teaching.model import SHAPES_VIT_TIMM_NAME

RANDOM_INIT_OF_A = "Random init of A"
SET_SIZE, SET_SEED = 24, 0  # the set the tab compares on: drawn Shapes, the same for every model pair


def architecture_of(request: ModelRequest, loaded: LoadedModel) -> str:
    """A's timm architecture, the name its random init is built from."""
    if request.name == TEACHING_MODEL:
        return SHAPES_VIT_TIMM_NAME
    if request.name == TEST_TINY:
        return TEST_TINY
    return (getattr(loaded.model, "pretrained_cfg", None) or {}).get("architecture") or request.name.split(".")[0]


def _random_init(architecture: str, labels: tuple[str, ...] | None) -> LoadedModel:
    if architecture == TEST_TINY:  # the test model is itself a random init (seed 0): B is seed 1
        loaded = vit_core.load_model("vit_tiny_patch16_224", pretrained=False, seed=1, depth=2, device=models.server_device())
    else:
        loaded = vit_core.load_model(architecture, pretrained=False, seed=0, device=models.server_device())
    return shared_model(loaded if labels is None or loaded.labels else _named(loaded, labels))


def _named(loaded: LoadedModel, labels: tuple[str, ...]) -> LoadedModel:
    import dataclasses

    return dataclasses.replace(loaded, labels=labels) if loaded.geometry.num_classes == len(labels) else loaded


def model_b(choice: str, request_a: ModelRequest, loaded_a: LoadedModel, uploaded: ModelRequest | None = None
            ) -> tuple[ModelRequest, LoadedModel]:
    """B's request (its cache key) and model for the picker's `choice`, or for `uploaded` (`uploaded_b`). Raises
    vit_core errors with a sentence (weights that don't fit are refused as A's are)."""
    if uploaded is not None:
        return uploaded, uploaded.shown(with_names_of(caches.load(uploaded), loaded_a))
    if choice == RANDOM_INIT_OF_A:
        architecture = architecture_of(request_a, loaded_a)
        loaded = caches.random_init_model(architecture, loaded_a.labels, _random_init)
        return ModelRequest(f"{architecture} (random init of A)", weights_id="random-init-of-a"), loaded
    request = ModelRequest(choice)
    return request, with_names_of(caches.load(request), loaded_a)


def uploaded_b(request_a: ModelRequest, loaded_a: LoadedModel, weights_path: str, digest: str, file_name: str
               ) -> ModelRequest:
    """B's request for an uploaded weights file of A's architecture (saved at `weights_path`, `digest` its cache key),
    named by the file the user chose (`model_b` loads it)."""
    return ModelRequest(architecture_of(request_a, loaded_a), weights_path=weights_path, weights_id=digest,
                        uploaded_names=((Path(weights_path).name, file_name),))


def set_comparison(key_a: str, key_b: str, a: LoadedModel, b: LoadedModel
                   ) -> tuple[DatasetResult, DatasetResult, CompareTotals, tuple[tuple[str, bytes], ...]]:
    """A and B over SET_SIZE drawn Shapes (seed SET_SEED): each model's dataset result, the comparison's totals and
    the images (name, PNG bytes). Cached by both models' cache keys (`caches.set_comparison`)."""
    return caches.set_comparison(key_a, key_b, a, b, _compared)


def _compared(_a: LoadedModel, _b: LoadedModel
              ) -> tuple[DatasetResult, DatasetResult, CompareTotals, tuple[tuple[str, bytes], ...]]:
    drawn = image_sets.shapes_set(_a, SET_SIZE, SET_SEED)
    mapping_a, mapping_b = image_sets.shapes_labels(_a), image_sets.shapes_labels(_b)
    labels_b = None
    if drawn.labels and mapping_a and mapping_b:  # A's class index -> the Shapes class -> B's class index
        shape_of = {index: shape for shape, index in mapping_a.items()}
        labels_b = tuple(mapping_b[shape_of[label]] for label in drawn.labels)
    a, b, totals = compare_sources(_a, _b, drawn.sources, (drawn.labels, labels_b))
    return a, b, totals, drawn.sources
