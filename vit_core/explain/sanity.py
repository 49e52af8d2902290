"""Sanity checks for relevance maps (Adebayo et al., NeurIPS 2018, "Sanity Checks for Saliency Maps"): a map that
explains the model must change when the model's weights are re-initialised, and when another class is explained.

Both take a map-computing callable (model, image, target) -> {method: (gh, gw) map}, so they work for every method
(by default `relevance_maps(...).maps`, whatever methods it has). Re-initialisation happens on a private deep copy
of the model; the shared model is never changed. Definitions: docs/spec/analyses.md, "Sanity checks".
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch
from PIL import Image

from ..capture import Capture
from ..loading.model import LoadedModel
from .passes import batch_boundary
from .ranks import spearman
from .relevance import relevance_maps

ExplainMaps = Callable[[LoadedModel, "Image.Image | Capture", int], Mapping[str, np.ndarray]]
HEAD = "head"
REINIT_STD = 0.02  # parameters of no module with reset_parameters are drawn from N(0, 0.02^2), timm's init for them


def method_maps(loaded: LoadedModel, image: Image.Image | Capture, target: int) -> Mapping[str, np.ndarray]:
    """The default map-computing callable: `relevance_maps(loaded, image, target).maps`, every method it has, the LRP
    maps by the epsilon rule (a rule chosen anew at every stage would make the stages incomparable)."""
    return relevance_maps(loaded, image, target, choose_gamma=False).maps


def randomisation_stages(model: torch.nn.Module) -> list[tuple[str, list[torch.nn.Module]]]:
    """The cascade, from the top: ("head", [the final norm, the attention pool, fc_norm and the classifier, those the
    model has]), then ("block L-1", [blocks[L-1]]) down to ("block 0", [blocks[0]])."""
    head = [m for m in (getattr(model, name, None) for name in ("norm", "attn_pool", "fc_norm", "head"))
            if isinstance(m, torch.nn.Module) and any(True for _ in m.parameters())]
    blocks = [(f"block {i}", [model.blocks[i]]) for i in reversed(range(len(model.blocks)))]
    return [(HEAD, head)] + blocks


def reinitialise(modules: list[torch.nn.Module], seed: int) -> None:
    """Draw every parameter of `modules` again, seeded, without touching the global random state: each sub-module
    with `reset_parameters` (linears, norms, layer scales) resets its own parameters (torch's and timm's init), and
    any other parameter is drawn from N(0, REINIT_STD^2)."""
    devices = sorted({p.device.index or 0 for m in modules for p in m.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        for module in modules:
            for sub in module.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
                else:
                    for param in sub.parameters(recurse=False):
                        torch.nn.init.normal_(param, std=REINIT_STD)


def private_copy(loaded: LoadedModel) -> LoadedModel:
    """A LoadedModel around a deep copy of the model (copied under the lock: no capture's hooks come along), with
    its own lock."""
    with loaded.lock:
        model = copy.deepcopy(loaded.model)
    return dataclasses.replace(loaded, model=model, lock=threading.Lock())  # nobody else runs it


def _correlations(reference: Mapping[str, np.ndarray], maps: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Spearman's rho of each reference map with the same method's map (NaN where that method has none)."""
    return {m: spearman(reference[m], maps[m]) if m in maps else math.nan for m in reference}


@dataclass(frozen=True)
class Sanity:
    """Each method's map against itself as the model is re-initialised from the top, and against another class's map."""

    target: int
    stages: tuple[str, ...]  # ("head", "block L-1", ..., "block 0"): re-initialised cumulatively, in this order
    cascading: dict[str, np.ndarray]  # method -> float64 (len(stages),): Spearman's rho with the original map after each
    other_class: int
    other_class_correlation: dict[str, float]  # method -> Spearman's rho of the target's map and the other class's


def cascading_randomisation(loaded: LoadedModel, image: Image.Image | Capture, target: int,
                            explain_maps: ExplainMaps = method_maps, *, seed: int = 0,
                            progress: Callable[[float, str], None] | None = None,
                            ) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """Adebayo et al.'s cascading randomisation: on a private copy, re-initialise the stages of
    `randomisation_stages` one after the other (stage i seeded seed + i, the earlier ones staying re-initialised) and
    after each, the Spearman rank correlation of each method's map with its map on the trained model. Calls the
    `between_batches` hook (passes) before each stage. -> (stage names, method -> (stages,) float64)."""
    reference = explain_maps(loaded, image, target)
    shadow = private_copy(loaded)
    stages = randomisation_stages(shadow.model)
    rows: list[dict[str, float]] = []
    report = progress or (lambda fraction, message: None)
    for i, (name, modules) in enumerate(stages):
        batch_boundary()  # each stage's maps are one batch: a caller sharing the model may end the run here
        reinitialise(modules, seed + i)
        rows.append(_correlations(reference, explain_maps(shadow, image, target)))
        report((i + 1) / len(stages), f"{name} re-initialised, {i + 1} of {len(stages)}")
    return tuple(name for name, _ in stages), {m: np.array([row[m] for row in rows]) for m in reference}


def other_class(num_classes: int, target: int, seed: int = 0) -> int:
    """A class other than `target`, uniformly among the other num_classes - 1, seeded."""
    if num_classes < 2:
        raise ValueError("the class check needs a model with at least two outputs")
    drawn = int(np.random.default_rng(seed).integers(num_classes - 1))
    return drawn + 1 if drawn >= target else drawn


def class_randomisation(loaded: LoadedModel, image: Image.Image | Capture, target: int,
                        explain_maps: ExplainMaps = method_maps, *, seed: int = 0) -> tuple[int, dict[str, float]]:
    """Each method's map for `target` against its map for a random other class (`other_class`, seeded): Spearman's
    rho. A map that does not depend on the class scores 1. -> (the other class, method -> rho)."""
    outputs = loaded.geometry.num_classes or int(loaded.model.num_features)  # no head: the pooled features are the outputs
    other = other_class(outputs, target, seed)
    return other, _correlations(explain_maps(loaded, image, target), explain_maps(loaded, image, other))


def sanity_checks(loaded: LoadedModel, image: Image.Image | Capture, target: int, explain_maps: ExplainMaps = method_maps, *,
                  seed: int = 0, progress: Callable[[float, str], None] | None = None) -> Sanity:
    """Both checks (`cascading_randomisation`, `class_randomisation`) for one image and target class."""
    stages, cascading = cascading_randomisation(loaded, image, target, explain_maps, seed=seed, progress=progress)
    other, correlation = class_randomisation(loaded, image, target, explain_maps, seed=seed)
    return Sanity(target=int(target), stages=stages, cascading=cascading, other_class=other,
                  other_class_correlation=correlation)
