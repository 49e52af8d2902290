"""The browser tests' shared helpers: Debian's chromium, a Playwright page on a URL, and waiting for the app.

Their fixtures (the server running the tiny test model, its page) are in tests/browser/conftest.py."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tools import loadtest  # the server start/stop and chromium flags the load test uses too

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium")
NO_CHROMIUM = "chromium is not installed (apt-get install -y chromium)"
# Tabs with nothing to look at until concepts made for the model are chosen (the Shapes ViT's ship with the package;
# tests/app/test_concepts_tab.py)
NEEDS_A_FOLDER = ("Concepts",)

if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI must run the browser tests: tools/test installs Debian's chromium, and it is missing")


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


@contextlib.contextmanager
def page_at(browser, size: tuple[int, int]) -> Iterator:
    """A new page of `browser` with a `size` (width, height) viewport, closed after the block."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    try:
        yield page
    finally:
        page.close()


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
