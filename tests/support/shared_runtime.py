"""Streamlit's private API as the tests use it, behind a version check: one runtime shared by every AppTest of a
test module, so sessions can run in parallel threads, a download button's bytes, and the app's compiles in turn.

AppTest's public API runs one session at a time, and every AppTest gets the same session id; a classroom (many
sessions at once, each checked against its own download) needs a runtime shared by all and a session id per
AppTest. Streamlit's internals change between versions without notice, so every use here is checked against the
minor version the dashboard pins (dashboard.server.streamlit_internals.checked, the server's one use of them): on
any other Streamlit `unchecked_reason` (or the `UncheckedStreamlit` raised) says why, and the tests that need them
skip with that reason.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import streamlit

from dashboard.server.streamlit_internals import PINNED_MINOR, checked


class UncheckedStreamlit(RuntimeError):
    """This Streamlit is not the version a use of its internals was checked on (the message says which)."""


def unchecked_reason(what: str) -> str | None:
    """Why `what` can't use Streamlit's internals here (a sentence for a test's skip), or None on the pinned version."""
    if checked():
        return None
    return f"{what} uses Streamlit internals checked on {PINNED_MINOR}x only; this is Streamlit {streamlit.__version__}"


def _require(what: str) -> None:
    reason = unchecked_reason(what)
    if reason is not None:
        raise UncheckedStreamlit(reason)


@contextlib.contextmanager
def shared_runtime() -> Iterator[Any]:
    """A runtime with one media-file manager (downloads, images) and cache storage for every AppTest
    started inside; pass it to `download` to get a download button's bytes. Skips on an unchecked Streamlit."""
    reason = unchecked_reason("the shared AppTest runtime")
    if reason is not None:
        pytest.skip(reason)
    with shared_apptest_runtime() as shared:
        yield shared


def download(runtime: Any, at, suffix: str) -> bytes:
    """The bytes a session's download button (the first whose label holds `suffix`) gives; one made
    on click (deferred) is made now."""
    button = next(b for b in at.get("download_button") if suffix in b.proto.label)
    return download_bytes(runtime, button.proto)


def compiles_take_turns() -> None:
    """AppTest compiles the app script on every run, each time with a new ScriptCache; the server compiles it
    once, under its one cache's lock. CPython 3.11 keeps one AST recursion counter per interpreter, so two
    threads building ASTs at once can fail ("SystemError: AST constructor recursion depth mismatch", seen in
    the tests that run sessions in threads). Not only compiles build ASTs: `ast.parse` does, and 3.11's
    traceback formatting calls it for every frame it underlines. So in tests the compiles and every
    `ast.parse` take turns on one lock. Raises UncheckedStreamlit on another Streamlit version."""
    _require("compiles_take_turns")
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache

    if getattr(ScriptCache.get_bytecode, "takes_turns", False):
        return
    turns = threading.RLock()  # re-entered: a compile's magic step calls ast.parse
    compile_script, parse = ScriptCache.get_bytecode, ast.parse

    def get_bytecode(self, script_path):
        with turns:
            return compile_script(self, script_path)

    def parse_in_turn(*args, **kwargs):
        with turns:
            return parse(*args, **kwargs)

    get_bytecode.takes_turns = parse_in_turn.takes_turns = True
    ScriptCache.get_bytecode = get_bytecode
    ast.parse = parse_in_turn


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
