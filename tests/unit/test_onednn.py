"""Float32 CPU linears on oneDNN (vit_core.onednn): MKL's numbers within float32 tolerance, only in the thread
and block that asked, never where a gradient is needed or autocast decides, recorded by the traced capture
forward, and off where $VIT_LENS_ONEDNN_LINEAR says so."""

from __future__ import annotations

import platform
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import vit_core
from vit_core import capture, onednn, serving, settings
from vit_core.onednn import linears_on_onednn, onednn_linear
from vit_core.serving import traced as tracing

ONEDNN_LINEAR_ENV = settings.ONEDNN_LINEAR.name

CPU = torch.device("cpu")
ONEDNN_OP, MKL_OP = "mkldnn::_linear_pointwise", "aten::addmm"

needs_onednn = pytest.mark.skipif(onednn_linear() is None, reason="no oneDNN linear in this torch or on this CPU")


def ops_run(fn) -> set[str]:
    """The names of the torch operations `fn()` ran in this thread."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.key for event in prof.key_averages()}


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(96, 384), torch.nn.GELU(), torch.nn.Linear(384, 96)).eval()


@pytest.fixture
def onednn_setting(monkeypatch):
    """Sets $VIT_LENS_ONEDNN_LINEAR and forgets the process's cached answer (and forgets it again after)."""

    def set_to(value: str) -> None:
        monkeypatch.setenv(ONEDNN_LINEAR_ENV, value)
        onednn_linear.cache_clear()

    yield set_to
    monkeypatch.undo()
    onednn_linear.cache_clear()


def test_x86_builds_of_torch_with_onednn_have_it():
    """So that the skips below can't hide a regression on the machines CI runs on."""
    if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available():
        assert onednn_linear() is not None


@needs_onednn
def test_linears_in_the_block_run_on_onednn_with_mkls_numbers_within_float32_tolerance():
    model, x = mlp(), torch.randn(2, 197, 96)
    with torch.inference_mode():
        on_mkl = model(x)
        with linears_on_onednn(CPU):
            ran = ops_run(lambda: model(x))
            on_onednn = model(x)
        after = ops_run(lambda: model(x))
    assert ONEDNN_OP in ran and MKL_OP not in ran
    assert ONEDNN_OP not in after and MKL_OP in after, "the block's end puts linears back on MKL"
    torch.testing.assert_close(on_onednn, on_mkl, rtol=1e-5, atol=1e-5)
    assert not torch.equal(on_onednn, on_mkl), "the two libraries sum in different orders: a test of the switch"


@needs_onednn
def test_other_threads_keep_mkl_while_one_thread_is_in_the_block():
    model, x = mlp(), torch.randn(197, 96)
    with torch.inference_mode():
        on_mkl = model(x)
    inside, outside = threading.Event(), {}

    def other_thread() -> None:
        inside.wait(10)
        with torch.inference_mode():
            outside["out"] = model(x)

    thread = threading.Thread(target=other_thread)
    thread.start()
    with torch.inference_mode(), linears_on_onednn(CPU):
        on_onednn = model(x)
        inside.set()
        thread.join(10)
    assert torch.equal(outside["out"], on_mkl) and not torch.equal(outside["out"], on_onednn)


@needs_onednn
def test_a_linear_that_needs_gradients_stays_on_mkl_and_its_backward_is_mkls():
    """The oneDNN op has no backward: a relevance pass (vit_core.explain) must get torch's own linear."""
    model = mlp()
    x = torch.randn(5, 96, requires_grad=True)
    expected = torch.autograd.grad(model(x).square().sum(), x)[0]
    with linears_on_onednn(CPU):
        ran = ops_run(lambda: model(x))
        got = torch.autograd.grad(model(x).square().sum(), x)[0]
    assert ONEDNN_OP not in ran
    assert torch.equal(got, expected)


@needs_onednn
def test_a_cpu_autocast_keeps_its_bfloat16_linear():
    model, x = mlp(), torch.randn(5, 96)
    with torch.inference_mode(), linears_on_onednn(CPU), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16


