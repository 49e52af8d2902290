"""One forward pass with forward hooks, returned as one frozen result.

`run_with_capture` is the library's entry point: preprocess the image as the model's pretrained config
says, run one hooked forward under the model's lock (`LoadedModel.lock`: the hooks and the `fused_attn`
flags are per-model state), and return every intermediate as CPU float32 numpy with the batch axis
removed, made read-only, so it can be cached and shared without copies. The hooks live only inside the
pass (`vit_core.hooks`). A class server runs the same pass through `vit_core.serving.serve_capture`,
which builds its result with `capture_of_pass` below, so both give the same `Capture`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import torch
from PIL import Image

from .analyses import softmax
from .errors import CaptureError
from .hooks import intermediates_kept
from .images import to_rgb
from .loading.model import Geometry, LoadedModel
from .runtime.devices import finished, full_float32, on_model_device, to_host
from .sites import SiteError, recorded_sites, site_names, sites_recorded


@dataclass(frozen=True)
class Capture:
    """Everything one forward pass showed. Shapes: T tokens, D width, L layers, H heads, C classes."""

    model_name: str
    geometry: Geometry
    input_image: np.ndarray  # uint8 (H, W, 3): the exact crop the model saw
    input_tensor: np.ndarray  # float32 (3, H, W): normalised input of patch_embed
    patch_embeddings: np.ndarray  # float32 (N, D): patch_embed output, before prefix tokens and position
    tokens: np.ndarray  # float32 (L+1, T, D): entering block 0, then after each block (before the final norm)
    pattern: np.ndarray  # float32 (L, H, T, T): post-softmax attention, rows = queries
    final_tokens: np.ndarray  # float32 (T, D): after the final norm
    pre_logits: np.ndarray  # float32 (D',): input of the classifier head (pooled, fc_norm'ed)
    logits: np.ndarray  # float32 (C,)
    forward_seconds: float  # wall time of the hooked forward pass
    sites: Mapping[str, np.ndarray] = field(default_factory=dict)  # canonical site name -> array: those asked beyond the fields

    @property
    def probs(self) -> np.ndarray:
        return softmax(self.logits)  # (C,)

    def site(self, name: str) -> np.ndarray:
        """The array of site `name` (vit_core.sites; aliases too), with `*` for the block: every block's, stacked
        ((L, ...)). The default sites come from the fields above; the others only if the pass was asked for them.
        Raises SiteError naming the site when it doesn't exist on this model or wasn't recorded."""
        names = site_names(name, self.geometry.num_layers)
        arrays = [self._site(n) for n in names]
        return np.stack(arrays) if "*" in name else arrays[0]  # L x (...) -> (L, ...)

    def _site(self, name: str) -> np.ndarray:
        fields = {"embed": self.patch_embeddings, "norm": self.final_tokens, "pre_logits": self.pre_logits,
                  "logits": self.logits}
        if name in fields:
            return fields[name]
        if name in self.sites:
            return self.sites[name]
        _, b, part = name.split(".", 2)
        if part in ("in", "out"):
            return self.tokens[int(b) + (part == "out")]  # tokens[b] enters block b, tokens[b+1] leaves it
        if part == "attn.pattern":
            return self.pattern[int(b)]
        raise SiteError(f"site {name!r} was not recorded: ask for it with run_with_capture(loaded, image, sites=[{name!r}]) "
                        "or in the lens's sites.")


def preprocess(loaded: LoadedModel, image: Image.Image) -> tuple[np.ndarray, torch.Tensor]:
    """The crop the model sees (uint8 (H, W, 3)) and its normalised tensor ((1, 3, H, W)), through the
    model's eval transform (built once, at load time: `LoadedModel.crop_transform` / `tensor_transform`)."""
    crop = loaded.crop_transform(to_rgb(image))
    return np.asarray(crop, dtype=np.uint8).copy(), loaded.tensor_transform(crop).unsqueeze(0)  # (3, H, W) -> (1, 3, H, W)


def _frozen(t: torch.Tensor) -> np.ndarray:
    """`to_host(t)`, made read-only."""
    array = to_host(t)
    array.setflags(write=False)
    return array


