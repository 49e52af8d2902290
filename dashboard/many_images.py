"""The "Many images" page: the model of the sidebar over a set of images, reduced per layer and head.

The set is a batch drawn by the Shapes generator (labels known) or the user's uploads: several image files,
or a .zip whose first-level folders name the classes (as the CLI's class-named subfolders). "Run" hands the
set to `vit_core.dataset.analyze_dataset` with a progress bar; the result (the paper's Fig. 7 right for
the set, accuracy and logit-lens accuracy per layer, the high-norm token rate per layer, the files the CLI
writes) is kept in the session, so changing a widget afterwards recomputes nothing.

A set is bounded so that one session can't exhaust a shared server: number of images, bytes per file
and in all, and a zip's members (their number, names and declared sizes) checked before anything is
extracted. A refused set is said in one sentence and the page, and the previous result, stay.

`dashboard/app.py` registers this file as a page: st.navigation runs it as a script (then the block at
the bottom draws the page); imported, it only defines the functions (the tests use them).
"""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from dashboard import figures
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB, markdown_literal
from dashboard.models import ModelRequest
from vit_core import dataset
from vit_core.errors import ViTLensError
from vit_core.loading import LoadedModel
from vit_core.teaching import data as shapes

# Per run. Measured: 64 images through ViT-B/16 in 51 s on the shared 2-core CPU (load 5-7), so 256 take minutes;
# the CLI (`vit-lens dataset`) has no cap.
MAX_IMAGES = 256
MAX_SET_MB = 100  # all images of one set together: the uploads, or a zip's uncompressed members
MAX_ZIP_MB = 100  # one uploaded file (a zip; a single image is held to MAX_IMAGE_MB)
MAX_ZIP_MEMBERS = 1000  # entries in a zip, folders and skipped files included
SHAPES_DEFAULT = 128  # images in a Shapes batch: the paper's Fig. 7 right averages over 128 images
_MB = 2**20

# Widget keys of this page (prefixed: one session state for both pages), and the session's latest result.
K_SOURCE, K_COUNT, K_SEED, K_FILES, K_RUN = "many_source", "many_count", "many_seed", "many_files", "many_run"
_PAGE_MODEL = "_many_page_model"  # (ModelRequest, LoadedModel) of this run: set by app.py before the page runs
_LATEST_RUN = "_many_latest_run"  # ManyRun: the last finished run of this session

SHAPES, UPLOADS = "shapes", "uploads"
SOURCES = {SHAPES: "A batch of drawn Shapes", UPLOADS: "Your images (files or a .zip)"}
_JUNK_PREFIXES = ("__MACOSX/",)  # what archivers add beside the user's files: ignored without a word


class SetError(ViTLensError):
    """A set of images this page refuses as a whole (too many, too large, a suspicious zip): one sentence."""


# ----------------------------------------------------------------------------------------------
# The set of images (no Streamlit here)


@dataclass(frozen=True)
class ImageSet:
    """What one run analyses: named image files, their labels (model class indices) when known, and notes."""

    description: str  # for people: "128 drawn Shapes (seed 0)", "3 uploaded files"
    sources: tuple[tuple[str, bytes], ...]  # (name, file bytes)
    labels: tuple[int | None, ...] | None  # one per source, None where unknown; None when none is known
    notes: tuple[str, ...] = ()  # what was skipped
    no_labels_reason: str = ""  # why there are no labels (with labels: "")

    def __post_init__(self) -> None:
        assert self.labels is None or len(self.labels) == len(self.sources)


def is_image_name(name: str) -> bool:
    return PurePosixPath(name).suffix.lower().lstrip(".") in IMAGE_TYPES


def _unsafe_member_name(name: str) -> bool:
    """A member name that would land outside a folder it is extracted into: absolute, a drive, or '..'."""
    posix = name.replace("\\", "/")
    return posix.startswith("/") or (len(posix) > 1 and posix[1] == ":") or ".." in PurePosixPath(posix).parts


