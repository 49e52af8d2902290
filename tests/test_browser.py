"""End to end in a real browser: `streamlit run dashboard/app.py` driven by Playwright + Debian's chromium.

The server runs the tiny random-init test model (`VIT_LENS_MODEL=test-tiny`). Screenshots go to
tests/artifacts/ (gitignored). Skipped only when no `chromium` is installed (CI installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import loadtest  # the server start/stop and chromium flags the load test uses too
from dashboard.models import TEST_TINY
from dashboard.views import VIEWS

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium")

if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI must run the browser tests: scripts/test installs Debian's chromium, and it is missing")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def server():
    port = loadtest.free_port()
    env = {**os.environ, "VIT_LENS_MODEL": TEST_TINY, "PYTHONUNBUFFERED": "1"}
    env.pop("VIT_LENS_RANDOM_INIT", None)
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        loadtest.wait_healthy(proc, url, ARTIFACTS / "streamlit.log", timeout=90)
        yield url
    finally:
        loadtest.stop_server(proc)
        log.close()


@contextlib.contextmanager
def chromium_page(url: str) -> Iterator:
    """A headless chromium page (Debian's binary, the load test's flags) on `url`, 1600 x 1800."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=loadtest.CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1800})
            page.goto(url)
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def page(server):
    with chromium_page(server) as page:
        yield page


def settle(page, timeout: float = 90_000) -> None:
    """Wait until the app is connected, its script has finished and nothing is still loading."""
    page.wait_for_timeout(400)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=timeout)
    page.wait_for_selector('[data-testid="stSkeleton"]', state="detached", timeout=timeout)
    page.wait_for_timeout(300)


def no_exception(page) -> None:
    blocks = page.locator('[data-testid="stException"]')
    assert blocks.count() == 0, blocks.first.inner_text()


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name, exact=True).click()
    settle(page)


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
        assert figures.count() > 0, f"{name}: no figure"
        page.screenshot(path=str(ARTIFACTS / f"view_{name.lower()}.png"), full_page=True)

    # the attention view: click patch 20 on the image, the query follows
    open_tab(page, "Attention")
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


def test_a_shared_link_opens_the_same_view(page, server):
    page.goto(f"{server}/?view=Attention&layer=1&head=head+2")
    settle(page)
    no_exception(page)
    text = page.locator('[role="tabpanel"]:visible').inner_text()
    assert "layer 1, head 2" in text
