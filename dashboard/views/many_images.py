"""The widgets of the Many images page (dashboard/page_scripts/many_images.py): the set's source, Run with a progress
bar, and the kept result with its downloads. The sets and the run are `dashboard.image_sets`' (no Streamlit there);
the session keeps the latest result (`session.keep_many_run`), so changing a widget afterwards recomputes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import streamlit as st

from dashboard import image_sets, session, text
from dashboard.figures.many_images import confusion_figure, per_layer_figure
from dashboard.image_choice import IMAGE_TYPES
from dashboard.literal import markdown_literal
from dashboard.models import ModelRequest
from dashboard.server import process
from dashboard.views import concepts as concept_view
from dashboard.views.context import ModelSource, cached_figure
from vit_core import dataset, explain
from vit_core.errors import ViTLensError
from vit_core.loading.model import LoadedModel
from vit_core.serving import WorkStopped

T = TypeVar("T")
_logger = logging.getLogger(__name__)


def set_ui(loaded: LoadedModel) -> Callable[[], image_sets.ImageSet]:
    """The set's source and its widgets. Returns how to make the set (called only when Run is pressed)."""
    source = st.radio("Images", list(image_sets.SOURCES), format_func=image_sets.SOURCES.get, key=session.K_MANY_SOURCE,
                      horizontal=True)
    if source == image_sets.SHAPES:
        left, right = st.columns(2)
        count = left.number_input("How many images", min_value=1, max_value=image_sets.MAX_IMAGES,
                                  value=image_sets.SHAPES_DEFAULT, step=16, key=session.K_MANY_COUNT,
                                  help=f"1 to {image_sets.MAX_IMAGES}; the paper averages over 128")
        seed = right.number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key=session.K_MANY_SEED,
                                  help="the same seed draws the same images")
        st.caption("Drawn by the teaching model's own data generator: 8 shapes and 'other', in equal numbers, "
                   "so the true labels are known.")
        return lambda: image_sets.shapes_set(loaded, int(count), int(seed))
    upload_mb = image_sets.upload_limit_mb(st.get_option("server.maxUploadSize"))  # what the server really takes
    files = st.file_uploader("Images, or a .zip with one folder per class", type=[*IMAGE_TYPES, "zip"],
                             accept_multiple_files=True, key=session.K_MANY_FILES, max_upload_size=upload_mb,
                             help="In a zip, first-level folders named after the model's classes (a class "
                                  "index, a class name, or an ImageNet synset id) give the true labels.")
    st.caption(image_sets.limits_text(upload_mb))
    return lambda: image_sets.uploaded_set(loaded, [(f.name, f.getvalue()) for f in files or ()])  # copied on Run only


def run_ui(request: ModelRequest, loaded: LoadedModel, make_set: Callable[[], image_sets.ImageSet]) -> None:
    """On Run: make the set, analyse it with a progress bar, keep the result in the session.
    A refused set: one sentence, and the previous result stays."""
    explain = st.toggle("Also judge every image's explanations", key=session.K_MANY_EXPLAIN,
                        help="Each method's relevance map of each image under the deletion and insertion tests, and for "
                             "drawn Shapes the pointing game, relevance mass and rank accuracy against the generator's "
                             "silhouettes; then which method to trust over the set. Many forwards per image: about a "
                             "second per image with the Shapes ViT on a laptop, far more with a large model.")
    if not st.button("Run", key=session.K_MANY_RUN, type="primary", icon=":material/play_arrow:"):
        return
    try:
        with st.spinner("Preparing the images..."):
            image_set = make_set()
    except image_sets.SetError as e:
        st.error(markdown_literal(str(e)))
        return
    total = len(image_set.sources)
    run = _as_job(f"Analysing {total} images with {loaded.name}...", "Analysed",
                  lambda progress: image_sets.run_set(request, loaded, image_set, progress, explain=explain), total)
    if run is not None:
        session.keep_many_run(run)


