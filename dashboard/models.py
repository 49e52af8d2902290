"""Which model a session asks for, how it is built, and what to show when it can't be had. No Streamlit here.

The model list of the sidebar, the `ModelRequest` that names one model (its `key` identifies it in
every per-model and per-image cache key), the one definition of the tiny test model, and the memory
of models that failed to load. `dashboard.caches` caches the built models; scripts and tests build
the same models through `build_named_model`.

Environment variables (read when used, through `vit_core.settings`):
- `VIT_LENS_MODEL=<name>`: the model the app opens with (`settings.MODEL`).
- `VIT_LENS_MODEL=test-tiny`: a random-init 2-block `vit_tiny_patch16_224` (fast, offline); the
  dashboard tests use it.
- `VIT_LENS_RANDOM_INIT=on`: build every timm model with random weights instead of pretrained ones
  (offline benchmarks: same compute as the pretrained model); off, 0, false, no or unset: pretrained.
  A session can ask for one model's random weights itself, where its pretrained ones can't be had (the
  sidebar's "Load with random weights" button: `ModelRequest.random_weights`).
- `VIT_LENS_WEIGHTS_UPLOADS=off`: no "Your own weights file..." choice (a weights file is up to
  400 MB held in the server's memory per session, and a model built per file). On by default (one
  user on their own machine); off in docs/serving.md's class command.
- `VIT_LENS_ANY_MODEL=off`: the picker offers the fixed list only, and refuses any other name. On by
  default (one user): besides the list, any timm model of the ViT family by name, with its pretrained
  tags, or an `hf-hub:` id typed in (each a model built and held by the server; off for a class).
- `VIT_LENS_DEVICE=auto|cpu|cuda|cuda:N|mps`: where the server's models run (default auto: CUDA, then
  Apple MPS, then the CPU); `vit-lens dashboard --device D` sets it. Resolved once per value; a value
  this machine can't honour stops `dashboard.serve` at start with one line.

The start-up model is pinned: built once and kept by this module, so that a student hopping between
models, which evicts it from the dashboard's model cache (3 entries), costs the class no reload.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import timm
import torch

import vit_core
from vit_core import settings
from vit_core.loading import TEACHING_MODEL, teaching_model_available
from vit_core.loading.labels import MAX_LABEL_FILE_BYTES
from vit_core.loading.model import LoadedModel
from vit_core.runtime.devices import resolve_device
from vit_core.serving import shared_model

TEST_TINY = "test-tiny"
UPLOAD_WEIGHTS = "upload"  # the model choice "your own weights file"
MAX_WEIGHTS_MB = 400  # the largest listed architecture (ViT-B/16 at 384) is about 350 MB; = server.maxUploadSize
MAX_LABELS_MB = MAX_LABEL_FILE_BYTES // 2**20  # the label uploader's cap: vit_core's own limit on a label file
FAILURE_MEMORY_S = 60.0  # a model that failed to load is not retried for this long (the hub probe costs seconds)
MAX_MODEL_NAME = 200  # a typed model name longer than this is refused before timm sees it
# timm modules whose models are VisionTransformer with a linear patch embedding, the family load_model
# accepts (vit_core.loading.check_supported). vision_transformer_hybrid builds VisionTransformer too, but
# its tokens come from a CNN stem, not from P x P patches: the patch views would be wrong, so it is left out.
# A few models of these modules are still refused by load_model (dynamic image size, parallel blocks):
# telling them apart means building each one (about 80 s for all), so load_model says so when picked.
ANY_MODEL_MODULES = ("vision_transformer", "deit")

# The labels are what the sidebar's picker shows: each fits its 190 px at 1280 px and on a phone (longer ones were cut
# mid-word, "works offlir"), measured in the browser by tests/browser/test_explorer_layout_browser.py.
MODEL_CHOICES: dict[str, str] = {
    "vit_base_patch16_224": "ViT-B/16, ImageNet (default)",
    "vit_small_patch16_224": "ViT-S/16, small",
    "deit_small_distilled_patch16_224": "DeiT-S (distillation token)",
    "vit_base_patch32_224": "ViT-B/32 (32-pixel patches)",
    "vit_base_patch16_384": "ViT-B/16 at 384 x 384",
    "vit_base_patch16_siglip_224": "SigLIP B/16 (no class token)",
    TEACHING_MODEL: "Shapes ViT, works offline",
    UPLOAD_WEIGHTS: "Your own weights file...",
}


def weights_uploads_allowed() -> bool:
    """Whether sessions may upload their own weights files ($VIT_LENS_WEIGHTS_UPLOADS)."""
    return settings.WEIGHTS_UPLOADS.on()


def any_model_allowed() -> bool:
    """Whether the picker offers any ViT-family model by name or hf-hub id ($VIT_LENS_ANY_MODEL)."""
    return settings.ANY_MODEL.on()


def device_setting() -> str:
    """The server's device as set ($VIT_LENS_DEVICE, default auto)."""
    return settings.DEVICE.text()


@functools.lru_cache(maxsize=4)
def _resolved_device(setting: str) -> torch.device:
    return resolve_device(setting)


