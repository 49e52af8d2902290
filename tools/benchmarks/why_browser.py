"""Time the Why? tab's judge in a real browser, click to table: the Shapes ViT's token-dropping curves alone, then
every test with the localisation, as a student sees them (the target: the curves under 1 s).

    .venv/bin/python -m tools.benchmarks.why_browser [--rounds 2]

Starts the dashboard with the bundled Shapes ViT as `tools/dashboard` does (offline), drives Debian's chromium at
1280 x 720 with Playwright, and for each round opens a fresh session on a shape example (nothing cached for it yet:
each round takes another example), clicks "Judge" and waits for the script to finish.

Two figures per click:
- in the page: from the button's `pointerdown` to the first frame painted with the trust table in it, and to the
  app's run state turning to finished, on the page's own clock (MutationObservers and requestAnimationFrame): what
  the student sees;
- by the driver: from before Playwright's click to its wait for the finished script returning. It adds Playwright's
  own work (the click's actionability checks before the press, its polling of the page after it: 0.2-0.4 s on a
  2-core VM, docs/performance/2026-11-27.md, "The click timed in the page"), so it is an upper bound.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from tools.loadtest import start_server, stop_server
from tools.make_assets import CHROMIUM_ARGS, STEP_TIMEOUT_MS, settle
from vit_core.teaching.data import CLASS_NAMES
from vit_core.teaching.model import TEACHING_MODEL

CURVES = "&tests=" + quote("Deletion (drop)") + "&tests=" + quote("Insertion (drop)")

# Installed in the page before the click: the time of the button's pointerdown, of the first frame painted after a
# table appeared in a Markdown element (the trust table is the page's only one), and of the app's run state turning
# to finished (every element of the run drawn), on the page's clock (ms).
WATCH_TABLE = """() => {
  window.__judged = {click: null, table: null, done: null};
  document.addEventListener("pointerdown", () => { window.__judged.click ??= performance.now(); }, true);
  const tables = () => document.querySelectorAll('[data-testid="stMarkdown"] table').length;
  const before = tables();
  const seen = new MutationObserver(() => {
    if (window.__judged.click !== null && tables() > before) {
      seen.disconnect();
      requestAnimationFrame(() => setTimeout(() => { window.__judged.table = performance.now(); }, 0));
    }
  });
  seen.observe(document.body, {childList: true, subtree: true});
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    if (window.__judged.click !== null && app.getAttribute("data-test-script-state") === "notRunning") {
      window.__judged.done = performance.now();
    }
  }).observe(app, {attributes: true, attributeFilter: ["data-test-script-state"]});
}"""


def judge_seconds(page, url: str) -> tuple[float, float, float]:
    """Open `url`, click Judge, wait for the script to finish. -> seconds in the page from the press to the table
    painted and to the run finished, and by the driver from before its click to its wait's return"""
    page.goto(url)
    settle(page)
    page.evaluate(WATCH_TABLE)
    start = time.perf_counter()
    page.get_by_role("button", name=re.compile("^Judge the")).click()
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="running"]', timeout=STEP_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=STEP_TIMEOUT_MS)
    driver = time.perf_counter() - start
    if page.locator('[data-testid="stException"]').count():
        raise SystemExit(f"{url}: the app showed an exception")
    page.wait_for_function("window.__judged.table !== null", timeout=STEP_TIMEOUT_MS)
    judged = page.evaluate("window.__judged")
    return (judged["table"] - judged["click"]) / 1000, (judged["done"] - judged["click"]) / 1000, driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="examples timed per kind (at most 4)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_server(TEACHING_MODEL, random_init=False, log_path=Path(workdir) / "server.log")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                shapes = list(CLASS_NAMES)
                for kind, tests in (("token-dropping curves", CURVES), ("every test + localisation", "")):
                    for _ in range(min(args.rounds, 4)):
                        example = f"Shape: {shapes.pop()}"
                        table, done, driver = judge_seconds(page, f"{url}/?view=Why%3F&example={quote(example)}{tests}")
                        print(f"{kind:28s} {example:16s} click -> table {table:.2f} s, run finished {done:.2f} s in the"
                              f" page ({driver:.2f} s by the driver)", flush=True)
                browser.close()
        finally:
            stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
