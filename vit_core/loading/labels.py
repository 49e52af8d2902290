"""Class names: from a label file the user gives (text or JSON), one beside the weights file, the bundled teaching
model's own, or timm's bundled ImageNet names.

Label files come from users (uploads on the server): each is capped in size and class count, and every way it
can be wrong is one sentence (a WeightsError).
"""

from __future__ import annotations

import stat
from pathlib import Path

import torch

from .. import bounded_json
from ..errors import WeightsError
from ..teaching.model import TEACHING_MODEL

MAX_CLASSES = 100_000  # ImageNet-21k has 21,843; the head of a 100k-class ViT-B is 300 MB
MAX_LABEL_FILE_BYTES = 8 * 2**20  # 100k names of 80 characters
MAX_LABEL_JSON_DEPTH = 8  # {"id2label": {"0": "cat"}} is 2 levels deep


def model_labels(model: torch.nn.Module, name: str, labels: str | Path | tuple[str, ...] | list[str] | None,
                 weights: Path | None) -> tuple[str, ...] | None:
    """The class names of `model`'s outputs in head order, or None (indices are shown): `labels` (names, or a label
    file), else a label file beside `weights`, else the teaching model's own, else ImageNet names when the pretrained
    config's class count fits the head. Raises WeightsError for names that don't match the head."""
    if labels is not None:
        names = read_labels(labels) if isinstance(labels, (str, Path)) else tuple(labels)
    elif name == TEACHING_MODEL:
        names = tuple(model.pretrained_cfg["label_names"])
    else:
        names = labels_beside(weights) if weights is not None else None
        if names is None:
            names = imagenet_labels(model)  # a guess from the pretrained config's class count, not the head's:
            if names is not None and len(names) != model.num_classes:  # built with num_classes=0, say
                names = None
    if names is not None and len(names) != model.num_classes:
        raise WeightsError(
            f"The labels list {len(names)} classes but the model's head has {model.num_classes}: "
            "wrong label file or wrong class count."
        )
    return names


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a text file (one per line) or JSON (a list, or {"label_names": [...]}, or id2label).

    Raises WeightsError with one sentence for a file that is too large, not UTF-8 text or not such JSON.
    """
    path = Path(path)
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):  # a FIFO would block the read, a device never end it
            raise WeightsError(f"The label file {path.name} is not a regular file.")
        size = status.st_size
        if size > MAX_LABEL_FILE_BYTES:
            raise WeightsError(f"The label file {path.name} is {size / 2**20:.0f} MB; label files are limited to "
                               f"{MAX_LABEL_FILE_BYTES // 2**20} MB.")
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise WeightsError(f"The label file {path.name} is not UTF-8 text; save it as UTF-8, one class name per line.") from e
    except OSError as e:
        raise WeightsError(f"The label file {path.name} can't be read ({e.strerror or 'error'}).") from e
    if path.suffix.lower() == ".json":
        names = _labels_from_json(text)
        if names is None:
            raise WeightsError(f"The label file {path.name} is not JSON of the form [\"cat\", \"dog\", ...], "
                               "{\"label_names\": [...]} or {\"0\": \"cat\", ...}.")
    else:
        names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) > MAX_CLASSES:
        raise WeightsError(f"The label file {path.name} lists {len(names):,} classes; ViT Lens loads at most {MAX_CLASSES:,}.")
    return names


def _labels_from_json(text: str) -> tuple[str, ...] | None:
    """Names from a JSON list, {"label_names" | "labels" | "id2label": ...} or an {"0": name} map; None if it is none of those."""
    try:
        data = bounded_json.loads(text, MAX_LABEL_JSON_DEPTH)
    except ValueError:  # not JSON, or nested deeper than any label list (NestingError)
        return None
    if isinstance(data, dict):
        data = data.get("label_names") or data.get("labels") or data.get("id2label") or data
    if isinstance(data, dict):
        try:
            data = [data[k] for k in sorted(data, key=int)]
        except (TypeError, ValueError):  # keys that are not class indices
            return None
    if not isinstance(data, list) or not all(isinstance(x, (str, int, float)) for x in data):
        return None
    return tuple(str(x) for x in data)


def labels_beside(weights: Path) -> tuple[str, ...] | None:
    for candidate in (weights.with_suffix(".labels.txt"), weights.parent / "labels.txt", weights.parent / "label_names.json"):
        if candidate.is_file():
            return read_labels(candidate)
    return None


def imagenet_labels(model: torch.nn.Module) -> tuple[str, ...] | None:
    """Human-readable ImageNet names from timm's bundled ImageNetInfo (no download), if the head fits."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if not subset:
        return None
    return tuple(ImageNetInfo(subset).label_descriptions())
