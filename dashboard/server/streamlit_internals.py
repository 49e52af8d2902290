"""The one place that uses Streamlit's private API: for the server, and for the tests.

Streamlit's internals change between versions without notice, so every use here is checked against the minor
version they were written and tested for (`PINNED_MINOR`, as pyproject.toml pins `streamlit==1.67.*`):
- in the server, on another version, a patch is skipped with one logged warning and Streamlit's own behaviour
  stays (`keep_made_downloads_for_a_while`);
- in the tests, `unchecked_reason` (or the `UncheckedStreamlit` raised) says why, and the test skips with that
  reason (`compiles_take_turns`, `shared_apptest_runtime`, `download_bytes`).

Nothing else in the dashboard or the tests imports from `streamlit.runtime`, `streamlit.components` or
AppTest's own module (tests/unit/test_structure.py checks it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import streamlit

_logger = logging.getLogger(__name__)

PINNED_MINOR = "1.67."


class UncheckedStreamlit(RuntimeError):
    """This Streamlit is not the version a use of its internals was checked on (the message says which)."""


def checked(version: str | None = None) -> bool:
    """Whether `version` (default: the installed Streamlit's) is the minor version the internals here were checked on."""
    return (streamlit.__version__ if version is None else version).startswith(PINNED_MINOR)


def unchecked_reason(what: str) -> str | None:
    """Why `what` can't use Streamlit's internals here (a sentence for a test's skip), or None on the pinned version."""
    if checked():
        return None
    return f"{what} uses Streamlit internals checked on {PINNED_MINOR}x only; this is Streamlit {streamlit.__version__}"


def _require(what: str) -> None:
    reason = unchecked_reason(what)
    if reason is not None:
        raise UncheckedStreamlit(reason)


# ----------------------------------------------------------------------------------------------
# The server

# Streamlit (1.67) drops a file a download button made on click at the second sweep of unreferenced files after it
# was made, and every script run of any session ends with such a sweep: in a class, two of them can come before the
# browser's fetch of the file, which then fails (HTTP 404). Kept for a few seconds at least, the fetch finds it; the
# cost is the exports made in those seconds (docs/performance.md, "The download grace"). Streamlit has
# no setting for it.
MADE_DOWNLOAD_GRACE_S = 5.0

@functools.cache
def keep_made_downloads_for_a_while() -> bool:
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


# ----------------------------------------------------------------------------------------------
# The tests


def compiles_take_turns() -> None:
    """AppTest compiles the app script on every run, each time with a new ScriptCache; the server compiles it
    once, under its one cache's lock. CPython 3.11 can fail when two threads compile at once ("SystemError:
    AST constructor recursion depth mismatch", seen in the tests that run sessions in threads), so in tests
    the compiles take turns, as they do in the server. Raises UncheckedStreamlit on another version."""
    _require("compiles_take_turns")
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    if getattr(ScriptCache.get_bytecode, "takes_turns", False):
        return
    lock, compile_script = threading.Lock(), ScriptCache.get_bytecode

    def get_bytecode(self, script_path):
        with lock:
            return compile_script(self, script_path)

    get_bytecode.takes_turns = True
    ScriptCache.get_bytecode = get_bytecode


class _SharedRuntime:
    """Stands in for `Runtime` inside AppTest: its `_instance` is left as set below, for every run."""

    _instance = None


def _own_session_runner(base):
    """AppTest's script runner, with a session id of its own per AppTest."""

    class OwnSessionRunner(base):
        def __init__(self, script_path, session_state, *args, **kwargs):
            super().__init__(script_path, session_state, *args, **kwargs)
            self._session_id = f"session-{id(session_state)}"

    return OwnSessionRunner


@contextlib.contextmanager
def shared_apptest_runtime() -> Iterator[Any]:
    """One Streamlit runtime shared by every AppTest started inside, so sessions can run in parallel threads.

    AppTest's public API runs one session at a time; each `run()` installs a mock `Runtime` globally and removes
    it afterwards, so with sessions in threads one run would pull the runtime from under another, and every
    AppTest gets the same session id, so one session's rerun would revoke another's download buttons. Here one
    runtime (a MagicMock with a real media-file manager and cache storage) stays for every run, and each AppTest
    gets a session id of its own. Yields the runtime (for `download_bytes`). Raises UncheckedStreamlit on another
    version."""
    _require("the shared AppTest runtime")
    from unittest.mock import MagicMock

    import streamlit.testing.v1.app_test as app_test_module
    from streamlit import config
    from streamlit.components.v2.component_manager import BidiComponentManager
    from streamlit.runtime import Runtime
    from streamlit.runtime.caching.storage.dummy_cache_storage import MemoryCacheStorageManager
    from streamlit.runtime.dataframe_source_manager import DataframeSourceManager
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    shared = MagicMock(spec=Runtime)
    shared.storage = MemoryMediaFileStorage("/mock/media")
    shared.media_file_mgr = MediaFileManager(shared.storage)
    shared.dataframe_source_mgr = DataframeSourceManager()
    shared.cache_storage_manager = MemoryCacheStorageManager()
    components = BidiComponentManager()
    components.discover_and_register_components(start_file_watching=False)
    shared.bidi_component_registry = components
    saved = (Runtime._instance, app_test_module.Runtime, app_test_module.patch_config_options,
             app_test_module.LocalScriptRunner, config.get_option("global.appTest"))
    Runtime._instance = shared
    app_test_module.Runtime = _SharedRuntime
    app_test_module.LocalScriptRunner = _own_session_runner(app_test_module.LocalScriptRunner)
    app_test_module.patch_config_options = lambda options: contextlib.nullcontext()  # set once, below
    config.set_option("global.appTest", True)
    try:
        yield shared
    finally:
        (Runtime._instance, app_test_module.Runtime, app_test_module.patch_config_options,
         app_test_module.LocalScriptRunner, app_test_flag) = saved
        config.set_option("global.appTest", app_test_flag)


def download_bytes(runtime: Any, button_proto: Any) -> bytes:
    """The bytes of a download button (its proto, as AppTest shows it) in `shared_apptest_runtime`'s runtime;
    one made on click (deferred) is made now."""
    _require("download_bytes")
    if button_proto.deferred_file_id:
        url = runtime.media_file_mgr.execute_deferred(button_proto.deferred_file_id)
    else:
        url = button_proto.url
    return runtime.storage.get_file(url.rsplit("/", 1)[-1]).content
