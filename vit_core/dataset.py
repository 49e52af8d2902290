"""The analyses over many images: a folder (or a set of uploads) reduced on the model's device.

Definitions: docs/spec/analyses.md, "Over many images": dataset values are means over images of the
per-image values (and their spread), never values of a mean image. Shapes: B images in a batch, L layers,
H heads, T = P + N tokens (P prefix tokens first, then N = gh*gw patches row-major), D width, C classes.

Why a module of its own: one image's capture keeps every attention pattern (L, H, T, T) on the host, which
is fine for one picture and ruinous for a folder (32 images of ViT-B/16: about 700 MB per batch, and copying
it off a GPU costs more than the forward itself). Here each batch runs one hooked forward, and the hooks
reduce on the device, layer by layer, as the pass goes: the pattern to mean attention distance (B, H) in both
conventions, the tokens to their high-norm rate (B,) and their logit-lens top-1 (B,). Only those small
arrays reach the host; the patterns are dropped as soon as their block is done.

Images are decoded in DataLoader worker processes with vit_core.images (the same checks as one upload)
and the model's own eval transform. Files that cannot be read are reported and skipped.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from . import analyses, explain
from .devices import describe_device, full_float32
from .errors import CaptureError, ImageError, ViTLensError
from .export import faithfulness_summary, json_bytes, npz_bytes
from .hooks import attention_recorded, tokens_recorded
from .images import DRAFT_MIN_SIDE, UPLOAD_EXTENSIONS, load_image
from .model import Geometry, LoadedModel

_logger = logging.getLogger(__name__)

Source = tuple[str, "bytes | Path"]  # (image name, raw file bytes or a path)
_SYNSET = re.compile(r"^n\d{8}$")


class DatasetError(ViTLensError, ValueError):
    """A set of images that gives nothing to analyse: no images at all, or none that could be read."""


# ----------------------------------------------------------------------------------------------
# Finding the images and their labels


def list_images(folder: Path) -> list[Path]:
    """Every file under `folder` (recursively) whose suffix is one of the image formats ViT Lens reads
    (images.UPLOAD_EXTENSIONS, any case), sorted by path. Hidden files and folders (".name") are left out."""
    folder = Path(folder)
    suffixes = {f".{ext}" for ext in UPLOAD_EXTENSIONS}
    found = [
        path for path in folder.rglob("*")
        if path.suffix.lower() in suffixes and path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]
    return sorted(found)


def _class_names(loaded: LoadedModel) -> dict[str, int]:
    """Lower-case names -> class index: each label and its first comma-separated part, the first class
    that has a name winning (as explain.resolve_target reads a target given by name)."""
    names: dict[str, int] = {}
    for index, label in enumerate(loaded.labels or ()):
        whole = label.strip().lower()
        for name in (whole, whole.split(",")[0].strip()):
            names.setdefault(name, index)
    return names


def _synsets(loaded: LoadedModel) -> dict[str, int]:
    """ImageNet synset ids (n01440764) -> class index for a model with an ImageNet head, else {}."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(loaded.model)
    if not subset:
        return {}
    return {synset: index for index, synset in enumerate(ImageNetInfo(subset).label_names())}


def class_of_folder(loaded: LoadedModel, name: str, names: dict[str, int] | None = None,
                    synsets: dict[str, int] | None = None) -> int | None:
    """The class a folder name stands for: a class index ("0".."C-1"), a label name (the whole name or its
    first comma-separated part, case-insensitive), or an ImageNet synset id; None when it names none."""
    num_classes = loaded.geometry.num_classes
    wanted = name.strip().lower()
    if wanted.isdigit():
        return int(wanted) if int(wanted) < num_classes else None
    names = _class_names(loaded) if names is None else names
    if wanted in names:
        return names[wanted]
    if _SYNSET.match(wanted):
        synsets = _synsets(loaded) if synsets is None else synsets
        return synsets.get(wanted)
    return None


