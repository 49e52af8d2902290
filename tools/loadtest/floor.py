"""The class load test's physical floor, measured in the same run, and its figures as ratios to it.

On C cores, N sessions' first images can't all be done before N x t / C seconds, with t the server's own capture
time on this machine (one torch thread, as a burst's passes run, traced, linears on the library the server
chooses), and the median student's can't come before half of that. These are the load test's floors, with N the
sessions. Each session then sends a second image (the default --images 2), whose forward comes on top: the
report also gives the median's ratio to the floor with every new image counted (N = sessions x images).

A figure in seconds only says something about the CPU it was taken on (the same code gave a 3.5 s median on a
Zen 5 and 12.3 s on a Zen 3); its ratio to the floor measured at the start of the same run says how much beyond
the forwards the server spends:

    floor_median = (N / 2) x t / C        floor_all = N x t / C

Goals: new-image median <= 1.5 x floor_median, p95 <= 1.5 x floor_all, control-change median <= 0.2 s,
no mismatches.

The floors take every session's image as sent at the same moment; `first_come_first_served` works out the run's own
pattern: a server that did nothing but the forwards, in the order the images came, each session sending its first
image `stagger_s` after the one before and its next image the moment its last one is done. Sent all at once, two
images a session put its new-image median at 2 x floor_median (each second image waits behind every first image still
queued); with the load test's 0.2 s between sessions (30 of them over 6 s), at about 1.0.

The same server given only a share of the machine (its forwards `capture_s / share` each, the rest of each core going
to other work) says what a run's share of the machine allows, and `share_needed` what share the goals need: on the
Zen 3 the forwards got about half of a storm's machine, at which such a server comes within a few percent of the runs'
own ratios (2.6-2.9 x floor_median), where the goals need 76-78 % (docs/performance/2026-11-28.md, "The forwards'
share of the machine").
"""

from __future__ import annotations

import heapq
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass

GOAL_RATIO = 1.5  # the new-image median and p95 at most this many times their floors
CONTROL_GOAL_S = 0.2  # the control-change median, in seconds
SIMD_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
              "amx_tile")  # the instruction sets MKL and oneDNN choose their kernels by


@dataclass(frozen=True)
class Floor:
    capture_s: float  # t: one capture, the server's way, on this machine, measured at the start of the run
    n: int  # N: the sessions (the load test's floor), or every new image of the run
    cores: int  # C

    @property
    def median_s(self) -> float:
        return self.n / 2 * self.capture_s / self.cores

    @property
    def all_s(self) -> float:
        return self.n * self.capture_s / self.cores


@dataclass(frozen=True)
class Ratios:
    new_image_median: float  # the new-image median / floor_median
    new_image_p95: float  # the new-image p95 / floor_all
    first_image_median: float  # each session's first image's median / floor_median
    every_image_median: float  # the new-image median / floor_median with every new image counted
    control_median_s: float
    mismatches: int

    def met(self) -> dict[str, bool]:
        return {"new-image median": self.new_image_median <= GOAL_RATIO, "new-image p95": self.new_image_p95 <= GOAL_RATIO,
                "control-change median": self.control_median_s <= CONTROL_GOAL_S, "mismatches": self.mismatches == 0}


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratios(floor: Floor, new_image: list[float], first_images: list[float], control: list[float],
           mismatches: int) -> Ratios:
    """The run's figures as ratios to its floor (seconds in, ratios out; the control change stays in seconds)."""
    median = statistics.median(new_image) if new_image else float("nan")
    first = statistics.median(first_images) if first_images else float("nan")
    every = Floor(floor.capture_s, len(new_image), floor.cores)
    return Ratios(median / floor.median_s, percentile(new_image, 95) / floor.all_s, first / floor.median_s,
                  median / every.median_s,
                  statistics.median(control) if control else float("nan"), mismatches)