def _as_job(starting: str, done_text: str, work: Callable[[Callable[[int, int], None]], T], total: int) -> T | None:
    """`work(progress)` as this session's explanation job (below the class's new images; one per session) with a
    progress bar. None when it was stopped (said with text.JOB_STOPPED) or refused (its message)."""
    bar = st.progress(0.0, text=starting)
    counted = [0, total]  # images done, of: what the server's log says of a stopped job

    def progress(done: int, of: int) -> None:
        counted[:] = done, of
        bar.progress(min(1.0, done / max(of, 1)), text=f"{done_text} {done} of {of} images...")

    try:
        with process.explanation_job():
            result = work(progress)
    except WorkStopped:
        # The server's own record of a stop nobody may be there to see (a closed page): tests/live read it.
        _logger.info("explanation job stopped after %d of %d images", *counted)
        bar.empty()
        st.info(text.JOB_STOPPED)
        return None
    except ViTLensError as e:
        bar.empty()
        st.error(markdown_literal(str(e)))
        return None
    bar.empty()
    return result


# ----------------------------------------------------------------------------------------------
# Concepts: the set through a `vit-lens concepts` run's autoencoder


def concepts_ui(request: ModelRequest, loaded: LoadedModel, make_set: Callable[[], image_sets.ImageSet]) -> None:
    """The Concepts section: a concepts folder made for this model; Find (forwards of blocks 0..L over the set) keeps
    the set's strongest features in the session; each shown with its top patches in the set and in the folder; the
    set's reconstruction error; and "remove this concept" over the set, on its own button."""
    with st.expander("Concepts: the sparse-autoencoder features of the set", icon=":material/category:"):
        picked = concept_view.concepts_picker(loaded, session.K_MANY_CONCEPTS, text.MANY_CONCEPTS)
        if picked is None:
            return
        if st.button("Find the set's concepts", key=session.K_MANY_CONCEPTS_FIND, icon=":material/search:",
                     help=f"runs blocks 0..{picked.found.layer} on each image of the set as the widgets above "
                          f"describe it (at most {image_sets.MAX_IMAGES})"):
            image_set = _made(make_set)
            if image_set is not None:
                found = _as_job(f"Encoding {len(image_set.sources)} images...", "Encoded",
                                lambda progress: image_sets.set_concepts_run(request, loaded, image_set, picked.found,
                                                                             picked.key, progress),
                                len(image_set.sources))
                if found is not None:
                    session.keep_many_concepts(found)
        kept = session.latest_many_concepts()
        if kept is None or kept.concepts_key != picked.key or kept.model_key != request.key:
            st.caption("Press **Find the set's concepts** to rank the features over the set.")
            return
        _set_concepts_ui(kept, picked, request, loaded, make_set)


def _made(make_set: Callable[[], image_sets.ImageSet]) -> image_sets.ImageSet | None:
    try:
        with st.spinner("Preparing the images..."):
            return make_set()
    except image_sets.SetError as e:
        st.error(markdown_literal(str(e)))
        return None


def _set_concepts_ui(kept: image_sets.SetConceptsRun, picked: concept_view.PickedConcepts, request: ModelRequest,
                     loaded: LoadedModel, make_set: Callable[[], image_sets.ImageSet]) -> None:
    seen, found = kept.seen, picked.found
    st.success(f"The concepts of {markdown_literal(kept.description)}: {kept.images} images, "
               f"{kept.images * loaded.geometry.num_patches:,} patch tokens after block {found.layer}, in "
               f"{kept.seconds:.1f} s.")
    if kept.skipped:
        st.caption(f"{len(kept.skipped)} image(s) could not be read: " + markdown_literal("; ".join(kept.skipped[:5])))
    a, b, c = st.columns(3)
    a.metric("The set's reconstruction error (FVU)", f"{seen.error:.3f}",
             help="sum over the set's patch tokens of ||x - x^||^2, over their spread sum ||x - mean x||^2 (the mean "
                  "over the whole set)")
    concept_view.folder_metrics(picked, (b, c))
    if not len(seen.strongest):
        st.info("No feature fires on this set.")
        return
    st.markdown(f"**The features that fire most over the set after block {found.layer}** (of "
                f"{found.sae.num_features:,}, k = {found.sae.k}, ranked by their mean activation over the set's patch "
                "tokens): each one's top patches in this set, beside its top patches in the folder it was learned from")
    concept_view.folder_note(picked)
    model = ModelSource(request, loaded)
    for j, feature in enumerate(seen.strongest.tolist()):
        entry = concept_view.folder_feature(picked, feature)
        st.markdown(f"Feature **#{feature}**: mean activation {seen.mean_activation[feature]:.3g} over the set, fires "
                    f"on {seen.firing_rate[feature]:.1%} of its patches (the folder's: "
                    f"{entry.get('firing_rate', float('nan')):.1%})")
        here, folder = st.columns(2)
        here.image(kept.crops[j], caption="in this set", output_format="PNG")
        folder.image(cached_figure(concept_view.folder_crops_png, model, picked.path, picked.key, feature),
                     caption="in the folder", output_format="PNG")
    _set_removal_ui(kept, picked, loaded, make_set)


