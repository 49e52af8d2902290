"""The dashboard's model settings: the server's device, any ViT by name, and a picker that names the model shown.

Offline and on the CPU: models are built with random init (`VIT_LENS_RANDOM_INIT=1`), a hub that can't be
reached is simulated by patching vit_core.loading's probe, and the device checks use what this machine has.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import COMMAND_TIMEOUT, assert_healthy, choose_weights, run_app
from dashboard import caches, cli, model_choice, models, session
from dashboard.literal import markdown_literal
from dashboard.server import launch
from vit_core.loading import create, names
from vit_core.runtime.devices import DeviceError, resolve_device

NOT_A_VIT = "resnet50 is not a Vision Transformer of timm's VisionTransformer family"
# Cheap members of the family (random init, on 2 CPU cores): 4 registers at 256 px (the DINOv2 register
# models are 518 px: 1,374 tokens, about 0.5 GB of attention per capture), DeiT-III, SigLIP (no class token).
REGISTERS, DEIT3, SIGLIP = "vit_little_patch16_reg4_gap_256", "deit3_small_patch16_224", "vit_base_patch16_siglip_224"


def header(at) -> str:
    """The page's lines about the model: the header's one line (model, image, prediction) and its model details."""
    return "\n".join(m.value for m in at.markdown if re.search(r"\b[Mm]odel \*\*", m.value))


def type_into_picker(at, typed: str) -> None:
    """Send what the browser sends when a name is typed into the Model picker and confirmed with Enter: the
    typed string as the widget's value. (AppTest's set_value takes listed options only, so the string is
    added to this test's copy of the options first; the server's option list is unchanged.)"""
    picker = at.selectbox(key=session.K_MODEL)
    picker.options.append(typed)
    picker.set_value(typed).run()
    assert_healthy(at)


def offline_hub(monkeypatch) -> None:
    """Nothing in the hub cache and no hub: pretrained loads fail fast with OfflineError."""
    monkeypatch.setattr(create, "hub_reachable", lambda: False)
    monkeypatch.setattr(create, "_cached_weights_file", lambda hub_id: None)


# ----------------------------------------------------------------------------------------------
# The server's device


def test_the_device_setting_is_parsed_and_resolved_once(monkeypatch):
    monkeypatch.delenv("VIT_LENS_DEVICE", raising=False)
    assert models.device_setting() == "auto" and models.server_device() == resolve_device("auto")
    monkeypatch.setenv("VIT_LENS_DEVICE", " CPU ")
    before = models._resolved_device.cache_info().hits
    assert models.server_device() == torch.device("cpu") == models.server_device()
    assert models._resolved_device.cache_info().hits == before + 1  # resolved once, then remembered
    monkeypatch.setenv("VIT_LENS_DEVICE", "gpu")
    with pytest.raises(DeviceError, match="unknown device 'gpu'"):
        models.server_device()
    if not torch.cuda.is_available():
        monkeypatch.setenv("VIT_LENS_DEVICE", "cuda:1")
        with pytest.raises(DeviceError, match="no usable CUDA GPU"):
            models.server_device()


def test_the_device_option_is_taken_out_of_streamlits_arguments():
    assert launch.split_device_option(["--server.port", "8502"]) == (None, ["--server.port", "8502"])
    assert launch.split_device_option(["--device", "cpu", "--server.port", "8502"]) == ("cpu", ["--server.port", "8502"])
    assert launch.split_device_option(["--server.headless=true", "--device=cuda:1"]) == ("cuda:1", ["--server.headless=true"])
    assert launch.split_device_option(["--device"]) == ("", [])
    assert launch.split_device_option(["--device", "--server.port", "8502"]) == ("", ["--server.port", "8502"])


@pytest.mark.parametrize("args, env, message", [
    (["--device", "gpu"], {}, "vit-lens dashboard: unknown device 'gpu': use auto, cpu, cuda, cuda:N or mps."),
    ([], {"VIT_LENS_DEVICE": "tpu"}, "vit-lens dashboard: unknown device 'tpu': use auto, cpu, cuda, cuda:N or mps."),
    (["--device"], {}, "vit-lens dashboard: --device needs a value: auto, cpu, cuda, cuda:N or mps."),
    ([], {"VIT_LENS_ANY_MODEL": "maybe"}, "vit-lens dashboard: VIT_LENS_ANY_MODEL='maybe': use on or off."),
    ([], {"VIT_LENS_HUGE_PAGES": "2"}, "vit-lens dashboard: VIT_LENS_HUGE_PAGES='2': use on or off."),
])
def test_a_bad_device_or_setting_stops_the_server_at_start_with_one_line(args, env, message):
    run = subprocess.run([sys.executable, "-m", "dashboard.serve", *args, "--server.headless", "true"],
                         capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env={**os.environ, **env})
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[-1] == message and "Traceback" not in run.stderr and "warm-up" not in run.stderr, run.stderr


def test_vit_lens_dashboard_takes_the_device_option(monkeypatch):
    monkeypatch.setenv("VIT_LENS_DEVICE", "auto")  # restored afterwards: main() sets it in this process
    replaced = []  # a restart here (dashboard.server.launch.restart_with_huge_pages) would have replaced pytest's process
    monkeypatch.setattr(os, "execve", lambda *args: replaced.append(args))
    with pytest.raises(SystemExit, match="unknown device 'gpu'"):
        cli.main(["dashboard", "--device=gpu", "--server.port", "8502"])
    assert os.environ["VIT_LENS_DEVICE"] == "gpu" and replaced == []


def test_the_sidebar_shows_the_servers_device(tiny_env, monkeypatch):
    monkeypatch.setenv("VIT_LENS_DEVICE", "cpu")
    at = run_app()
    assert "Runs on: CPU (the server's device)." in [c.value for c in at.sidebar.caption]
    loaded = caches.load(models.ModelRequest(models.TEST_TINY))
    assert model_choice.device_caption(loaded) == "Runs on: CPU (the server's device)."


def test_a_bad_device_setting_ends_the_page_with_one_sentence(tiny_env, monkeypatch):
    """`streamlit run dashboard/app.py` skips dashboard.serve's check: the page says it instead of a traceback."""
    monkeypatch.setenv("VIT_LENS_DEVICE", "gpu")
    at = run_app()
    why = markdown_literal("unknown device 'gpu': use auto, cpu, cuda, cuda:N or mps.")  # shown as written
    assert [e.value for e in at.error] == [f"This server's device setting (VIT_LENS_DEVICE) can't be used: {why}"]
    assert not at.tabs


