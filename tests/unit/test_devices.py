"""Devices: `load_model(device=...)`, and every pass's inputs made on the model's device.

This machine (and CI) has no GPU, so what a CPU-only test can show is limited, and these tests say which part
they show:

- the device argument: "cpu" and torch.device("cpu") are accepted, bad names are refused with one sentence
  before anything is read or built, and the results equal the default path's (bit for bit on the CPU);
- the plumbing: with the model moved to torch's "meta" device (tensors with shapes and no data, a stand-in
  for a GPU), every entry point runs its forward with no torch call mixing tensors of two devices, and fails
  only where it copies a result back to the host (a meta tensor has no data to copy). A missing `.to(device)`
  makes some call mix the host and the device: `DeviceSpy` records it (checked on a deliberate mistake).

They can't show numbers on a real GPU (float32 tolerance, TF32 in cuDNN convolutions), speed, or CUDA kernels:
that check runs on a GPU machine (tools/benchmarks/gpu_parity.py; docs/performance/2026-11-23.md, "GPU parity").
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import timm
import torch
from torch.overrides import TorchFunctionMode

from conftest import drawn_image
from vit_core import explain, load_model, run_with_capture
from vit_core.runtime.devices import DeviceError, on_model_device

ARCH = "vit_tiny_patch16_224"
TINY = dict(pretrained=False, seed=0, depth=2)


# ----------------------------------------------------------------------------------------------
# The device argument


@pytest.mark.parametrize("device", ["cpu", "CPU", torch.device("cpu"), None, "auto"])
def test_cpu_is_accepted_in_every_spelling(device):
    if device in ("auto", None) and torch.cuda.is_available():
        pytest.skip("auto picks the GPU on this machine")
    loaded = load_model(ARCH, device=device, **TINY)
    assert loaded.device == torch.device("cpu")
    assert loaded.device_name == "CPU"
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu", "cuda:0:1", "cuda:-1"])
def test_a_malformed_device_is_refused_before_anything_is_built(monkeypatch, tmp_path, device):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a model was built (or a weights file read) before the device was checked")

    monkeypatch.setattr(timm, "create_model", must_not_run)
    monkeypatch.setattr("vit_core.loading.weights.read_state_dict", must_not_run)
    for kwargs in (dict(pretrained=False), dict(weights=tmp_path / "w.safetensors"), dict()):
        with pytest.raises(DeviceError) as refused:
            load_model(ARCH, device=device, **kwargs)
        message = str(refused.value)
        assert "\n" not in message and message.endswith(".") and "auto, cpu, cuda" in message, message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_gpu_this_machine_lacks_is_refused_in_one_sentence(device):
    with pytest.raises(DeviceError, match=r"^device 'cuda(:\d)?' asked for, but this machine has no usable CUDA GPU\.$"):
        load_model(ARCH, device=device, **TINY)


def test_results_on_an_explicit_cpu_equal_the_default_path(image):
    """On this machine auto = cpu: the explicit device must change nothing, down to the bit."""
    if torch.cuda.is_available():
        pytest.skip("auto picks the GPU on this machine")
    default, explicit = load_model(ARCH, **TINY), load_model(ARCH, device=torch.device("cpu"), **TINY)
    a, b = run_with_capture(default, image), run_with_capture(explicit, image)
    for field in ("input_tensor", "patch_embeddings", "tokens", "pattern", "final_tokens", "pre_logits", "logits"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    np.testing.assert_array_equal(explain.logit_lens(default, a), explain.logit_lens(explicit, b))
    np.testing.assert_array_equal(explain.predict_intervened(default, a, drop=[3, 4], ablate=[(1, 0)]),
                                  explain.predict_intervened(explicit, b, drop=[3, 4], ablate=[(1, 0)]))


def test_on_model_device_moves_a_tensor_to_the_parameters_device():
    model = torch.nn.Linear(3, 2)
    x = torch.ones(1, 3)
    assert on_model_device(model, x) is x  # already there: no copy
    model.to("meta")
    moved = on_model_device(model, x)
    assert moved.device.type == "meta" and moved.shape == x.shape and x.device.type == "cpu"


# ----------------------------------------------------------------------------------------------
# The plumbing, with the model on the "meta" device


class DeviceSpy(TorchFunctionMode):
    """While active, notes every torch call whose tensor arguments lie on more than one device: the mark of a
    tensor made on the host and handed to a model on another device (torch raises for some such calls, and
    silently computes others, e.g. a CPU conv2d with meta weights answers on the CPU)."""

    def __init__(self):
        super().__init__()
        self.mixed: list[str] = []
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        self.names.add(name)
        devices = {t.device.type for t in _tensors((args, kwargs))}
        if len(devices) > 1:
            self.mixed.append(f"{name}: {sorted(devices)}")
        return func(*args, **kwargs)


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


@pytest.fixture(scope="module")
def on_meta():
    """A tiny model moved to the meta device (its own copy: moving destroys the weights), with a capture of an image
    made while it was still on the CPU (the explain entry points take one)."""
    loaded = load_model(ARCH, device="cpu", **TINY)
    cap = run_with_capture(loaded, drawn_image(2))
    loaded.model.to("meta")
    assert loaded.device.type == "meta"
    return loaded, cap


def _runs_on_the_device_until_the_host_copy(call) -> DeviceSpy:
    """Run `call` under a DeviceSpy; it must fail only where a result is copied off the meta device."""
    spy = DeviceSpy()
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"), spy:
        call()
    assert "linear" in spy.names, f"the model's forward did not run: {sorted(spy.names)[:20]}"
    assert spy.mixed == [], spy.mixed
    return spy


def test_the_spy_catches_an_input_left_on_the_host(on_meta):
    """The control: the plain forward of a host tensor through the meta model mixes devices, and the spy says so
    at the first call (the CPU conv2d with meta weights, which torch computes on the CPU without complaint), before
    torch itself raises further on."""
    loaded, _ = on_meta
    spy = DeviceSpy()
    with pytest.raises(RuntimeError, match="is not on the expected device"), spy:
        loaded.model(torch.zeros(1, 3, *loaded.geometry.img_size))
    assert spy.mixed[0].startswith("conv2d"), spy.mixed


def test_capture_feeds_the_model_on_its_device(on_meta):
    loaded, _ = on_meta
    _runs_on_the_device_until_the_host_copy(lambda: run_with_capture(loaded, drawn_image(2)))


@pytest.mark.parametrize("entry", ["relevance_maps", "logit_lens", "patch_logit_lens", "predict_intervened",
                                   "faithfulness", "model_input"])
def test_every_explain_entry_point_feeds_the_model_on_its_device(on_meta, entry):
    loaded, cap = on_meta
    maps = {"rollout": np.arange(loaded.geometry.num_patches, dtype=np.float32).reshape(loaded.geometry.grid)}
    calls = {
        "relevance_maps": lambda: explain.relevance_maps(loaded, cap, target=3),
        "logit_lens": lambda: explain.logit_lens(loaded, cap),
        "patch_logit_lens": lambda: explain.patch_logit_lens(loaded, cap, 1),
        "predict_intervened": lambda: explain.predict_intervened(loaded, cap, drop=[0, 5], mask=[7], ablate=[(1, 2)]),
        "faithfulness": lambda: explain.faithfulness(loaded, cap, maps, target=3, steps=4, random_orders=2),
    }
    if entry == "model_input":  # no forward: the input itself must be made on the device, from a capture or a picture
        assert explain.model_input(loaded, cap).device.type == "meta"
        assert explain.model_input(loaded, drawn_image(2)).device.type == "meta"
        return
    _runs_on_the_device_until_the_host_copy(calls[entry])


# ----------------------------------------------------------------------------------------------
# Full float32 on a GPU: cuDNN would run the patch embedding in TF32 by default


@pytest.fixture
def tf32_allowed():
    """Both TF32 flags on (torch's matmul default is off), as they were afterwards."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_full_float32_turns_tf32_off_for_cuda_only_and_restores_it(tf32_allowed):
    """The flags are plain process-wide settings: they can be read and set without a GPU."""
    from vit_core.runtime.devices import full_float32

    flags = lambda: (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)  # noqa: E731
    with full_float32(torch.device("cpu")):
        assert flags() == (True, True)
    with full_float32(torch.device("cuda", 0)):
        assert flags() == (False, False)
    assert flags() == (True, True)
    with pytest.raises(KeyError), full_float32(torch.device("cuda", 0)):
        raise KeyError("a pass that fails")
    assert flags() == (True, True)


def test_full_float32_holds_while_any_pass_runs(tf32_allowed):
    """Two passes overlapping in time (two models in two threads): the first to end must not turn TF32 back on
    under the other; the last to end restores it."""
    from vit_core.runtime.devices import full_float32

    first, second = full_float32(torch.device("cuda", 0)), full_float32(torch.device("cuda", 1))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
    second.__exit__(None, None, None)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)