def folder_labels(loaded: LoadedModel, folder: Path, paths: Sequence[Path]) -> list[int | None] | None:
    """True labels from the first-level subfolder each of `paths` lies in (ImageNet's folder layout):
    FOLDER/<class>/.../image. A file directly in `folder`, or in a subfolder that names no class, gets None.
    Returns None when no subfolder names a class (the images are then unlabelled)."""
    folder = Path(folder)
    names, synsets = _class_names(loaded), _synsets(loaded)
    known: dict[str, int | None] = {}
    labels: list[int | None] = []
    for path in paths:
        parts = Path(path).relative_to(folder).parts
        if len(parts) < 2:
            labels.append(None)
            continue
        if parts[0] not in known:
            known[parts[0]] = class_of_folder(loaded, parts[0], names, synsets)
        labels.append(known[parts[0]])
    return labels if any(label is not None for label in labels) else None


# ----------------------------------------------------------------------------------------------
# Decoding in worker processes


class DecodedImages(Dataset):
    """The sources as model inputs: item i is (i, float32 (3, H, W) normalised input) or (i, the reason it
    could not be read). Holds only picklable things (the sources and the two transforms, not the model),
    so DataLoader workers can have it."""

    def __init__(self, sources: Sequence[Source], crop_transform: Callable, tensor_transform: Callable,
                 min_side: int = DRAFT_MIN_SIDE):
        self.sources = list(sources)
        self.crop_transform, self.tensor_transform = crop_transform, tensor_transform
        self.min_side = min_side  # a large JPEG's decode keeps this shorter side (LoadedModel.decode_min_side)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str]:
        _, source = self.sources[index]
        try:
            image = load_image(source, self.min_side)  # RGB, the same hostile-input checks as one upload
            crop = self.crop_transform(image)  # refuses what the model's resize would enlarge too far
        except ImageError as e:
            return index, str(e)
        return index, self.tensor_transform(crop)  # (3, H, W), as capture.preprocess


def collate_decoded(items: list[tuple[int, torch.Tensor | str]]
                    ) -> tuple[torch.Tensor, torch.Tensor | None, list[tuple[int, str]]]:
    """A batch of DecodedImages items -> (indices (B,) int64, inputs (B, 3, H, W) or None when every
    image failed, failures [(index, reason)]): the failures kept aside, the rest stacked."""
    good = [(i, x) for i, x in items if isinstance(x, torch.Tensor)]
    failures = [(i, x) for i, x in items if not isinstance(x, torch.Tensor)]
    indices = torch.tensor([i for i, _ in good], dtype=torch.long)
    inputs = torch.stack([x for _, x in good]) if good else None  # B x (3, H, W) -> (B, 3, H, W)
    return indices, inputs, failures


def image_loader(loaded: LoadedModel, sources: Sequence[Source], batch_size: int, workers: int) -> DataLoader:
    """The batches of `sources` as collate_decoded gives them, decoded by `workers` processes (0: in this one)
    with the model's own transforms; pinned host memory when the model is on a GPU."""
    decoded = DecodedImages(sources, loaded.crop_transform, loaded.tensor_transform, loaded.decode_min_side)
    return DataLoader(decoded, batch_size=batch_size, num_workers=workers, collate_fn=collate_decoded,
                      pin_memory=loaded.device.type == "cuda")


# ----------------------------------------------------------------------------------------------
# Reductions on the device (torch versions of analyses.py's definitions, batched)


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float64 for the norm quartiles, as analyses.high_norm_fence computes them; Apple's MPS has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def attention_distances(pattern: torch.Tensor, distance: torch.Tensor,
                        num_prefix_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention distance of every image and head of one layer, in both conventions of
    analyses.mean_attention_distance: pattern (B, H, T, T), distance (N, N) pixels float32 ->
    ((B, H) prefix attention left out, (B, H) each patch row renormalised over patch keys), float32."""
    p = num_prefix_tokens
    patch_to_patch = pattern[:, :, p:, p:].float()  # (B, H, N, N): a view when the pattern is float32 already
    per_query = (patch_to_patch * distance).sum(dim=-1)  # (B, H, N): sum_j a_ij d_ij
    row_mass = patch_to_patch.sum(dim=-1)  # (B, H, N): what each patch row gives to patches
    return per_query.mean(dim=-1), (per_query / row_mass.clamp_min(1e-12)).mean(dim=-1)


def token_norms(tokens: torch.Tensor) -> torch.Tensor:
    """Euclidean norm of every token, as explain.token_norms (float64, then float32 where the device has
    float64): (B, T, D) -> float32 (B, T)."""
    return torch.linalg.vector_norm(tokens.to(_exact_dtype(tokens.device)), dim=-1).float()


def high_norm_rates(norms: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Share of patch tokens above Q3 + 3 IQR of their image's patch norms (analyses.high_norm_rate, one
    layer of each image): norms float32 (B, T) -> float32 (B,). Quartiles by linear interpolation in
    float64 (float32 on MPS), as numpy's, so the fence equals analyses.high_norm_fence."""
    patch_norms = norms[:, num_prefix_tokens:]  # (B, N)
    quartiles = torch.quantile(patch_norms.to(_exact_dtype(norms.device)),
                               torch.tensor([0.25, 0.75], dtype=_exact_dtype(norms.device), device=norms.device), dim=-1)
    q1, q3 = quartiles  # (2, B) -> (B,), (B,)
    fence = (q3 + analyses.HIGH_NORM_IQR_FACTOR * (q3 - q1)).float()  # (B,)
    return (patch_norms > fence[:, None]).float().mean(dim=-1)


