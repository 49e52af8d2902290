"""The "why this prediction" tabs (Why?, Interventions, Logit lens) run in-process with Streamlit's AppTest.

What they show is checked against `vit_core.explain` called directly on the same model and image:
the test model (`VIT_LENS_MODEL=test-tiny`, random init, built the same way here) on its default
example, and the bundled Shapes ViT where its weights exist (its size and classes are not assumed).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import vit_core
from conftest import REPO, assert_healthy, run_app
from dashboard import caches, examples, session, text
from dashboard.figures import base as figures
from dashboard.figures import interventions as intervention_figures
from dashboard.figures import lens as lens_figures
from dashboard.figures import prediction as prediction_figures
from dashboard.figures import why as why_figures
from dashboard.literal import markdown_literal
from dashboard.models import TEST_TINY, build_named_model
from dashboard.server.byte_budget import ByteBudgetCache, one_each
from dashboard.views import interventions, lens, why
from vit_core import analyses, explain
from vit_core.loading import TEACHING_MODEL

WHY_VIEWS = ("8 Why?", "Interventions", "Logit lens")  # the tabs' labels (dashboard.views.VIEWS)
SHAPES_VIT = REPO / "vit_core" / "assets" / "shapes_vit" / "model.safetensors"


@pytest.fixture(scope="module")
def reference():
    """The test model and its default example, as the app builds and decodes them."""
    loaded = build_named_model(TEST_TINY)
    image = vit_core.decode_image(examples.example_bytes(examples.default_example(loaded.name))).image
    return loaded, image


def images(at: AppTest) -> tuple[str, ...]:
    return tuple(url for im in at.get("image") for url in im.value)


def markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def target_metric(at: AppTest) -> str:
    return next(m.value for m in at.metric if m.label.startswith("p(target)"))


def after_list(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**After"))


def top5_lines(loaded, logits: np.ndarray) -> str:
    return "\n".join(f"{i + 1}. {markdown_literal(p.label)} ({p.prob:.1%})"
                     for i, p in enumerate(analyses.top_k(logits, loaded.labels, 5)))


@pytest.mark.parametrize("model, random_init", [
    (TEST_TINY, False),
    ("deit_small_distilled_patch16_224", True),  # two prefix tokens
    ("vit_base_patch16_siglip_224", True),  # no class token, and no classifier head
    pytest.param(TEACHING_MODEL, False, marks=pytest.mark.skipif(not SHAPES_VIT.is_file(), reason="Shapes ViT not trained")),
])
def test_the_why_views_render(monkeypatch, model, random_init):
    monkeypatch.setenv("VIT_LENS_MODEL", model)
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "1" if random_init else "0")
    at = run_app(view=WHY_VIEWS[0])
    has_head = not any("no classifier head" in i.value for i in at.info)
    for view in WHY_VIEWS:
        at.session_state["view"] = view
        at.run()
        assert_healthy(at)
        assert not at.error, [e.value for e in at.error]
        if has_head:
            assert images(at), f"{view} shows no figure"
        else:
            assert any("no classifier head" in i.value for i in at.info), view
    downloads = [b.proto.label for b in at.get("download_button")]
    assert ("All arrays + explanations (.npz)" in downloads) == has_head
    if has_head:  # every method has a map, AttnLRP and CP-LRP included, and nothing says a method is missing
        at.session_state["view"] = "8 Why?"
        at.run()
        assert len(images(at)) >= len(explain.METHODS)
        assert not at.info, [i.value for i in at.info]


def test_the_target_selection_changes_the_maps(tiny_env, reference):
    loaded, image = reference
    at = run_app()
    at.session_state["view"] = "8 Why?"  # as a click on the tab does
    at.run()
    before = images(at)
    box = at.selectbox(key="target")
    assert box.value == int(np.argmax(vit_core.run_with_capture(loaded, image).logits))  # the top-1 by default
    second = box.options[1]
    box.select_index(1).run()
    assert_healthy(at)
    target = at.selectbox(key="target").value
    assert second.startswith(f"{target}: ")
    assert f"({target})" in captions(at)
    after = images(at)
    assert after != before
    # the class-independent maps (raw attention, rollout) stay, the gradient-based and LRP ones change (a map shown in
    # the pair and under All maps is one picture)
    assert len(set(before)) == len(explain.METHODS)
    assert len(set(after) - set(before)) == len(explain.METHODS) - 2
    at.session_state["view"] = "Interventions"  # the same target there (one key, in the URL)
    at.run()
    assert at.selectbox(key="target").value == target
    assert next(m.label for m in at.metric).endswith(f"for {markdown_literal(loaded.label(target))}")


def test_dropping_masking_and_ablating_show_what_explain_gives(tiny_env, reference):
    loaded, image = reference
    logits = vit_core.run_with_capture(loaded, image).logits
    target = int(np.argmax(logits))
    at = run_app(view="Interventions")
    assert target_metric(at) == interventions.percent(analyses.softmax(logits)[target])
    assert after_list(at).endswith(top5_lines(loaded, logits))

    chosen = [0, 7, 30, 100]
    at.multiselect(key="int_patches").set_value(chosen).run()
    assert_healthy(at)
    dropped = explain.predict_intervened(loaded, image, drop=chosen)
    assert not np.allclose(dropped, logits)
    assert target_metric(at) == interventions.percent(analyses.softmax(dropped)[target])
    assert after_list(at).endswith(top5_lines(loaded, dropped))
    assert "4 patch(es) dropped" in after_list(at)

    at.radio(key="int_mode").set_value("mask").run()
    masked = explain.predict_intervened(loaded, image, mask=chosen)
    assert target_metric(at) == interventions.percent(analyses.softmax(masked)[target])
    assert after_list(at).endswith(top5_lines(loaded, masked))

    at.multiselect(key="int_heads").set_value([(1, 0), (0, 2)]).run()
    at.radio(key="int_ablation").set_value("mean").run()
    both = explain.predict_intervened(loaded, image, mask=chosen, ablate=[(0, 2), (1, 0)], ablation="mean")
    assert target_metric(at) == interventions.percent(analyses.softmax(both)[target])
    assert after_list(at).endswith(top5_lines(loaded, both))

    at.button(key="int_reset").click().run()
    assert_healthy(at)
    assert at.multiselect(key="int_patches").value == [] and at.multiselect(key="int_heads").value == []
    assert target_metric(at) == interventions.percent(analyses.softmax(logits)[target])
    assert after_list(at).startswith("**After: no intervention**")


def test_a_click_toggles_a_patch():
    assert session.toggled([], 5) == [5]
    assert session.toggled([9, 5], 7) == [5, 7, 9]
    assert session.toggled([5, 7, 9], 7) == [5, 9]


def shown_table(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("| method |"))


@pytest.mark.parametrize("light", [True, False])
def test_the_judge_button_fills_the_trust_table_with_explain_numbers(tiny_env, reference, monkeypatch, light):
    """After the click: a progress bar advanced stage by stage to the end, then the table of every map under every test
    with explain.judge's numbers and verdicts, kept for every session. A light model's LRP maps come with their rule
    chosen; another model's show the epsilon rule until judged, then only its LRP maps are made again: the same
    numbers either way."""
    monkeypatch.setattr(caches.serving, "light_pass", lambda loaded: light)
    # the last gamma choice wins (not the epsilon maps shown first), in the app and in the reference alike
    monkeypatch.setattr(explain.lrp, "pick_choice", lambda scores: explain.LrpChoice(
        name=list(scores)[-1], score=float(list(scores.values())[-1]), scores=dict(scores)))
    for name in ("_chosen_relevance", "_judgements", "_latest_judgement"):  # nothing kept from the other case
        monkeypatch.setattr(caches, name, ByteBudgetCache(64, size_of=one_each))
    loaded, image = reference
    messages = []
    compute = caches.compute_judgement

    def recorded_compute(request, loaded, image, cap, relevance, steps, objects, progress=None, tests=()):
        return compute(request, loaded, image, cap, relevance, steps, objects,
                       lambda fraction, message: messages.append((fraction, message)) or progress(fraction, message),
                       tests)

    monkeypatch.setattr(caches, "compute_judgement", recorded_compute)
    reused = []  # what the app's judge was given of the rule choice's forwards
    judge = explain.judge
    monkeypatch.setattr(explain, "judge", lambda *args, **kwargs: reused.append(kwargs.get("reuse")) or judge(*args, **kwargs))
    second = analyses.top_k(vit_core.run_with_capture(loaded, image).logits, loaded.labels, 5)[1]
    at = run_app(view="Why?", steps="5", target=f"{second.index}: {second.label}")
    assert not any(m.value.startswith("| method |") for m in at.markdown)  # judged on request only
    rules = [c.value for c in at.caption if c.value.startswith("rule")]
    assert len(rules) == len(explain.LRP_METHODS)
    assert all(r.startswith("rule chosen on this image") == light for r in rules), rules
    at.button(key="why_judge").click().run()
    assert_healthy(at)
    assert at.selectbox(key="target").value == second.index
    assert len(reused) == 1 and reused[0] is not None and reused[0].target == second.index  # not run twice
    fractions = [f for f, _ in messages]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    relevance = explain.relevance_maps(loaded, image, target=second.index, cap=vit_core.run_with_capture(loaded, image))
    expected = explain.judge(loaded, image, relevance.maps, second.index, steps=5)
    methods = list(relevance.maps)
    table = shown_table(at)
    assert table == why.trust_table(expected, methods)
    assert set(expected.results) == set(explain.FAITHFULNESS_TESTS)  # no object known for this example
    for m in methods:  # the numbers themselves, not only the formatter's
        row = next(line for line in table.splitlines() if line.startswith(f"| {text.METHOD_TITLES[m]} |"))
        for t, result in expected.results.items():
            assert f"{result.values[m]:.3g} {why.VERDICT_MARKS[result.verdict(m).label]}" in row, (m, t, row)
    assert why.agreement_sentence(expected, methods) in markdown(at)
    last = explain.gamma_candidates(loaded.model)[-1].name
    assert [c.value for c in at.caption if c.value.startswith("rule")] == [f"rule chosen on this image: **{last}**"] * 2
    again = run_app(view="Why?", steps="5", target=f"{second.index}: {second.label}")  # a new session, no click
    assert shown_table(again) == table

    quick = run_app(view="Why?", steps="5", tests=["Deletion (drop)", "Insertion (drop)"])  # the curves only
    quick.button(key="why_judge").click().run()
    assert_healthy(quick)
    header = shown_table(quick).splitlines()[0]
    assert "Deletion (drop)" in header and "Insertion (drop)" in header and "SaCo" not in header


def judgement_of(values: dict[str, float], random_values: list[float], test: str = "insertion_auc") -> explain.Judgement:
    result = explain.TestResult(test, values, float(np.mean(random_values)), float(np.std(random_values, ddof=1)),
                                np.array(random_values))
    return explain.Judgement(target=0, steps=10, methods=tuple(values), results={test: result})


def test_a_map_within_the_random_orders_spread_is_not_called_better():
    randoms = [0.50, 0.52, 0.48, 0.51, 0.49, 0.50, 0.53, 0.47]  # std 0.02
    judged = judgement_of({"chefer": 0.52, "rollout": 0.70, "gradcam": 0.30}, randoms)
    table = why.trust_table(judged, ["chefer", "rollout", "gradcam"])
    assert f"| {text.METHOD_TITLES['chefer']} | 0.52 ≈ |" in table  # +0.02: one std, inside the margin
    assert f"| {text.METHOD_TITLES['rollout']} | 0.7 ✓ |" in table
    assert f"| {text.METHOD_TITLES['gradcam']} | 0.3 ✗ |" in table
    assert "| random | 0.5 ± 0.02 |" in table
    assert "All 1 tests agree on Rollout" in why.agreement_sentence(judged, ["chefer", "rollout", "gradcam"])
    nothing = judgement_of({"chefer": 0.51}, randoms)
    assert "no map is distinguishable from random" in why.agreement_sentence(nothing, ["chefer"])


@pytest.mark.skipif(not SHAPES_VIT.is_file(), reason="Shapes ViT not trained")
def test_a_shape_example_is_judged_against_its_generator_mask(monkeypatch):
    """The Shapes ViT on a shape example: the object's patches shown first, and the localisation metrics in the table
    with explain's numbers for the generator's mask; then the sanity checks on request."""
    from dashboard import ground_truth

    monkeypatch.setenv("VIT_LENS_MODEL", TEACHING_MODEL)
    at = run_app(view="Why?", steps="5")
    assert_healthy(at)
    assert "**Object (ground truth)**" in markdown(at)
    loaded = build_named_model(TEACHING_MODEL)
    name = examples.default_example(loaded.name)
    image = vit_core.decode_image(examples.example_bytes(name)).image
    objects = explain.object_patches(loaded, ground_truth.example_mask(name), image.size)
    assert f"{int(objects.sum())} of {loaded.geometry.num_patches} patches" in captions(at)
    at.button(key="why_judge").click().run()
    assert_healthy(at)
    target = at.selectbox(key="target").value
    cap = vit_core.run_with_capture(loaded, image)
    relevance = explain.relevance_maps(loaded, image, target=target, cap=cap)
    expected = explain.judge(loaded, image, relevance.maps, target, steps=5, mask=objects)
    assert {"pointing_game", "relevance_mass", "relevance_rank"} <= set(expected.results)
    assert shown_table(at) == why.trust_table(expected, list(relevance.maps))

    at.button(key="why_sanity").click().run()
    assert_healthy(at)
    assert "**Sanity checks** (Adebayo et al. 2018)" in markdown(at)
    assert any("Spearman" in c for c in captions(at).splitlines())


def test_url_parameters_restore_the_selections(tiny_env, reference):
    loaded, image = reference
    logits = vit_core.run_with_capture(loaded, image).logits
    third = analyses.top_k(logits, loaded.labels, 5)[2]
    at = run_app(view="Why?", target=f"{third.index}: {third.label}", steps="20", methods=["Rollout", "Grad-CAM"])
    assert at.selectbox(key="target").value == third.index
    assert at.selectbox(key="steps").value == 20
    assert at.pills(key="methods").value == ["rollout", "gradcam"]
    assert f"({third.index})" in captions(at)
    assert len(set(images(at))) == 2  # the maps of the two chosen methods only (the pair, and under All maps)
    at = run_app(view="Logit lens", lens_layer="after block 0")
    assert at.select_slider(key="lens_layer").value == 1
    assert any("after block 0" in c.value for c in at.caption)
    at = run_app(view="Interventions", int_mode="mask", int_ablation="mean", target=f"{third.index}: {third.label}")
    assert at.radio(key="int_mode").value == "mask" and at.radio(key="int_ablation").value == "mean"
    assert target_metric(at) == interventions.percent(analyses.softmax(logits)[third.index])


def test_the_logit_lens_strip_lists_the_classes_on_top_somewhere():
    probs = np.array([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.05, 0.05, 0.1, 0.8]])  # (L+1, C)
    assert lens.lens_classes(probs, k=1) == [3, 0]
    assert lens.lens_classes(probs, k=2) == [3, 2, 0, 1]
    assert lens.lens_classes(probs, k=2, limit=3) == [3, 2, 0]


def test_the_new_figures_are_pngs():
    rng = np.random.default_rng(0)
    curves = {"chefer": rng.random(10), "random": rng.random(10)}
    pngs = [
        why_figures.faithfulness_curves_png(curves, curves, np.full(10, 0.1), np.full(10, 0.1), title="t"),
        lens_figures.logit_lens_strip_png(rng.random((3, 4)), ["a", "b", "c", "d"]),
        lens_figures.patch_lens_png(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), rng.integers(0, 3, (4, 4)),
                                    rng.random((4, 4)), {0: "a", 1: "b", 2: "c"}, (8, 8)),
        intervention_figures.prediction_change_png(["a", "b"], [0.6, 0.3], [0.2, 0.7]),
        figures.png_bytes(intervention_figures.removed_patches_image(np.zeros((32, 32, 3), np.uint8), (4, 4), (8, 8), [0, 5],
                                                                     "drop")),
    ]
    for png in pngs:
        assert png.startswith(b"\x89PNG")
    crop = np.full((32, 32, 3), 200, np.uint8)
    dropped = intervention_figures.removed_patches_image(crop, (4, 4), (8, 8), [5], "drop")
    s = dropped.shape[0] // 32  # display scale
    r, c = divmod(5, 4)
    block = dropped[r * 8 * s + 3:(r + 1) * 8 * s - 3, c * 8 * s + 3:(c + 1) * 8 * s - 3]
    assert (block.max(axis=-1) < 255).all() and (dropped[:8 * s - 2, :8 * s - 2] == 200).all()


def test_the_explanation_download_holds_the_export_keys_of_the_computed_curves(tiny_env):
    """caches.explanation_arrays (the sidebar's download) has the keys and values `vit_core.export` writes
    for `analyze --explain` with every test, from what the views computed: the tests once judged, for their target."""
    from dashboard.models import ModelRequest
    from vit_core import export

    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    name = examples.SYNTHETIC_SCENE
    image = caches.decode(name, examples.example_bytes(name))
    cap = caches.shared_capture(request, loaded, image)
    second = analyses.top_k(cap.logits, loaded.labels, 2)[1].index
    expected, _ = export.explanation_export(loaded, cap, caches.full_image(image), second, steps=5,
                                            tests=explain.FAITHFULNESS_TESTS)  # the Why? tab judges by every test

    before = caches.explanation_arrays(request, loaded, image, cap)  # no curves yet: the top-1's maps, no curves
    assert int(before["target"]) == int(np.argmax(cap.logits))
    judged_keys = ("deletion_", "insertion_", "pixel_", "srg_", "saco_")
    assert set(before) == {k for k in expected if not k.startswith(judged_keys)}

    caches.compute_judgement(request, loaded, image, cap, caches.relevance(request, loaded, image, cap, second), 5, None)
    arrays = caches.explanation_arrays(request, loaded, image, cap)
    assert set(arrays) == set(expected)
    for key, value in expected.items():
        assert arrays[key].dtype == value.dtype and arrays[key].shape == value.shape, key
        np.testing.assert_allclose(arrays[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_maps_kept_from_a_model_loaded_before_are_judged_without_its_forwards(tiny_env, monkeypatch):
    """The maps with their rule chosen are kept per model name, image and target; the model object can be let go and
    loaded again meanwhile. Judging them then runs every set on the model now loaded, instead of raising on the
    choice's sets of the other object, with the numbers of a fresh judge."""
    from dashboard.models import ModelRequest

    for kept in ("_chosen_relevance", "_judgements", "_latest_judgement"):  # nothing from the other tests
        monkeypatch.setattr(caches, kept, ByteBudgetCache(64, size_of=one_each))
    request = ModelRequest(TEST_TINY)
    loaded = caches.load(request)
    name = examples.SYNTHETIC_SCENE
    image = caches.decode(name, examples.example_bytes(name))
    cap = caches.shared_capture(request, loaded, image)
    target = int(np.argmax(cap.logits))
    chosen = caches.chosen_relevance(request, loaded, image, cap, target)
    assert chosen.choice_sets is not None and chosen.choice_sets.ran_on(loaded.model)
    again = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))  # the same weights, another object
    judged = caches.compute_judgement(request, again, image, cap, chosen, 5, None, tests=("deletion_auc",))
    expected = explain.judge(again, cap, chosen.maps, target, steps=5, tests=("deletion_auc",))
    assert judged.results["deletion_auc"].values == pytest.approx(expected.results["deletion_auc"].values, abs=1e-6)


