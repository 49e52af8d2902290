"""The upload budget on a live server started as the README says for hosting (`streamlit run dashboard/app.py`) or
by `python -m dashboard.serve`:
the app's caps hold (HTTP 413), and a session's uploads that no script run claimed leave the server's memory within
seconds of its next run, and at once when it disconnects. Seen through the server's own metrics
(`/_stcore/metrics`: the UploadedFileManager's bytes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from streamlit.proto.BackMsg_pb2 import BackMsg

from conftest import REPO
from dashboard.image_choice import MAX_IMAGE_MB
from dashboard.server.streamlit_internals import UNCLAIMED_GRACE_S
from tools.loadtest.client import XSRF_COOKIE, StreamlitSession
from tools.loadtest.server import free_port, stop_server, wait_healthy

MB = 2**20


@pytest.fixture(params=["streamlit run", "dashboard.serve"])
def server(request, tmp_path_factory):
    """`streamlit run dashboard/app.py` (the README's hosting command), or `python -m dashboard.serve` (`vit-lens
    dashboard`, tools/dashboard), with weights uploads off (the class server) and the tiny model."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("upload_budget") / "server.log"
    env = {**os.environ, "VIT_LENS_MODEL": "test-tiny", "VIT_LENS_RANDOM_INIT": "1", "VIT_LENS_WEIGHTS_UPLOADS": "off",
           "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        start = ["streamlit", "run", "dashboard/app.py"] if request.param == "streamlit run" else ["dashboard.serve"]
        proc = subprocess.Popen([sys.executable, "-m", *start, "--server.headless",
                                 "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                                 "--browser.gatherUsageStats", "false"],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log_path, 120)
        yield url
    finally:
        stop_server(proc)


def _held_bytes(page: StreamlitSession) -> int:
    text = page.http.get(f"{page.url}/_stcore/metrics", timeout=30).text
    return sum(int(float(m)) for m in re.findall(r'cache_type="UploadedFileManager"[^}]*}\s+([0-9.e+]+)', text))


def _until_held(page: StreamlitSession, expected: int, timeout: float = 15) -> int:
    """The server's held upload bytes once they are `expected` (the metrics are cached up to 5 s)."""
    deadline = time.monotonic() + timeout
    while (held := _held_bytes(page)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    return held


def _put(page: StreamlitSession, name: str, data: bytes) -> int:
    """Ask for an upload URL and PUT `data` to it, never telling any widget (what a hostile page does)."""
    msg = BackMsg()
    msg.file_urls_request.request_id = request_id = str(uuid.uuid4())
    msg.file_urls_request.file_names.append(name)
    msg.file_urls_request.session_id = page.session_id
    page._send(msg)
    urls = page._await_response(request_id).file_urls_response.file_urls[0]
    return page.http.put(page.url + urls.upload_url, files={"file": (name, data)}, timeout=60,
                         headers={"X-Xsrftoken": page.http.cookies.get(XSRF_COOKIE, "")}).status_code


def test_caps_and_unclaimed_uploads_whatever_starts_the_server(server):
    page = StreamlitSession(server)
    try:
        page.open()
        assert _put(page, "big.png", b"x" * (MAX_IMAGE_MB * MB + 1)) == 413  # the page's 25 MB, not config.toml's 400
        assert _put(page, "w.safetensors", b"x" * MB) == 413  # weights uploads are off
        for i in range(3):
            assert _put(page, f"junk{i}.png", b"x" * (4 * MB)) == 204
        assert _until_held(page, 12 * MB) == 12 * MB
        time.sleep(UNCLAIMED_GRACE_S)  # a run beginning within the grace may be the one the browser asked for
        page.open()  # the next run claims none of them
        assert _until_held(page, 0) == 0
        assert _put(page, "junk.png", b"x" * (4 * MB)) == 204
        assert _until_held(page, 4 * MB) == 4 * MB
    finally:
        page.close()
    other = StreamlitSession(server)
    try:
        assert _until_held(other, 0) == 0  # the closed session's upload went with it, not 120 s later
    finally:
        other.close()