def zip_members(zip_name: str, data: bytes, images_before: int = 0,
                bytes_before: int = 0) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The image files inside a zip as (path inside the zip, bytes), and the names of the members skipped.

    Everything that can be checked from the zip's directory is checked before a byte is decompressed:
    the number of members, their names (absolute or '..' paths refuse the zip), encryption, each image's
    declared size and their total (a zip bomb declares huge sizes, or lies: a member is read to at most its
    declared size + 1 byte, and one that gives more refuses the zip). Members that are not images (a nested
    zip included: it is not opened) are skipped; the archivers' own files (__MACOSX/, hidden files) ignored.
    `images_before`, `bytes_before`: what the set holds already (other uploads), counted against the same caps.
    Raises SetError.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise SetError(f"{zip_name} is not a readable zip file ({e}).") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ZIP_MEMBERS:
            raise SetError(f"{zip_name} has {len(infos)} entries; a zip here may have at most {MAX_ZIP_MEMBERS}.")
        unsafe = next((i.filename for i in infos if _unsafe_member_name(i.filename)), None)
        if unsafe is not None:
            raise SetError(f"{zip_name} holds a member named {unsafe!r} that points outside the archive, so it is refused.")
        wanted, skipped = [], []
        for info in infos:
            base = PurePosixPath(info.filename).name
            if info.is_dir() or info.filename.startswith(_JUNK_PREFIXES) or base.startswith("."):
                continue
            (wanted if is_image_name(info.filename) else skipped).append(info)
        if images_before + len(wanted) > MAX_IMAGES:
            what = f"{zip_name} holds {len(wanted)}" + (f" (and the other uploads {images_before})" if images_before else "")
            raise SetError(f"{what} images; one run takes at most {MAX_IMAGES}.")
        if any(i.flag_bits & 0x1 for i in wanted):
            raise SetError(f"{zip_name} is encrypted; please upload a zip without a password.")
        big = next((i for i in wanted if i.file_size > MAX_IMAGE_MB * _MB), None)
        if big is not None:
            raise SetError(f"{zip_name}: {big.filename} unpacks to {big.file_size / _MB:,.0f} MB; "
                           f"an image may have at most {MAX_IMAGE_MB} MB.")
        total = sum(i.file_size for i in wanted)
        if bytes_before + total > MAX_SET_MB * _MB:
            what = f"{zip_name} unpacks to {total / _MB:,.0f} MB of images" + (
                f" (and the other uploads hold {bytes_before / _MB:,.0f} MB)" if bytes_before else "")
            raise SetError(f"{what}; a set may have at most {MAX_SET_MB} MB.")
        members = []
        for info in wanted:
            try:
                with archive.open(info) as member:
                    content = member.read(info.file_size + 1)  # never more than declared (+1 to see a lie)
            except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError, ValueError) as e:
                raise SetError(f"{zip_name}: {info.filename} can't be unpacked ({e}).") from None
            if len(content) > info.file_size:
                raise SetError(f"{zip_name}: {info.filename} unpacks to more than its declared size, so the zip is refused.")
            members.append((info.filename, content))
    return members, [i.filename for i in skipped]


def _without_common_root(paths: Sequence[str]) -> list[PurePosixPath]:
    """Paths inside a zip, with the one folder that holds everything removed (a zip of `myset/` holds
    `myset/circle/a.png`: the class folders are one level down)."""
    parts = [PurePosixPath(p).parts for p in paths]
    if parts and all(len(p) > 2 for p in parts) and len({p[0] for p in parts}) == 1:
        parts = [p[1:] for p in parts]
    return [PurePosixPath(*p) for p in parts]


def zip_labels(loaded: LoadedModel, paths: Sequence[str]) -> list[int | None] | None:
    """Labels from the first-level folders of paths inside a zip, named as the CLI's class folders are
    (a class index, a label name, an ImageNet synset id): `vit_core.dataset.folder_labels` on those paths."""
    root = Path("/zip")  # folder_labels reads only the paths' parts below the root, never the disk
    return dataset.folder_labels(loaded, root, [root / p for p in _without_common_root(paths)])


