"""The session state of both pages: the widget keys, what a session keeps for itself, and the callbacks that change it.

The one module that reads or writes `st.session_state` (tests/unit/test_dashboard_parts.py checks it). The shared
caches are `dashboard.caches`.

Widget keys: selections that matter live in the URL. Those widgets are created with `bind="query-params"`, so
their key is the query parameter of a shared link (`?model=...&view=Attention&layer=3`). The Many images page's
keys are prefixed (`many_`): one session state serves both pages.

What a session keeps (not widgets): the model and image it last loaded (kept after a refused one), which image
input it touched last, the capture it holds in the shared cache, its attention-distance history, its saved
uploads, the canvases' clear counters, the patches and heads of its intervention (with the model and image they
belong to, and a patch-click count), the model chosen in the sidebar for this run (read by the pages), and the
Many images page's latest result. What a session keeps is capped (the distance history, the saved uploads).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import streamlit as st

from dashboard.server import uploads

if TYPE_CHECKING:
    from dashboard.image_choice import ImageChoice
    from dashboard.image_sets import ManyRun, SetConceptsRun
    from dashboard.models import ModelRequest
    from vit_core.loading.model import LoadedModel

MAX_HISTORY_IMAGES = 200  # per session and model: the distance history keeps the latest (2 small arrays each)
MAX_HISTORY_MODELS = 4
MAX_SAVED_UPLOADS = 8  # per session: weights / label files remembered by upload id

# Widget keys. Those bound to the URL are the query parameters of a shared link.
K_MODEL, K_ARCH, K_WEIGHTS, K_LABELS = "model", "arch", "weights_file", "labels_file"
K_WEIGHTS_B = "weights_file_b"  # the Compare tab's model B from a weights file
K_EXAMPLE, K_UPLOAD, K_CAMERA_ON, K_CAMERA = "example", "upload", "camera_on", "camera"
K_DRAW_ON, K_DRAW = "draw_on", "draw"
K_VIEW, K_LAYER, K_HEAD, K_QUERY, K_PATCH = "view", "layer", "head", "query", "patch"
K_FUSION, K_ROLLOUT_LAYER, K_POS_PATCH, K_POS_RES = "fusion", "rollout_layer", "pos_patch", "pos_res"
K_FILTER_START, K_MAD_RENORM, K_MAD_BATCH, K_TOPK = "filter_start", "mad_renorm", "mad_batch", "topk"
K_TARGET, K_METHODS, K_STEPS, K_LENS_LAYER = "target", "methods", "steps", "lens_layer"
K_TESTS = "tests"
K_WHY_LEFT, K_WHY_RIGHT = "why_left", "why_right"  # the Why? tab's pair of maps
K_INT_PATCHES, K_INT_MODE, K_INT_HEADS, K_INT_ABLATION = "int_patches", "int_mode", "int_heads", "int_ablation"
K_NORM_LAYER = "norm_layer"
K_CONCEPTS, K_CONCEPT_REMOVED = "concepts", "concept_removed"  # the Concepts tab: the concepts chosen, the feature removed
K_CIRCUIT_EDGE, K_CIRCUIT_CLICK = "concept_circuit_edge", "concept_circuit_click"  # the circuit's edge chosen, its clicks
# The Many images page.
K_MANY_SOURCE, K_MANY_COUNT, K_MANY_SEED = "many_source", "many_count", "many_seed"
K_MANY_FILES, K_MANY_RUN, K_MANY_EXPLAIN = "many_files", "many_run", "many_explain"
# Its Concepts section: the concepts path, Find, the feature to remove, Remove.
K_MANY_CONCEPTS, K_MANY_CONCEPTS_FIND = "many_concepts", "many_concepts_find"
K_MANY_CONCEPT_REMOVED, K_MANY_CONCEPT_REMOVE = "many_concept_removed", "many_concept_remove"

# Session-state keys that are not widgets.
_HOLDER = "_capture_holder"  # this session's name in the capture cache's holds: see holder
_SOURCE, _LAST_GOOD, _MAD_HISTORY, _SAVED_UPLOADS = "_image_source", "_last_good_image", "_mad_history", "_saved_uploads"
_LAST_GOOD_MODEL = "_last_good_model"  # the ModelRequest this session last loaded: kept after a refused model
_MODEL_REFUSED = "_model_refused"  # (message for the user, the picker's value for the model shown instead)
_MODEL_NOTE = "_model_note"  # (a note about the model shown, the picker's value it is about): see keep_model_note
_RANDOM_WEIGHTS = "_random_weights"  # the timm names this session asked to load with random weights
_CHOSEN_MODEL = "_chosen_model"  # (ModelRequest, LoadedModel) the sidebar chose in this script run: see chosen_model
_CANVAS_GENERATION = "_canvas_generation"  # canvas key -> how many times it was cleared: see canvas_generation
_INT_OWNER = "_intervention_owner"  # (model key, image sha) the chosen patches belong to: see keep_interventions_for
_TARGET_OWNER = "_target_owner"  # (model key, image sha) the chosen target class belongs to: see keep_target_for
_INT_CLICKS = "_intervention_clicks"  # how many patch clicks so far: part of the clickable chart's key
_DECODE_LOCK = "_decode_lock"  # see decode_lock
_MANY_LATEST_RUN = "_many_latest_run"  # ManyRun: the last finished run of the Many images page
_MANY_CONCEPTS = "_many_concepts"  # SetConceptsRun: the last set whose concepts the Many images page found
_INPUT_REFUSAL = "_input_refusal"  # the input this script run refused, for the main area: see keep_input_refusal
_OBJECTS = "_objects"  # image sha -> KnownObject: where the object is, for a drawing or a shape example
MAX_KNOWN_OBJECTS = 4  # per session: the latest images whose object it knows (a mask of the image's size each)
_COMPARE_SET = "_compare_set"  # the Compare tab: (A's key, B's key) whose set comparison was asked for
_COMPARE_OPENED = "_compare_opened"  # the Compare tab: (name, bytes) of the set image opened above, or None


# ----------------------------------------------------------------------------------------------
# The model


def keep_chosen_model(request: ModelRequest, loaded: LoadedModel) -> None:
    """app.py, in every script run: the model the sidebar chose, for the page that runs next (`chosen_model`)."""
    st.session_state[_CHOSEN_MODEL] = (request, loaded)


def chosen_model() -> tuple[ModelRequest, LoadedModel]:
    """The page scripts: (request, loaded) of the model chosen in the sidebar in this script run."""
    return st.session_state[_CHOSEN_MODEL]


def chosen_model_if_any() -> LoadedModel | None:
    """The model chosen in the sidebar in this script run, or None before the sidebar chose one."""
    chosen = st.session_state.get(_CHOSEN_MODEL)
    return None if chosen is None else chosen[1]


def model_choice() -> str | None:
    """The Model picker's value (its widget state), or None before the picker exists."""
    return st.session_state.get(K_MODEL)


