"""The Why? tab: every method's relevance map for a target class, judged: each map under every faithfulness test (and,
where the app knows where the object is, the localisation metrics) beside random patch orders, with verdicts by a
margin, and the sanity checks (definitions: docs/spec/analyses.md, "Why this prediction").

Like the other views it never calls the model itself: the maps come from `dashboard.caches` (cached per model, image
and target, computed by `vit_core.explain`); the tests and the sanity checks only when the user asks for them (a
button each), as they cost many forwards.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import streamlit as st

from dashboard import caches, session, text
from dashboard.figures import base as figures
from dashboard.figures import why as why_figures
from dashboard.literal import markdown_literal as md  # class names come from uploaded label files
from dashboard.server import process
from dashboard.views.context import ViewContext, cached_figure, no_head, shape, show_picture, target_ui
from dashboard.views.registry import view
from vit_core import explain
from vit_core.explain.perturbation import BEATS, TIED, WORSE
from vit_core.serving import WorkStopped

STEP_CHOICES = (5, 10, 20)  # S: points per deletion / insertion curve (the spec's default: 10)
VERDICT_MARKS = {BEATS: "✓", TIED: "≈", WORSE: "✗"}
# The judge's progress bar moves at most this often: each update re-renders the page in the browser, which shares the
# server's cores on a laptop (docs/performance.md, "The judge's forwards on lanes"); a second's judge needs none.
PROGRESS_EVERY_S = 0.5


def _method_title(method: str) -> str:
    """A method's name as the tabs show it (its key where text.py has no title)."""
    return text.METHOD_TITLES.get(method, method)


def _relevance_overlay(ctx: ViewContext, target: int, method: str, rule: str, encoding: str) -> bytes:
    """One method's relevance map for `target` over the crop (min-max scaled for display), enlarged. `rule`: the LRP
    rule the map was made with ("" for the other methods), which keys the figure cache."""
    del rule
    g, cap = ctx.loaded.geometry, ctx.cap
    amap = caches.relevance(ctx.request, ctx.loaded, ctx.image, cap, target).maps[method]  # (gh, gw)
    scale = figures.display_scale(cap.input_image.shape[1], 256)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, amap, g.patch_size), scale), encoding)


def _object_overlay(ctx: ViewContext, objects_digest: str, encoding: str) -> bytes:
    """The object's patches over the crop, enlarged as the maps are. `objects_digest` keys the figure cache."""
    del objects_digest
    g, cap = ctx.loaded.geometry, ctx.cap
    objects = _objects(ctx)  # (gh, gw) bool
    scale = figures.display_scale(cap.input_image.shape[1], 256)
    return figures.encode(figures.enlarge(figures.overlay(cap.input_image, objects.astype(np.float32), g.patch_size),
                                          scale), encoding)


def _objects(ctx: ViewContext) -> np.ndarray | None:
    """The patches (gh, gw) bool of the object, where the app knows where it is in this image (a drawing, a shape)."""
    known = session.known_object(ctx.image.sha)
    if known is None:
        return None
    try:
        return caches.object_patches(ctx.request, ctx.loaded, ctx.image, known.mask)
    except explain.MaskError:  # an object smaller than half of any patch: no localisation scores (said below the maps)
        return None


def _curves_png(ctx: ViewContext, target: int, steps: int, objects_digest: str, tests: tuple[str, ...], pixels: bool,
                methods: tuple[str, ...]) -> bytes:
    judged = caches.judgement_result(ctx.request, ctx.image, target, steps, _objects(ctx), tests)
    del objects_digest  # keys the figure cache: the judgement above is the one of this object
    curves = judged.pixel_curves if pixels else judged.curves
    shown = [m for m in methods if m in curves.deletion] + [explain.RANDOM]
    title = {m: _method_title(m) for m in methods} | {explain.RANDOM: explain.RANDOM}
    how = "pixels masked to the mean" if pixels else "tokens dropped"
    return why_figures.faithfulness_curves_png(
        {title[m]: curves.deletion[m] for m in shown}, {title[m]: curves.insertion[m] for m in shown},
        curves.random_deletion_std, curves.random_insertion_std,
        title=f"{how}; target {ctx.loaded.label(target)}: {steps} steps over {ctx.loaded.geometry.num_patches} patches")