def uploaded_set(loaded: LoadedModel, files: Sequence[tuple[str, bytes]]) -> ImageSet:
    """The set made of uploaded files: images as they are, zips unpacked (zip_members), labels from the zips'
    class folders. Raises SetError for a set over the bounds or an unsafe zip; oversized single files are skipped."""
    if not files:
        raise SetError("Upload some images or a .zip first.")
    total = sum(len(data) for _, data in files)
    if total > MAX_SET_MB * _MB:
        raise SetError(f"These uploads hold {total / _MB:,.0f} MB; a set may have at most {MAX_SET_MB} MB.")
    plain = [(name, data) for name, data in files if not name.lower().endswith(".zip")]
    too_large = [name for name, data in plain if len(data) > MAX_IMAGE_MB * _MB]  # skipped, and said
    sources = [(name, data) for name, data in plain if len(data) <= MAX_IMAGE_MB * _MB]
    labels: list[int | None] = [None] * len(sources)
    skipped: list[str] = []  # not images
    for name, data in files:  # each zip checked against what the set holds already, before it is unpacked
        if name.lower().endswith(".zip"):
            members, not_images = zip_members(name, data, len(sources), sum(len(d) for _, d in sources))
            member_labels = zip_labels(loaded, [m for m, _ in members]) if members else None
            sources += [(f"{name}/{m}", content) for m, content in members]
            labels += member_labels or [None] * len(members)
            skipped += [f"{name}/{m}" for m in not_images]
    if len(sources) > MAX_IMAGES:
        raise SetError(f"These uploads hold {len(sources)} images; one run takes at most {MAX_IMAGES}.")
    notes = []
    if skipped:
        notes.append(f"Skipped {len(skipped)} file(s) that are not images (a zip inside a zip is not opened): "
                     f"{_some(skipped)}.")
    if too_large:
        notes.append(f"Skipped {len(too_large)} image(s) over {MAX_IMAGE_MB} MB: {_some(too_large)}.")
    if not sources:
        whys = ([f"{len(skipped)} file(s) that are not images: {_some(skipped)}"] if skipped else []) + (
            [f"{len(too_large)} image(s) over {MAX_IMAGE_MB} MB: {_some(too_large)}"] if too_large else [])
        raise SetError(f"There is no image in these uploads{' (only ' + '; '.join(whys) + ')' if whys else ''}.")
    known = any(label is not None for label in labels)
    no_labels = "" if known else ("No labels, so no accuracy: labels come from a .zip whose first-level folders "
                                  "name the model's classes (a class index, a class name, or an ImageNet synset "
                                  "id such as n01440764).")
    what = f"{len(sources)} uploaded image{'s' * (len(sources) != 1)}"
    return ImageSet(what, tuple(sources), tuple(labels) if known else None, tuple(notes), no_labels)


