"""The lesson page's Streamlit layer: the step bar (Back, the step numbers, Next), one step's main figure beside its
text, the predict-then-reveal question and the concept check. It only arranges: the words and answers come from
dashboard/lesson/steps.py and quiz.py, every figure from the explorer's own figure functions (dashboard/views), the
numbers from the one cached capture and `dashboard.caches`.

The step lives in the URL (`?step=N`, set with st.query_params), so a teacher can link a slide to a step. Answers
live only in this session's widget state (the concept check's persists across steps: `persist_state="session"`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import streamlit as st

from dashboard import caches, draw, inputs, session
from dashboard.figures import base as figures
from dashboard.figures.base import image_size, is_jpeg, recorded_text_px
from dashboard.lesson import ahead, quiz, steps
from dashboard.lesson.facts import top_layer_from
from dashboard.lesson.quiz import Question
from dashboard.lesson.steps import COUNT, STEPS, StepText
from dashboard.text import METHOD_TITLES
from dashboard.views import attention, embeddings, lens, pipeline, prediction, why
from dashboard.views.context import ViewContext
from dashboard.views.header import outside_its_world
from vit_core import analyses, explain, serving, settings
from vit_core.explain.perturbation import BEATS, TIED, WORSE
from vit_core.loading.model import pos_embed_rows

STEP_PARAM = "step"
EXPLORER = "page_scripts/one_image.py"
# The figure's largest size on screen, CSS pixels: beside the text, or (figures much wider than tall) across the
# page with the text below. The lesson opens with the sidebar collapsed, so at 1280 x 720 the page is about 1230 px
# wide and the figure starts about 115 px down, below the step bar: either way it ends inside the first 720 px.
SIDE_MAX = (720, 580)  # (width, height)
WIDE_MAX = (1100, 380)  # lower, so that the text below starts on the first screen too
WIDE_ASPECT = 1.6  # width / height from which a figure goes across the page
# The smallest figure text a projector's back row reads, in CSS pixels on the screen: a figure is shown at least as
# wide as its smallest text (recorded in the picture by dashboard/figures) needs for that, within the sizes above.
MIN_TEXT_PX = 18
DELETION_TESTS = ("deletion_auc",)  # the Why? tab's quickest test: one token-dropping curve per map
DELETION_STEPS = 10  # points per curve, the spec's default
VERDICT_INDEX = {BEATS: 0, TIED: 1, WORSE: 2}  # explain's verdict -> steps.VERDICT_ANSWERS


def requested_step() -> int:
    return steps.parse_step(st.query_params.get(STEP_PARAM))


def go_to(step: int) -> None:
    """on_click of Back and Next: the step in the URL (the page reruns on it)."""
    st.query_params[STEP_PARAM] = str(step)


def is_wide(size: tuple[int, int]) -> bool:
    """Whether a picture of `size` (width, height) goes across the page, its text below it."""
    return size[0] >= WIDE_ASPECT * size[1]


def figure_width(size: tuple[int, int], largest: tuple[int, int], text_px: float | None = None) -> int:
    """The width in CSS pixels at which a picture of `size` (width, height) fits inside `largest` (width, height),
    and no narrower than its smallest text (`text_px` in the picture's own pixels; None: it has none) needs to be
    MIN_TEXT_PX on the screen, as long as that fits `largest`'s width."""
    (w, h), (max_w, max_h) = size, largest
    fit = max_h * w / max(h, 1)
    legible = w * MIN_TEXT_PX / text_px if text_px else 0.0
    return int(max(120, min(max_w, max(fit, legible))))


@dataclass(frozen=True)
class Layout:
    """Where a step puts things: its figure, its controls, its words (sentences, Notice, Try this), its question."""

    largest: tuple[int, int]  # the figure's largest size on screen (width, height), CSS pixels
    figure: Any  # st.empty(): the figure's box, sized once the figure is known
    controls: Any
    words: Any
    question: Any


def layout(wide: bool) -> Layout:
    """Beside: the figure left, one column of controls, words and question right. Wide: the figure across the page,
    the words below it on the left, the controls and the question on the right."""
    if wide:
        figure = st.empty()
        left, right = st.columns([3, 2], gap="medium")
        return Layout(WIDE_MAX, figure, right.container(), left.container(), right.container())
    with st.container(horizontal=True, gap="medium"):
        figure = st.empty()
        column = st.container(width="stretch")
    return Layout(SIDE_MAX, figure, column.container(), column.container(), column.container())


# The last step: the figure with its words below on the left, and on the right, from the top of the first screen,
# the links and the concept check (below everything else it was out of the first screen).
LAST_COLUMNS = (7, 3)
LAST_MAX = (840, 420)  # the left column's width at 1280 px: the logit lens's text at MIN_TEXT_PX


def last_step_layout() -> Layout:
    left, right = st.columns(list(LAST_COLUMNS), gap="medium")
    return Layout(LAST_MAX, left.empty(), right.container(), left.container(), right.container())


def arrange(ctx: ViewContext, probe: bytes | None, place: Layout | None = None) -> Layout:
    """A step's layout, chosen by the shape of its figure: `probe` is the figure at the step's first settings (a
    control changes what a figure shows, not its shape), None where the step has none for this model. `place`: a
    layout the step chose itself."""
    place = place or layout(probe is not None and is_wide(image_size(probe)))
    with place.words:
        inputs.untrained_warning(ctx.loaded)
    return place


# The main area's words for the back row: the sentences, the questions and their options at BODY_PX (Streamlit's
# 16 px body and 14 px widget labels read small on a projector). The sidebar keeps its own sizes.
BODY_PX = 18
LESSON_CSS = f"""
[data-testid="stMain"] [data-testid="stMarkdownContainer"] :is(p, li),
[data-testid="stMain"] [data-testid="stWidgetLabel"] p {{ font-size: {BODY_PX}px; }}
"""


def lesson(ctx: ViewContext) -> None:
    st.html(f"<style>{LESSON_CSS}</style>")
    step = requested_step()
    step_bar(step)
    DRAW[step - 1](ctx)
    if step == 1:
        with st.expander("Before you start: a short check (what do you know already?)", expanded=True):
            concept_check("start")
        st.caption(static_lesson_note(settings.STATIC_LESSON.text()))


# The static lesson (vit_core.web): where a class has no server to host, the same ten steps in each student's browser.
STATIC_LESSON = ("No server for your class? This lesson also runs in each student's browser, with the model: "
                 "`vit-lens export-web --out lesson/` writes it as a folder to put on any web space (README, "
                 "\"A lesson without a server\").")


def static_lesson_note(address: str) -> str:
    """The line under step 1: a link to the class's static lesson where the server was told its address
    (VIT_LENS_STATIC_LESSON), else the command that makes one."""
    if not address:
        return STATIC_LESSON
    target = address.replace(" ", "%20").replace("(", "%28").replace(")", "%29")  # a Markdown link's target, unbroken
    return f"This lesson also runs without a server, in each student's browser: [the static lesson]({target})."


def end_checks() -> None:
    """The last step's concept check, the start's answers beside it, and how the two compare."""
    with st.expander("Check what you learned", expanded=True):
        end = concept_check("end")
    with st.expander("Your answers at the start"):
        start = concept_check("start")
    line = quiz.progress_line(start, end)
    if line:
        st.markdown(line)


def step_bar(step: int) -> None:
    """One compact row: Back, the step and its title (pick another to go there), Next."""
    # Page Up and Page Down are what a presenter's clicker sends; the buttons show them. No tooltips: after a click
    # the pointer stays on the button, and its tooltip stayed over the page's top right.
    with st.container(horizontal=True, vertical_alignment="center", key="lesson_bar"):
        st.button("Back", key="lesson_back", icon=":material/arrow_back:", disabled=step == 1, on_click=go_to,
                  args=(step - 1,), shortcut="PageUp")
        picked = st.selectbox("Step", list(range(1, COUNT + 1)), index=step - 1, key=f"lesson_steps_{step}",
                              format_func=lambda n: f"Step {n} of {COUNT}: {STEPS[n - 1].title}",
                              label_visibility="collapsed", width=420)
        st.button("Next", key="lesson_next", icon=":material/arrow_forward:", icon_position="right", type="primary",
                  disabled=step == COUNT, on_click=go_to, args=(step + 1,), shortcut="PageDown")
    if picked != step:
        go_to(picked)
        st.rerun()


FIGURE_KEY = "lesson_figure"  # the figure's box; a page's CSS and the browser tests find it by this key's class


def show_figure(place: Layout, data: bytes, caption: str | None = None, key: str = FIGURE_KEY) -> None:
    """A step's main figure: the explorer's bytes as they are, shown at a width that fits the first screen. A step
    that shows a first figure and then its final one gives the first another `key` (a key is once per run)."""
    width = figure_width(image_size(data), place.largest, recorded_text_px(data))
    with place.figure.container(width=width, key=key):
        st.image(data, caption=caption, width="stretch", output_format="JPEG" if is_jpeg(data) else "PNG")


def say(place: Layout, text: StepText, key: str, answer: Callable[[], StepText] | None = None) -> None:
    """The step's sentences, Notice and Try this; its question, and the link to the explorer's view."""
    with place.words:
        st.markdown(text.body)
        st.markdown(f":material/visibility: **Notice.** {text.notice}")
        st.markdown(f":material/touch_app: **Try this.** {text.try_this}")
    with place.question:
        if text.question is not None:
            predict_then_reveal(text, key, answer)
        if text.explore:
            view = text.explore["view"]
            st.page_link(EXPLORER, label=f"Open the {view} view in the explorer", query_params=text.explore,
                         icon=":material/open_in_new:")


def predict_then_reveal(text: StepText, key: str, answer: Callable[[], StepText] | None = None) -> None:
    """Pick first, then reveal: the answer (from `answer()` where it costs something to compute) only on request."""
    q = text.question
    pick = st.radio(f":material/help: **Predict.** {q.prompt}", q.options, index=None, key=f"lesson_pick_{key}",
                    horizontal=True)
    if not st.toggle("Reveal the answer", key=f"lesson_reveal_{key}", disabled=pick is None,
                     help="Pick an answer first"):
        return
    if answer is not None:
        text = answer()
        q = text.question
    if q.is_right(pick):
        st.success(f"Right: **{q.right_option}**. {text.reveal}", icon=":material/check_circle:")
    else:
        st.error(f"The answer is **{q.right_option}**. {text.reveal}", icon=":material/cancel:")


def concept_check(stage: str) -> quiz.Grade:
    """The concept check's questions (the same at the start and the end), graded once answered."""
    picks = [st.radio(f"{i + 1}. {q.prompt}", q.options, index=None, key=f"lesson_{stage}_{i}",
                      persist_state="session") for i, q in enumerate(quiz.CONCEPT_CHECK)]
    result = quiz.grade(quiz.CONCEPT_CHECK, picks)
    st.markdown(f"**{quiz.summary(result)}**")
    if result.complete:
        st.markdown("\n".join(_graded_line(i, q, right) for i, (q, right)
                              in enumerate(zip(quiz.CONCEPT_CHECK, result.right, strict=True))))
    return result


def _graded_line(i: int, q: Question, right: bool | None) -> str:
    mark = ":green[:material/check:]" if right else ":red[:material/close:]"
    return f"- {mark} {i + 1}. {q.right_option}. {q.why}"


# ----------------------------------------------------------------------------------------------
# The steps: each arranges its figure, controls, words and question by the figure's shape


def _image(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    figure = pipeline.patch_grid_figure(ctx, g.center_patch)
    place = arrange(ctx, figure)
    show_figure(place, figure)
    say(place, steps.image_and_patches(g, ctx.image.name, ctx.image.size), "1")
    place.question.caption("Before you start, answer the short check below.")


def _filters(ctx: ViewContext) -> None:
    pca = caches.filters_pca(ctx.request.key, ctx.loaded)
    figure = embeddings.filters_figure(ctx.model)
    place = arrange(ctx, figure)
    show_figure(place, figure)
    say(place, steps.patch_to_vector(ctx.loaded.geometry, pca.explained_variance_ratio), "2")


def _positions(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    if pos_embed_rows(ctx.loaded) is None or not g.has_pos_embed:
        arrange(ctx, None).words.info("This model has no learned position embedding (it encodes position another "
                                      "way): nothing to show in this step.")
        return
    k = g.center_patch
    similarity = caches.pos_similarity(ctx.request.key, tuple(g.grid), ctx.loaded)  # (N, gh, gw)
    figure = embeddings.positions_figure(ctx.model, k)
    place = arrange(ctx, figure)
    show_figure(place, figure)
    say(place, steps.where_it_is(g, similarity[k], k), "3")


def _layer_slider(g, key: str, label: str = "Layer (0 = first block)") -> int:
    return st.slider(label, 0, g.num_layers - 1, g.num_layers - 1, key=key)


def _one_head(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    query = attention.default_query_token(g)
    place = arrange(ctx, attention.attention_figure(ctx, g.num_layers - 1, 0, query))
    with place.controls:
        c1, c2 = st.columns(2)
        with c1:
            layer = _layer_slider(g, "lesson_layer_4", "Layer")
        head = c2.selectbox("Head", list(range(g.num_heads)), key="lesson_head_4", format_func=lambda h: f"head {h}")
    amap = analyses.attention_map(cap.pattern, layer, head, query, g.num_prefix_tokens, g.grid)
    show_figure(place, attention.attention_figure(ctx, layer, head, query))
    say(place, steps.one_head(g, layer, head, query, amap), "4")


def _all_heads(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    query = attention.default_query_token(g)
    place = arrange(ctx, attention.head_maps_figure(ctx, g.num_layers - 1, query))
    with place.controls:
        layer = _layer_slider(g, "lesson_layer_5")
    maps = analyses.layer_attention_maps(cap.pattern, layer, query, g.num_prefix_tokens, g.grid)  # (H, gh, gw)
    show_figure(place, attention.head_maps_figure(ctx, layer, query))
    say(place, steps.all_heads(g, layer, query, maps), "5")


def _layers(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry

    def rollout(last: int) -> np.ndarray:  # (gh, gw), the Attention tab's cached entry
        return attention.rollout_map(ctx, "mean", last)

    place = arrange(ctx, attention.rollout_figure(ctx, g.num_layers - 1))
    with place.controls:
        last = _layer_slider(g, "lesson_rollout_6", "Roll out up to layer")
    show_figure(place, attention.rollout_figure(ctx, last))
    say(place, steps.through_layers(g, last, rollout(last), rollout(0), rollout(g.num_layers - 1)), "6")


def _distance(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    distances = attention.record_attention_distances(ctx)[0]  # (L, H), prefix attention left out
    figure = attention.distance_figure(ctx)
    place = arrange(ctx, figure)
    show_figure(place, figure)
    images = len(session.distance_history(ctx.request.key))  # the figure's crosses average these (from 2 on)
    say(place, steps.how_far(g, distances, analyses.uniform_attention_distance(g.grid, g.patch_size), images), "7")


NO_HEAD = ("This model has no classifier head: its output is a feature vector, not classes. Load weights with a head "
           "(or a fine-tuned checkpoint) for this step.")


def _prediction(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    if not g.num_classes:
        arrange(ctx, None).words.info(NO_HEAD)
        return
    k = min(5, g.num_classes)
    preds = analyses.top_k(ctx.cap.logits, ctx.loaded.labels, k)
    figure = prediction.top_classes_figure(ctx, k)
    place = arrange(ctx, figure)
    show_figure(place, figure)
    say(place, steps.prediction(g, preds, outside_its_world(ctx.loaded.name, ctx.loaded.labels, preds[0]),
                                draw.thickness_note(ctx.loaded.name, [p.label for p in preds])), "8")
    relevance_ahead(ctx)


def _relevance_key(ctx: ViewContext, target: int) -> tuple:
    return ctx.request.key, ctx.image.sha, target


def relevance_ahead(ctx: ViewContext) -> None:
    """Step 9's relevance maps, started while step 8 shows (they took seconds after Next). Only for a light model
    (`serving.light_pass`: the Shapes ViT), whose maps go to a cache without Streamlit (`caches.relevance`); a
    larger model's are made by step 9, behind its progress line."""
    if not serving.light_pass(ctx.loaded):
        return
    target = int(np.argmax(ctx.cap.logits))
    ahead.start(_relevance_key(ctx, target),
                partial(caches.relevance, ctx.request, ctx.loaded, ctx.image, ctx.cap, target))


def quick_map_figure(ctx: ViewContext, target: int, method: str) -> tuple[bytes, np.ndarray] | None:
    """One method's relevance map alone (Chefer's: one forward and backward, tens of milliseconds on the Shapes ViT)
    and its picture, drawn as the Why? tab draws it: what step 9 shows first while the other maps are still being
    made. None for a method the model can't run this way (the LRP methods need their rule chosen first)."""
    if method in explain.LRP_METHODS:
        return None
    quick = explain.relevance_maps(ctx.loaded, ctx.cap, target=target, cap=ctx.cap, methods=(method,))
    if method not in quick.maps:
        return None
    amap = quick.maps[method]  # (gh, gw)
    crop = ctx.cap.input_image  # (H, W, 3)
    scale = figures.display_scale(crop.shape[1], 256)
    return figures.encode(figures.enlarge(figures.overlay(crop, amap, ctx.loaded.geometry.patch_size), scale),
                          "jpeg"), amap


WHY_METHOD_KEY = "lesson_method_9"
FIRST_METHOD = "chefer"


def figure_first(ctx: ViewContext, target: int, job) -> Layout | None:
    """Step 9 before every method's map is made (by step 8's `job` from `ahead`, or None: here): the shown method's
    map alone and the step's first sentences at once, a progress line where the Method list will be, until all the
    maps are made. The layout, or None where no map could be drawn alone (then only the progress line)."""
    shown = session.widget_value(WHY_METHOD_KEY, FIRST_METHOD)
    quick = quick_map_figure(ctx, target, shown)
    place = early = None
    if quick is not None:
        figure, amap = quick
        place = arrange(ctx, figure)
        show_figure(place, figure, key=f"{FIGURE_KEY}_first")  # replaced by the final one, the same map
        early = place.words.empty()
        early.markdown(steps.why(ctx.loaded.geometry, ctx.loaded.label(target), METHOD_TITLES.get(shown, shown),
                                 amap).body)
    with place.controls if place is not None else st.container(), \
            st.spinner("Making the other methods' maps (for the Method list)..."):
        ahead.wait(job)
        caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)  # unless the job made them
    if early is not None:
        early.empty()  # the step's words follow in full
    return place


def _why(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    if not g.num_classes:
        arrange(ctx, None).words.info(NO_HEAD)
        return
    target = int(np.argmax(ctx.cap.logits))
    job = ahead.running(_relevance_key(ctx, target))  # step 8 started the maps: still being made?
    made_here = serving.light_pass(ctx.loaded) and not caches.relevance_kept(ctx.request, ctx.image, target)
    place = figure_first(ctx, target, job) if job is not None or made_here else None
    with st.spinner("Making the relevance maps..."):  # a larger model's, made here: seconds on a CPU
        relevance = caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)
    methods = [m for m in explain.METHODS if m in relevance.maps]
    first = methods.index(FIRST_METHOD) if FIRST_METHOD in methods else 0
    if place is None:
        place = arrange(ctx, why.relevance_figure(ctx, relevance, methods[first]))
    method = place.controls.selectbox("Method", methods, index=first, key=WHY_METHOD_KEY,
                                      format_func=lambda m: METHOD_TITLES.get(m, m))
    text = steps.why(g, ctx.loaded.label(target), METHOD_TITLES.get(method, method), relevance.maps[method])

    def answer() -> StepText:  # on reveal only: the deletion test (kept for every session once run)
        objects = why.object_patches(ctx)
        judged = caches.judgement_result(ctx.request, ctx.image, target, DELETION_STEPS, objects, DELETION_TESTS)
        if judged is None:  # as the Why? tab judges (a few seconds on the Shapes ViT, about a minute for ViT-B/16 on CPU)
            bar = st.progress(0.0, text="Running the deletion test...")

            def progress(fraction: float, message: str) -> None:
                bar.progress(min(1.0, max(0.0, float(fraction))), text=message)

            judged = caches.compute_judgement(ctx.request, ctx.loaded, ctx.image, ctx.cap, relevance, DELETION_STEPS,
                                              objects, progress, DELETION_TESTS)
            bar.empty()
        result = judged.results["deletion_auc"]
        verdict = result.verdict(method)
        st.image(why.curves_figure(ctx, target, DELETION_STEPS, DELETION_TESTS, (method,)), width="stretch")
        return steps.judged(text, VERDICT_INDEX[verdict.label], verdict.value, result.random_mean, result.random_std,
                            explain.MARGIN_SDS)

    say(place, text, "9", answer)
    relevance = caches.relevance(ctx.request, ctx.loaded, ctx.image, ctx.cap, target)  # the LRP rule chosen, once judged
    show_figure(place, why.relevance_figure(ctx, relevance, method))


FURTHER = (("Interventions", ":material/content_cut:"), ("Logit lens", ":material/stacked_line_chart:"),
           ("Registers & norms", ":material/bar_chart:"))


def _further(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    figure = lens.lens_figure(ctx) if g.num_classes else None
    place = arrange(ctx, figure, last_step_layout())
    if figure is not None:
        tops = lens.logit_lens_rows(ctx).argmax(axis=1)  # (L+1,)
        show_figure(place, figure)
        say(place, steps.going_further(g, ctx.loaded.label(int(tops[-1])), top_layer_from(tops)), "10")
    with place.question:
        for view, icon in FURTHER:
            st.page_link(EXPLORER, label=f"{view} in the explorer", query_params={"view": view}, icon=icon)
        end_checks()


DRAW = (_image, _filters, _positions, _one_head, _all_heads, _layers, _distance, _prediction, _why, _further)
assert len(DRAW) == COUNT
