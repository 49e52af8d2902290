"""A class of students on one server: many sessions at once, hostile uploads, no network, upload caps.

- Sessions in parallel threads (AppTest) each get exactly the analysis of their own image: each one's
  `.npz` download equals `run_with_capture` + `analysis_arrays` run alone on the same bytes.
- The same through real browsers (a short run of tools/loadtest on the tiny model).
- Every odd file a phone can hold (tools/hostile/corpus.py) uploaded through the app: analysed with
  the right crop, or refused with a sentence; never a traceback, and the previous image stays.
- Weights files that must be refused (wrong architecture, wrong class count, truncated, a pickle
  that would run code), through the app.
- With no network the app opens on the bundled model (or says that it can't) and says why within
  5 s of the first page load; with a populated hub cache it uses the cached weights.

The model is the tiny random-init one (`VIT_LENS_MODEL=test-tiny`), or vit_tiny through a local hub cache.
Sessions in threads share one Streamlit runtime: tests/support/shared_runtime.py, the one place that uses
Streamlit's private API (pinned to 1.67.x).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

from conftest import REPO, assert_healthy, choose_weights, run_app
from dashboard import caches, session
from dashboard.image_choice import MAX_IMAGE_MB
from dashboard.models import MAX_WEIGHTS_MB, TEST_TINY
from dashboard.server.byte_budget import ByteBudgetCache, nbytes_of
from support.shared_runtime import download as _download
from support.shared_runtime import shared_runtime
from tools import loadtest
from tools.hostile.corpus import corpus
from vit_core import analyses, decode_image, run_with_capture
from vit_core.export import analysis_arrays, summary
from vit_core.loading import TEACHING_MODEL, teaching_model_available

ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def reference():
    """The test-tiny model as the app builds it, loaded here to analyse images alone."""
    return loadtest.reference_model(TEST_TINY, random_init=False)


@pytest.fixture(scope="module")
def runtime():
    """One media-file manager (downloads, images) and cache storage for every AppTest of this module."""
    with shared_runtime() as shared:
        yield shared


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key=session.K_UPLOAD).set_value((name, data, "application/octet-stream")).run()
    assert_healthy(at)
    return at


def header(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("Model **"))


def download(at: AppTest, runtime, suffix: str) -> bytes:
    """The bytes the session's sidebar download button gives (the .npz is generated on click)."""
    return _download(runtime, at, suffix)


def npz(at: AppTest, runtime) -> dict[str, np.ndarray]:
    return dict(np.load(io.BytesIO(download(at, runtime, ".npz"))))


def standalone(loaded, data: bytes) -> dict[str, np.ndarray]:
    return analysis_arrays(loaded, run_with_capture(loaded, decode_image(data).image))


