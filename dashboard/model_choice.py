"""The sidebar's model choice, shared by both pages: the Model picker (bound to `?model=`), own weights and labels,
loading with a spinner, and what to show when a model can't be had. Small `*_ui` helpers that return plain values;
every widget has an explicit key (`dashboard.session`).

What is said under the picker is a `ModelNote`: red for a failure the user can act on (a bad weights file, not a
ViT); a calm note where the model can't be downloaded (offline: the bundled Shapes ViT is shown, and the model's
architecture can still be loaded with random weights, "structure only") or where a typed text picked a model.

app.py draws it once per script run, above `st.navigation` (`sidebar`), so the picker keeps its value across pages;
each page script then gets the model with `session.chosen_model()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import vit_core
from dashboard import caches, models, session, text
from dashboard.literal import markdown_literal
from vit_core import settings
from vit_core.loading import TEACHING_MODEL
from vit_core.loading.model import LoadedModel
from vit_core.loading.weights import WEIGHT_SUFFIXES
from vit_core.runtime.devices import DeviceError

K_RANDOM_WEIGHTS, K_PRETRAINED_WEIGHTS = "random_weights", "pretrained_weights"  # the two buttons' widget keys
RANDOM_WEIGHTS_BUTTON = "Load with random weights (structure only)"


@dataclass(frozen=True)
class ModelNote:
    """What the sidebar says under the picker about the model choice."""

    text: str  # markdown: one or two short sentences
    failure: bool = True  # red: something the user can act on; else a calm note (offline, a typed text matched)
    detail: str = ""  # markdown behind "Why?": the loader's own sentence
    random_weights_for: str = ""  # a timm name whose pretrained weights can't be had: its random weights offered
    open_detail: bool = False  # "Why?" (and the offer) open: the user chose that model, it isn't the start-up one
    standing: bool = False  # said on every run while the picker names the model shown, not once


def sidebar() -> tuple[models.ModelRequest, LoadedModel]:
    """The sidebar's title and model choice; the model chosen, also kept in the session for the page that runs
    next (`session.chosen_model`)."""
    with st.sidebar:
        st.title("ViT Lens")
        st.caption("Look inside a Vision Transformer, on your own image.")
        request, loaded = load_model_ui(model_ui())
    session.keep_chosen_model(request, loaded)
    return request, loaded


def model_ui() -> models.ModelRequest | None:
    """The model choice (bound to `?model=`): one of the list or, where the server allows any model, any
    ViT-family name of timm's (with its pretrained tags) or a typed `hf-hub:` id. None while own weights are
    chosen but not uploaded yet. A name this server refuses: an error, and the model in use stays (and is named)."""
    server_device_or_stop()
    refused = session.take_back_refused_choice()  # before the widget exists: afterwards it can't be set
    choices = models.model_choices()
    options = models.picker_options()
    any_model = models.any_model_allowed()
    start = settings.MODEL.text()
    name = st.selectbox("Model", options, index=options.index(start) if start in options else 0, key=session.K_MODEL,
                        format_func=lambda n: choices.get(n, n), bind="query-params", accept_new_options=any_model,
                        help=text.MODEL_HELP_ANY if any_model else text.MODEL_HELP)
    standing = session.model_note(name)  # (also forgets a note about a model no longer named)
    note = refused if refused is not None else standing
    if note is not None:
        show_note(note, "picker")
    if name not in options:  # typed in (any model), or a value that never was an option
        name = name.strip()
        in_use = session.last_good_model() or models.ModelRequest(start)
        if name == models.UPLOAD_WEIGHTS:  # a link asking for weights uploads where they are off: ignored,
            _show_instead(None, in_use)  # as Streamlit ignores any other invalid value in a link
            return in_use
        match = models.match_typed_name(name, choices, options) if any_model else None
        if match is not None and match[0] != name:  # part of a name, typed and confirmed with Enter
            _show_instead(matched_note(name, *match), models.ModelRequest(match[0]))  # (reruns, the picker on it)
            name = match[0]
        refusal = models.typed_name_refusal(name)
        if refusal is not None:
            _show_instead(ModelNote(f"{markdown_literal(name)} can't be chosen: {refusal}"), in_use)
            return in_use
    if name != models.UPLOAD_WEIGHTS:
        random_weights = session.random_weights_chosen(name)
        if random_weights:
            st.caption("Random weights (structure only): its attention, filters and predictions were not learned.")
            st.button("Try its pretrained weights", key=K_PRETRAINED_WEIGHTS, on_click=session.choose_random_weights,
                      args=(name, False), icon=":material/download:")
        return models.ModelRequest(name, random_weights=random_weights)
    archs = [n for n in options if n not in (TEACHING_MODEL, models.TEST_TINY, models.UPLOAD_WEIGHTS)]
    arch = st.selectbox("Architecture of your weights", archs, key=session.K_ARCH, format_func=lambda n: choices.get(n, n),
                        help="The timm ViT your weights were trained as." if any_model
                        else "Any timm ViT name works from Python; here, the listed ones.")
    weights = st.file_uploader(f"Weights file (up to {models.MAX_WEIGHTS_MB} MB)", type=[s.lstrip(".") for s in WEIGHT_SUFFIXES],
                               key=session.K_WEIGHTS, max_upload_size=models.MAX_WEIGHTS_MB,
                               help="safetensors preferred; .pth/.pt/.bin are loaded with weights_only (no code runs)")
    labels = st.file_uploader(f"Label file (optional: one class per line, or JSON; up to {models.MAX_LABELS_MB} MB)",
                              type=["txt", "json"], key=session.K_LABELS, max_upload_size=models.MAX_LABELS_MB)
    if weights is None:
        st.info("Upload a weights file for the chosen architecture.")
        return None
    weights_path, digest = session.save_upload(weights)
    labels_path = ""
    names = [(Path(weights_path).name, weights.name)]
    if labels is not None:
        labels_path, labels_digest = session.save_upload(labels)
        digest += labels_digest[:16]
        names.append((Path(labels_path).name, labels.name))
    return models.ModelRequest(arch, weights_path=weights_path, labels_path=labels_path, weights_id=digest,
                               uploaded_names=tuple(names))


def server_device_or_stop() -> None:
    """The server's device setting ($VIT_LENS_DEVICE), checked before any model is built: a value this machine
    can't honour (`dashboard.serve` refuses it at start; `streamlit run` doesn't) ends the page with one sentence."""
    try:
        models.server_device()
    except DeviceError as e:
        st.error(f"This server's device setting (VIT_LENS_DEVICE) can't be used: {markdown_literal(str(e))}")
        st.stop()


# A choice that failed (or a typed text that matched a model) is taken back: the picker then names the model actually
# shown. The note and the name to show wait in session state for the rerun, which sets the picker before creating it.


def _show_instead(note: ModelNote | None, shown: models.ModelRequest) -> None:
    """Say `note` (if any); if the picker can name `shown` (the model used instead) and names another, set it to
    `shown` and rerun. Weights files are not taken back: their uploader keeps the file to try another."""
    value = shown.name
    if note is not None and note.standing:
        session.keep_model_note(note, value)
    can_name = not shown.weights_path and (value in models.picker_options() or models.any_model_allowed())
    if can_name and session.model_choice() != value:
        session.refuse_model_choice(note, value)
        st.rerun()  # the failed run's page is replaced: the note is shown in the rerun
    if note is not None:
        show_note(note, "load")


def show_note(note: ModelNote, where: str) -> None:
    """A failure in red; a calm note in blue, its detail and the random-weights offer behind "Why?". `where` tells
    apart the buttons of the notes said under the picker and after a load, which can both be said in one run."""
    if note.failure:
        st.error(note.text)
    else:
        st.info(note.text, icon=":material/info:")
    if not (note.detail or note.random_weights_for):
        return
    with st.expander("Why?", expanded=note.open_detail):
        if note.detail:
            st.markdown(note.detail)
        if note.random_weights_for:
            st.button(RANDOM_WEIGHTS_BUTTON, key=f"{K_RANDOM_WEIGHTS}_{where}", on_click=_choose_random_weights,
                      args=(note.random_weights_for,), icon=":material/casino:",
                      help=f"Build {note.random_weights_for} with random weights: its patches, tokens, layers and "
                           "heads are real, what it attends to and predicts is not learned.")


def _choose_random_weights(name: str) -> None:
    """The offer's button (a callback: runs before the rerun, so the picker can still be set): `name`, random weights."""
    session.choose_random_weights(name)
    session.pick_model(name)


