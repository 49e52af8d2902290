"""The Compare tab (dashboard/views/compare.py) on the tiny test model against its random init of another seed: the
page draws without an error, its numbers are the library's, and the set comparison runs; its figure builders headless."""

from __future__ import annotations

import numpy as np

from conftest import assert_healthy, run_app
from dashboard import compare_models
from dashboard.figures import base
from dashboard.figures import compare as compare_figures
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
