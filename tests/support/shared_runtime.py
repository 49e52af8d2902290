"""One Streamlit runtime shared by every AppTest of a test module, so sessions can run in parallel threads.

AppTest's public API runs one session at a time, and every AppTest gets the same session id; a classroom (many
sessions at once, each checked against its own download) needs a runtime shared by all and a session id per
AppTest. That takes Streamlit's private API, which lives in one place:
dashboard.server.streamlit_internals.shared_apptest_runtime (checked against the pinned minor version; on any
other Streamlit the tests that use it skip with the reason).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from dashboard.server import streamlit_internals


@contextlib.contextmanager
def shared_runtime() -> Iterator[Any]:
    """A runtime with one media-file manager (downloads, images) and cache storage for every AppTest
    started inside; pass it to `download` to get a download button's bytes."""
    reason = streamlit_internals.unchecked_reason("the shared AppTest runtime")
    if reason is not None:
        pytest.skip(reason)
    with streamlit_internals.shared_apptest_runtime() as shared:
        yield shared


def download(runtime: Any, at, suffix: str) -> bytes:
    """The bytes a session's download button (the first whose label holds `suffix`) gives; one made
    on click (deferred) is made now."""
    button = next(b for b in at.get("download_button") if suffix in b.proto.label)
    return streamlit_internals.download_bytes(runtime, button.proto)
