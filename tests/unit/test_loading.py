"""Loading: local weights files (safely), the hub cache with no network, fail-fast offline, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vit_core import ModelError, OfflineError, WeightsError, load_model
from vit_core.loading import TEACHING_MODEL, teaching_model_available

TINY = dict(depth=2)  # vit_tiny_patch16_224 with 2 blocks


def tiny_state(num_classes=10, seed=1, **kwargs):
    import timm

    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=num_classes, **{**TINY, **kwargs})
    return {k: v.contiguous() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------- local files


def test_safetensors_file_with_labels_beside_it(tmp_path):
    state = tiny_state(num_classes=10)
    path = tmp_path / "ft.safetensors"
    save_file(state, str(path))
    (tmp_path / "labels.txt").write_text("\n".join(f"thing {i}" for i in range(10)))
    loaded = load_model("vit_tiny_patch16_224", weights=path, **TINY)
    assert loaded.geometry.num_classes == 10  # head size taken from the file
    assert loaded.labels == tuple(f"thing {i}" for i in range(10))
    assert loaded.weights == "file: ft.safetensors"
    own = loaded.model.state_dict()
    assert all(torch.equal(own[k], state[k]) for k in state)
    assert not loaded.model.training


@pytest.mark.parametrize("wrap", [None, "model", "state_dict"])
def test_pth_checkpoints_load_with_weights_only(tmp_path, wrap):
    state = tiny_state(num_classes=5)
    path = tmp_path / "ft.pth"
    torch.save(state if wrap is None else {wrap: state, "epoch": 3}, path)
    loaded = load_model("vit_tiny_patch16_224", weights=path, **TINY)
    assert torch.equal(loaded.model.head.weight, state["head.weight"])
    assert loaded.labels is None and loaded.label(3) == "class 3"


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"head.weight": torch.zeros(2, 2), "payload": _RunsCode(marker)}, path)
    with pytest.raises(WeightsError, match="refused.*Python objects"):
        load_model("vit_tiny_patch16_224", weights=path, **TINY)
    assert not marker.exists()


def test_wrong_architecture_is_refused_with_the_mismatch(tmp_path):
    import timm

    path = tmp_path / "small.safetensors"
    small = timm.create_model("vit_small_patch16_224", pretrained=False, depth=2)
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, str(path))
    with pytest.raises(WeightsError, match="does not fit vit_tiny_patch16_224.*shape mismatch"):
        load_model("vit_tiny_patch16_224", weights=path, **TINY)


def test_missing_blocks_are_refused(tmp_path):
    path = tmp_path / "deeper.safetensors"
    save_file(tiny_state(depth=3), str(path))
    with pytest.raises(WeightsError, match="unexpected tensors"):
        load_model("vit_tiny_patch16_224", weights=path, **TINY)


def test_fewer_blocks_name_the_missing_tensors_and_a_wider_head_its_shape(tmp_path):
    path = tmp_path / "shallow.safetensors"
    state = tiny_state(depth=1)
    state["head.weight"] = torch.zeros(10, 7)  # and a head of the wrong width (the class count comes from dim 0)
    save_file(state, str(path))
    with pytest.raises(WeightsError) as refused:
        load_model("vit_tiny_patch16_224", weights=path, **TINY)
    message = str(refused.value)
    assert message.startswith("shallow.safetensors does not fit vit_tiny_patch16_224: 12 missing tensors (blocks.1.")
    assert ", ...); shape mismatch: head.weight (10, 7) vs (10, 192) (file vs model). Is it the right architecture?" in message


def test_a_weights_file_is_read_once_and_the_model_checked_once(tmp_path, monkeypatch):
    from vit_core.loading import create, names, weights

    path = tmp_path / "ft.safetensors"
    save_file(tiny_state(num_classes=10), str(path))
    reads, checks = [], []
    read, check = weights.read_state_dict, names.check_supported
    monkeypatch.setattr(weights, "read_state_dict", lambda p: reads.append(p) or read(p))
    for module in (names, create):  # the probe on 'meta' is checked in one, a model without a probe in the other
        monkeypatch.setattr(module, "check_supported", lambda model, name: checks.append(name) or check(model, name))
    loaded = load_model("vit_tiny_patch16_224", weights=path, **TINY)
    assert loaded.geometry.num_classes == 10
    assert len(reads) == 1 and len(checks) == 1


def test_truncated_safetensors_is_refused(tmp_path):
    path = tmp_path / "cut.safetensors"
    save_file(tiny_state(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(WeightsError, match="not a valid safetensors file"):
        load_model("vit_tiny_patch16_224", weights=path, **TINY)


def test_label_file_with_the_wrong_class_count_is_refused(tmp_path):
    path = tmp_path / "ft.safetensors"
    save_file(tiny_state(num_classes=10), str(path))
    labels = tmp_path / "names.json"
    labels.write_text(json.dumps(["a", "b", "c"]))
    with pytest.raises(WeightsError, match="3 classes but the model's head has 10"):
        load_model("vit_tiny_patch16_224", weights=path, labels=labels, **TINY)


def test_unsupported_weights_format(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x01")
    with pytest.raises(WeightsError, match="unsupported weights format"):
        load_model("vit_tiny_patch16_224", weights=path, **TINY)


# ---------------------------------------------------------------------------------- names


@pytest.mark.parametrize("name,message", [
    ("resnet50", "not a Vision Transformer"),
    ("swin_tiny_patch4_window7_224", "not a Vision Transformer"),
    ("vit_bas_patch16_224", "Did you mean vit_base_patch16_224"),
    ("vit_base_patch16_224.x", r"no pretrained tag 'x' for vit_base_patch16_224 \(its tags are augreg2_in21k_ft_in1k"),
    ("vit_tiny_patch16_224.no_such_tag", r"no pretrained tag 'no_such_tag' for vit_tiny_patch16_224"),
])
def test_models_outside_the_family_are_refused(name, message):
    with pytest.raises(ModelError, match=message):
        load_model(name, pretrained=False)


@pytest.mark.parametrize("pretrained", [False, True])
def test_an_unknown_pretrained_tag_is_a_model_error_not_timms_runtime_error(pretrained):
    """`vit_base_patch16_224.x` is a ModelError, not timm's RuntimeError, whether its weights are wanted or not."""
    with pytest.raises(ModelError, match=r"^timm has no pretrained tag 'x' for vit_base_patch16_224 .*\)\.$"):
        load_model("vit_base_patch16_224.x", pretrained=pretrained)