def assert_same_analysis(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for key in expected:
        if key in loadtest.EXACT:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
        else:
            np.testing.assert_allclose(got[key], expected[key], rtol=loadtest.RTOL, atol=loadtest.ATOL, err_msg=key)


# ----------------------------------------------------------------------------------------------
# Many sessions at once


def test_sessions_in_parallel_threads_each_get_their_own_analysis(tiny_env, runtime, reference):
    sessions, errors, results = 4, [], {}
    barrier = threading.Barrier(sessions)

    def student(i: int) -> None:
        at = None
        try:
            at = run_app(view="Attention")
            barrier.wait(timeout=120)  # everyone uploads at once
            got = []
            for step in range(2):
                name, data = loadtest.session_image(i, step, size=(160 + 8 * i, 120))
                upload(at, name, data)
                at.slider(key=session.K_LAYER).set_value((i + step) % 2).run()
                at.selectbox(key=session.K_HEAD).set_value((i + step) % 3).run()
                assert_healthy(at)
                assert f"image **{name}**" in header(at)
                assert any(f"layer {(i + step) % 2}, head {(i + step) % 3}" in m.value for m in at.markdown)
                got.append((data, npz(at, runtime), json.loads(download(at, runtime, ".json"))))
            results[i] = got
        except BaseException as e:  # noqa: BLE001 - reported below, with the session and what its page showed
            shown = "" if at is None else (f"; page: exceptions {[x.value for x in at.exception]}, errors "
                                           f"{[x.value for x in at.error]}, tabs {[t.label for t in at.tabs]}")
            errors.append(f"session {i}: {type(e).__name__}: {e}{shown}")

    threads = [threading.Thread(target=student, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(sessions))
    for got in results.values():
        for data, arrays, summary_json in got:
            assert_same_analysis(arrays, standalone(reference, data))
            expected = summary(reference, run_with_capture(reference, decode_image(data).image))
            assert [p["index"] for p in summary_json["topk"]] == [p["index"] for p in expected["topk"]]
            assert np.allclose([p["prob"] for p in summary_json["topk"]], [p["prob"] for p in expected["topk"]], rtol=1e-4)
    crops = {arrays["input_image"].tobytes() for got in results.values() for _, arrays, _ in got}
    assert len(crops) == 2 * sessions  # and they really were different images


def test_a_slow_or_crashing_session_holds_up_and_breaks_no_other(tiny_env, runtime, reference, monkeypatch):
    """One student's image takes long to decode and another's forward pass crashes: meanwhile a third
    student's upload goes through, and the crashed session works again with its next image."""
    import vit_core
    from vit_core import serving

    (slow_name, slow), (bad_name, bad), (ok_name, ok), (next_name, nxt) = (
        loadtest.session_image(i, 1, size=(200 + i, 150)) for i in range(40, 44))
    bad_size = (241, 150)
    release = threading.Event()
    real_decode, real_capture = vit_core.decode_image, serving.serve_capture

    def decode(data, *args, **kwargs):
        if data == slow:
            release.wait(timeout=60)  # held until the other sessions are done
        return real_decode(data, *args, **kwargs)

    def capture(loaded, image, **kwargs):
        if image.size == bad_size:
            with loaded.lock:  # the crash happens while this session holds the shared model
                raise RuntimeError("simulated crash in the forward pass")
        return real_capture(loaded, image, **kwargs)

    monkeypatch.setattr(vit_core, "decode_image", decode)
    monkeypatch.setattr(serving, "serve_capture", capture)  # the dashboard's capture
    slow_session, crashed, fine = run_app(), run_app(), run_app()
    waiting = threading.Thread(target=lambda: slow_session.file_uploader(key=session.K_UPLOAD).set_value(
        (slow_name, slow, "image/png")).run())
    waiting.start()
    try:
        crashed.file_uploader(key=session.K_UPLOAD).set_value((bad_name, bad, "image/png")).run()
        assert crashed.exception  # this session's run failed...
        upload(fine, ok_name, ok)  # ...and another's upload is analysed meanwhile, the slow one still decoding
        assert f"image **{ok_name}**" in header(fine) and waiting.is_alive()
        assert_same_analysis(npz(fine, runtime), standalone(reference, ok))
        upload(crashed, next_name, nxt)  # the crashed session goes on with its next image
        assert f"image **{next_name}**" in header(crashed)
    finally:
        release.set()
        waiting.join(timeout=120)
    assert_healthy(slow_session)
    assert f"image **{slow_name}**" in header(slow_session)


def test_a_mismatch_would_be_detected(reference):
    """The load test's comparison is not vacuous: another student's image is reported."""
    _, mine = loadtest.session_image(0, 0)
    _, theirs = loadtest.session_image(1, 0)
    arrays = standalone(reference, mine)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    assert loadtest.compare(reference, mine, buffer.getvalue()) == []
    problems = loadtest.compare(reference, theirs, buffer.getvalue())
    assert any(p.startswith("input_image") for p in problems) and any(p.startswith("pattern") for p in problems)


def test_the_distance_history_of_a_session_is_capped(tiny_env, runtime, monkeypatch):
    monkeypatch.setattr(session, "MAX_HISTORY_IMAGES", 3)
    at = run_app(view="Distance")
    batch = [loadtest.session_image(50, step, size=(64, 48)) for step in range(5)]
    at.file_uploader(key=session.K_MAD_BATCH).set_value([(n, d, "image/png") for n, d in batch]).run()
    assert_healthy(at)
    history = at.session_state["_mad_history"]
    assert [len(per_model) for per_model in history.values()] == [3]
    assert any("average over the 3 image(s)" in c.value for c in at.caption)


def test_batch_uploads_leave_the_shared_caches_unchanged(tiny_env, runtime, reference):
    """The distance tab's batch uploader reduces each image to its mean attention distances (L, H) and drops
    the capture: no capture and no decoded picture of a batch image lands in the caches every session shares."""
    at = run_app(view="Distance")
    captures, pictures = set(caches._captures.keys()), set(caches._pictures.keys())
    batch = [loadtest.session_image(60, step, size=(64, 48)) for step in range(3)]
    at.file_uploader(key=session.K_MAD_BATCH).set_value([(n, d, "image/png") for n, d in batch]).run()
    assert_healthy(at)
    assert set(caches._captures.keys()) == captures and set(caches._pictures.keys()) == pictures
    (history,) = at.session_state["_mad_history"].values()
    assert len(history) == 1 + len(batch)  # the image shown and the batch
    for _, data in batch:
        cap = run_with_capture(reference, decode_image(data).image)
        g = cap.geometry
        expected = analyses.mean_attention_distance(cap.pattern, g.num_prefix_tokens, g.grid, g.patch_size)  # (L, H)
        np.testing.assert_allclose(history[hashlib.sha256(data).hexdigest()][0], expected, rtol=1e-5, atol=1e-6)
    assert any("average over the 4 image(s)" in c.value for c in at.caption)


def test_held_captures_stay_within_the_byte_budget_and_the_oldest_holds_go(tiny_env, runtime, reference,
                                                                          monkeypatch):
    """Four sessions, a budget of 3.5 captures: after each upload the captures kept (held ones included) sum to
    at most the budget; the latest sessions' captures stay, the oldest sessions' go; a session whose capture
    went gets its own analysis again on its next run."""
    images = [loadtest.session_image(70 + i, 0, size=(64, 48)) for i in range(4)]
    one = nbytes_of(run_with_capture(reference, decode_image(images[0][1]).image))
    budget = int(3.5 * one)
    monkeypatch.setattr(caches, "_captures", ByteBudgetCache(budget))
    sessions = []
    for name, data in images:
        at = run_app()
        upload(at, name, data)
        sessions.append(at)
        assert caches._captures.total_bytes <= budget
        assert sum(nbytes_of(caches._captures.get(k)) for k in caches._captures.keys()) <= budget
    kept = {sha for _, sha in caches._captures.keys()}
    shas = [hashlib.sha256(data).hexdigest() for _, data in images]
    assert set(shas[2:]) <= kept and not set(shas[:2]) & kept  # the two latest holds stay, the two oldest went
    at, (name, data) = sessions[0], images[0]
    at.session_state[session.K_VIEW] = "Patches"  # a full rerun of the first session
    at.run()
    assert_healthy(at)
    assert f"image **{name}**" in header(at)
    assert_same_analysis(npz(at, runtime), standalone(reference, data))
    assert shas[0] in {sha for _, sha in caches._captures.keys()} and caches._captures.total_bytes <= budget


@needs_chromium
def test_load_test_sessions_each_get_their_own_analysis(tmp_path):
    """tools/loadtest, short: a chromium page and two protocol clients on one server at once."""
    report = loadtest.run(sessions=3, browsers=1, model=TEST_TINY, random_init=False, images=1, changes=2,
                          step_timeout_s=90, stagger_s=0.1, deadline_s=240, workdir=tmp_path, quiet=True)
    assert report["clients"] == ["browser", "protocol", "protocol"]
    assert report["compared"] == 3 and not report["mismatches"], report
    assert not report["errors"] and not report["server_log"], report
    assert len(report["new_image"]) == 3 and len(report["control"]) == 6 and len(report["download"]) == 3
    assert (tmp_path / "after_the_class.png").stat().st_size > 10_000
    assert not (tmp_path / "downloads").exists()  # compared, then deleted (13 GB for a ViT-B/16-384 class)
    assert report["cpu"]["server_cpu_s"] > 0 and report["cpu"]["busy_cpu_s"] >= report["cpu"]["server_cpu_s"] * 0.5


def test_the_steps_tool_takes_one_session_through_the_load_tests_steps_and_counts_the_servers_cpu(tmp_path):
    """tools/loadtest/steps.py on the tiny model: every step of a load-test session once (two images, four control
    changes each), then each step that finds its figures cached twice, with the server's CPU read around each."""
    from tools.loadtest import steps

    report = steps.run(sessions=1, model=TEST_TINY, random_init=False, repeats=2, photo_size=None, workdir=tmp_path,
                       quiet=True)
    counts = {kind: c.count for kind, c in report["costs"].items()}
    assert counts == {"first page load": 1, "new image": 2, "Attention tab": 1, "control change": 8, "download": 2,
                      **dict.fromkeys(steps.CACHED_KINDS, 2)}
    assert sum(sum(c.server.values()) for c in report["costs"].values()) > 0  # the server's CPU, read from /proc
    assert any(line.startswith("one image as the load test sends it") for line in report["lines"])
    assert any(line.startswith("the load test's goals in its storm") for line in report["lines"])


def test_a_session_result_leaves_its_downloads_out_of_its_repr():
    """CPython 3.11's asyncio.run formats the repr of the main task, its result included, when it checks the SIGINT
    handler it set: the 30 sessions' results with 60 downloads of 31 MB took 6 CPU-s to render after the storm."""
    result = loadtest.SessionResult(3, client="protocol", new_image=[1.5])
    result.downloads.append(("photo.jpg", b"\xff" * 2_000_000, b"\x00" * 5_000_000))
    assert len(repr(result)) < 1_000 and "new_image=[1.5]" in repr(result)


def test_load_test_holds_downloads_in_memory_up_to_its_budget_then_on_disk(tmp_path):
    store = loadtest.DownloadStore(tmp_path, memory_mb=1000 / 2**20)  # room for 1,000 bytes
    first, second, third = b"a" * 600, b"b" * 600, b"c" * 300
    kept = [store.keep(0, 0, first), store.keep(0, 1, second), store.keep(1, 0, third)]
    assert kept[0] is first and kept[2] is third  # in memory while they fit
    assert kept[1] == loadtest.download_path(tmp_path, 0, 1) and kept[1].read_bytes() == second  # beyond: on disk
    assert [loadtest.DownloadStore.read(k) for k in kept] == [first, second, third]


def test_load_test_cpu_meter_counts_the_server_and_its_children(tmp_path):
    """The CPU the load test reports for the server is the server's (and its children's), not its own."""
    import subprocess
    import sys

    burnt = tmp_path / "burnt"
    burn = (f"import pathlib, time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
            f"pathlib.Path({str(burnt)!r}).touch()\ntime.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(120)"])
    try:
        meter = loadtest.CpuMeter(parent.pid)
        meter.start()
        time.sleep(2.5)  # the machine's CPU-s below: at least 2 cores x 2.5 s
        deadline = time.monotonic() + 100
        while not burnt.exists() and time.monotonic() < deadline:  # however long a busy machine makes the 0.6 CPU-s
            time.sleep(0.1)
        use = meter.stop()
    finally:
        for child in loadtest.meters._children(parent.pid):
            os.kill(child, 9)
        parent.kill()
        parent.wait()
    assert 0.5 <= use["server_cpu_s"] <= 1.5, use
    assert use["clients_cpu_s"] < 0.3, use  # this process slept
    assert use["busy_cpu_s"] >= 0.5 and use["machine_cpu_s"] >= 2.0, use


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux's")
def test_load_test_reports_what_the_servers_in_memory_files_hold_besides_its_rss():
    """The export's scratch files (memfd, written, not mapped) are memory VmRSS leaves out: the load test adds
    them up for the server and its children, here a child holding 24 MB in one."""
    import subprocess
    import sys

    hold = ("import os, sys, time\nfd = os.memfd_create('scratch')\nos.write(fd, b'x' * (24 << 20))\n"
            "print('ready', flush=True)\ntime.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\n"
                               f"subprocess.run([sys.executable, '-c', {hold!r}])"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        sampler = loadtest.RssSampler(parent.pid)
        sampler.sample()
    finally:
        for child in loadtest.meters._children(parent.pid):
            os.kill(child, 9)
        parent.kill()
        parent.wait()
    assert 24 <= sampler.memfd_peak_mb < 25, sampler.memfd_peak_mb
    assert sampler.peak_mb > 0


def test_protocol_client_reports_what_the_run_showed(tiny_env, tmp_path, reference):
    """tools/loadtest/client.py against a live server: widgets by key, texts, a refused widget key."""
    from tools.loadtest.client import StreamlitSession

    proc, url = loadtest.start_server(TEST_TINY, False, tmp_path / "streamlit.log")
    try:
        page = StreamlitSession(url, timeout=60)
        first = page.open()
        assert not first.exceptions and first.media and first.media_bytes > 0
        assert {"upload", "model", "view", "dl_npz"} <= set(page.widget_ids)
        name, data = loadtest.session_image(7, 1)
        shown = page.upload("upload", name, data)
        assert any(f"image **{name}**" in t for t in shown.texts), shown.texts
        page.set("view", "Attention")
        assert page.fragments["layer"]  # the attention controls live in a fragment: reruns are the fragment's
        run = page.set("head", "head 2")
        assert any("head 2" in t for t in run.texts) and not run.exceptions
        assert loadtest.compare(reference, data, page.download("dl_npz")) == []  # the export of this image
        with pytest.raises(KeyError, match="no widget"):
            page.set("no_such_widget", 1)
        page.close()
    finally:
        loadtest.stop_server(proc)


# ----------------------------------------------------------------------------------------------
# Hostile and odd files, through the app


@pytest.fixture(scope="module")
def hostile():
    return corpus()


def test_every_odd_file_is_analysed_correctly_or_refused_with_a_sentence(tiny_env, runtime, hostile):
    at = run_app(view="Pipeline")
    name, data = loadtest.session_image(7, 0)
    upload(at, name, data)
    previous_name, previous_crop = name, npz(at, runtime)["input_image"]
    for case in hostile:
        upload(at, case.filename, case.data)
        errors = [e.value for e in at.error]
        if case.refused:
            assert len(errors) == 1 and errors[0].startswith(f"{case.filename}: "), (case.id, errors)
            assert re.search(case.refused, errors[0]), (case.id, errors[0])
            assert f"image **{previous_name}**" in header(at), case.id  # the previous image is still shown
            assert any(f"Still showing {previous_name}" in c.value for c in at.caption), case.id
            np.testing.assert_array_equal(npz(at, runtime)["input_image"], previous_crop, err_msg=case.id)
        else:
            assert not errors, (case.id, errors)
            assert f"image **{case.filename}**" in header(at), case.id
            crop = npz(at, runtime)["input_image"]
            assert crop.shape == (224, 224, 3), case.id
            case.crop(crop)
            if case.note:
                assert any(case.note in c.value for c in at.caption), (case.id, [c.value for c in at.caption])
            previous_name, previous_crop = case.filename, crop
        for view in ("Patches", "Pipeline"):  # the session goes on working
            at.session_state[session.K_VIEW] = view
            at.run()
            assert_healthy(at)
            assert at.get("image"), (case.id, view)


def test_uploads_are_capped_and_the_cap_is_told(tiny_env, runtime):
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] == MAX_WEIGHTS_MB  # the server's own limit (HTTP 413)
    assert config["server"]["enableXsrfProtection"] is True and config["server"]["headless"] is True
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["showErrorDetails"] in ("type", "none")

    at = run_app()
    uploader = at.file_uploader(key=session.K_UPLOAD)
    assert uploader.proto.max_upload_size_mb == MAX_IMAGE_MB  # the browser refuses bigger files
    assert f"{MAX_IMAGE_MB} MB" in uploader.proto.label and f"{MAX_IMAGE_MB} MB" in uploader.proto.help
    before = header(at)
    # a client that ignores the widget's cap: the app refuses the bytes itself
    upload(at, "huge.jpg", b"\xff\xd8\xff" + b"\0" * (MAX_IMAGE_MB * 2**20 + 10))
    assert any("limited to 25 MB" in e.value for e in at.error), [e.value for e in at.error]
    assert header(at) == before


# ----------------------------------------------------------------------------------------------
# Weights files, through the app


def tiny_weights(num_classes: int = 1000, arch: str = "vit_tiny_patch16_224", **kwargs) -> dict[str, torch.Tensor]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=num_classes, **kwargs)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def fallback_name() -> str:
    return TEACHING_MODEL if teaching_model_available() else "vit_tiny_patch16_224"


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def safetensors_bytes(tensors: dict[str, torch.Tensor], tmp_path: Path) -> bytes:
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    return path.read_bytes()


