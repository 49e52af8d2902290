"""The one module that owns the dashboard's shared caches: every `st.cache_resource` and byte-budget store.

Shared by every browser session, all keyed on strings, never on tensors or arrays (what a cached function needs
beyond its key comes in as an underscore argument, which Streamlit does not hash):
- models: `st.cache_resource`, keyed by `ModelRequest.load_args`; `LoadedModel.lock` serialises forwards. A
  model that can't be loaded (offline, a refused weights file) is remembered for a minute, so reruns don't retry;
- one forward pass with its capture per (model, image), keyed by the model key and the sha256 of the image
  bytes: a `ByteBudgetCache` bounded by bytes (`CAPTURE_BUDGET`: $VIT_LENS_CAPTURE_MB, else a quarter of the
  machine's memory, 512 MiB to 8 GiB; see dashboard.server.byte_budget), since a capture is 31 MiB for
  ViT-B/16 and 205 MiB for ViT-B/16-384. Each session holds the capture it looks at in the same cache
  (evicted after every capture nobody holds); the decoded pictures the forward passes start from are bounded
  by bytes too (`PICTURE_BUDGET`, a sixteenth of that, at least 256 MiB);
- every per-image analysis that is a lens (vit_core.lenses: the catalog's mean attention distance, rollout,
  logit lens, attention logits, and the lenses of the server's lens files) in one store, `lens_arrays`, keyed by
  what the lens declares: (model, image, lens, its settings' values), bounded by bytes (`LENS_BUDGET`, a quarter
  of the captures'). A lens reads the shared capture; only one whose sites go beyond it runs a pass of its own;
- small per-model analyses (filter PCA, position similarity): the views and the `.npz` export read the same
  entries as the lenses' (`analysis_arrays`), nothing is computed twice;
- figures, keyed by what their builder takes (`dashboard.figure_keys`);
- the "why" analyses (`vit_core.explain`): relevance maps per (model, image, target), the per-patch logit lens,
  interventions per (model, image, intervention); the tests of the maps (`explain.judge`: curves, SRG, SaCo,
  localisation) and their sanity checks, computed on request with a progress bar, in small stores bounded by
  their number of entries, per (model, image, target, steps, object).

Shared by up to a classroom of sessions: every cache has `max_entries` or a budget. What a session keeps for
itself is `dashboard.session`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from functools import cache, partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import streamlit as st
from PIL import Image

import vit_core
from dashboard import examples, figure_keys, session
from dashboard.image_choice import ImageChoice, check_file_size, preview_copy
from dashboard.models import FailureMemory, ModelRequest, build_model
from dashboard.server import process
from dashboard.server.byte_budget import ByteBudgetCache, default_capture_budget, one_each
from vit_core import analyses, concepts, explain, export, lenses, serving
from vit_core.concepts.folders import ConceptsFolder, check_for_model, open_folder
from vit_core.images import DRAFT_MIN_SIDE
from vit_core.loading.model import LoadedModel, patch_embed_bias, patch_embed_weight, pos_embed_rows
from vit_core.sites import recorded_sites

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


def decode(name: str, data: bytes, in_session: bool = True) -> ImageChoice:
    """Decode uploaded or example bytes; raises vit_core.ImageError with a message for the user (also for a picture
    the sidebar's model would enlarge too far before its crop: LoadedModel.crop_transform.check). `in_session`:
    False outside a session's script run (the server's warm-up)."""
    check_file_size(data)
    sha = hashlib.sha256(data).hexdigest()
    if not in_session:
        return ImageChoice(name, sha, data, *_image_info(sha, data))
    with session.decode_lock():  # one decode in flight per session (vit_core.images.decode_image's slots are shared)
        choice = ImageChoice(name, sha, data, *_image_info(sha, data))
    loaded = session.chosen_model_if_any()
    if loaded is not None:  # refused now, while the previous image can still be kept, not in the forward pass
        loaded.crop_transform.check(choice.size)
    return choice


@st.cache_data(max_entries=16, show_spinner=False)
def example_bytes(name: str) -> bytes:
    """The bytes of a built-in example image (small: cache_data's copy per hit is cheap)."""
    return examples.example_bytes(name)


# ----------------------------------------------------------------------------------------------
# The forward pass per (model, image) and the analyses of its capture


_captures: ByteBudgetCache[vit_core.Capture] = ByteBudgetCache(CAPTURE_BUDGET)  # shared by every session


def shared_capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice) -> vit_core.Capture:
    """The capture of one hooked forward pass per (model, image), cached and shared by every session
    (computed once however many sessions ask for it at the same moment)."""
    def forward() -> vit_core.Capture:
        light = serving.light_pass(loaded)  # the Shapes ViT: each stroke of a drawing is a new image, done at once
        cap = serving.serve_capture(loaded, full_image(image, loaded.decode_min_side), on_this_thread=light)
        if not light:
            process.new_image_turn.made_a_capture()  # this image's figures come after others' control changes
        return cap

    return _captures.get_or_compute((request.key, image.sha), forward)


