"""Weights files a user gives (.safetensors, .pth/.pt/.bin, JAX .npz): read without running code, checked against
what they declare before anything is read in full, and loaded into the model built for them at random.

A weights file says what it holds (a safetensors header, a zip directory of .npy headers, tensor metadata in a
pickle); these checks hold the declarations against the bytes really present and against the model's own
tensors, so that a small file can't make the loader allocate gigabytes before refusing it (a head is made to the
file's class count only once that count is checked). Every refusal is one sentence (a WeightsError) that names the
file, never the server's path.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from timm.models.vision_transformer import VisionTransformer

from .. import bounded_json
from ..errors import WeightsError
from .labels import MAX_CLASSES

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
PICKLE_SUFFIXES = (".pth", ".pt", ".bin")  # torch.save checkpoints: their tensors are checked once read
# A safetensors header lists every tensor: vit_gigantic_patch14_clip_224 (the largest timm ViT) has 585 tensors in a
# 57 KB header, ViT-H/14 390 in 37 KB (built on 'meta', float32). The caps are far above those, and far below
# safetensors' own limit of 100 MB, a header that takes minutes and gigabytes (1.67 M empty tensors) to refuse.
SAFETENSORS_MAX_HEADER_BYTES = 4 * 2**20  # read and parsed (nesting checked first) in well under a second
SAFETENSORS_MAX_TENSORS = 10_000
SAFETENSORS_MAX_DEPTH = 8  # {name: {"shape": [...], ...}} is 3 levels deep
NPZ_MAX_MEMBERS = 4096  # a ViT-H JAX checkpoint with its optimizer state has about 1,500 arrays
# The item sizes of safetensors' dtypes (its spec), to check declared shapes against the bytes present.
_SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def load_weights(model: VisionTransformer, path: Path, name: str, *, keep_head: bool) -> None:
    """Check the weights file `path`, read it once and load it into `model` (timm's random init of `name`), whose
    head takes the file's class count first unless `keep_head` (the caller asked for a class count itself).
    Declared shapes are checked first (headers only), then the file is read (it can be 350 MB) and its tensors go in.
    """
    check_weights_file(path, model)
    state = None if path.suffix.lower() == ".npz" else read_state_dict(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        check_state_dict(path, state, model)
    classes = head_classes(state) if state is not None else None
    if classes is not None and classes != model.num_classes and not keep_head:
        with torch.random.fork_rng():  # the new head's init is overwritten by the file: the global RNG stays as it was
            model.reset_classifier(classes)
    load_weights_into(model, path, state, name)
    check_finite(model, path)


def check_finite(model: torch.nn.Module, path: Path) -> None:
    """Refuse weights that hold NaN or infinite values, naming the first such tensor: such a model answers NaN
    logits, which every analysis would turn into numbers that look real (a top-1 of class 0, an accuracy)."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WeightsError(f"{path.name}: tensor {name[:80]!r} holds NaN or infinite values (a diverged training "
                               "run or a damaged file): refused.")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors / .pth / .pt / .bin file, never unpickling arbitrary objects."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WEIGHT_SUFFIXES:
        raise WeightsError(f"{path.name}: unsupported weights format; use {', '.join(WEIGHT_SUFFIXES)}.")
    if not path.is_file():  # the name only: an uploaded file's path is the server's business
        raise WeightsError(f"{path.name}: no such weights file.")
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightsError(f"{path.name} is not a valid safetensors file (truncated or damaged?): {e}") from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types; all mean "refused"
        import pickle

        if isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e) or "Unsupported global" in str(e):
            raise WeightsError(
                f"{path.name} was refused: it contains Python objects, not only tensors, and loading it "
                "could run code. ViT Lens loads weights safely (weights_only); convert it to safetensors."
            ) from e
        raise WeightsError(f"{path.name} is not a PyTorch checkpoint ({_what_it_looks_like(path)}).") from e
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path.name} holds no state dict of tensors.")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _what_it_looks_like(path: Path) -> str:
    """What a file that torch.load refused seems to be, from its first bytes: text, an archive torch can't read, a
    pickle it can't read, or something else."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        return f"it can't be read: {e.strerror or e}"
    if not head:
        return "it is empty"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive without torch.save's records, or damaged"
    if head[:1] == b"\x80":
        return "a pickle that is damaged or cut short"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        text = head[:e.start].decode("utf-8") if e.start > len(head) - 4 else ""
    if text and all(c.isprintable() or c in "\t\r\n" for c in text):
        return "it looks like text"
    return "neither the zip archive torch.save writes nor a pickle"


def head_classes(state: dict[str, torch.Tensor]) -> int | None:
    head = state.get("head.weight")
    return int(head.shape[0]) if head is not None and head.ndim == 2 else None


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Declared shapes of a .safetensors file, from its JSON header only, each checked against the bytes
    it points at. Raises WeightsError for a header that is damaged or claims more than the file holds."""
    def refuse(why: str) -> WeightsError:
        return WeightsError(f"{path.name} is not a valid safetensors file ({why}).")

    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise refuse("too short")
        header_len = int.from_bytes(head, "little")
        if header_len > SAFETENSORS_MAX_HEADER_BYTES:  # from the first 8 bytes: nothing more is read
            raise WeightsError(f"{path.name} has a safetensors header of {header_len / 2**20:,.1f} MB; ViT Lens reads "
                               f"headers of at most {SAFETENSORS_MAX_HEADER_BYTES // 2**20} MB (a ViT's is under 100 KB).")
        if header_len > size - 8:
            raise refuse("its header is larger than the file")
        try:
            header = bounded_json.loads(f.read(header_len).decode("utf-8"), SAFETENSORS_MAX_DEPTH)
        except bounded_json.NestingError as e:
            raise refuse(f"its header is not a table of tensors: {e}") from e
        except (UnicodeDecodeError, ValueError) as e:
            raise refuse("its header is not JSON") from e
    if not isinstance(header, dict):
        raise refuse("its header is not a table of tensors")
    tensors = len(header) - ("__metadata__" in header)
    if tensors > SAFETENSORS_MAX_TENSORS:
        raise WeightsError(f"{path.name} declares {tensors:,} tensors; ViT Lens loads at most "
                           f"{SAFETENSORS_MAX_TENSORS:,} (a ViT has under 1,000).")
    data_len = size - 8 - header_len
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            itemsize = _SAFETENSORS_ITEMSIZE[entry["dtype"]]
            shape, offsets = entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError) as e:
            raise refuse(f"tensor {name[:80]!r} is not described properly") from e
        if not _counts(shape) or not _counts(offsets) or len(offsets) != 2:  # 1e400, -1, "3", 2.5 are not sizes
            raise refuse(f"tensor {name[:80]!r} is not described properly (its shape and offsets must be whole numbers)")
        shape, (begin, end) = tuple(shape), offsets
        if not begin <= end <= data_len or end - begin != math.prod(shape) * itemsize:
            raise refuse(f"tensor {name[:80]!r} declares {shape} but the file holds {max(end - begin, 0)} bytes for it")
        shapes[str(name)] = shape
    return shapes


