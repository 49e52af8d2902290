"""A light model's capture on the server (a stroke's prediction within 0.5 s): on the thread that asks, with one torch
thread, never on a lowered forward lane; the same numbers as the library's capture, bit for bit."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
import timm
import torch

from conftest import drawn_image, encoded
from unit.test_serving_passes import assert_restored, patch_mlp
from unit.test_serving_traced import FIELDS
from vit_core import load_model, run_with_capture, serving
from vit_core.loading.model import LoadedModel
from vit_core.serving import capture as serving_capture


def test_the_teaching_model_and_the_test_model_are_light_and_real_vits_are_not(tiny):
    assert serving.light_pass(load_model("vit-lens/shapes-vit"))  # about 0.3 G multiply-adds
    assert serving.light_pass(tiny)
    for name, tokens in (("vit_small_patch16_224", 197), ("deit_tiny_patch16_224", 197), ("vit_base_patch16_224", 197)):
        with torch.device("meta"):  # shapes only: no memory, no weights
            model = timm.create_model(name)
        shapes_only = SimpleNamespace(model=model, geometry=SimpleNamespace(num_tokens=tokens))
        shapes_only.multiply_adds = LoadedModel.multiply_adds.fget(shapes_only)  # the property, on the stand-in
        assert not serving.light_pass(shapes_only), name


@pytest.mark.parametrize("tracing", [True, False])
def test_a_pass_on_this_thread_uses_one_torch_thread_no_lane_and_gives_the_librarys_numbers(tracing, monkeypatch):
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2)  # its own trace, if any
    images = [drawn_image(seed) for seed in (1, 2)]
    expected = [run_with_capture(loaded, im) for im in images]
    monkeypatch.setattr(serving_capture, "on_a_lane", lambda *a: pytest.fail("a light pass went to a forward lane"))
    seen = []
    undo = patch_mlp(loaded.model, lambda: seen.append((threading.current_thread(), torch.get_num_threads())))
    threads_before = torch.get_num_threads()
    serving.set_traced_forward(tracing)
    try:
        got = [serving.serve_capture(loaded, im, on_this_thread=True) for im in images]
    finally:
        serving.set_traced_forward(False)
        undo()
    for cap, want in zip(got, expected, strict=True):
        for field in FIELDS:
            np.testing.assert_array_equal(getattr(cap, field), getattr(want, field), err_msg=field)
    # Eager, the MLP runs in Python and is seen; traced (after the first pass records the trace), it is not.
    assert seen and all(where is threading.current_thread() and threads == 1 for where, threads in seen), seen
    assert torch.get_num_threads() == threads_before
    assert_restored(loaded)


@pytest.mark.skipif(sys.platform != "linux", reason="threads have nice values of their own on Linux")
def test_a_light_models_new_image_keeps_the_pages_priority(tiny_env):
    """Each stroke of a drawing is a new image: with a light model its run is not lowered below the pages (a large
    model's is: tests/unit/test_dashboard_parts.py), so the stroke's answer doesn't wait for the rest of the machine."""
    from dashboard import caches
    from dashboard.models import TEST_TINY, ModelRequest

    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    assert serving.light_pass(loaded)
    image = caches.decode("light_pass_test.png", encoded(drawn_image(seed=4343)))

    def a_run() -> int:
        caches.shared_capture(request, loaded, image)
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    with ThreadPoolExecutor(1) as pool:  # a new thread, as Streamlit starts for a session's runs
        assert pool.submit(a_run).result() == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