def server_device() -> torch.device:
    """The device every model of this server runs on, resolved once per setting.
    Raises vit_core.DeviceError (one sentence) for a value this machine can't honour."""
    return _resolved_device(device_setting())


@functools.lru_cache(maxsize=1)
def family_model_names() -> tuple[str, ...]:
    """Every timm model of ANY_MODEL_MODULES: each architecture, followed by its name with each pretrained
    tag (`vit_base_patch16_224.augreg2_in21k_ft_in1k`), sorted. Read from timm's registry once (no download)."""
    modules = list(ANY_MODEL_MODULES)
    names = set(timm.list_models(module=modules)) | set(timm.list_models(module=modules, pretrained=True))
    return tuple(sorted(names))  # '.' sorts before '_': an architecture's tags follow it


def model_choices() -> dict[str, str]:
    """The sidebar's model list; the start-up model from $VIT_LENS_MODEL first if it isn't listed;
    no weights upload unless the server allows it."""
    start = settings.MODEL.text()
    choices = {k: v for k, v in MODEL_CHOICES.items() if k != UPLOAD_WEIGHTS or weights_uploads_allowed()}
    if start in choices:
        return choices
    label = "Test model (tiny, random init)" if start == TEST_TINY else start
    return {start: label, **choices}


def picker_options() -> list[str]:
    """The Model picker's options: `model_choices()`, then, where any model is allowed, every other
    model of the ViT family (`family_model_names`)."""
    options = list(model_choices())
    if any_model_allowed():
        listed = set(options)
        options += [name for name in family_model_names() if name not in listed]
    return options


def typed_name_refusal(name: str) -> str | None:
    """Why a model name outside the fixed list can't be asked for here, or None if load_model may judge it
    (it refuses non-ViTs, unknown names and, offline, missing weights with its own sentence)."""
    if not any_model_allowed():
        return "this server offers only the models in its list."
    if len(name) > MAX_MODEL_NAME:
        return f"a model name is at most {MAX_MODEL_NAME} characters."
    return None


def random_init_forced() -> bool:
    """Whether every timm model is built with random weights ($VIT_LENS_RANDOM_INIT)."""
    return settings.RANDOM_INIT.on()


def match_typed_name(typed: str, choices: dict[str, str], options: list[str]) -> tuple[str, int] | None:
    """The model a text typed into the picker means, and how many models it matches; None if it matches none.

    Streamlit hands over what was typed when Enter is pressed (`accept_new_options`), not the option the list
    showed first, so part of a name ("dino", "vit_small", "B/16") would otherwise be taken as a model name of its
    own. Matching ignores case; every word typed must be part of the model's name or of its label in `choices`.
    An exact name or label wins; else the first match in `options`'s order among the listed models (`choices`),
    else the shortest other name (an architecture before its `name.tag` variants, alphabetical on a tie).
    `hf-hub:` ids are not matched: they name a model outside the list."""
    text = typed.strip().casefold()
    words = text.split()
    if not words or text.startswith("hf-hub:"):
        return None
    listed = [n for n in options if n in choices and n != UPLOAD_WEIGHTS]
    searchable = [(n, f"{n} {choices.get(n, '')}".casefold()) for n in [*listed, *(n for n in options if n not in choices)]]
    for name, _ in searchable:
        if text in (name.casefold(), choices.get(name, "").casefold()):
            return name, 1
    found = [name for name, where in searchable if all(word in where for word in words)]
    if not found:
        return None
    first_listed = [n for n in found if n in choices]
    best = first_listed[0] if first_listed else min(found, key=lambda n: (len(n), n))
    return best, len(found)


def pretrained_unavailable(name: str, error: Exception) -> bool:
    """Whether `error`, raised loading timm model `name` with its pretrained weights, means only that those weights
    can't be had (offline, or timm has none for it): the architecture itself can then be built with random weights."""
    if name in (TEACHING_MODEL, TEST_TINY, UPLOAD_WEIGHTS) or name.startswith("hf-hub:"):
        return False  # the bundled models need no download; a hub id's architecture comes from the hub too
    if isinstance(error, vit_core.OfflineError):
        return True
    if not isinstance(error, vit_core.ModelError) or name not in family_model_names():
        return False
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except (RuntimeError, ValueError):
        return False
    return not getattr(cfg, "hf_hub_id", None)  # timm knows the architecture, with no weights to download