def patch_distances_on(geometry: Geometry, device: torch.device) -> torch.Tensor:
    """analyses.patch_distances of the model's grid as float32 (N, N) pixels on `device`: made once per run."""
    return torch.from_numpy(analyses.patch_distances(geometry.grid, geometry.patch_size)).float().to(device)


@dataclass
class _BatchReductions:
    """What the hooks of one forward left, all on the device; lists in layer order."""

    distance: list[torch.Tensor] = field(default_factory=list)  # L x (B, H)
    distance_renorm: list[torch.Tensor] = field(default_factory=list)  # L x (B, H)
    high_norm_rate: list[torch.Tensor] = field(default_factory=list)  # (L+1) x (B,)
    lens_top1: list[torch.Tensor] = field(default_factory=list)  # (L+1) x (B,), only when asked for


@contextlib.contextmanager
def reductions_recorded(loaded: LoadedModel, store: _BatchReductions, distance: torch.Tensor, logit_lens: bool) -> Iterator[None]:
    """Inside the block, a forward of `loaded.model` reduces as it goes: each block's attention pattern to
    its mean attention distances, the tokens entering block 0 and after each block to their high-norm rate
    and (with `logit_lens`) the top-1 class of the model's head path on them (explain.logit_lens). Hooks and
    the attention flags are removed / restored on exit, also when the forward raises."""
    model, p = loaded.model, loaded.geometry.num_prefix_tokens

    def reduce_pattern(pattern: torch.Tensor) -> None:
        default, renormalised = attention_distances(pattern, distance, p)
        store.distance.append(default)
        store.distance_renorm.append(renormalised)

    def reduce_tokens(tokens: torch.Tensor) -> None:
        store.high_norm_rate.append(high_norm_rates(token_norms(tokens), p))
        if logit_lens:
            store.lens_top1.append(explain.head_logits(model, tokens).argmax(dim=-1))  # (B, C) -> (B,)

    with contextlib.ExitStack() as stack:
        stack.enter_context(attention_recorded(model, reduce_pattern))
        stack.enter_context(tokens_recorded(model, reduce_tokens))
        yield


@dataclass(frozen=True)
class BatchValues:
    """The per-image values of one batch, on the host: the small arrays the device sent back."""

    distance: np.ndarray  # float32 (B, L, H), pixels
    distance_renorm: np.ndarray  # float32 (B, L, H)
    high_norm_rate: np.ndarray  # float32 (B, L+1)
    top1: np.ndarray  # int64 (B,)
    lens_top1: np.ndarray | None  # int64 (B, L+1), None when the logit lens was not asked for


