"""Opening a concepts folder (`vit-lens concepts`' DIR) for the app: which folders there are, and each one checked
once, when it is opened, against bounds from the model and the machine.

- `BUNDLED_DIR`: the Shapes ViT's concepts shipped with the package (tools/teaching/make_concepts.py);
- `offered_folders`: the folders a server offers by name, the teacher's (`VIT_LENS_CONCEPTS`) and the bundled ones;
- `typed_folder`: a path a single user typed, resolved as the server's command line would (relative to the folder
  the server was started in);
- `open_folder`: concepts.safetensors and concepts.json read as regular files of bounded size (never a FIFO, a
  device or /proc's endless files), every tensor finite, norm_scale > 0, F within `max_features`, concepts.json
  nested at most SUMMARY_DEPTH deep with the types and ranges docs/spec/interface.md gives (`check_summary`);
- `image_path`: a top patch's file inside the folder the concepts were learned from, or None;
- `circuit_beside`, `read_circuit`: the circuit.json of a run of several blocks, beside its DIR/layer-L folders, read
  as a regular file of bounded size and checked (`check_circuit`).

Every refusal is a ConceptsError of one sentence. Shapes: D width, F features, (gh, gw) the model's patch grid.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Mapping, Sequence

import torch

from .. import bounded_json
from ..runtime import memory_limit_bytes
from .sae import FORMAT, Concepts, ConceptsError, Normalisation, TopKSAE

CONCEPTS_FILE, SUMMARY_FILE = "concepts.safetensors", "concepts.json"
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "assets" / "shapes_concepts"
BUNDLED_NAME = "Shapes ViT, block 2 (bundled)"
MAX_FEATURES_PER_WIDTH = 64  # F <= 64 D: Gao et al.'s largest dictionaries are 32x-64x the width
FEATURE_COPIES = 16  # float32 (F, D) matrices a file's use may hold at once (read, loaded, encoder, decoder, codes)
HEADER_BYTES = 2**20  # a concepts file's safetensors header: six tensors and five metadata strings
SUMMARY_FEATURE_BYTES = 8 * 2**10  # concepts.json per feature: 20 top patches of about 120 bytes, with room
SUMMARY_DEPTH = 6  # {"features": [{"top": [{...}]}]} is 4 levels deep
MAX_TOP = 100  # top patches per feature (`vit-lens concepts` writes 20)
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux


def max_features(d_model: int, memory: int | None = None) -> int:
    """The most features a concepts file of width `d_model` may have here: MAX_FEATURES_PER_WIDTH D, and no more
    than FEATURE_COPIES float32 (F, D) matrices fit in the machine's memory (the container's limit)."""
    memory = memory or memory_limit_bytes() or 4 * 2**30
    return max(1, min(MAX_FEATURES_PER_WIDTH * d_model, memory // (FEATURE_COPIES * 4 * d_model)))


def concepts_file_bytes(num_features: int, d_model: int) -> int:
    """The bytes of concepts.safetensors for F and D (its float32 tensors, float64 norm_scale), header aside."""
    return 4 * (2 * num_features * d_model + num_features + 2 * d_model) + 8


# ----------------------------------------------------------------------------------------------
# Which folders


def offered_folders(setting: str) -> dict[str, Path]:
    """Name -> folder of the concept folders a server offers: the bundled concepts, then each folder of `setting`
    (VIT_LENS_CONCEPTS: folders separated by os.pathsep) by its own name. Raises ConceptsError for a folder that
    is not one or holds no concepts file, or two of the same name."""
    offered = {BUNDLED_NAME: BUNDLED_DIR} if (BUNDLED_DIR / CONCEPTS_FILE).is_file() else {}
    for entry in filter(None, (part.strip() for part in setting.split(os.pathsep))):
        folder = Path(entry).expanduser().resolve()
        if not (folder / CONCEPTS_FILE).is_file():
            raise ConceptsError(f"{entry}: not a folder that `vit-lens concepts` wrote (no {CONCEPTS_FILE} in it).")
        if folder.name in offered:
            raise ConceptsError(f"{entry}: two concept folders are named {folder.name!r}; rename one.")
        offered[folder.name] = folder
    return offered


def typed_folder(text: str, base: Path) -> Path:
    """The concepts folder a typed path names (the folder, or the folder of its concepts.safetensors): `~` is the
    home folder, a relative path is relative to `base` (the folder the server was started in). Raises
    ConceptsError for a path too long or holding a NUL."""
    if len(text) > MAX_PATH_CHARS or "\0" in text:
        raise ConceptsError("That is not a path this machine can have.")
    path = Path(text).expanduser()
    path = path if path.is_absolute() else base / path
    return path.parent if path.name == CONCEPTS_FILE else path


# ----------------------------------------------------------------------------------------------
# Reading, checked


def _opened_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (a symlink to one is fine). Raises ConceptsError: not
    there, not a regular file (a folder, a FIFO, a device)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before opening: a FIFO waits for a writer, a device has effects
            raise ConceptsError(f"{path.name} is not a regular file.")
        f = os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")  # a FIFO swapped in opens at once
    except OSError as e:
        raise ConceptsError(f"{path.name}: {(e.strerror or str(e)).lower()}.") from None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise ConceptsError(f"{path.name} is not a regular file.")
    return f


def _read_bounded(f: BinaryIO, name: str, max_bytes: int) -> bytes:
    """The rest of `f`, refused unread when its size is over `max_bytes` (and if it grew past them since)."""
    size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
        raise ConceptsError(f"{name} has {size:,} bytes, more than the {max_bytes:,} it may have here.")
    try:
        data = f.read(max_bytes + 1 - f.tell())
    except OSError as e:
        raise ConceptsError(f"{name}: {(e.strerror or str(e)).lower()}.") from None
    if f.tell() > max_bytes:
        raise ConceptsError(f"{name} has more than the {max_bytes:,} bytes it may have here.")
    return data


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`, its size checked before it is read. Raises
    ConceptsError in one sentence."""
    with _opened_regular(path) as f:
        return _read_bounded(f, path.name, max_bytes)


