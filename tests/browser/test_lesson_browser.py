"""The lesson (/lesson?step=N) in a real browser at a projector's 1280 x 720, on the bundled Shapes ViT (offline):
the page opens with the sidebar collapsed (the inputs one click away); every step opened by its URL shows its main
figure whole inside the first 720 px, with its text at least 18 px on the screen (measured as the presenter test
measures 14 px: the smallest text each picture records, times its displayed over its natural width), and its
controls, its "Reveal the answer" and its links inside the first 720 px too; Next leads to the following step and
leaves no tooltip over the page; nothing on the page is an exception; a predict-then-reveal question and the concept
check answered as a student would. Screenshots: tests/artifacts/lesson_step<N>.png. Skipped like the other browser
tests where no chromium is installed."""

from __future__ import annotations

import os
import re

import pytest

from browser.test_presenter_browser import FIGURES_JS, shown_text_px
from dashboard.lesson import quiz
from dashboard.lesson.steps import COUNT, STEPS
from dashboard.lesson.ui import MIN_TEXT_PX
from support.browser import ARTIFACTS, CHROMIUM, NO_CHROMIUM, no_exception, settle
from tools import loadtest
from vit_core.loading import teaching_model_available

pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
              pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are missing")]

PROJECTOR = {"width": 1280, "height": 720}


@pytest.fixture(scope="module")
def server(shapes_server) -> str:
    return shapes_server


@pytest.fixture(scope="module")
def projector(page, server):
    """The conftest's page at 1280 x 720, whose first visit to the fresh server is a slide's link to a step: with the
    page scripts in a `pages/` folder, Streamlit answers it with "Page not found" before the page."""
    page.set_viewport_size(PROJECTOR)
    page.goto(f"{server}/lesson?step=4")
    seen = []
    for _ in range(30):  # the message came and went within the first second
        seen.append(page.locator("body").inner_text())
        page.wait_for_timeout(100)
    settle(page)
    assert not any("Page not found" in text for text in seen)
    assert f"Step 4 of {COUNT}" in bar_text(page)
    sidebar = page.locator('[data-testid="stSidebar"]').bounding_box()
    assert sidebar is None or sidebar["x"] + sidebar["width"] <= 1, sidebar  # collapsed: the step has the 1280 px
    assert page.locator('[data-testid="stExpandSidebarButton"]').count() == 1  # the inputs: one click away
    return page


# The step's own controls and links in the main area (not the concept check's expanders): their boxes' bottoms.
CONTROLS_JS = """() => {
  const main = document.querySelector('[data-testid=stMain]');
  const ids = ['stButton', 'stSlider', 'stSelectbox', 'stRadio', 'stCheckbox', 'stPageLink'];
  return [...main.querySelectorAll(ids.map(id => `[data-testid=${id}]`).join(','))]
    .filter(el => !el.closest('[data-testid=stExpander]') && el.offsetParent !== null)
    .map(el => ({what: el.getAttribute('data-testid') + ' ' + el.innerText.trim().split('\\n')[0].slice(0, 40),
                 bottom: el.getBoundingClientRect().bottom + scrollY}));
}"""


def assert_readable_first_screen(page, step: int) -> float | None:
    """The step's figure text at least MIN_TEXT_PX, its controls and links inside the first screen; -> the smallest
    figure text (None: its figure has no text)."""
    page.evaluate("() => window.scrollTo(0, 0)")
    sizes = [px for figure in page.evaluate(FIGURES_JS) for _, px in shown_text_px(page, figure)]
    assert all(px >= MIN_TEXT_PX for px in sizes), f"step {step}: figure text {sizes} px"
    low = [c for c in page.evaluate(CONTROLS_JS) if c["bottom"] > PROJECTOR["height"]]
    assert not low, f"step {step}: below the first screen: {low}"
    return min(sizes) if sizes else None


def bar_text(page) -> str:
    """The step bar's title: the value of its step picker."""
    return page.locator('.st-key-lesson_bar input[role="combobox"]').input_value()