# ----------------------------------------------------------------------------------------------
# Any ViT


def test_the_family_list_is_timms_vision_transformers_with_their_tags():
    names = models.family_model_names()
    assert names is models.family_model_names()  # read from timm once
    for name in (REGISTERS, DEIT3, SIGLIP, "vit_small_patch14_reg4_dinov2", "deit_tiny_distilled_patch16_224",
                 "vit_base_patch16_224.augreg2_in21k_ft_in1k", "deit3_small_patch16_224.fb_in22k_ft_in1k"):
        assert name in names, name
    for name in ("resnet50", "swin_tiny_patch4_window7_224", "eva02_tiny_patch14_224", "beit_base_patch16_224",
                 "vit_tiny_r_s16_p8_224"):  # the hybrid's tokens come from a CNN stem: left out
        assert name not in names, name
    i = names.index("vit_base_patch16_224")
    assert names[i + 1].startswith("vit_base_patch16_224.")  # an architecture's tags follow it


def test_listed_models_pass_load_models_family_check():
    """A sample across the list, built on 'meta' (shapes only) by load_model's own check."""
    architectures = sorted({name.split(".")[0] for name in models.family_model_names()})
    for name in [REGISTERS, DEIT3, SIGLIP, *architectures[::25]]:
        assert names._probe_family(name, {}) is not None, name


