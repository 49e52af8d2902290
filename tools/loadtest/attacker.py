"""One student among the class who sends hostile files instead of photos (`python -m tools.loadtest --attacker`).

The files are tools/hostile's, drawn by the generators the tests use too (tools/hostile/images.py,
tools/hostile/canvas.py): a progressive JPEG with thousands of scans, a 400,000 x 10 PNG, a TIFF of
20,000 frames, a GIF whose second frame is cut off (uploads), and a PNG of 169 MP sent as the Draw canvas's
value. The attacker sends them one after another, a short pause between two, until every other session is done;
each round's files differ in a comment (a PNG tEXt chunk, a JPEG COM segment, a GIF comment, a TIFF's trailing
byte), so no cache of the server's can answer a repeat. Every file must be refused (an error naming it, the
previous image kept) or shown, never a traceback; what each took is reported per file, beside the others'
latencies (tools/loadtest/classroom.py compares them with a run without the attacker).

Other attacks (`--attack KIND`), each what one student can do with the page as it is:
  judge       a new image, then the Why? tab's Judge (hundreds of perturbed forwards of the shared model), in a loop;
  many-judge  the Many images page: 32 drawn Shapes with "Also judge every image's explanations", Run, in a loop;
  uploads     upload URLs asked for and 24 MB files PUT, never rerunning the script that would read them.
When the students are done the attacker's page closes at once, mid-run (a judge then stops at the server).
"""

from __future__ import annotations

import io
import statistics
import struct
import threading
import time
import uuid
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
    # "refused" (an error naming the file, or HTTP 413), "shown" (no error), "judged" (the judge's table or the set's
    # result shown), "held" (a PUT the server kept), "exception" (a traceback) or "failed"
    result: str
    detail: str = ""  # the error or exception the page showed


ATTACKS = ("files", "judge", "many-judge", "uploads")
JUDGE_TAB = "Why?"  # dashboard.views.VIEWS
MANY_PAGE = "many-images"  # dashboard/app.py's url_path of the Many images page
MANY_IMAGES = 32  # the red team's set
FLOOD_MB = 24  # each PUT of the upload flood


def run_attacker(url: str, index: int, step_timeout_s: float, start_delay: float, stop: threading.Event,
                 pause_s: float, result, kind: str = "files", under_way: threading.Event | None = None) -> None:
    """Session `index` attacks (`kind`, one of ATTACKS) in rounds until `stop` is set; fills `result` (a
    SessionResult: `attacks` with an Outcome per step, `errors` with tracebacks the page showed and failures of the
    session). Sets `under_way` once its first attack is sent (a judge: once its image and tab are ready, as it
    clicks), also when it fails before."""
    under_way = under_way or threading.Event()
    from .client import StreamlitSession

    if kind not in ATTACKS:
        raise ValueError(f"unknown attack {kind!r}; one of {ATTACKS}")
    page = None
    try:
        stop.wait(start_delay)
        page = StreamlitSession(url, timeout=step_timeout_s)
        page.open()
        if kind in ("judge", "many-judge"):  # one step takes minutes: the page goes when the class is done
            threading.Thread(target=_close_when, args=(stop, page), daemon=True).start()
        if kind in ("files", "uploads"):
            under_way.set()
        round_ = 0
        while not stop.is_set():
            {"files": _hostile_files, "judge": _judge, "many-judge": _many_judge, "uploads": _upload_flood
             }[kind](page, round_, stop, pause_s, result, under_way)
            round_ += 1
    except Exception as e:  # noqa: BLE001 - a finding, not a crash of the tool
        if not stop.is_set():  # (after it, the page closed under the attacker's feet)
            result.errors.append(f"attacker (session {index}): {type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:300] if str(e) else ''}")
    finally:
        under_way.set()
        if page is not None:
            result.retries = [f"attacker: {r}" for r in page.retries]
            page.close()


def _close_when(stop: threading.Event, page) -> None:
    stop.wait()
    page.close()  # the attacker's receive fails at once: its run goes on at the server until the server stops it


