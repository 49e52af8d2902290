"""Shared fixtures: small random-init ViTs (fixed seed) and images the tests draw themselves."""

from __future__ import annotations

from pathlib import Path

from vit_core.runtime import no_triton_without_a_gpu

no_triton_without_a_gpu()  # as the entry points do, before torch is imported: no triton teardown noise on a CPU machine

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tools.hostile.images import encoded  # noqa: E402, F401 - the tests' `from conftest import encoded`

REPO = Path(__file__).resolve().parent.parent  # vit_core and dashboard are imported as installed (pip install -e .)

torch.set_num_threads(2)


def _compiles_take_turns() -> None:
    """AppTest compiles the app script on every run; two threads building ASTs at once (compiles, ast.parse, 3.11's
    tracebacks) can fail on CPython 3.11, so in tests they take turns (support.shared_runtime.compiles_take_turns,
    the tests' one place with Streamlit's private API). On a Streamlit other than the pinned minor version nothing is
    patched: the tests that run sessions in threads skip there (tests/support/shared_runtime.py says why)."""
    from support.shared_runtime import UncheckedStreamlit, compiles_take_turns

    try:
        compiles_take_turns()
    except UncheckedStreamlit:
        pass  # one session at a time needs no turns; the threaded tests skip with the reason


_compiles_take_turns()

# Small members of each branch of timm's VisionTransformer family: (name, create_model kwargs).
SMALL = dict(embed_dim=64, num_heads=4, depth=2)
FAMILY = {
    "class_token": ("vit_tiny_patch16_224", dict(depth=2)),
    "distilled": ("deit_tiny_distilled_patch16_224", dict(depth=2)),
    "registers": ("vit_small_patch14_reg4_dinov2", dict(SMALL, img_size=112)),
    "no_class_token": ("vit_base_patch16_siglip_224", SMALL),
    "patch32": ("vit_base_patch32_224", SMALL),
    "input384": ("vit_base_patch16_384", dict(SMALL, depth=1)),
}


def hooks_on(model: torch.nn.Module) -> int:
    """Every forward (pre-)hook registered anywhere on `model`, whoever registered it: stricter than
    vit_core's `recording_hooks_on`, which counts only the handles its own recording made.

    torch has no public API that lists a module's hooks, so this reads its private per-module
    dictionaries: the only private-API use in the tests, checked against the torch versions it was
    written for."""
    assert int(torch.__version__.split(".")[0]) == 2, f"hooks_on reads torch 2.x internals; check it for {torch.__version__}"
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def drawn_image(seed: int = 0, size: tuple[int, int] = (240, 320)) -> Image.Image:
    """A deterministic RGB test picture: a smooth gradient with a few bright rectangles."""
    rng = np.random.default_rng(seed)
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + y) / 17.0 + seed)], axis=-1) * 200
    for _ in range(3):
        top, left = rng.integers(0, h - 40), rng.integers(0, w - 40)
        img[top : top + 40, left : left + 40] = rng.integers(0, 256, size=3)
    return Image.fromarray(img.astype(np.uint8))


FOLDER_MARKERS = ("app", "browser", "live")  # tests/<folder>/ -> marker (registered in pyproject.toml)


def pytest_collection_modifyitems(config, items) -> None:
    """Each test under tests/app/, tests/browser/ or tests/live/ gets its folder's marker."""
    here = Path(__file__).resolve().parent
    for item in items:
        try:
            folder = item.path.resolve().relative_to(here).parts[0]
        except ValueError:
            continue
        if folder in FOLDER_MARKERS:
            item.add_marker(folder)


@pytest.fixture(autouse=True)
def traced_forward_as_it_was():
    """The dashboard turns the traced capture forward on process-wide (dashboard.server.process, on every AppTest
    run); each test starts from, and leaves, the server's default off unless it asks otherwise."""
    from vit_core import serving

    serving.set_traced_forward(False)
    yield
    serving.set_traced_forward(False)


@pytest.fixture(scope="session")
def tiny():
    """A 2-block random-init vit_tiny_patch16_224 (14 x 14 patches of 16 px, 1 class token)."""
    from vit_core import load_model

    return load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2)


@pytest.fixture(scope="session")
def family():
    from vit_core import load_model

    return {key: load_model(name, pretrained=False, seed=0, **kwargs) for key, (name, kwargs) in FAMILY.items()}


@pytest.fixture
def image():
    return drawn_image(0)


@pytest.fixture
def tiny_env(monkeypatch):
    """The dashboard opens with the tiny random-init test model (dashboard.models.TEST_TINY): fast and offline."""
    from dashboard.models import TEST_TINY

    monkeypatch.setenv("VIT_LENS_MODEL", TEST_TINY)
    monkeypatch.delenv("VIT_LENS_RANDOM_INIT", raising=False)
    monkeypatch.delenv("VIT_LENS_WEIGHTS_UPLOADS", raising=False)


APP = str(REPO / "dashboard" / "app.py")
# How long one AppTest script run may take before it counts as hung: a guard, not a speed check. A run that takes
# 10 s on a quiet machine took over 120 s at a load average of 18 on two cores (2026-12-06), and AppTest fails a run
# that outlasts its timeout.
APP_TIMEOUT = 900
COMMAND_TIMEOUT = 900  # the same guard for a command a test runs (`python -m vit_core ...`): importing torch is slow too


def run_app(default_timeout: int = APP_TIMEOUT, **query: str):
    """The dashboard run once in-process by Streamlit's AppTest, with `query` as URL parameters."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=default_timeout)
    at.query_params.update(query)
    at.run()
    assert_healthy(at)
    return at


def assert_healthy(at) -> None:
    assert not at.exception, [e.value for e in at.exception]


def choose_weights(at, arch: str, name: str, data: bytes, labels: tuple[str, bytes] | None = None):
    """In an AppTest session: choose "your own weights file", the architecture `arch`, upload `data` as `name`
    (and a label file (name, bytes)), and run."""
    from dashboard import session
    from dashboard.models import UPLOAD_WEIGHTS

    at.selectbox(key=session.K_MODEL).set_value(UPLOAD_WEIGHTS).run()
    assert_healthy(at)
    at.selectbox(key=session.K_ARCH).set_value(arch)
    at.file_uploader(key=session.K_WEIGHTS).set_value((name, data, "application/octet-stream"))
    if labels:
        at.file_uploader(key=session.K_LABELS).set_value((*labels, "text/plain"))
    at.run()
    assert_healthy(at)
    return at
