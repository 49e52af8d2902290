"""End to end in a real browser: `streamlit run dashboard/app.py` driven by Playwright + Debian's chromium.

The server runs the tiny random-init test model (`VIT_LENS_MODEL=test-tiny`). Screenshots go to
tests/artifacts/ (gitignored). Skipped only when no `chromium` is installed (CI installs it). The server and page
fixtures are in tests/browser/conftest.py, the helpers in tests/support/browser.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dashboard.views import RENAMED, VIEWS
from support.browser import ARTIFACTS, CHROMIUM, NEEDS_A_FOLDER, NO_CHROMIUM, no_exception, open_tab, settle

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)


def test_upload_visit_every_view_and_click_a_patch(page, tmp_path):
    settle(page)
    no_exception(page)
    assert page.locator('[data-testid="stTab"], button[role="tab"]').count() >= len(VIEWS)

    # upload an image through the real file input
    rng = np.random.default_rng(0)
    picture = tmp_path / "stripes.png"
    rgb = np.zeros((180, 240, 3), dtype=np.uint8)
    rgb[:, ::30] = 255
    rgb[..., 1] = rng.integers(0, 120, size=(180, 240))
    Image.fromarray(rgb).save(picture)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(picture))
    settle(page)
    no_exception(page)
    assert "stripes.png" in page.locator('[data-testid="stMain"]').inner_text()

    for name in VIEWS:
        open_tab(page, name)
        no_exception(page)
        panel = page.locator('[role="tabpanel"]:visible')
        figures = panel.locator('[data-testid="stImage"], [data-testid="stPlotlyChart"]')
        if name in NEEDS_A_FOLDER:  # no concepts of this model are offered: the choice is there, and says how to make them
            assert panel.locator('[data-testid="stSelectbox"]', has_text="Concepts").count() == 1, f"{name}: no choice"
            assert "vit-lens concepts FOLDER" in panel.inner_text(), f"{name}: no word on making concepts"
        else:
            assert figures.count() > 0, f"{name}: no figure"
        assert "stripes.png" in page.locator('[data-testid="stMain"]').inner_text(), f"{name}: the upload is gone"
        page.screenshot(path=str(ARTIFACTS / f"view_{name.lower().replace(' ', '_')}.png"), full_page=True)

    # the attention view: click patch 20 on the image, the query follows
    open_tab(page, RENAMED["Attention"])
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    chart.scroll_into_view_if_needed()
    heading_before = page.locator('[role="tabpanel"]:visible').inner_text()
    assert "CLS" in heading_before
    points = chart.locator(".scatterlayer .point")
    assert points.count() == 196
    points.nth(20).click(force=True)
    settle(page)
    no_exception(page)
    text = page.locator('[role="tabpanel"]:visible').inner_text()
    assert "patch 20 (row 1, col 6)" in text
    assert "query=patch" in page.url  # the choice is in the shareable link
    page.screenshot(path=str(ARTIFACTS / "view_attention_clicked.png"), full_page=True)


@pytest.mark.parametrize("head", ["head+2", "2"])
def test_a_shared_link_opens_the_same_view(page, server, head):
    """The README's forms: a former tab label and a head by its number or its label; the URL keeps them, as labels."""
    page.goto(f"{server}/?view=Attention&layer=1&head={head}")
    settle(page)
    no_exception(page)
    text = page.locator('[role="tabpanel"]:visible').inner_text()
    assert "layer 1, head 2" in text
    assert "view=5+Attention" in page.url and "head=head+2" in page.url  # (layer 1 is the default here: not kept)