def refuse_model_choice(message: Any, shown: str) -> None:
    """A choice that failed: in the rerun that follows, the picker is set to `shown` before it exists (afterwards
    it can't be set) and `message` said below it (see `take_back_refused_choice`)."""
    st.session_state[_MODEL_REFUSED] = (message, shown)


def take_back_refused_choice() -> Any:
    """In the rerun after `refuse_model_choice`, before the picker exists: set it to the model shown instead, and
    return the message to show below it (None if there is none)."""
    refused = st.session_state.pop(_MODEL_REFUSED, None)
    if refused is None:
        return None
    st.session_state[K_MODEL] = refused[1]
    return refused[0]


def keep_model_note(note: Any, shown: str) -> None:
    """A note (dashboard.model_choice.ModelNote) said under the picker on every run while it names `shown`."""
    st.session_state[_MODEL_NOTE] = (note, shown)


def model_note(shown: str) -> Any:
    """The note kept about `shown`, the picker's value now; None, and the note forgotten, once it names another."""
    kept = st.session_state.get(_MODEL_NOTE)
    if kept is not None and kept[1] != shown:
        del st.session_state[_MODEL_NOTE]
        return None
    return None if kept is None else kept[0]


def pick_model(name: str) -> None:
    """From a widget's callback (it runs before the rerun creates the picker): the picker set to `name`."""
    st.session_state[K_MODEL] = name


def random_weights_chosen(name: str) -> bool:
    """Whether this session asked for timm model `name` with random weights (its pretrained ones can't be had)."""
    return name in st.session_state.get(_RANDOM_WEIGHTS, ())


def choose_random_weights(name: str, chosen: bool = True) -> None:
    names = set(st.session_state.get(_RANDOM_WEIGHTS, ()))
    st.session_state[_RANDOM_WEIGHTS] = frozenset(names | {name} if chosen else names - {name})


def last_good_model() -> ModelRequest | None:
    return st.session_state.get(_LAST_GOOD_MODEL)


def remember_good_model(request: ModelRequest) -> None:
    st.session_state[_LAST_GOOD_MODEL] = request


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
# The image


def image_source() -> str:
    return st.session_state.get(_SOURCE, "example")


def set_image_source(source: str) -> None:
    """on_change callback of the image inputs: the input touched last is the one shown."""
    st.session_state[_SOURCE] = source


def drawing_on() -> bool:
    """Whether the Draw toggle is on: its value in this run, known before the toggle is drawn (the page places the
    canvas in the main area, beside the drawing's result, only then)."""
    return bool(st.session_state.get(K_DRAW_ON, False))