def reduce_batch(loaded: LoadedModel, x: torch.Tensor, logit_lens: bool, distance: torch.Tensor | None = None) -> BatchValues:
    """One hooked forward of the batch x (B, 3, H, W) on the model's device, reduced there; only the
    per-image values come back. Under `loaded.lock` and inference_mode, in full float32 on a GPU (as a capture:
    results equal the CPU's within float32 tolerance; an autocast around the call still runs in bfloat16);
    eval mode restored after."""
    geometry, model = loaded.geometry, loaded.model
    device = loaded.device
    if distance is None:
        distance = patch_distances_on(geometry, device)
    store = _BatchReductions()
    with (loaded.lock, torch.inference_mode(), explain.eval_mode(model), full_float32(device),
          reductions_recorded(loaded, store, distance, logit_lens)):
        logits = model(x.to(device, non_blocking=True))  # (B, C)
    if len(store.distance) != geometry.num_layers:
        raise CaptureError(f"expected one attention pattern per block ({geometry.num_layers}), got {len(store.distance)}: "
                           "this model's attention does not run through timm's standard path.")
    assert len(store.high_norm_rate) == geometry.num_layers + 1, f"{len(store.high_norm_rate)} token reductions"
    on_device = {
        "distance": torch.stack(store.distance, dim=1),  # L x (B, H) -> (B, L, H)
        "distance_renorm": torch.stack(store.distance_renorm, dim=1),
        "high_norm_rate": torch.stack(store.high_norm_rate, dim=1),  # (L+1) x (B,) -> (B, L+1)
        "top1": logits.argmax(dim=-1),  # (B,): the first maximum, as np.argmax
    }
    if logit_lens:
        on_device["lens_top1"] = torch.stack(store.lens_top1, dim=1)  # (B, L+1)
    host = {key: value.cpu().numpy() for key, value in on_device.items()}  # the one copy back
    return BatchValues(
        distance=host["distance"].astype(np.float32), distance_renorm=host["distance_renorm"].astype(np.float32),
        high_norm_rate=host["high_norm_rate"].astype(np.float32), top1=host["top1"].astype(np.int64),
        lens_top1=host["lens_top1"].astype(np.int64) if logit_lens else None,
    )


# ----------------------------------------------------------------------------------------------
# Accumulating over images


class RunningMoments:
    """Mean and population variance (ddof 0) over images of a per-image array, merged a batch at a time in
    float64 (Chan et al.'s parallel update: no sum of squares that loses digits)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None  # sum of squared deviations from the mean

    def add(self, values: np.ndarray) -> None:
        """values: (B, ...) one row per image."""
        values = np.asarray(values, dtype=np.float64)
        if len(values) == 0:
            return
        batch_mean = values.mean(axis=0)
        batch_m2 = ((values - batch_mean) ** 2).sum(axis=0)
        if self.count == 0:
            self.count, self.mean, self.m2 = len(values), batch_mean, batch_m2
            return
        total = self.count + len(values)
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * len(values) / total
        self.m2 = self.m2 + batch_m2 + delta**2 * self.count * len(values) / total
        self.count = total

    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / self.count)


# ----------------------------------------------------------------------------------------------
# The result


@dataclass(frozen=True)
class DatasetResult:
    """The dataset-level values of analyses.md "Over many images". Shapes: L layers, H heads."""

    model: str
    weights: str
    device: str  # devices.describe_device of the device that ran it
    num_images: int  # images analysed (the failures not counted)
    mean_attention_distance: np.ndarray  # float32 (L, H), pixels: mean over images, default convention
    mean_attention_distance_std: np.ndarray  # float32 (L, H): population standard deviation over images (ddof 0)
    mean_attention_distance_renorm: np.ndarray  # float32 (L, H): mean over images, renormalised convention
    high_norm_rate: np.ndarray  # float32 (L+1,): mean over images of each image's high-norm patch share
    accuracy: float | None  # top-1 over the labelled images; None without labels
    logit_lens_accuracy: np.ndarray | None  # float32 (L+1,): top-1 of each logit-lens row over the labelled images
    deletion_auc: dict[str, float]  # method (then "random") -> mean over images; {} without explain
    insertion_auc: dict[str, float]
    failures: tuple[tuple[str, str], ...]  # (image name, one sentence why it was skipped)
    num_labelled: int = 0  # images with a known label among the analysed ones

    def arrays(self) -> dict[str, np.ndarray]:
        """dataset.npz as interface.md's table: num_images, the distances, high_norm_rate; accuracy and
        logit_lens_accuracy with labels; deletion_auc_<name> / insertion_auc_<name> with explanations."""
        arrays = {
            "num_images": np.asarray(self.num_images, dtype=np.int64),
            "mean_attention_distance": np.asarray(self.mean_attention_distance, dtype=np.float32),
            "mean_attention_distance_std": np.asarray(self.mean_attention_distance_std, dtype=np.float32),
            "mean_attention_distance_renorm": np.asarray(self.mean_attention_distance_renorm, dtype=np.float32),
            "high_norm_rate": np.asarray(self.high_norm_rate, dtype=np.float32),
        }
        if self.accuracy is not None:
            arrays["accuracy"] = np.asarray(self.accuracy, dtype=np.float64)
        if self.logit_lens_accuracy is not None:
            arrays["logit_lens_accuracy"] = np.asarray(self.logit_lens_accuracy, dtype=np.float32)
        for name, value in self.deletion_auc.items():
            arrays[f"deletion_auc_{name}"] = np.asarray(value, dtype=np.float64)
        for name, value in self.insertion_auc.items():
            arrays[f"insertion_auc_{name}"] = np.asarray(value, dtype=np.float64)
        return arrays

    def summary(self) -> dict[str, Any]:
        """dataset.json: the model, its weights, the device, the scalars and one line per image that failed."""
        return {
            "model": self.model,
            "weights": self.weights,
            "device": self.device,
            "num_images": self.num_images,
            "num_labelled": self.num_labelled,
            "accuracy": self.accuracy,
            "faithfulness": faithfulness_summary(self.deletion_auc, self.insertion_auc),
            "mean_attention_distance_std": "population standard deviation over images (ddof 0)",
            "failures": [f"{name}: {reason}" for name, reason in self.failures],
        }


def _explained_aucs(loaded: LoadedModel, source: bytes | Path, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Deletion and insertion AUC of every relevance method and of the random baseline for one image, its
    target the top-1 (as explanations default to)."""
    image = load_image(source, loaded.decode_min_side)
    relevance = explain.relevance_maps(loaded, image)
    faith = explain.faithfulness(loaded, image, relevance.maps, relevance.target, steps=steps)
    return faith.deletion_auc, faith.insertion_auc


