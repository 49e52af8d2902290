"""What the load test measures besides latencies, read from /proc while the sessions run: where the machine's CPU
went (`CpuMeter`: the server, by the parts of it, the clients, the rest) and the server's memory (`RssSampler`)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from vit_core.serving.priority import EXPORT_LANE_NAME, FORWARD_LANE_NAME


def _status_kb(pid: int, *field_names: str) -> list[int]:
    """The fields of /proc/PID/status named (kB values, such as VmRSS), read at once; 0 for each once it has ended."""
    found = dict.fromkeys(field_names, 0)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in found:
                found[name] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return list(found.values())


def _memfd_paths(pid: int) -> list[str]:
    """/proc paths of the process's in-memory files (memfd: the `.npz` exports' scratch files, vit_core/serving/npz.py):
    memory that VmRSS leaves out, since they are written, not mapped."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                found.append(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass  # closed meanwhile
    return found


def _file_kb(paths: list[str]) -> int:
    """What the files at `paths` hold in memory, in kB (those closed meanwhile: nothing)."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_blocks // 2  # 512-byte blocks
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def _stat_seconds(path: str) -> tuple[str, float, float] | None:
    """(the kernel's name, user CPU seconds, system CPU seconds) from a process's or thread's /proc stat file; None
    once it has ended."""
    try:
        head, fields = Path(path).read_text().rsplit(") ", 1)  # the name, in parentheses, may hold anything
        numbers, hz = fields.split(), os.sysconf("SC_CLK_TCK")
        return head.split(" (", 1)[1], int(numbers[11]) / hz, int(numbers[12]) / hz
    except (OSError, ValueError, IndexError):
        return None


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (its threads included, its children not)."""
    stat = _stat_seconds(f"/proc/{pid}/stat")
    return (0.0, 0.0) if stat is None else stat[1:]


def _machine_seconds() -> tuple[float, float]:
    """(all, busy) CPU seconds of the whole machine since boot, from /proc/stat (busy: not idle or iowait)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    return sum(ticks) / hz, (sum(ticks) - ticks[3] - ticks[4]) / hz


def _threads_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """{thread id: (the kernel's name for it, its user + system CPU seconds)} of a process's live threads."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    stats = {int(tid): _stat_seconds(f"/proc/{pid}/task/{tid}/stat") for tid in tids}
    return {tid: (stat[0], stat[1] + stat[2]) for tid, stat in stats.items() if stat is not None}  # (none: ended)


# The server's CPU by where it went: its lanes carry the kernel names vit_core.serving.priority gives them, the main
# thread runs Streamlit's event loop, and child processes decode uploads (vit_core.images.decoding); what is left is the page
# scripts' threads (Streamlit starts one per session's runs; they come and go) and the server's other threads.
SERVER_PARTS = ("forward lanes", "export lanes", "event loop", "decode processes", "page scripts and the rest")


def server_parts(server_pid: int, begin: dict[int, tuple[str, float]], end: dict[int, tuple[str, float]],
                 server_s: float, children_s: float) -> dict[str, float]:
    """The server's CPU seconds between two readings of its threads (`_threads_cpu_seconds`), by SERVER_PARTS:
    `server_s` is the whole (process and children), `children_s` the children's share."""
    parts = dict.fromkeys(SERVER_PARTS, 0.0)
    names = {FORWARD_LANE_NAME: "forward lanes", EXPORT_LANE_NAME: "export lanes"}
    for tid, (name, seconds) in end.items():
        before = begin.get(tid, (name, 0.0))[1]  # a thread started meanwhile: all of its time
        part = "event loop" if tid == server_pid else names.get(name)
        if part is not None:
            parts[part] += seconds - before
    parts["decode processes"] = children_s
    parts["page scripts and the rest"] = server_s - sum(parts.values())
    return parts


class CpuMeter:
    """Where the machine's CPU went between start() and stop(): the server (with its children; and by SERVER_PARTS),
    this process (the protocol clients) and everything else. Tells whether a run was CPU-bound and who took the CPU."""

    def __init__(self, server_pid: int | None):
        self.server_pid = server_pid

    def _read(self, clients_s: float | None = None) -> tuple[tuple[float, ...], dict[int, tuple[str, float]]]:
        """The readings; this process's CPU read last, unless read already (`clients_s`)."""
        server, children = [0.0, 0.0], [0.0, 0.0]  # (user, system)
        for pid in _children(self.server_pid) if self.server_pid else []:
            children = [a + b for a, b in zip(children, _cpu_seconds(pid), strict=True)]
        if self.server_pid:
            server = [a + b for a, b in zip(children, _cpu_seconds(self.server_pid), strict=True)]
        threads = _threads_cpu_seconds(self.server_pid) if self.server_pid else {}
        clients = sum(_cpu_seconds(os.getpid())) if clients_s is None else clients_s
        return (*_machine_seconds(), *server, sum(children), clients), threads

    # This process's CPU is read after the other readings at the start and before them at the end: the meter's own
    # reads of /proc are no client's (a storm's meter reads them once; tools/loadtest/steps.py, at every step).
    def start(self) -> None:
        self._begin, self._begin_threads = self._read()

    def stop(self) -> dict:
        end, end_threads = self._read(clients_s=sum(_cpu_seconds(os.getpid())))
        total, busy, server_user, server_system, children, clients = (b - a for a, b in zip(self._begin, end, strict=True))
        server = server_user + server_system  # 0 without a server pid: "other" then holds the server
        parts = (server_parts(self.server_pid, self._begin_threads, end_threads, server, children)
                 if self.server_pid else None)
        return {"machine_cpu_s": total, "busy_cpu_s": busy, "server_cpu_s": server if self.server_pid else None,
                "server_system_cpu_s": server_system, "clients_cpu_s": clients, "other_cpu_s": busy - server - clients,
                "server_parts_cpu_s": parts}


class RssSampler:
    """Samples VmRSS of a process and its children; `peak_mb` also takes each one's VmHWM (kernel peak);
    `memfd_peak_mb` is the most their in-memory files held at once (not in VmRSS). The processes and their in-memory
    files are looked up again every `refresh` seconds, not at every sample: a server's exports keep their scratch files
    (vit_core/serving/npz.py), and walking every thread's children and 170 file descriptors at each sample takes ten
    times the CPU (docs/performance/2026-11-28.md, "The load test's RSS sampler")."""

    def __init__(self, pid: int, every: float = 0.1, refresh: float = 1.0):
        self.pid, self.every, self.refresh, self.peak_kb, self.hwm_kb, self.memfd_peak_kb = pid, every, refresh, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pids: list[int] = []
        self._memfds: list[str] = []
        self._refresh_at = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        if time.monotonic() >= self._refresh_at:
            self._pids = [self.pid] + _children(self.pid)
            self._memfds = [path for pid in self._pids for path in _memfd_paths(pid)]
            self._refresh_at = time.monotonic() + self.refresh
        rss_hwm = [_status_kb(p, "VmRSS", "VmHWM") for p in self._pids]
        self.peak_kb = max(self.peak_kb, sum(rss for rss, _ in rss_hwm))
        self.hwm_kb = max(self.hwm_kb, sum(hwm for _, hwm in rss_hwm))
        self.memfd_peak_kb = max(self.memfd_peak_kb, _file_kb(self._memfds))

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return max(self.peak_kb, self.hwm_kb) / 1024

    @property
    def memfd_peak_mb(self) -> float:
        return self.memfd_peak_kb / 1024