def test_another_image_clears_the_patches_and_keeps_the_heads(tiny_env):
    at = run_app(view="Interventions")
    at.multiselect(key="int_patches").set_value([3, 4]).run()
    at.multiselect(key="int_heads").set_value([(0, 1)]).run()
    at.selectbox(key="example").set_value(examples.SYNTHETIC_SCENE).run()
    assert_healthy(at)
    assert at.multiselect(key="int_patches").value == [] and at.multiselect(key="int_heads").value == [(0, 1)]
    assert "1 head(s) zero-ablated" in after_list(at)


def test_probabilities_keep_three_digits_when_small():
    assert interventions.percent(0.5) == "50.00%" and interventions.percent(0.01) == "1.00%"
    assert interventions.percent(0.0023125) == "0.231%"


def test_class_names_with_markup_are_drawn_as_written():
    """A label file may hold any text: `$` must not start matplotlib mathtext (malformed mathtext raises)."""
    name = r"cat $\frac{1}{$ dog"
    rng = np.random.default_rng(0)
    for png in (lens_figures.logit_lens_strip_png(rng.random((2, 2)), [name, "b"], title=name),
                lens_figures.patch_lens_png(np.zeros((16, 16, 3), np.uint8), np.zeros((2, 2), int), rng.random((2, 2)), {0: name},
                                            (8, 8), title=name),
                intervention_figures.prediction_change_png([name], [0.5], [0.4], title=name),
                why_figures.faithfulness_curves_png({name: rng.random(4)}, {name: rng.random(4)}, np.zeros(4), np.zeros(4), name),
                prediction_figures.top_k_png([name], [0.5]),
                prediction_figures.logits_png(rng.random(3), [0], [name])):
        assert png.startswith(b"\x89PNG")


