"""The browser tests' fixtures: `streamlit run dashboard/app.py` on the tiny random-init test model
(`VIT_LENS_MODEL=test-tiny`, one server per test module), or the server on the bundled Shapes ViT
(`shapes_server`), and a headless chromium page on the module's `server`. Tests that use
them are skipped where no `chromium` is installed (CI must have it: tests/support/browser.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.browser import ARTIFACTS, CHROMIUM, NO_CHROMIUM, REPO, chromium_page
from tools import loadtest


@pytest.fixture(scope="module")
def server():
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from dashboard.models import TEST_TINY

    port = loadtest.free_port()
    env = {**os.environ, "VIT_LENS_MODEL": TEST_TINY, "PYTHONUNBUFFERED": "1"}
    env.pop("VIT_LENS_RANDOM_INIT", None)
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        loadtest.wait_healthy(proc, url, ARTIFACTS / "streamlit.log", timeout=90)
        yield url
    finally:
        loadtest.stop_server(proc)
        log.close()


@pytest.fixture(scope="module")
def shapes_server(request):
    """The dashboard as `tools/dashboard` starts it (`loadtest.start_server`), on the bundled Shapes ViT: for the
    modules that need a trained model (a module takes it as its `server`). Its log: tests/artifacts/
    streamlit_<module>.log."""
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from vit_core import TEACHING_MODEL

    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / f"streamlit_{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_')}.log"
    proc, url = loadtest.start_server(TEACHING_MODEL, random_init=False, log_path=log_path)
    try:
        yield url
    finally:
        loadtest.stop_server(proc)


@pytest.fixture(scope="module")
def page(server):
    with chromium_page(server) as page:
        yield page


@pytest.fixture(scope="module")
def browser():
    """Headless chromium (Debian's binary, the load test's flags) for a module's pages at their own sizes
    (`support.browser.page_at`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=loadtest.CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
