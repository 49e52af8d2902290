"""The sidebar: choose a model, choose an image, download the analysis. Small `*_ui` helpers
that return plain values; every widget has an explicit key.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import vit_core
from dashboard import draw, examples, models, process, state, text
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, ImageChoice, markdown_literal
from vit_core import export
from vit_core.devices import DeviceError
from vit_core.loading import TEACHING_MODEL, WEIGHT_SUFFIXES, LoadedModel, env_default_model

# ----------------------------------------------------------------------------------------------
# Model


def model_ui() -> models.ModelRequest | None:
    """The model choice (bound to `?model=`): one of the list or, where the server allows any model, any
    ViT-family name of timm's (with its pretrained tags) or a typed `hf-hub:` id. None while own weights are
    chosen but not uploaded yet. A name this server refuses: an error, and the model in use stays (and is named)."""
    server_device_or_stop()
    refused_message = _take_back_the_refused_choice()  # before the widget exists: afterwards it can't be set
    choices = models.model_choices()
    options = models.picker_options()
    any_model = models.any_model_allowed()
    start = env_default_model()
    name = st.selectbox("Model", options, index=options.index(start) if start in options else 0, key=state.K_MODEL,
                        format_func=lambda n: choices.get(n, n), bind="query-params", accept_new_options=any_model,
                        help=text.MODEL_HELP_ANY if any_model else text.MODEL_HELP)
    if refused_message:
        st.error(refused_message)
    if name not in options:  # typed in (any model), or a value that never was an option
        name = name.strip()
        in_use = state.last_good_model() or models.ModelRequest(start)
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
    arch = st.selectbox("Architecture of your weights", archs, key=state.K_ARCH, format_func=lambda n: choices.get(n, n),
                        help="The timm ViT your weights were trained as." if any_model
                        else "Any timm ViT name works from Python; here, the listed ones.")
    weights = st.file_uploader(f"Weights file (up to {models.MAX_WEIGHTS_MB} MB)", type=[s.lstrip(".") for s in WEIGHT_SUFFIXES],
                               key=state.K_WEIGHTS, max_upload_size=models.MAX_WEIGHTS_MB,
                               help="safetensors preferred; .pth/.pt/.bin are loaded with weights_only (no code runs)")
    labels = st.file_uploader(f"Label file (optional: one class per line, or JSON; up to {models.MAX_LABELS_MB} MB)",
                              type=["txt", "json"], key=state.K_LABELS, max_upload_size=models.MAX_LABELS_MB)
    if weights is None:
        st.info("Upload a weights file for the chosen architecture.")
        return None
    weights_path, digest = state.save_upload(weights)
    labels_path = ""
    names = [(Path(weights_path).name, weights.name)]
    if labels is not None:
        labels_path, labels_digest = state.save_upload(labels)
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


# A choice that failed is taken back: the picker then names the model actually shown. The message and the
# name to show wait in session state for the rerun, which sets the picker before creating it.
_MODEL_REFUSED = "_model_refused"  # (message for the user, the picker's value for the model shown instead)


def _choice_failed(message: str | None, shown: models.ModelRequest) -> None:
    """Say `message` (if any); if the picker can name `shown` (the model used instead) and names another, set
    it to `shown` and rerun. Weights files are not taken back: their uploader keeps the file to try another."""
    value = shown.name
    can_name = not shown.weights_path and (value in models.picker_options() or models.any_model_allowed())
    if can_name and st.session_state.get(state.K_MODEL) != value:
        st.session_state[_MODEL_REFUSED] = (message, value)
        st.rerun()  # the failed run's page is replaced: the message is shown in the rerun
    if message:
        st.error(message)


def _take_back_the_refused_choice() -> str | None:
    """In the rerun after `_choice_failed`, before the picker exists: set it to the model shown instead, and
    return the message to show below it (None if there is none)."""
    refused = st.session_state.pop(_MODEL_REFUSED, None)
    if refused is None:
        return None
    st.session_state[state.K_MODEL] = refused[1]
    return refused[0]


def load_model_ui(request: models.ModelRequest | None) -> tuple[models.ModelRequest, LoadedModel]:
    """Load the requested model with a spinner. A model that can't be had (offline, bad weights, not a ViT): say
    why, and keep showing the session's previous model (at first: the bundled teaching model, or an untrained
    tiny one), which the picker then names. Below the picker: the device the server runs its models on."""
    if request is None:
        request = state.last_good_model() or models.fallback_request()[0]
    try:
        with st.spinner(f"Loading {request.name} (downloading its weights the first time)...", show_time=True):
            loaded = state.load(request)
    except vit_core.ViTLensError as e:
        previous = state.last_good_model()
        if previous is not None and previous != request:
            fallback, note = previous, f"Still showing {markdown_literal(previous.name)}."
        else:
            fallback, note = models.fallback_request()
        kind = "You are offline" if isinstance(e, vit_core.OfflineError) else "That model can't be loaded"
        _choice_failed(f"{kind}: {markdown_literal(request.for_user(str(e)))}\n\n{note}", fallback)
        with st.spinner("Loading the previous model..."):
            request, loaded = fallback, state.load(fallback)
    else:
        state.remember_good_model(request)
    st.caption(device_caption(loaded))
    return request, loaded


def device_caption(loaded: LoadedModel) -> str:
    return f"Runs on: {loaded.device_name} (the server's device)."


# ----------------------------------------------------------------------------------------------
# Image


def image_ui(model_name: str) -> ImageChoice:
    """Example, upload, camera or drawing: the input touched last wins. A bad file: an error and the previous image."""
    names = examples.example_names()
    default = examples.default_example(model_name)
    example = st.selectbox("Example image", names, index=names.index(default), key=state.K_EXAMPLE,
                           bind="query-params", on_change=state.set_image_source, args=("example",))
    upload = st.file_uploader(f"...or your own image (up to {MAX_IMAGE_MB} MB)", type=list(IMAGE_TYPES),
                              key=state.K_UPLOAD, max_upload_size=MAX_IMAGE_MB, on_change=state.set_image_source,
                              args=("upload",), help=text.UPLOAD_HELP.format(mb=MAX_IMAGE_MB))
    camera = None
    if st.toggle("Take a photo with the camera", key=state.K_CAMERA_ON):
        camera = st.camera_input("Camera", key=state.K_CAMERA, on_change=state.set_image_source, args=("camera",))
    drawing = None
    if st.toggle("Draw", key=state.K_DRAW_ON, help="Draw a shape with the mouse or a finger"):
        drawing = draw.draw_ui(state.K_DRAW, on_change=state.set_image_source, args=("draw",))

    source = state.image_source()
    if source == "upload" and upload is not None:
        name, data = upload.name, upload.getvalue()
    elif source == "camera" and camera is not None:
        name, data = "camera photo", camera.getvalue()
    elif source == "draw" and drawing is not None:
        name, data = "drawing.png", drawing
    else:
        name, data = example, state.example_bytes(example)
    try:
        image = state.decode(name, data)
    except vit_core.ImageError as e:
        st.error(f"{markdown_literal(name)}: {markdown_literal(str(e))}")
        previous = state.last_good_image()
        if previous is not None:
            st.caption(f"Still showing {markdown_literal(previous.name)}.")
            return previous
        return state.decode(example, state.example_bytes(example))
    state.remember_good_image(image)
    for note in image.notes:
        st.caption(note)
    return image


# ----------------------------------------------------------------------------------------------
# Export


def export_ui(loaded: LoadedModel, cap: vit_core.Capture, stem: str) -> None:
    make = process.made_at_low_priority(lambda: export.npz_bytes(export.analysis_arrays(loaded, cap)))
    st.download_button("All arrays of this image (.npz)", data=make,
                       file_name=f"{stem}.npz", mime="application/zip", key="dl_npz", on_click="ignore",
                       icon=":material/download:", help="input crop, logits, attention of every layer and head, tokens, "
                                                        "distances, rollout, filters: the format of `python -m vit_core analyze`")
    st.download_button("Summary (.json)", data=export.json_bytes(export.summary(loaded, cap)), file_name=f"{stem}.json",
                       mime="application/json", key="dl_json", on_click="ignore", icon=":material/download:")


def untrained_warning(loaded: LoadedModel) -> None:
    if loaded.weights.startswith("random init"):
        st.warning(text.UNTRAINED, icon=":material/warning:")