def test_a_known_pretrained_tag_still_builds():
    assert load_model("vit_tiny_patch16_224.augreg_in21k", pretrained=False, **TINY).name == "vit_tiny_patch16_224.augreg_in21k"


def test_random_init_is_deterministic_under_its_seed():
    a = load_model("vit_tiny_patch16_224", pretrained=False, seed=3, **TINY)
    b = load_model("vit_tiny_patch16_224", pretrained=False, seed=3, **TINY)
    c = load_model("vit_tiny_patch16_224", pretrained=False, seed=4, **TINY)
    assert torch.equal(a.model.pos_embed, b.model.pos_embed)
    assert not torch.equal(a.model.pos_embed, c.model.pos_embed)
    assert a.labels is not None and len(a.labels) == 1000 and a.labels[0].startswith("tench")  # ImageNet names, offline


@pytest.mark.skipif(not teaching_model_available(), reason="the bundled teaching model is not built yet")
def test_bundled_teaching_model_loads_offline():
    loaded = load_model(TEACHING_MODEL)
    assert loaded.weights.startswith("bundled")
    assert loaded.labels is not None and len(loaded.labels) == loaded.geometry.num_classes >= 8
    assert loaded.geometry.has_class_token and loaded.geometry.has_pos_embed
    assert loaded.geometry.num_layers >= 4 and loaded.geometry.num_heads >= 4


# ---------------------------------------------------------------------------------- the hub, offline

HUB_ID = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # vit_tiny_patch16_224's default pretrained tag