def matched_note(typed: str, picked: str, count: int) -> ModelNote:
    """The calm note for a typed text that picked a model: which one, and how to get another."""
    typed_md = markdown_literal(typed.strip())
    if count == 1:
        return ModelNote(f"“{typed_md}”: **{markdown_literal(picked)}**, the one model whose name matches.", failure=False)
    return ModelNote(f"“{typed_md}” matches {count} models: showing **{markdown_literal(picked)}**. Type more of a "
                     "name to pick another.", failure=False)


def failure_note(request: models.ModelRequest, error: vit_core.ViTLensError, shown: models.ModelRequest,
                 shown_note: str, chosen: bool, untrained: bool = False) -> ModelNote:
    """What to say when `request` can't be loaded and `shown` is shown instead (`shown_note` says so for a failure).
    Offline, or a timm architecture with no weights to download, is a calm note that stays while `shown` is shown
    and offers the architecture's random weights; anything else is a failure, and so is an `untrained` stand-in
    (the bundled model is missing too). `chosen`: the user picked `request` (not the start-up model): the offer is
    open."""
    why = markdown_literal(request.for_user(str(error)))
    offline = isinstance(error, vit_core.OfflineError)
    unavailable = not request.weights_path and not request.random_init and models.pretrained_unavailable(request.name, error)
    if not (offline or unavailable) or untrained:
        kind = "You are offline" if offline else "That model can't be loaded"
        return ModelNote(f"{kind}: {why}\n\n{shown_note}")
    name = markdown_literal(request.name)
    instead = ("using the bundled Shapes ViT" if shown.name == TEACHING_MODEL
               else f"still showing **{markdown_literal(shown.name)}**")
    if shown.name == request.name:  # its random weights, chosen before: the pretrained ones tried again
        instead = "its random weights stay"
    if not offline:
        text = f"**{name}** has no pretrained weights: {instead}."
    elif chosen:  # the user picked it (the start-up model's failure is the normal offline state: said shortly)
        text = f"**Offline**: **{name}** can't be downloaded; {instead}."
    else:
        text = f"**Offline**: {instead}."
    offer = request.name if unavailable else ""
    detail = why + (f"\n\n{markdown_literal(request.name)}'s architecture can still be loaded with random weights: "
                    "its patches, tokens, layers and heads are real; what it attends to and predicts is not learned."
                    if offer else "")
    return ModelNote(text, failure=False, detail=detail, random_weights_for=offer, open_detail=chosen, standing=True)


