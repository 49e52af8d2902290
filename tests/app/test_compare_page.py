"""The Compare tab (dashboard/views/compare.py) on the tiny test model against its random init of another seed: the
page draws without an error, its numbers are the library's, and the set comparison runs; its figure builders headless."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from conftest import assert_healthy, run_app
from dashboard import compare_models, models
from dashboard.figures import base
from dashboard.figures import compare as compare_figures
from dashboard.models import TEST_TINY
from dashboard.views import compare as compare_view

TAB = "Compare"


def test_the_compare_tab_shows_a_against_its_random_init_and_compares_them_over_a_set(tiny_env):
    at = run_app(view=TAB)
    picker = at.selectbox(key=compare_view.K_MODEL_B)
    assert picker.value == compare_models.RANDOM_INIT_OF_A  # the offline story is the first choice
    kl = at.metric[0]
    assert kl.label == "KL(A || B)" and float(kl.value.split()[0]) > 0  # two random inits disagree
    shown = len(at.get("image"))
    assert shown >= 3  # attention triplet, rollout triplet, the logit lens of both
    at.button(key=f"{compare_view.K_SET}_run").click().run()
    assert_healthy(at)
    texts = " ".join(m.value for m in at.markdown)
    assert "Heads that changed most" in texts and f"of {compare_models.SET_SIZE} images" in texts
    assert len(at.get("image")) >= shown + 2  # the CKA heatmap and both models' distances
    at.slider(key=compare_view.K_LAYER).set_value(1).run()  # a control reruns its fragment only, without an error
    assert_healthy(at)
    _a_changed_image_opens_above(at)


def _kl_shown(at) -> float:
    return float(at.metric[0].value.split()[0])


def _a_changed_image_opens_above(at) -> None:
    """Clicking a changed image's button shows it above: the page's numbers are then that image's (its KL is the one
    of the two models' captures of it); Back shows the sidebar's image again."""
    import vit_core
    from dashboard import image_sets
    from vit_core.compare import prediction_kl

    opens = [b for b in at.button if b.key.startswith(f"{compare_view.K_OPEN}_")]
    assert opens  # two random inits answer differently on some of the set
    name = opens[0].key.removeprefix(f"{compare_view.K_OPEN}_")
    sidebar_kl = _kl_shown(at)
    opens[0].click().run()
    assert_healthy(at)
    assert any(name in info.value for info in at.info)
    tiny = [vit_core.load_model("vit_tiny_patch16_224", pretrained=False, seed=seed, depth=2, device="cpu") for seed in (0, 1)]
    data = dict(image_sets.shapes_set(tiny[0], compare_models.SET_SIZE, compare_models.SET_SEED).sources)[name]
    image = Image.open(io.BytesIO(data)).convert("RGB")
    caps = [vit_core.run_with_capture(m, image) for m in tiny]
    assert at.metric[0].value == f"{float(prediction_kl(caps[0].logits, caps[1].logits)):.3g} nats"
    assert _kl_shown(at) != sidebar_kl
    at.button(key=compare_view.K_BACK).click().run()
    assert_healthy(at)
    assert not any(name in info.value for info in at.info) and _kl_shown(at) == sidebar_kl


def test_a_link_keeps_model_b_and_the_view(tiny_env):
    """`?view=Compare&model_b=<the test model's label>&compare_layer=1` (a bound selectbox keeps its option's label):
    B is A itself (KL 0, the same top-1) at block 1, and the URL keeps B beside the sidebar's model and the tab."""
    label = models.model_choices()[TEST_TINY]
    at = run_app(view=TAB, model_b=label, compare_layer="1")
    assert at.selectbox(key=compare_view.K_MODEL_B).value == TEST_TINY
    assert at.slider(key=compare_view.K_LAYER).value == 1
    assert _kl_shown(at) == 0 and at.metric[0].delta == "same top-1"
    at.selectbox(key=compare_view.K_MODEL_B).set_value(compare_models.RANDOM_INIT_OF_A).run()
    assert_healthy(at)
    assert _kl_shown(at) > 0
    at.selectbox(key=compare_view.K_MODEL_B).set_value(TEST_TINY).run()
    assert at.query_params[compare_view.K_MODEL_B] == label and "Compare" in at.query_params["view"]


def test_b_from_a_weights_file_of_as_architecture_is_compared_and_a_bad_file_is_one_sentence(tiny_env, tmp_path):
    """Model B as a weights file: the tiny test model's architecture saved at another seed (a stand-in for A after
    fine-tuning). Before the upload the tab says what to upload; after it, B is named by the user's file and the KL
    shown is the library's between A's and those weights' captures of the image; a file that is not weights is one
    error sentence naming it."""
    from safetensors.torch import save_file

    import vit_core
    from dashboard import session
    from vit_core.compare import prediction_kl

    b = vit_core.load_model("vit_tiny_patch16_224", pretrained=False, seed=3, depth=2, device="cpu")
    save_file({k: v.contiguous() for k, v in b.model.state_dict().items()}, str(tmp_path / "b.safetensors"))
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (120, 160, 3), dtype=np.uint8)).save(buffer, "PNG")
    at = run_app(view=TAB)
    at.file_uploader(key=session.K_UPLOAD).set_value(("noise.png", buffer.getvalue(), "image/png")).run()
    at.selectbox(key=compare_view.K_MODEL_B).set_value(models.UPLOAD_WEIGHTS).run()
    assert_healthy(at)
    assert any("Upload B's weights file" in info.value for info in at.info) and not at.metric
    at.file_uploader(key=session.K_WEIGHTS_B).set_value(
        ("finetuned.safetensors", (tmp_path / "b.safetensors").read_bytes(), "application/octet-stream")).run()
    assert_healthy(at)
    assert not at.error, [e.value for e in at.error]
    assert any("finetuned.safetensors" in c.value for c in at.caption)  # named by the user's file, not the server's copy
    a = vit_core.load_model("vit_tiny_patch16_224", pretrained=False, depth=2, device="cpu")
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    cap_a, cap_b = vit_core.run_with_capture(a, image), vit_core.run_with_capture(b, image)
    assert at.metric[0].value == f"{float(prediction_kl(cap_a.logits, cap_b.logits)):.3g} nats"
    at.file_uploader(key=session.K_WEIGHTS_B).set_value(("notes.safetensors", b"not weights", "application/octet-stream")).run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "notes.safetensors" in errors[0], errors


