"""The standalone reference the sessions' downloads are checked against: the same image analysed alone, here, by
the model the server shows, built the same way."""

from __future__ import annotations

import io

import numpy as np

from dashboard.models import build_named_model
from dashboard.server.byte_budget import default_capture_budget, nbytes_of

# Compared arrays: exact for the crop, tight tolerances for float results of the same computation.
EXACT = ("input_image", "grid", "patch_size", "num_prefix_tokens")
RTOL, ATOL = 1e-4, 1e-5


def reference_model(model: str, random_init: bool):
    """The model the server shows, built the same way (dashboard.models; random init: timm's, seed 0)."""
    return build_named_model(model, random_init)


def compare(loaded, image_bytes: bytes, npz: bytes) -> list[str]:
    """Differences between a session's download and the same image analysed alone ([] if none).

    Decoded as the server decodes it for the model (a large JPEG at reduced size, its shorter side at least
    `loaded.decode_min_side`: vit_core.images.draft_size), so the crops must be equal byte for byte."""
    from vit_core import decode_image, run_with_capture
    from vit_core.export import analysis_arrays

    expected = analysis_arrays(loaded, run_with_capture(loaded, decode_image(image_bytes, loaded.decode_min_side).image))
    got = dict(np.load(io.BytesIO(npz)))
    problems = []
    if set(got) != set(expected):
        problems.append(f"keys differ: {sorted(set(got) ^ set(expected))}")
    for key in sorted(set(got) & set(expected)):
        a, b = got[key], expected[key]
        if a.shape != b.shape:
            problems.append(f"{key}: shape {a.shape} vs {b.shape}")
        elif key in EXACT and not np.array_equal(a, b):
            problems.append(f"{key}: differs")
        elif key not in EXACT and not np.allclose(a, b, rtol=RTOL, atol=ATOL):
            problems.append(f"{key}: max |diff| {float(np.abs(a.astype(np.float64) - b).max()):.2e}")
    return problems


def capture_sizes(loaded) -> tuple[float, float]:
    """(MiB of one capture of `loaded`, MiB of the captures' byte budget a server started here has)."""
    from PIL import Image

    from vit_core import run_with_capture

    cap = run_with_capture(loaded, Image.new("RGB", (64, 64)))
    return nbytes_of(cap) / 2**20, default_capture_budget() / 2**20