def test_another_image_brings_the_target_back_to_its_top_1(tiny_env, reference):
    """A target chosen for one image is not carried to the next (a drawing after the example): the new top-1."""
    at = run_app(view="Why?")
    first_top1 = at.selectbox(key="target").value
    at.selectbox(key="target").select_index(1).run()
    chosen = at.selectbox(key="target").value
    assert chosen != first_top1  # the second of the example's top 5
    at.selectbox(key="example").set_value(examples.SYNTHETIC_SCENE).run()
    assert_healthy(at)
    loaded = build_named_model(TEST_TINY)
    scene = vit_core.decode_image(examples.example_bytes(examples.SYNTHETIC_SCENE)).image
    top1 = int(np.argmax(vit_core.run_with_capture(loaded, scene).logits))
    assert at.selectbox(key="target").value == top1 and top1 != chosen


def judgement_over(beaten: dict[str, set[str]], tests: tuple[str, ...] = explain.FAITHFULNESS_TESTS) -> explain.Judgement:
    """Every method of `beaten` under every test of `tests`: a clear win (random at 0.5 ± 0.02, the map at 0.9 or,
    lower being better, 0.1) on the tests it names, random's own mean on the others."""
    randoms = np.array([0.50, 0.52, 0.48, 0.51, 0.49, 0.50, 0.53, 0.47])
    results = {}
    for t in tests:
        better = 0.9 if explain.CONVENTIONS[t][1] else 0.1
        values = {m: better if t in wins else 0.5 for m, wins in beaten.items()}
        results[t] = explain.TestResult(t, values, float(randoms.mean()), float(randoms.std(ddof=1)), randoms)
    return explain.Judgement(target=0, steps=10, methods=tuple(beaten), results=results)


