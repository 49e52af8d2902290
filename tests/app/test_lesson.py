"""The lesson page (/lesson, dashboard/page_scripts/lesson.py), run in-process with Streamlit's AppTest on the bundled
Shapes ViT (and on the tiny random-init model for the structure): every step renders its figure from the explorer's
own figure functions, Next and Back move `?step=`, the predict-then-reveal answers are the live model's, the concept
check says what was right and remembers the start across steps."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import assert_healthy, run_app
from dashboard import examples
from dashboard.lesson import ahead, facts, quiz
from dashboard.lesson.steps import COUNT, STEPS
from vit_core import TEACHING_MODEL, export, load_model, run_with_capture
from vit_core.images import load_image
from vit_core.loading import teaching_model_available

PAGE = "page_scripts/lesson.py"  # relative to dashboard/app.py

needs_shapes = pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are missing")


@pytest.fixture
def shapes_env(monkeypatch):
    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    monkeypatch.delenv("VIT_LENS_RANDOM_INIT", raising=False)


def lesson_at(step: int | None = None) -> AppTest:
    """The app, switched to the lesson page (at `?step=`), run."""
    at = run_app()
    if step is not None:
        at.query_params["step"] = str(step)
    at.switch_page(PAGE).run()
    assert_healthy(at)
    return at


def shown_step(at: AppTest) -> int:
    """The step the page shows: its step picker's value."""
    return next(s.value for s in at.selectbox if s.key and s.key.startswith("lesson_steps_"))


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [m.value for m in at.caption] + [a.value for a in at.success]
                     + [a.value for a in at.error])


@needs_shapes
def test_every_step_renders_one_figure_and_its_prompts(shapes_env):
    at = lesson_at()
    assert shown_step(at) == 1
    for step in range(1, COUNT + 1):
        at.query_params["step"] = str(step)
        at.run()
        assert_healthy(at)
        assert not at.error, [e.value for e in at.error]
        assert shown_step(at) == step
        assert len(at.get("image")) == 1, f"step {step}: {len(at.get('image'))} figures"
        words = texts(at)
        assert "**Notice.**" in words and "**Try this.**" in words, step
    assert [t.title for t in STEPS][0] == "The image and its patches"


@needs_shapes
def test_next_and_back_move_the_step_in_the_url(shapes_env):
    at = lesson_at(3)
    assert shown_step(at) == 3
    at.button(key="lesson_next").click().run()
    assert_healthy(at)
    assert at.query_params["step"] == "4" and shown_step(at) == 4
    at.button(key="lesson_back").click().run()
    at.button(key="lesson_back").click().run()
    assert at.query_params["step"] == "2" and shown_step(at) == 2
    at.selectbox(key="lesson_steps_2").set_value(9).run()  # the step picker jumps
    assert shown_step(at) == 9 and at.query_params["step"] == "9"
    at.query_params["step"] = "1"
    at.run()
    assert at.button(key="lesson_back").disabled
    at.query_params["step"] = str(COUNT)
    at.run()
    assert at.button(key="lesson_next").disabled
    at.query_params["step"] = "not a step"
    at.run()
    assert_healthy(at)
    assert shown_step(at) == 1


def shapes_capture(example: str):
    """The Shapes ViT run here, outside the app, on one of the app's example images."""
    loaded = load_model(TEACHING_MODEL)
    data = examples.example_bytes(example)
    return run_with_capture(loaded, load_image(data))


@needs_shapes
def test_the_most_global_layer_is_the_live_models(shapes_env):
    """Step 7's "which layer has the most global heads?" is answered from the model's own attention on this image:
    the same layer as the mean attention distance computed here, outside the app."""
    at = lesson_at(7)
    example = at.selectbox(key="example").value
    distances, _ = export.mean_attention_distances(shapes_capture(example))  # (L, H)
    expected = facts.most_global_layer(distances)
    pick = at.radio(key="lesson_pick_7")
    assert pick.options == [str(layer) for layer in range(distances.shape[0])]
    assert at.toggle(key="lesson_reveal_7").disabled  # pick first
    pick.set_value(str(expected)).run()
    at.toggle(key="lesson_reveal_7").set_value(True).run()
    assert_healthy(at)
    assert [s.value for s in at.success] and f"Layer {expected}:" in at.success[0].value
    wrong = str((expected + 1) % distances.shape[0])
    at.radio(key="lesson_pick_7").set_value(wrong).run()
    assert f"The answer is **{expected}**" in at.error[0].value
    notice = next(m.value for m in at.markdown if "**Notice.**" in m.value)
    assert f"{distances[0].min():.0f} to {distances[0].max():.0f} px" in notice  # the live numbers