def _header(f: BinaryIO, name: str) -> tuple[bytes, dict[str, Any]]:
    """A safetensors file's first bytes and its JSON header, read from `f` with the header's length and nesting
    bounded."""
    size = os.fstat(f.fileno()).st_size
    first = f.read(8)
    length = int.from_bytes(first, "little") if len(first) == 8 else -1
    if not 0 < length <= min(HEADER_BYTES, size - 8):
        raise ConceptsError(f"{name} is not a concepts file (no safetensors header).")
    raw = f.read(length)
    try:
        header = bounded_json.loads(raw.decode("utf-8"), 4)
    except (UnicodeDecodeError, ValueError):
        raise ConceptsError(f"{name} is not a concepts file (its header is not JSON of tensors).") from None
    if not isinstance(header, dict):
        raise ConceptsError(f"{name} is not a concepts file (its header is not JSON of tensors).")
    return first + raw, header


def _declared(header: dict[str, Any], key: str) -> tuple[int, ...] | None:
    shape = header.get(key, {}).get("shape") if isinstance(header.get(key), dict) else None
    ok = isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    return tuple(shape) if ok else None


def read_concepts(path: Path, memory: int | None = None) -> Concepts:
    """concepts.safetensors at `path`, checked before its tensors are read (a regular file, its header's format and
    F within `max_features` of its width, its size) and after (every tensor of its shape and finite, norm_scale
    > 0, k in 1..F, a layer >= 0). Raises ConceptsError."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    with _opened_regular(path) as f:
        head, header = _header(f, path.name)
        shape = _declared(header, "W_enc")
        if shape is None or len(shape) != 2 or 0 in shape:
            raise ConceptsError(f"{path.name} is damaged: it has no encoder of a known shape.")
        num_features, d_model = shape
        bound = max_features(d_model, memory)
        if num_features > bound:
            raise ConceptsError(f"{path.name} declares {num_features:,} features; concepts of width {d_model:,} may "
                                f"have at most {bound:,} on this machine.")
        data = head + _read_bounded(f, path.name, concepts_file_bytes(num_features, d_model) + HEADER_BYTES)
    metadata = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    if metadata.get("format") != FORMAT:
        raise ConceptsError(f"{path.name} is not a ViT Lens concepts file (its format is {metadata.get('format')!r}).")
    try:
        tensors = load(data)
        layer, k = int(metadata["layer"]), int(metadata["k"])
        model, weights = str(metadata["model"]), str(metadata.get("weights", ""))
    except (SafetensorError, KeyError, ValueError) as e:
        raise ConceptsError(f"{path.name} is damaged ({str(e)[:200]}).") from None
    expected = {"W_enc": (num_features, d_model), "b_enc": (num_features,), "W_dec": (d_model, num_features),
                "b_pre": (d_model,), "norm_mean": (d_model,), "norm_scale": ()}
    wrong = [key for key, want in expected.items() if key not in tensors or tuple(tensors[key].shape) != want]
    if wrong:
        raise ConceptsError(f"{path.name} is damaged: {', '.join(wrong)} missing or of the wrong shape.")
    if not all(bool(torch.isfinite(tensors[key]).all()) for key in expected):
        raise ConceptsError(f"{path.name} is damaged: it holds values that are not finite (NaN or infinity).")
    scale = float(tensors["norm_scale"])
    if scale <= 0:
        raise ConceptsError(f"{path.name} is damaged: its norm_scale is {scale:g}, not a positive number.")
    if not 1 <= k <= num_features or layer < 0:
        raise ConceptsError(f"{path.name} is damaged: k = {k} or layer {layer} is out of range.")
    sae = TopKSAE(d_model, num_features, k)
    sae.load_state_dict({"W_enc": tensors["W_enc"].float(), "b_enc": tensors["b_enc"].float(),
                         "decoder": tensors["W_dec"].float().T.contiguous(), "b_pre": tensors["b_pre"].float()})
    return Concepts(sae.eval(), Normalisation(tensors["norm_mean"].float().numpy(), scale), model, weights, layer)


def load_concepts(path: str | Path) -> Concepts:
    """A concepts.safetensors (or the folder that holds it), checked as the app checks it (`read_concepts`).
    Raises ConceptsError."""
    path = Path(path)
    path = path / CONCEPTS_FILE if path.is_dir() else path
    try:
        return read_concepts(path)
    except ConceptsError as e:
        raise ConceptsError(f"{path.parent}: {e}") from None


def _bounded_json(path: Path, limit: int, depth: int) -> Any:
    """The JSON of the regular file at `path`, read only if at most `limit` bytes, nested at most `depth` deep.
    Raises ConceptsError naming the file."""
    data = read_regular(path, limit)
    try:
        return bounded_json.loads(data.decode("utf-8"), depth)
    except bounded_json.NestingError as e:
        raise ConceptsError(f"{path.name} is damaged: {e}.") from None
    except (UnicodeDecodeError, ValueError):
        raise ConceptsError(f"{path.name} is damaged: it is not JSON.") from None


def read_summary_checked(path: Path, num_features: int) -> dict[str, Any]:
    """concepts.json at `path` ({} where there is none), its size bounded by F and its nesting by SUMMARY_DEPTH,
    checked by `check_summary` (the grid aside). Raises ConceptsError."""
    if not os.path.lexists(path):
        return {}
    summary = _bounded_json(path, 2**20 + num_features * SUMMARY_FEATURE_BYTES, SUMMARY_DEPTH)
    check_summary(summary, num_features, None, path.name)
    return summary


def _number(value: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


def _count(value: Any, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < high


def check_summary(summary: Any, num_features: int, grid: tuple[int, int] | None, name: str = SUMMARY_FILE) -> None:
    """concepts.json's content as docs/spec/interface.md ("Concepts") gives it, for F features: an object; fvu,
    spliced_top1_agreement (0..1), held_out_images, steerable_share and stable_share (0..1) and stability (-1..1)
    numbers where present; folder a string; at most F features, each {index, firing_rate (0..1), mean_activation
    (>= 0), steers (a bool) and stability (-1..1) where present, top: at most MAX_TOP {file (a string), row, col (in the
    grid, when `grid` is given), activation}}. Raises ConceptsError naming the first part that is not."""
    def refuse(what: str) -> ConceptsError:
        return ConceptsError(f"{name} is damaged: {what}.")

    if not isinstance(summary, dict):
        raise refuse("it is not a JSON object")
    for key, low, high in (("fvu", 0, math.inf), ("spliced_top1_agreement", 0, 1), ("held_out_images", 0, math.inf),
                           ("steerable_share", 0, 1), ("stability", -1, 1), ("stable_share", 0, 1)):
        if key in summary and not _number(summary[key], low, high):
            raise refuse(f"its {key} is not a number in range")
    if not isinstance(summary.get("folder", ""), str):
        raise refuse("its folder is not a path")
    features = summary.get("features", [])
    if not isinstance(features, list) or len(features) > num_features:
        raise refuse(f"its features are not a list of at most {num_features:,}")
    rows, cols = grid or (2**62, 2**62)
    for f, entry in enumerate(features):
        if not (isinstance(entry, dict) and entry.get("index", f) == f and _number(entry.get("firing_rate", 0), 0, 1)
                and _number(entry.get("mean_activation", 0), 0)):
            raise refuse(f"feature {f}'s entry is not one of its feature")
        if not (isinstance(entry.get("steers", False), bool) and _number(entry.get("stability", 0), -1, 1)):
            raise refuse(f"feature {f}'s steers or stability is not a yes/no and a cosine")
        top = entry.get("top", [])
        if not isinstance(top, list) or len(top) > MAX_TOP:
            raise refuse(f"feature {f}'s top patches are not a list of at most {MAX_TOP}")
        for t in top:
            if not (isinstance(t, dict) and isinstance(t.get("file"), str) and _count(t.get("row"), rows)
                    and _count(t.get("col"), cols) and _number(t.get("activation"))):
                raise refuse(f"a top patch of feature {f} is not a file and a patch of this model's grid")


# ----------------------------------------------------------------------------------------------
# A folder, opened


@dataclass(frozen=True)
class ConceptsFolder:
    """A concepts folder, read and checked."""

    folder: Path  # the concepts' folder (absolute)
    concepts: Concepts
    summary: dict[str, Any]  # concepts.json ({} where there is none)
    images: Path | None  # the folder the concepts were learned from (concepts.json's, relative to `folder`)


def open_folder(folder: Path, memory: int | None = None) -> ConceptsFolder:
    """The concepts in `folder` (absolute), checked (`read_concepts`, `read_summary_checked`). Raises ConceptsError."""
    found = read_concepts(folder / CONCEPTS_FILE, memory)
    summary = read_summary_checked(folder / SUMMARY_FILE, found.sae.num_features)
    images = summary.get("folder") or None
    return ConceptsFolder(folder, found, summary, folder / images if images else None)


def check_for_model(opened: ConceptsFolder, num_layers: int, grid: tuple[int, int]) -> None:
    """The concepts' layer within the model's blocks and their top patches within its grid. Raises ConceptsError."""
    layer = opened.concepts.layer
    if layer >= num_layers:
        raise ConceptsError(f"These concepts are of block {layer}; this model has blocks 0..{num_layers - 1}.")
    check_summary(opened.summary, opened.concepts.sae.num_features, grid)


def image_path(images: Path | None, file: str) -> Path | None:
    """The image a top patch names under `images`, or None for a name that could lead out of it (absolute, with a
    `..`, a NUL, too long): never read. Links inside the folder are followed as `vit-lens concepts` followed them."""
    parts = Path(file).parts if isinstance(file, str) and 0 < len(file) <= MAX_PATH_CHARS and "\0" not in file else ()
    if images is None or not parts or Path(file).is_absolute() or Path(file).drive or ".." in parts:
        return None
    return images / file


def outside_files(images: Path | None, top: Sequence[Mapping[str, Any]]) -> int:
    """How many of a feature's top patches name a file outside `images` (skipped, never read)."""
    return sum(image_path(images, t["file"]) is None for t in top)


