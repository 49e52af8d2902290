"""One Streamlit runtime shared by every AppTest of a test module, so sessions can run in parallel threads.

The ONE place where the tests use Streamlit's private API. Why it is unavoidable: AppTest's public
API runs one session at a time; each `run()` installs a mock `Runtime` globally and removes it
afterwards, so with sessions in threads one run would pull the runtime from under another, and every
AppTest gets the same session id, so one session's rerun would revoke another's download buttons. A
classroom (many sessions at once, each checked against its own download) needs both. Internals
change between Streamlit versions: pinned to the 1.67 minor version (as pyproject pins it), skipped
with the reason on any other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest.mock import MagicMock

import pytest
import streamlit

PINNED_MINOR = "1.67."


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
def shared_runtime() -> Iterator[MagicMock]:
    """A runtime with one media-file manager (downloads, images) and cache storage for every AppTest
    started inside; `.media_file_mgr` and `.storage` give a download button's bytes."""
    if not streamlit.__version__.startswith(PINNED_MINOR):
        pytest.skip(f"the shared AppTest runtime patches Streamlit internals checked on {PINNED_MINOR}x only; "
                    f"this is Streamlit {streamlit.__version__}")
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


def download(runtime: MagicMock, at, suffix: str) -> bytes:
    """The bytes a session's download button (the first whose label holds `suffix`) gives; one made
    on click (deferred) is made now."""
    button = next(b for b in at.get("download_button") if suffix in b.proto.label)
    if button.proto.deferred_file_id:
        url = runtime.media_file_mgr.execute_deferred(button.proto.deferred_file_id)
    else:
        url = button.proto.url
    return runtime.storage.get_file(url.rsplit("/", 1)[-1]).content