def widget_value(key: str, default: Any) -> Any:
    """The value a widget with `key` holds in this session, before it is drawn in this run (`default` before its
    first run): a page that lays out what the widget will show, ahead of the widget."""
    return st.session_state.get(key, default)


def linked_head(value: str) -> int | None:
    """The head a `&head=` value written as a number (`2`, `-1`) or `mean` means (-1: the mean of all heads), else None:
    the widget itself binds to its labels (`head 2`), which links keep working with too."""
    value = value.strip()
    if value == "mean":
        return -1
    # ASCII digits only: str.isdigit takes "²", which int() refuses
    return int(value) if re.fullmatch(r"-?[0-9]{1,4}", value) and int(value) >= -1 else None


def link_labels(params: dict[str, str], renamed: dict[str, str], head_label: Callable[[int], str],
                token_name: Callable[[int], str], num_heads: int, num_tokens: int) -> dict[str, str]:
    """The parameters of a link that the README's forms name by something else than the bound widget's label, with the
    label each means: a former tab label (`view=Attention` -> `5 Attention`), a head by number (`head=2` -> `head 2`),
    a token by index (`query=5` -> its name). Empty when the link already speaks in labels."""
    out = {}
    if params.get(K_VIEW) in renamed:
        out[K_VIEW] = renamed[params[K_VIEW]]
    head = linked_head(params.get(K_HEAD, "x"))
    if head is not None and head < num_heads:
        out[K_HEAD] = head_label(head)
    query = params.get(K_QUERY, "").strip()
    if re.fullmatch(r"[0-9]{1,6}", query) and int(query) < num_tokens:
        out[K_QUERY] = token_name(int(query))
    return out


def open_link(renamed: dict[str, str], head_label: Callable[[int], str], token_name: Callable[[int], str],
              num_heads: int, num_tokens: int) -> None:
    """Before any widget bound to the URL exists: a link in one of the README's other forms (`link_labels`) is
    rewritten to the labels and the page runs again, so the widgets open on it and the URL keeps it (a bound widget
    drops a value it doesn't know from the URL; once bound, a parameter can't be set from the script)."""
    if st.session_state.get(K_VIEW) in renamed:  # set so by a script (the load test)
        st.session_state[K_VIEW] = renamed[st.session_state[K_VIEW]]
    labels = link_labels(st.query_params.to_dict(), renamed, head_label, token_name, num_heads, num_tokens)
    if not labels:
        return
    try:
        st.query_params.update(labels)
    except st.errors.StreamlitAPIException:  # already bound in this session: the widgets keep their values
        return
    st.rerun()


def canvas_generation(key: str) -> int:
    """How often the canvas `key` was cleared: part of its widget key, since a new key is a fresh, empty canvas
    (the component keeps its drawing per key)."""
    return st.session_state.get(_CANVAS_GENERATION, {}).get(key, 0)


def stroke_key(key: str) -> str:
    """The widget key of canvas `key`'s stroke-width slider."""
    return f"{key}_stroke"


def pen_width(key: str, default: int) -> int:
    """The pen width canvas `key` draws with now (its slider's value), in canvas pixels."""
    return int(st.session_state.get(stroke_key(key), default))


def clear_canvas(key: str) -> None:
    """on_click callback of the canvas's Clear button."""
    generations = st.session_state.setdefault(_CANVAS_GENERATION, {})
    generations[key] = generations.get(key, 0) + 1


def last_good_image() -> ImageChoice | None:
    return st.session_state.get(_LAST_GOOD)


def remember_good_image(image: ImageChoice) -> None:
    st.session_state[_LAST_GOOD] = image


def keep_input_refusal(refusal) -> None:
    """The input the sidebar refused in this script run (an `inputs.Refusal`), or None: set on every run by the
    image choice, read by the page where it says so in the main area."""
    st.session_state[_INPUT_REFUSAL] = refusal


def input_refusal():
    """The input refused in this script run (`inputs.Refusal`), or None."""
    return st.session_state.get(_INPUT_REFUSAL)


@dataclass(frozen=True)
class KnownObject:
    """Where the object is in an image the session shows: the ground truth the Why? tab scores maps against."""

    mask: np.ndarray  # (H, W) bool in the image's own pixels, True on the object
    source: str  # where it comes from, for the caption ("your strokes, ...", "the generator's mask")


def remember_object(image_sha: str, mask: np.ndarray, source: str) -> None:
    """Keep the object of image `image_sha` (the latest MAX_KNOWN_OBJECTS images)."""
    known = st.session_state.setdefault(_OBJECTS, {})
    known.pop(image_sha, None)
    known[image_sha] = KnownObject(mask, source)
    while len(known) > MAX_KNOWN_OBJECTS:
        known.pop(next(iter(known)))


