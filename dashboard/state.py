"""The one module that owns Streamlit's caches, session state and the URL's query parameters.

Caches (shared by every browser session, all keyed on strings, never on tensors or arrays):
- models: `st.cache_resource`, keyed by `ModelRequest.load_args`; `LoadedModel.lock` serialises forwards;
- one forward pass with its capture per (model, image), keyed by the model key and the sha256 of the
  image bytes: a `ByteBudgetCache` bounded by bytes (`CAPTURE_BUDGET`: $VIT_LENS_CAPTURE_MB, else a
  quarter of the machine's memory, 512 MiB to 8 GiB; see dashboard.byte_budget), since a capture is
  31 MiB for ViT-B/16 and 205 MiB for ViT-B/16-384. Each session holds the capture it looks at in
  the same cache (evicted after every capture nobody holds); the decoded pictures the forward passes
  start from are bounded by bytes too (`PICTURE_BUDGET`, a sixteenth of that, at least 256 MiB);
- small per-model / per-capture analyses (filter PCA, position similarity, attention distance);
- figures, keyed by what their builder takes (`dashboard.figure_keys`);
- the "why" analyses (`vit_core.explain`): relevance maps per (model, image, target), the logit lens,
  interventions per (model, image, intervention); the deletion / insertion curves, computed on request
  with a progress bar, in a small bounded store per (model, image, target, steps).

Session state: the image source touched last, the last good image and model, the session's held
capture, its attention-distance history, its saved uploads, the canvases' clear counters, the patches
and heads of its intervention (with the model and image they belong to, and a patch-click count). Selections
that matter live in the URL: the widgets are created with `bind="query-params"`, so their key is the
query parameter (`?model=...&view=Attention&layer=3`).

Shared by up to a classroom of sessions: every cache has `max_entries` or a byte budget, and what a session
keeps for itself is capped too (the distance history, the saved weights uploads). The distance tab's batch
uploader keeps out of the shared caches: each image is reduced to its mean attention distances and its
capture dropped. A model that can't be
loaded (offline, a refused weights file) is remembered for a minute, so reruns don't retry it.
What is not Streamlit's lives beside this module: `models`, `examples`, `uploads`, `image_choice`, `process`.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import streamlit as st
from PIL import Image

import vit_core
from dashboard import examples, figure_keys, process, uploads
from dashboard.byte_budget import ByteBudgetCache, default_capture_budget
from dashboard.image_choice import ImageChoice, check_file_size, preview_copy
from dashboard.models import FailureMemory, ModelRequest, build_model
from vit_core import analyses, explain, export
from vit_core.images import DRAFT_MIN_SIDE
from vit_core.loading import LoadedModel

MAX_BATCH_IMAGES = 32
MAX_HISTORY_IMAGES = 200  # per session and model: the distance history keeps the latest (2 small arrays each)
MAX_HISTORY_MODELS = 4
MAX_SAVED_UPLOADS = 8  # per session: weights / label files remembered by upload id

# Widget keys. Those bound to the URL are the query parameters of a shared link.
K_MODEL, K_ARCH, K_WEIGHTS, K_LABELS = "model", "arch", "weights_file", "labels_file"
K_EXAMPLE, K_UPLOAD, K_CAMERA_ON, K_CAMERA = "example", "upload", "camera_on", "camera"
K_DRAW_ON, K_DRAW = "draw_on", "draw"
K_VIEW, K_LAYER, K_HEAD, K_QUERY, K_PATCH = "view", "layer", "head", "query", "patch"
K_FUSION, K_ROLLOUT_LAYER, K_POS_PATCH, K_POS_RES = "fusion", "rollout_layer", "pos_patch", "pos_res"
K_FILTER_START, K_MAD_RENORM, K_MAD_BATCH, K_TOPK = "filter_start", "mad_renorm", "mad_batch", "topk"
K_TARGET, K_METHODS, K_STEPS, K_LENS_LAYER = "target", "methods", "steps", "lens_layer"
K_INT_PATCHES, K_INT_MODE, K_INT_HEADS, K_INT_ABLATION = "int_patches", "int_mode", "int_heads", "int_ablation"
# Session-state keys that are not widgets.
_HOLDER = "_capture_holder"  # this session's name in the capture cache's holds: see held_capture
_SOURCE, _LAST_GOOD, _MAD_HISTORY, _SAVED_UPLOADS = "_image_source", "_last_good_image", "_mad_history", "_saved_uploads"
_LAST_GOOD_MODEL = "_last_good_model"  # the ModelRequest this session last loaded: kept after a refused model
_CANVAS_GENERATION = "_canvas_generation"  # canvas key -> how many times it was cleared: see canvas_generation
_INT_OWNER = "_intervention_owner"  # (model key, image sha) the chosen patches belong to: see keep_interventions_for
_INT_CLICKS = "_intervention_clicks"  # how many patch clicks so far: part of the clickable chart's key


# ----------------------------------------------------------------------------------------------
# Models


@st.cache_resource(max_entries=3, show_spinner=False)
def _cached_model(name: str, weights_path: str, labels_path: str, weights_id: str, random_init: bool) -> LoadedModel:
    del weights_id  # only keys the cache: the digest of the uploaded file(s)
    return build_model(name, weights_path, labels_path, random_init)


_failures = FailureMemory()  # shared by every session


def load(request: ModelRequest) -> LoadedModel:
    """The model, from the cache or loaded now. Raises vit_core errors (OfflineError, WeightsError, ...);
    a model that failed lately raises its error again without a retry (models.FailureMemory)."""
    failed = _failures.recent(request.load_args)
    if failed is not None:
        raise failed
    try:
        return _cached_model(*request.load_args)
    except vit_core.ViTLensError as e:
        _failures.remember(request.load_args, e)
        raise


def save_upload(upload: Any) -> tuple[str, str]:
    """Store an uploaded weights / labels file under its digest (so the model cache can key on it).

    Hashed and written once per upload (its file_id), not per rerun.
    """
    saved = st.session_state.setdefault(_SAVED_UPLOADS, {})
    if upload.file_id in saved and Path(saved[upload.file_id][0]).is_file():  # (pruned: written again)
        return saved[upload.file_id]
    saved[upload.file_id] = uploads.store(upload.getvalue(), Path(upload.name).suffix)
    while len(saved) > MAX_SAVED_UPLOADS:
        del saved[next(iter(saved))]
    return saved[upload.file_id]


# ----------------------------------------------------------------------------------------------
# Images


CAPTURE_BUDGET = default_capture_budget()  # bytes: the shared captures, held ones included
# bytes: decoded pictures, needed only until their forward pass and preview are made (a phone photo, drafted,
# is 12 MB, so a class's 30 photos would hold 360 MB for nothing; a 50 MP PNG is 200 MB).
PICTURE_BUDGET = max(CAPTURE_BUDGET // 16, 256 * 2**20)


def _picture_nbytes(decoded: vit_core.DecodedImage) -> int:
    width, height = decoded.image.size
    return 4 * width * height  # Pillow keeps RGB as 4 bytes a pixel


_pictures: ByteBudgetCache[vit_core.DecodedImage] = ByteBudgetCache(PICTURE_BUDGET, size_of=_picture_nbytes)


def _decoded(sha: str, data: bytes, min_side: int = DRAFT_MIN_SIDE) -> vit_core.DecodedImage:
    return _pictures.get_or_compute((sha, min_side), partial(vit_core.decode_image, data, min_side))


def full_image(image: ImageChoice, min_side: int = DRAFT_MIN_SIDE) -> Image.Image:
    """The decoded RGB picture the model starts from (a large JPEG at reduced size, its shorter side at
    least `min_side`: vit_core.decode_image; the model's own `decode_min_side` for its forward pass)."""
    return _decoded(image.sha, image.data, min_side).image


@st.cache_resource(max_entries=48, show_spinner=False)
def _image_info(sha: str, _data: bytes) -> tuple[tuple[int, int], tuple[str, ...], Image.Image]:
    """(size, notes, preview) of an image: what every rerun needs, kept longer than the full-size pictures."""
    decoded = _decoded(sha, _data)
    return decoded.image.size, decoded.notes, preview_copy(decoded.image)


def decode(name: str, data: bytes) -> ImageChoice:
    """Decode uploaded or example bytes; raises vit_core.ImageError with a message for the user."""
    check_file_size(data)
    sha = hashlib.sha256(data).hexdigest()
    return ImageChoice(name, sha, data, *_image_info(sha, data))


@st.cache_data(max_entries=16, show_spinner=False)
def example_bytes(name: str) -> bytes:
    """The bytes of a built-in example image (small: cache_data's copy per hit is cheap)."""
    return examples.example_bytes(name)


def image_source() -> str:
    return st.session_state.get(_SOURCE, "example")


def set_image_source(source: str) -> None:
    """on_change callback of the image inputs: the input touched last is the one shown."""
    st.session_state[_SOURCE] = source


def canvas_generation(key: str) -> int:
    """How often the canvas `key` was cleared: part of its widget key, since a new key is a fresh, empty canvas
    (the component keeps its drawing per key)."""
    return st.session_state.get(_CANVAS_GENERATION, {}).get(key, 0)


def clear_canvas(key: str) -> None:
    """on_click callback of the canvas's Clear button."""
    generations = st.session_state.setdefault(_CANVAS_GENERATION, {})
    generations[key] = generations.get(key, 0) + 1


def last_good_model() -> ModelRequest | None:
    return st.session_state.get(_LAST_GOOD_MODEL)


def remember_good_model(request: ModelRequest) -> None:
    st.session_state[_LAST_GOOD_MODEL] = request


def last_good_image() -> ImageChoice | None:
    return st.session_state.get(_LAST_GOOD)


def remember_good_image(image: ImageChoice) -> None:
    st.session_state[_LAST_GOOD] = image


# ----------------------------------------------------------------------------------------------
# The forward pass per (model, image) and the analyses of its capture


_captures: ByteBudgetCache[vit_core.Capture] = ByteBudgetCache(CAPTURE_BUDGET)  # shared by every session


def shared_capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice) -> vit_core.Capture:
    """The capture of one hooked forward pass per (model, image), cached and shared by every session
    (computed once however many sessions ask for it at the same moment)."""
    def forward() -> vit_core.Capture:
        cap = vit_core.run_with_capture(loaded, full_image(image, loaded.decode_min_side))
        process.finish_this_run_below_the_pages()  # this image's figures come after others' control changes
        return cap

    return _captures.get_or_compute((request.key, image.sha), forward)