def _counts(values: object) -> bool:
    """A JSON list of non-negative integers (a shape, data offsets); JSON's true and false are not counts."""
    return isinstance(values, list) and all(type(v) is int and v >= 0 for v in values)


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Declared shapes of a .npz archive's arrays, from the zip directory and each .npy header: only the
    first bytes of each member are inflated. Raises WeightsError for a damaged archive or a non-numeric array."""
    import zipfile

    import numpy as np

    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if len(members) > NPZ_MAX_MEMBERS:
                raise WeightsError(f"{path.name} holds {len(members)} arrays; a ViT checkpoint has far fewer.")
            for member in members:
                with archive.open(member) as f:
                    npy = np.lib.format
                    version = npy.read_magic(f)
                    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read_header(f)
                if dtype.hasobject or dtype.itemsize == 0:
                    raise WeightsError(f"{path.name}: array {member.filename[:80]!r} is not numeric.")
                shapes[member.filename.removesuffix(".npy")] = tuple(int(d) for d in shape)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise WeightsError(f"{path.name} is not a valid .npz archive (truncated or damaged?).") from e
    return shapes


def _architecture_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def checkhead_classes(path: Path, classes: int) -> None:
    """Refuse a head of more than MAX_CLASSES classes (or none) before a model is built with it. A head of
    the wrong width is left to the full mismatch report of the strict load: its size is bounded by then."""
    if not 1 <= classes <= MAX_CLASSES:
        raise WeightsError(f"{path.name} declares a head of {classes:,} classes; ViT Lens loads 1 to {MAX_CLASSES:,}.")


def check_declared_shapes(path: Path, shapes: dict[str, tuple[int, ...]], model: torch.nn.Module) -> None:
    """Every tensor of the file no larger than the architecture could use: its largest tensor four
    times over (a position embedding trained at a larger size is resampled), or a full-size head."""
    arch = _architecture_shapes(model)
    width = getattr(model, "num_features", 4096)
    largest = max(math.prod(s) for s in arch.values()) * 4 if arch else 2**28
    limit = max(largest, MAX_CLASSES * width)
    for name, shape in shapes.items():
        if math.prod(shape) > limit:
            raise WeightsError(
                f"{path.name}: {name[:80]!r} declares {math.prod(shape):,} values, more than "
                f"{model.__class__.__name__} could use ({limit:,}): refused before loading."
            )
    total = sum(math.prod(s) for s in shapes.values())
    if arch and total > 4 * sum(math.prod(s) for s in arch.values()) + limit:
        raise WeightsError(f"{path.name} declares {total:,} values in all, far more than the architecture holds: refused.")


def check_torch_archive(path: Path) -> None:
    """A PyTorch checkpoint (a zip since torch 1.6) whose records would inflate beyond the file's own size
    is refused unread: torch.save stores records uncompressed, so only a crafted file compresses them."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return  # the legacy format: torch reads it as it comes
    try:
        with zipfile.ZipFile(path) as archive:
            inflated = sum(member.file_size for member in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise WeightsError(f"{path.name} could not be read as a PyTorch checkpoint (damaged zip).") from e
    if inflated > path.stat().st_size:
        raise WeightsError(f"{path.name} holds compressed records that would inflate to {inflated:,} bytes; "
                           "torch.save writes none, so it was refused unread.")


def check_weights_file(path: Path, model: torch.nn.Module) -> None:
    """Check a weights file's declarations against `model` before it is read in full (a pickled checkpoint: its
    archive only; `check_state_dict` checks its tensors once read)."""
    suffix = path.suffix.lower()
    if not path.is_file():
        return  # read_state_dict says so
    if suffix in PICKLE_SUFFIXES:
        check_torch_archive(path)
        return
    if suffix == ".safetensors":
        shapes = safetensors_shapes(path)
        check_declared_shapes(path, shapes, model)
        head = shapes.get("head.weight")
        if head is not None and len(head) == 2:
            checkhead_classes(path, head[0])
        return
    if suffix == ".npz":
        shapes = npz_shapes(path)
        check_declared_shapes(path, shapes, model)
        kernel = next((s for k, s in shapes.items() if k.endswith("head/kernel") and len(s) == 2), None)
        if kernel is not None:
            checkhead_classes(path, kernel[1])  # JAX: (D, C)


def check_state_dict(path: Path, state: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """The checks of `check_weights_file` for a pickled checkpoint, once its tensors are read (their data is
    no larger than the file): each tensor's view must lie within its own storage (a pickle can declare a huge
    tensor over one stored value, stride 0), and the shapes must fit the architecture."""
    for name, tensor in state.items():
        needed = tensor.numel() * tensor.element_size()
        if needed > tensor.untyped_storage().nbytes():
            raise WeightsError(f"{path.name}: {name[:80]!r} declares {tuple(tensor.shape)} over less data: refused.")
    check_declared_shapes(path, {k: tuple(v.shape) for k, v in state.items()}, model)
    classes = head_classes(state)
    if classes is not None:
        checkhead_classes(path, classes)


def load_weights_into(model: VisionTransformer, path: Path, state: dict[str, torch.Tensor] | None, name: str) -> None:
    """Load the weights file `path` into `model`: `state` is its tensors as already read (None for a JAX .npz)."""
    if state is None:  # the original Google JAX checkpoints (.npz), through timm's converter
        try:
            model.load_pretrained(str(path))
        except Exception as e:  # timm's converter raises many types; its messages may hold the server's path
            raise WeightsError(f"{path.name} is not a JAX ViT checkpoint that fits {name}: "
                               f"{str(e).replace(str(path), path.name)}") from e
        return
    from timm.models.vision_transformer import checkpoint_filter_fn

    try:
        state = checkpoint_filter_fn(state, model)  # timm's own conversions (e.g. pos_embed resampling)
    except Exception as e:
        raise WeightsError(f"{path.name} does not fit {name}: {e}") from e
    result = _strict_load(model, state)
    if result:
        raise WeightsError(f"{path.name} does not fit {name}: {result}")


def _first_three(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")


def _strict_load(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Load `state` into `model`; '' if every tensor fit exactly, else a one-line description of the
    mismatch (the model is then partly loaded: discard it).

    torch's `load_state_dict(strict=False)` reports missing and unexpected keys; tensors of the wrong
    shape make it raise instead, so those are found (and left out) first.
    """
    own = model.state_dict()
    wrong_shape = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    report = model.load_state_dict({k: v for k, v in state.items() if k not in wrong_shape}, strict=False)
    missing = [k for k in report.missing_keys if k not in wrong_shape]
    problems = [f"{len(keys)} {what} tensors ({_first_three(keys)})"
                for what, keys in (("missing", missing), ("unexpected", report.unexpected_keys)) if keys]
    if wrong_shape:
        shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong_shape[:3]]
        problems.append(f"shape mismatch: {'; '.join(shapes)} (file vs model)")
    return "; ".join(problems) + ". Is it the right architecture?" if problems else ""
