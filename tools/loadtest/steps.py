"""What each of a student's steps costs the class server's CPU, one session at a time, against what the load test's goals
leave.

    .venv/bin/python -m tools.loadtest.steps                  # ViT-B/16 (random init): 3 sessions in turn, ~1 min
    .venv/bin/python -m tools.loadtest.steps --model test-tiny --sessions 1

The load test (`python -m tools.loadtest`) runs 30 sessions at once and says what share of the machine its forwards
got and what share the goals need. This tool puts protocol sessions (tools/loadtest/client.py) through the same
steps as the load test's sessions (`run_protocol_session`: the first page load, an image upload, the Attention tab,
four control changes, the `.npz` download, a second image and its changes and download), one session at a time on
a server of its own, and reads what each step cost in CPU: the server's by the load test's parts (`server_parts`,
from /proc) and this process's, the client's. Then, on a session of its own, three steps that find every figure in
the server's caches (a control change back and forth, a whole rerun with nothing changed, the same download again):
what a rerun costs with nothing to draw, Streamlit's and the page's own work.

Alone, nothing competes: each figure is a lower bound of what the same step costs in a storm. The last lines put one
image's steps, besides its forward, against what the goals leave them (`floor.share_needed` for the load test's storm:
30 sessions of two images, 0.2 s apart, on this machine's cores). /proc counts CPU in ticks (10 ms on Linux): each
figure is a step kind's total over its repeats, divided by them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

from dashboard.models import TEST_TINY
from vit_core.runtime import cpu_quota

from . import floor as floors
from .meters import SERVER_PARTS, CpuMeter, _cpu_seconds
from .server import server_linears, start_server, stop_server
from .sessions import STEP_KINDS, DownloadStore, prepare_images, run_protocol_session

T = TypeVar("T")
SETTLE_S = 0.05  # after a step returns, before its CPU is read: the server's last sends of the run
CACHED_KINDS = ("control change, figures cached", "whole rerun, figures cached", "the same download again")
LOAD_TEST = dict(sessions=30, images=2, changes=4, stagger_s=0.2)  # the load test's storm, for the goals' budget


@dataclass
class StepCost:
    """CPU-seconds of every run of one kind of step, summed: the server's by part, the client's, and wall time."""
    count: int = 0
    server: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SERVER_PARTS, 0.0))
    client_s: float = 0.0
    wall_s: float = 0.0

    def add(self, server: dict[str, float], client_s: float, wall_s: float) -> None:
        self.count += 1
        for part, seconds in server.items():
            self.server[part] += seconds
        self.client_s += client_s
        self.wall_s += wall_s

    def per_step(self, seconds: float) -> float:
        return seconds / self.count if self.count else float("nan")

    @property
    def besides_forwards_s(self) -> float:
        """The server's CPU-seconds, its forward lanes' left out."""
        return sum(self.server.values()) - self.server["forward lanes"]


class StepMeter:
    """`step(kind, action)` for `run_protocol_session`: runs the action inside the load test's CpuMeter (the server's
    CPU by part, this process's) and adds what it read to `costs[kind]`."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.costs: dict[str, StepCost] = defaultdict(StepCost)

    def step(self, kind: str, action: Callable[[], T]) -> T:
        meter = CpuMeter(self.server_pid)
        meter.start()
        started = time.perf_counter()
        result = action()
        wall = time.perf_counter() - started
        time.sleep(SETTLE_S)
        used = meter.stop()
        self.costs[kind].add(used["server_parts_cpu_s"], used["clients_cpu_s"], wall)
        return result