def test_triplet_shows_the_difference_only_where_the_grids_match():
    rng = np.random.default_rng(0)
    crop = rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)
    a, b = rng.random((4, 4)), rng.random((4, 4))
    png = compare_figures.triplet_png(crop, a, (8, 8), crop, b, (8, 8), ("A", "B", "B - A"), side=64)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    same = compare_figures.diff_tile(np.zeros((4, 4)), 8)
    assert np.all(same == same[0, 0]) and same[0, 0].min() > 200  # no difference: white-ish everywhere
    grey = compare_figures.triplet_png(crop, a, (8, 8), crop[:16, :16], b[:2, :2], (8, 8), ("A", "B", "-"), side=64)
    assert base.image_size(grey) == base.image_size(png)


def test_the_set_figures_are_pngs_with_legible_text():
    cka = np.eye(3)
    for png in (compare_figures.cka_png(cka, "CKA", width_px=400),
                compare_figures.distance_both_png(np.ones((2, 3)), np.full((2, 3), 2.0), 1.5, width_px=400),
                compare_figures.lens_both_png(np.linspace(0, 1, 3), np.linspace(1, 0, 3), "circle", width_px=400)):
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert base.image_size(png)[0] <= 400
        assert base.recorded_text_px(png) >= base.TEXT_PX - 0.5
