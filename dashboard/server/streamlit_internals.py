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
import time

import streamlit

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
