"""The one module that owns Streamlit's caches, session state and the URL's query parameters.

Caches (shared by every browser session, all keyed on strings, never on tensors or arrays):
- models: `st.cache_resource`, keyed by name + weights digest; `LoadedModel.lock` serialises forwards;
- one capture per (model, image): `st.cache_resource(max_entries=...)`, keyed by the model key and
  the sha256 of the image bytes, the image itself passed as an underscore argument;
- small per-model / per-capture analyses (filter PCA, position similarity, attention distance).

Selections that matter live in the URL: the widgets below are created with
`bind="query-params"`, so their key is the query parameter (`?model=...&view=Attention&layer=3`).

Shared by up to a classroom of sessions: every cache has `max_entries`, and what a session keeps
for itself is capped too (the distance history, the saved weights uploads). A model that can't be
loaded (offline, a refused weights file) is remembered for a minute, so reruns don't retry it.

Test and benchmark hooks (environment variables, read at start-up):
- `VIT_LENS_MODEL=<name>`: the model the app opens with (`vit_core.loading.env_default_model`).
- `VIT_LENS_MODEL=test-tiny`: a random-init 2-block `vit_tiny_patch16_224` (fast, offline); the
  dashboard tests use it.
- `VIT_LENS_RANDOM_INIT=1`: build every timm model with random weights instead of pretrained ones
  (offline benchmarks: same compute as the pretrained model).
"""

from __future__ import annotations

import gc
import hashlib
import io
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import streamlit as st
from PIL import Image, ImageDraw, ImageFilter

import vit_core
from vit_core import ImageError, analyses, export  # noqa: F401 - ImageError re-exported for the views
from vit_core.images import UPLOAD_EXTENSIONS as IMAGE_TYPES  # noqa: F401 - the uploaders use it
from vit_core.loading import TEACHING_MODEL, LoadedModel, env_default_model, teaching_model_available
from vit_core.runtime import configure_threads

_logger = logging.getLogger(__name__)

TEST_TINY = "test-tiny"
UNTRAINED_FALLBACK = "vit_tiny_patch16_224"
UPLOAD_WEIGHTS = "upload"  # the model choice "your own weights file"
MAX_WEIGHTS_MB = 400  # the largest listed architecture (ViT-B/16 at 384) is about 350 MB; = server.maxUploadSize
MAX_IMAGE_MB = 25
MAX_BATCH_IMAGES = 32
MAX_HISTORY_IMAGES = 200  # per session and model: the distance history keeps the latest (2 small arrays each)
MAX_HISTORY_MODELS = 4
MAX_SAVED_UPLOADS = 8  # per session: weights / label files remembered by upload id
UPLOADS_DISK_MB = 4096  # saved weights uploads on disk, all sessions together: the oldest go first
# The shape examples are drawn by the training generator with this seed. Seed 0's circle sits on
# stripes of nearly its own colour and is one of the shipped model's rare errors (98.95 % held-out
# accuracy): a poor first page. With seed 2 the model gets all eight right (tests/test_teaching_model.py).
SHAPE_EXAMPLE_SEED = 2
FAILURE_MEMORY_S = 60.0  # a model that failed to load is not retried for this long (the hub probe costs seconds)

MODEL_CHOICES: dict[str, str] = {
    "vit_base_patch16_224": "ViT-B/16, ImageNet (default)",
    "vit_small_patch16_224": "ViT-S/16, small",
    "deit_small_distilled_patch16_224": "DeiT-S distilled (class + distillation token)",
    "vit_base_patch32_224": "ViT-B/32 (32-pixel patches)",
    "vit_base_patch16_384": "ViT-B/16 at 384 x 384",
    "vit_base_patch16_siglip_224": "SigLIP ViT-B/16 (no class token)",
    TEACHING_MODEL: "Shapes ViT, bundled, works offline",
    UPLOAD_WEIGHTS: "Your own weights file...",
}

# Widget keys. Those bound to the URL are the query parameters of a shared link.
K_MODEL, K_ARCH, K_WEIGHTS, K_LABELS = "model", "arch", "weights_file", "labels_file"
K_EXAMPLE, K_UPLOAD, K_CAMERA_ON, K_CAMERA = "example", "upload", "camera_on", "camera"
K_VIEW, K_LAYER, K_HEAD, K_QUERY, K_PATCH = "view", "layer", "head", "query", "patch"
K_FUSION, K_ROLLOUT_LAYER, K_POS_PATCH, K_POS_RES = "fusion", "rollout_layer", "pos_patch", "pos_res"
K_FILTER_START, K_MAD_RENORM, K_MAD_BATCH, K_TOPK = "filter_start", "mad_renorm", "mad_batch", "topk"
_K_HELD_CAPTURE = "_held_capture"  # (model key, image sha) -> the session's current capture, see session_capture
_SOURCE, _LAST_GOOD, _MAD_HISTORY = "_image_source", "_last_good_image", "_mad_history"