def _sanity_png(ctx: ViewContext, target: int, methods: tuple[str, ...]) -> bytes:
    result = caches.sanity_result(ctx.request, ctx.image, target)
    return why_figures.sanity_png(result.stages, {m: result.cascading[m] for m in methods if m in result.cascading},
                                  {m: v for m, v in result.other_class_correlation.items() if m in methods},
                                  {m: _method_title(m) for m in methods},
                                  title=f"other class: {ctx.loaded.label(result.other_class)} ({result.other_class})")


@view("Why?", family="lesson", order=8)
def why_view(ctx: ViewContext) -> None:
    if no_head(ctx):
        st.markdown(text.WHY)
        return
    _explanations(ctx)
    st.markdown(text.WHY)
    st.markdown(text.WHY_DISAGREE)


@st.fragment
def _explanations(ctx: ViewContext) -> None:
    c1, c2 = st.columns([4, 1])
    target = target_ui(ctx, c1)
    steps = c2.selectbox("Curve steps S", STEP_CHOICES, index=STEP_CHOICES.index(10), key=session.K_STEPS,
                         bind="query-params", help=text.FAITHFULNESS_HOW)
    maps_area = st.container()  # the maps first, their choices below them; filled last: the button below may judge
    methods = st.pills("Methods", list(explain.METHODS), selection_mode="multi", default=list(explain.METHODS),
                       key=session.K_METHODS, bind="query-params", format_func=_method_title)
    chosen_tests = st.pills("Tests", list(explain.FAITHFULNESS_TESTS), selection_mode="multi",
                            default=list(explain.FAITHFULNESS_TESTS), key=session.K_TESTS, bind="query-params",
                            format_func=lambda t: text.TEST_TITLES[t][0],
                            help="Each test costs its own forwards: the two token-dropping curves are the quickest.")
    methods = [m for m in explain.METHODS if m in methods]  # display order, whatever order they were picked in
    tests = tuple(t for t in explain.FAITHFULNESS_TESTS if t in chosen_tests)
    if not methods or not tests:
        maps_area.info("Pick at least one method and one test.")
        return
    relevance = caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)
    objects = _objects(ctx)
    judged = caches.judgement_result(ctx.request, ctx.image, target, steps, objects, tests)
    if objects is None and session.known_object(ctx.image.sha) is not None:
        st.caption("The object covers no patch by half, so the maps are not scored against it: draw bigger or "
                   "with a wider pen.")
    st.divider()
    if judged is None:
        judged = _judge_button(ctx, relevance, steps, objects, tests)
        relevance = caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)  # the LRP rule chosen on judging
    if judged is not None:
        _trust_table(ctx, judged, target, steps, objects, tests, methods)
    with maps_area:
        _pair(ctx, relevance, judged, methods, objects)
        with st.expander(f"All {len(methods) + (objects is not None)} maps side by side, with what each computes"):
            _method_columns(ctx, relevance, judged, methods, objects)
    st.divider()
    _sanity(ctx, target, methods)


def _rule(relevance: explain.Relevance, method: str) -> str:
    """The LRP rule `method`'s map was made with (part of its figure's cache key); "" for the other methods."""
    choice = relevance.gamma_choice.get(method)
    return choice.name if choice is not None else explain.EPSILON_ONLY.name if method in explain.LRP_METHODS else ""


OBJECT = "object"  # the pair's name of the object's patches (the ground truth), beside the methods' names
PAIRED_FIRST = "chefer"  # the right map at first, beside the object (or the first method): the lesson's step 9 map
PAIR_COLUMNS = [2, 2, 1]  # two maps of about 370 px at 1280 x 720, whole in the first screen; their pickers beside


def pair_defaults(names: list[str]) -> tuple[str, str]:
    """The two maps shown at first: the object where the app knows it (else the first method), and Chefer's map (the
    lesson's step 9 map) or the next one."""
    right = PAIRED_FIRST if PAIRED_FIRST in names[1:] else names[min(1, len(names) - 1)]
    return names[0], right


def _pair(ctx: ViewContext, relevance: explain.Relevance, judged: explain.Judgement | None, methods: list[str],
          objects: np.ndarray | None) -> None:
    """Two maps, large enough for a room (a projector, a phone), chosen beside them; the others one click away in
    the expander of all the maps below (their descriptions there too)."""
    names = ([OBJECT] if objects is not None else []) + methods
    titles = {OBJECT: "Object (ground truth)"} | {m: _method_title(m) for m in methods}
    first_left, first_right = pair_defaults(names)
    columns = st.columns(PAIR_COLUMNS, gap="medium")
    with columns[2]:
        left = st.selectbox("Left map", names, index=names.index(first_left), key=session.K_WHY_LEFT,
                            format_func=titles.get)
        right = st.selectbox("Right map", names, index=names.index(first_right), key=session.K_WHY_RIGHT,
                             format_func=titles.get)
        st.caption("Every map, with what each computes: **All maps** below.")
    for name, column in zip((left, right), columns[:2], strict=True):
        with column:
            if name == OBJECT:
                _object_map(ctx, objects, "why_pair_object", width="stretch")
            else:
                _method_map(ctx, relevance, judged, name, f"why_pair_{name}", width="stretch", rule_caption=False)


