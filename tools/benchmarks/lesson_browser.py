"""Time the lesson's Next from step 8 (the prediction) to step 9 (why this prediction?) in a real browser at a
projector's 1280 x 720, on the bundled Shapes ViT, as a class sees it.

    .venv/bin/python -m tools.benchmarks.lesson_browser [--rounds 3] [--shots DIR] [--at-once]

Starts the dashboard with the bundled Shapes ViT as `tools/dashboard` does (offline), drives Debian's chromium with
Playwright, and for each round opens a fresh session on another shape example at /lesson?step=8 (nothing of step 9
cached for that image yet: the relevance maps are made per image), waits for the page to finish, then presses Next.

Three figures per press, on the page's own clock (MutationObservers and requestAnimationFrame), from Next's
`pointerdown`:
- title: the step bar names step 9;
- figure: step 9's main figure is painted (a loaded picture in the lesson's figure box, not the one step 8 showed, and
  not greyed as stale while the script still runs): what the student waits for;
- done: the app's run state turned to finished (everything of the step drawn).
With --shots, a screenshot of each round's step 9 once the run finished. Step 8 makes step 9's maps ahead
(dashboard/lesson/ahead.py); --at-once presses Next before that can have finished (as soon as step 8's run ends), so
step 9 shows its first map and the rest as it comes.

The figures, before and after step 8 made the maps ahead: docs/performance/2026-11-28.md, "The lesson's step 9".
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

from tools.loadtest import start_server, stop_server
from tools.make_assets import CHROMIUM_ARGS, STEP_TIMEOUT_MS, settle
from vit_core.teaching.data import CLASS_NAMES
from vit_core.teaching.model import TEACHING_MODEL

PROJECTOR = {"width": 1280, "height": 720}

# Installed in the page before the press. A figure counts as shown once its <img> has loaded, its source differs from
# step 8's, and no element around it is marked stale (Streamlit greys the last run's elements while a run goes on).
WATCH_NEXT = """() => {
  const figure = () => document.querySelector('[class*="st-key-lesson_figure"] img');
  const before = figure() ? figure().getAttribute('src') : null;
  const title = () => { const i = document.querySelector('.st-key-lesson_bar input[role="combobox"]');
                        return i ? i.value : ''; };
  window.__next = {click: null, title: null, figure: null, done: null};
  const stamp = name => requestAnimationFrame(() => setTimeout(() => { window.__next[name] ??= performance.now(); }, 0));
  document.addEventListener('pointerdown', () => { window.__next.click ??= performance.now(); }, true);
  const check = () => {
    if (window.__next.click === null) return;
    if (window.__next.title === null && title().startsWith('Step 9 ')) stamp('title');
    const img = figure();
    if (window.__next.figure === null && img && img.complete && img.naturalWidth > 0
        && img.getAttribute('src') !== before && title().startsWith('Step 9 ') && !img.closest('[data-stale="true"]')) {
      stamp('figure');
    }
  };
  new MutationObserver(check).observe(document.body, {childList: true, subtree: true, attributes: true});
  document.addEventListener('load', check, true);  // an <img> finishing its load is no mutation
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    if (window.__next.click !== null && app.getAttribute('data-test-script-state') === 'notRunning') {
      check();
      window.__next.done ??= performance.now();
    }
  }).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""


def next_to_step_9(page, url: str, shot: Path | None, at_once: bool = False) -> dict[str, float]:
    """Open step 8 at `url`, press Next, wait for step 9 to finish. -> seconds from the press to the title, the
    figure painted and the run finished. `at_once`: Next is pressed as soon as step 8's run has finished (a presenter
    paging through), not after the page has settled."""
    page.goto(url)
    if at_once:
        page.wait_for_selector('[class*="st-key-lesson_figure"] img', timeout=STEP_TIMEOUT_MS)
        page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=STEP_TIMEOUT_MS)
    else:
        settle(page)
    page.evaluate(WATCH_NEXT)
    page.locator(".st-key-lesson_next").get_by_role("button").click()
    page.wait_for_function("window.__next.done !== null && window.__next.figure !== null", timeout=STEP_TIMEOUT_MS)
    settle(page)
    exception = page.locator('[data-testid="stException"]')
    if exception.count():
        raise SystemExit(f"{url}: the app showed an exception:\n{exception.first.inner_text()}")
    if shot is not None:
        page.screenshot(path=str(shot))
    seen = page.evaluate("window.__next")
    return {name: (seen[name] - seen["click"]) / 1000 for name in ("title", "figure", "done")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="shape examples timed, each in a fresh session (<= 8)")
    parser.add_argument("--shots", type=Path, default=None, help="a folder for each round's screenshot of step 9")
    parser.add_argument("--at-once", action="store_true",
                        help="press Next as soon as step 8's run has finished, not once the page has settled")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    times = []
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_server(TEACHING_MODEL, random_init=False, log_path=Path(workdir) / "server.log")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                for shape in list(CLASS_NAMES)[:min(args.rounds, len(CLASS_NAMES))]:
                    example = f"Shape: {shape}"
                    page = browser.new_page(viewport=PROJECTOR)  # a fresh session: nothing of its own cached
                    shot = None if args.shots is None else args.shots / f"lesson_step9_{shape}.png"
                    seen = next_to_step_9(page, f"{url}/lesson?step=8&example={quote(example)}", shot, args.at_once)
                    page.close()
                    times.append(seen)
                    print(f"{example:16s} Next -> step 9's title {seen['title']:.2f} s, its figure {seen['figure']:.2f}"
                          f" s, run finished {seen['done']:.2f} s", flush=True)
                browser.close()
        finally:
            stop_server(proc)
    for name in ("title", "figure", "done"):
        values = [t[name] for t in times]
        print(f"{name:6s} median {statistics.median(values):.2f} s, max {max(values):.2f} s over {len(values)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
