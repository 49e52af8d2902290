"""Time the static lesson (`vit-lens export-web`) in headless chromium, as a class meets it: from a local static server,
each page in a fresh browser context (nothing cached), at a projector's 1280 x 720, without and with chromium's 4x CPU
throttling (CDP Emulation.setCPUThrottlingRate: roughly a phone).

    .venv/bin/python -m tools.benchmarks.web_lesson [--site DIR] [--rounds 5] [--shots DIR]

Figures, on the page's own clock (performance.now(); the page records them in vitLens.app.timings):
- open: from the navigation's start to the first example's prediction shown with step 1's figure;
- stroke: from a stroke's end (pointerup on the drawing canvas) to its prediction and the open step's figure drawn;
- example: from a click on an example to its prediction and the open step's figure (its PNG fetched and decoded);
- deletion: the deletion test of the rollout map (its 10 steps and 8 random orders; forwards batched per step);
and the site's size. Without --site, the Shapes ViT's site is exported to a temporary folder first. With --shots, a
screenshot of steps 1, 4, 6, 9 at 1280 x 720 and steps 1 and 9 at 390 x 844 (unthrottled), with the smallest figure text
and whether each step's figure and controls end above the fold.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from tools.make_assets import CHROMIUM_ARGS

PROJECTOR = (1280, 720)
EXAMPLES = ("star", "heart", "arrow")  # not the first example, which the page opens with
PHONE = (390, 844)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def star(box: dict, turn: float) -> list[tuple[float, float]]:
    """A five-pointed star in one stroke over the canvas's box, turned by `turn` radians (each stroke a new drawing)."""
    cx, cy, r = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2, box["width"] * 0.36
    return [(cx + r * np.sin(turn + 4 * np.pi * i / 5), cy - r * np.cos(turn + 4 * np.pi * i / 5)) for i in range(6)]


def draw(page, points: list[tuple[float, float]]) -> None:
    page.mouse.move(*points[0])
    page.mouse.down()
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        for t in np.linspace(0, 1, 6)[1:]:
            page.mouse.move(x0 + t * (x1 - x0), y0 + t * (y1 - y0))
    page.mouse.up()


def timings(page, what: str) -> list[float]:
    return [t["ms"] for t in page.evaluate("vitLens.app.timings") if t["what"] == what]


def one_round(browser, url: str, throttle: float, strokes: int, deletions: int) -> dict[str, list[float]]:
    context = browser.new_context(viewport={"width": PROJECTOR[0], "height": PROJECTOR[1]})
    page = context.new_page()
    try:
        if throttle > 1:
            context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": throttle})
        page.goto(url + "?step=1")
        page.wait_for_function("(window.vitLens?.app.timings || []).some((t) => t.what === 'open-to-first-prediction')",
                               timeout=120_000)
        result = {"open": timings(page, "open-to-first-prediction")}
        page.click("#draw")
        box = page.locator("#drawing").bounding_box()
        for i in range(strokes):
            before = int(page.evaluate("document.body.dataset.ready"))
            page.click("#clear")
            draw(page, star(box, 0.2 * i))
            page.wait_for_function(f"Number(document.body.dataset.ready) > {before}", timeout=60_000)
        result["stroke"] = timings(page, "your drawing")
        for name in EXAMPLES:  # a new image: click to its prediction and the open step's figure (fetch and decode included)
            before = int(page.evaluate("document.body.dataset.ready"))
            page.get_by_role("button", name=name, exact=True).click()
            page.wait_for_function(f"Number(document.body.dataset.ready) > {before}", timeout=60_000)
        result["example"] = [t for name in EXAMPLES for t in timings(page, name)]
        result["deletion"] = page.evaluate("""async (n) => {
            const V = vitLens, g = V.model.g, img = V.app.image, out = [];
            const map = V.analyses.rollout(img.result.attention, g);
            const { random_orders: orders, steps } = V.app.site.info.deletion;
            for (let i = 0; i < n; i++) {
                const t = performance.now();
                await V.why.deletionTest(V.model, img.pixels, map, img.preds[0].index, orders, steps);
                out.push(performance.now() - t);
            }
            return out;
        }""", deletions)
        return result
    finally:
        context.close()


# In the page: the smallest text of the figure and its controls as shown (SVG text and canvas captions are drawn at
# 18 px in their own units, then scaled with their element; a canvas without text is left out), and where the figure
# and the controls end.
MEASURE = """() => {
    const scale = (e) => e.getBoundingClientRect().width / (e.viewBox ? e.viewBox.baseVal.width : e.width);
    const drawn = [...document.querySelectorAll('#figure svg, #figure canvas[data-text]')].map(scale);
    const css = [...document.querySelectorAll('#controls, #controls *, #figure .caption')]
        .map((e) => parseFloat(getComputedStyle(e).fontSize));
    const bottom = (sel) => Math.max(...[...document.querySelectorAll(sel)].map((e) => e.getBoundingClientRect().bottom));
    return { smallest_text_px: Math.min(18 * Math.min(1, ...drawn), ...css),
             figure_bottom: bottom('#figure'), controls_bottom: bottom('#controls'), fold: innerHeight };
}"""


def layout(browser, url: str, size: tuple[int, int], steps: list[int], shots: Path) -> list[dict]:
    """Per step: its screenshot, the smallest font size of the figure's text (SVG text, canvas captions are drawn at
    18 px by figures.js), and whether the figure and the controls end within the first screen."""
    rows = []
    context = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = context.new_page()
    try:
        for step in steps:
            page.goto(url + f"?step={step}")
            page.wait_for_selector("body[data-ready]", state="attached", timeout=120_000)
            if step == 9:
                page.wait_for_selector("#figure svg[aria-label='deletion test']", timeout=120_000)
            page.wait_for_timeout(300)
            path = shots / f"web-lesson-step{step}-{size[0]}x{size[1]}.png"
            page.screenshot(path=str(path))
            rows.append({"step": step, "size": f"{size[0]}x{size[1]}", "screenshot": path.name, **page.evaluate(MEASURE)})
    finally:
        context.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="an exported site (default: export the Shapes ViT's to a temporary folder)")
    parser.add_argument("--rounds", type=int, default=5, help="fresh pages per setting (default 5)")
    parser.add_argument("--strokes", type=int, default=5, help="strokes per page (default 5)")
    parser.add_argument("--deletions", type=int, default=3, help="deletion tests per page (default 3)")
    parser.add_argument("--shots", type=Path, help="folder for the layout screenshots")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    temporary = None
    if args.site is None:
        from vit_core import load_model
        from vit_core.web.site import write_site

        temporary = Path(tempfile.mkdtemp(prefix="vit-lens-site-"))
        write_site(load_model("vit-lens/shapes-vit"), temporary)
    folder = args.site or temporary
    server, url = serve(folder)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    report: dict = {"site_bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
                    "cpu": lscpu.split("Model name:")[-1].splitlines()[0].strip()}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            for throttle in (1, 4):
                runs = [one_round(browser, url, throttle, args.strokes, args.deletions) for _ in range(args.rounds)]
                figures = {what: [x for r in runs for x in r[what]] for what in ("open", "stroke", "example", "deletion")}
                report[f"x{throttle}"] = {what: {"median_ms": statistics.median(v), "max_ms": max(v), "n": len(v)}
                                          for what, v in figures.items()}
            if args.shots:
                args.shots.mkdir(parents=True, exist_ok=True)
                report["layout"] = (layout(browser, url, PROJECTOR, [1, 4, 6, 9], args.shots)
                                    + layout(browser, url, PHONE, [1, 9], args.shots))
            browser.close()
    finally:
        server.shutdown()
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
