"""One student's session: its images (distinct bytes per session and step), its control changes, what it measured
(`SessionResult`) and its downloads (`DownloadStore`), and the session itself as a protocol client
(`run_protocol_session`, tools/loadtest/client.py). The same session in a chromium page is tools/loadtest/pages.py;
every session at once, tools/loadtest/storm.py."""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")
# what `run_protocol_session` hands its `step` as a step's kind, in the order a session takes them
STEP_KINDS = ("first page load", "new image", "Attention tab", "control change", "download")


def session_image(session: int, step: int, size: tuple[int, int] = (480, 360)) -> tuple[str, bytes]:
    """A phone-photo-like picture unique to (session, step): smooth colours, shapes, noise. JPEG or PNG."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(1000 * session + step)
    w, h = size if max(size) <= 1024 else (size[0] // 4, size[1] // 4)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + 2 * y) / (15 + 5 * step) + session)], axis=-1)
    rgb = (base * rng.uniform(120, 255, size=3) + rng.normal(0, 8, size=(h, w, 3))).clip(0, 255).astype(np.uint8)
    im = Image.fromarray(rgb)
    if (w, h) != size:  # drawn small, enlarged: a phone-sized photo in a fraction of the time
        im = im.resize(size, Image.Resampling.BICUBIC)
        w, h = size
    draw = ImageDraw.Draw(im)
    side = max(4, min(w, h) // 4)
    for _ in range(4):
        x0, y0 = rng.integers(0, w - side), rng.integers(0, h - side)
        box = [int(x0), int(y0), int(x0 + rng.integers(side // 2, 2 * side)), int(y0 + rng.integers(side // 2, 2 * side))]
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    buffer = io.BytesIO()
    if step % 2 == 0:
        im.save(buffer, format="JPEG", quality=88)
        return f"student{session:02d}_photo{step}.jpg", buffer.getvalue()
    im.save(buffer, format="PNG")
    return f"student{session:02d}_drawing{step}.png", buffer.getvalue()


def prepare_images(sessions: int, images: int, workdir: Path, photo_size: tuple[int, int] | None = None
                   ) -> list[list[tuple[str, bytes]]]:
    """Each session's images, written to workdir: the first a photo of `photo_size` (JPEG), then drawings."""
    prepared = []
    for i in range(sessions):
        mine = [session_image(i, step, **({"size": photo_size} if step == 0 and photo_size else {})) for step in range(images)]
        for name, data in mine:
            (workdir / name).write_bytes(data)
        prepared.append(mine)
    return prepared


@dataclass
class SessionResult:
    index: int
    client: str = "browser"  # "browser" (a chromium page) or "protocol" (client.StreamlitSession)
    first_render: float = float("nan")
    new_image: list[float] = field(default_factory=list)
    control: list[float] = field(default_factory=list)
    control_kinds: list[str] = field(default_factory=list)  # "layer slider" or "head select", per control entry
    download: list[float] = field(default_factory=list)  # seconds from the click to the whole .npz received
    # (file name, image bytes, the downloaded .npz: its bytes, or the file it was saved to; see DownloadStore).
    # Not in repr: CPython 3.11's asyncio.run formats the main task's repr, results included, when it checks
    # the SIGINT handler it set (signal.getsignal), and 60 downloads of 31 MB took 6 CPU-s to render.
    downloads: list[tuple[str, bytes, bytes | Path]] = field(default_factory=list, repr=False)
    errors: list[str] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)  # protocol clients: requests sent twice (see tools/loadtest/client.py)
    attacks: list = field(default_factory=list)  # the attacker (client "attacker"): an attacker.Outcome per file sent


@dataclass(frozen=True)
class ControlChange:
    kind: str  # "layer slider" or "head select"
    layer: int  # the layer shown after the change
    head: int | None  # the head chosen (head select only)
    expected: str  # text the attention view then shows


def control_change(index: int, change: int, layer: int) -> ControlChange:
    """Session `index`'s `change`-th control change, from `layer`: even ones move the layer slider one step,
    odd ones choose a head that depends on the session (so sessions differ), as pages and protocol clients do."""
    if change % 2 == 0:
        layer = layer - 1 if layer > 0 else layer + 1
        return ControlChange("layer slider", layer, None, f"layer {layer},")
    head = (index + change) % 3
    return ControlChange("head select", layer, head, f"layer {layer}, head {head}")