# ----------------------------------------------------------------------------------------------
# A circuit across blocks (DIR/circuit.json beside DIR/layer-L)

CIRCUIT_FILE = "circuit.json"
CIRCUIT_DEPTH = 4  # {"edges": [{"from": {...}}]} is 4 levels deep
CIRCUIT_EDGE_BYTES = 400  # an edge's entry, indented as the command writes it, with room to spare
CIRCUIT_EDGES_PER_FEATURE = 10  # vit_core.concepts.circuit.EDGES_PER_FEATURE
CIRCUIT_MAX_LAYERS = 3


def circuit_beside(folder: Path, layer: int) -> Path | None:
    """The circuit.json of the run whose block `layer` is the concepts folder `folder` (DIR/layer-L), or None."""
    path = folder.parent / CIRCUIT_FILE
    return path if folder.name == f"layer-{layer}" and os.path.lexists(path) else None


def read_circuit(path: Path, num_features: int) -> dict[str, Any]:
    """circuit.json at `path`, its size bounded by F (the features of the largest dictionary it may join) and its
    nesting by CIRCUIT_DEPTH, checked by `check_circuit` with every block's F taken as `num_features`. Raises
    ConceptsError."""
    limit = 2**20 + CIRCUIT_EDGE_BYTES * CIRCUIT_EDGES_PER_FEATURE * num_features * (CIRCUIT_MAX_LAYERS - 1)
    circuit = _bounded_json(path, limit, CIRCUIT_DEPTH)
    layers = circuit.get("layers") if isinstance(circuit, dict) else None
    check_circuit(circuit, {layer: num_features for layer in layers} if isinstance(layers, list)
                  and all(isinstance(layer, int) for layer in layers) else {}, path.name)
    return circuit