def _set_removal_ui(kept: image_sets.SetConceptsRun, picked: concept_view.PickedConcepts, loaded: LoadedModel,
                    make_set: Callable[[], image_sets.ImageSet]) -> None:
    """Remove this concept over the set: on its button, two forwards per image; the result kept with the set's."""
    strongest = kept.seen.strongest.tolist()
    left, right = st.columns([2, 1], vertical_alignment="bottom")
    feature = left.selectbox("Remove this concept over the set", strongest, key=session.K_MANY_CONCEPT_REMOVED,
                             format_func=lambda f: f"feature #{f}",
                             help="subtracts s z_f d_f, the feature's share of the reconstruction, from every patch "
                                  f"token after block {picked.found.layer} of every image; the rest of the model "
                                  "runs on that")
    if right.button("Remove", key=session.K_MANY_CONCEPT_REMOVE, icon=":material/remove_circle:"):
        image_set = _made(make_set)
        if image_set is not None and image_sets.set_digest(image_set) != kept.set_digest:
            st.info("The images above changed since their concepts were found: press **Find the set's concepts** "
                    "again.")
        elif image_set is not None:
            done = _as_job(f"Removing feature #{feature} from {kept.images} images...", "Done",
                           lambda progress: image_sets.set_concept_removed(loaded, image_set, picked.found, kept,
                                                                          feature, progress),
                           kept.images)
            if done is not None:
                kept = done
                session.keep_many_concepts(kept)
    removal = kept.removed.get(feature)
    if removal is None:
        return
    a, b = st.columns(2)
    a.metric(f"Top-1 unchanged without feature #{feature}, over {removal.images} images", f"{removal.agreement:.0%}",
             help=f"the share of the set's {removal.images} images whose top-1 class stays")
    b.metric("Mean KL of the class probabilities", f"{removal.kl:.3g} nats",
             help="the mean over the set's images of KL(p || p_removed) = sum_c p_c (log p_c - log p_removed,c)")


def results_ui(run: image_sets.ManyRun, request: ModelRequest) -> None:
    """The kept result: what it was computed with, Fig. 7 right, accuracy (overall, per layer, per class, the confusion
    matrix), high-norm rate, each image's row, the skipped files, downloads."""
    result = run.result
    st.success(f"{result.num_images} images analysed ({markdown_literal(run.description)}) with "
               f"**{markdown_literal(run.model_name)}** ({markdown_literal(run.weights)}) on {result.device}, "
               f"in {run.seconds:.1f} s.")
    if run.model_key != request.key:
        st.info(f"This result is for {markdown_literal(run.model_name)}; press Run for the model in the sidebar.")
    if run.stopped:
        st.warning(markdown_literal(run.stopped))
    for note in run.notes:
        st.caption(markdown_literal(note))
    if result.failures:
        st.warning(f"{len(result.failures)} image(s) could not be used and were skipped.")
        with st.expander("Which, and why"):
            st.markdown("\n".join(f"- {markdown_literal(name)}: {markdown_literal(reason)}"
                                  for name, reason in result.failures))

    st.subheader("Attention distance per head and block")
    st.markdown(text.MANY_FIGURE)
    st.image(run.files["mean_attention_distance.png"], output_format="PNG")
    st.caption("Blocks are numbered from 0, as in every figure here: block 0 is the first.")

    st.subheader("Accuracy per layer")
    if result.accuracy is None:
        st.caption(markdown_literal(run.no_labels_reason or "No labels for this set, so no accuracy."))
    else:
        st.metric(f"Top-1 accuracy over {result.num_labelled} labelled images", f"{result.accuracy:.1%}")
        st.markdown(text.MANY_LENS)
        st.plotly_chart(per_layer_figure(result.logit_lens_accuracy, "Logit-lens top-1 accuracy", "accuracy"),
                        key="many_lens_chart")
        _classes_ui(result)

    st.subheader("High-norm tokens per layer")
    st.markdown(text.MANY_HIGH_NORM)
    st.plotly_chart(per_layer_figure(result.high_norm_rate, "Share of high-norm patch tokens", "share of patches",
                                     full_range=False),
                    key="many_norm_chart")

    trust = result.which_to_trust()
    if trust is not None:
        _trust_ui(trust)

    st.subheader("Each image")
    st.caption("One row per analysed image: its true class (where known), the model's top-1 and its probability. "
               "Click a column's name to sort by it, e.g. the wrong ones first.")
    st.dataframe(_table(dataset.image_table(result)), key="many_images_table", hide_index=True,
                 column_config={"probability": st.column_config.NumberColumn(format="percent")})

    st.subheader("Downloads")
    st.caption("The same files as `vit-lens dataset`.")
    columns = st.columns(len(run.files))
    for column, (name, data) in zip(columns, run.files.items(), strict=True):
        column.download_button(name, data=data, file_name=name, mime=_MIMES[Path(name).suffix], key=f"many_dl_{name}",
                               on_click="ignore", icon=":material/download:")