def assert_figure_above_the_fold(page, step: int) -> None:
    figure = page.locator('[class*="st-key-lesson_figure"] img')
    assert figure.count() == 1, f"step {step}: {figure.count()} main figures"
    assert figure.evaluate("img => img.complete && img.naturalWidth > 0"), f"step {step}: the figure did not load"
    box = figure.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= PROJECTOR["height"], f"step {step}: {box}"
    assert box["x"] >= 0 and box["x"] + box["width"] <= PROJECTOR["width"], f"step {step}: {box}"
    assert box["height"] > 150, f"step {step}: a figure too small to read on a projector: {box}"


def test_every_step_by_its_url_shows_its_figure_above_the_fold_and_next_leads_on(projector, server):
    page = projector
    smallest = {}
    for step in range(1, COUNT + 1):
        page.goto(f"{server}/lesson?step={step}")
        settle(page)
        no_exception(page)
        assert "Page not found" not in page.locator("body").inner_text()
        assert f"Step {step} of {COUNT}: {STEPS[step - 1].title}" in bar_text(page)
        assert_figure_above_the_fold(page, step)
        smallest[step] = assert_readable_first_screen(page, step)
        page.screenshot(path=str(ARTIFACTS / f"lesson_step{step}.png"))
        next_button = page.locator(".st-key-lesson_next").get_by_role("button")
        if step == COUNT:
            assert next_button.is_disabled()
            continue
        next_button.click()
        settle(page)
        no_exception(page)
        assert re.search(rf"[?&]step={step + 1}(&|$)", page.url), page.url
        assert f"Step {step + 1} of {COUNT}" in bar_text(page)
        assert_figure_above_the_fold(page, step + 1)
        assert not page.locator('[data-testid="stTooltipContent"]').count(), f"step {step + 1}: a tooltip after Next"
    assert any(px is not None for px in smallest.values())  # the measurement found text to measure
    print("smallest figure text per step at 1280 x 720 (px):", {k: v and round(v, 1) for k, v in smallest.items()})


def test_the_last_steps_check_starts_in_the_first_screen(projector, server):
    page = projector
    page.goto(f"{server}/lesson?step={COUNT}")
    settle(page)
    check = page.locator('[data-testid="stExpander"]').filter(has_text="Check what you learned")
    first = check.locator('[data-testid="stRadio"]').first.bounding_box()
    assert first is not None and first["y"] + 60 <= PROJECTOR["height"], first  # its first question's start at least


def test_step_9_shows_its_figure_and_controls_in_the_first_screen_after_next(projector, server):
    """Next from step 8 on a fresh image: step 9's relevance map, its Method list, its question's reveal and its
    explorer link inside the first 720 px (the reveal sat at y = 717 and the link below, with the sidebar open)."""
    page = projector
    page.goto(f"{server}/lesson?step=8&example=Shape%3A%20heart")
    settle(page)
    page.locator(".st-key-lesson_next").get_by_role("button").click()
    settle(page)
    no_exception(page)
    assert f"Step 9 of {COUNT}" in bar_text(page)
    assert_figure_above_the_fold(page, 9)
    assert_readable_first_screen(page, 9)
    main = page.locator('[data-testid="stMain"]')
    for element in (main.get_by_text("Reveal the answer"), main.get_by_text("Open the Why? view in the explorer"),
                    main.locator('[data-testid="stSelectbox"]').filter(has_text="Method")):
        box = element.bounding_box()
        assert box is not None and box["y"] + box["height"] <= PROJECTOR["height"], box


def pick(page, question_label: str, option: str) -> None:
    """Click `option` of the radio group whose label contains `question_label`."""
    group = page.locator('[data-testid="stRadio"]').filter(has_text=question_label)
    group.get_by_text(option, exact=True).click()
    settle(page)