def test_with_any_model_off_the_picker_has_only_the_fixed_list(tiny_env, monkeypatch):
    monkeypatch.setenv("VIT_LENS_ANY_MODEL", "off")
    assert models.picker_options() == list(models.model_choices())
    assert models.typed_name_refusal(DEIT3) == "this server offers only the models in its list."
    at = run_app(model=DEIT3)  # a link naming a model off the list: ignored
    picker = at.selectbox(key=session.K_MODEL)
    assert picker.options == list(models.model_choices().values()) and picker.value == models.TEST_TINY
    type_into_picker(at, DEIT3)  # what a client could send anyway: not taken either
    assert at.selectbox(key=session.K_MODEL).value == models.TEST_TINY and "vit_tiny_patch16_224" in header(at)
    monkeypatch.setenv("VIT_LENS_ANY_MODEL", "on")
    assert DEIT3 in models.picker_options() and models.typed_name_refusal(DEIT3) is None
    assert "at most" in models.typed_name_refusal("vit_" * 60)


@pytest.mark.parametrize("name, prefix, prediction", [
    (REGISTERS, "4 prefix", r"\*\*.+\*\* \(\d+\.\d%\)"),  # 4 registers, no class token
    (DEIT3, "1 prefix", r"\*\*.+\*\* \(\d+\.\d%\)"),
    (SIGLIP, "0 prefix", "no classifier head"),  # timm's SigLIP image towers have no classifier
])
def test_any_vit_of_the_family_loads_with_random_init_and_shows_its_prediction(tiny_env, monkeypatch, name, prefix,
                                                                                 prediction):
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1")
    at = run_app()
    at.selectbox(key=session.K_MODEL).set_value(name).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    shown = header(at)
    assert f"Model **{name}** (random init" in shown and prefix in shown and re.search(prediction, shown), shown
    assert at.selectbox(key=session.K_MODEL).value == name


def test_a_non_vit_is_refused_with_load_models_sentence_and_the_previous_model_kept(tiny_env):
    at = run_app()
    type_into_picker(at, "resnet50")
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and NOT_A_VIT in errors[0] and "Still showing test-tiny." in errors[0], errors
    assert at.selectbox(key=session.K_MODEL).value == models.TEST_TINY and "vit_tiny_patch16_224" in header(at)


def notes(at) -> list[str]:
    return [i.value for i in at.sidebar.info]


def why(at) -> str:
    """The text behind the sidebar's "Why?" expanders."""
    return "\n".join(m.value for e in at.sidebar.expander if e.label == "Why?" for m in e.markdown)


def test_a_typed_hub_id_offline_says_so_at_once(tiny_env, monkeypatch):
    offline_hub(monkeypatch)
    at = run_app()
    type_into_picker(at, "hf-hub:someone/their-vit")
    hub_id = markdown_literal("hf-hub:someone/their-vit")  # shown as typed, not as markup
    assert not at.error, [e.value for e in at.error]  # offline is a calm note, not a failure
    assert notes(at) == [f"**Offline**: **{hub_id}** can't be downloaded; still showing **test-tiny**."]
    assert why(at).startswith(f"Pretrained weights for {hub_id} are not in the local cache")
    assert not at.button  # a hub id's architecture comes from the hub too: no random weights offered
    assert at.selectbox(key=session.K_MODEL).value == models.TEST_TINY


# ----------------------------------------------------------------------------------------------
# Offline: a calm note, and the random weights of a model whose pretrained ones can't be had


