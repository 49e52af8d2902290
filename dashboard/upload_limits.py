"""The upload limits a server enforces, from the numbers the pages state (dashboard.image_choice, dashboard.image_sets,
dashboard.models): made here, above the server wing, and handed to it (`process.serving(upload_limits)`), so that
dashboard.server imports nothing of the pages."""

from __future__ import annotations

from dashboard import image_sets, models
from dashboard.image_choice import IMAGE_TYPES, MAX_IMAGE_MB
from dashboard.server.byte_budget import _memory_limit_bytes
from dashboard.server.uploads import MAX_UPLOADS_TOTAL_MB, MIN_UPLOADS_TOTAL_MB, UPLOADS_TOTAL_SHARE, UploadLimits

BATCH_IMAGES_HELD = 32  # = dashboard.views.attention.MAX_BATCH_IMAGES (a test checks), not imported: no Streamlit here


def upload_limits(memory_bytes: int | None = None) -> UploadLimits:
    """The limits for this server's settings: per file as the pages say them (dashboard.image_choice.MAX_IMAGE_MB,
    dashboard.image_sets' zip cap, the label and weights caps of dashboard.models), per session the most one
    session's uploaders can hold at once, and for all sessions an eighth of the memory (`memory_bytes`, default the
    container's), between MIN_UPLOADS_TOTAL_MB and MAX_UPLOADS_TOTAL_MB and never under one session's."""
    mb = 2**20
    weights = models.weights_uploads_allowed()
    server_mb = models.MAX_WEIGHTS_MB if weights else MAX_IMAGE_MB
    zip_mb = image_sets.upload_limit_mb(server_mb)
    # One session at most holds: its image, a batch for the distance tab, a set for Many images, and its weights
    # and labels (the sidebar's, on every page).
    session = (MAX_IMAGE_MB + BATCH_IMAGES_HELD * MAX_IMAGE_MB + max(image_sets.MAX_SET_MB, zip_mb)
               + ((models.MAX_WEIGHTS_MB + models.MAX_LABELS_MB) if weights else 0)) * mb
    memory = memory_bytes or _memory_limit_bytes() or 4 * 2**30
    total = min(max(memory // UPLOADS_TOTAL_SHARE, MIN_UPLOADS_TOTAL_MB * mb), MAX_UPLOADS_TOTAL_MB * mb)
    return UploadLimits(image_bytes=MAX_IMAGE_MB * mb, zip_bytes=zip_mb * mb, labels_bytes=models.MAX_LABELS_MB * mb,
                        weights_bytes=models.MAX_WEIGHTS_MB * mb if weights else 0, session_bytes=session,
                        total_bytes=max(total, session), server_mb=server_mb,
                        image_suffixes=tuple(f".{t}" for t in IMAGE_TYPES))