def test_predict_then_reveal_and_the_concept_check_at_both_ends(projector, server):
    page = projector
    page.goto(f"{server}/lesson?step=7")  # which layer has the most global heads?
    settle(page)
    reveal = page.get_by_role("switch", name="Reveal the answer")
    assert reveal.is_disabled()  # pick first
    pick(page, "Which layer has the most global heads", "0")
    page.get_by_text("Reveal the answer").click()
    settle(page)
    no_exception(page)
    verdict = page.locator('[data-testid="stAlert"]').filter(has_text=re.compile(r"Right|The answer is")).inner_text()
    assert re.search(r"Layer \d+: \d+ px on average", verdict), verdict

    page.goto(f"{server}/lesson?step=1")  # the concept check at the start: all wrong but the first
    settle(page)
    for i, q in enumerate(quiz.CONCEPT_CHECK):
        wrong = next(o for o in q.options if o != q.right_option)
        pick(page, q.prompt, q.right_option if i == 0 else wrong)
    no_exception(page)
    assert f"You got 1 of {len(quiz.CONCEPT_CHECK)} right." in page.locator('[data-testid="stMain"]').inner_text()

    for _ in range(COUNT - 1):  # to the end by Next, in the same session
        page.locator(".st-key-lesson_next").get_by_role("button").click()
        settle(page)
    assert f"Step {COUNT} of {COUNT}" in bar_text(page)
    end = page.locator('[data-testid="stExpander"]').filter(has_text="Check what you learned")
    for q in quiz.CONCEPT_CHECK:
        group = end.locator('[data-testid="stRadio"]').filter(has_text=q.prompt)
        group.get_by_text(q.right_option, exact=True).click()
        settle(page)
    no_exception(page)
    n = len(quiz.CONCEPT_CHECK)
    text = page.locator('[data-testid="stMain"]').inner_text()
    assert f"You got {n} of {n} right." in text
    assert f"At the start you got 1 of {n}; now {n}: {n - 1} more than at the start." in text  # kept across steps
    page.screenshot(path=str(ARTIFACTS / "lesson_check.png"), full_page=True)


def test_a_step_link_opens_the_lesson_where_the_start_up_model_is_refused(projector, tmp_path):
    """Offline, the server's start-up model (ViT-B/16, pretrained) can't be had: the model choice says so and reruns
    the script on the bundled model. That rerun came before st.navigation knew the page and reopened a slide's link
    /lesson?step=4 as the One image page ("/?step=4"). (The module's browser page, on a second server.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    proc, url = loadtest.start_server("vit_base_patch16_224", False, tmp_path / "streamlit.log", extra_env=env)
    try:
        page = projector
        page.goto(f"{url}/lesson?step=4")
        settle(page)
        no_exception(page)
        assert "/lesson" in page.url and f"Step 4 of {COUNT}" in bar_text(page), page.url
        assert "Offline" in page.locator('[data-testid="stSidebar"]').inner_text()
    finally:
        loadtest.stop_server(proc)


@pytest.mark.parametrize("path", ["/lesson?step=4", "/many-images", "/?view=Attention"])
def test_an_offline_page_asks_nothing_of_the_internet_and_its_console_is_clean(page, server, path):
    """The server started as the README starts it (dashboard.serve): every request a page makes stays on the server
    (the tab's icon ships with the app: a `:material/...:` one is fetched from a font host), and the console shows no
    error, such as the 404s of a page's path probed for the server (/lesson/_stcore/health)."""
    page = page.context.browser.new_page(viewport=PROJECTOR)  # a fresh page in the module's browser (one Playwright)
    try:
        requests, problems = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.goto(server + path)
        settle(page)
        no_exception(page)
        page.wait_for_timeout(1000)  # the favicon is asked for after the page's first run
        icon = page.evaluate("document.querySelector('link[rel~=icon]')?.href")
    finally:
        page.close()
    assert icon and icon.startswith(server), icon
    assert requests and all(url.startswith(server) for url in requests), [u for u in requests if not u.startswith(server)]
    assert not problems, problems