def model_choices() -> dict[str, str]:
    """The sidebar's model list; the start-up model from $VIT_LENS_MODEL first if it isn't listed."""
    start = env_default_model()
    if start in MODEL_CHOICES:
        return dict(MODEL_CHOICES)
    label = "Test model (tiny, random init)" if start == TEST_TINY else start
    return {start: label, **MODEL_CHOICES}


def random_init_forced() -> bool:
    return os.environ.get("VIT_LENS_RANDOM_INIT", "") not in ("", "0")


# ----------------------------------------------------------------------------------------------
# Torch threads: size the pool from the container's CPU quota, once per process


@st.cache_resource
def configure_torch_threads() -> int:
    """Once per server process (torch's thread pool is process-wide)."""
    return configure_threads()


_heap_frozen = False


def freeze_long_lived_heap() -> None:
    """Once per process, after the first full page: hide everything alive from the cyclic garbage collector.

    Streamlit runs a full ``gc.collect(2)`` after every script run (``runner.postScriptGC``). With
    torch, timm, plotly and matplotlib imported that is ~485k objects and took 257 ms per rerun on the
    2-core machine: most of a control change in the browser. Those objects live as long as the server;
    ``gc.freeze`` moves them to a generation the collector skips (after it: 0 ms). Reference counting
    still frees them as usual; only reference cycles alive right now would never be collected.
    """
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


# ----------------------------------------------------------------------------------------------
# Models


@st.cache_resource(max_entries=3, show_spinner=False)
def _cached_model(name: str, weights_path: str, labels_path: str, weights_id: str, random_init: bool) -> LoadedModel:
    del weights_id  # only keys the cache: the digest of the uploaded file(s)
    if name == TEST_TINY:
        return vit_core.load_model("vit_tiny_patch16_224", pretrained=False, depth=2)
    if name == TEACHING_MODEL:
        return vit_core.load_model(TEACHING_MODEL)
    kwargs: dict[str, Any] = {}
    if labels_path:
        kwargs["labels"] = labels_path
    if weights_path:
        return vit_core.load_model(name, weights=weights_path, **kwargs)
    return vit_core.load_model(name, pretrained=not random_init, **kwargs)


@dataclass(frozen=True)
class ModelRequest:
    name: str  # a timm name, TEACHING_MODEL or TEST_TINY
    weights_path: str = ""  # a local copy of uploaded weights
    labels_path: str = ""
    weights_id: str = ""  # sha256 of the uploaded weights (+ labels)

    @property
    def key(self) -> str:
        """Identifies the model in every per-model / per-image cache key."""
        return f"{self.name}|{self.weights_id or ('random' if self.random_init else 'pretrained')}"

    @property
    def random_init(self) -> bool:
        return random_init_forced() and not self.weights_path and self.name not in (TEACHING_MODEL, TEST_TINY)


_failures: dict[tuple, tuple[float, vit_core.ViTLensError]] = {}  # shared by every session
_failures_lock = threading.Lock()


def load(request: ModelRequest) -> LoadedModel:
    """The model, from the cache or loaded now. Raises vit_core errors (OfflineError, WeightsError, ...).

    st.cache_resource does not cache exceptions: without the memory below, every rerun of every
    session would retry a model that can't be had (offline: a meta build and, once a minute, a
    hub probe of up to seconds).
    """
    args = (request.name, request.weights_path, request.labels_path, request.weights_id, request.random_init)
    now = time.monotonic()
    with _failures_lock:
        failed = _failures.get(args)
    if failed is not None and now - failed[0] < FAILURE_MEMORY_S:
        raise failed[1]
    try:
        return _cached_model(*args)
    except vit_core.ViTLensError as e:
        with _failures_lock:
            for key in [k for k, (t, _) in _failures.items() if now - t >= FAILURE_MEMORY_S]:
                del _failures[key]
            _failures[args] = (now, e)
        raise


