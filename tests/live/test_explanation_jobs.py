"""Explanation jobs on a live server (`python -m dashboard.serve`, the tiny model): the load test's judging attacks
(tools/loadtest/attacker.py) get their tables, and a Many images run with judging stops at the server as soon as its
page closes (dashboard.server.jobs), not minutes later. The class-wide ratios: `python -m tools.loadtest --attacker
--attack judge` (docs/performance.md)."""

from __future__ import annotations

import os
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
        yield url, proc.pid
    finally:
        stop_server(proc)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process and all its threads so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_over(pid: int, seconds: float) -> float:
    before = _cpu_seconds(pid)
    time.sleep(seconds)
    return _cpu_seconds(pid) - before


@pytest.mark.parametrize("kind", ["judge", "many-judge"])
def test_the_attackers_judging_gets_its_result(server, kind):
    url, _ = server
    page = StreamlitSession(url, timeout=240)
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
    url, pid = server
    page = StreamlitSession(url, timeout=600)
    page.open()
    page.go_to(attacker.MANY_PAGE)
    page.states[keys.K_MANY_COUNT] = WidgetState(id=page.widget_ids[keys.K_MANY_COUNT], double_value=256)
    page.set(keys.K_MANY_EXPLAIN, True)
    running = threading.Thread(target=lambda: _ignore_errors(page.click, keys.K_MANY_RUN), daemon=True)
    running.start()
    time.sleep(3)  # the run under way: 256 images, each judged
    busy = _cpu_over(pid, 2)
    page.close()  # the tab closed
    time.sleep(2)  # the disconnect reaches the server; the job stops at its next slice
    after = _cpu_over(pid, 2)
    print(f"server CPU over 2 s: {busy:.2f} s while judging, {after:.2f} s after the page closed")
    assert busy > 0.8, f"the run was not under way ({busy:.2f} CPU-s in 2 s)"
    assert after < 0.25 * busy, f"the run went on after its page closed ({after:.2f} CPU-s in 2 s)"


def _ignore_errors(call, *args) -> None:
    try:
        call(*args)
    except Exception:  # noqa: BLE001 - the page is closed under it on purpose
        pass
