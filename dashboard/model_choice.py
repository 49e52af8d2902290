"""The sidebar's model choice, shared by both pages: the Model picker (bound to `?model=`), own weights and labels,
loading with a spinner, and what to show when a model can't be had. Small `*_ui` helpers that return plain values;
every widget has an explicit key (`dashboard.session`).

app.py draws it once per script run, above `st.navigation` (`sidebar`), so the picker keeps its value across pages;
each page script then gets the model with `session.chosen_model()`.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import vit_core
from dashboard import caches, models, session, text
from dashboard.image_choice import markdown_literal
from vit_core import settings
from vit_core.devices import DeviceError
from vit_core.loading import TEACHING_MODEL
from vit_core.model import LoadedModel
from vit_core.weights import WEIGHT_SUFFIXES


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
    refused_message = session.take_back_refused_choice()  # before the widget exists: afterwards it can't be set
    choices = models.model_choices()
    options = models.picker_options()
    any_model = models.any_model_allowed()
    start = settings.MODEL.text()
    name = st.selectbox("Model", options, index=options.index(start) if start in options else 0, key=session.K_MODEL,
                        format_func=lambda n: choices.get(n, n), bind="query-params", accept_new_options=any_model,
                        help=text.MODEL_HELP_ANY if any_model else text.MODEL_HELP)
    if refused_message:
        st.error(refused_message)
    if name not in options:  # typed in (any model), or a value that never was an option
        name = name.strip()
        in_use = session.last_good_model() or models.ModelRequest(start)
        if name == models.UPLOAD_WEIGHTS:  # a link asking for weights uploads where they are off: ignored,
            _choice_failed(None, in_use)  # as Streamlit ignores any other invalid value in a link
            return in_use
        refusal = models.typed_name_refusal(name)
        if refusal is not None:
            _choice_failed(f"{markdown_literal(name)} can't be chosen: {refusal}", in_use)
            return in_use
    if name != models.UPLOAD_WEIGHTS:
        return models.ModelRequest(name)
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
    can't honour (`dashboard.server.serve` refuses it at start; `streamlit run` doesn't) ends the page with one sentence."""
    try:
        models.server_device()
    except DeviceError as e:
        st.error(f"This server's device setting (VIT_LENS_DEVICE) can't be used: {markdown_literal(str(e))}")
        st.stop()


# A choice that failed is taken back: the picker then names the model actually shown. The message and the
# name to show wait in session state for the rerun, which sets the picker before creating it.


def _choice_failed(message: str | None, shown: models.ModelRequest) -> None:
    """Say `message` (if any); if the picker can name `shown` (the model used instead) and names another, set
    it to `shown` and rerun. Weights files are not taken back: their uploader keeps the file to try another."""
    value = shown.name
    can_name = not shown.weights_path and (value in models.picker_options() or models.any_model_allowed())
    if can_name and session.model_choice() != value:
        session.refuse_model_choice(message, value)
        st.rerun()  # the failed run's page is replaced: the message is shown in the rerun
    if message:
        st.error(message)


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
        kind = "You are offline" if isinstance(e, vit_core.OfflineError) else "That model can't be loaded"
        _choice_failed(f"{kind}: {markdown_literal(request.for_user(str(e)))}\n\n{note}", fallback)
        with st.spinner("Loading the previous model..."):
            request, loaded = fallback, caches.load(fallback)
    else:
        session.remember_good_model(request)
    st.caption(device_caption(loaded))
    return request, loaded


def device_caption(loaded: LoadedModel) -> str:
    return f"Runs on: {loaded.device_name} (the server's device)."