def held_capture(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, holder: str) -> vit_core.Capture:
    """`shared_capture` of the image a session is looking at, held in the cache for that session (`holder`:
    `session.holder()`).

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
    _captures.hold(holder, (request.key, image.sha))
    return cap


# Every per-image analysis that is a lens (vit_core.lenses: the catalog's built-in ones, the server's lens files'), in
# one store keyed by what the lens declares: (model, image, lens, its settings' values). Bounded by bytes, not a
# count: a rollout is a few KiB, ViT-B/16's attention logits 22 MiB, at 384 px 190 MiB.
LENS_BUDGET = max(CAPTURE_BUDGET // 4, 128 * 2**20)  # bytes: every lens result of every session
LENS_ENTRY_BYTES = 4096  # the least an entry counts for (a failure's sentence, two (L, H) arrays), so that the count
# of entries is bounded too
CAPTURE_LENS = "capture"  # the catalog's lens of the capture's own fields: read from the capture, never stored twice


@dataclasses.dataclass(frozen=True)
class LensResult:
    arrays: dict[str, np.ndarray]  # the lens's own keys -> read-only arrays (shapes: the lens's docstring)
    failure: str | None = None  # the sentence saying why the lens failed on this image (then no arrays)


def _lens_nbytes(result: LensResult) -> int:
    return max(sum(int(a.nbytes) for a in result.arrays.values()), LENS_ENTRY_BYTES)


_lens_results: ByteBudgetCache[LensResult] = ByteBudgetCache(LENS_BUDGET, size_of=_lens_nbytes)


@cache
def _catalog() -> dict[str, lenses.Lens]:
    return {one.name: one for one in lenses.catalog()}


def lens_key(request: ModelRequest, image: ImageChoice, one: lenses.Lens, settings: dict[str, Any]) -> tuple:
    """What a lens result is kept under: the model, the image's sha256, the lens (its source, name and file's digest)
    and its settings over their defaults (lenses.settings_key: LensError for a setting it doesn't declare)."""
    return request.key, image.sha, f"{one.source}:{one.name}:{one.sha256}", lenses.settings_key(one, settings)


def _lens_pass(loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture, one: lenses.Lens) -> vit_core.Capture:
    """The capture `one` reads: the shared one when its sites are all the default capture's (no forward), else a
    pass of its own that records its extra sites too (the shared capture records no extras)."""
    if not recorded_sites(one.sites, loaded.geometry.num_layers):  # SiteError for a site this model hasn't
        return cap
    return vit_core.run_with_capture(loaded, full_image(image, loaded.decode_min_side), sites=one.sites)


def _lens_entry(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                one: lenses.Lens, settings: dict[str, Any]) -> LensResult:
    def compute() -> LensResult:
        try:
            arrays = lenses.results_of(one, _lens_pass(loaded, image, cap, one), settings, loaded)
        except vit_core.ViTLensError as e:  # LensError, SiteError: said in the lens's tab, kept like a result
            return LensResult({}, str(e))
        for array in arrays.values():
            array.setflags(write=False)  # shared by every session
        return LensResult(arrays)

    return _lens_results.get_or_compute(lens_key(request, image, one, settings), compute)


def lens_arrays(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                one: lenses.Lens | str, **settings: Any) -> dict[str, np.ndarray]:
    """The arrays of lens `one` (a catalog lens by its name, or a loaded Lens) on this image with `settings` over its
    defaults, keyed as the lens returns them (`rollout`, not `rollout.rollout`): computed once per (model, image,
    lens, settings) for every session, from the shared capture (a pass of its own only for sites beyond it). Raises
    LensError when the lens fails on this image."""
    one = _catalog()[one] if isinstance(one, str) else one
    result = _lens_entry(request, loaded, image, cap, one, settings)
    if result.failure is not None:
        raise lenses.LensError(result.failure)
    return result.arrays


def uncached_attention_distances(loaded: LoadedModel, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The mean attention distances (L, H) of an image file, kept out of the shared caches: the image is decoded
    and run here, reduced to the two (L, H) arrays, and its picture and capture are dropped (the distance tab's
    batch uploader: 32 ViT-B/16-384 captures would be 6.5 GiB). Raises vit_core.ImageError with a message for
    the user."""
    check_file_size(data)
    cap = serving.serve_capture(loaded, vit_core.decode_image(data, loaded.decode_min_side).image)
    return export.mean_attention_distances(cap)


@st.cache_resource(max_entries=8, show_spinner=False)
def patches_as_linear(model_key: str, image_sha: str, _loaded: LoadedModel,
                      _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    """The normalised input cut into flattened patches (N, ph*pw*3), and E x + b for each (N, D)."""
    g = _cap.geometry
    image = np.ascontiguousarray(_cap.input_tensor.transpose(1, 2, 0))  # (3, H, W) -> (H, W, 3)
    flat = analyses.flatten_patches(analyses.split_patches(image, g.patch_size))  # (N, ph, pw, 3) -> (N, ph*pw*3)
    linear = analyses.embed_patches_linear(flat, patch_embed_weight(_loaded), patch_embed_bias(_loaded))
    return flat, linear


@st.cache_resource(max_entries=6, show_spinner=False)
def filters_pca(model_key: str, _loaded: LoadedModel) -> analyses.FilterPCA:
    return analyses.filters_pca(patch_embed_weight(_loaded), k=analyses.PCA_COMPONENTS)


@st.cache_resource(max_entries=24, show_spinner=False)
def pos_similarity(model_key: str, grid: tuple[int, int], _loaded: LoadedModel) -> np.ndarray | None:
    """Position-embedding similarity (N', gh', gw') on `grid` (resampled in 2D if it differs), or None."""
    g = _loaded.geometry
    rows = pos_embed_rows(_loaded)
    if rows is None:
        return None
    if tuple(grid) != tuple(g.grid):
        rows = analyses.resample_pos_embed(rows, g.grid, grid, g.num_prefix_tokens, g.no_embed_class)  # (T_pe', D)
    return analyses.pos_embed_similarity(rows, g.num_prefix_tokens, g.no_embed_class, grid)


def analysis_arrays(request: ModelRequest, loaded: LoadedModel, image: ImageChoice,
                    cap: vit_core.Capture) -> dict[str, np.ndarray]:
    """Every array of the export format (`vit_core.export.analysis_arrays`: the same keys and values), from the
    entries the views read: each catalog lens of every image's export with its default settings (the attention
    distances, the rollout of the Attention tab's defaults: mean fusion, every layer; the capture's own fields from
    the capture), the filter PCA and the position similarity on the model's own grid. A function of plain
    arguments: called from a download button's thread."""
    g = loaded.geometry
    computed = {one.name: lens_arrays(request, loaded, image, cap, one) for one in lenses.catalog()
                if one.export == "image" and one.name != CAPTURE_LENS}
    return (export.image_arrays(cap, computed=computed)
            | export.model_arrays(filters_pca(request.key, loaded), pos_similarity(request.key, tuple(g.grid), loaded)))


# ----------------------------------------------------------------------------------------------
# "Why this prediction": explanations, logit lens, interventions, faithfulness curves


@st.cache_resource(max_entries=24, show_spinner=False)
def _relevance(model_key: str, image_sha: str, target: int, _loaded: LoadedModel,
               _cap: vit_core.Capture) -> explain.Relevance:
    return explain.relevance_maps(_loaded, _cap, target=target, cap=_cap, choose_gamma=False)


# The LRP maps with their rule chosen on the image (explain.relevance_maps' gamma choice: a faithfulness test of each
# candidate, about 60 perturbed inputs; docs/performance/2026-11-25.md, "AttnLRP and CP-LRP"): made when someone judges the maps,
# or with the maps for a light model.
_chosen_relevance: ByteBudgetCache[explain.Relevance] = ByteBudgetCache(24, size_of=one_each)


def relevance(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
              target: int) -> explain.Relevance:
    """Every method's relevance map (gh, gw) for class `target`, cached and shared by every session. The LRP maps
    by the rule chosen on this image: for a light model (`serving.light_pass`: the Shapes ViT, whose choice takes
    about 0.3 s) at once, so its maps never change when judged; for the others once someone judged the maps, until
    then by the epsilon rule (one forward and a backward per method: the maps appear with the others)."""
    chosen = _chosen_relevance.get((request.key, image.sha, int(target)))
    if chosen is not None:
        return chosen
    if serving.light_pass(loaded):
        return chosen_relevance(request, loaded, image, cap, target)
    return _relevance(request.key, image.sha, int(target), loaded, cap)


def relevance_kept(request: ModelRequest, image: ImageChoice, target: int) -> bool:
    """Whether `relevance` has the maps of this image and class with the rule chosen at hand (a light model's are
    kept so from the start), so that asking for them costs nothing now."""
    return _chosen_relevance.get((request.key, image.sha, int(target))) is not None


def chosen_relevance(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                     target: int) -> explain.Relevance:
    """`relevance` with the LRP rule chosen on this image (explain.relevance_maps with its gamma choice): computed now
    unless kept, and from now on what `relevance` gives every session."""
    key = (request.key, image.sha, int(target))
    chosen = _chosen_relevance.get(key)
    if chosen is not None:
        return chosen
    if serving.light_pass(loaded):  # asked for by `relevance` before any map was made: all of them in one call
        chosen = explain.relevance_maps(loaded, cap, target=int(target), cap=cap, choose_gamma=True)
    else:  # the epsilon maps are shown: only the LRP maps change, the others are taken from them, not made again
        epsilon = _relevance(request.key, image.sha, int(target), loaded, cap)
        lrp = explain.relevance_maps(loaded, cap, target=int(target), cap=cap, methods=explain.LRP_METHODS,
                                     choose_gamma=True)
        merged = {m: a for m, a in epsilon.maps.items() if m not in explain.LRP_METHODS} | lrp.maps
        maps = {m: merged[m] for m in explain.METHODS if m in merged}  # in METHODS order, as relevance_maps gives
        chosen = dataclasses.replace(epsilon, maps=maps, unsupported=epsilon.unsupported | lrp.unsupported,
                                     gamma_choice=lrp.gamma_choice, choice_sets=lrp.choice_sets)
    _chosen_relevance.put(key, chosen)
    return chosen


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


# Results computed on request (a button), with a progress bar, which st.cache_resource can't show while it computes:
# kept here for every session, the oldest used first out past a number of entries.
_judgements: ByteBudgetCache[explain.Judgement] = ByteBudgetCache(32, size_of=one_each)
_latest_judgement: ByteBudgetCache[tuple] = ByteBudgetCache(64, size_of=one_each)  # (model, image) -> its latest key
_sanity: ByteBudgetCache[explain.Sanity] = ByteBudgetCache(16, size_of=one_each)


def object_digest(objects: np.ndarray | None) -> str:
    """Names the object patches (gh, gw) bool in cache keys ("" for none)."""
    return "" if objects is None else hashlib.sha256(np.packbits(objects).tobytes()).hexdigest()[:16]


def _judgement_key(request: ModelRequest, image: ImageChoice, target: int, steps: int, objects: np.ndarray | None,
                   tests: tuple[str, ...]) -> tuple[str, str, int, int, str, tuple[str, ...]]:
    return request.key, image.sha, int(target), int(steps), object_digest(objects), tuple(tests)


@st.cache_resource(max_entries=32, show_spinner=False)
def _object_patches(model_key: str, image_sha: str, mask_digest: str, _loaded: LoadedModel, _mask: np.ndarray,
                    image_size: tuple[int, int]) -> np.ndarray:
    patches = explain.object_patches(_loaded, _mask, image_size)
    patches.setflags(write=False)
    return patches


def object_patches(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, mask: np.ndarray) -> np.ndarray:
    """The patches (gh, gw) bool the object covers (at least half their pixels), with the mask (H, W) through the
    model's own resize and crop (explain.object_patches)."""
    digest = hashlib.sha256(np.packbits(mask).tobytes() + str(mask.shape).encode()).hexdigest()
    return _object_patches(request.key, image.sha, digest, loaded, mask, tuple(image.size))


def judgement_result(request: ModelRequest, image: ImageChoice, target: int, steps: int, objects: np.ndarray | None,
                     tests: tuple[str, ...] = explain.FAITHFULNESS_TESTS) -> explain.Judgement | None:
    """`tests` of every map of (model, image, target, steps, object) if someone judged them already, else None."""
    return _judgements.get(_judgement_key(request, image, target, steps, objects, tests))


def compute_judgement(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                      relevance: explain.Relevance, steps: int, objects: np.ndarray | None,
                      progress: Callable[[float, str], None] | None = None,
                      tests: tuple[str, ...] = explain.FAITHFULNESS_TESTS) -> explain.Judgement:
    """Every map of `relevance`'s target under the faithfulness `tests`, and the localisation metrics where the
    object's patches are known, beside the random baseline (explain.judge): computed now, kept for every session.
    The LRP maps judged are those with their rule chosen on the image (`chosen_relevance`), which `relevance` gives
    from then on."""
    if progress is not None:
        progress(0.0, "choosing the LRP rule on this image...")
    relevance = chosen_relevance(request, loaded, image, cap, relevance.target)
    known = relevance.choice_sets  # the choice's forwards, not run again; unless the maps outlived their model object
    reuse = known if known is not None and known.ran_on(loaded.model) else None  # (the model was loaded again)
    result = explain.judge(loaded, cap, relevance.maps, relevance.target, mask=objects, steps=steps, tests=tests,
                           progress=progress, reuse=reuse)
    key = _judgement_key(request, image, relevance.target, steps, objects, tuple(tests))
    _judgements.put(key, result)
    _latest_judgement.put((request.key, image.sha), key)
    return result


def latest_judgement(request: ModelRequest, image: ImageChoice) -> explain.Judgement | None:
    """The tests judged last for this model and image (any target, steps or object), if still kept."""
    key = _latest_judgement.get((request.key, image.sha))
    return None if key is None else _judgements.get(key)


def sanity_result(request: ModelRequest, image: ImageChoice, target: int) -> explain.Sanity | None:
    return _sanity.get((request.key, image.sha, int(target)))


def compute_sanity(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture, target: int,
                   progress: Callable[[float, str], None] | None = None) -> explain.Sanity:
    """The sanity checks of every method's map (explain.sanity_checks: cascading re-initialisation on a private
    copy of the model, and a random other class): computed now, kept for every session."""
    result = explain.sanity_checks(loaded, cap, int(target), progress=progress)
    _sanity.put((request.key, image.sha, int(target)), result)
    return result


def explanation_arrays(request: ModelRequest, loaded: LoadedModel, image: ImageChoice,
                       cap: vit_core.Capture) -> dict[str, np.ndarray]:
    """The explanation keys of the export (interface.md, "Explanations in the export", as
    `vit_core.export.explanation_arrays` builds them) from what the dashboard computed, without running
    the tests again: target, relevance_<method>, logit_lens, token_norms, and where this image's maps were judged
    (for the target they were judged for; else the top-1) deletion_<name> / insertion_<name> and the other tests'
    keys (`export.judgement_arrays`). A function of plain arguments: called from a download button's thread."""
    judged = latest_judgement(request, image)
    target = judged.target if judged is not None else explain.resolve_target(loaded, cap.logits)
    arrays = export.explanation_arrays(relevance(request, loaded, image, cap, target),
                                       lens_arrays(request, loaded, image, cap, "logit_lens")["logit_lens"],
                                       explain.token_norms(cap),
                                       None if judged is None else judged.curves)
    return arrays if judged is None else arrays | export.judgement_arrays(judged)


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
# Concepts (vit_core.concepts): the files of a `vit-lens concepts` run, found by their path on the server


@st.cache_resource(max_entries=4, show_spinner=False)
def _concepts(folder: str, stamp: tuple[int, ...]) -> ConceptsFolder:
    return open_folder(Path(folder))


def loaded_concepts(folder: str) -> tuple[str, ConceptsFolder]:
    """The concepts in `folder` (absolute: a server's offered folder, or a single user's typed one), read and checked
    once (vit_core.concepts.folders.open_folder), and the key that names them in other caches (the folder and its
    files' modification times: a rerun's new files are read again). Raises ConceptsError."""
    stamp = []
    for name in (concepts.CONCEPTS_FILE, concepts.SUMMARY_FILE):
        try:
            stamp.append(os.stat(Path(folder) / name).st_mtime_ns)
        except OSError:
            stamp.append(-1)  # open_folder says why, if it matters
    resolved = str(Path(folder).resolve())
    return f"{resolved}|{stamp[0]}|{stamp[1]}", _concepts(resolved, tuple(stamp))


@st.cache_resource(max_entries=16, show_spinner=False)
def _model_check(concepts_key: str, num_layers: int, grid: tuple[int, int], _opened: ConceptsFolder) -> str:
    try:
        check_for_model(_opened, num_layers, grid)
    except concepts.ConceptsError as e:
        return str(e)
    return ""


def concepts_model_check(concepts_key: str, opened: ConceptsFolder, loaded: LoadedModel) -> str:
    """Why the concepts don't fit `loaded`'s blocks and grid ("" when they do), checked once per concepts and model
    shape (concepts.json's top patches can number a million)."""
    g = loaded.geometry
    return _model_check(concepts_key, g.num_layers, tuple(g.grid), opened)


@st.cache_resource(max_entries=16, show_spinner=False)
def _image_concepts(model_key: str, image_sha: str, concepts_key: str, _concepts: concepts.Concepts,
                    _cap: vit_core.Capture) -> concepts.ImageConcepts:
    return concepts.image_concepts(_concepts, _cap, count=concepts.SHOWN_FEATURES)


def image_concepts(request: ModelRequest, image: ImageChoice, concepts_key: str, found: concepts.Concepts,
                   cap: vit_core.Capture) -> concepts.ImageConcepts:
    """The image's strongest features and reconstruction error, from its capture (no forward pass)."""
    return _image_concepts(request.key, image.sha, concepts_key, found, cap)


@st.cache_resource(max_entries=64, show_spinner=False)
def _concept_removed(model_key: str, image_sha: str, concepts_key: str, feature: int, _loaded: LoadedModel,
                     _concepts: concepts.Concepts, _cap: vit_core.Capture) -> np.ndarray:
    return concepts.logits_with_concept_removed(_loaded, _cap, _concepts, feature)


def concept_removed_logits(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                           concepts_key: str, found: concepts.Concepts, feature: int) -> np.ndarray:
    """The logits (C,) with one feature's share of the reconstruction subtracted at the concepts' layer."""
    return _concept_removed(request.key, image.sha, concepts_key, feature, loaded, found, cap)


@st.cache_resource(max_entries=16, show_spinner=False)
def _circuit(path: str, stamp: int, num_features: int) -> dict:
    from vit_core.concepts.folders import read_circuit

    return read_circuit(Path(path), num_features)


def loaded_circuit(path: str, num_features: int) -> dict:
    """circuit.json at `path`, read and checked once per modification (vit_core.concepts.folders.read_circuit, every
    block's F bounded by `num_features`). Raises ConceptsError."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = -1  # read_circuit says why
    return _circuit(path, stamp, num_features)


@st.cache_resource(max_entries=16, show_spinner=False)
def _image_circuit(model_key: str, image_sha: str, concepts_keys: tuple[str, ...], _loaded: LoadedModel,
                   _dictionaries: tuple, _cap: vit_core.Capture):
    from vit_core.concepts.circuit import image_circuit as circuit_of_image

    return circuit_of_image(_loaded, _dictionaries, explain.model_input(_loaded, _cap))


def image_circuit(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                  concepts_keys: tuple[str, ...], dictionaries: tuple):
    """The image's circuit through the listed blocks' dictionaries (vit_core.concepts.circuit.image_circuit)."""
    return _image_circuit(request.key, image.sha, concepts_keys, loaded, dictionaries, cap)


@st.cache_resource(max_entries=64, show_spinner=False)
def _image_removal(model_key: str, image_sha: str, upstream_key: str, downstream_key: str, u: int, v: int,
                   _loaded: LoadedModel, _upstream: concepts.Concepts, _downstream: concepts.Concepts,
                   _cap: vit_core.Capture) -> tuple[np.ndarray, np.ndarray]:
    from vit_core.concepts.circuit import image_removal as removal_on_image

    return removal_on_image(_loaded, _upstream, _downstream, explain.model_input(_loaded, _cap), u, v)


def image_removal(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture,
                  keys: tuple[str, str], dictionaries: tuple, u: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """v's activation per patch (N,) of the image, plain and with u removed at u's block."""
    return _image_removal(request.key, image.sha, *keys, u, v, loaded, *dictionaries, cap)


@st.cache_resource(max_entries=128, show_spinner=False)
def _feature_crops(model_key: str, concepts_key: str, feature: int, count: int, _loaded: LoadedModel,
                   _images: Path | None, _top: tuple) -> list[tuple[np.ndarray, float]]:
    return concepts.top_crops(_loaded, _images, _top, count)


def feature_crops(request: ModelRequest, loaded: LoadedModel, concepts_key: str, opened: ConceptsFolder, feature: int,
                  count: int) -> list[tuple[np.ndarray, float]]:
    """A feature's top patches from the folder it was learned on (crops around them, with their activations); none
    where the folder is not on this machine, and none of a file outside it."""
    entries = opened.summary.get("features", [])
    top = entries[feature].get("top", []) if feature < len(entries) else []
    return _feature_crops(request.key, concepts_key, feature, count, loaded, opened.images, tuple(top))


# ----------------------------------------------------------------------------------------------
# Lenses (vit_core.lenses): the built-in ones and those the server was started with, never a page's


@st.cache_resource(show_spinner=False)
def page_lenses(sources: tuple[str, ...]) -> tuple[tuple[lenses.Lens, ...], str | None]:
    """The lenses of `sources` (imported once per server) and None, or () and the sentence saying why they can't be
    loaded (the tab shows it)."""
    try:
        return tuple(lenses.lenses_of(list(sources))), None
    except lenses.LensError as e:
        return (), str(e)


def lens_result(request: ModelRequest, loaded: LoadedModel, image: ImageChoice, cap: vit_core.Capture, one: lenses.Lens,
                settings: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """`one`'s arrays keyed `<lens>.<key>` on this image with `settings` over its defaults, and None (`lens_arrays`);
    or {} and the sentence of its failure, for the Lenses tab to show."""
    result = _lens_entry(request, loaded, image, cap, one, dict(settings or {}))
    return {f"{one.name}.{key}": array for key, array in result.arrays.items()}, result.failure


@st.cache_resource(max_entries=2, show_spinner=False)
def random_init_model(architecture: str, labels: tuple[str, ...] | None,
                      _build: Callable[[str, tuple[str, ...] | None], LoadedModel]) -> LoadedModel:
    """The Compare tab's "random init of A" (`dashboard.compare_models` builds it), one per architecture and names."""
    return _build(architecture, labels)


@st.cache_resource(max_entries=4, show_spinner=False)
def set_comparison(key_a: str, key_b: str, _a: LoadedModel, _b: LoadedModel,
                   _compare: Callable[[LoadedModel, LoadedModel], Any]) -> Any:
    """The Compare tab's comparison of A and B over its set (`dashboard.compare_models` computes it), by both keys."""
    return _compare(_a, _b)

