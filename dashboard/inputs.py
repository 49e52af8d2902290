"""The sidebar: choose a model, choose an image, download the analysis. Small `*_ui` helpers
that return plain values; every widget has an explicit key.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import vit_core
from dashboard import draw, examples, models, state, text
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, ImageChoice, markdown_literal
from vit_core import export
from vit_core.loading import TEACHING_MODEL, WEIGHT_SUFFIXES, LoadedModel, env_default_model

# ----------------------------------------------------------------------------------------------
# Model


def model_ui() -> models.ModelRequest | None:
    """The model choice (bound to `?model=`); None while own weights are chosen but not uploaded yet."""
    choices = models.model_choices()
    names = list(choices)
    start = env_default_model()
    name = st.selectbox("Model", names, index=names.index(start) if start in names else 0, key=state.K_MODEL,
                        format_func=lambda n: choices[n], bind="query-params",
                        help="timm Vision Transformers; pretrained weights are downloaded once (the first time "
                             "can take a minute). The bundled Shapes ViT works offline.")
    if name != models.UPLOAD_WEIGHTS:
        return models.ModelRequest(name)
    archs = [n for n in models.MODEL_CHOICES if n not in (TEACHING_MODEL, models.UPLOAD_WEIGHTS)]
    arch = st.selectbox("Architecture of your weights", archs, key=state.K_ARCH,
                        help="Any timm ViT name works from Python; here, the listed ones.")
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


def load_model_ui(request: models.ModelRequest | None) -> tuple[models.ModelRequest, LoadedModel]:
    """Load the requested model with a spinner. A model that can't be had (offline, bad weights): say why,
    and keep showing the session's previous model (at first: the bundled teaching model, or an untrained tiny one)."""
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
        st.error(f"{kind}: {markdown_literal(request.for_user(str(e)))}\n\n{note}")
        with st.spinner("Loading the previous model..."):
            return fallback, state.load(fallback)
    state.remember_good_model(request)
    return request, loaded


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
    st.download_button("All arrays of this image (.npz)", data=lambda: export.npz_bytes(export.analysis_arrays(loaded, cap)),
                       file_name=f"{stem}.npz", mime="application/zip", key="dl_npz", on_click="ignore",
                       icon=":material/download:", help="input crop, logits, attention of every layer and head, tokens, "
                                                        "distances, rollout, filters: the format of `python -m vit_core analyze`")
    st.download_button("Summary (.json)", data=export.json_bytes(export.summary(loaded, cap)), file_name=f"{stem}.json",
                       mime="application/json", key="dl_json", on_click="ignore", icon=":material/download:")


def untrained_warning(loaded: LoadedModel) -> None:
    if loaded.weights.startswith("random init"):
        st.warning(text.UNTRAINED, icon=":material/warning:")
