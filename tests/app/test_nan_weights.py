"""A weights file holding NaN or infinite values is refused in the model picker in one sentence that names the
tensor (vit_core's load refuses it), and the pages go on with the previous model: no ValueError, no "nan%"."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import assert_healthy, choose_weights, run_app

TENSOR = "blocks.0.attn.qkv.weight"


@pytest.fixture(scope="module")
def nan_weights(tmp_path_factory) -> bytes:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state[TENSOR][0, 0] = float("nan")
    state["head.bias"][1] = float("inf")
    path = tmp_path_factory.mktemp("weights") / "w.safetensors"
    save_file(state, str(path))
    return path.read_bytes()


def everything_shown(at) -> list[str]:
    return ([m.value for m in at.markdown] + [c.value for c in at.caption] + [e.value for e in at.error]
            + [w.value for w in at.warning] + [i.value for i in at.info] + [str(p.value) for p in at.get("progress")]
            + [s.proto.spec for s in at.get("plotly_chart")])


@pytest.mark.parametrize("view", ["6 Distance", "Registers & norms"])
def test_nan_weights_are_refused_naming_the_tensor_and_the_view_keeps_the_previous_model(tiny_env, nan_weights, view):
    at = run_app(view=view)
    choose_weights(at, "vit_tiny_patch16_224", "diverged.safetensors", nan_weights)
    assert_healthy(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    assert "diverged.safetensors" in errors[0] and TENSOR in errors[0] and "NaN" in errors[0], errors
    sentence = re.sub(r"\([^)]*\)", "", errors[0].split("Still showing")[0]).strip()
    assert sentence.endswith(".") and ". " not in sentence.rstrip("."), errors[0]  # one sentence, then what stays
    shown = everything_shown(at)
    assert not any(re.search(r"nan\s*%|\bnan\b", text, re.IGNORECASE) for text in shown
                   if TENSOR not in text), [t for t in shown if "nan" in t.lower()][:3]
    assert not any("ValueError" in text for text in shown)
    assert any("Still showing test-tiny." in e for e in errors)
    at.run()  # the next rerun: the previous model still, nothing raised
    assert_healthy(at)
    assert not any("ValueError" in text for text in everything_shown(at))


def test_nan_weights_leave_the_many_images_page_working(tiny_env, nan_weights):
    from dashboard import image_sets, session

    at = run_app()
    choose_weights(at, "vit_tiny_patch16_224", "diverged.safetensors", nan_weights)
    at.switch_page("page_scripts/many_images.py").run()
    assert_healthy(at)
    at.radio(key=session.K_MANY_SOURCE).set_value(image_sets.SHAPES).run()
    at.button(key=session.K_MANY_RUN).click().run()
    assert_healthy(at)
    shown = everything_shown(at)
    assert not any("ValueError" in text or re.search(r"nan\s*%", text, re.IGNORECASE) for text in shown)
    assert [s.value for s in at.success] and np.isfinite(
        [float(x) for x in re.findall(r"[-+]?\d+\.\d+", " ".join(s.value for s in at.success))]).all()