def known_object(image_sha: str) -> KnownObject | None:
    return st.session_state.get(_OBJECTS, {}).get(image_sha)


def holder() -> str:
    """This session's name among the holders of the shared capture cache (`caches.held_capture`)."""
    return st.session_state.setdefault(_HOLDER, uuid.uuid4().hex)


# ----------------------------------------------------------------------------------------------
# The attention-distance history


def remember_distances(model_key: str, image_sha: str, result: tuple[np.ndarray, np.ndarray]) -> None:
    """(MAD, MAD renormalised) of one image join the session's history (the latest image of the latest model last)."""
    history = st.session_state.setdefault(_MAD_HISTORY, {})
    per_model = history.pop(model_key, {})
    history[model_key] = per_model  # the latest model last
    per_model.pop(image_sha, None)
    per_model[image_sha] = result  # the latest image last
    while len(per_model) > MAX_HISTORY_IMAGES:
        del per_model[next(iter(per_model))]
    while len(history) > MAX_HISTORY_MODELS:
        del history[next(iter(history))]


def distance_history(model_key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per image sha: (MAD, MAD renormalised) of every image analysed with this model in this session."""
    return st.session_state.get(_MAD_HISTORY, {}).get(model_key, {})


# ----------------------------------------------------------------------------------------------
# Widget values and callbacks


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


def keep_target_for(model_key: str, image_sha: str) -> None:
    """Back to the top-1 target when the image or model changed in this session (a drawing after the example: the
    example's class is rarely the drawing's); the first image keeps the target the URL gave. Call before the widget."""
    previous = st.session_state.get(_TARGET_OWNER)
    st.session_state[_TARGET_OWNER] = (model_key, image_sha)
    if previous is not None and previous != (model_key, image_sha):
        st.session_state.pop(K_TARGET, None)


def reset_intervention() -> None:
    """on_click callback of the interventions' Reset button: no patch dropped or masked, no head ablated."""
    st.session_state[K_INT_PATCHES] = []
    st.session_state[K_INT_HEADS] = []


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


# ----------------------------------------------------------------------------------------------
# The Many images page


def latest_many_run() -> ManyRun | None:
    """The last finished run of the Many images page in this session, or None."""
    return st.session_state.get(_MANY_LATEST_RUN)


def keep_many_run(run: ManyRun) -> None:
    st.session_state[_MANY_LATEST_RUN] = run


def latest_many_concepts() -> SetConceptsRun | None:
    """The last set whose concepts the Many images page found in this session (with its removals), or None."""
    return st.session_state.get(_MANY_CONCEPTS)


def keep_many_concepts(found: SetConceptsRun) -> None:
    st.session_state[_MANY_CONCEPTS] = found


def decode_lock() -> threading.Lock:
    """This session's lock around its image decodes: one decode in flight per session (a second tab is a second
    session), so one student's files hold at most one of the server's MAX_CONCURRENT_DECODES slots."""
    return st.session_state.setdefault(_DECODE_LOCK, threading.Lock())


# ----------------------------------------------------------------------------------------------
# The Compare tab


def compare_set_asked() -> tuple[str, str] | None:
    """(A's key, B's key) of the pair whose comparison over the set this session asked for, or None."""
    return st.session_state.get(_COMPARE_SET)


def ask_compare_set(keys: tuple[str, str]) -> None:
    st.session_state[_COMPARE_SET] = keys


def compare_opened() -> tuple[str, bytes] | None:
    """The set image (name, its bytes) that the Compare tab shows above instead of the sidebar's, or None."""
    return st.session_state.get(_COMPARE_OPENED)


def open_compare_image(name: str | None, data: bytes | None = None) -> None:
    """on_click callback: show set image `name` above in the Compare tab (None: the sidebar's image again)."""
    st.session_state[_COMPARE_OPENED] = None if name is None else (name, data)


def choose_clicked_edge(options: list[str]) -> None:
    """The circuit chart's on_select: a click on an edge's middle marker (customdata [i, r, c]) chooses the option
    that starts with "i|r|c|"."""
    points = st.session_state[K_CIRCUIT_CLICK].selection.points
    if points and isinstance(points[0].get("customdata"), list):
        i, r, c = points[0]["customdata"]
        chosen = next((o for o in options if o.startswith(f"{i}|{r}|{c}|")), None)
        if chosen is not None:
            st.session_state[K_CIRCUIT_EDGE] = chosen


def forget_edge_not_in(options: list[str]) -> None:
    """The chosen edge forgotten when this image's circuit has no such option (another image, another folder)."""
    if st.session_state.get(K_CIRCUIT_EDGE) not in [None, *options]:
        st.session_state[K_CIRCUIT_EDGE] = None
