"""The presenter-ready explorer, in a real browser: a projector's 1280 x 720 (the sidebar open), a student
laptop's 1366 x 768 and a phone's 390 x 844, on the bundled Shapes ViT (what a class gets offline).

What is checked, from the page as rendered (never from the code's constants):
- every One-image tab, opened by its link, shows its main figure (the first figure, by its top) entirely inside the
  first 720 px, and nothing on the page is an exception;
- every figure's text is at least 14 px on the screen at 1280 px wide. The size is the font size (the em, what CSS
  means by "14px text"), in CSS pixels as displayed:
  * a picture (PNG or JPEG shown by st.image, or a picture inside a plotly chart): its builder records in the file
    the size of the smallest text drawn in it, in the picture's own pixels (dashboard/figures/base.py: for a
    matplotlib figure, the smallest font size among the drawn figure's visible text artists, tick labels included,
    times dpi / 72; for a PIL sheet, the font size it drew with; "none" for a picture without text). The test fetches
    the very bytes the page shows (the element's src), reads that record, and multiplies it by the picture's
    displayed width over its natural width, both read in the browser. A shown picture without a record fails;
  * a plotly chart's own text (the patch numbers): each visible SVG <text>'s computed font size times the scale
    of its transform to the screen (getScreenCTM);
- the 12 x 12 patch grid keeps all its lines at 1280 and 1366 px: the clickable grid draws them as vector shapes
  (11 + 11 lines), and the Pipeline tab's crop with its grid is shown at exactly its natural width (drawn at the
  size it is shown: a browser shrinking it would drop lines);
- the tabs: numbered in the lesson's order, the research tools after a "Research:" mark, the row not scrolling at
  1280 px, and a link with a former label (`?view=Attention`) opening the renamed tab;
- a phone: the image and the prediction in the first screen, no error box in the main area, the sidebar (the
  inputs) closed behind one button.
Screenshots go to tests/artifacts/presenter_*.png (gitignored).
"""

from __future__ import annotations

import base64
from urllib.parse import quote, urljoin

import pytest

from dashboard.figures.base import image_size, recorded_text_px
from dashboard.views import LESSON_VIEWS, RENAMED, VIEWS
from support.browser import ARTIFACTS, CHROMIUM, NEEDS_A_FOLDER, NO_CHROMIUM, no_exception, page_at, settle

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)

PROJECTOR, LAPTOP, PHONE = (1280, 720), (1366, 768), (390, 844)
MIN_TEXT_PX = 14

# Every figure of the visible tab panel (or, on a page without tabs, of the main area): pictures and charts, with
# their box on the page (scrolled to the top) and what their text size is measured from.
FIGURES_JS = """() => {
  const panel = [...document.querySelectorAll('[role=tabpanel]')].find(p => p.offsetParent !== null)
                || document.querySelector('[data-testid=stMain]');
  const box = el => { const r = el.getBoundingClientRect();
                      return {top: r.top + scrollY, bottom: r.bottom + scrollY, width: r.width, height: r.height}; };
  const pictures = [...panel.querySelectorAll('[data-testid=stImage] img')].map(img => ({
      kind: 'img', src: img.getAttribute('src'), natural: img.naturalWidth, ...box(img)}));
  const charts = [...panel.querySelectorAll('[data-testid=stPlotlyChart]')].map(chart => {
      const svg = chart.querySelector('.main-svg');
      const texts = [...chart.querySelectorAll('svg text')].filter(t => t.textContent.trim() && t.getBBox().width > 0)
          .map(t => { const m = t.getScreenCTM();
                      return {text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b)}; });
      const images = [...chart.querySelectorAll('svg image')].map(im => ({
          href: im.getAttribute('href') || im.getAttribute('xlink:href'), width: im.getBoundingClientRect().width}));
      const lines = chart.querySelectorAll('.shapelayer path').length;
      return {kind: 'chart', texts, images, lines, ...box(svg)}; });
  return [...pictures, ...charts].sort((a, b) => a.top - b.top);
}"""


@pytest.fixture(scope="module")
def server(shapes_server) -> str:
    return shapes_server


def open_view(page, server: str, view: str) -> list[dict]:
    page.goto(f"{server}/?view={quote(view)}")
    settle(page)
    no_exception(page)
    page.evaluate("() => window.scrollTo(0, 0)")
    return page.evaluate(FIGURES_JS)


def shown_text_px(page, figure: dict) -> list[tuple[str, float]]:
    """(what, size in CSS px on the screen) of the smallest text of every picture and chart text in `figure`."""
    sizes = []
    if figure["kind"] == "img":
        data = page.request.get(urljoin(page.url, figure["src"])).body()
        recorded = recorded_text_px(data)  # KeyError: a shown picture that does not say how large its text is
        if recorded is not None:
            sizes.append((figure["src"], recorded * figure["width"] / figure["natural"]))
        return sizes
    for image in figure["images"]:
        data = base64.b64decode(image["href"].split(",", 1)[1])
        recorded = recorded_text_px(data)
        if recorded is not None:
            sizes.append(("chart picture", recorded * image["width"] / image_size(data)[0]))
    sizes += [(f"chart text {t['text']!r}", t["px"]) for t in figure["texts"]]
    return sizes


