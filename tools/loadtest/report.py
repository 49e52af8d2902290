"""The load test's report as text: latencies (median, p95, max) per kind of client and step, where the CPU went,
what the attacker's files got, the problems found and the server's memory. Each function returns lines; the
figures come from the report dict tools/loadtest/classroom.py builds."""

from __future__ import annotations

import os
import statistics

import numpy as np

from vit_core import settings

from .sessions import SessionResult


def percentile(samples: list[float], q: float) -> float:
    """The nearest-rank q-quantile: a latency some sample really had, not an interpolation."""
    return float(np.percentile(samples, 100 * q, method="inverted_cdf")) if samples else float("nan")


def summarise(name: str, samples: list[float]) -> str:
    if not samples:
        return f"{name:<46} (none)"
    return (f"{name:<46} n={len(samples):<4} median {statistics.median(samples):6.2f} s   p95 {percentile(samples, 0.95):6.2f} s"
            f"   max {max(samples):6.2f} s")


def storm_lines(seconds: float, cpu_use: dict) -> list[str]:
    """How long the sessions took and where the machine's CPU went meanwhile (a CpuMeter's reading)."""
    server_cpu = "unknown (no --server-pid)" if cpu_use["server_cpu_s"] is None else (
        f"{cpu_use['server_cpu_s']:.1f} (in the kernel {cpu_use['server_system_cpu_s']:.1f})")
    lines = [f"all sessions done in {seconds:.1f} s; CPU in that time: {cpu_use['busy_cpu_s']:.1f} of the machine's"
             f" {cpu_use['machine_cpu_s']:.1f} CPU-s busy ({os.cpu_count()} CPUs): server {server_cpu},"
             f" this script's clients {cpu_use['clients_cpu_s']:.1f}, the rest {cpu_use['other_cpu_s']:.1f}"]
    if cpu_use["server_parts_cpu_s"]:
        lines.append("  the server's CPU-s by where it went: " + ", ".join(
            f"{part} {part_s:.1f}" for part, part_s in cpu_use["server_parts_cpu_s"].items()))
    return lines


def client_lines(results: list[SessionResult]) -> list[str]:
    """The latencies of each kind of client that ran: chromium pages (to rendered) and protocol clients (to the run
    done and its media fetched)."""
    lines = []
    for client, what in (("browser", "rendered"), ("protocol", "run done, media fetched")):
        mine = [r for r in results if r.client == client]
        if not mine:
            continue
        lines.append(f"{len(mine)} {'chromium pages' if client == 'browser' else 'protocol clients'}:")
        lines.append(summarise(f"  first page load -> {what}", [r.first_render for r in mine if not np.isnan(r.first_render)]))
        lines.append(summarise(f"  new image -> {what}", [t for r in mine for t in r.new_image]))
        lines.append(summarise("    of which each session's first", [r.new_image[0] for r in mine if r.new_image]))
        lines.append(summarise(f"  control change -> {what}", [t for r in mine for t in r.control]))
        for kind in ("layer slider", "head select"):
            times = [t for r in mine for t, k in zip(r.control, r.control_kinds, strict=True) if k == kind]
            lines.append(summarise(f"    of which {kind}", times))
        lines.append(summarise("  .npz download -> all bytes received", [t for r in mine for t in r.download]))
    return lines


def attacker_lines(report: dict) -> list[str]:
    from .attacker import attack_lines

    return ["the attacker's files (each: from the message sent to its run done):", *attack_lines(report["attacks"])]


def problem_lines(report: dict) -> list[str]:
    """The downloads compared, the mismatches, errors and requests sent twice (the first few of each)."""
    lines = [f"downloads compared with standalone runs: {report['compared']}, mismatches: {len(report['mismatches'])}",
             f"exceptions / errors in pages: {len(report['errors'])}; problems in the server log:"
             f" {len(report['server_log'])}",
             f"requests sent a second time (a closed keep-alive connection, or a made download dropped before it was"
             f" fetched): {len(report['retries'])}"]
    lines += ["  " + line for line in report["retries"][:10]]
    lines += ["  " + line for line in (report["mismatches"] + report["errors"] + report["server_log"])[:20]]
    return lines


def memory_lines(report: dict) -> list[str]:
    """The server's peak memory (when its pid is known), one capture's size against its budget, its linears."""
    lines = []
    if report["peak_rss_mb"] is not None:
        lines.append(f"server peak RSS (process + children): {report['peak_rss_mb']:.0f} MB; besides, its in-memory"
                     f" files (memfd: export scratch files, not in RSS) held at most {report['peak_memfd_mb']:.0f} MB")
    lines.append(f"one capture of {report['model']}: {report['capture_mb']:.0f} MiB; the server's capture budget:"
                 f" {report['capture_budget_mb']:.0f} MiB (${settings.CAPTURE_MB.name}, see dashboard/server/byte_budget.py)")
    if report["linears"]:
        lines.append(f"the server's {report['linears']}")
    return lines