@needs_shapes
def test_the_prediction_step_says_the_live_top_class(shapes_env):
    at = lesson_at(8)
    cap = shapes_capture(at.selectbox(key="example").value)
    loaded = load_model(TEACHING_MODEL)
    top = int(np.argmax(cap.logits))
    notice = next(m.value for m in at.markdown if "**Notice.**" in m.value)
    assert f"The model says **{loaded.label(top)}** with **{100 * cap.probs[top]:.0f}%**" in notice


@needs_shapes
def test_revealing_the_why_step_runs_the_deletion_test(shapes_env):
    at = lesson_at(9)
    assert len(at.get("image")) == 1
    at.radio(key="lesson_pick_9").set_value(at.radio(key="lesson_pick_9").options[1]).run()
    at.toggle(key="lesson_reveal_9").set_value(True).run()
    assert_healthy(at)
    verdict = [a.value for a in at.success] + [a.value for a in at.error]
    assert len(verdict) == 1 and "Deletion AUC" in verdict[0] and "random" in verdict[0]
    assert len(at.get("image")) == 2  # the relevance map, and now the deletion curves


@needs_shapes
def test_the_concept_check_grades_and_remembers_the_start(shapes_env):
    qs = quiz.CONCEPT_CHECK
    at = lesson_at(1)
    for i, q in enumerate(qs):
        wrong = next(o for o in q.options if o != q.right_option)
        at.radio(key=f"lesson_start_{i}").set_value(q.right_option if i < 2 else wrong)
    at.run()
    assert f"You got 2 of {len(qs)} right." in texts(at)
    for _ in range(COUNT - 1):  # to the last step by Next, in the same session
        at.button(key="lesson_next").click().run()
    assert shown_step(at) == COUNT
    assert at.radio(key="lesson_start_0").value == qs[0].right_option  # kept while the steps in between ran
    for i, q in enumerate(qs):
        at.radio(key=f"lesson_end_{i}").set_value(q.right_option)
    at.run()
    assert_healthy(at)
    words = texts(at)
    assert f"You got {len(qs)} of {len(qs)} right." in words
    assert f"At the start you got 2 of {len(qs)}; now {len(qs)}" in words


def test_every_step_renders_on_a_random_init_model(tiny_env):
    """The structure on another geometry (14 x 14 patches, 3 heads, random weights): every step draws, with the
    untrained warning."""
    at = lesson_at()
    for step in range(1, COUNT + 1):
        at.query_params["step"] = str(step)
        at.run()
        assert_healthy(at)
        assert len(at.get("image")) == 1, step
        assert any("RANDOM weights" in w.value for w in at.warning), step


def test_the_one_image_page_is_still_the_default(tiny_env):
    at = run_app()
    assert at.tabs  # the explorer's tabs, not the lesson
    assert not [s for s in at.selectbox if s.key and s.key.startswith("lesson_")]


@needs_shapes
def test_step_9_shows_its_map_first_while_step_8s_maps_are_still_being_made(shapes_env, monkeypatch):
    """Next from step 8 while the relevance maps started there (dashboard.lesson.ahead) are still being made: step 9
    draws the shown method's map and waits for the job behind a progress line; once done, the whole step with its
    Method list, one figure (the first replaced by the final one in the same place)."""
    at = lesson_at(8)
    job = concurrent.futures.Future()
    job.set_running_or_notify_cancel()
    asked = []

    def still_running(key):
        asked.append(key)
        threading.Timer(0.3, job.set_result, (None,)).start()  # the job ends while step 9 waits for it
        return job

    monkeypatch.setattr(ahead, "running", still_running)
    at.button(key="lesson_next").click().run()
    assert_healthy(at)
    assert shown_step(at) == 9 and asked and job.done()
    assert len(at.get("image")) == 1
    assert at.selectbox(key="lesson_method_9").value == "chefer"
    words = texts(at)
    assert words.count("A **relevance map** scores each patch") == 1  # the first sentences, not twice
    assert "**Notice.**" in words


def test_the_first_step_points_to_the_lesson_without_a_server(tiny_env, monkeypatch):
    """The Streamlit lesson names the static one (`vit-lens export-web`), where a class has no server, and links to it
    where the server knows its address."""
    assert "vit-lens export-web --out lesson/" in texts(lesson_at(1))
    monkeypatch.setenv("VIT_LENS_STATIC_LESSON", "http://192.168.1.20:8000/")
    assert "[the static lesson](http://192.168.1.20:8000/)" in texts(lesson_at(1))