def test_offline_start_is_a_calm_note_and_offers_the_models_random_weights(tiny_env, monkeypatch):
    from dashboard import model_choice, text
    from vit_core import TEACHING_MODEL

    offline_hub(monkeypatch)
    monkeypatch.setenv("VIT_LENS_MODEL", "vit_tiny_patch16_224")  # the start-up model, as ViT-B/16 is in a class
    at = run_app()
    assert not at.error, [e.value for e in at.error]
    assert notes(at) == ["**Offline**: using the bundled Shapes ViT."]
    assert "can't be reached" in why(at) and "random weights" in why(at)
    assert at.selectbox(key=session.K_MODEL).value == TEACHING_MODEL and f"**{TEACHING_MODEL}**" in header(at)
    at.run()  # the note stays while the bundled model stands in
    assert notes(at) == ["**Offline**: using the bundled Shapes ViT."] and not at.error

    at.button(key=f"{model_choice.K_RANDOM_WEIGHTS}_picker").click().run()
    assert_healthy(at)
    assert not at.error and not notes(at), [e.value for e in at.error] + notes(at)
    assert at.selectbox(key=session.K_MODEL).value == "vit_tiny_patch16_224"
    assert "Model **vit_tiny_patch16_224** (random init" in header(at)
    assert text.UNTRAINED in [w.value for w in at.warning]  # the page says the weights are random
    assert any("Random weights (structure only)" in c.value for c in at.sidebar.caption)

    at.button(key=model_choice.K_PRETRAINED_WEIGHTS).click().run()  # still offline: the random weights stay
    assert_healthy(at)
    assert notes(at) == ["**Offline**: **vit_tiny_patch16_224** can't be downloaded; its random weights stay."]
    at.run()
    assert "Model **vit_tiny_patch16_224** (random init" in header(at) and not at.error


def test_a_bad_weights_file_is_still_a_failure_in_red(tiny_env):
    from dashboard import model_choice

    at = run_app()
    choose_weights(at, "vit_tiny_patch16_224", "notes.safetensors", b"not a safetensors file")
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("That model can't be loaded: notes.safetensors"), errors
    assert not notes(at) and not [b for b in at.button if b.key.startswith(model_choice.K_RANDOM_WEIGHTS)]


def test_an_uploaded_checkpoint_is_named_by_its_own_file_and_a_three_class_head_is_no_top_5(tiny_env, tmp_path):
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    at = run_app()
    choose_weights(at, "vit_tiny_patch16_224", "my finetune.safetensors", (tmp_path / "w.safetensors").read_bytes())
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    captions = [c.value for c in at.sidebar.caption]
    assert any("Weights: file: my finetune.safetensors" in c for c in captions), captions
    assert "(file: my finetune.safetensors)" in header(at)
    assert not any(re.search(r"[0-9a-f]{32}", line) for line in [*captions, header(at)])  # not the server's copy
    shown = [m.value for m in at.markdown] + [b.label for b in at.selectbox]
    assert not [line for line in shown if re.search(r"top 5 of 3", line, re.IGNORECASE)]


def test_the_refusals_kinds():
    """Which failures are calm notes offering random weights, and which stay failures."""
    from dashboard.model_choice import failure_note
    from vit_core import ModelError, OfflineError, WeightsError

    offline, shapes = OfflineError("no hub"), models.ModelRequest(models.TEACHING_MODEL)
    note = failure_note(models.ModelRequest("vit_base_patch16_224"), offline, shapes, "", chosen=False)
    assert (note.failure, note.standing, note.random_weights_for, note.open_detail) == (False, True,
                                                                                         "vit_base_patch16_224", False)
    chosen = failure_note(models.ModelRequest("vit_small_patch16_224"), offline, models.ModelRequest("vit_base_patch16_224"),
                          "", chosen=True)
    assert chosen.text == ("**Offline**: **vit_small_patch16_224** can't be downloaded; still showing "
                           "**vit_base_patch16_224**.") and chosen.open_detail
    for error in (WeightsError("bad file"), ModelError("resnet50 is not a Vision Transformer")):
        failed = failure_note(models.ModelRequest("vit_base_patch16_224"), error, shapes, "Still showing x.", chosen=True)
        assert failed.failure and not failed.random_weights_for and failed.text.endswith("Still showing x.")
    untrained = failure_note(models.ModelRequest("vit_base_patch16_224"), offline, models.ModelRequest(models.TEST_TINY),
                             "The bundled teaching model is missing too", chosen=False, untrained=True)
    assert untrained.failure  # the stand-in is untrained: that stays loud
    assert models.pretrained_unavailable("vit_base_patch16_224", offline)
    assert not models.pretrained_unavailable("hf-hub:someone/their-vit", offline)
    assert not models.pretrained_unavailable("vit_base_patch16_224", ModelError("not a ViT"))  # timm has its weights
    no_weights = next(n for n in models.family_model_names() if "." not in n and not getattr(
        __import__("timm").models.get_pretrained_cfg(n), "hf_hub_id", None))
    assert models.pretrained_unavailable(no_weights, ModelError("timm has no pretrained weights"))