def test_weights_that_must_be_refused_are_refused_with_the_reason(tiny_env, runtime, tmp_path):
    marker = tmp_path / "pwned"
    evil = io.BytesIO()
    torch.save({"head.weight": torch.zeros(2, 2), "payload": _RunsCode(marker)}, evil)
    tiny = safetensors_bytes(tiny_weights(depth=2), tmp_path)
    cases = [
        ("wrong architecture", "vit_small_patch16_224", "tiny.safetensors", tiny, "does not fit vit_small_patch16_224.*mismatch"),
        ("truncated", "vit_small_patch16_224", "cut.safetensors", tiny[: len(tiny) // 3], "not a valid safetensors file"),
        ("pickle that runs code", "vit_small_patch16_224", "evil.pth", evil.getvalue(), "refused.*Python objects"),
    ]
    for what, arch, name, data, reason in cases:
        at = run_app()
        model_before = header(at).split("Model **")[1].split("**")[0]
        choose_weights(at, arch, name, data)
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and "can't be loaded" in errors[0], (what, errors)
        assert re.search(reason, errors[0]), (what, errors[0])
        assert f"Model **{model_before}**" in header(at), what  # the session keeps the model it had
        for view in ("Attention", "Prediction"):
            at.session_state[session.K_VIEW] = view
            at.run()
            assert_healthy(at)
    assert not marker.exists()  # the pickle's code never ran


def test_a_label_file_with_the_wrong_class_count_is_refused(tiny_env, runtime, tmp_path):
    weights = safetensors_bytes(tiny_weights(num_classes=10, arch="vit_small_patch16_224"), tmp_path)
    at = run_app()
    choose_weights(at, "vit_small_patch16_224", "ft.safetensors", weights)
    assert not at.error, [e.value for e in at.error]
    assert "ft.safetensors" in header(at) and "vit_small_patch16_224" in header(at)  # the weights alone are fine
    choose_weights(at, "vit_small_patch16_224", "ft.safetensors", weights, labels=("names.txt", b"cat\ndog\nbird\n"))
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "3 classes but the model's head has 10" in errors[0], errors


# ----------------------------------------------------------------------------------------------
# No network: real server, real browser, timed from the first page load


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=loadtest.CHROMIUM_ARGS)
        yield launched
        launched.close()


def no_network_env(hf_home: Path) -> dict[str, str]:
    """A hub that can't be reached: its address refuses connections (as with no network at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=f"http://127.0.0.1:{loadtest.free_port()}")
    return env


def open_and_time(browser, url: str, shown: str, screenshot: str) -> tuple[float, float, str]:
    """Seconds from page load until `shown` is on the page, and until the page is fully rendered
    (screenshot in tests/artifacts/)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        started = time.perf_counter()
        page.goto(url)
        page.get_by_text(shown, exact=False).first.wait_for(timeout=60_000)
        message_s = time.perf_counter() - started
        page.wait_for_selector('[data-testid="stFileUploaderDropzoneInput"]', state="attached", timeout=60_000)
        page.wait_for_function(loadtest.APP_IDLE, timeout=60_000, polling=50)
        rendered_s = time.perf_counter() - started
        assert page.locator('[data-testid="stException"]').count() == 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
        return message_s, rendered_s, page.locator('[data-testid="stApp"]').inner_text()
    finally:
        page.close()


@needs_chromium
def test_no_network_shows_the_bundled_model_and_says_why_within_5_s(browser, tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("HF_")]:
        monkeypatch.delenv(key)
    proc, url = loadtest.start_server("vit_base_patch16_224", False, tmp_path / "streamlit.log",
                                      extra_env=no_network_env(tmp_path / "hf"))
    try:
        # A calm note (the reason behind its "Why?"); loud only where the bundled model is missing too.
        said = "Offline: using the bundled Shapes ViT" if teaching_model_available() else "You are offline"
        message_s, rendered_s, text = open_and_time(browser, url, said, "offline_start.png")
    finally:
        loadtest.stop_server(proc)
    print(f"offline: reason shown {message_s:.1f} s, page rendered {rendered_s:.1f} s after the page load")
    assert message_s < 5, f"the reason took {message_s:.1f} s"
    assert "Why?" in text if teaching_model_available() else "can't be reached" in text and "HF_HOME" in text
    assert f"Model {fallback_name()}" in text
    assert rendered_s < 30, rendered_s


@needs_chromium
def test_no_network_with_a_populated_hub_cache_uses_the_cached_weights(browser, tmp_path, monkeypatch):
    from unit.test_loading import HUB_ID, populate_hub_cache

    for key in [k for k in os.environ if k.startswith("HF_")]:
        monkeypatch.delenv(key)
    populate_hub_cache(tmp_path / "hf")
    proc, url = loadtest.start_server("vit_tiny_patch16_224", False, tmp_path / "streamlit.log",
                                      extra_env=no_network_env(tmp_path / "hf"))
    try:
        message_s, rendered_s, text = open_and_time(browser, url, f"hub cache: {HUB_ID}", "offline_hub_cache.png")
    finally:
        loadtest.stop_server(proc)
    print(f"hub cache: weights shown {message_s:.1f} s, page rendered {rendered_s:.1f} s after the page load")
    assert "offline" not in text.lower() and "RANDOM weights" not in text
    assert "Model vit_tiny_patch16_224" in text
    assert message_s < 15 and rendered_s < 30, (message_s, rendered_s)


@needs_chromium
def test_the_benchmark_drives_one_browser_session_through_the_load_test(capsys):
    """tools/benchmarks/benchmark.py's browser section reuses the load test's session driver: a change of that driver's
    signature must not leave the benchmark broken (it did once: only this catches it)."""
    import math
    from concurrent.futures import ThreadPoolExecutor

    from tools.benchmarks import benchmark

    # on a thread of its own: a module-scoped Playwright page of another test may hold an event loop on this one
    with ThreadPoolExecutor(1) as thread:
        figures = thread.submit(benchmark.browser, TEST_TINY, 1, 1).result()
    assert "browser errors" not in capsys.readouterr().out
    assert all(math.isfinite(figures[k]) and figures[k] > 0 for k in ("cold start", "new image", "control change"))
