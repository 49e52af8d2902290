"""Float32 CPU linears on oneDNN (vit_core.runtime.onednn): off by default (results reproducible from process to process);
opted in, MKL's numbers within float32 tolerance, only in the thread and block that asked, never where a gradient
is needed or autocast decides, recorded by the traced capture forward, and under `auto` only for the kinds of
product a measurement found faster (the decision from given timings).

Whether oneDNN's sums differ from MKL's in the last bits depends on the CPU (on a Sapphire Rapids Xeon they were
equal), so these tests check which operator ran, never that the numbers differ."""

from __future__ import annotations

import platform
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import vit_core
from vit_core import capture, serving, settings
from vit_core.runtime import onednn
from vit_core.runtime.onednn import linears_on_onednn, onednn_linear
from vit_core.serving import traced as tracing

ONEDNN_LINEAR_ENV = settings.ONEDNN_LINEAR.name

CPU = torch.device("cpu")
ONEDNN_OP, MKL_OP = "mkldnn::_linear_pointwise", "aten::addmm"

needs_onednn = pytest.mark.skipif(onednn.available_linear() is None, reason="no oneDNN linear in this torch or on this CPU")


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
    """Sets $VIT_LENS_ONEDNN_LINEAR for the test (read at every pass, never cached)."""

    def set_to(value: str) -> None:
        monkeypatch.setenv(ONEDNN_LINEAR_ENV, value)

    return set_to


@pytest.fixture(autouse=True)
def opted_in(onednn_setting):
    """Each test here starts with oneDNN opted in for every product (`on`); a test that needs another value sets it.
    The availability probe (two products of its own) runs here, not inside a test's profiled block."""
    onednn_setting("on")
    onednn_linear()


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


@needs_onednn
def test_other_threads_keep_mkl_while_one_thread_is_in_the_block(monkeypatch):
    model, x = mlp(), torch.randn(197, 96)
    real, routed_from = onednn_linear(), []

    def counted(x, weight, bias):  # oneDNN's linear, noting which thread sent it a product
        routed_from.append(threading.get_ident())
        return real(x, weight, bias)

    monkeypatch.setattr(onednn, "onednn_linear", lambda: counted)
    with torch.inference_mode():
        on_mkl = model(x)
    inside, outside = threading.Event(), {}

    def other_thread() -> None:
        inside.wait(10)
        outside["thread"] = threading.get_ident()
        with torch.inference_mode():
            outside["out"] = model(x)

    thread = threading.Thread(target=other_thread)
    thread.start()
    with torch.inference_mode(), linears_on_onednn(CPU):
        model(x)
        inside.set()
        thread.join(10)
    assert routed_from and set(routed_from) == {threading.get_ident()}, "only the block's own thread was routed"
    assert outside["thread"] not in routed_from
    assert torch.equal(outside["out"], on_mkl), "the other thread ran torch's own linear"


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
    assert ONEDNN_OP in ops_run(lambda: vit_core.run_with_capture(loaded, image))
    onednn_setting("off")
    assert onednn_linear() is None
    on_mkl = vit_core.run_with_capture(loaded, image)
    assert ONEDNN_OP not in ops_run(lambda: vit_core.run_with_capture(loaded, image))
    for field in ("tokens", "pattern", "final_tokens", "pre_logits", "logits"):
        np.testing.assert_allclose(getattr(on_onednn, field), getattr(on_mkl, field), rtol=1e-4, atol=1e-5, err_msg=field)


def test_by_default_every_linear_runs_on_torchs_own_library(tiny, image, monkeypatch):
    """Off unless asked: a choice made by timing would let two runs of the same input differ in the last bits."""
    monkeypatch.delenv(ONEDNN_LINEAR_ENV)
    assert settings.ONEDNN_LINEAR.mode() == "off" and onednn_linear() is None
    ran = ops_run(lambda: vit_core.run_with_capture(tiny, image))
    assert ONEDNN_OP not in ran and MKL_OP in ran


def test_the_setting_turns_it_off_and_on(onednn_setting):
    assert settings.ONEDNN_LINEAR.mode({}) == "off"
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
    onednn.available_linear.cache_clear()
    try:
        assert onednn_linear() is None
    finally:
        monkeypatch.undo()
        onednn.available_linear.cache_clear()  # the real op again for the tests after


@pytest.mark.parametrize("mkl, onednn_times, expected", [
    ([10.0, 10.2, 9.9], [5.0, 5.1, 5.3], True),  # twice as fast: the Zen 5 case
    ([8.7, 8.8, 8.6], [9.8, 9.7, 9.9], False),  # slower: the Zen 3 at 1 thread
    ([10.0, 10.0, 10.0], [9.6, 9.7, 9.6], False),  # within the margin: a wash, torch's own MKL stays
    ([10.0, 30.0, 10.0, 10.0, 10.0], [9.0, 9.0, 50.0, 9.0, 9.0], True),  # one slow round doesn't decide
    ([14.2, 8.3, 14.0], [12.2, 12.1, 12.3], False),  # two slow MKL rounds (a busy neighbour): the fastest decide
    ([8.4, 8.5, 8.3], [13.0, 12.9, 7.7], True),  # ... and the other way round
])
def test_onednn_is_chosen_only_where_its_fastest_round_is_clearly_faster(mkl, onednn_times, expected):
    assert onednn.prefers_onednn(mkl, onednn_times) is expected