_MIMES = {".npz": "application/zip", ".json": "application/json", ".png": "image/png", ".csv": "text/csv",
          ".parquet": "application/vnd.apache.parquet"}


def _classes_ui(result: dataset.DatasetResult) -> None:
    """Per true class: its images, how many the model got right, and the confusion matrix."""
    st.markdown("**Per class**: the accuracy over each true class's images, and where the model put them.")
    st.dataframe(_table(dataset.class_table(result)), key="many_classes_table", hide_index=True,
                 column_config={"accuracy": st.column_config.NumberColumn(format="percent")})
    st.plotly_chart(confusion_figure(result.arrays()["confusion"], result.class_names), key="many_confusion_chart")


def _trust_ui(trust) -> None:
    """Which explanation to trust over the set: each method's mean score under each test, its rank among the methods and
    the share of images where it beat random; the random baseline's mean; how far the tests agree."""
    st.subheader("Which explanation to trust over the set")
    st.markdown(trust_table(trust))
    st.caption("Each cell: the mean over the images (its rank among the methods; the share of images where it beat "
               "random by more than two standard deviations of the random orders). ↑ higher is better, ↓ lower. "
               "The localisation columns count only the images with an object (not the 'other' drawings).")
    if trust.agreement:
        st.markdown("**Do the tests agree?** Kendall's tau-b between two tests' rankings of the methods: 1 the same "
                    "order, 0 unrelated, -1 reversed.")
        st.markdown(agreement_table(trust))


def trust_table(trust) -> str:
    """The FolderJudgement as Markdown: methods x tests, then the random row."""
    tests = trust.tests
    arrow = {t: "↑" if explain.CONVENTIONS[t][1] else "↓" for t in tests}
    lines = ["| method | " + " | ".join(f"{text.TEST_TITLES[t][0]} {arrow[t]}" for t in tests) + " |",
             "| --- |" + " --- |" * len(tests)]
    for row in trust.rows():
        lines.append(f"| {text.METHOD_TITLES.get(row['method'], row['method'])} | " + " | ".join(
            f"{row[t]:.3g} (#{row[f'{t}_rank']:g}, {row[f'{t}_beats_share']:.0%})" for t in tests) + " |")
    lines.append("| random | " + " | ".join(f"{trust.means[t].get(explain.RANDOM, float('nan')):.3g}" for t in tests) + " |")
    return "\n".join(lines)


def agreement_table(trust) -> str:
    """Kendall's tau-b between every two tests' rankings, as a Markdown matrix."""
    names = [text.TEST_TITLES[t][0] for t in trust.tests]
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for a in trust.tests:
        taus = [1.0 if a == b else trust.agreement.get((a, b), trust.agreement.get((b, a), float("nan")))
                for b in trust.tests]
        lines.append(f"| {text.TEST_TITLES[a][0]} | " + " | ".join(f"{tau:+.2f}" for tau in taus) + " |")
    return "\n".join(lines)


def _table(columns: dict) -> dict:
    """Columns as st.dataframe takes them: lists (object arrays of text would show as 'object')."""
    return {name: values.tolist() for name, values in columns.items()}