@contextlib.contextmanager
def full_float32_recorded(monkeypatch, loaded, *modules):
    """A stand-in for devices.full_float32 in each of `modules` (the modules that call it by that name) for the
    block; yields (the devices it was asked for, one flag per forward of `loaded`'s head: was its thread inside?).
    Per thread, as the real one is (a TorchFunctionMode): the judge's lanes each enter it for their own forwards."""
    asked: list[torch.device] = []
    heads_seen: list[bool] = []
    this_thread = threading.local()

    @contextlib.contextmanager
    def recording(device):
        asked.append(device)
        before = getattr(this_thread, "inside", False)
        this_thread.inside = True
        try:
            yield
        finally:
            this_thread.inside = before

    for module in modules:
        monkeypatch.setattr(module, "full_float32", recording)
    handle = loaded.model.head.register_forward_pre_hook(
        lambda m, args: heads_seen.append(getattr(this_thread, "inside", False)))
    try:
        yield asked, heads_seen
    finally:
        handle.remove()


@pytest.mark.parametrize("entry", ["run_with_capture", "relevance_maps", "logit_lens", "patch_logit_lens",
                                   "predict_intervened", "faithfulness"])
def test_every_pass_runs_inside_full_float32_for_the_model_device(monkeypatch, tiny, entry):
    """Each entry point's forwards reach the head inside `full_float32(loaded.device)` (recorded by a stand-in)."""
    import vit_core.capture
    import vit_core.explain.passes
    import vit_core.explain.relevance

    cap = run_with_capture(tiny, drawn_image(4))
    with full_float32_recorded(monkeypatch, tiny, vit_core.capture, vit_core.explain.passes,
                               vit_core.explain.relevance) as (asked, heads_seen):
        {
            "run_with_capture": lambda: run_with_capture(tiny, drawn_image(4)),
            "relevance_maps": lambda: explain.relevance_maps(tiny, cap),
            "logit_lens": lambda: explain.logit_lens(tiny, cap),
            "patch_logit_lens": lambda: explain.patch_logit_lens(tiny, cap, 0),
            "predict_intervened": lambda: explain.predict_intervened(tiny, cap, drop=[1]),
            "faithfulness": lambda: explain.faithfulness(tiny, cap, {"m": np.ones(tiny.geometry.grid)}, 0, steps=2,
                                                         random_orders=1),
        }[entry]()
    assert heads_seen and all(heads_seen), heads_seen
    assert asked and all(device == tiny.device for device in asked)