def _object_map(ctx: ViewContext, objects: np.ndarray, key: str, width: int | str = "content") -> None:
    g = ctx.loaded.geometry
    known = session.known_object(ctx.image.sha)
    digest = caches.object_digest(objects)
    show_picture(cached_figure(_object_overlay, ctx, digest, "jpeg"), key, f"{ctx.stem}_object",
                 png=partial(_object_overlay, ctx, digest, "png"), title="Object (ground truth)", width=width)
    st.caption(f"{int(objects.sum())} of {g.num_patches} patches: {md(known.source)}, through the model's "
               "resize and crop; a patch is the object's when half its pixels are.")


def _method_map(ctx: ViewContext, relevance: explain.Relevance, judged: explain.Judgement | None, method: str,
                key: str, width: int | str = "content", rule_caption: bool = True) -> None:
    """A method's map over the crop (or why it has none), its name, how many tests it passed, and (`rule_caption`)
    the LRP rule its map was made with."""
    target = relevance.target
    if method not in relevance.maps:
        st.info(relevance.unsupported.get(method, "Not computed for this model."))
        st.markdown(f"**{_method_title(method)}**")
        return
    choice, rule = relevance.gamma_choice.get(method), _rule(relevance, method)
    show_picture(cached_figure(_relevance_overlay, ctx, target, method, rule, "jpeg"), key,
                 f"{ctx.stem}_{method}_class{target}", png=partial(_relevance_overlay, ctx, target, method, rule, "png"),
                 title=_method_title(method), width=width)
    if judged is not None and method in judged.methods:
        labels = [judged.results[t].verdict(method).label for t in judged.results]
        st.markdown(f"beats random on **{labels.count(BEATS)} of {len(labels)}** tests")
    if rule_caption and method in explain.LRP_METHODS:
        st.caption(f"rule chosen on this image: **{md(choice.name)}**" if choice is not None else
                   "rule: epsilon everywhere; judging the maps chooses the rule that scores best here")


def _method_columns(ctx: ViewContext, relevance: explain.Relevance, judged: explain.Judgement | None,
                    methods: list[str], objects: np.ndarray | None) -> None:
    """One column per method: its map over the crop (or why it has none), its name, how many tests it passed, what it
    computes; first the object's patches where the app knows them. The maps come first in every column, their names
    under them: a long name wraps to more lines in a narrow column, and above the maps it would push its map down."""
    g, target = ctx.loaded.geometry, relevance.target
    columns = st.columns(len(methods) + (objects is not None))
    if objects is not None:
        with columns[0]:
            _object_map(ctx, objects, "why_object")
    for method, col in zip(methods, columns[objects is not None:], strict=True):
        with col:
            _method_map(ctx, relevance, judged, method, f"why_{method}")
            st.caption(text.METHOD_TEXTS.get(method, ""))
    st.caption(f"maps `{shape(g.grid, batch=False)}` over the {g.num_patches} patches, for class "
               f"**{md(ctx.loaded.label(target))}** ({target}); each min-max scaled for display, exported unscaled.")


def _judge_button(ctx: ViewContext, relevance: explain.Relevance, steps: int, objects: np.ndarray | None,
                  tests: tuple[str, ...]) -> explain.Judgement | None:
    """The button that judges the maps: once clicked, a progress bar advanced as each test finishes. -> the judgement."""
    n = len(relevance.maps)
    slot = st.empty()  # the heading and button: gone once the table is there (it is drawn in this same run)
    with slot.container():
        st.markdown("**Which to trust here.** " + text.FAITHFULNESS_HOW)
        where = " and, on the object you drew or the generator drew, the localisation metrics" if objects is not None else ""
        names = ", ".join(text.TEST_TITLES[t][0] for t in tests)
        clicked = st.button(f"Judge the {n} maps: {names}{where}, against {explain.RANDOM_ORDERS} random orders "
                            f"({steps} steps)", key="why_judge", icon=":material/query_stats:", type="primary")
    if not clicked:
        return None
    bar = st.progress(0.0, text="choosing the LRP rule, then the tests...")
    shown = time.monotonic()

    def progress(fraction: float, message: str) -> None:
        nonlocal shown
        if time.monotonic() - shown >= PROGRESS_EVERY_S:
            bar.progress(min(1.0, max(0.0, float(fraction))), text=message)
            shown = time.monotonic()

    try:
        with process.explanation_job():  # below the class's new images; one per session
            judged = caches.compute_judgement(ctx.request, ctx.loaded, ctx.image, ctx.cap, relevance, steps, objects,
                                              progress, tests)
    except WorkStopped:
        bar.empty()
        st.info(text.JOB_STOPPED)
        return None
    bar.empty()
    slot.empty()
    return judged


