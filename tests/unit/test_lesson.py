"""The lesson's pure parts (dashboard/lesson): the numbers its sentences use, its questions' answers computed from
the live arrays, the concept check's grading, the step in the URL. No Streamlit run here (tests/app/test_lesson.py
runs the page)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest

from dashboard import draw
from dashboard.lesson import ahead, facts, quiz, steps
from dashboard.lesson.ui import MIN_TEXT_PX, WIDE_MAX, figure_width
from vit_core import Geometry
from vit_core.analyses import AttentionMap, Prediction

DASHBOARD_APP = Path(steps.__file__).parents[1] / "app.py"


def geometry(grid=(4, 4), patch=(8, 8), prefix=("CLS",), layers=3, heads=4, dim=32, classes=5) -> Geometry:
    return Geometry(img_size=(grid[0] * patch[0], grid[1] * patch[1]), patch_size=patch, grid=grid,
                    prefix_names=prefix, no_embed_class=False, has_pos_embed=True, num_layers=layers,
                    num_heads=heads, embed_dim=dim, num_classes=classes)


# ----------------------------------------------------------------------------------------------
# facts


def test_effective_patches_counts_how_many_patches_a_map_is_spread_over():
    one = np.zeros((4, 4))
    one[1, 2] = 0.3
    assert facts.effective_patches(one) == pytest.approx(1.0)
    assert facts.effective_patches(np.ones((4, 4))) == pytest.approx(16.0)
    half = np.zeros((4, 4))
    half[0, :2] = 5.0  # two patches, evenly: the scale does not matter
    assert facts.effective_patches(half) == pytest.approx(2.0)
    assert facts.effective_patches(np.zeros((3, 3))) == 9.0  # nothing anywhere: as if even


def test_top_patch_and_top_share():
    amap = np.arange(16, dtype=float).reshape(4, 4)
    assert facts.top_patch(amap) == 15
    # the top tenth of 16 patches is 2 patches (rounded): 15 + 14 of 120
    assert facts.top_share(amap) == pytest.approx(29 / 120)
    assert facts.top_share(np.zeros((4, 4))) == 0.0


def test_most_focused_head_and_distinct_top_patches():
    maps = np.full((3, 4, 4), 1 / 16)  # head 0 and 2: uniform
    maps[1] = 0.0
    maps[1, 3, 3] = 1.0  # head 1: a single patch
    assert facts.most_focused_head(maps) == 1
    assert facts.distinct_top_patches(maps) == 2  # patch 0 (uniform: the first on ties) and patch 15


def test_most_global_layer_is_the_layer_with_the_largest_mean_distance():
    distances = np.array([[10.0, 60.0], [40.0, 40.0], [20.0, 30.0]])  # (L, H): means 35, 40, 25
    assert facts.most_global_layer(distances) == 1


def test_position_pattern_tells_neighbours_from_far_from_no_pattern():
    grid, k = (5, 5), 12  # the centre
    rows, cols = np.divmod(np.arange(25), 5)
    distance = np.hypot(rows - 2, cols - 2).reshape(grid)
    assert facts.position_pattern(np.exp(-distance), k, grid) == facts.NEIGHBOURS
    assert facts.position_pattern(distance / distance.max(), k, grid) == facts.FAR
    assert facts.position_pattern(np.full(grid, 0.5), k, grid) == facts.NO_PATTERN
    rng = np.random.default_rng(0)
    noise = rng.normal(size=grid)
    assert facts.position_pattern(noise, k, grid) in facts.POSITION_ANSWERS
    assert facts.most_similar_patches(np.exp(-distance), k) == [7, 11, 13, 17]  # the 4 neighbours, in order


def test_number_choices_and_logit_lens_settling():
    assert facts.number_choices(145, [144, 12, 192, 144]) == [12, 144, 145, 192]
    assert facts.top_layer_from(np.array([3, 1, 2, 2, 2])) == 2
    assert facts.top_layer_from(np.array([2, 2])) == 0


# ----------------------------------------------------------------------------------------------
# steps: answers from the live numbers


def test_parse_step_keeps_to_the_steps():
    assert steps.parse_step("3") == 3
    assert steps.parse_step(" 10 ") == steps.COUNT == 10
    assert steps.parse_step("99") == steps.COUNT
    assert steps.parse_step("0") == 1
    assert steps.parse_step(None) == 1
    assert steps.parse_step("three") == 1


def test_every_step_has_a_title_and_the_explorer_tab_names_exist():
    from dashboard.views import VIEWS

    names = set(VIEWS) | set(getattr(__import__("dashboard.views", fromlist=["RENAMED"]), "RENAMED", {}))
    assert len(steps.STEPS) == steps.COUNT
    for step in steps.STEPS:
        assert step.title
        assert step.tab is None or step.tab in names, step.tab


def test_token_count_question_counts_prefix_and_patches():
    g = geometry(grid=(12, 12), patch=(8, 8))
    text = steps.image_and_patches(g, "star.png", (300, 200))
    assert text.question.right_option == "145"
    assert "144" in text.body and "star.png" in text.notice
    no_prefix = steps.image_and_patches(geometry(grid=(12, 12), prefix=()), "x.png", (96, 96))
    assert no_prefix.question.right_option == "144"


def test_the_most_global_layer_question_is_answered_from_the_distances():
    g = geometry(layers=3)
    distances = np.array([[5.0, 30.0, 8.0, 9.0], [20.0, 22.0, 25.0, 21.0], [10.0, 12.0, 11.0, 9.0]])
    text = steps.how_far(g, distances, uniform=14.0)
    assert text.question.options == ("0", "1", "2")
    assert text.question.right_option == "1"
    assert "5 to 30 px" in text.notice  # layer 0's range, live
    assert text.question.is_right("1") and text.question.is_right("0") is False and text.question.is_right(None) is None


def test_the_most_focused_head_question_and_the_prefix_question():
    g = geometry(heads=3)
    maps = np.full((3, 4, 4), 1 / 16)
    maps[2] = 0.0
    maps[2, 0, 1] = 1.0
    assert steps.all_heads(g, 1, 0, maps).question.right_option == "2"
    mostly_prefix = AttentionMap(np.full((4, 4), 0.2 / 16), prefix_share=0.8)
    assert steps.one_head(g, 1, 0, 0, mostly_prefix).question.answer == 1
    mostly_patches = AttentionMap(np.full((4, 4), 0.9 / 16), prefix_share=0.1)
    assert steps.one_head(g, 1, 0, 0, mostly_patches).question.answer == 0
    assert steps.one_head(geometry(heads=3, prefix=()), 1, 0, 5, mostly_patches).question is None  # nothing to ask


def test_rollout_question_compares_the_first_layer_with_all_layers():
    g = geometry()
    focused, even = np.zeros((4, 4)), np.ones((4, 4))
    focused[2, 2] = 1.0
    assert steps.through_layers(g, 2, even, focused, even).question.right_option == steps.MORE_SPREAD
    assert steps.through_layers(g, 2, focused, even, focused).question.right_option == steps.MORE_FOCUSED


def test_the_distance_step_speaks_of_crosses_only_once_there_are_some():
    """The figure draws its crosses (the session's average) from 2 images on: with one image the step says there is
    nothing to average yet, not "the crosses average every image"."""
    g = geometry(layers=3)
    distances = np.array([[5.0, 30.0, 8.0, 9.0], [20.0, 22.0, 25.0, 21.0], [10.0, 12.0, 11.0, 9.0]])
    one = steps.how_far(g, distances, uniform=14.0, images=1)
    assert "crosses average" not in one.try_this and "nothing to average yet" in one.try_this
    three = steps.how_far(g, distances, uniform=14.0, images=3)
    assert "The crosses average the 3 images" in three.try_this
    assert "layer 1" not in (one.try_this + three.try_this).lower()  # the question's answer is not given away above it


def test_the_distance_reveal_compares_the_answer_with_another_layer():
    g = geometry(layers=3)
    first_most_global = np.array([[40.0, 50.0, 45.0, 47.0], [20.0, 22.0, 25.0, 21.0], [10.0, 12.0, 11.0, 9.0]])
    text = steps.how_far(g, first_most_global, uniform=14.0)
    assert text.question.right_option == "0"
    assert text.reveal == "Layer 0: 46 px on average over its heads (layer 2: 10 px)."  # not "(layer 0: 46 px)"
    later = steps.how_far(g, first_most_global[::-1].copy(), uniform=14.0)
    assert later.reveal == "Layer 2: 46 px on average over its heads (layer 0: 10 px)."


def test_the_last_step_says_when_the_top_class_settles_in_the_logit_lens():
    g = geometry(layers=4)  # rows: the embeddings, after blocks 0-3
    only_last = steps.going_further(g, "circle", facts.top_layer_from(np.array([1, 1, 2, 1, 0])))
    assert "only after the last block (block 3)" in only_last.notice and "stays" not in only_last.notice
    settled = steps.going_further(g, "circle", facts.top_layer_from(np.array([1, 0, 0, 0, 0])))
    assert "after block 0 and stays so through the last (block 3)" in settled.notice
    at_once = steps.going_further(g, "circle", facts.top_layer_from(np.array([0, 0, 0, 0, 0])))
    assert "already at the embeddings" in at_once.notice


def test_a_ring_with_circle_second_is_told_that_the_stroke_decides():
    """Only for the bundled Shapes ViT, only ring first and circle second; said in step 8's Notice."""
    assert draw.thickness_note(draw.TEACHING_MODEL, ["ring", "circle", "other"]) == draw.RING_OR_CIRCLE
    assert "thickness decides" in draw.RING_OR_CIRCLE and draw.RING_OR_CIRCLE.count(". ") == 0  # one sentence
    for labels in (["circle", "ring"], ["ring", "square"], ["ring"]):
        assert draw.thickness_note(draw.TEACHING_MODEL, labels) is None
    assert draw.thickness_note("vit_base_patch16_224", ["ring", "circle"]) is None
    preds = [Prediction(5, "ring", 0.908, 6.0), Prediction(0, "circle", 0.017, 2.0)]
    text = steps.prediction(geometry(), preds, None, draw.thickness_note(draw.TEACHING_MODEL, ["ring", "circle"]))
    assert text.notice.endswith(draw.RING_OR_CIRCLE)


def test_the_default_pen_draws_a_circle_thin_by_the_model_cards_rule():
    """The Shapes ViT's circle is an outline at most 8 % of its radius (vit_core/teaching/data.py): the default pen
    stays inside that for a circle a third of the canvas across, and is thicker than the thinnest pen it was
    trained on once scaled to its 96 px input."""
    from vit_core.teaching.data import MIN_STROKE_PX

    assert draw.DEFAULT_STROKE_PX <= draw.CIRCLE_MAX_STROKE * draw.CANVAS_PX / 6
    assert draw.DEFAULT_STROKE_PX * 96 / draw.CANVAS_PX >= MIN_STROKE_PX


def test_prediction_step_names_the_top_class_and_its_probability():
    preds = [Prediction(4, "star", 0.931, 6.0), Prediction(0, "circle", 0.05, 3.1)]
    text = steps.prediction(geometry(), preds, None)
    assert "**star** with **93%**" in text.notice and "circle" in text.notice
    assert text.question.right_option == steps.SHIFT_NO and "2.90" in text.reveal


def test_why_step_is_answered_by_the_deletion_verdict():
    g = geometry()
    relevance = np.zeros((4, 4))
    relevance[3, 0] = 1.0
    text = steps.why(g, "star", "Grad-CAM", relevance)
    assert "patch 12 (row 3, column 0)" in text.notice
    answered = steps.judged(text, 1, 0.41, 0.40, 0.02, 2.0)
    assert answered.question.right_option == steps.VERDICT_ANSWERS[1]
    assert "0.410" in answered.reveal and "0.400 ± 0.020" in answered.reveal


def test_class_names_are_markdown_literals():
    preds = [Prediction(0, "*bold* [link](x)", 0.9, 2.0)]
    notice = steps.prediction(geometry(), preds, None).notice
    assert "\\*bold\\*" in notice and "\\[link\\]" in notice


# ----------------------------------------------------------------------------------------------
# the concept check


def test_grading_says_what_was_right():
    qs = quiz.CONCEPT_CHECK
    assert 3 <= len(qs) <= 5
    nothing = quiz.grade(qs, [None] * len(qs))
    assert nothing.score == nothing.answered == 0 and not nothing.complete
    assert "Answer the" in quiz.summary(nothing)
    right = [q.right_option for q in qs]
    wrong = [next(o for o in q.options if o != q.right_option) for q in qs]
    all_right = quiz.grade(qs, right)
    assert all_right.complete and all_right.score == len(qs)
    assert quiz.summary(all_right) == f"You got {len(qs)} of {len(qs)} right."
    mixed = quiz.grade(qs, [right[0], wrong[1]] + [None] * (len(qs) - 2))
    assert mixed.right[:2] == (True, False) and mixed.answered == 2 and mixed.score == 1
    assert quiz.summary(mixed) == f"2 of {len(qs)} answered, 1 right so far."
    before = quiz.grade(qs, wrong)
    assert quiz.progress_line(before, all_right) == (f"At the start you got 0 of {len(qs)}; now {len(qs)}: "
                                                     f"{len(qs)} more than at the start.")
    assert quiz.progress_line(mixed, all_right) is None  # the start check is not complete


def test_the_concept_check_answers_are_not_always_the_same_letter():
    assert len({q.answer for q in quiz.CONCEPT_CHECK}) >= 3


def test_a_question_refuses_an_answer_outside_its_options():
    with pytest.raises(AssertionError):
        quiz.Question("?", ("a", "b"), 2)
    with pytest.raises(ValueError):
        quiz.question("?", [1, 2], 3)


# ----------------------------------------------------------------------------------------------
# layout


def test_figure_width_fits_the_box():
    assert figure_width((1000, 500), (820, 340)) == 680  # height-bound
    assert figure_width((1000, 100), (820, 340)) == 820  # width-bound
    assert figure_width((400, 400), (520, 540)) == 520
    assert figure_width((10, 1000), WIDE_MAX) == 120  # never a sliver


def test_figure_width_makes_the_smallest_text_legible_where_the_box_allows():
    # a short, wide figure whose 15 px text would show at 15 px at its height-bound width: widened to MIN_TEXT_PX
    assert figure_width((600, 300), (900, 300), text_px=15) == int(600 * MIN_TEXT_PX / 15)
    assert figure_width((600, 300), (700, 300), text_px=15) == 700  # as far as the box's width allows
    assert figure_width((600, 300), (900, 300), text_px=None) == 600  # no text: the box decides


def test_the_page_scripts_are_not_in_a_folder_streamlit_takes_for_its_file_based_pages():
    """A `pages/` folder beside app.py turns on Streamlit's older file-based pages: a fresh server then showed "Page
    not found" for /lesson?step=4 (a teacher's slide link) before st.navigation's page. The lesson is one of the
    navigation's pages, by its URL."""
    assert not (DASHBOARD_APP.parent / "pages").exists()
    app = DASHBOARD_APP.read_text()
    assert re.search(r'st\.Page\("page_scripts/lesson\.py".*?url_path="lesson"', app)


# ----------------------------------------------------------------------------------------------
# ahead: step 9's maps made while step 8 shows


def test_work_made_ahead_runs_once_per_key_and_a_queued_job_is_made_by_its_step():
    release, calls = threading.Event(), []

    def slow(name: str):
        calls.append(name)
        release.wait(10)

    ahead.start("a", lambda: slow("a"))
    ahead.start("a", lambda: slow("a again"))  # already under way: not started twice
    ahead.start("b", lambda: slow("b"))  # queued behind "a" (one worker)
    for _ in range(200):  # until the worker has picked "a"
        if calls:
            break
        threading.Event().wait(0.01)
    running = ahead.running("a")
    assert running is not None and not running.done()
    assert ahead.running("b") is None  # still queued: cancelled, its step makes it itself
    release.set()
    ahead.wait(running)
    assert ahead.running("a") is None  # done: the result is in the caches, nothing left to wait for
    ahead.wait(None)
    assert calls == ["a"]


def test_the_uniform_attention_label_of_step_7s_figure_stays_inside_its_axes():
    """The distance figure's "uniform attention" label, at the screen's text size, on a model of 4 layers (the Shapes
    ViT): placed at the last layer plus half it started beyond the x range and ran over the axes' border."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from dashboard.figures.base import legible
    from vit_core import plots

    distances = np.random.default_rng(0).uniform(15, 50, size=(4, 8))  # (L, H)
    fig = legible(plots.attention_distance_figure(distances, 50.0), 540, 400)
    renderer = FigureCanvasAgg(fig).get_renderer()
    ax = fig.axes[0]
    label = next(t for t in ax.texts if t.get_text().strip() == "uniform attention")
    inside, box = ax.get_window_extent(renderer), label.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, (box, inside)