def first_come_first_served(sessions: int, images: int, capture_s: float, cores: int, stagger_s: float = 0.0,
                            share: float = 1.0) -> list[float]:
    """The new-image latencies (seconds) of a server that does nothing but the forwards (`capture_s` each, one per core
    at a time) in the order the images come: session i sends its first image at i x `stagger_s` and each next one the
    moment the last is done (no control changes, no download, no figures), as the load test's sessions do. Every
    session's first image (session 0 first), then every second one, and so on. `share`: the part of each core the
    forwards get (the rest goes to other work, evenly over time), so that each takes `capture_s / share`."""
    capture_s = capture_s / share
    free = [0.0] * cores  # when each core is next free (a heap)
    waiting = [(i * stagger_s, i, 1) for i in range(sessions)]  # (sent at, session, which image): a heap, by time sent
    heapq.heapify(waiting)
    latencies = {}  # (image, session) -> seconds
    while waiting:
        sent, session, image = heapq.heappop(waiting)  # the longest-waiting image goes next
        done = max(sent, heapq.heappop(free)) + capture_s
        heapq.heappush(free, done)
        latencies[image, session] = done - sent
        if image < images:
            heapq.heappush(waiting, (done, session, image + 1))
    return [latencies[key] for key in sorted(latencies)]


def first_come_first_served_ratios(floor: Floor, images: int, stagger_s: float, share: float = 1.0) -> Ratios:
    """`ratios` of `first_come_first_served` for the run's sessions (floor.n), t and cores: every session's first image
    comes first in its latencies."""
    latencies = first_come_first_served(floor.n, images, floor.capture_s, floor.cores, stagger_s, share)
    return ratios(floor, latencies, latencies[:floor.n], [], 0)


SHARE_STEP = 0.01


def share_needed(floor: Floor, images: int, stagger_s: float, goal: float = GOAL_RATIO) -> float | None:
    """The smallest share of the machine (to SHARE_STEP) whose forwards, served first come first served
    (`first_come_first_served` with that `share`), bring both the new-image median and p95 within `goal` x their floors;
    None if even all of it doesn't (every image sent at once, say). The ratios only fall as the share grows (each
    forward ends later at a smaller one, and every image sent later waits for those before it), so the search walks
    down from 1 and stops at the first share that misses."""
    def met(share: float) -> bool:
        r = first_come_first_served_ratios(floor, images, stagger_s, share)
        return r.new_image_median <= goal and r.new_image_p95 <= goal

    steps = round(1 / SHARE_STEP)
    needed = None
    for k in range(steps, 0, -1):
        if not met(k / steps):
            break
        needed = k / steps
    return needed


def other_work_allowed(share: float) -> float:
    """All other work's CPU a storm may hold when the forwards get `share` of the machine, as a multiple of theirs."""
    return (1 - share) / share


@dataclass(frozen=True)
class Share:
    """The forwards' share of a storm's machine: what it allowed a first-come-first-served server, and what the goals need."""
    forwards_cpu_s: float  # the forward lanes' CPU-seconds in the storm
    machine_cpu_s: float  # the machine's in the same time (seconds x cores)
    at_this_share: Ratios  # first come first served, its forwards given this run's share
    needed: float | None  # share_needed

    @property
    def share(self) -> float:
        return self.forwards_cpu_s / self.machine_cpu_s

    def lines(self) -> list[str]:
        r = self.at_this_share
        lines = [f"  the forwards got {self.share:.0%} of the machine in the storm ({self.forwards_cpu_s:.1f} of"
                 f" {self.machine_cpu_s:.1f} CPU-s); a first-come-first-served server whose forwards got that share:"
                 f" new-image median / floor_median {r.new_image_median:.2f}, p95 / floor_all {r.new_image_p95:.2f}"]
        if self.needed is None:
            return lines + ["  even all of the machine would not bring a first-come-first-served server within the goals"]
        other_now = (self.machine_cpu_s - self.forwards_cpu_s) / self.forwards_cpu_s
        other_allowed = other_work_allowed(self.needed)
        return lines + [f"  the goals need the forwards to get at least {self.needed:.0%} of it: all other work (pages,"
                        f" downloads, the event loop, decodes, this script's clients, idle time) within"
                        f" {other_allowed:.2f} x the forwards' CPU, where this run took {other_now:.2f} x"]