def named_tests_of(sentence: str, method: str, tests: list[str]) -> set[str]:
    """The tests the sentence says `method` beat random on: its clause (clauses are split by ';', the head by '.'),
    read as written: 'A only', 'every test', 'every test but A and B', 'no test'."""
    title = text.METHOD_TITLES[method]
    clauses = [c for part in sentence.split(";") for c in part.split("**: ")]  # the all-agree head apart
    clause = next(c for c in clauses if title in c)
    said = clause.split(" random on ", 1)[1] if " random on " in clause else "every test"
    named = {t for t in tests if text.TEST_TITLES[t][0] in said}
    if said.startswith("every test but"):
        return set(tests) - named
    if said.startswith("every test"):
        return set(tests)
    return named


@pytest.mark.parametrize("beaten", [
    # the case a user met: two methods on one pixel test, a third on SRG, the rest on nothing
    {"raw_attention": {"pixel_deletion_auc"}, "rollout": set(), "chefer": {"srg"}, "gradcam": {"pixel_deletion_auc"}},
    # equal counts, different tests; most tests; every test beside fewer
    {"raw_attention": {"deletion_auc", "saco"}, "chefer": {"srg", "insertion_auc"}, "gradcam": {"deletion_auc", "saco"}},
    {"rollout": set(explain.FAITHFULNESS_TESTS) - {"saco"}, "attnlrp": {"saco"}, "cplrp": set()},
    {"rollout": set(explain.FAITHFULNESS_TESTS), "chefer": {"srg", "saco", "deletion_auc", "insertion_auc"},
     "gradcam": set()},
], ids=["one-test-each", "equal-counts", "all-but-one", "all-agree"])
def test_the_verdict_sentence_names_each_methods_own_tests_from_the_table(beaten):
    """Each method's summary in the sentence names exactly the tests its row of the table marks ✓, where the methods
    beat random on different tests."""
    judged = judgement_over(beaten)
    methods = list(beaten)
    table = why.trust_table(judged, methods)
    sentence = why.agreement_sentence(judged, methods)
    head, *rows = table.splitlines()
    columns = [t for title in head.split("|")[2:-1] for t in explain.FAITHFULNESS_TESTS
               if title.strip()[:-2] == text.TEST_TITLES[t][0]]
    assert columns == list(explain.FAITHFULNESS_TESTS)
    for m in methods:
        row = next(r for r in rows if r.startswith(f"| {text.METHOD_TITLES[m]} |"))
        ticked = {t for t, cell in zip(columns, row.split("|")[2:-1], strict=True) if cell.strip().endswith("✓")}
        assert ticked == beaten[m]  # the table itself, as built
        assert named_tests_of(sentence, m, columns) == ticked, (m, sentence)
    assert ("**All 6 tests agree on" in sentence) == any(len(v) == 6 for v in beaten.values())


def test_the_verdict_sentence_of_the_case_a_user_met_reads_as_the_table():
    judged = judgement_over({"raw_attention": {"pixel_deletion_auc"}, "chefer": {"srg"},
                             "gradcam": {"pixel_deletion_auc"}})
    assert why.agreement_sentence(judged, ["raw_attention", "chefer", "gradcam"]) == (
        "**The tests disagree.** Raw attention and Grad-CAM beat random on Deletion (mask) only (1 of 6 tests); "
        "Gradient x attention (Chefer) beats random on SRG only (1 of 6 tests).")