def _cell(judged: explain.Judgement, test: str, method: str) -> str:
    verdict = judged.results[test].verdict(method)
    return f"{verdict.value:.3g} {VERDICT_MARKS[verdict.label]}"


def trust_table(judged: explain.Judgement, methods: list[str]) -> str:
    """Methods x tests as a Markdown table: each score with its verdict mark, then the random baseline's mean ± std."""
    tests = list(judged.results)
    head = "| method | " + " | ".join(f"{text.TEST_TITLES[t][0]} {'↑' if judged.results[t].higher_is_better else '↓'}"
                                       for t in tests) + " |"
    rows = [f"| {_method_title(m)} | " + " | ".join(_cell(judged, t, m) for t in tests) + " |"
            for m in methods if m in judged.methods]
    random_row = ("| random | " + " | ".join(f"{judged.results[t].random_mean:.3g} ± {judged.results[t].random_std:.2g}"
                                             for t in tests) + " |")
    return "\n".join([head, "| --- |" + " --- |" * len(tests), *rows, random_row])


def _and_list(names: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _which_tests(passed: tuple[str, ...], tests: list[str]) -> str:
    """The tests one group of methods beat random on, in the table's column order: named directly when they are at
    most half the tests, else as every test but those missed (the shorter list either way)."""
    titles = {t: text.TEST_TITLES[t][0] for t in tests}
    count = f"{len(passed)} of {len(tests)} tests"
    if not passed:
        return "no test"
    if len(passed) == len(tests):
        return f"every test ({count})"
    if len(passed) <= len(tests) - len(passed):
        return f"{_and_list([titles[t] for t in passed])} only ({count})"
    return f"every test but {_and_list([titles[t] for t in tests if t not in passed])} ({count})"


def agreement_sentence(judged: explain.Judgement, methods: list[str]) -> str:
    """What the table says, method by method: the methods that beat random on every test if any do (or that no map
    beats random anywhere), then each method's own tests, those with the same tests named together. Methods are
    merged only where their ✓ cells are the same: a summary never names a test for a method whose row lacks it."""
    shown = [m for m in methods if m in judged.methods]
    tests = list(judged.results)
    passed = {m: tuple(t for t in tests if judged.results[t].verdict(m).beats) for m in shown}
    best = max((len(v) for v in passed.values()), default=0)
    if best == 0:
        return ("**On this image no map is distinguishable from random on any test**: the model's decision may rest on "
                "something none of them captures, or the image has too little to find.")
    groups: dict[tuple[str, ...], list[str]] = {}  # the tests passed -> the methods that passed exactly those
    for m in sorted(shown, key=lambda m: -len(passed[m])):  # stable: the table's order among equals
        groups.setdefault(passed[m], []).append(m)
    clauses = [f"{_and_list([_method_title(m) for m in group])} "
               f"{'beats' if len(group) == 1 else 'beat'} random on {_which_tests(tests_passed, tests)}"
               for tests_passed, group in groups.items()]
    if best == len(tests):  # the first group passed every test
        leaders = _and_list([_method_title(m) for m in next(iter(groups.values()))])
        head = f"**All {len(tests)} tests agree on {leaders}**: beyond the random orders' spread on every one."
        return head if len(groups) == 1 else f"{head} {'; '.join(clauses[1:])}."
    return f"**The tests disagree.** {'; '.join(clauses)}."


def _trust_table(ctx: ViewContext, judged: explain.Judgement, target: int, steps: int, objects: np.ndarray | None,
                 tests: tuple[str, ...], methods: list[str]) -> None:
    st.markdown(f"**Which to trust here** (target **{md(ctx.loaded.label(target))}**)")
    st.markdown(trust_table(judged, methods))
    st.markdown(agreement_sentence(judged, methods))
    margin = explain.MARGIN_SDS
    st.caption(f"✓ beats random: better than the mean of the {explain.RANDOM_ORDERS} random orders (random maps for the "
               f"object metrics) by more than {margin:g} standard deviations of theirs; ≈ not distinguishable from "
               "random on this image; ✗ worse than random. ↑ higher is better, ↓ lower is better. The LRP maps' rule "
               "was chosen on this image by its own deletion and insertion score, so their verdicts on those two tests "
               "flatter them a little; the other tests are independent of the choice. "
               + " ".join(f"**{text.TEST_TITLES[t][0]}**: {text.TEST_TITLES[t][1]}." for t in judged.results))
    names = tuple(m for m in methods if m in judged.methods)
    digest = caches.object_digest(objects)
    # A toggle, not an expander: an expander's content is built (two figures) even while it is closed.
    if st.toggle("Show the deletion and insertion curves", key="why_show_curves"):
        for pixels, curves in ((False, judged.curves), (True, judged.pixel_curves)):
            if curves is not None:
                show_picture(cached_figure(_curves_png, ctx, target, steps, digest, tests, pixels, names),
                             f"why_curves_{'mask' if pixels else 'drop'}",
                             f"{ctx.stem}_{'masking' if pixels else 'dropping'}_class{target}_S{steps}")
        st.caption(f"curves of `{shape((steps,), batch=False)}` points each; the random band is the mean ± one standard "
                   f"deviation of the {explain.RANDOM_ORDERS} orders.")


def _sanity(ctx: ViewContext, target: int, methods: list[str]) -> None:
    """Adebayo et al.'s sanity checks, on request: the maps as the model's blocks are re-initialised from the top,
    and against a random other class's maps."""
    result = caches.sanity_result(ctx.request, ctx.image, target)
    if result is None:
        st.markdown("**Sanity checks** (Adebayo et al. 2018): a map that stays the same when the model's weights are "
                    "randomised, or when another class is explained, says nothing about this model's decision.")
        stages = ctx.loaded.geometry.num_layers + 1
        if not st.button(f"Run the sanity checks ({stages} re-initialisations of a private copy of the model, and "
                         "another class)", key="why_sanity", icon=":material/shuffle:"):
            return
        bar = st.progress(0.0, text="re-initialising from the top...")
        try:
            with process.explanation_job():  # below the class's new images; one per session
                result = caches.compute_sanity(ctx.request, ctx.loaded, ctx.image, ctx.cap, target,
                                               lambda fraction, message: bar.progress(min(1.0, float(fraction)),
                                                                                      text=message))
        except WorkStopped:
            bar.empty()
            st.info(text.JOB_STOPPED)
            return
        bar.empty()
    names = tuple(m for m in methods if m in result.cascading)
    st.markdown("**Sanity checks** (Adebayo et al. 2018)")
    show_picture(cached_figure(_sanity_png, ctx, target, names), "why_sanity_png", f"{ctx.stem}_sanity_class{target}")
    st.caption("Spearman's rank correlation of each map with its map on the trained model, as the head and then block "
               "after block are re-initialised (a private copy: the model you explore is untouched); a map that "
               "explains the model falls towards 0. Diamonds: the correlation with the map of a random other class; "
               "near 1 means the map ignores the class.")


# ----------------------------------------------------------------------------------------------
# This module's figures by a public name, for the lesson page (dashboard/lesson): the same cached figures.


def relevance_figure(ctx: ViewContext, relevance: explain.Relevance, method: str) -> bytes:
    """The Why? tab's map of `method` (one of relevance.maps) for relevance.target over the crop: JPEG bytes."""
    return cached_figure(_relevance_overlay, ctx, relevance.target, method, _rule(relevance, method), "jpeg")


def object_patches(ctx: ViewContext) -> np.ndarray | None:
    """The patches (gh, gw) bool of the object where the app knows it (the Why? tab judges maps against it), or None."""
    return _objects(ctx)


def curves_figure(ctx: ViewContext, target: int, steps: int, tests: tuple[str, ...], methods: tuple[str, ...]) -> bytes:
    """The Why? tab's token-dropping deletion and insertion curves of `methods` beside random orders: PNG bytes.
    Only once those `tests` were judged (caches.judgement_result with `object_patches(ctx)`)."""
    digest = caches.object_digest(_objects(ctx))
    return cached_figure(_curves_png, ctx, target, steps, digest, tests, False, methods)