def quiet_server_cpu(pid: int, window_s: float = 1.0, quiet: float = 0.05, timeout_s: float = 120) -> float:
    """Wait until the server has settled (its start-up measurements and first trace run on a thread of their own after
    it answers) and return its CPU-seconds a second then: the first `window_s` in which it took under `quiet` of a core,
    or the last one before `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        before = sum(_cpu_seconds(pid))
        time.sleep(window_s)
        rate = (sum(_cpu_seconds(pid)) - before) / window_s
        if rate < quiet or time.monotonic() > deadline:
            return rate


def cached_steps(meter: StepMeter, url: str, image: tuple[str, bytes], repeats: int) -> None:
    """CACHED_KINDS on a session of their own: its image uploaded, the Attention tab open, one change made; then each
    kind `repeats` times, every figure it shows already made (the server's caches are shared by every session)."""
    from .client import StreamlitSession

    page = StreamlitSession(url)
    try:
        page.open()
        page.upload("upload", *image)
        page.set("view", "Attention")
        last = int(page.elements["layer"].default[0])
        layers = (last - 1, last)
        for layer in layers:  # both maps made once
            page.set("layer", layer)
        for i in range(repeats):
            meter.step(CACHED_KINDS[0], partial(page.set, "layer", layers[i % 2]))
        for _ in range(repeats):
            meter.step(CACHED_KINDS[1], page._rerun)  # the page's state unchanged: a whole run of the script
        page.download("dl_npz")
        for _ in range(repeats):
            meter.step(CACHED_KINDS[2], partial(page.download, "dl_npz"))
    finally:
        page.close()


def budget_per_image(capture_s: float, cores: int) -> tuple[float | None, float | None]:
    """(the share of the machine the goals need the forwards to get in the load test's storm, all other work's CPU an
    image may take then, as a multiple of the forward's): None, None where no share would do."""
    storm = LOAD_TEST
    needed = floors.share_needed(floors.Floor(capture_s, storm["sessions"], cores), storm["images"], storm["stagger_s"])
    return (needed, floors.other_work_allowed(needed)) if needed else (None, None)


def report_lines(costs: dict[str, StepCost], sessions: int, images: int, capture_s: float, cores: int,
                 idle_server_s: float) -> list[str]:
    """The table of step costs (ms per step), one image's steps and the same steps with every figure cached, as
    multiples of t (`capture_s`), and the goals' budget in the same terms."""
    ms = 1e3
    header = (f"{'step':<34} {'n':>4}  {'forward':>8} {'pages+':>8} {'events':>8} {'export':>8} {'decode':>8}"
              f"  {'server*':>8} {'client':>7}  {'wall':>7}")
    lines = [f"CPU per step, ms (server by part: forward lanes, page scripts and the rest, the event loop, export lanes,"
             f" decode processes; server* = all but the forwards; the idle server took {idle_server_s * ms:.1f} ms a"
             f" second)", header]
    for kind in [*STEP_KINDS, *CACHED_KINDS]:
        cost = costs.get(kind)
        if cost is None or not cost.count:
            continue
        part = {p: cost.per_step(cost.server[p]) * ms for p in SERVER_PARTS}
        lines.append(f"{kind:<34} {cost.count:>4}  {part['forward lanes']:>8.1f} {part['page scripts and the rest']:>8.1f}"
                     f" {part['event loop']:>8.1f} {part['export lanes']:>8.1f} {part['decode processes']:>8.1f}"
                     f"  {cost.per_step(cost.besides_forwards_s) * ms:>8.1f} {cost.per_step(cost.client_s) * ms:>7.1f}"
                     f"  {cost.per_step(cost.wall_s) * ms:>7.1f}")
    # One image as the load test sends it: every step but the first page load, over the sessions' images. Put against
    # t, what a forward costs in a storm (one torch thread a lane); alone, a forward runs on every core (wide), which
    # costs more CPU for less time (vit_core/serving/passes.py).
    taken = [costs[k] for k in STEP_KINDS[1:] if k in costs]
    image_count = sessions * images
    forward_s = sum(c.server["forward lanes"] for c in taken) / image_count
    server_s = sum(c.besides_forwards_s for c in taken) / image_count
    client_s = sum(c.client_s for c in taken) / image_count
    lines.append(f"one image as the load test sends it (its upload, {LOAD_TEST['changes']} control changes and download;"
                 f" the Attention tab once a session), alone: besides its forward ({forward_s * ms:.0f} ms of CPU alone),"
                 f" the server {server_s * ms:.0f} ms and the client {client_s * ms:.0f} ms:"
                 f" {(server_s + client_s) / capture_s:.2f} x t = {capture_s * ms:.0f} ms, the server's alone"
                 f" {server_s / capture_s:.2f} x")
    cached = [costs.get(k) for k in CACHED_KINDS]
    if all(c is not None and c.count for c in cached):
        change, rerun, download = cached  # the upload's rerun stands as a whole rerun: no decode, no new figure
        floor_s = sum(c.per_step(c.besides_forwards_s + c.client_s) * n
                      for c, n in ((rerun, 1), (change, LOAD_TEST["changes"]), (download, 1)))
        lines.append(f"the same steps with every figure cached (a whole rerun, {LOAD_TEST['changes']} control changes,"
                     f" a download), server and client: {floor_s * ms:.0f} ms, {floor_s / capture_s:.2f} x t")
    needed, allowed = budget_per_image(capture_s, cores)
    if needed is None:
        lines.append("the load test's goals: no share of this machine would bring a first-come-first-served server within "
                     "them")
    else:
        lines.append(f"the load test's goals in its storm ({LOAD_TEST['sessions']} sessions of {LOAD_TEST['images']}"
                     f" images, {LOAD_TEST['stagger_s']} s apart, {cores} cores) need the forwards to get {needed:.0%} of"
                     f" the machine: all other work within {allowed:.2f} x the forwards' CPU, {allowed:.2f} x t an image")
    return lines


def run(sessions: int = 3, model: str = "vit_base_patch16_224", random_init: bool = True, repeats: int = 20,
        photo_size: tuple[int, int] | None = (4032, 3024), workdir: Path | None = None, quiet: bool = False) -> dict:
    """Measure; returns {"costs": {kind: StepCost}, "capture_s", "cores", "lines"} (the lines also printed unless quiet)."""
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    workdir = Path(workdir or tempfile.mkdtemp(prefix="vit_lens_steps_"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"CPU: {floors.this_cpu()}")
    capture_s, cores = floors.capture_seconds(model, random_init), cpu_quota()
    say(f"one capture the server's way (1 torch thread): t = {capture_s:.3f} s")
    images = LOAD_TEST["images"]
    prepared = prepare_images(sessions + 1, images, workdir, photo_size)
    proc, url = start_server(model, random_init, workdir / "streamlit.log")
    try:
        meter = StepMeter(proc.pid)
        idle_server_s = quiet_server_cpu(proc.pid)
        store = DownloadStore(workdir, memory_mb=4096)
        for index in range(sessions):
            result = run_protocol_session(url, index, prepared[index], LOAD_TEST["changes"], 300, 0.0, store,
                                          step=meter.step)
            if result.errors:
                raise SystemExit(f"session {index} failed: {result.errors[0]}")
            result.downloads.clear()  # (not compared here: the load test does that)
        cached_steps(meter, url, prepared[sessions][0], repeats)
    finally:
        stop_server(proc)
    lines = report_lines(meter.costs, sessions, images, capture_s, cores, idle_server_s)
    linears = server_linears(workdir / "streamlit.log")  # what the server decided at start on this machine
    lines += [f"the server's {linears}"] if linears else []
    for line in lines:
        say(line)
    return {"costs": dict(meter.costs), "capture_s": capture_s, "cores": cores, "lines": lines}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.loadtest.steps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=3, help="sessions taken through the steps, one at a time")
    parser.add_argument("--model", default="vit_base_patch16_224", help=f"a timm name, or {TEST_TINY}")
    parser.add_argument("--pretrained", action="store_true", help="the server loads pretrained weights (needs them cached)")
    parser.add_argument("--repeats", type=int, default=20, help="repeats of each step that finds its figures cached")
    parser.add_argument("--photo", default="4032x3024", help="each session's first image, a JPEG (WxH; 0: a small one)")
    parser.add_argument("--workdir", type=Path, help="where the images and the server log go")
    args = parser.parse_args()
    from vit_core.runtime import configure_threads, one_blas_thread

    one_blas_thread()
    configure_threads()
    run(args.sessions, args.model, not args.pretrained, args.repeats,
        None if args.photo in ("0", "") else tuple(int(v) for v in args.photo.lower().split("x")), args.workdir)



if __name__ == "__main__":
    main()