def _some(names: Sequence[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def shapes_labels(loaded: LoadedModel) -> dict[int, int] | None:
    """Shapes label -> the model's class index, matched by name; None unless the model knows every Shapes class."""
    model_index = {name.strip().lower(): i for i, name in enumerate(loaded.labels or ())}
    mapping = {k: model_index.get(name) for k, name in enumerate(shapes.LABELS)}
    return None if None in mapping.values() else mapping


def shapes_set(loaded: LoadedModel, count: int, seed: int) -> ImageSet:
    """`count` images drawn by the Shapes generator (balanced classes, `seed` fixes them), as PNG files."""
    if not 1 <= count <= MAX_IMAGES:
        raise SetError(f"A Shapes batch has 1 to {MAX_IMAGES} images, not {count}.")
    drawn = shapes.draw_set(count, seed)  # images (n, S, S, 3) uint8, labels (n,) indices into shapes.LABELS
    sources = tuple((f"shape_{i:03d}_{shapes.LABELS[label]}.png", figures.png_bytes(img))
                    for i, (img, label) in enumerate(zip(drawn.images, drawn.labels, strict=True)))
    mapping = shapes_labels(loaded)
    no_labels = "" if mapping else ("No accuracy: this model's classes are not the Shapes' classes "
                                    "(choose the bundled Shapes ViT for that).")
    labels = tuple(mapping[int(label)] for label in drawn.labels) if mapping else None
    return ImageSet(f"{count} drawn Shapes (seed {seed})", sources, labels, (), no_labels)


# ----------------------------------------------------------------------------------------------
# One run and its result


@dataclass(frozen=True)
class ManyRun:
    """A finished run, as the session keeps it: the result, the files to download, and what it was computed with."""

    result: dataset.DatasetResult
    files: dict[str, bytes]  # dataset_files(): dataset.npz, dataset.json, mean_attention_distance.png
    model_key: str  # ModelRequest.key of the model it ran on
    model_name: str
    weights: str
    description: str  # ImageSet.description
    notes: tuple[str, ...]
    no_labels_reason: str
    seconds: float


def run_set(request: ModelRequest, loaded: LoadedModel, image_set: ImageSet,
            progress: Callable[[int, int], None] | None = None) -> ManyRun:
    """analyze_dataset over the set (batched, reduced on the model's device), and the CLI's three files."""
    start = time.perf_counter()
    result = dataset.analyze_dataset(loaded, image_set.sources, image_set.labels, batch_size=None,
                                     progress=progress)
    files = dataset.dataset_files(result, loaded.geometry)
    return ManyRun(result, files, request.key, loaded.name, loaded.weights, image_set.description, image_set.notes,
                   image_set.no_labels_reason, time.perf_counter() - start)


def per_layer_figure(values: np.ndarray, title: str, y_title: str, full_range: bool = True) -> go.Figure:
    """A value per logit-lens row / residual layer, values (L+1,) in [0, 1] -> a line over the rows
    (row 0: the embeddings, row l: after block l - 1), shown in percent: from 0 to 100 % (`full_range`,
    for accuracies), else from 0 to a little above the largest value (rates of a few percent)."""
    top = 100.0 if full_range else max(1.0, 120 * float(np.max(values)))
    rows = [figures.lens_row_name(r) for r in range(len(values))]
    fig = go.Figure(go.Scatter(x=list(range(len(values))), y=(100 * np.asarray(values, dtype=np.float64)).round(2),
                               mode="lines+markers", customdata=rows,
                               hovertemplate="%{customdata}: %{y:.1f}%<extra></extra>"))
    fig.update_layout(title=title, height=320, margin=dict(l=60, r=20, t=50, b=50), showlegend=False,
                      xaxis=dict(title="layer (0 = the embeddings, l = after block l - 1)", dtick=1),
                      yaxis=dict(title=y_title, range=[0, top], ticksuffix="%"))
    return fig


# ----------------------------------------------------------------------------------------------
# The page (Streamlit)

INTRO = (
    "Run the model chosen in the sidebar over **many images** at once. For each image, each layer and each "
    "head, the **mean attention distance** is how far (in pixels of the input) a patch looks on average: the "
    "attention weights times the distance between the query patch and each key patch. Averaged over the set, "
    "it gives the paper's Fig. 7 (right): in the first layers some heads attend **locally** (small distance, "
    "like a CNN's small filters) while others already look **globally** across the image; deeper, nearly all "
    "heads look far. Every value is computed on each image, then averaged over the images (with its spread)."
)
FIGURE_TEXT = (
    "One dot per head, one column per layer (network depth): the dot is the mean over the images, its bar the "
    "standard deviation over the images. A head that spreads its attention evenly over all patches sits near "
    "the dashed line; a head that looks only at its own neighbourhood sits low."
)
LENS_TEXT = (
    "**Logit lens**: the model's own final norm and classifier head applied to the tokens after each block, as "
    "if the network stopped there. Its top-1 accuracy per layer shows at which depth the answer becomes readable."
)
HIGH_NORM_TEXT = (
    "**High-norm tokens** (Darcet et al., 2024): the share of patch tokens whose norm is far above the others "
    "in that layer (above Q3 + 3 IQR of the layer's patch norms). Large trained ViTs grow a few of them in "
    "the later layers, used as scratch space; models with register tokens grow fewer."
)


def hand_over_model(request: ModelRequest, loaded: LoadedModel) -> None:
    """app.py: the model of this run, for the page script (st.navigation runs it with no arguments)."""
    st.session_state[_PAGE_MODEL] = (request, loaded)


def limits_text() -> str:
    return (f"At most {MAX_IMAGES} images and {MAX_SET_MB} MB per set; an image up to {MAX_IMAGE_MB} MB, a .zip up "
            f"to {MAX_ZIP_MB} MB (at most {MAX_ZIP_MEMBERS} entries). For larger sets use "
            f"`vit-lens dataset FOLDER` on your own machine.")


def set_ui(loaded: LoadedModel) -> Callable[[], ImageSet]:
    """The set's source and its widgets. Returns how to make the set (called only when Run is pressed)."""
    source = st.radio("Images", list(SOURCES), format_func=SOURCES.get, key=K_SOURCE, horizontal=True)
    if source == SHAPES:
        left, right = st.columns(2)
        count = left.number_input("How many images", min_value=1, max_value=MAX_IMAGES, value=SHAPES_DEFAULT, step=16,
                                  key=K_COUNT, help=f"1 to {MAX_IMAGES}; the paper averages over 128")
        seed = right.number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key=K_SEED,
                                  help="the same seed draws the same images")
        st.caption("Drawn by the teaching model's own data generator: 8 shapes and 'other', in equal numbers, "
                   "so the true labels are known.")
        return lambda: shapes_set(loaded, int(count), int(seed))
    files = st.file_uploader("Images, or a .zip with one folder per class", type=[*IMAGE_TYPES, "zip"],
                             accept_multiple_files=True, key=K_FILES, max_upload_size=MAX_ZIP_MB,
                             help="In a zip, first-level folders named after the model's classes (a class "
                                  "index, a class name, or an ImageNet synset id) give the true labels.")
    st.caption(limits_text())
    return lambda: uploaded_set(loaded, [(f.name, f.getvalue()) for f in files or ()])  # copied on Run only


def run_ui(request: ModelRequest, loaded: LoadedModel, make_set: Callable[[], ImageSet]) -> None:
    """On Run: make the set, analyse it with a progress bar, keep the result in the session.
    A refused set: one sentence, and the previous result stays."""
    if not st.button("Run", key=K_RUN, type="primary", icon=":material/play_arrow:"):
        return
    try:
        with st.spinner("Preparing the images..."):
            image_set = make_set()
    except SetError as e:
        st.error(markdown_literal(str(e)))
        return
    total = len(image_set.sources)
    bar = st.progress(0.0, text=f"Analysing {total} images with {loaded.name}...")

    def progress(done: int, of: int) -> None:
        bar.progress(min(1.0, done / max(of, 1)), text=f"Analysed {done} of {of} images...")

    try:
        run = run_set(request, loaded, image_set, progress)
    except ViTLensError as e:
        bar.empty()
        st.error(markdown_literal(str(e)))
        return
    bar.empty()
    st.session_state[_LATEST_RUN] = run


def results_ui(run: ManyRun, request: ModelRequest) -> None:
    """The kept result: what it was computed with, Fig. 7 right, accuracy, high-norm rate, failures, downloads."""
    result = run.result
    st.success(f"{result.num_images} images analysed ({markdown_literal(run.description)}) with "
               f"**{markdown_literal(run.model_name)}** ({markdown_literal(run.weights)}) on {result.device}, "
               f"in {run.seconds:.1f} s.")
    if run.model_key != request.key:
        st.info(f"This result is for {markdown_literal(run.model_name)}; press Run for the model in the sidebar.")
    for note in run.notes:
        st.caption(markdown_literal(note))
    if result.failures:
        st.warning(f"{len(result.failures)} image(s) could not be used and were skipped.")
        with st.expander("Which, and why"):
            st.markdown("\n".join(f"- {markdown_literal(name)}: {markdown_literal(reason)}"
                                  for name, reason in result.failures))

    st.subheader("Attention distance per head and layer")
    st.markdown(FIGURE_TEXT)
    st.image(run.files["mean_attention_distance.png"], output_format="PNG")

    st.subheader("Accuracy per layer")
    if result.accuracy is None:
        st.caption(markdown_literal(run.no_labels_reason or "No labels for this set, so no accuracy."))
    else:
        st.metric(f"Top-1 accuracy over {result.num_labelled} labelled images", f"{result.accuracy:.1%}")
        st.markdown(LENS_TEXT)
        st.plotly_chart(per_layer_figure(result.logit_lens_accuracy, "Logit-lens top-1 accuracy", "accuracy"),
                        key="many_lens_chart")

    st.subheader("High-norm tokens per layer")
    st.markdown(HIGH_NORM_TEXT)
    st.plotly_chart(per_layer_figure(result.high_norm_rate, "Share of high-norm patch tokens", "share of patches",
                                     full_range=False),
                    key="many_norm_chart")

    st.subheader("Downloads")
    st.caption("The same three files as `vit-lens dataset`.")
    columns = st.columns(len(run.files))
    mimes = {".npz": "application/zip", ".json": "application/json", ".png": "image/png"}
    for column, (name, data) in zip(columns, run.files.items(), strict=True):
        column.download_button(name, data=data, file_name=name, mime=mimes[Path(name).suffix], key=f"many_dl_{name}",
                               on_click="ignore", icon=":material/download:")


def page(request: ModelRequest, loaded: LoadedModel) -> None:
    st.header("Many images")
    st.markdown(INTRO)
    make_set = set_ui(loaded)
    run_ui(request, loaded, make_set)
    run = st.session_state.get(_LATEST_RUN)
    if run is not None:
        results_ui(run, request)


if __name__ == "__main__":  # st.navigation runs this file as the page: draw it with the module's own functions
    from dashboard import many_images as _module

    _module.page(*st.session_state[_module._PAGE_MODEL])