@dataclass(frozen=True)
class ModelRequest:
    name: str  # a timm name (maybe with a pretrained tag), an "hf-hub:" id, TEACHING_MODEL or TEST_TINY
    weights_path: str = ""  # a local copy of uploaded weights
    labels_path: str = ""
    weights_id: str = ""  # sha256 of the uploaded weights (+ labels)
    # (saved file name, name as uploaded) of each uploaded file: messages about a file use the user's name
    uploaded_names: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    random_weights: bool = False  # the session asked for this timm model's random weights (structure only)

    def for_user(self, message: str) -> str:
        """`message` (about this request's files) with each saved file's name replaced by the name it was uploaded as."""
        for saved, uploaded in self.uploaded_names:
            message = message.replace(saved, uploaded)
        return message

    def shown(self, loaded: LoadedModel) -> LoadedModel:
        """`loaded` as the session shows it: an uploaded weights file named as the user's file (`loaded.weights` says
        "file: <its digest>.safetensors", the name it is saved and shared under), not the server's copy."""
        if not self.uploaded_names:
            return loaded
        return replace(loaded, weights=self.for_user(loaded.weights))  # the same model, lock and all

    @property
    def key(self) -> str:
        """Identifies the model in every per-model / per-image cache key."""
        return f"{self.name}|{self.weights_id or ('random' if self.random_init else 'pretrained')}"

    @property
    def random_init(self) -> bool:
        return ((random_init_forced() or self.random_weights) and not self.weights_path
                and self.name not in (TEACHING_MODEL, TEST_TINY))

    @property
    def load_args(self) -> tuple[str, str, str, str, bool]:
        """Everything that decides which model is built: the model cache's key."""
        return self.name, self.weights_path, self.labels_path, self.weights_id, self.random_init


def build_named_model(name: str, random_init: bool = False) -> LoadedModel:
    """A model by name as the dashboard shows it, on the server's device: TEST_TINY, TEACHING_MODEL, a timm
    name (with or without a pretrained tag) or an hf-hub id."""
    device = server_device()
    if name == TEST_TINY:
        return vit_core.load_model("vit_tiny_patch16_224", pretrained=False, depth=2, device=device)
    if name == TEACHING_MODEL:
        return vit_core.load_model(TEACHING_MODEL, device=device)
    return vit_core.load_model(name, pretrained=not random_init, device=device)


_pinned: dict[tuple[str, bool], LoadedModel] = {}  # the start-up model, at most one entry
_pinned_lock = threading.Lock()


def pinned_startup_model(name: str, random_init: bool) -> LoadedModel:
    """The start-up model ($VIT_LENS_MODEL), built once per process and kept here whatever the model
    cache evicts. A different start-up model (tests change the variable) replaces it."""
    key = (name, random_init)
    with _pinned_lock:  # built once even when every session asks at the same moment
        if key not in _pinned:
            loaded = shared_model(build_named_model(name, random_init))
            _pinned.clear()
            _pinned[key] = loaded
        return _pinned[key]


def build_model(name: str, weights_path: str, labels_path: str, random_init: bool) -> LoadedModel:
    """The model of a request (see `ModelRequest.load_args`), as the server shares it among sessions
    (vit_core.serving.shared_model: explanation jobs let new images' forwards in first). Raises vit_core errors with
    a message for the user."""
    if name == settings.MODEL.text() and not (weights_path or labels_path) and random_init == random_init_forced():
        return pinned_startup_model(name, random_init)  # (a session's random weights of it are not pinned)
    if not (weights_path or labels_path):
        return shared_model(build_named_model(name, random_init))
    kwargs: dict[str, Any] = {"labels": labels_path} if labels_path else {}
    kwargs["device"] = server_device()
    if name == TEST_TINY:  # its architecture, as build_named_model makes it
        name, kwargs["depth"] = "vit_tiny_patch16_224", 2
    # A file is never dropped without a word: the teaching model refuses one in a sentence (vit_core.load_model).
    if weights_path:
        return shared_model(vit_core.load_model(name, weights=weights_path, **kwargs))
    return shared_model(vit_core.load_model(name, pretrained=not random_init, **kwargs))


def fallback_request() -> tuple[ModelRequest, str]:
    """What to show when the chosen model can't be had: the bundled model, else an untrained one."""
    if teaching_model_available():
        return ModelRequest(TEACHING_MODEL), f"Showing the bundled {MODEL_CHOICES[TEACHING_MODEL]!r} model instead."
    return (ModelRequest(TEST_TINY),
            "The bundled teaching model is missing too, so a tiny RANDOMLY INITIALISED model is shown: "
            "its attention and predictions mean nothing.")


class FailureMemory:
    """Errors of recent model loads, per load key, shared by every session (thread-safe).

    A cache of built models does not cache exceptions: without this memory, every rerun of every
    session would retry a model that can't be had (offline: a meta build and, once a minute, a hub
    probe of up to seconds).
    """

    def __init__(self, seconds: float = FAILURE_MEMORY_S, clock=time.monotonic) -> None:
        self.seconds, self._clock = seconds, clock
        self._failures: dict[tuple, tuple[float, vit_core.ViTLensError]] = {}
        self._lock = threading.Lock()

    def recent(self, key: tuple) -> vit_core.ViTLensError | None:
        """The error of `key`'s last load if it failed less than `seconds` ago."""
        with self._lock:
            failed = self._failures.get(key)
        if failed is not None and self._clock() - failed[0] < self.seconds:
            return failed[1]
        return None

    def remember(self, key: tuple, error: vit_core.ViTLensError) -> None:
        now = self._clock()
        with self._lock:
            for old in [k for k, (t, _) in self._failures.items() if now - t >= self.seconds]:
                del self._failures[old]
            self._failures[key] = (now, error)
