"""A Streamlit session without a browser: the messages a page sends and the files it fetches, nothing drawn.

`StreamlitSession` speaks Streamlit's own protocol (the version pyproject.toml pins, 1.67) to a
running app, as the browser's page does:
  * one websocket to ``/_stcore/stream``; every rerun is a ``BackMsg.rerun_script`` carrying the
    widget states the page would send (and the fragment id when the widget lives in a fragment);
  * an upload is a ``file_urls_request``, an HTTP PUT of the file (with the XSRF token the health
    check set as a cookie), then a rerun with the uploader's new state;
  * a download button's file is asked for with a ``backend_operation_request`` and fetched over HTTP;
  * after every run it fetches each ``/media/...`` file the run referenced (images, figures), as a
    page loads its pictures.
It keeps what each run showed (texts, exceptions, widgets by key) so a caller can check it, and
measures nothing itself. Thirty of these take a tenth of a 2-core machine (tools/loadtest reports
how much), so a load test on one small machine measures the server, not thirty renderers competing with
it for the CPU.

Widgets are found by their key: Streamlit's element id for a keyed widget ends in ``-<key>``.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from urllib.parse import urlencode

import requests
from google.protobuf.message import Message
from streamlit.proto.Alert_pb2 import Alert
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.sync.client import connect

XSRF_COOKIE = "_streamlit_xsrf"
DONE = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY)
DOWNLOAD_ATTEMPTS = 3  # a made download dropped before its fetch (a Streamlit 1.67 race, see download) is asked for again


class ProtocolError(RuntimeError):
    """The app answered something a page would not expect (a compile error, a refused upload...)."""


@dataclass
class Run:
    """What one script run sent: its texts (markdown, captions, alerts), exceptions and media files."""

    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the bodies of st.error alerts (also in texts)
    exceptions: list[str] = field(default_factory=list)
    media: list[str] = field(default_factory=list)  # "/media/..." paths, fetched after the run
    media_bytes: int = 0


def _media_paths(msg: Message, found: list[str]) -> None:
    """Every string field of a protobuf message (recursively) that names a media file."""
    for desc, value in msg.ListFields():
        values = value if desc.is_repeated else [value]
        for v in values:
            if isinstance(v, Message):
                _media_paths(v, found)
            elif isinstance(v, str) and v.startswith("/media/"):
                found.append(v)


def _texts(element: Message) -> list[str]:
    kind = element.WhichOneof("type")
    if kind in ("markdown", "heading", "text", "alert"):
        return [getattr(element, kind).body]
    if kind == "imgs":
        return [img.caption for img in element.imgs.imgs if img.caption]
    return []


class StreamlitSession:
    """One page's session with the app at ``url`` (http://host:port, loopback in the load test)."""

    def __init__(self, url: str, timeout: float = 120):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.http = requests.Session()
        self.http.get(f"{self.url}/_stcore/health", timeout=timeout).raise_for_status()  # sets the XSRF cookie
        self._closing = ExitStack()
        self.ws = self._closing.enter_context(connect("ws" + self.url[len("http"):] + "/_stcore/stream",
                                                      subprotocols=["streamlit"], origin=self.url, max_size=None,
                                                      open_timeout=timeout))
        self.session_id = ""
        self.widget_ids: dict[str, str] = {}  # widget key -> element id
        self.fragments: dict[str, str] = {}  # widget key -> id of the fragment it was drawn in ("" = none)
        self.elements: dict[str, Message] = {}  # widget key -> its element proto, as last drawn
        self.states: dict[str, WidgetState] = {}  # widget key -> the state this page reports
        self.query: dict[str, str] = {}  # bound query parameters the page's URL carries
        self.page_name = ""  # the app's page (st.navigation's url_path); "" is its default page
        self.progress_text = ""  # the text of the last progress bar drawn, as the page shows it while a run goes on
        self.responses: dict[str, ForwardMsg] = {}  # request id -> file_urls / backend operation response
        self.retries: list[str] = []  # what was tried twice, and why (see _http and download)

    def _http(self, method: str, path: str, **kwargs) -> requests.Response:
        """One HTTP request, sent again once if the connection breaks, as a browser does when the server has
        just closed the idle keep-alive connection the request went out on. Retries are listed in ``retries``."""
        try:
            return self.http.request(method, self.url + path, timeout=self.timeout, **kwargs)
        except requests.ConnectionError as e:
            self.retries.append(f"{method} {path}: {type(e).__name__}, sent again")
            return self.http.request(method, self.url + path, timeout=self.timeout, **kwargs)

    def close(self) -> None:
        self._closing.close()
        self.http.close()

    # -------------------------------------------------------------------------------- messages

    def _send(self, msg: BackMsg) -> None:
        self.ws.send(msg.SerializeToString())

    def _receive(self, deadline: float, run: Run | None = None) -> ForwardMsg:
        """The next message; deltas are filed into ``run`` (and the widget table) on the way."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer from {self.url} within {self.timeout:.0f} s")
        msg = ForwardMsg()
        msg.ParseFromString(self.ws.recv(timeout=left))
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self.session_id = msg.new_session.initialize.session_id or self.session_id
        elif kind == "delta" and msg.delta.WhichOneof("type") in ("new_element", "add_block"):
            self._file_element(getattr(msg.delta, msg.delta.WhichOneof("type")), msg.delta.fragment_id, run)
        elif kind == "file_urls_response":
            self.responses[msg.file_urls_response.response_id] = msg
        elif kind == "backend_operation_response":
            self.responses[msg.backend_operation_response.request_id] = msg
        elif kind == "ref_hash":  # only sent to pages that report cached messages, which this one never does
            raise ProtocolError("the server referred to a cached message this page never had")
        return msg

    def _file_element(self, element: Message, fragment_id: str, run: Run | None) -> None:
        """Note a widget (an element, or a block such as tabs) by its key, and what the run showed."""
        kind = element.WhichOneof("type")
        widget = getattr(element, kind) if kind else None
        element_id = getattr(widget, "id", "") if widget is not None else ""
        if element_id.startswith("$$ID-"):
            key = element_id.rsplit("-", 1)[1]
            self.widget_ids[key], self.fragments[key], self.elements[key] = element_id, fragment_id, widget
        if kind == "progress":
            self.progress_text = element.progress.text
        if run is not None:
            run.texts += _texts(element)
            if kind == "alert" and element.alert.format == Alert.ERROR:
                run.errors.append(element.alert.body)
            if kind == "exception":
                run.exceptions.append(f"{element.exception.type}: {element.exception.message}")
            _media_paths(element, run.media)

    def _rerun(self, fragment_id: str = "") -> Run:
        """Send the page's state, wait for the run to finish, fetch its media; returns what it showed."""
        msg = BackMsg()
        client = msg.rerun_script
        client.query_string = urlencode(self.query)
        client.widget_states.widgets.extend(self.states.values())
        client.fragment_id = fragment_id
        client.page_name = self.page_name
        client.context_info.timezone = "UTC"
        client.context_info.locale = "en-US"
        client.context_info.url = self.url + "/"
        self._send(msg)
        return self._finish_run()

    def _finish_run(self) -> Run:
        run = Run()
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._receive(deadline, run)
            if msg.WhichOneof("type") != "script_finished":
                continue
            if msg.script_finished == ForwardMsg.FINISHED_WITH_COMPILE_ERROR:
                raise ProtocolError("the app's script did not compile")
            if msg.script_finished in DONE:  # FINISHED_EARLY_FOR_RERUN: another run follows
                break
        for path in dict.fromkeys(run.media):  # as a page loads its pictures, each once
            response = self._http("GET", path)
            response.raise_for_status()
            run.media_bytes += len(response.content)
        return run

    def _await_response(self, request_id: str) -> ForwardMsg:
        deadline = time.monotonic() + self.timeout
        while request_id not in self.responses:
            self._receive(deadline)
        return self.responses.pop(request_id)

    # -------------------------------------------------------------------------------- what a user does

    def open(self) -> Run:
        """The first page load: a rerun with no widget state."""
        return self._rerun()

    def set(self, key: str, value: str | int | float | bool | dict, query_value: str | None = None) -> Run:
        """Choose ``value`` in the widget with ``key`` (select box / tabs: the option's text; slider: a number;
        a custom component (components v2, e.g. the Draw canvas): its state, a dict sent as JSON, as its frontend
        sends it).

        The rerun is the fragment's own when the widget lives in a fragment, as in a browser. Widgets bound to
        the URL (``bind="query-params"``) also put ``query_value`` (default: str(value)) in the page's query.
        """
        if key not in self.widget_ids:
            raise KeyError(f"no widget with key {key!r} on the page; known: {sorted(self.widget_ids)}")
        state = WidgetState(id=self.widget_ids[key])
        if isinstance(value, dict):
            state.json_value = json.dumps(value)
        elif isinstance(value, bool):
            state.bool_value = value
        elif isinstance(value, (int, float)):
            state.double_array_value.data.append(float(value))
        else:
            state.string_value = value
        self.states[key] = state
        if getattr(self.elements[key], "query_param_key", ""):
            self.query[self.elements[key].query_param_key] = str(value) if query_value is None else query_value
        return self._rerun(self.fragments[key])

    def click(self, key: str) -> Run:
        """Press the button with ``key``: one run with its trigger set, as a page sends it (not sent again after)."""
        if key not in self.widget_ids:
            raise KeyError(f"no button with key {key!r} on the page; known: {sorted(self.widget_ids)}")
        self.states[key] = WidgetState(id=self.widget_ids[key], trigger_value=True)
        try:
            return self._rerun(self.fragments[key])
        finally:
            self.states.pop(key, None)

    def go_to(self, page_name: str) -> Run:
        """Open another page of the app (its url_path), as its link in the sidebar does."""
        self.page_name = page_name
        return self._rerun()

    def upload(self, key: str, name: str, data: bytes) -> Run:
        """Upload a file into the file uploader with ``key``: ask for URLs, PUT the bytes, rerun."""
        if key not in self.widget_ids:
            raise KeyError(f"no file uploader with key {key!r} on the page")
        msg = BackMsg()
        request_id = str(uuid.uuid4())
        msg.file_urls_request.request_id = request_id
        msg.file_urls_request.file_names.append(name)
        msg.file_urls_request.session_id = self.session_id
        self._send(msg)
        response = self._await_response(request_id).file_urls_response
        if response.error_msg:
            raise ProtocolError(f"upload refused: {response.error_msg}")
        urls = response.file_urls[0]
        put = self._http("PUT", urls.upload_url, files={"file": (name, data)},
                         headers={"X-Xsrftoken": self.http.cookies.get(XSRF_COOKIE, "")})
        if put.status_code >= 400:
            raise ProtocolError(f"upload of {name} refused: HTTP {put.status_code} {put.text[:200]}")
        state = WidgetState(id=self.widget_ids[key])
        info = state.file_uploader_state_value.uploaded_file_info.add()
        info.name, info.size, info.file_id = name, len(data), urls.file_id
        info.file_urls.CopyFrom(urls)
        self.states[key] = state
        return self._rerun(self.fragments[key])

    def download(self, key: str) -> bytes:
        """The file behind the download button with ``key``, as clicking it fetches it.

        A deferred file (made on click) that is gone by the time it is fetched is asked for again, up to
        DOWNLOAD_ATTEMPTS times in all, as a user clicks again: Streamlit (1.67) drops a made file once two
        runs of *any* session have finished since, so under load the fetch can lose that race (each retry is
        listed in ``retries``).
        """
        button = self.elements.get(key)
        if button is None:
            raise KeyError(f"no download button with key {key!r} on the page")
        # streamed, then read in one call: `.content` would gather a 31 MB export in 10 kB pieces in Python
        if button.url:  # an eager file: its URL is in the element
            got = self._http("GET", button.url, stream=True)
        else:
            got = self._http("GET", self._make_deferred(button.deferred_file_id), stream=True)
            for _ in range(DOWNLOAD_ATTEMPTS - 1):
                if got.status_code != 404:
                    break
                got.close()
                self.retries.append(f"download {key}: the made file was already dropped (HTTP 404), asked again")
                got = self._http("GET", self._make_deferred(button.deferred_file_id), stream=True)
        with got:
            got.raise_for_status()
            return got.raw.read(decode_content=True)

    def _make_deferred(self, file_id: str) -> str:
        """Ask the server to run a deferred download's callable; returns the made file's path."""
        msg = BackMsg()
        request_id = str(uuid.uuid4())
        op = msg.backend_operation_request
        op.request_id, op.session_id, op.deferred_file.file_id = request_id, self.session_id, file_id
        self._send(msg)
        response = self._await_response(request_id).backend_operation_response
        if response.error_msg:
            raise ProtocolError(f"download refused: {response.error_msg}")
        return response.deferred_file.url