# ----------------------------------------------------------------------------------------------
# Typing part of a name


def test_a_typed_part_of_a_name_means_the_best_matching_model():
    choices = models.model_choices()
    options = models.picker_options()
    assert models.match_typed_name("vit_small", choices, options) == ("vit_small_patch16_224", models.match_typed_name(
        "vit_small", choices, options)[1])  # the listed model first, though many others match
    assert models.match_typed_name("  SigLIP ", choices, options)[0] == "vit_base_patch16_siglip_224"  # its label
    assert models.match_typed_name("shapes", choices, options)[0] == models.TEACHING_MODEL
    assert models.match_typed_name("b/16 384", choices, options)[0] == "vit_base_patch16_384"  # every word
    picked, count = models.match_typed_name("dinov2", choices, options)
    assert count > 4 and picked == min((n for n in options if "dinov2" in n), key=lambda n: (len(n), n))
    assert "." not in picked  # an architecture before its tagged names
    assert models.match_typed_name("VIT_TINY_PATCH16_224", choices, options) == ("vit_tiny_patch16_224", 1)  # exact
    for nothing in ("resnet50", "hf-hub:someone/vit", "   ", "no such model"):
        assert models.match_typed_name(nothing, choices, options) is None, nothing


def test_typing_part_of_a_name_and_enter_picks_the_matching_model(tiny_env, monkeypatch):
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1")
    at = run_app()
    type_into_picker(at, "little_patch16_reg4_gap")  # what Streamlit sends: the typed text, not an option
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key=session.K_MODEL).value == REGISTERS  # the picker names the model picked
    assert f"Model **{REGISTERS}**" in header(at)
    said = notes(at)
    typed, picked = markdown_literal("little_patch16_reg4_gap"), markdown_literal(REGISTERS)
    assert len(said) == 1 and said[0].startswith(f"“{typed}” matches "), said
    assert said[0].endswith(f" models: showing **{picked}**. Type more of a name to pick another."), said


# ----------------------------------------------------------------------------------------------
# The picker after a failed load


def test_after_a_failed_load_the_picker_names_the_model_shown(tiny_env, monkeypatch):
    """The bug: the picker kept naming the model that failed while the previous one was shown."""
    offline_hub(monkeypatch)
    at = run_app()
    at.selectbox(key=session.K_MODEL).set_value("vit_small_patch16_224").run()
    assert_healthy(at)
    offline = "**Offline**: **vit_small_patch16_224** can't be downloaded; still showing **test-tiny**."
    assert not at.error and notes(at) == [offline]
    assert at.selectbox(key=session.K_MODEL).value == models.TEST_TINY  # was vit_small_patch16_224
    assert "vit_tiny_patch16_224" in header(at)
    at.run()  # any later rerun: the model shown, still named, and the note kept while it stands in
    assert_healthy(at)
    assert at.selectbox(key=session.K_MODEL).value == models.TEST_TINY and not at.error
    assert notes(at) == [offline]
