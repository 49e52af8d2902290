"""The one place in the dashboard that uses Streamlit's private API.

Streamlit's internals change between versions without notice, so every use here is checked against the minor
version it was written and tested for (`PINNED_MINOR`, as pyproject.toml pins `streamlit==1.67.*`): on another
version a patch is skipped with one logged warning and Streamlit's own behaviour stays (`shelve_made_downloads`).
The tests' own uses of Streamlit's internals (a runtime shared by AppTests, a download's bytes) live in
tests/support/shared_runtime.py, behind the same check (`checked`).

Nothing else in the dashboard imports from `streamlit.runtime`, `streamlit.components` or AppTest's own module
(tests/unit/test_dashboard_parts.py checks it).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import streamlit

from dashboard.server import jobs

_logger = logging.getLogger(__name__)

PINNED_MINOR = "1.67."


def checked(version: str | None = None) -> bool:
    """Whether `version` (default: the installed Streamlit's) is the minor version the internals here were checked on."""
    return (streamlit.__version__ if version is None else version).startswith(PINNED_MINOR)


# Streamlit (1.67) drops a file a download button made on click at the second sweep of unreferenced files after it
# was made, and every script run of any session ends with such a sweep: in a class, two of them can come before the
# browser's fetch of the file, which then fails (HTTP 404). Kept for a few seconds at least, the fetch finds it; the
# cost is the exports made in those seconds (docs/performance.md, "The download grace"). Streamlit has
# no setting for it.
MADE_DOWNLOAD_GRACE_S = 5.0

@functools.cache
def shelve_made_downloads() -> bool:
    """Once per process: a sweep drops a file made for a download only once it is MADE_DOWNLOAD_GRACE_S old (and
    unreferenced, as before). Media files (figures) are dropped as before, at the first sweep that finds them
    unreferenced. Replaces streamlit.runtime.media_file_manager.MediaFileMetadata, which that module builds for each
    file it stores, by a subclass that knows when it was made.

    On a Streamlit other than PINNED_MINOR: one warning in the log, nothing patched (Streamlit's own sweep).
    Returns whether the patch is in place."""
    if not checked():
        _logger.warning("Streamlit %s is not %sx: made downloads are swept as Streamlit does (a late fetch may fail); "
                        "the patch that keeps them %.0f s was checked on %sx only",
                        streamlit.__version__, PINNED_MINOR, MADE_DOWNLOAD_GRACE_S, PINNED_MINOR)
        return False
    from streamlit.runtime import media_file_manager

    class MadeAtMetadata(media_file_manager.MediaFileMetadata):
        def __init__(self, kind: media_file_manager.MediaFileKind = media_file_manager.MediaFileKind.MEDIA) -> None:
            super().__init__(kind)
            self._made_at = time.monotonic()

        @property
        def is_marked_for_delete(self) -> bool:  # read by the sweep for downloadable files only
            return self._is_marked_for_delete and time.monotonic() - self._made_at >= MADE_DOWNLOAD_GRACE_S

    media_file_manager.MediaFileMetadata = MadeAtMetadata
    return True


# Streamlit (1.67) keeps every file a browser PUTs in memory (MemoryUploadedFileManager), keyed by session and file
# id, until that session is shut down: a session that PUTs files and never runs the script that would read them holds
# them all, and a disconnected session's files stay for its reconnect window (server.disconnectedSessionTTL, 120 s)
# and until some later disconnect sweeps it. A PUT is checked only against server.maxUploadSize, whatever the widget
# it came for says. The bounded manager below refuses (HTTP 413, through the upload handler's own error path) a file
# over the app's cap for its kind or one that would take its session or the server over their byte budgets, and
# forgets a session's files that no uploader ever claimed once a full script run that began after them has drawn the
# whole page, and at once when the session disconnects (what its uploaders hold stays for the reconnect window).
#
# A claim is kept for the file's life: an uploader reads its files (get_files) only when its value comes fresh from
# the browser, and with an on_change callback that is before the script starts (SessionState.on_script_will_rerun);
# later runs reuse the value read then. A file the user replaces or removes is deleted by the browser itself.
UNCLAIMED_GRACE_S = 5.0  # a PUT is claimed by the rerun the browser asks for right after it: milliseconds later

_upload_limits = None  # dashboard.server.uploads.UploadLimits, once installed


@functools.cache
def _bounded_upload_manager() -> type:
    from starlette.exceptions import HTTPException
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager

    class BoundedUploadedFileManager(MemoryUploadedFileManager):
        """MemoryUploadedFileManager with byte budgets and claims (see above); made by `_make_bounded`."""

        def _start_bounding(self) -> None:
            self._bound_lock = threading.RLock()  # around check-and-add and the sweeps; Streamlit's own lock inside
            self._unclaimed: dict[str, dict[str, float]] = {}  # session -> file id -> when it was PUT, until read
            self._running: dict[str, float] = {}  # session -> when its full run under way began

        def held_bytes(self, session_id: str | None = None) -> int:
            with self._lock:
                if session_id is None:
                    return self._total_bytes
                return sum(len(f.data) for f in self.file_storage.get(session_id, {}).values())

        def unclaimed(self, session_id: str) -> list[str]:
            with self._bound_lock:
                return sorted(self._unclaimed.get(session_id, {}))

        def add_file(self, session_id: str, file) -> None:
            limits = _upload_limits
            size = len(file.data)
            with self._bound_lock:
                if limits is not None:
                    cap = limits.file_cap(file.name)
                    if size > cap:
                        raise HTTPException(status_code=413, detail=f"File too large: at most {cap >> 20} MB")
                    with self._lock:
                        held = self.file_storage.get(session_id, {})
                        old = held.get(file.file_id)
                        replaced = len(old.data) if old is not None else 0
                        session_bytes = sum(len(f.data) for f in held.values()) - replaced + size
                        total_bytes = self._total_bytes - replaced + size
                    if session_bytes > limits.session_bytes or total_bytes > limits.total_bytes:
                        _logger.warning("upload refused: session %s would hold %d MiB (budget %d MiB), the server "
                                        "%d MiB (budget %d MiB)", session_id, session_bytes >> 20,
                                        limits.session_bytes >> 20, total_bytes >> 20, limits.total_bytes >> 20)
                        raise HTTPException(status_code=413, detail="Too much uploaded: over the upload budget")
                super().add_file(session_id, file)
                self._unclaimed.setdefault(session_id, {})[file.file_id] = time.monotonic()

        def get_files(self, session_id: str, file_ids):
            files = super().get_files(session_id, file_ids)
            with self._bound_lock:
                waiting = self._unclaimed.get(session_id, {})
                for f in files:
                    waiting.pop(f.file_id, None)
            return files

        def remove_file(self, session_id: str, file_id: str) -> None:
            with self._bound_lock:
                super().remove_file(session_id, file_id)
                self._unclaimed.get(session_id, {}).pop(file_id, None)

        def remove_session_files(self, session_id: str) -> None:
            with self._bound_lock:
                super().remove_session_files(session_id)
                self._unclaimed.pop(session_id, None)
                self._running.pop(session_id, None)

        def remove_unclaimed(self, session_id: str) -> None:
            with self._bound_lock:
                for file_id in list(self._unclaimed.get(session_id, {})):
                    self.remove_file(session_id, file_id)

        def run_started(self, session_id: str) -> None:
            with self._bound_lock:
                self._running[session_id] = time.monotonic()

        def run_finished(self, session_id: str, completed: bool) -> None:
            """A full run of the session ended; `completed`: it drew the whole page, so every uploader on it has had
            its browser's files: one PUT before the run began (less the grace) and still unclaimed is not wanted."""
            with self._bound_lock:
                started = self._running.pop(session_id, None)
                if not completed or started is None:
                    return
                before = started - UNCLAIMED_GRACE_S
                for file_id, added in list(self._unclaimed.get(session_id, {}).items()):
                    if added < before:
                        self.remove_file(session_id, file_id)

    return BoundedUploadedFileManager


def _make_bounded(manager: object) -> object:
    """`manager` (Streamlit's MemoryUploadedFileManager) turned into the bounded one in place: the upload routes
    and every session hold this very object."""
    bounded = _bounded_upload_manager()
    if not isinstance(manager, bounded):
        manager.__class__ = bounded
        manager._start_bounding()
    return manager


def install_upload_budget(limits) -> bool:
    """Once per process, before or after the server has started: every PUT held to `limits`
    (dashboard.server.uploads.UploadLimits) and unclaimed files forgotten (see above; at a disconnect:
    `install_disconnect_hook`). If the server is already running (`streamlit run dashboard/app.py`: the app's first run
    calls this), its upload cap (server.maxUploadSize) is lowered to `limits.server_mb` unless a command-line flag or
    STREAMLIT_ variable set it; before (`dashboard.serve`) the serve command passes that cap as a flag.

    On a Streamlit other than PINNED_MINOR: one warning, nothing patched. Returns whether it is in place."""
    global _upload_limits
    if not checked():
        _logger.warning("Streamlit %s is not %sx: uploads are held as Streamlit does (no per-session budget)",
                        streamlit.__version__, PINNED_MINOR)
        return False
    from streamlit import config
    from streamlit.runtime import Runtime
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
    from streamlit.web.server import server as server_module

    _upload_limits = limits
    bounded = _bounded_upload_manager()

    class BoundedServerUploads(bounded):  # what a server built from now on makes
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._start_bounding()

    server_module.MemoryUploadedFileManager = BoundedServerUploads
    if Runtime.exists():
        manager = Runtime.instance().uploaded_file_mgr
        if isinstance(manager, MemoryUploadedFileManager):  # a real server, not AppTest's stand-in
            _make_bounded(manager)
            if (config.get_where_defined("server.maxUploadSize") != config._DEFINED_BY_FLAG
                    and config.get_option("server.maxUploadSize") > limits.server_mb):
                config.set_option("server.maxUploadSize", limits.server_mb)
    return True


def install_disconnect_hook() -> bool:
    """Once per process: when a session's browser disconnects, not when its reconnect window closes, its explanation
    job stops (dashboard.server.jobs: nobody is there to see it) and its unclaimed uploads go; the files its uploaders
    hold stay for that window (a student's wifi that drops for a moment keeps the photo). On a Streamlit other than
    PINNED_MINOR nothing is patched. Returns whether it is in place."""
    if not checked():
        return False
    from streamlit.runtime import runtime as runtime_module

    runtime_class = runtime_module.Runtime
    if getattr(runtime_class.disconnect_session, "_vit_lens_hook", False):
        return True
    original = runtime_class.disconnect_session

    def disconnect_session(self, session_id: str, *, client=None) -> None:
        original(self, session_id, client=client)
        if not self.is_active_session(session_id):
            jobs.stop_session_job(session_id)
            if hasattr(self.uploaded_file_mgr, "remove_unclaimed"):
                self.uploaded_file_mgr.remove_unclaimed(session_id)

    disconnect_session._vit_lens_hook = True
    runtime_class.disconnect_session = disconnect_session
    return True


def current_session_id() -> str | None:
    """The id of the session whose script run calls this, or None outside one (a test's bare script, the CLI)."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    return None if ctx is None else ctx.session_id


def _session_uploads() -> tuple[object, str] | None:
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not hasattr(ctx.uploaded_file_mgr, "run_started"):
        return None
    return ctx.uploaded_file_mgr, ctx.session_id


def upload_run_started() -> None:
    """At the start of a full script run of the app (process.serving): its uploaders' claims are counted afresh."""
    found = _session_uploads()
    if found is not None:
        found[0].run_started(found[1])


def upload_run_finished(completed: bool) -> None:
    """At the end of that run; `completed`: it drew the whole page, so the files it left unclaimed go."""
    found = _session_uploads()
    if found is not None:
        found[0].run_finished(found[1], completed)


# Streamlit's frontend (1.67) finds its server by trying the page's own path first: opened at /lesson, it asks
# /lesson/_stcore/health and /lesson/_stcore/host-config (both 404 by design: a page is not a base path), then the
# parent, "/", which answers. It does that because it can't tell a page's path from a base URL under a proxy; it reads
# the answer from `window.__streamlit.BACKEND_BASE_URL` when the page defines it. Every page of the app is then served
# with that set to the server's own base (server.baseUrlPath), and the browser asks only there: an offline class's
# console stays clean. Streamlit has no setting for it.
def index_html_with_backend_base(html: str, base_url_path: str) -> str:
    """Streamlit's index.html with `window.__streamlit.BACKEND_BASE_URL` set to the server's base, before its scripts."""
    base = "/" + base_url_path.strip("/") + "/" if base_url_path.strip("/") else "/"
    script = ("<script>window.__streamlit = Object.assign(window.__streamlit || {}, "
              f"{{BACKEND_BASE_URL: new URL({base!r}, window.location.origin).href}});</script>")
    return html.replace("<head>", "<head>" + script, 1)


@functools.cache
def serve_pages_with_backend_base() -> bool:
    """Once per process, before Streamlit builds its server: index.html (every page's HTML) is served with the
    server's base set (`index_html_with_backend_base`). Returns whether the patch is in place (on a Streamlit other than
    PINNED_MINOR: one warning, nothing patched). `streamlit run dashboard/app.py` builds its server before the app's
    first run, so there Streamlit's own probe stays; `vit-lens dashboard` (dashboard.serve) patches first."""
    if not checked():
        _logger.warning("Streamlit %s is not %sx: its pages probe their own path for the server first (two 404s in "
                        "the browser's console on /lesson)", streamlit.__version__, PINNED_MINOR)
        return False
    from pathlib import Path

    from starlette.responses import FileResponse, HTMLResponse
    from streamlit import config
    from streamlit.web.server.starlette import starlette_static_routes as routes

    make_handler = routes.create_streamlit_static_handler

    def handler_with_backend_base(directory: str, base_url: str | None):
        handler = make_handler(directory=directory, base_url=base_url)
        index = Path(directory) / "index.html"
        html = index_html_with_backend_base(index.read_text(encoding="utf-8"),
                                            config.get_option("server.baseUrlPath") or "")
        get_response = handler.get_response

        async def get_response_with_base(path, scope):
            response = await get_response(path, scope)
            if isinstance(response, FileResponse) and Path(response.path) == index:
                headers = {k: v for k, v in response.headers.items()
                           if k.lower() not in ("content-length", "content-type", "etag", "last-modified")}
                return HTMLResponse(html, status_code=response.status_code, headers=headers)
            return response

        handler.get_response = get_response_with_base
        return handler

    routes.create_streamlit_static_handler = handler_with_backend_base
    return True
