"""The One image page's `.npz` downloads, through a shared AppTest runtime (their bytes can be read): the same file
`vit_core.export.analysis_arrays` + `vit_core.serving.npz_bytes` write for the same capture, made from the arrays the
page's caches hold, with no second attention-distance or rollout computation."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import COMMAND_TIMEOUT, assert_healthy, run_app
from dashboard import caches, examples
from dashboard.models import TEST_TINY, ModelRequest
from support.shared_runtime import download, shared_runtime
from vit_core import TEACHING_MODEL, analyses, explain, export, serving


@pytest.fixture(scope="module")
def runtime():
    with shared_runtime() as shared:
        yield shared


def counted(monkeypatch, module, name: str) -> list:
    """Every call of `module.name` from now on (the function still runs)."""
    calls, real = [], getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_the_npz_is_the_exports_own_file_from_what_the_caches_hold(tiny_env, runtime, monkeypatch):
    """The page computed the attention distances (as for every image it shows), the Attention tab the rollout the
    export holds (mean fusion, every layer), the Filters tab the PCA, the Why? tab the relevance maps: the downloads
    compute none of them again."""
    at = run_app(view="Attention")
    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    name = examples.default_example(loaded.name)
    image = caches.decode(name, caches.example_bytes(name))
    cap = caches.shared_capture(request, loaded, image)  # the session's own capture, from the shared cache
    caches.lens_arrays(request, loaded, image, cap, "rollout")  # the Attention tab's defaults (its figure may be cached)
    caches.filters_pca(request.key, loaded)  # the Filters tab's
    judged = caches.latest_judgement(request, image)  # the Why? tab's maps, for the target the export takes
    caches.relevance(request, loaded, image, cap, judged.target if judged else explain.resolve_target(loaded, cap.logits))
    assert_healthy(at)

    distances = counted(monkeypatch, analyses, "mean_attention_distances")
    rollouts = counted(monkeypatch, analyses, "attention_rollout")
    pcas = counted(monkeypatch, analyses, "filters_pca")
    got = download(runtime, at, "All arrays of this image (.npz)")
    explained = download(runtime, at, "All arrays + explanations (.npz)")
    assert (distances, rollouts, pcas) == ([], [], [])  # nothing computed twice

    expected = export.analysis_arrays(loaded, cap)
    assert len(distances) == 1 and len(rollouts) == 1  # the counters count: the standalone export computes them
    assert got == serving.npz_bytes(expected)
    with np.load(io.BytesIO(explained)) as npz:
        for key, value in expected.items():
            np.testing.assert_array_equal(npz[key], value, err_msg=key)


def test_the_download_computes_the_rollout_once_when_no_tab_has(tiny_env, runtime, monkeypatch):
    """A fresh image whose Attention tab was never opened: the download computes the default rollout once, into the
    cache the tab reads, and the attention distances not at all (the page computed them)."""
    at = run_app(view="Prediction")
    at.selectbox(key="example").set_value(examples.SYNTHETIC_SCENE).run()
    assert_healthy(at)
    rollouts = counted(monkeypatch, analyses, "attention_rollout")
    distances = counted(monkeypatch, analyses, "mean_attention_distances")
    first = download(runtime, at, "All arrays of this image (.npz)")
    assert len(rollouts) <= 1 and distances == []
    again = download(runtime, at, "All arrays of this image (.npz)")
    assert again == first and len(rollouts) <= 1 and distances == []


def test_the_npz_a_student_downloads_is_the_same_bits_as_vit_lens_analyze_writes(monkeypatch, runtime, tmp_path):
    """Same input, same numbers: the page's capture (the server's way: its passes, its trace, its threads) and the
    command line's, in a process of its own, give the same arrays bit for bit. On the bundled Shapes ViT, a model
    both know by name."""
    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    at = run_app()
    assert_healthy(at)
    downloaded = download(runtime, at, "All arrays of this image (.npz)")
    name = examples.default_example(caches.load(ModelRequest(TEACHING_MODEL)).name)
    (tmp_path / "example.png").write_bytes(caches.example_bytes(name))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIT_LENS_")}
    result = subprocess.run([sys.executable, "-m", "vit_core", "analyze", "example.png", "--model", TEACHING_MODEL,
                             "--device", "cpu", "--out", "out"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, result.stderr
    with np.load(io.BytesIO(downloaded)) as page, np.load(tmp_path / "out" / "example.npz") as command:
        assert page.files and set(page.files) == set(command.files)
        different = [key for key in page.files if (page[key].dtype, page[key].shape, page[key].tobytes())
                     != (command[key].dtype, command[key].shape, command[key].tobytes())]
    assert not different, f"the page's and the command's arrays differ in {different}"