def fallback_request() -> tuple[ModelRequest, str]:
    """What to show when the chosen model can't be had: the bundled model, else an untrained one."""
    if teaching_model_available():
        return ModelRequest(TEACHING_MODEL), f"Showing the bundled {MODEL_CHOICES[TEACHING_MODEL]!r} model instead."
    return (ModelRequest(TEST_TINY),
            "The bundled teaching model is missing too, so a tiny RANDOMLY INITIALISED model is shown: "
            "its attention and predictions mean nothing.")


def save_upload(upload: Any) -> tuple[str, str]:
    """Store an uploaded weights / labels file under its digest (so the model cache can key on it).

    Hashing a few hundred MB costs about a second: done once per upload (its file_id), not per rerun.
    """
    saved = st.session_state.setdefault("_saved_uploads", {})
    if upload.file_id in saved and Path(saved[upload.file_id][0]).is_file():  # (pruned: written again)
        return saved[upload.file_id]
    data, suffix = upload.getvalue(), Path(upload.name).suffix
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(tempfile.gettempdir()) / "vit_lens_uploads"
    folder.mkdir(exist_ok=True)
    path = folder / f"{digest[:32]}{suffix.lower()}"
    if not path.exists():  # written whole, then renamed: another session never reads half a file
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as part:
            part.write(data)
        os.replace(part.name, path)
        _prune_uploads(folder, keep=path)
    saved[upload.file_id] = (str(path), digest)
    while len(saved) > MAX_SAVED_UPLOADS:
        del saved[next(iter(saved))]
    return str(path), digest


def _prune_uploads(folder: Path, keep: Path, max_bytes: int = UPLOADS_DISK_MB * 2**20) -> None:
    """Delete the oldest saved uploads beyond `max_bytes` (a class uploading weights must not fill the disk).

    A model already loaded from a deleted file stays in the cache, and a session that still holds
    the upload writes the file again on its next run (save_upload).
    """
    try:
        files = sorted((f for f in folder.iterdir() if f.is_file() and f != keep and f.suffix != ".part"),
                       key=lambda f: f.stat().st_mtime)
        total = keep.stat().st_size + sum(f.stat().st_size for f in files)
        for f in files:
            if total <= max_bytes:
                break
            total -= f.stat().st_size
            f.unlink(missing_ok=True)
    except OSError as e:  # another session pruning at the same time: harmless
        _logger.debug("pruning uploads: %s", e)


# ----------------------------------------------------------------------------------------------
# Images


@dataclass(frozen=True)
class ImageChoice:
    """An image a session shows. Light enough to keep per session: the file's bytes (compressed) and
    a display copy, not the decoded full-size picture (a 12 MP phone photo is 36 MB decoded)."""

    name: str  # for people and file names
    sha: str  # sha256 of the bytes: the per-image cache key
    data: bytes  # the file as given
    size: tuple[int, int]  # (width, height) of the decoded picture, upright
    source_format: str
    notes: tuple[str, ...]  # what decoding did that the user may want to know
    display: Image.Image  # the picture, at most DISPLAY_SIDE pixels a side

    def full_image(self) -> Image.Image:
        """The decoded full-size RGB picture (from the shared cache, or decoded again)."""
        return _decoded(self.sha, self.data).image


DISPLAY_SIDE = 1024


@st.cache_resource(max_entries=8, show_spinner=False)
def _decoded(sha: str, _data: bytes) -> vit_core.DecodedImage:
    return vit_core.decode_image(_data)


def _display_copy(image: Image.Image) -> Image.Image:
    if max(image.size) <= DISPLAY_SIDE:
        return image
    small = image.copy()
    small.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE), Image.Resampling.LANCZOS)
    return small


def decode(name: str, data: bytes) -> ImageChoice:
    """Decode uploaded or example bytes; raises vit_core.ImageError with a message for the user."""
    if len(data) > MAX_IMAGE_MB * 1024 * 1024:  # the browser enforces the widget's cap; a script may not
        raise ImageError(f"The file is {len(data) / 2**20:.0f} MB; images are limited to {MAX_IMAGE_MB} MB.")
    sha = hashlib.sha256(data).hexdigest()
    return ImageChoice(name, sha, data, *_image_info(sha, data))


@st.cache_resource(max_entries=48, show_spinner=False)
def _image_info(sha: str, _data: bytes) -> tuple[tuple[int, int], str, tuple[str, ...], Image.Image]:
    """(size, source format, notes, display copy) of an image: what every rerun needs, kept longer
    than the full-size decoded pictures."""
    decoded = _decoded(sha, _data)
    return decoded.image.size, decoded.source_format, decoded.notes, _display_copy(decoded.image)