def test_products_are_grouped_by_rows_up_to_the_measured_size_features_bias_and_threads():
    weight, bias = torch.zeros(2304, 768), torch.zeros(2304)
    kind = onednn.product_kind(torch.zeros(1, 197, 768), weight, bias, threads=1)
    assert kind == onednn.ProductKind(256, 768, 2304, True, 1)  # 197 tokens: 129-256 rows
    assert onednn.product_kind(torch.zeros(64, 197, 768), weight, bias, 1).rows == onednn.MEASURE_ROWS
    assert onednn.product_kind(torch.zeros(1, 768), weight, None, 2) == onednn.ProductKind(1, 768, 2304, False, 2)
    assert onednn.product_kind(torch.zeros(3, 768), weight, bias, 1).rows == 4
    assert str(kind) == "129-256 rows x 768 -> 2304, 1 thread"
    assert str(onednn.product_kind(torch.zeros(5000, 768), weight, bias, 2)) == ">512 rows x 768 -> 2304, 2 threads"


@pytest.fixture
def measured(onednn_setting, monkeypatch):
    """The default (auto) setting with a measurement that says what the test wants: oneDNN twice as fast for
    products with more than 200 output features, slower for the rest; returns the kinds measured, in order."""
    onednn_setting("auto")
    onednn.forget_choices()
    asked: list[tuple[int, int]] = []

    def fake_measure(linear, x, weight, bias):
        asked.append(tuple(weight.shape))
        return ([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) if weight.shape[0] > 200 else ([1.0, 1.0, 1.0], [1.5, 1.5, 1.5])

    monkeypatch.setattr(onednn, "time_both", fake_measure)
    yield asked
    onednn.forget_choices()


@needs_onednn
def test_by_default_each_kind_of_product_takes_the_library_measured_faster_once_per_process(measured):
    model, x = mlp(), torch.randn(2, 197, 96)  # linears 96 -> 384 (oneDNN faster) and 384 -> 96 (MKL faster)
    with torch.inference_mode():
        on_mkl = model(x)
        with linears_on_onednn(CPU):
            ran = ops_run(lambda: model(x))
            again = model(x)
    assert ONEDNN_OP in ran and MKL_OP in ran, "one product of each library"
    assert measured == [(384, 96), (96, 384)], "each kind measured once, at its first product"
    torch.testing.assert_close(again, on_mkl, rtol=1e-5, atol=1e-5)
    made = {c.kind.d_out: c.onednn for c in onednn.choices()}
    assert made == {384: True, 96: False}
    line = onednn.choices_line(onednn.choices())
    assert "\n" not in line and "oneDNN for 1 of 2 kinds of product" in line and "96 -> 384" in line


@needs_onednn
def test_another_thread_count_or_row_count_is_measured_again(measured):
    model = mlp()
    threads = torch.get_num_threads()
    with torch.inference_mode(), linears_on_onednn(CPU):
        model(torch.randn(197, 96))
        model(torch.randn(150, 96))  # the same kind: 129-256 rows
        model(torch.randn(3, 96))  # 3-4 rows: measured again
        torch.set_num_threads(1)
        try:
            model(torch.randn(197, 96))
        finally:
            torch.set_num_threads(threads)
    kinds = [(c.kind.rows, c.kind.threads) for c in onednn.choices()]
    assert kinds == [(256, threads)] * 2 + [(4, threads)] * 2 + [(256, 1)] * 2


@needs_onednn
def test_a_forward_being_traced_measures_nothing_and_records_the_choice_made_before(measured):
    model, x = mlp(), torch.randn(197, 96)
    with torch.inference_mode(), linears_on_onednn(CPU):
        unmeasured = torch.jit.trace(model, x, check_trace=False)
        assert measured == [], "nothing may run beside a trace's recorded operations"
        model(x)  # the eager forward chooses (a capture's trace is recorded after its eager check)
        traced = torch.jit.trace(model, x, check_trace=False)
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        assert ONEDNN_OP not in ops_run(lambda: unmeasured(x))
        ops = ops_run(lambda: traced(x))
    assert ONEDNN_OP in ops and MKL_OP in ops


def test_a_real_measurement_times_both_libraries_on_the_products_rows():
    """The timing itself, not its outcome: both libraries run the same product, MEASURE_ROUNDS times each."""
    linear = onednn_linear()
    if linear is None:
        pytest.skip("no oneDNN linear in this torch or on this CPU")
    mkl, on_onednn = onednn.time_both(linear, torch.randn(1, 3000, 32), torch.randn(16, 32), None)
    assert len(mkl) == len(on_onednn) == onednn.MEASURE_ROUNDS and min(mkl + on_onednn) > 0