def load_model_ui(request: models.ModelRequest | None) -> tuple[models.ModelRequest, LoadedModel]:
    """Load the requested model with a spinner. A model that can't be had (offline, bad weights, not a ViT): say
    why, and keep showing the session's previous model (at first: the bundled teaching model, or an untrained
    tiny one), which the picker then names. Below the picker: the device the server runs its models on."""
    if request is None:
        request = session.last_good_model() or models.fallback_request()[0]
    try:
        with st.spinner(f"Loading {request.name} (downloading its weights the first time)...", show_time=True):
            loaded = caches.load(request)
    except vit_core.ViTLensError as e:
        previous = session.last_good_model()
        if previous is not None and previous != request:
            fallback, note = previous, f"Still showing {markdown_literal(previous.name)}."
        else:
            fallback, note = models.fallback_request()
        if fallback.random_weights and fallback.name == request.name:  # its pretrained weights tried again, in vain:
            session.choose_random_weights(request.name)  # the next run asks for the random ones again
        untrained = fallback.name == models.TEST_TINY and fallback != previous  # the bundled model is missing
        _show_instead(failure_note(request, e, fallback, note, chosen=previous is not None, untrained=untrained),
                      fallback)
        with st.spinner("Loading the previous model..."):
            request, loaded = fallback, caches.load(fallback)
    else:
        session.remember_good_model(request)
    loaded = request.shown(loaded)
    st.caption(device_caption(loaded))
    return request, loaded


def device_caption(loaded: LoadedModel) -> str:
    return f"Runs on: {loaded.device_name} (the server's device)."