def default_batch_size(device: torch.device) -> int:
    """Images per hooked forward: 8 on a CPU, where a large batch's un-fused attention (12 x 197 x 197 floats per
    image and layer for ViT-B/16) falls out of the caches; 64 on an accelerator (docs/performance.md, "Many images")."""
    return 8 if device.type == "cpu" else 64


def analyze_dataset(loaded: LoadedModel, sources: Sequence[Source], labels: Sequence[int | None] | None = None, *,
                    batch_size: int | None = None, workers: int = 0, explain: bool = False, steps: int = explain.DEFAULT_STEPS,
                    progress: Callable[[int, int], None] | None = None) -> DatasetResult:
    """The dataset-level values of `sources` ((name, file bytes or path) each): per image, one hooked forward
    in batches of `batch_size` (default: `default_batch_size` of the model's device) reduced on the model's device,
    then means (and the distance's std) over images.

    labels: one true class (or None) per source, for accuracy and logit-lens accuracy (the logit lens runs only
    when some label is known). workers: DataLoader worker processes that decode (0: in this process; they are
    forked on Linux, so a multi-threaded server is safer with 0). explain: also the deletion / insertion AUC of every
    relevance method and the random baseline, target the top-1, per image (one at a time: it needs gradients;
    the image is decoded again in this process), averaged over images.
    progress(done, total) after each batch and each explained image; total counts each image once, twice
    with `explain`. Unreadable images are skipped and listed in `failures`. Raises DatasetError when no image
    could be analysed, CaptureError for a model whose attention bypasses timm's standard path.
    """
    # In here `explain` is the flag (the API's name); the module's functions are reached through _explained_aucs.
    num_classes = loaded.geometry.num_classes
    if labels is not None and len(labels) != len(sources):
        raise ValueError(f"{len(labels)} labels for {len(sources)} images")
    if labels is not None and any(label is not None and not 0 <= label < num_classes for label in labels):
        raise ValueError(f"a label is outside the model's classes 0..{num_classes - 1}")
    if not sources:
        raise DatasetError("There are no images to analyse.")
    geometry = loaded.geometry
    device = loaded.device
    logit_lens = labels is not None and any(label is not None for label in labels)
    distance = patch_distances_on(geometry, device)
    batch_size = batch_size or default_batch_size(device)
    loader = image_loader(loaded, sources, batch_size, workers)
    total = len(sources) * (2 if explain else 1)
    report = progress or (lambda done, total: None)
    done = 0

    distances, distances_renorm, rates = RunningMoments(), RunningMoments(), RunningMoments()
    correct, lens_correct, labelled = 0, np.zeros(geometry.num_layers + 1, dtype=np.int64), 0
    deletion: dict[str, list[float]] = {}
    insertion: dict[str, list[float]] = {}
    failures: list[tuple[str, str]] = []
    for indices, x, failed in loader:
        for index, reason in failed:
            failures.append((sources[index][0], reason))
            _logger.info("skipped %s: %s", sources[index][0], reason)
        if x is not None:
            values = reduce_batch(loaded, x, logit_lens, distance)
            distances.add(values.distance)
            distances_renorm.add(values.distance_renorm)
            rates.add(values.high_norm_rate)
            if logit_lens:
                for row, index in enumerate(indices.tolist()):
                    if labels[index] is not None:
                        labelled += 1
                        correct += int(values.top1[row] == labels[index])
                        lens_correct += values.lens_top1[row] == labels[index]
        done += len(indices) + len(failed) * (2 if explain else 1)
        report(done, total)
        if explain:
            for index in indices.tolist():
                try:  # decoded again here: a file on disk can change (or vanish) after its batch was read
                    deletion_auc, insertion_auc = _explained_aucs(loaded, sources[index][1], steps)
                except ImageError as e:
                    failures.append((sources[index][0], f"No explanation: {e}"))
                    deletion_auc, insertion_auc = {}, {}
                for name in deletion_auc:
                    deletion.setdefault(name, []).append(deletion_auc[name])
                    insertion.setdefault(name, []).append(insertion_auc[name])
                done += 1
                report(done, total)

    if distances.count == 0:
        first = f" (first: {failures[0][0]}: {failures[0][1]})" if failures else ""
        raise DatasetError(f"None of the {len(sources)} images could be read{first}.")
    return _read_only(DatasetResult(
        model=loaded.name,
        weights=loaded.weights,
        device=describe_device(device),
        num_images=distances.count,
        mean_attention_distance=distances.mean.astype(np.float32),
        mean_attention_distance_std=distances.std().astype(np.float32),
        mean_attention_distance_renorm=distances_renorm.mean.astype(np.float32),
        high_norm_rate=rates.mean.astype(np.float32),
        accuracy=correct / labelled if labelled else None,
        logit_lens_accuracy=(lens_correct / labelled).astype(np.float32) if labelled else None,
        deletion_auc={name: float(np.mean(values)) for name, values in deletion.items()},
        insertion_auc={name: float(np.mean(values)) for name, values in insertion.items()},
        failures=tuple(failures),
        num_labelled=labelled,
    ))


def _read_only(result: DatasetResult) -> DatasetResult:
    """The result's arrays made read-only, so that a cache can hand the same result to every session."""
    for value in vars(result).values():
        if isinstance(value, np.ndarray):
            value.setflags(write=False)
    return result


# ----------------------------------------------------------------------------------------------
# Files


def dataset_files(result: DatasetResult, geometry: Geometry) -> dict[str, bytes]:
    """The three files of interface.md's `dataset` command: name -> bytes. The figure is the paper's Fig. 7 (right)
    for the set (`vit_core.plots.attention_distance_png`, as the dashboard draws it): every head's mean attention
    distance over the images (a dot each, its std over the images as an error bar) against depth."""
    from .plots import attention_distance_png  # here, not at the top: the reductions need no plotting library

    figure = attention_distance_png(result.mean_attention_distance,
                                    analyses.uniform_attention_distance(geometry.grid, geometry.patch_size),
                                    spread=result.mean_attention_distance_std,
                                    title=f"{result.model}: mean over {result.num_images} images, bars: std over images")
    return {
        "dataset.npz": npz_bytes(result.arrays()),
        "dataset.json": json_bytes(result.summary()),
        "mean_attention_distance.png": figure,
    }