def capture_of_pass(loaded: LoadedModel, crop: np.ndarray, x: torch.Tensor, logits: torch.Tensor,
                    store: dict[str, list[torch.Tensor]], seconds: float, sites: Iterable[str] = ()) -> Capture:
    """The frozen result of one hooked forward: `crop` (H, W, 3) and `x` (1, 3, H, W) as `preprocess` made them,
    `logits` (1, C) and `store` (key -> tensors in call order, keys `hooks.CAPTURED_KEYS` and the recorded `sites`)
    as the pass left them.
    Raises CaptureError if the model did not produce exactly one attention pattern per block."""
    geometry = loaded.geometry
    num_layers = geometry.num_layers
    patterns = store.get("pattern", [])
    if len(patterns) != num_layers:
        raise CaptureError(
            f"expected one attention pattern per block ({num_layers}), got {len(patterns)}: this model's "
            "attention does not run through timm's standard path."
        )
    tokens = store["tokens"]
    assert len(tokens) == num_layers + 1, f"{len(tokens)} token captures for {num_layers} blocks"
    pattern = torch.cat(patterns, dim=0)  # L x (1, H, T, T) -> (L, H, T, T)
    if pattern.shape[1:] != (geometry.num_heads, geometry.num_tokens, geometry.num_tokens):
        raise CaptureError(f"the attention patterns have shape {tuple(pattern.shape[1:])}, not (heads, tokens, tokens) = "
                           f"{(geometry.num_heads, geometry.num_tokens, geometry.num_tokens)}: this model's attention is not "
                           "one softmax per head.")
    crop.setflags(write=False)
    return Capture(
        model_name=loaded.name,
        geometry=geometry,
        input_image=crop,
        input_tensor=_frozen(x[0]),  # (3, H, W): the host input, not a copy back from the device
        patch_embeddings=_frozen(store["patch_embeddings"][0][0]),  # (1, N, D) -> (N, D)
        tokens=_frozen(torch.cat(tokens, dim=0)),  # (L+1) x (1, T, D) -> (L+1, T, D)
        pattern=_frozen(pattern),
        final_tokens=_frozen(store["final_tokens"][0][0]),  # (1, T, D) -> (T, D)
        pre_logits=_frozen(store["pre_logits"][0][0]),  # (1, D') -> (D',)
        logits=_frozen(logits[0]),  # (1, C) -> (C,)
        forward_seconds=seconds,
        sites={name: _frozen(store[name][0][0]) for name in sites},  # (1, ...) -> (...)
    )


def run_with_capture(loaded: LoadedModel, image: Image.Image, sites: Iterable[str] = ()) -> Capture:
    """Preprocess `image` as the model's pretrained config says, run one hooked forward pass, and
    return every intermediate as numpy; `sites` (vit_core.sites names, `*` for every block) are recorded
    on top of the default fields, and read with `Capture.site`.

    Safe to call from many threads on one shared `loaded`: passes take its lock, one at a time. Runs on
    the model's device in full float32 (`devices.full_float32`). Raises CaptureError if the model did not
    produce exactly one attention pattern per block, SiteError (before the pass) for a site not on this model.
    """
    model = loaded.model
    extra = recorded_sites(sites, loaded.geometry.num_layers)
    crop, x = preprocess(loaded, image)  # (H, W, 3), (1, 3, H, W) on the host
    store: dict[str, list[torch.Tensor]] = {}

    def keep(key: str, tensor: torch.Tensor) -> None:
        store.setdefault(key, []).append(tensor.detach())

    with loaded.lock, intermediates_kept(model, keep), sites_recorded(model, extra, keep), torch.inference_mode(), \
            full_float32(loaded.device):
        started = time.perf_counter()
        logits = model(on_model_device(model, x))  # (1, C), on the model's device
        finished(logits.device)  # a GPU runs asynchronously: time the pass, not its launch
        seconds = time.perf_counter() - started
    return capture_of_pass(loaded, crop, x, logits, store, seconds, extra)