def synthetic_scene(size: int = 448) -> bytes:
    """A simple scene the app draws itself: sky, sun, hills, a house and a tree (PNG bytes)."""
    im = Image.new("RGB", (size, size))
    sky = np.linspace([120, 180, 250], [220, 235, 255], size).astype(np.uint8)  # (size, 3)
    im.paste(Image.fromarray(np.repeat(sky[:, None, :], size, axis=1)))
    d = ImageDraw.Draw(im)
    u = size / 100
    d.ellipse([75 * u, 8 * u, 92 * u, 25 * u], fill=(255, 210, 60))
    d.ellipse([-30 * u, 55 * u, 70 * u, 130 * u], fill=(90, 160, 80))
    d.ellipse([40 * u, 60 * u, 140 * u, 130 * u], fill=(70, 140, 60))
    d.rectangle([20 * u, 52 * u, 48 * u, 78 * u], fill=(200, 70, 60))
    d.polygon([(16 * u, 53 * u), (34 * u, 36 * u), (52 * u, 53 * u)], fill=(110, 60, 40))
    d.rectangle([30 * u, 64 * u, 38 * u, 78 * u], fill=(80, 50, 30))
    d.rectangle([70 * u, 55 * u, 74 * u, 75 * u], fill=(100, 70, 40))
    d.ellipse([62 * u, 38 * u, 82 * u, 60 * u], fill=(40, 120, 50))
    im = im.filter(ImageFilter.GaussianBlur(0.6))
    buffer = io.BytesIO()
    im.save(buffer, format="PNG")
    return buffer.getvalue()


def _shape_names() -> tuple[str, ...]:
    try:
        from vit_core.teaching.data import CLASS_NAMES
    except ImportError:
        return ()
    return CLASS_NAMES


def example_names() -> list[str]:
    return ["Grace Hopper (photo)", "Synthetic scene (drawn by the app)"] + [f"Shape: {s}" for s in _shape_names()]


@st.cache_data(max_entries=16, show_spinner=False)
def example_bytes(name: str) -> bytes:
    """The bytes of a built-in example image (small: cache_data's copy per hit is cheap)."""
    if name.startswith("Grace Hopper"):
        import matplotlib.cbook

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            return f.read()
    if name.startswith("Shape: "):
        from vit_core.teaching.data import sample_image

        buffer = io.BytesIO()
        sample_image(name.removeprefix("Shape: "), seed=SHAPE_EXAMPLE_SEED, size=64).save(buffer, format="PNG")
        return buffer.getvalue()
    return synthetic_scene()


def default_example(model_name: str) -> str:
    names = example_names()
    if model_name == TEACHING_MODEL and len(names) > 2:
        return names[2]
    return names[0]


def image_source() -> str:
    return st.session_state.get(_SOURCE, "example")


def set_image_source(source: str) -> None:
    """on_change callback of the image inputs: the input touched last is the one shown."""
    st.session_state[_SOURCE] = source


def last_good_image() -> ImageChoice | None:
    return st.session_state.get(_LAST_GOOD)


def remember_good_image(image: ImageChoice) -> None:
    st.session_state[_LAST_GOOD] = image


# ----------------------------------------------------------------------------------------------
# Captures and per-capture analyses


@dataclass(frozen=True)
class _Lazy:
    """The full-size picture of `choice`, decoded only if the capture is not cached."""

    choice: ImageChoice


@st.cache_resource(max_entries=24, show_spinner=False)
def _capture(model_key: str, image_sha: str, _loaded: LoadedModel, _image: _Lazy) -> vit_core.Capture:
    return vit_core.run_with_capture(_loaded, _image.choice.full_image())


def capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice) -> vit_core.Capture:
    """One hooked forward pass per (model, image), shared by every session."""
    return _capture(request.key, image.sha, loaded, _Lazy(image))


def session_capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice) -> vit_core.Capture:
    """`capture` of the image this session is looking at, also held by the session itself.

    With more sessions than the shared cache has entries (a class of 30), sessions evict each other's
    captures, and a full rerun (a tab switch, a sidebar change) would decode the image and run the model
    again. Held here, a session's current capture lives as long as the session looks at it: memory grows
    by at most one capture per session. (Control changes inside a view are fragment reruns, which keep
    the capture they were drawn with anyway.)
    """
    key = (request.key, image.sha)
    held = st.session_state.get(_K_HELD_CAPTURE)
    if held is not None and held[0] == key:
        return held[1]
    cap = capture(request, loaded, image)
    st.session_state[_K_HELD_CAPTURE] = (key, cap)
    return cap


