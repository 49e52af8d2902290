"""Errors a user can cause, each with a message written for that user.

The dashboard shows `str(error)` and keeps working; the CLI prints it as one line. Anything else
that escapes is a bug in ViT Lens, not in the user's input.
"""


class ViTLensError(Exception):
    """Base class: the message is meant to be shown to the user as it is."""


class ImageError(ViTLensError):
    """An uploaded or given image can't be used (not an image, truncated, too large, ...)."""


class ModelError(ViTLensError):
    """A model name that is unknown or not a Vision Transformer of timm's family."""


class WeightsError(ViTLensError):
    """A weights file that can't be loaded safely or doesn't fit the chosen architecture."""


class OfflineError(ViTLensError):
    """Pretrained weights are needed from the hub, and the hub can't be reached."""


class CaptureError(ViTLensError):
    """The forward pass did not yield what the capture needs (e.g. one attention pattern per block)."""
