"""Explanation jobs on a live server (`python -m dashboard.serve`, the tiny model): the load test's judging attacks
(tools/loadtest/attacker.py) get their tables, and a Many images run with judging stops at the server as soon as its
page closes (dashboard.server.jobs), not minutes later. The class-wide ratios: `python -m tools.loadtest --attacker
--attack judge` (docs/performance.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest
from streamlit.proto.WidgetStates_pb2 import WidgetState

from conftest import REPO
from dashboard import session as keys
from tools.loadtest import attacker
from tools.loadtest.client import StreamlitSession
from tools.loadtest.server import free_port, stop_server, wait_healthy
from tools.loadtest.sessions import SessionResult

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("jobs") / "server.log"
    env = {**os.environ, "VIT_LENS_MODEL": "test-tiny", "VIT_LENS_RANDOM_INIT": "1", "VIT_LENS_WEIGHTS_UPLOADS": "off",
           "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dashboard.serve", "--server.headless", "true", "--server.port",
                                 str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, 120)
        yield url, log_path
    finally:
        stop_server(proc)


def _until(found, what: str, timeout: float):
    """found()'s first truthy value, asked every 0.1 s; fails after `timeout` s (generous: this is no timing)."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.1)
    return value


@pytest.mark.parametrize("kind", ["judge", "many-judge"])
def test_the_attackers_judging_gets_its_result(server, kind):
    url, _ = server
    page = StreamlitSession(url, timeout=900)  # generous: beside CPU-bound work a nice +15 judge crawls
    result = SessionResult(0, client="attacker")
    try:
        page.open()
        if kind == "many-judge":
            attacker.MANY_IMAGES, many = 4, attacker.MANY_IMAGES
        step = {"judge": attacker._judge, "many-judge": attacker._many_judge}[kind]
        step(page, 0, threading.Event(), 0, result, threading.Event())
    finally:
        if kind == "many-judge":
            attacker.MANY_IMAGES = many
        page.close()
    assert [o.result for o in result.attacks] == ["judged"], result.attacks
    assert not result.errors


def test_a_judged_run_stops_at_the_server_when_its_page_closes(server):
    """Judged by the job's own record, not by the CPU the server got: a busy machine gives the job's nice +15 threads
    next to nothing (beside two CPU-bound processes not one image in 300 s), so the page is closed once the run is
    under way (its progress bar drawn), and the server's log must then say the job stopped, before the 256th image."""
    url, log_path = server
    page = StreamlitSession(url, timeout=600)
    page.open()
    page.go_to(attacker.MANY_PAGE)
    page.states[keys.K_MANY_COUNT] = WidgetState(id=page.widget_ids[keys.K_MANY_COUNT], double_value=256)
    page.set(keys.K_MANY_EXPLAIN, True)
    running = threading.Thread(target=lambda: _ignore_errors(page.click, keys.K_MANY_RUN), daemon=True)
    running.start()
    _until(lambda: page.progress_text.startswith(("Analysing 256 images", "Analysed")), "the run's progress bar", 600)
    seen = re.fullmatch(r"Analysed (\d+) of 256 images\.\.\.", page.progress_text)
    page.close()  # the tab closed, the run under way
    stopped = _until(lambda: re.search(r"explanation job stopped after (\d+) of (\d+) images", log_path.read_text()),
                     "the server's log saying the job stopped", 600)
    done_before, done_at_stop, of = int(seen[1]) if seen else 0, int(stopped[1]), int(stopped[2])
    print(f"the page saw {done_before} of 256 images done; the job stopped after {done_at_stop} of {of}")
    assert of == 256 and done_before <= done_at_stop < 256


def _ignore_errors(call, *args) -> None:
    try:
        call(*args)
    except Exception:  # noqa: BLE001 - the page is closed under it on purpose
        pass
