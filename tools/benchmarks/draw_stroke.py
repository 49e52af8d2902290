"""Time each pen stroke on the Draw input, in a real browser: from the stroke's mouse-up until the new prediction is
shown (the target: within 0.5 s with the bundled Shapes ViT on a 2-core machine).

    .venv/bin/python -m tools.benchmarks.draw_stroke [--strokes 12] [--port 8630] [--url URL] [--model NAME]

Starts the dashboard as `tools/dashboard` does (`python -m dashboard.serve`, the bundled Shapes ViT, offline)
on the first free port of 8630-8639 (or uses a running one: --url), opens headless chromium at 1280 x 720, turns
Draw on and draws one stroke at a time on the canvas (streamlit-drawable-canvas's `canvas.upper-canvas`, the mouse
driven as tests/browser/test_draw_browser.py does), each stroke one more edge of a star, placed where the canvas is
at that moment (a notice above it can move it). The page records on its own clock (performance.now()) when the
mouse went up, when the browser sent the drawing (the first websocket message after it), when the script started
and finished running, and when the text "prediction <label> (<p>%)" last changed. Per stroke it prints those times
from mouse-up and the forward pass's time as the page states it ("One forward pass: N ms"); then the median and 90th
percentile of mouse-up -> prediction shown, and the CPU (lscpu's model name). The canvas component itself waits
200 ms after a stroke before it sends the drawing (streamlit-drawable-canvas 0.13's debounce): the "sent" column.

A stroke whose prediction text happens to read the same as before counts with the script's end instead ("same
text" in its row). The first stroke (which also switches the page from the example to the drawing) is timed but
left out of the summary with --skip-first.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.loadtest import stop_server, wait_healthy
from tools.make_assets import CHROMIUM_ARGS, settle
from vit_core.loading import TEACHING_MODEL

ROOT = Path(__file__).resolve().parents[2]
PORTS = range(8630, 8640)
TARGET_S = 0.5
STEP_TIMEOUT_MS = 60_000

# Installed before the app's own scripts: marks on the page's clock. `up`: the stroke's mouse-up; `sent`: the first
# websocket message after it (the canvas's drawing, which the component sends after its own debounce); `running` /
# `done`: the script state going to "running", then back to "notRunning"; `shown`: the prediction text changing.
INSTRUMENT = r"""
(() => {
  const vl = window.__vl = {up: null, sent: null, running: null, done: null, shown: null, text: null, state: null};
  window.addEventListener('mouseup', () => {
    vl.up = performance.now(); vl.sent = vl.running = vl.done = vl.shown = null;
  }, true);
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (vl.up !== null && vl.sent === null) vl.sent = performance.now();
    return send.call(this, data);
  };
  const prediction = /prediction\s+(\S+)\s+\((\d+(?:\.\d+)?)%\)/;
  const observe = () => {
    const app = document.querySelector('[data-testid="stApp"]');
    const main = document.querySelector('[data-testid="stMain"]');
    if (!app || !main) { setTimeout(observe, 50); return; }
    new MutationObserver((records) => {
      const now = performance.now();
      const state = app.getAttribute('data-test-script-state');
      // Records are delivered in batches: a run that started and ended within one shows as a record whose old
      // value is "running" while the state is already "notRunning".
      const ran = state === 'running' || records.some((r) => r.attributeName && r.oldValue === 'running');
      if (vl.up !== null && ran && vl.running === null) vl.running = now;
      if (vl.up !== null && vl.running !== null && vl.done === null && state === 'notRunning') vl.done = now;
      vl.state = state;
      const found = (main.textContent || '').match(prediction);
      const text = found ? found[0] : null;
      if (text !== vl.text) { vl.text = text; if (vl.up !== null) vl.shown = now; }
    }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true,
                               attributeOldValue: true, attributeFilter: ['data-test-script-state']});
  };
  observe();
})();
"""


def cpu_model() -> str:
    """lscpu's "Model name" (and the CPUs this process may use)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    names = re.findall(r"^Model name:\s*(.+)$", out, flags=re.MULTILINE)
    return f"{names[0].strip() if names else 'unknown CPU'}, {len(os.sched_getaffinity(0))} CPUs usable"


def free_port_in(ports: range) -> int:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SystemExit(f"no free port in {ports.start}-{ports.stop - 1}")


