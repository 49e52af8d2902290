"""A session in a chromium page (Debian's, through Playwright): the same steps as a protocol client's
(tools/loadtest/sessions.py), each timed from the user's action to every view of the open tab rendered."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from .sessions import ControlChange, SessionResult, control_change, download_path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
UPLOADER = '[data-testid="stFileUploaderDropzoneInput"]'

APP_IDLE = ('() => { const a = document.querySelector(\'[data-testid="stApp"]\');'
            ' return a && a.dataset.testScriptState === "notRunning" && a.dataset.testConnectionState === "CONNECTED"'
            ' && !document.querySelector(\'[data-testid="stSkeleton"]\')'
            ' && [...document.querySelectorAll(\'[data-testid="stMain"] img\')].every(i => i.complete); }')


async def idle(page, timeout_ms: float, poll_ms: float = 50) -> None:
    """The script has finished, the connection is up, nothing is loading and every image has arrived.

    Checked every ``poll_ms``: 50 ms for one session; with many, each check is a DOM query in every
    page, so they poll less often (200 ms) and leave the CPU to the server.
    """
    await page.wait_for_function(APP_IDLE, timeout=timeout_ms, polling=poll_ms)


async def check_no_exception(page, result: SessionResult, where: str) -> None:
    blocks = page.locator('[data-testid="stException"]')
    if await blocks.count():
        result.errors.append(f"session {result.index}, {where}: {(await blocks.first.inner_text())[:300]}")


class PageSteps:
    """A session's steps in its page, each timed and then checked for an exception shown (into `result`)."""

    def __init__(self, page, result: SessionResult, timeout_ms: float, poll_ms: float):
        self.page, self.result, self.timeout_ms, self.poll_ms = page, result, timeout_ms, poll_ms
        self.main = page.locator('[data-testid="stMain"]')
        self.slider = None  # the Attention tab's layer slider, once it is open

    async def rendered(self) -> None:
        await idle(self.page, self.timeout_ms, self.poll_ms)

    async def first_load(self, url: str) -> None:
        started = time.perf_counter()
        await self.page.goto(url, timeout=self.timeout_ms)
        await self.page.wait_for_selector(UPLOADER, state="attached", timeout=self.timeout_ms)
        await self.rendered()
        self.result.first_render = time.perf_counter() - started
        await check_no_exception(self.page, self.result, "first load")

    async def upload(self, path: Path) -> None:
        started = time.perf_counter()
        await self.page.locator(UPLOADER).first.set_input_files(str(path))
        await self.main.get_by_text(f"image {path.name}", exact=False).first.wait_for(timeout=self.timeout_ms)
        await self.rendered()
        self.result.new_image.append(time.perf_counter() - started)
        await check_no_exception(self.page, self.result, f"upload {path.name}")

    async def open_attention(self) -> int:
        """Opens the Attention tab (untimed); returns the layer its slider shows."""
        await self.page.get_by_role("tab", name="5 Attention", exact=True).click()  # dashboard.views.RENAMED
        await self.main.get_by_text("mean of heads", exact=False).first.wait_for(timeout=self.timeout_ms)
        await self.rendered()
        self.slider = (self.main.locator('[data-testid="stSlider"]').filter(has_text="Layer (0 = first block)")
                       .locator('input[type="range"]'))
        return int(await self.slider.input_value())

    async def change_control(self, change: int, move: ControlChange) -> None:
        panel = self.page.locator('[role="tabpanel"]:visible')
        # timed from the user's deciding action (the arrow key, Enter on the typed option), not from
        # the steps before it (focusing, opening the select, typing)
        if move.kind == "layer slider":  # by keyboard
            key = "ArrowLeft" if int(await self.slider.input_value()) > move.layer else "ArrowRight"
            await self.slider.focus()
            started = time.perf_counter()
            await self.slider.press(key)
        else:  # type the option and choose it
            box = self.main.locator('[data-testid="stSelectbox"]').filter(has_text="Head").locator("input")
            await box.click()
            await box.fill(f"head {move.head}")
            started = time.perf_counter()
            await box.press("Enter")
        await panel.get_by_text(move.expected, exact=False).first.wait_for(timeout=self.timeout_ms)
        await self.rendered()
        self.result.control.append(time.perf_counter() - started)
        self.result.control_kinds.append(move.kind)
        await check_no_exception(self.page, self.result, f"control change {change} ({move.expected})")

    async def download(self, workdir: Path, name: str, data: bytes) -> None:
        """The sidebar's export of the capture (widget key dl_npz), not the one with explanations beside it."""
        button = self.page.locator('[data-testid="stSidebar"] .st-key-dl_npz').get_by_role("button")
        started = time.perf_counter()
        async with self.page.expect_download(timeout=self.timeout_ms) as info:
            await button.click()
        download = await info.value
        saved = download_path(workdir, self.result.index, len(self.result.downloads))
        await download.save_as(saved)
        self.result.download.append(time.perf_counter() - started)
        self.result.downloads.append((name, data, saved))
        await check_no_exception(self.page, self.result, f"download after {name}")


async def run_session(browser, url: str, index: int, images: list[tuple[str, bytes]], changes: int,
                      step_timeout_ms: float, start_delay: float, workdir: Path, poll_ms: float = 50) -> SessionResult:
    """Session `index` in a page of `browser`, after `start_delay` seconds: the first load, then each image (written to
    `workdir` already) uploaded, its `changes` control changes (on the Attention tab, opened after the first upload)
    and its download. A failed step ends the session with an error and a screenshot in `workdir`."""
    result = SessionResult(index)
    context = await browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = await context.new_page()
    page.on("pageerror", lambda e: result.errors.append(f"session {index}, page error: {e}"))
    steps = PageSteps(page, result, step_timeout_ms, poll_ms)
    try:
        await asyncio.sleep(start_delay)
        await steps.first_load(url)
        layer = None
        for number, (name, data) in enumerate(images):
            await steps.upload(workdir / name)
            if number == 0:
                layer = await steps.open_attention()
            for change in range(changes):
                move = control_change(index, change, layer)
                layer = move.layer
                await steps.change_control(change, move)
            await steps.download(workdir, name, data)
    except Exception as e:  # noqa: BLE001 - a timeout or a broken page is a finding, not a crash of the tool
        result.errors.append(f"session {index}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        try:
            await page.screenshot(path=str(workdir / f"failed_session{index:02d}.png"), full_page=True)
        except Exception:  # noqa: BLE001
            pass
    finally:
        await context.close()
    return result


def lowered(executable: str, workdir: Path) -> str:
    """A wrapper that keeps `executable` and its children on the last CPU at the lowest priority: 30
    pages stand for 30 students' devices, not for work the server should share all its cores with (see
    tools/loadtest/classroom.py's docstring). Chromium run as root resets its processes' nice values, not their affinity."""
    cpus = sorted(os.sched_getaffinity(0))
    pin = f"taskset -c {cpus[-1]} " if len(cpus) > 1 and shutil.which("taskset") else ""
    wrapper = workdir / "chromium-lowered"
    wrapper.write_text(f'#!/bin/sh\nexec {pin}nice -n 19 "{executable}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)
