"""One student among the class who sends hostile files instead of photos (`python -m tools.loadtest --attacker`).

The files are tools/hostile's, drawn by the generators the tests use too (tools/hostile/images.py,
tools/hostile/canvas.py): a progressive JPEG with thousands of scans, a 400,000 x 10 PNG, a TIFF of
20,000 frames, a GIF whose second frame is cut off (uploads), and a PNG of 169 MP sent as the Draw canvas's
value. The attacker sends them one after another, a short pause between two, until every other session is done;
each round's files differ in a comment (a PNG tEXt chunk, a JPEG COM segment, a GIF comment, a TIFF's trailing
byte), so no cache of the server's can answer a repeat. Every file must be refused (an error naming it, the
previous image kept) or shown, never a traceback; what each took is reported per file, beside the others'
latencies (tools/loadtest/classroom.py compares them with a run without the attacker).
"""

from __future__ import annotations

import statistics
import struct
import threading
import time
import zlib
from dataclasses import dataclass

from dashboard import session as keys
from dashboard.literal import markdown_literal

CANVAS_KEY = f"{keys.K_DRAW}_canvas_0"  # dashboard.draw.draw_ui's canvas before any Clear


@dataclass(frozen=True)
class Attack:
    kind: str  # what it is, for the report
    name: str  # the file's name (the canvas's value is always "drawing.png" in the app)
    data: bytes
    via: str = "upload"  # "upload" (the image uploader) or "canvas" (the Draw canvas's data URL)


def hostile_attacks() -> list[Attack]:
    """The hostile files, made by the generators its tests use (tools/hostile)."""
    from tools.hostile.canvas import huge_png
    from tools.hostile.images import damaged_second_frame_gif, gray_png, many_frame_tiff, many_scan_jpeg

    return [
        Attack("progressive JPEG, 4,000 scans", "scans.jpg", many_scan_jpeg(4000)),
        Attack("PNG of 400,000 x 10", "panorama.png", gray_png(400_000, 10)),
        Attack("TIFF of 20,000 frames", "frames.tif", many_frame_tiff(20_000)),
        Attack("GIF, second frame cut off", "animation.gif", damaged_second_frame_gif()),
        Attack("canvas: PNG of 13,000 x 13,000 (169 MP)", "drawing.png", huge_png(), via="canvas"),
    ]


def varied(data: bytes, round_: int) -> bytes:
    """`data` with a comment that names the round: the same picture (and the same cost), other bytes."""
    note = f"round {round_}".encode()
    if data.startswith(b"\x89PNG\r\n\x1a\n"):  # a tEXt chunk right after IHDR (8 + 25 bytes)
        body = b"Comment\x00" + note
        chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
        return data[:33] + chunk + data[33:]
    if data.startswith(b"\xff\xd8"):  # a COM segment right after SOI
        return data[:2] + b"\xff\xfe" + struct.pack(">H", len(note) + 2) + note + data[2:]
    if data.startswith((b"GIF87a", b"GIF89a")):  # a comment extension after the header and global colour table
        packed = data[10]
        at = 13 + (3 * 2 ** ((packed & 7) + 1) if packed & 0x80 else 0)
        return data[:at] + b"\x21\xfe" + bytes([len(note)]) + note + b"\x00" + data[at:]
    return data + note  # a TIFF: bytes after its last directory, read by nobody


def canvas_value(png: bytes) -> dict:
    """The Draw canvas's component state as its frontend sends it after a stroke: the Fabric.js JSON and the
    drawing as a data URL (here any bytes a script likes)."""
    from tools.hostile.canvas import data_url

    return {"drawing": {"raw": {"objects": [{"type": "path"}], "background": "#ffffff"}, "data": data_url(png)}}


@dataclass(frozen=True)
class Outcome:
    kind: str
    seconds: float  # from the message sent to the run finished and its media fetched
    result: str  # "refused" (an error naming the file), "shown" (no error), "exception" (a traceback) or "failed"
    detail: str = ""  # the error or exception the page showed


def run_attacker(url: str, index: int, step_timeout_s: float, start_delay: float, stop: threading.Event,
                 pause_s: float, result) -> None:
    """Session `index` sends `hostile_attacks()` in rounds until `stop` is set; fills `result` (a SessionResult:
    `attacks` with an Outcome per file, `errors` with tracebacks the page showed and failures of the session)."""
    from .client import StreamlitSession

    attacks = hostile_attacks()
    page = None
    try:
        stop.wait(start_delay)
        page = StreamlitSession(url, timeout=step_timeout_s)
        page.open()
        page.set(keys.K_DRAW_ON, True)
        round_ = 0
        while not stop.is_set():
            for attack in attacks:
                if stop.is_set():
                    break
                data = varied(attack.data, round_)
                name = attack.name if attack.via == "canvas" else f"r{round_}_{attack.name}"
                started = time.perf_counter()
                try:
                    run = (page.set(CANVAS_KEY, canvas_value(data)) if attack.via == "canvas"
                           else page.upload(keys.K_UPLOAD, name, data))
                except Exception as e:  # a refused upload (HTTP 413) or a time-out is an outcome
                    result.attacks.append(Outcome(attack.kind, time.perf_counter() - started, "failed",
                                                  f"{type(e).__name__}: {str(e)[:200]}"))
                    if isinstance(e, TimeoutError):  # the session's socket is gone with it
                        raise
                    continue
                seconds = time.perf_counter() - started
                if run.exceptions:
                    outcome = Outcome(attack.kind, seconds, "exception", run.exceptions[0][:300])
                    result.errors.append(f"attacker, {attack.kind}: a traceback: {outcome.detail}")
                else:
                    mine = [e for e in run.errors if e.startswith(markdown_literal(name) + ":")]
                    outcome = Outcome(attack.kind, seconds, "refused" if mine else "shown", (mine or [""])[0][:300])
                result.attacks.append(outcome)
                stop.wait(pause_s)
            round_ += 1
    except Exception as e:  # noqa: BLE001 - a finding, not a crash of the tool
        result.errors.append(f"attacker (session {index}): {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
    finally:
        if page is not None:
            result.retries = [f"attacker: {r}" for r in page.retries]
            page.close()


def attack_lines(outcomes: list[Outcome]) -> list[str]:
    """The report's lines on the attacker: per kind of file, how often each outcome came, and how long it took."""
    lines = []
    for kind in dict.fromkeys(o.kind for o in outcomes):
        mine = [o for o in outcomes if o.kind == kind]
        counts = ", ".join(f"{r} {sum(o.result == r for o in mine)}" for r in dict.fromkeys(o.result for o in mine))
        seconds = [o.seconds for o in mine]
        lines.append(f"  {kind:<42} n={len(mine):<3} {counts}; median {statistics.median(seconds):5.2f} s,"
                     f" max {max(seconds):5.2f} s")
        first = {}  # an example of each outcome's message
        for o in mine:
            first.setdefault(o.result, o.detail)
        lines += [f"      {result}, e.g.: {detail[:160]}" for result, detail in first.items() if detail]
    return lines or ["  (the attacker sent nothing)"]