def check_circuit(circuit: Any, num_features: Mapping[int, int], name: str = CIRCUIT_FILE) -> None:
    """circuit.json's content as docs/spec/interface.md ("Concepts") gives it: an object whose layers are 2 to
    CIRCUIT_MAX_LAYERS increasing blocks, each a key of `num_features` (block -> F); its edges a list of at most
    CIRCUIT_EDGES_PER_FEATURE per feature of each block but the first, each {from: {layer, feature}, to: {layer,
    feature}, attribution, removal_effect} from one listed block to the next, features below their block's F, the
    attribution finite and the removal effect finite and at most 1. Raises ConceptsError naming the first part that
    is not."""
    def refuse(what: str) -> ConceptsError:
        return ConceptsError(f"{name} is damaged: {what}.")

    if not isinstance(circuit, dict):
        raise refuse("it is not a JSON object")
    layers = circuit.get("layers")
    if not (isinstance(layers, list) and 2 <= len(layers) <= CIRCUIT_MAX_LAYERS
            and all(_count(layer, 2**31) for layer in layers)
            and all(b > a for a, b in zip(layers, layers[1:], strict=False)) and all(layer in num_features for layer in layers)):
        raise refuse(f"its layers are not 2 to {CIRCUIT_MAX_LAYERS} increasing blocks of its dictionaries")
    edges = circuit.get("edges")
    most = CIRCUIT_EDGES_PER_FEATURE * sum(num_features[layer] for layer in layers[1:])
    if not isinstance(edges, list) or len(edges) > most:
        raise refuse(f"its edges are not a list of at most {most:,}")
    following = dict(zip(layers, layers[1:], strict=False))
    for number, edge in enumerate(edges):
        ends = [edge.get(end) if isinstance(edge, dict) else None for end in ("from", "to")]
        if not (all(isinstance(end, dict) and end.get("layer") in num_features
                    and _count(end.get("feature"), num_features[end["layer"]]) for end in ends)
                and following.get(ends[0]["layer"]) == ends[1]["layer"]
                and _number(edge.get("attribution")) and _number(edge.get("removal_effect"), high=1)):
            raise refuse(f"edge {number} is not one from a feature of a listed block to one of the next, with its "
                         "attribution and removal effect")