def _holder() -> str:
    return st.session_state.setdefault(_HOLDER, uuid.uuid4().hex)


def held_capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice) -> vit_core.Capture:
    """`shared_capture` of the image this session is looking at, held in the cache for this session.

    With more sessions than the cache keeps captures, sessions would evict each other's, and a full
    rerun (a tab switch, a sidebar change) would run the model again. A held capture is evicted only
    after every capture nobody holds; each session holds one (the one it looks at), and all of them
    together stay within the byte budget: past it, the longest unused hold goes too, and that session
    computes its capture again on its next full rerun. The budget counts what the cache keeps: a
    session's fragments (control changes rerun only their view, with the arguments of the last full
    run) still reference the capture they were drawn with, so an evicted capture is freed at that
    session's next full run, not at once.
    """
    cap = shared_capture(request, loaded, image)
    _captures.hold(_holder(), (request.key, image.sha))
    return cap


def _mean_attention_distances(cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention distance (L, H): (prefix attention left out, rows renormalised over patches)."""
    g = cap.geometry
    args = (cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)
    return analyses.mean_attention_distance(*args), analyses.mean_attention_distance(*args, renormalize=True)


@st.cache_resource(max_entries=64, show_spinner=False)
def _distances(model_key: str, image_sha: str, _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    return _mean_attention_distances(_cap)


def attention_distances(request: ModelRequest, image: ImageChoice, cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention distance (L, H) of this image: (prefix attention left out, rows renormalised over patches)."""
    return _distances(request.key, image.sha, cap)


def record_attention_distances(request: ModelRequest, image: ImageChoice,
                               cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """`attention_distances`, also recorded in the session's history (the latest image of the latest model last)."""
    result = attention_distances(request, image, cap)
    _remember_distances(request.key, image.sha, result)
    return result


def _remember_distances(model_key: str, image_sha: str, result: tuple[np.ndarray, np.ndarray]) -> None:
    history = st.session_state.setdefault(_MAD_HISTORY, {})
    per_model = history.pop(model_key, {})
    history[model_key] = per_model  # the latest model last
    per_model.pop(image_sha, None)
    per_model[image_sha] = result  # the latest image last
    while len(per_model) > MAX_HISTORY_IMAGES:
        del per_model[next(iter(per_model))]
    while len(history) > MAX_HISTORY_MODELS:
        del history[next(iter(history))]


def add_to_distance_average(request: ModelRequest, loaded: LoadedModel, data: bytes) -> None:
    """One image of the distance tab's batch uploader: its mean attention distances (L, H) join this
    session's history (once per image). Nothing goes into the shared caches: the image is decoded and
    run here, reduced to the two (L, H) arrays, and its picture and capture are dropped (a batch of 32
    ViT-B/16-384 captures would be 6.5 GiB). Raises vit_core.ImageError with a message for the user."""
    check_file_size(data)
    sha = hashlib.sha256(data).hexdigest()
    if sha in distance_history(request):
        return
    cap = vit_core.run_with_capture(loaded, vit_core.decode_image(data, loaded.decode_min_side).image)
    _remember_distances(request.key, sha, _mean_attention_distances(cap))


def distance_history(request: ModelRequest) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per image sha: (MAD, MAD renormalised) of every image analysed with this model in this session."""
    return st.session_state.get(_MAD_HISTORY, {}).get(request.key, {})


@st.cache_resource(max_entries=8, show_spinner=False)
def patches_as_linear(model_key: str, image_sha: str, _loaded: LoadedModel,
                      _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
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


# ----------------------------------------------------------------------------------------------
# "Why this prediction": explanations, logit lens, interventions, faithfulness curves


@st.cache_resource(max_entries=24, show_spinner=False)
def _relevance(model_key: str, image_sha: str, target: int, _loaded: LoadedModel,
               _cap: vit_core.Capture) -> explain.Relevance:
    return explain.relevance_maps(_loaded, _cap, target=target, cap=_cap)


def relevance(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
              target: int) -> explain.Relevance:
    """Every method's relevance map (gh, gw) for class `target`: one forward + backward pass per
    (model, image, target), cached and shared by every session."""
    return _relevance(request.key, image.sha, int(target), loaded, cap)


@st.cache_resource(max_entries=24, show_spinner=False)
def logit_lens(model_key: str, image_sha: str, _loaded: LoadedModel, _cap: vit_core.Capture) -> np.ndarray:
    """The logit lens of a capture: float32 (L+1, C), row l = the head applied after block l (row 0: the embeddings)."""
    return explain.logit_lens(_loaded, _cap)


@st.cache_resource(max_entries=48, show_spinner=False)
def patch_logit_lens(model_key: str, image_sha: str, layer: int, _loaded: LoadedModel,
                     _cap: vit_core.Capture) -> np.ndarray:
    """The per-patch logit lens of one layer: float32 (N, C), every patch token through the head without pooling."""
    return explain.patch_logit_lens(_loaded, _cap, layer)


@st.cache_resource(max_entries=128, show_spinner=False)
def _intervened(model_key: str, image_sha: str, drop: tuple[int, ...], mask: tuple[int, ...],
                ablate: tuple[tuple[int, int], ...], ablation: str, _loaded: LoadedModel,
                _cap: vit_core.Capture) -> np.ndarray:
    return explain.predict_intervened(_loaded, _cap, drop=drop, mask=mask, ablate=ablate, ablation=ablation)


def intervened_logits(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture, *,
                      drop: tuple[int, ...] = (), mask: tuple[int, ...] = (), ablate: tuple[tuple[int, int], ...] = (),
                      ablation: str = "zero") -> np.ndarray:
    """The logits (C,) after dropping / masking patches and ablating heads (explain.predict_intervened), cached
    per (model, image, intervention): clicking a patch back and forth costs one forward each way, once."""
    return _intervened(request.key, image.sha, tuple(sorted(drop)), tuple(sorted(mask)), tuple(sorted(ablate)), ablation,
                       loaded, cap)


class _BoundedStore:
    """A small thread-safe dict that forgets its oldest entries: results computed on request (a button),
    with a progress bar, which st.cache_resource can't show while it computes."""

    def __init__(self, max_entries: int) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_entries

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = value
            while len(self._items) > self._max:
                self._items.popitem(last=False)


_faithfulness = _BoundedStore(max_entries=32)  # shared by every session, like the caches above


def _faithfulness_key(request: ModelRequest, image: ImageChoice, target: int, steps: int) -> str:
    return repr((request.key, image.sha, int(target), int(steps)))


_latest_faithfulness = _BoundedStore(max_entries=64)  # (model key, image sha) -> the key of its latest curves


def faithfulness_result(request: ModelRequest, image: ImageChoice, target: int, steps: int) -> explain.Faithfulness | None:
    """The deletion / insertion curves of (model, image, target, steps) if someone computed them already, else None."""
    return _faithfulness.get(_faithfulness_key(request, image, target, steps))


def compute_faithfulness(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                         relevance: explain.Relevance, steps: int, progress: Callable[[float, str], None] | None = None,
                         on_partial: Callable[[explain.Faithfulness], None] | None = None) -> explain.Faithfulness:
    """Deletion and insertion curves of every supported method's map and of the random baseline
    (explain.faithfulness_by_method), computed now and kept for every session once all are done;
    `progress(fraction, message)` after each unit, `on_partial(result so far)` with the random baseline and
    the methods finished so far, as each finishes (the random baseline first)."""
    finished: list[explain.MethodCurves] = []
    for unit in explain.faithfulness_by_method(loaded, cap, relevance.maps, relevance.target, steps=steps,
                                               progress=progress):
        finished.append(unit)
        if on_partial is not None:
            on_partial(explain.faithfulness_of(relevance.target, steps, finished))
    result = explain.faithfulness_of(relevance.target, steps, finished)
    key = _faithfulness_key(request, image, relevance.target, steps)
    _faithfulness.put(key, result)
    _latest_faithfulness.put(repr((request.key, image.sha)), key)
    return result


def latest_faithfulness(request: ModelRequest, image: ImageChoice) -> explain.Faithfulness | None:
    """The curves computed last for this model and image (any target, any number of steps), if still kept."""
    key = _latest_faithfulness.get(repr((request.key, image.sha)))
    return None if key is None else _faithfulness.get(key)


def explanation_arrays(request: ModelRequest, loaded: LoadedModel, image: ImageChoice,
                       cap: vit_core.Capture) -> dict[str, np.ndarray]:
    """The explanation keys of the export (interface.md, "Explanations in the export", as
    `vit_core.export.explanation_arrays` builds them) from what the dashboard computed, without running
    the curves again: target, relevance_<method>, logit_lens, token_norms, and deletion_<name> /
    insertion_<name> when the curves of this image were computed (for the target they were computed for;
    else the top-1). A function of plain arguments: called from a download button's thread."""
    faith = latest_faithfulness(request, image)
    target = faith.target if faith is not None else explain.resolve_target(loaded, cap.logits)
    return export.explanation_arrays(relevance(request, loaded, image, cap, target),
                                     logit_lens(request.key, image.sha, loaded, cap), explain.token_norms(cap), faith)


# ----------------------------------------------------------------------------------------------
# Figures


@st.cache_resource(max_entries=256, show_spinner=False)
def _figure(key: str, _build: Callable[[], bytes]) -> bytes:
    return _build()


def cached_figure(build: Callable[..., bytes], source: figure_keys.FigureSource, *settings: Any, **options: Any) -> bytes:
    """`build(source, *settings, **options)`: the bytes of a figure, built once per key, which is derived
    from exactly these arguments (dashboard.figure_keys: a builder that could draw anything else is refused).

    Figures cost 50-300 ms each with matplotlib on a busy 2-core machine; a control change rebuilds
    only the figure whose arguments it changes.
    """
    key = figure_keys.figure_key(build, source, settings, options)
    return _figure(key, partial(build, source, *settings, **options))


# ----------------------------------------------------------------------------------------------
# Widget values


def reset_if_out_of_range(key: str, size: int, default: int) -> None:
    """Set widget `key` to `default` if its value is no longer below `size` (call before creating the widget)."""
    if key in st.session_state and st.session_state[key] >= size:
        st.session_state[key] = default


def keep_interventions_for(model_key: str, image_sha: str) -> None:
    """Forget the intervention's chosen patches when the image or model changed, its heads when the model
    changed (another model has other heads). Call before creating the widgets."""
    previous = st.session_state.get(_INT_OWNER)
    if previous == (model_key, image_sha):
        return
    st.session_state[_INT_OWNER] = (model_key, image_sha)
    st.session_state[K_INT_PATCHES] = []
    if previous is None or previous[0] != model_key:
        st.session_state[K_INT_HEADS] = []


def reset_intervention() -> None:
    """on_click callback of the interventions' Reset button: no patch dropped or masked, no head ablated."""
    st.session_state[K_INT_PATCHES] = []
    st.session_state[K_INT_HEADS] = []


# ----------------------------------------------------------------------------------------------
# Clicks on a patch image


def _clicked_patch(chart_key: str) -> int | None:
    """The patch k clicked on the clickable image chart `chart_key` (its marker's customdata), or None."""
    points = st.session_state[chart_key].selection.points
    if not points:
        return None
    point = points[0]
    k = point.get("customdata", point.get("point_index"))
    if isinstance(k, list):
        k = k[0]
    return None if k is None else int(k)


def patch_click_callback(chart_key: str, target_key: str, offset: int = 0) -> None:
    """on_select callback: a click on patch k of a chart sets widget `target_key` to offset + k."""
    k = _clicked_patch(chart_key)
    if k is not None:
        st.session_state[target_key] = offset + k


def toggled(selection: list[int], k: int) -> list[int]:
    """`selection` with patch k added, or removed if it was in it (sorted)."""
    return sorted(set(selection) ^ {k})


def patch_clicks() -> int:
    """How many patches were toggled by a click so far: the clickable chart's key changes with it, so every
    click arrives as a fresh selection (a second click on the same patch is a new event, not a deselection)."""
    return st.session_state.get(_INT_CLICKS, 0)


def patch_toggle_callback(chart_key: str) -> None:
    """on_select callback: a click on patch k of chart `chart_key` adds k to the intervention's patches or removes it."""
    k = _clicked_patch(chart_key)
    if k is not None:
        st.session_state[K_INT_PATCHES] = toggled(st.session_state.get(K_INT_PATCHES, []), k)
        st.session_state[_INT_CLICKS] = patch_clicks() + 1
