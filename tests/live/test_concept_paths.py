"""A FIFO typed as a concepts path, on a real server (issue 53's take-down: the old loader opened it and blocked,
holding the interpreter, and 29 other students got no answer). The server runs as tools/dashboard starts it, on
loopback with the single-user defaults, the only place a path box exists; students are protocol sessions
(tools/loadtest/client.py). One sends FIFO paths in a loop while three others switch tabs: every FIFO is refused in
one sentence, the health check answers, and the others' step latencies during the attack over before are printed
(their ratio), not asserted: the machine may be busy.

A class server (weights uploads off) shows no path box at all: checked here on the same protocol."""

from __future__ import annotations

import os
import statistics
import threading
import time
import urllib.request

import pytest

from dashboard import session as keys
from dashboard.views.concepts import TYPED
from tools.loadtest.client import StreamlitSession
from tools.loadtest.server import start_server, stop_server
from vit_core.loading import TEACHING_MODEL, teaching_model_available

pytestmark = pytest.mark.skipif(not teaching_model_available(), reason="the bundled Shapes ViT's weights are not here")

STUDENTS, SWITCHES = 3, 4
PATH_KEY = f"{keys.K_CONCEPTS}_path"


def switch_tabs(page: StreamlitSession, latencies: list[float]) -> None:
    for i in range(SWITCHES):
        started = time.perf_counter()
        run = page.set(keys.K_VIEW, "Attention" if i % 2 == 0 else "Concepts")
        assert not run.exceptions, run.exceptions
        latencies.append(time.perf_counter() - started)


def in_parallel(pages: list[StreamlitSession]) -> list[float]:
    latencies: list[float] = []
    threads = [threading.Thread(target=switch_tabs, args=(page, latencies)) for page in pages]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert len(latencies) == len(pages) * SWITCHES  # every student's every step came back
    return latencies


def test_a_fifo_typed_as_a_concepts_path_is_refused_at_once_and_the_others_are_answered(tmp_path):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / "concepts.safetensors")
    proc, url = start_server(TEACHING_MODEL, False, tmp_path / "server.log", {"HF_HUB_OFFLINE": "1"}, timeout=240)
    try:
        students = [StreamlitSession(url, timeout=240) for _ in range(STUDENTS)]
        for page in students:
            page.open()
        before = in_parallel(students)

        attacker = StreamlitSession(url, timeout=240)
        attacker.open()
        attacker.set(keys.K_VIEW, "Concepts")
        attacker.set(keys.K_CONCEPTS, TYPED)
        stop, refusals, health = threading.Event(), [], []

        def attack() -> None:
            i = 0
            while not stop.is_set():
                run = attacker.set(PATH_KEY, str(pipe) if i % 2 == 0 else str(pipe / "concepts.safetensors"))
                refusals.append((run.errors, run.exceptions))
                health.append(urllib.request.urlopen(f"{url}/_stcore/health", timeout=60).read())
                i += 1

        thread = threading.Thread(target=attack)
        thread.start()
        during = in_parallel(students)
        stop.set()
        thread.join(timeout=300)
        assert not thread.is_alive()
        assert refusals and all(len(errors) == 1 and errors[0].endswith("concepts.safetensors is not a regular file.")
                                and not exceptions for errors, exceptions in refusals), refusals[:3]
        assert set(health) == {b"ok"}
        ratio = statistics.median(during) / statistics.median(before)
        print(f"\n{len(refusals)} FIFO paths refused; the other students' tab switches: median "
              f"{statistics.median(before):.2f} s before, {statistics.median(during):.2f} s during the attack "
              f"(ratio {ratio:.2f}); load average {os.getloadavg()[0]:.1f}")
        for page in [*students, attacker]:
            page.close()
    finally:
        stop_server(proc)


def test_a_class_server_shows_no_path_box(tmp_path):
    proc, url = start_server(TEACHING_MODEL, False, tmp_path / "server.log",
                             {"HF_HUB_OFFLINE": "1", "VIT_LENS_WEIGHTS_UPLOADS": "off", "VIT_LENS_ANY_MODEL": "off"},
                             timeout=240)
    try:
        page = StreamlitSession(url, timeout=240)
        page.open()
        page.set(keys.K_VIEW, "Concepts")
        assert keys.K_CONCEPTS in page.widget_ids and PATH_KEY not in page.widget_ids
        options = list(page.elements[keys.K_CONCEPTS].options)
        assert "Shapes ViT, block 2 (bundled)" in options and TYPED not in options  # names only
        page.close()
    finally:
        stop_server(proc)
