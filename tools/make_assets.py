"""Make the README's screenshots (assets/*.png) from the real app.

    .venv/bin/python -m tools.make_assets [--out assets] [--keep-server-log]

Starts the dashboard as `tools/dashboard` does (through the load test's `start_server`) on a free loopback port
with the bundled Shapes ViT, offline
(VIT_LENS_MODEL=vit-lens/shapes-vit, HF_HUB_OFFLINE=1: nothing is downloaded), drives it with Playwright
and Debian's chromium (`apt-get install -y chromium`; Playwright's own browser download is not used), and
saves one PNG per shot at 1280 x 800, quantised to a 256-colour palette so that each stays small. Beside them,
`labels.json`: the tab labels and the lesson's step bar as the app showed them in the shots; a test
(tests/unit/test_assets.py) fails when the app's labels drift from the pictures', so they are made again.
Waits as Streamlit's own e2e suite does: the app's script has finished (`data-test-script-state`), it is
connected, and no skeleton (a placeholder for something still loading) is left.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tools.loadtest import start_server, stop_server
from vit_core.teaching.model import TEACHING_MODEL

ROOT = Path(__file__).resolve().parent.parent
VIEWPORT = {"width": 1280, "height": 800}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
START_TIMEOUT_S = 180
STEP_TIMEOUT_MS = 180_000


@dataclass(frozen=True)
class Shot:
    file: str  # under --out
    path: str  # URL path and query after the server's address
    run_button: str | None = None  # a button to click (and wait for) before the screenshot
    top: str | None = None  # a selector scrolled to the top of the window (below the header) before the shot


TABS = '[role="tablist"]'
SHOTS = (  # the tab is a query parameter (dashboard/app.py binds st.tabs to ?view=); the page's path is its url_path
    Shot("lesson.png", "/lesson?step=5"),
    Shot("pipeline.png", "/?view=Pipeline"),
    Shot("attention.png", "/?view=Attention", top=TABS),
    Shot("why.png", "/?view=Why%3F", top=TABS),
    Shot("why_judged.png", "/?view=Why%3F", run_button="Judge the", top=':text("Which to trust here")'),
    Shot("many_images.png", "/many-images", run_button="Run",
         top='[data-testid="stHeading"]:has-text("Attention distance per head")'),
)


def settle(page) -> None:
    """Until the script has finished, the app is connected and nothing is still loading (Streamlit's e2e waits)."""
    page.wait_for_timeout(500)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=STEP_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="stApp"][data-test-connection-state="CONNECTED"]', timeout=STEP_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="stSkeleton"]', state="detached", timeout=STEP_TIMEOUT_MS)
    page.wait_for_timeout(800)  # images and plotly figures finish drawing


LABELS = "labels.json"  # beside the PNGs: what the shots showed (tests/unit/test_assets.py)
LABELS_JS = """() => ({
  tabs: [...document.querySelectorAll('[role=tab]')].map(t => t.innerText.trim()),
  pages: [...document.querySelectorAll('[data-testid=stSidebarNavLink]')].map(a => a.innerText.trim().split('\\n').pop()),
})"""


def check_no_exception(page, shot: Shot) -> None:
    blocks = page.locator('[data-testid="stException"]')
    if blocks.count():
        raise SystemExit(f"{shot.path}: the app showed an exception:\n{blocks.first.inner_text()}")


def small_png(raw: Path, out: Path) -> int:
    """`raw` saved as a palette PNG (256 colours, no dithering: flat UI colours stay flat); returns its size."""
    with Image.open(raw) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE) \
            .save(out, optimize=True)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets", help="folder of the PNGs (default assets/)")
    parser.add_argument("--keep-server-log", action="store_true", help="print the server's log at the end")
    args = parser.parse_args(argv)

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed: apt-get update && apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vit-lens-assets-") as scratch:
        scratch = Path(scratch)
        log = scratch / "streamlit.log"
        proc, url = start_server(TEACHING_MODEL, False, log, extra_env={"HF_HUB_OFFLINE": "1"}, timeout=START_TIMEOUT_S)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                labels = {}
                try:
                    for shot in SHOTS:
                        page = browser.new_page(viewport=VIEWPORT)
                        page.goto(url + shot.path)
                        settle(page)
                        if shot.run_button:
                            page.get_by_role("button", name=shot.run_button).click()
                            settle(page)
                        check_no_exception(page, shot)
                        if shot.file == "attention.png":  # the One image page: its tabs and the sidebar's pages
                            labels = page.evaluate(LABELS_JS)
                        if shot.top:
                            page.locator(shot.top).first.evaluate(  # below Streamlit's header bar
                                "e => { e.style.scrollMarginTop = '70px'; e.scrollIntoView({block: 'start'}); }")
                            page.wait_for_timeout(800)
                        raw = scratch / shot.file
                        page.screenshot(path=str(raw))
                        size = small_png(raw, args.out / shot.file)
                        print(f"{args.out / shot.file}: {size / 1024:.0f} KB")
                        page.close()
                finally:
                    browser.close()
            (args.out / LABELS).write_text(json.dumps(labels, indent=1) + "\n")
        finally:
            stop_server(proc)
            if args.keep_server_log:
                print(log.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
