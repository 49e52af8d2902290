"""The image a session looks at, as the session keeps it: its bytes, digest and a small preview. No Streamlit here.

`dashboard.caches.decode` makes one (decoding through the shared caches).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from vit_core import ImageError
from vit_core.images import UPLOAD_EXTENSIONS

IMAGE_TYPES = UPLOAD_EXTENSIONS  # the file types the image uploaders accept
MAX_IMAGE_MB = 25
PREVIEW_MAX_SIDE = 1024  # pixels: the preview a session keeps of its image (not the crop the model sees)


@dataclass(frozen=True)
class ImageChoice:
    """An image a session shows. Light enough to keep per session: the file's bytes (compressed) and
    a preview, not the decoded full-size picture (a 12 MP phone photo is 36 MB decoded)."""

    name: str  # for people and file names
    sha: str  # sha256 of the bytes: the per-image cache key
    data: bytes  # the file as given
    size: tuple[int, int]  # (width, height) of the decoded picture, upright
    notes: tuple[str, ...]  # what decoding did that the user may want to know
    preview: Image.Image  # the picture, at most PREVIEW_MAX_SIDE pixels a side


def check_file_size(data: bytes) -> None:
    """Raise ImageError for a file over MAX_IMAGE_MB (the browser enforces the widget's cap; a script may not)."""
    if len(data) > MAX_IMAGE_MB * 1024 * 1024:
        raise ImageError(f"The file is {len(data) / 2**20:.0f} MB; images are limited to {MAX_IMAGE_MB} MB.")


def preview_copy(image: Image.Image) -> Image.Image:
    """The picture itself if small enough, else a copy shrunk to PREVIEW_MAX_SIDE pixels a side."""
    if max(image.size) <= PREVIEW_MAX_SIDE:
        return image
    small = image.copy()
    small.thumbnail((PREVIEW_MAX_SIDE, PREVIEW_MAX_SIDE), Image.Resampling.LANCZOS)
    return small