def start_server(model: str, port: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python -m dashboard.serve` (what tools/dashboard runs) with `model`, on 127.0.0.1:`port`."""
    env = {**os.environ, "VIT_LENS_MODEL": model, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("VIT_LENS_RANDOM_INIT", None)
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboard.serve", "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log_path, timeout=180)
    return proc, url


Point = tuple[float, float]


def star_edges(count: int, seed: int = 0) -> list[tuple[Point, Point]]:
    """`count` strokes in the canvas's own coordinates (0-1 across and down), each one edge of a 5-pointed star
    (10 corners, starting at the lower right point), a smaller star on each further lap. The star stays below the
    canvas's top fifth, where its toolbar floats. `seed` moves and sizes it a little: another run's drawings are
    new images, not the server's cached ones (each image's capture is shared by every session)."""
    rng = random.Random(seed)
    cx, cy, size = 0.5 + rng.uniform(-0.05, 0.05), 0.56 + rng.uniform(-0.03, 0.03), rng.uniform(0.85, 1.0)
    edges = []
    for i in range(count):
        r = 0.36 * size * (1 - 0.2 * (i // 10))
        corners = [(cx + (r if k % 2 == 0 else 0.45 * r) * math.cos(-math.pi / 2 + k * math.pi / 5),
                    cy + (r if k % 2 == 0 else 0.45 * r) * math.sin(-math.pi / 2 + k * math.pi / 5))
                   for k in (4 + i % 10, 5 + i % 10)]
        edges.append((corners[0], corners[1]))
    return edges


def canvas_box(page) -> dict[str, float]:
    """The canvas's box on the screen once the layout around it has settled (a notice above it, or the figures
    beside it, can move it after a stroke): the same box twice in a row."""
    canvas = page.locator("canvas.upper-canvas").first
    canvas.scroll_into_view_if_needed()
    box = None
    for _ in range(50):
        page.wait_for_timeout(100)
        box, before = canvas.bounding_box(), box
        if box is not None and box == before:
            break
    if box is None or box["width"] < 100:
        raise SystemExit(f"no canvas to draw on (found {box})")
    return box


def draw_edge(page, start: Point, end: Point) -> None:
    page.mouse.move(*start)
    page.mouse.down()
    page.mouse.move(*end, steps=8)
    page.mouse.up()


def timed_stroke(page, start: Point, end: Point) -> dict[str, float | None]:
    """One stroke from `start` to `end` (in the canvas's coordinates, 0-1); its marks in seconds after mouse-up,
    once the rerun it caused has finished."""
    box = canvas_box(page)
    draw_edge(page, *((box["x"] + x * box["width"], box["y"] + y * box["height"]) for x, y in (start, end)))
    try:
        page.wait_for_function("() => window.__vl.done !== null", timeout=STEP_TIMEOUT_MS, polling=20)
    except Exception as e:  # playwright's TimeoutError: say what the page saw
        shot = Path(tempfile.gettempdir()) / "draw_stroke_timeout.png"
        page.screenshot(path=str(shot))
        raise SystemExit(f"no rerun finished after the stroke (the page: {shot}): "
                         f"{page.evaluate('() => ({...window.__vl})')}") from e
    page.wait_for_timeout(400)  # a second rerun (a callback's st.rerun) would show up here
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=STEP_TIMEOUT_MS)
    marks = page.evaluate("() => ({...window.__vl})")
    up = marks["up"]
    times = {name: None if marks[name] is None else (marks[name] - up) / 1000 for name in ("sent", "running", "done", "shown")}
    forward = re.search(r"One forward pass: (\d+) ms", page.locator('[data-testid="stApp"]').inner_text())
    return {**times, "forward": None if forward is None else int(forward.group(1)) / 1000}  # as the page says it


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the nearest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run(page, url: str, strokes: int, skip_first: bool, seed: int) -> list[float]:
    page.add_init_script(INSTRUMENT)
    page.goto(url)
    settle(page)
    # The Draw switch: in the sidebar, or wherever the page puts it.
    sidebar_draw = page.locator('[data-testid="stSidebar"]').get_by_text("Draw", exact=True)
    (sidebar_draw if sidebar_draw.count() else page.get_by_text("Draw", exact=True)).first.click()
    settle(page)
    edges = star_edges(strokes, seed)
    print(f"{'stroke':>6} {'sent':>6} {'running':>8} {'done':>6} {'shown':>6}  (s after mouse-up)  forward pass",
          flush=True)
    shown = []
    for i, (start, end) in enumerate(edges, 1):
        marks = timed_stroke(page, start, end)
        if page.locator('[data-testid="stException"]').count():
            raise SystemExit(f"stroke {i}: the app showed an exception")
        same = marks["shown"] is None
        latency = marks["done"] if same else marks["shown"]
        cells = " ".join(f"{'-' if marks[k] is None else f'{marks[k]:.3f}':>{w}}"
                         for k, w in (("sent", 6), ("running", 8), ("done", 6), ("shown", 6)))
        forward = "" if marks["forward"] is None else f"  {marks['forward']:.3f} s"
        print(f"{i:>6} {cells}{forward}{'  (same text: done counted)' if same else ''}", flush=True)
        if not (skip_first and i == 1):
            shown.append(latency)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strokes", type=int, default=12, help="strokes timed (default 12, at least 10)")
    parser.add_argument("--port", type=int, help="the server's port (default: the first free one of 8630-8639)")
    parser.add_argument("--url", help="time a server already running there instead of starting one")
    parser.add_argument("--model", default=TEACHING_MODEL, help=f"the server's model (default {TEACHING_MODEL})")
    parser.add_argument("--skip-first", action="store_true", help="leave the first stroke out of the summary")
    parser.add_argument("--screenshot", type=Path, help="save the page after the last stroke here")
    parser.add_argument("--seed", type=int, help="where the star is drawn (default: a new place each run)")
    args = parser.parse_args(argv)
    if args.strokes < 10:
        parser.error("--strokes: at least 10")
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    seed = random.randrange(2**31) if args.seed is None else args.seed
    print(f"CPU: {cpu_model()}; star seed {seed}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        proc = None
        url = args.url
        if url is None:
            port = args.port or free_port_in(PORTS)
            proc, url = start_server(args.model, port, Path(workdir) / "server.log")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                latencies = run(page, url, args.strokes, args.skip_first, seed)
                if args.screenshot:
                    page.screenshot(path=str(args.screenshot))
                browser.close()
        finally:
            if proc is not None:
                stop_server(proc)
    median, p90 = statistics.median(latencies), percentile(latencies, 90)
    print(f"mouse-up -> new prediction shown over {len(latencies)} strokes: median {median:.3f} s, "
          f"p90 {p90:.3f} s (target {TARGET_S} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