@needs_onednn
def test_only_float32_cpu_linears_are_sent():
    x, weight = torch.randn(4, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    with torch.inference_mode(), linears_on_onednn(CPU):
        ran = ops_run(lambda: F.linear(x, weight))
        assert torch.equal(F.linear(x, weight), x @ weight.T)
    assert ONEDNN_OP not in ran


@needs_onednn
def test_a_capture_runs_its_linears_on_onednn_eager_and_traced(tiny, image, monkeypatch):
    x = capture.preprocess(tiny, image)[1]
    eager_ops = ops_run(lambda: vit_core.run_with_capture(tiny, image))
    assert ONEDNN_OP in eager_ops and MKL_OP not in eager_ops

    serving.set_traced_forward(True)
    first = serving.serve_capture(tiny, image)  # records the trace, checked against the eager forward bit for bit
    trace = tracing._tracing.traced.get(tiny.model)
    assert trace is not None, "the oneDNN linear is recorded by the tracer, so the trace is kept"
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        traced_ops = ops_run(lambda: trace(x))
    assert ONEDNN_OP in traced_ops and MKL_OP not in traced_ops
    assert np.array_equal(serving.serve_capture(tiny, image).logits, first.logits)


@needs_onednn
def test_every_pass_without_gradients_runs_on_onednn_and_the_gradient_pass_on_mkl(tiny, image):
    """`devices.full_float32`, which every pass enters, is where the linears are routed: the explanations' forwards
    and the many-images batches too; the relevance pass's forward needs gradients and keeps torch's linear."""
    from vit_core import dataset, explain

    cap = vit_core.run_with_capture(tiny, image)
    x = capture.preprocess(tiny, image)[1]
    batch = torch.cat([x, x])  # (2, 3, H, W)
    for name, run in {
        "logit lens": lambda: explain.logit_lens(tiny, cap),
        "intervention": lambda: explain.predict_intervened(tiny, cap, drop=[1]),
        "batch": lambda: dataset.reduce_batch(tiny, batch, logit_lens=True),
    }.items():
        ran = ops_run(run)
        assert ONEDNN_OP in ran and MKL_OP not in ran, name
    ran = ops_run(lambda: explain.relevance._gradient_pass(tiny, x, None))
    assert ONEDNN_OP not in ran and MKL_OP in ran


@needs_onednn
def test_a_capture_on_onednn_equals_one_on_mkl_within_float32_tolerance(family, image, onednn_setting):
    loaded = family["registers"]
    on_onednn = vit_core.run_with_capture(loaded, image)
    onednn_setting("off")
    assert onednn_linear() is None
    on_mkl = vit_core.run_with_capture(loaded, image)
    assert ONEDNN_OP not in ops_run(lambda: vit_core.run_with_capture(loaded, image))
    for field in ("tokens", "pattern", "final_tokens", "pre_logits", "logits"):
        np.testing.assert_allclose(getattr(on_onednn, field), getattr(on_mkl, field), rtol=1e-4, atol=1e-5, err_msg=field)
    assert not np.array_equal(on_onednn.tokens, on_mkl.tokens), "the setting switched the library"


def test_the_setting_turns_it_off_and_the_default_is_on(onednn_setting):
    onednn_setting("off")
    assert onednn_linear() is None
    with linears_on_onednn(CPU):  # no mode entered: nothing to route
        assert torch.equal(F.linear(torch.ones(2, 3), torch.ones(4, 3)), torch.full((2, 4), 3.0))
    onednn_setting("on")
    assert (onednn_linear() is not None) == (
        platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available())


def test_a_torch_without_the_op_keeps_mkl(onednn_setting, monkeypatch):
    monkeypatch.setattr(onednn, "_LINEAR_SOURCE", onednn._LINEAR_SOURCE.replace("_linear_pointwise", "_no_such_op"))
    onednn_setting("on")
    assert onednn_linear() is None
