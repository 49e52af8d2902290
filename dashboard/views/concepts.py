"""The Concepts tab: the sparse-autoencoder features (vit_core.concepts) a `vit-lens concepts` run learned for this
model, on the image on screen: its strongest features as maps beside their top patches from the folder, the image's
reconstruction error, and "remove this concept" with the prediction before and after (as the Interventions tab).
Definitions: docs/spec/analyses.md, "Concepts". The features come from the capture's own tokens; only the removal
runs the model again (cached per model, image, concepts file and feature)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import concepts as concept_figures
from dashboard.figures import interventions as intervention_figures
from dashboard.literal import markdown_literal as md
from dashboard.views.context import (
    TARGET_CHOICES,
    ModelSource,
    ViewContext,
    cached_figure,
    column_px,
    no_head,
    show_picture,
)
from vit_core import analyses, settings
from vit_core.concepts import Concepts, ConceptsError
from vit_core.concepts.folders import check_circuit, circuit_beside, offered_folders, outside_files, typed_folder
from vit_core.concepts.quality import STABLE_COSINE
from vit_core.loading.model import LoadedModel

FEATURE_COLUMNS = [1, 3]  # the feature's map on the image, then its top patches from the folder
CROPS_SHOWN = 8
MAP_PX = 160


def _feature_map_png(ctx: ViewContext, path: str, concepts_key: str, feature: int) -> bytes:
    _, opened = caches.loaded_concepts(path)
    seen = caches.image_concepts(ctx.request, ctx.image, concepts_key, opened.concepts, ctx.cap)
    g = ctx.loaded.geometry
    activation = seen.codes[:, feature].reshape(g.grid)  # (N,) -> (gh, gw)
    return figures.encode(concept_figures.feature_map_image(ctx.cap.input_image, activation, g.patch_size, MAP_PX), "png")


def folder_crops_png(model: ModelSource, path: str, concepts_key: str, feature: int) -> bytes:
    """A feature's top patches from the folder it was learned on, side by side (the Many images page's too)."""
    _, opened = caches.loaded_concepts(path)
    crops = caches.feature_crops(model.request, model.loaded, concepts_key, opened, feature, CROPS_SHOWN)
    return figures.encode(concept_figures.crops_row_image([crop for crop, _ in crops]), "png")


def _prediction_change_png(ctx: ViewContext, path: str, concepts_key: str, feature: int) -> bytes:
    _, opened = caches.loaded_concepts(path)
    before = ctx.cap.probs
    after = analyses.softmax(caches.concept_removed_logits(ctx.request, ctx.loaded, ctx.image, ctx.cap, concepts_key,
                                                           opened.concepts, feature))
    classes = list(dict.fromkeys([int(i) for i in np.argsort(-before, kind="stable")[:TARGET_CHOICES]]
                                 + [int(i) for i in np.argsort(-after, kind="stable")[:TARGET_CHOICES]]))
    return intervention_figures.prediction_change_png([ctx.loaded.label(c) for c in classes], before[classes].tolist(),
                                                      after[classes].tolist(), width_px=column_px([1, 1], 1) - 20)


def _ranked(logits: np.ndarray, labels) -> str:
    return "\n".join(f"{i + 1}. {md(p.label)} ({p.prob:.1%})" for i, p in enumerate(analyses.top_k(logits, labels,
                                                                                                 TARGET_CHOICES)))


@dataclass(frozen=True)
class PickedConcepts:
    """A concepts folder the user chose, opened, checked and made for the current model."""

    path: str  # the folder (absolute), as caches.loaded_concepts takes it
    key: str  # caches.loaded_concepts's: names these concepts in other caches
    found: Concepts
    summary: dict[str, Any]  # concepts.json ({} where there is none)
    images: Path | None  # the folder the concepts were learned from


LOOPBACK = ("127.0.0.1", "localhost", "::1")
TYPED = "A folder on this machine..."  # the choice that shows the path box, where there is one


def typed_paths_allowed() -> bool:
    """Whether a typed path may name a folder on the server: only for a single user on their own machine, a server
    listening on loopback alone (`--server.address 127.0.0.1`) with weights uploads and any model on. A server that
    others reach offers its folders by name only (docs/serving.md, "Concepts for a class")."""
    address = str(st.get_option("server.address") or "")
    return address in LOOPBACK and settings.WEIGHTS_UPLOADS.on() and settings.ANY_MODEL.on()


def offered() -> dict[str, Path]:
    """Name -> folder: the bundled concepts and the teacher's (VIT_LENS_CONCEPTS, checked at the server's start)."""
    try:
        return offered_folders(settings.CONCEPTS.text())
    except ConceptsError:  # the server refused to start on it; a plain `streamlit run` offers the bundled ones
        return offered_folders("")


def _default_choice(choices: list[str], folders: dict[str, Path], loaded: LoadedModel) -> int:
    """The first offered folder learned for this model (its index among the choices, none first), else none."""
    for i, name in enumerate(choices):
        try:
            if name in folders and caches.loaded_concepts(str(folders[name]))[1].concepts.model == loaded.name:
                return i + 1
        except ConceptsError:
            continue
    return 0


def _chosen_folder(loaded: LoadedModel, key: str) -> tuple[str, Path] | None:
    """The folder chosen in widget `key` (by name, or typed where `typed_paths_allowed`): (what to call it, folder)."""
    folders = offered()
    choices = [*folders, *([TYPED] if typed_paths_allowed() else [])]
    choice = st.selectbox("Concepts", [None, *choices], key=key, index=_default_choice(choices, folders, loaded),
                          format_func=lambda c: "none" if c is None else c,
                          help="the concept folders this server offers (`vit-lens dashboard --concepts DIR`)")
    if choice is None:
        return None
    if choice != TYPED:
        return (choice, folders[choice]) if choice in folders else None
    base = Path.cwd()
    text_ = st.text_input("The folder `vit-lens concepts` wrote (or its concepts.safetensors)", key=f"{key}_path",
                          placeholder="/path/to/DIR", help=f"a relative path is relative to {base}").strip()
    if not text_:
        return None
    try:
        return text_, typed_folder(text_, base)
    except ConceptsError as e:
        st.error(str(e))
        return None


def concepts_picker(loaded: LoadedModel, key: str, empty: str) -> PickedConcepts | None:
    """The choice of a concepts folder (widget `key`), its concepts opened and checked once against the model and the
    machine. None when there are none to use: `empty` (Markdown) shown when none is chosen, else the one line that
    says why (can't be read, damaged, another model's)."""
    chosen = _chosen_folder(loaded, key)
    if chosen is None:
        st.markdown(empty)
        return None
    name, folder = chosen
    try:
        concepts_key, opened = caches.loaded_concepts(str(folder))
    except ConceptsError as e:
        st.error(md(f"{name}: {e}"))
        return None
    found = opened.concepts
    if found.model != loaded.name or found.sae.d_model != loaded.geometry.embed_dim:
        st.warning(f"These concepts were learned for {md(found.model)}, not {md(loaded.name)}: choose that model, "
                   "or learn concepts for this one.")
        return None
    why = caches.concepts_model_check(concepts_key, opened, loaded)
    if why:
        st.error(md(f"{name}: {why}"))
        return None
    if found.weights and found.weights != loaded.weights:
        st.caption(f"Learned with the weights {md(found.weights)}; this model has {md(loaded.weights)}.")
    return PickedConcepts(str(opened.folder), concepts_key, found, opened.summary, opened.images)


def folder_metrics(picked: PickedConcepts, columns: Sequence) -> None:
    """The folder's held-out FVU and spliced top-1 agreement (concepts.json), in two of the page's columns."""
    summary = picked.summary
    if "fvu" in summary and "spliced_top1_agreement" in summary:
        columns[0].metric("Held-out FVU of the folder", f"{summary['fvu']:.3f}",
                          help=f"over the {summary.get('held_out_images', 0)} images held out of training")
        columns[1].metric("Spliced top-1 agreement", f"{summary['spliced_top1_agreement']:.0%}",
                          help="held-out images whose top-1 stays when block L's patch tokens are replaced by their "
                               "reconstruction")


def folder_note(picked: PickedConcepts) -> None:
    """A caption when the folder the concepts were learned from is not on this server (its crops can't be shown), and
    one when some top patches name files outside it (skipped)."""
    if picked.images is None or not picked.images.is_dir():  # concepts made elsewhere: the maps show, the crops can't
        folder = picked.summary.get("folder", "")
        st.caption(f"The folder the concepts were learned from ({md(folder or 'not named')}) is not on this server: its "
                   "top patches can't be shown.")
        return
    outside = sum(outside_files(picked.images, entry.get("top", [])) for entry in picked.summary.get("features", []))
    if outside:
        st.caption(f"{outside:,} top patches name files outside the folder the concepts were learned from: skipped.")


def feature_marks(entry: dict[str, Any], summary: dict[str, Any] | None = None) -> str:
    """Sentences on a feature from its concepts.json entry: stable or not (`--stability`: the largest cosine between
    its decoder column and a second dictionary's, at seed + 1, above STABLE_COSINE or not), and whether removing it
    changes some held-out image's top-1 ("" where the entry says neither); from the `summary` (concepts.json), how
    many held-out images were tried where `--steering-images` tried fewer than all."""
    marks = []
    if isinstance(entry.get("stability"), (int, float)):
        cosine = float(entry["stability"])
        marks.append(f"**Unstable**: a second dictionary (seed + 1) has no feature closer than cosine {cosine:.2f}"
                     if cosine <= STABLE_COSINE else f"Stable: a second dictionary (seed + 1) has it at cosine {cosine:.2f}")
    if entry.get("steers") is True:
        marks.append("Removing it changes the top-1 of some held-out image")
    elif entry.get("steers") is False:
        tried, held = (summary or {}).get("steering_images"), (summary or {}).get("held_out_images")
        marks.append(f"Removing it changed the top-1 of none of the {tried:,} held-out images tried (of {held:,})"
                     if isinstance(tried, int) and isinstance(held, int) and tried < held
                     else "Removing it changed no held-out image's top-1")
    return "".join(f" {mark}." for mark in marks)


def folder_feature(picked: PickedConcepts, feature: int) -> dict[str, Any]:
    """concepts.json's entry of `feature` ({} where there is none)."""
    features = picked.summary.get("features", [])
    return features[feature] if feature < len(features) else {}


@st.fragment
def concepts_view(ctx: ViewContext) -> None:
    picked = concepts_picker(ctx.loaded, session.K_CONCEPTS, text.CONCEPTS)
    if picked is None:
        return
    path, concepts_key, found = picked.path, picked.key, picked.found
    seen = caches.image_concepts(ctx.request, ctx.image, concepts_key, found, ctx.cap)
    a, b, c = st.columns(3)
    a.metric("This image's reconstruction error (FVU)", f"{seen.error:.3f}",
             help="sum over its patch tokens of ||x - x^||^2, over their spread sum ||x - mean x||^2")
    folder_metrics(picked, (b, c))
    st.markdown(f"**The image's strongest features after block {found.layer}** (of {found.sae.num_features:,}, "
                f"k = {found.sae.k}), each with its top patches from the folder")
    folder_note(picked)
    for feature in seen.strongest.tolist():
        left, right = st.columns(FEATURE_COLUMNS, vertical_alignment="center")
        with left:
            show_picture(cached_figure(_feature_map_png, ctx, path, concepts_key, feature), f"concept_map_{feature}",
                         f"{ctx.stem}_feature_{feature}")
        with right:
            entry = folder_feature(picked, feature)
            st.image(cached_figure(folder_crops_png, ctx.model, path, concepts_key, feature), output_format="PNG")
            st.caption(f"Feature **#{feature}**: fires on {entry.get('firing_rate', float('nan')):.2%} of the folder's "
                       f"patches, mean activation {entry.get('mean_activation', float('nan')):.3g}; here its total "
                       f"activation is {float(seen.maps[list(seen.strongest).index(feature)].sum()):.3g}."
                       + feature_marks(entry, picked.summary))
    if not len(seen.strongest):
        st.info("No feature fires on this image.")
        return
    if no_head(ctx):
        return
    _removal(ctx, path, concepts_key, found, seen.strongest.tolist())
    _circuit(ctx, picked)
    st.markdown(text.CONCEPTS)


def _removal(ctx: ViewContext, path: str, concepts_key: str, found, strongest: list[int]) -> None:
    """Remove this concept: the prediction with the chosen feature's share subtracted, beside the original."""
    feature = st.selectbox("Remove this concept", [None, *strongest], key=session.K_CONCEPT_REMOVED,
                           format_func=lambda f: "none" if f is None else f"feature #{f}",
                           help="subtracts s z_f d_f, the feature's share of the reconstruction, from every patch token "
                                f"after block {found.layer}; the rest of the model runs on that")
    if feature is None or feature not in strongest:
        return
    logits = caches.concept_removed_logits(ctx.request, ctx.loaded, ctx.image, ctx.cap, concepts_key, found, feature)
    a, b = st.columns(2)
    a.markdown("**Original**\n\n" + _ranked(ctx.cap.logits, ctx.loaded.labels))
    b.markdown(f"**After removing feature #{feature}**\n\n" + _ranked(logits, ctx.loaded.labels))
    show_picture(cached_figure(_prediction_change_png, ctx, path, concepts_key, feature), "concept_change",
                 f"{ctx.stem}_without_feature_{feature}")


@dataclass(frozen=True)
class CircuitFolders:
    """The run of several blocks the picked folder belongs to: its circuit.json and each block's dictionary."""

    circuit: dict[str, Any]
    keys: tuple[str, ...]  # caches.loaded_concepts's, per listed block
    dictionaries: tuple[Concepts, ...]


def _circuit_folders(ctx: ViewContext, picked: PickedConcepts) -> CircuitFolders | None:
    """The circuit.json beside the picked DIR/layer-L and the dictionaries of its blocks, read and checked (each for
    this model); None where there is none, or the one line that says why it can't be used."""
    path = circuit_beside(Path(picked.path), picked.found.layer)
    if path is None:
        return None
    try:
        circuit = caches.loaded_circuit(str(path), picked.found.sae.num_features)
        opened = [caches.loaded_concepts(str(path.parent / f"layer-{layer}")) for layer in circuit["layers"]]
        check_circuit(circuit, {o.concepts.layer: o.concepts.sae.num_features for _, o in opened}, path.name)
        for key, o in opened:
            why = caches.concepts_model_check(key, o, ctx.loaded)
            if o.concepts.model != ctx.loaded.name or o.concepts.sae.d_model != ctx.loaded.geometry.embed_dim or why:
                raise ConceptsError(why or f"the dictionary of block {o.concepts.layer} is not this model's.")
    except ConceptsError as e:
        st.error(md(f"The circuit beside these concepts can't be shown: {e}"))
        return None
    return CircuitFolders(circuit, tuple(key for key, _ in opened), tuple(o.concepts for _, o in opened))


def _edge_name(edge: str) -> str:
    upstream, downstream = edge.split(">")
    (a, u), (b, v) = upstream.split(":"), downstream.split(":")
    return f"#{u} (block {a}) -> #{v} (block {b})"


def _circuit(ctx: ViewContext, picked: PickedConcepts) -> None:
    """Circuits: the image's patches -> its strongest features at each listed block -> the prediction, edges by
    attribution on this image; an edge chosen (clicked, or in the list) shows the removal on this image: the
    downstream feature's map with and without the upstream one."""
    folders = _circuit_folders(ctx, picked)
    if folders is None:
        return
    seen = caches.image_circuit(ctx.request, ctx.loaded, ctx.image, ctx.cap, folders.keys, folders.dictionaries)
    layers = seen.layers
    st.markdown(f"**Circuit across blocks {', '.join(map(str, layers))}**: this image's strongest features at each "
                "block, joined by their attribution on it (blue: adds to the next one's pre-activation, red: "
                "takes from it)")
    options = [f"{i}|{r}|{c}|{layers[i]}:{seen.strongest[i][c]}>{layers[i + 1]}:{seen.strongest[i + 1][r]}"
               for i, values in enumerate(seen.attribution)
               for r, c in sorted(np.ndindex(values.shape), key=lambda rc, v=values: -abs(v[rc]))]
    figure = concept_figures.circuit_figure(layers, seen.strongest, seen.totals, seen.attribution, seen.to_prediction,
                                            ctx.loaded.label(seen.prediction))
    st.plotly_chart(figure, key=session.K_CIRCUIT_CLICK, on_select=lambda: session.choose_clicked_edge(options),
                    selection_mode="points",
                    config={"displayModeBar": False})
    if not options:
        st.info("No two of the shown features are joined on this image.")
        return
    session.forget_edge_not_in(options)
    edge = st.selectbox("Remove the upstream feature of an edge (or click its middle)", [None, *options],
                        key=session.K_CIRCUIT_EDGE, format_func=lambda o: "none" if o is None else _edge_name(o.split("|")[3]),
                        help="subtracts s z_u d_u from every patch token after u's block and runs the blocks up to v's")
    if edge is None:
        return
    i, r, c = (int(part) for part in edge.split("|")[:3])
    u, v = int(seen.strongest[i][c]), int(seen.strongest[i + 1][r])
    plain, removed = caches.image_removal(ctx.request, ctx.loaded, ctx.image, ctx.cap, folders.keys[i:i + 2],
                                          folders.dictionaries[i:i + 2], u, v)
    g = ctx.loaded.geometry
    left, right = st.columns(2)
    top = float(max(plain.max(), removed.max(), 0.0)) or 1.0
    for column, activation, title in ((left, plain, f"#{v} as it is"), (right, removed, f"#{v} without #{u}")):
        column.image(concept_figures.feature_map_image(ctx.cap.input_image, activation.reshape(g.grid), g.patch_size,
                                                       MAP_PX, top), caption=title)  # one colour scale for both
    fires = plain > 0  # (N,): where v fires on the image as it is
    before, after = float(plain[fires].sum()), float(removed[fires].sum())
    change = 1 - after / before if before > 0 else float("nan")
    folder_effect = next((e["removal_effect"] for e in folders.circuit["edges"]
                          if (e["from"]["layer"], e["from"]["feature"], e["to"]["layer"], e["to"]["feature"])
                          == (layers[i], u, layers[i + 1], v)), None)
    st.caption(f"On this image feature #{v}'s activation over the patches where it fires goes from {before:.3g} to "
               f"{after:.3g} without #{u} (a removal effect of {change:.2f})"
               + (f"; over the circuit's images (circuit.json) the edge's removal effect is {folder_effect:.2f}."
                  if folder_effect is not None else "; the folder's circuit does not list this edge (not among v's "
                  "10 upstream features of largest attribution)."))