@st.cache_resource(max_entries=64, show_spinner=False)
def _distances(model_key: str, image_sha: str, _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    g = _cap.geometry
    args = (_cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)
    return analyses.mean_attention_distance(*args), analyses.mean_attention_distance(*args, renormalize=True)


def attention_distances(request: ModelRequest, image: ImageChoice, cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention distance (L, H) of this image, both conventions; recorded in the session history."""
    result = _distances(request.key, image.sha, cap)
    history = st.session_state.setdefault(_MAD_HISTORY, {})
    per_model = history.pop(request.key, {})
    history[request.key] = per_model  # the latest model last
    per_model.pop(image.sha, None)
    per_model[image.sha] = result  # the latest image last
    while len(per_model) > MAX_HISTORY_IMAGES:
        del per_model[next(iter(per_model))]
    while len(history) > MAX_HISTORY_MODELS:
        del history[next(iter(history))]
    return result


def distance_history(request: ModelRequest) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per image sha: (MAD, MAD renormalised) of every image analysed with this model in this session."""
    return st.session_state.get(_MAD_HISTORY, {}).get(request.key, {})


@st.cache_resource(max_entries=8, show_spinner=False)
def patches_as_linear(model_key: str, image_sha: str, _loaded: LoadedModel, _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """The normalised input cut into flattened patches (N, ph*pw*3), and E x + b for each (N, D)."""
    g = _cap.geometry
    image = np.ascontiguousarray(_cap.input_tensor.transpose(1, 2, 0))  # (3, H, W) -> (H, W, 3)
    flat = analyses.flatten_patches(analyses.split_patches(image, g.patch_size))  # (N, ph, pw, 3) -> (N, ph*pw*3)
    linear = analyses.embed_patches_linear(flat, export.patch_embed_weight(_loaded), export.patch_embed_bias(_loaded))
    return flat, linear


@st.cache_resource(max_entries=6, show_spinner=False)
def filters_pca(model_key: str, _loaded: LoadedModel) -> analyses.FilterPCA:
    return analyses.filters_pca(export.patch_embed_weight(_loaded), k=export.PCA_COMPONENTS)


@st.cache_resource(max_entries=24, show_spinner=False)
def pos_similarity(model_key: str, grid: tuple[int, int], _loaded: LoadedModel) -> np.ndarray | None:
    """Position-embedding similarity (N', gh', gw') on `grid` (resampled in 2D if it differs), or None."""
    g = _loaded.geometry
    rows = export.pos_embed_rows(_loaded)
    if rows is None:
        return None
    if tuple(grid) != tuple(g.grid):
        rows = analyses.resample_pos_embed(rows, g.grid, grid, g.num_prefix_tokens, g.no_embed_class)  # (T_pe', D)
    return analyses.pos_embed_similarity(rows, g.num_prefix_tokens, g.no_embed_class, grid)


@st.cache_resource(max_entries=64, show_spinner=False)
def rollout(model_key: str, image_sha: str, fusion: str, last_layer: int, _cap: vit_core.Capture) -> np.ndarray:
    g = _cap.geometry
    return analyses.attention_rollout(_cap.pattern, g.num_prefix_tokens, g.grid, fusion, last_layer,
                                      has_class_token=g.has_class_token)


@st.cache_resource(max_entries=256, show_spinner=False)
def _png(key: str, _build: Callable[[], bytes]) -> bytes:
    return _build()


def cached_png(build: Callable[[], bytes], *key_parts: object) -> bytes:
    """PNG bytes of a figure, built once per key (model key, image sha, figure name, its settings).

    Figures cost 50-300 ms each with matplotlib on a busy 2-core machine; a control change rebuilds
    only the figure whose key it changes.
    """
    return _png("|".join(str(part) for part in key_parts), build)


# ----------------------------------------------------------------------------------------------
# Clicks on a patch image


def patch_click_callback(chart_key: str, target_key: str, offset: int = 0) -> None:
    """on_select callback: a click on patch k of a chart sets widget `target_key` to offset + k."""
    points = st.session_state[chart_key].selection.points
    if not points:
        return
    point = points[0]
    k = point.get("customdata", point.get("point_index"))
    if isinstance(k, list):
        k = k[0]
    if k is not None:
        st.session_state[target_key] = offset + int(k)