def forwards_share(floor: Floor, images: int, stagger_s: float, forwards_cpu_s: float, storm_s: float) -> Share:
    """This run's `Share`: the forward lanes' `forwards_cpu_s` against the machine's storm_s x cores."""
    machine_cpu_s = storm_s * floor.cores
    at_this_share = first_come_first_served_ratios(floor, images, stagger_s, min(1.0, forwards_cpu_s / machine_cpu_s))
    return Share(forwards_cpu_s, machine_cpu_s, at_this_share, share_needed(floor, images, stagger_s))


def report_lines(floor: Floor, r: Ratios, best: Ratios | None = None) -> list[str]:
    met = r.met()

    def mark(goal: str) -> str:
        return "met" if met[goal] else "NOT MET"

    return [
        f"floor: one capture t = {floor.capture_s:.3f} s (the server's way, 1 torch thread), N = {floor.n}"
        f" sessions, C = {floor.cores} cores: floor_median = (N/2) x t / C = {floor.median_s:.2f} s,"
        f" floor_all = N x t / C = {floor.all_s:.2f} s",
        f"  new-image median / floor_median = {r.new_image_median:.2f} (goal <= {GOAL_RATIO}: {mark('new-image median')})",
        f"  new-image p95 / floor_all = {r.new_image_p95:.2f} (goal <= {GOAL_RATIO}: {mark('new-image p95')})",
        f"  each session's first image, median / floor_median = {r.first_image_median:.2f}; the new-image median /"
        f" the floor_median of every new image counted = {r.every_image_median:.2f}",
        f"  control-change median {r.control_median_s:.2f} s (goal <= {CONTROL_GOAL_S} s:"
        f" {mark('control-change median')}); mismatches {r.mismatches} ({mark('mismatches')})",
    ] + ([
        f"  a server doing nothing but the forwards, first come first served: new-image median / floor_median"
        f" {best.new_image_median:.2f}, p95 / floor_all {best.new_image_p95:.2f} (the same test, each next image sent"
        f" as the last is done)",
    ] if best is not None else [])


def cpu_description(lscpu_text: str) -> str:
    """'MODEL, N CPUs, SIMD flags' from `lscpu`'s output: what a figure's kernels depended on."""
    fields = dict(re.findall(r"^([^:\n]+):\s*(.*)$", lscpu_text, flags=re.M))
    flags = set(fields.get("Flags", "").split())
    simd = [f for f in SIMD_FLAGS if f in flags]
    return (f"{fields.get('Model name', 'unknown CPU').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs,"
            f" flags: {' '.join(simd) or 'none of ' + '/'.join(SIMD_FLAGS[:3])}")


def this_cpu() -> str:
    if shutil.which("lscpu") is None:
        return "unknown CPU (no lscpu)"
    return cpu_description(subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout)


def capture_seconds(model: str, random_init: bool, rounds: int = 5) -> float:
    """t: the median of `rounds` captures of `model` the way the server's burst runs them (`serve_capture`, one torch
    thread, traced where the server traces; linears chosen as the server chooses them, vit_core.runtime.onednn), after
    one untimed capture that records the trace. In this process, before the server starts: the machine is quiet."""
    from PIL import Image

    from dashboard.models import build_named_model
    from vit_core import settings
    from vit_core.runtime import torch_threads
    from vit_core.serving import parallel_passes, serve_capture, set_parallel_passes, set_traced_forward, traced_forward_enabled
    from vit_core.serving.passes import narrow_threads

    loaded = build_named_model(model, random_init)
    image = Image.new("RGB", (640, 480), (120, 90, 60))
    passes, narrow, traced = parallel_passes(), narrow_threads(), traced_forward_enabled()
    set_parallel_passes(1, 1)
    set_traced_forward(settings.TRACED_FORWARD.on())
    try:
        with torch_threads(1):
            serve_capture(loaded, image)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                serve_capture(loaded, image)
                times.append(time.perf_counter() - started)
    finally:
        set_traced_forward(traced)
        set_parallel_passes(passes, narrow * passes)
    return statistics.median(times)