class DownloadStore:
    """The protocol sessions' downloads until they are compared: in memory while they fit `memory_mb`, on disk
    beyond. Mid-storm, writing a 31 MB export to disk costs this machine about 90 ms of CPU (plus the kernel's
    writeback), taken from the server the test measures; 60 exports of ViT-B/16-384 (13 GB) don't fit in memory."""

    def __init__(self, workdir: Path, memory_mb: float):
        self.workdir, self.room = workdir, int(memory_mb * 2**20)
        self._lock = threading.Lock()

    def keep(self, session: int, step: int, data: bytes) -> bytes | Path:
        with self._lock:
            fits = len(data) <= self.room
            self.room -= len(data) if fits else 0
        if fits:
            return data
        saved = download_path(self.workdir, session, step)
        saved.write_bytes(data)
        return saved

    @staticmethod
    def read(kept: bytes | Path) -> bytes:
        return kept if isinstance(kept, bytes) else kept.read_bytes()


def download_path(workdir: Path, session: int, step: int) -> Path:
    """Where session `session`'s download number `step` is kept until it is compared."""
    folder = workdir / "downloads"
    folder.mkdir(exist_ok=True)
    return folder / f"session{session:02d}_{step}.npz"


def just_do(kind: str, action: Callable[[], T]) -> T:
    """`run_protocol_session`'s default `step`: the action, nothing around it."""
    return action()


def run_protocol_session(url: str, index: int, images: list[tuple[str, bytes]], changes: int, step_timeout_s: float,
                         start_delay: float, store: DownloadStore, step: Callable[[str, Callable], object] = just_do
                         ) -> SessionResult:
    """The same steps as a chromium page's (`pages.run_session`), sent as Streamlit's own messages (see
    tools/loadtest/client.py): no page is drawn.

    Latencies run from the message sent to the run finished and every media file it referenced fetched;
    a browser adds its drawing on top (docs/performance/2026-11-23.md, "Lighter load-test clients"). Each step runs as
    `step(kind, action)`, kind one of STEP_KINDS: tools/loadtest/steps.py measures each one's CPU that way.
    """
    from .client import StreamlitSession

    result = SessionResult(index, client="protocol")
    page = None

    def check(run, where: str, expected: str | None = None) -> None:
        result.errors += [f"session {index}, {where}: {e[:300]}" for e in run.exceptions]
        if expected is not None and not any(expected in text for text in run.texts):
            result.errors.append(f"session {index}, {where}: {expected!r} not shown")

    try:
        time.sleep(start_delay)
        started = time.perf_counter()
        page = StreamlitSession(url, timeout=step_timeout_s)
        check(step("first page load", page.open), "first load")
        result.first_render = time.perf_counter() - started
        layer = None
        for number, (name, data) in enumerate(images):
            started = time.perf_counter()
            run = step("new image", partial(page.upload, "upload", name, data))
            result.new_image.append(time.perf_counter() - started)
            check(run, f"upload {name}", f"image **{name}**")
            if number == 0:
                check(step("Attention tab", partial(page.set, "view", "Attention")), "Attention tab", "mean of heads")
                layer = int(page.elements["layer"].default[0])
            for change in range(changes):
                move = control_change(index, change, layer)
                layer = move.layer
                started = time.perf_counter()
                run = step("control change", partial(page.set, "layer", layer) if move.kind == "layer slider"
                           else partial(page.set, "head", f"head {move.head}"))
                result.control.append(time.perf_counter() - started)
                result.control_kinds.append(move.kind)
                check(run, f"control change {change}", move.expected)
            started = time.perf_counter()
            npz = step("download", partial(page.download, "dl_npz"))
            result.download.append(time.perf_counter() - started)
            kept = store.keep(index, len(result.downloads), npz)
            result.downloads.append((name, data, kept))
    except Exception as e:  # noqa: BLE001 - a timeout or a refused message is a finding, not a crash of the tool
        result.errors.append(f"session {index}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    finally:
        if page is not None:
            result.retries = [f"session {index}: {r}" for r in page.retries]
            page.close()
    return result