def populate_hub_cache(hf_home: Path) -> dict[str, torch.Tensor]:
    """Locally made weights placed in the hub cache layout, as a download would leave them."""
    import timm

    torch.manual_seed(7)
    state = {k: v.contiguous() for k, v in timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict().items()}
    repo = hf_home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    save_file(state, str(snapshot / "model.safetensors"))
    cfg = timm.models.get_pretrained_cfg("vit_tiny_patch16_224").to_dict()
    kept = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std", "num_classes", "classifier", "first_conv")
    (snapshot / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "num_classes": 1000,
        "pretrained_cfg": {k: v for k, v in cfg.items() if k in kept},
    }))
    return state


def run_isolated(code: str, hf_home: Path, offline: bool) -> dict:
    """Run `code` in a fresh interpreter with its own hub cache; it prints one JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(hf_home)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LOAD_AND_REPORT = """
    import json, time
    import torch
    from vit_core import load_model, OfflineError
    started = time.perf_counter()
    try:
        loaded = load_model({name!r})
        pos_embed_sum = float(loaded.model.pos_embed.double().sum())
        result = {{"weights": loaded.weights, "pos_embed_sum": pos_embed_sum, "classes": len(loaded.labels)}}
    except OfflineError as e:
        result = {{"offline_error": str(e)}}
    result["seconds"] = time.perf_counter() - started
    print(json.dumps(result))
"""


@pytest.mark.parametrize("offline_flag", [False, True])
def test_populated_hub_cache_is_used_without_network(tmp_path, offline_flag):
    state = populate_hub_cache(tmp_path)
    result = run_isolated(LOAD_AND_REPORT.format(name="vit_tiny_patch16_224"), tmp_path, offline=offline_flag)
    assert result.get("weights") == f"hub cache: {HUB_ID}", result
    assert result["pos_embed_sum"] == pytest.approx(float(state["pos_embed"].double().sum()))
    assert result["classes"] == 1000


def test_hf_hub_id_through_timms_hub_path_with_hf_hub_offline(tmp_path):
    state = populate_hub_cache(tmp_path)
    result = run_isolated(LOAD_AND_REPORT.format(name=f"hf-hub:{HUB_ID}"), tmp_path, offline=True)
    assert result.get("weights") == f"hub: {HUB_ID}", result
    assert result["pos_embed_sum"] == pytest.approx(float(state["pos_embed"].double().sum()))


@pytest.mark.parametrize("offline_flag", [False, True])
def test_offline_without_cache_fails_within_seconds_and_says_what_to_do(tmp_path, offline_flag):
    result = run_isolated(LOAD_AND_REPORT.format(name="vit_base_patch16_224"), tmp_path, offline=offline_flag)
    message = result.get("offline_error", "")
    assert "can't be reached" in message and "HF_HOME" in message and TEACHING_MODEL in message, result
    assert result["seconds"] < 10  # timm alone spends ~47 s in retries here


def test_offline_error_in_process():
    if os.environ.get("HF_HUB_OFFLINE"):
        pytest.skip("runs the network probe path")
    from vit_core.loading.create import hub_reachable

    if hub_reachable():
        pytest.skip("the hub is reachable from this machine")
    with pytest.raises(OfflineError, match="can't be reached"):
        load_model("vit_small_patch16_224")


def test_a_hanging_network_lookup_counts_as_offline_within_the_deadline(monkeypatch):
    import time
    import urllib.request

    from vit_core.loading import create

    def hanging_lookup(*args, **kwargs):  # a DNS lookup that doesn't return in time, then fails as a real one would
        time.sleep(60)
        raise TimeoutError("timed out")

    monkeypatch.setattr(urllib.request, "urlopen", hanging_lookup)
    create._hub_reachable_at.cache_clear()
    started = time.perf_counter()
    try:
        assert create._hub_reachable_at(-1) is False
    finally:
        create._hub_reachable_at.cache_clear()
    assert time.perf_counter() - started < create.HUB_PROBE_TIMEOUT_S + 2
