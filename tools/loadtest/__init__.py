"""The classroom load test: N sessions at once on one dashboard server, each checked against the same
images analysed alone (see tools/loadtest/classroom.py for what it does and reports).

    .venv/bin/python -m tools.loadtest --sessions 5 --model test-tiny

`classroom` runs it (`run`, `main`) in named steps; `server` starts and stops the dashboard; `sessions` holds one
session's images, results and downloads and the protocol session (`client`: `StreamlitSession`), `pages` the same
session in a chromium page, `storm` every session at once (`attacker`: the one session of `--attacker` that sends
hostile files); `meters` reads the server's CPU and memory, `reference` checks each download against the same image
analysed alone, `report` writes the figures out. The names the tests and the benchmarks use are re-exported here."""

from .classroom import main, run
from .meters import CpuMeter, RssSampler
from .pages import APP_IDLE, CHROMIUM_ARGS
from .reference import ATOL, EXACT, RTOL, compare, reference_model
from .report import summarise
from .server import free_port, start_server, stop_server, wait_healthy
from .sessions import DownloadStore, SessionResult, download_path, prepare_images, session_image
from .storm import drive

__all__ = [
    "APP_IDLE", "ATOL", "CHROMIUM_ARGS", "EXACT", "RTOL", "CpuMeter", "DownloadStore", "RssSampler", "SessionResult",
    "compare", "download_path", "drive", "free_port", "main", "prepare_images", "reference_model", "run",
    "session_image", "start_server", "stop_server", "summarise", "wait_healthy",
]
