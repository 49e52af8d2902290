"""Every session at once on one server: the students' protocol clients and chromium pages, staggered, and the
attacker beside them (tools/loadtest/attacker.py) until they are done."""

from __future__ import annotations

import asyncio
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .pages import CHROMIUM_ARGS, idle, lowered, run_session
from .sessions import DownloadStore, SessionResult, run_protocol_session

ATTACK_START_TIMEOUT_S = 300.0  # the students start then even if the attacker never got its attack going


async def drive(url: str, prepared: list[list[tuple[str, bytes]]], changes: int, step_timeout_s: float,
                stagger_s: float, workdir: Path, screenshot: Path | None, store: DownloadStore,
                browsers: int = 0, attacker: bool = False, attack_pause_s: float = 1.0,
                sessions_done: Callable[[], None] = lambda: None, attack: str = "files") -> list[SessionResult]:
    """Run every session at once (`prepared`: each one's images): the first `browsers` as chromium pages, the rest
    as protocol clients (one thread each, their downloads kept in `store`); then, if `screenshot`, one more page
    to show the app still answers. With `attacker`, one more protocol session (the last) attacks (`attack`, one of
    tools/loadtest/attacker.py's ATTACKS) from before the others start until every other one is done; its result
    comes last. `sessions_done` is called once the students' sessions are done, before that page (which is nobody's
    work in the class)."""
    from .attacker import run_attacker

    sessions = len(prepared)
    browsers = min(browsers, sessions)
    # a thread per protocol session (asyncio's default pool has only cpu_count + 4)
    threads = ThreadPoolExecutor(max_workers=max(1, sessions - browsers + attacker), thread_name_prefix="session")
    stop = threading.Event()  # set once the students are done: the attacker stops
    # The students start once the attack is under way (a judge's click sent: its minutes overlap the whole class),
    # or at once without an attacker.
    under_way = threading.Event()
    if not attacker:
        under_way.set()
    attack_result = SessionResult(sessions, client="attacker")

    def students_done() -> None:
        sessions_done()
        stop.set()

    try:
        loop = asyncio.get_running_loop()
        attacking = loop.run_in_executor(threads, run_attacker, url, sessions, step_timeout_s, 0.0, stop,
                                         attack_pause_s, attack_result, attack, under_way) if attacker else None
        await loop.run_in_executor(threads, under_way.wait, ATTACK_START_TIMEOUT_S)
        protocol = [loop.run_in_executor(threads, run_protocol_session, url, i, prepared[i], changes, step_timeout_s,
                                         i * stagger_s, store) for i in range(browsers, sessions)]
        if not browsers:
            results = list(await asyncio.gather(*protocol))
            students_done()
            if screenshot is not None:  # chromium starts after the class: its start-up is no student's work
                await _with_browser(url, 0, prepared, changes, step_timeout_s, stagger_s, workdir, screenshot, [])
        else:
            results = await _with_browser(url, browsers, prepared, changes, step_timeout_s, stagger_s, workdir,
                                          screenshot, protocol, students_done)
        if attacking is not None:
            await attacking
            results.append(attack_result)
        return results
    finally:
        stop.set()  # (a deadline's cancellation too: the attacker's thread ends after its current file)
        threads.shutdown(wait=False, cancel_futures=True)


async def _with_browser(url: str, browsers: int, prepared: list[list[tuple[str, bytes]]], changes: int,
                        step_timeout_s: float, stagger_s: float, workdir: Path, screenshot: Path | None,
                        protocol: list, sessions_done: Callable[[], None] = lambda: None) -> list[SessionResult]:
    """The chromium pages of `drive`, gathered with the protocol sessions already under way (`sessions_done` is
    called once they all are)."""
    from playwright.async_api import async_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=lowered(chromium, workdir) if browsers > 1 else chromium,
                                          args=CHROMIUM_ARGS)
        try:
            poll_ms = 50 if browsers == 1 else 200
            pages = [run_session(browser, url, i, prepared[i], changes, step_timeout_s * 1000, i * stagger_s, workdir,
                                 poll_ms) for i in range(browsers)]
            results = list(await asyncio.gather(*pages, *protocol))
            sessions_done()
            if screenshot is not None:  # one more page after the storm: the app still answers
                page = await browser.new_page(viewport={"width": 1400, "height": 1200})
                await page.goto(url)
                await page.wait_for_selector('[data-testid="stFileUploaderDropzoneInput"]', state="attached")
                await idle(page, step_timeout_s * 1000)
                await page.screenshot(path=str(screenshot), full_page=True)
        finally:
            await browser.close()
    return results