@pytest.fixture(scope="module")
def projector_tabs(browser, server) -> dict[str, tuple[list[dict], list[tuple[str, float]]]]:
    """Every tab at 1280 x 720, opened by its link: (its figures, the on-screen size of every figure's smallest text)."""
    seen = {}
    with page_at(browser, PROJECTOR) as page:
        for view in (v for v in VIEWS if v not in NEEDS_A_FOLDER):  # (no figure until given a concepts folder)
            figures = open_view(page, server, view)
            sizes = [size for figure in figures for size in shown_text_px(page, figure)]
            seen[view] = (figures, sizes)
            name = view.lower().replace(" ", "_").replace("?", "").replace("&", "and")
            page.screenshot(path=str(ARTIFACTS / f"presenter_1280x720_{name}.png"))
    return seen


def test_every_tab_shows_its_main_figure_whole_in_the_first_720_px(projector_tabs):
    tops = {}
    for view, (figures, _) in projector_tabs.items():
        assert figures, f"{view}: no figure"
        first = figures[0]
        tops[view] = (round(first["top"]), round(first["bottom"]))
        assert 0 <= first["top"] and first["bottom"] <= PROJECTOR[1], (view, tops[view])
    print("first figure (top, bottom) at 1280 x 720:", tops)


def test_figure_text_is_at_least_14_px_at_1280_wide(projector_tabs):
    measured = {view: sizes for view, (_, sizes) in projector_tabs.items()}
    # Every tab's figures carry text, but the Why? tab's first screen: its maps are pictures without any
    without_text = {view for view, sizes in measured.items() if not sizes}
    assert without_text <= {RENAMED["Why?"]}, without_text
    small = {view: [(what, round(px, 1)) for what, px in sizes if px < MIN_TEXT_PX] for view, sizes in measured.items()}
    assert not any(small.values()), small
    print("smallest figure text at 1280 x 720 (px):", {view: round(min(px for _, px in sizes), 1)
                                                      for view, sizes in measured.items() if sizes})


@pytest.mark.parametrize("size", [PROJECTOR, LAPTOP], ids=["1280", "1366"])
def test_the_patch_grid_keeps_every_line_and_legible_numbers(browser, server, size):
    with page_at(browser, size) as page:
        chart = next(f for f in open_view(page, server, RENAMED["Patches"]) if f["kind"] == "chart")
        assert chart["lines"] >= 2 * (12 - 1)  # 11 + 11 lines between the 12 x 12 patches (and the chosen patch's frame)
        numbers = [t for t in chart["texts"] if t["text"].isdigit()]
        assert sorted(int(t["text"]) for t in numbers) == list(range(144))
        assert min(t["px"] for t in numbers) >= MIN_TEXT_PX
        page.screenshot(path=str(ARTIFACTS / f"presenter_patches_{size[0]}x{size[1]}.png"))

        grid = open_view(page, server, RENAMED["Pipeline"])[1]  # the image, then the crop with its grid
        assert grid["kind"] == "img" and round(grid["width"]) == grid["natural"], grid


def test_the_tabs_are_numbered_and_grouped_and_old_links_still_open_them(browser, server):
    with page_at(browser, PROJECTOR) as page:
        open_view(page, server, "Attention")  # a link from before the tabs were numbered
        selected = page.locator('[role="tab"][aria-selected="true"]').inner_text()
        assert selected.strip() == RENAMED["Attention"] == "5 Attention"
        layout = page.evaluate("""() => {
          const row = document.querySelector('.st-key-view [role=tablist]');
          const tabs = [...row.querySelectorAll('[role=tab]')].map(t => [t.innerText.trim(), t.getBoundingClientRect()]);
          return {mark: getComputedStyle(row, '::before').content, scroll: row.scrollWidth, width: row.clientWidth,
                  names: tabs.map(t => t[0]), lefts: tabs.map(t => t[1].left), rights: tabs.map(t => t[1].right)};
        }""")
        assert layout["names"] == list(VIEWS)
        assert layout["mark"] == '"Research:"' and layout["scroll"] <= layout["width"]  # all tabs in view at 1280 px
        last_lesson = len(LESSON_VIEWS) - 1  # the mark sits between the lesson's last tab and the first research tool
        gaps = [b - a for a, b in zip(layout["rights"], layout["lefts"][1:], strict=False)]
        assert gaps[last_lesson] > 3 * max(gaps[:last_lesson]), gaps


def test_a_phone_shows_the_image_and_the_prediction_first(browser, server):
    with page_at(browser, PHONE) as page:
        page.goto(server)
        settle(page)
        no_exception(page)
        figures = page.evaluate(FIGURES_JS)
        assert figures and figures[0]["kind"] == "img" and figures[0]["bottom"] <= PHONE[1], figures[:1]
        prediction = page.locator('[data-testid="stMain"]').get_by_text("prediction", exact=False).first.bounding_box()
        assert prediction is not None and prediction["y"] + prediction["height"] <= PHONE[1]
        assert page.locator('[data-testid="stMain"] [data-testid="stAlertContentError"]').count() == 0
        sidebar = page.locator('[data-testid="stSidebar"]').bounding_box()
        assert sidebar is None or sidebar["x"] + sidebar["width"] <= 1  # closed: the main area is the first screen
        assert page.locator('[data-testid="stExpandSidebarButton"]').count() == 1  # the inputs: one tap away
        page.screenshot(path=str(ARTIFACTS / "presenter_390x844_first_screen.png"))