def _hostile_files(page, round_: int, stop: threading.Event, pause_s: float, result, under_way) -> None:
    """One round of `hostile_attacks()`, each file refused or shown, never a traceback."""
    if round_ == 0:
        page.set(keys.K_DRAW_ON, True)
    for attack in hostile_attacks():
        if stop.is_set():
            return
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


def _noise_png(seed: int) -> bytes:
    """A 320 x 240 picture of coloured noise: another image (and another judge) every round."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _timed(kind: str, step, result, judged_text: str) -> None:
    """Run `step()` (a run of the page) as one Outcome of `kind`: "judged" when the run shows `judged_text`."""
    started = time.perf_counter()
    try:
        run = step()
    except Exception as e:  # the page closed mid-run at the class's end, or a time-out: an outcome, then raised
        result.attacks.append(Outcome(kind, time.perf_counter() - started, "failed", f"{type(e).__name__}: {str(e)[:200]}"))
        raise
    seconds = time.perf_counter() - started
    if run.exceptions:
        result.errors.append(f"attacker, {kind}: a traceback: {run.exceptions[0][:300]}")
        result.attacks.append(Outcome(kind, seconds, "exception", run.exceptions[0][:300]))
    else:
        shown = any(judged_text in t for t in run.texts)
        detail = "" if shown else " / ".join(run.texts)[:300]
        result.attacks.append(Outcome(kind, seconds, "judged" if shown else "shown", detail))


def _judge(page, round_: int, stop: threading.Event, pause_s: float, result, under_way) -> None:
    """A new image, then Judge on the Why? tab."""
    page.upload(keys.K_UPLOAD, f"r{round_}_noise.png", _noise_png(round_))
    if round_ == 0:
        page.set(keys.K_VIEW, JUDGE_TAB)
    under_way.set()  # (the click's run is on its way as the students start: a judge takes far longer than a storm)
    _timed("Judge on the Why? tab", lambda: page.click("why_judge"), result, "| method |")
    stop.wait(pause_s)


def _many_judge(page, round_: int, stop: threading.Event, pause_s: float, result, under_way) -> None:
    """The Many images page: MANY_IMAGES drawn Shapes (another seed each round), also judged, Run."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    if round_ == 0:
        page.go_to(MANY_PAGE)
        page.states[keys.K_MANY_COUNT] = WidgetState(id=page.widget_ids[keys.K_MANY_COUNT], double_value=MANY_IMAGES)
        page.set(keys.K_MANY_EXPLAIN, True)
    page.states[keys.K_MANY_SEED] = WidgetState(id=page.widget_ids[keys.K_MANY_SEED], double_value=round_)
    under_way.set()
    _timed(f"Many images: {MANY_IMAGES} Shapes, also judged", lambda: page.click(keys.K_MANY_RUN), result,
           "images analysed")
    stop.wait(pause_s)


def _upload_flood(page, round_: int, stop: threading.Event, pause_s: float, result, under_way) -> None:
    """Ask for an upload URL and PUT a FLOOD_MB file to it, never telling any widget; pause_s / 10 between two."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    from .client import XSRF_COOKIE

    msg = BackMsg()
    msg.file_urls_request.request_id = request_id = str(uuid.uuid4())
    msg.file_urls_request.file_names.append(f"flood{round_}.png")
    msg.file_urls_request.session_id = page.session_id
    started = time.perf_counter()
    page._send(msg)
    urls = page._await_response(request_id).file_urls_response.file_urls[0]
    status = page.http.put(page.url + urls.upload_url, files={"file": (f"flood{round_}.png", b"x" * (FLOOD_MB << 20))},
                           headers={"X-Xsrftoken": page.http.cookies.get(XSRF_COOKIE, "")}, timeout=page.timeout).status_code
    result.attacks.append(Outcome(f"PUT of {FLOOD_MB} MB, never read", time.perf_counter() - started,
                                  "refused" if status == 413 else "held" if status < 300 else "failed", f"HTTP {status}"))
    stop.wait(pause_s / 10)


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
