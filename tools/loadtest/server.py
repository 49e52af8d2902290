"""The dashboard server a load test runs against: started as tools/dashboard starts it, on a free loopback port,
stopped, and its log read for problems afterwards."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, random_init: bool, log_path: Path, extra_env: dict[str, str] | None = None,
                 timeout: float = 120, own_cpus: bool = False) -> tuple[subprocess.Popen, str]:
    """The dashboard as `tools/dashboard` starts it (`python -m dashboard.serve`, i.e. `streamlit run
    dashboard/app.py` after the heavy imports) on a free loopback port; returns (process, url) once healthy."""
    port = free_port()
    env = {**os.environ, "VIT_LENS_MODEL": model, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("VIT_LENS_RANDOM_INIT", None)
    if random_init:
        env["VIT_LENS_RANDOM_INIT"] = "1"
    env.update(extra_env or {})
    log = open(log_path, "w")

    def server_first() -> None:
        """With own_cpus, the server keeps every CPU but the last for itself (the browsers get the last,
        see lowered()), so a torch thread never waits on a core that 30 pages are rendering on; its
        thread count follows (vit_core.runtime.cpu_quota). It also runs at a higher priority (root only)."""
        cpus = sorted(os.sched_getaffinity(0))
        if own_cpus and len(cpus) > 1:
            os.sched_setaffinity(0, cpus[:-1])
        try:
            os.nice(-10)
        except PermissionError:
            pass

    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboard.serve", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=server_first)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, log_path, timeout)
    return proc, url


def wait_healthy(proc: subprocess.Popen, url: str, log_path: Path, timeout: float) -> None:
    """Return once the Streamlit server at `url` answers its health check; stop it and raise if it
    exits or does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"streamlit did not start; see {log_path}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def server_log_problems(log_path: Path) -> list[str]:
    """The lines of the server's log that tell of an exception or error."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    return [line for line in text.splitlines() if re.search(r"Traceback|Uncaught|Exception in|Error:", line)]


def server_linears(log_path: Path) -> str | None:
    """The server's one log line on which library it chose for its linears (vit_core.runtime.onednn.choices_line)."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    lines = [line for line in text.splitlines() if "linears measured" in line]
    return "linears measured" + lines[-1].split("linears measured", 1)[1] if lines else None
