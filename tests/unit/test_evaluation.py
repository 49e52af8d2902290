"""Which map to trust (analyses.md, "Faithfulness" to "Which to trust here"): the verdict rule, SRG and SaCo against loop
references and known values, a random map's SaCo near 0, the one-image table and its flat scalars, the folder's
ranks and Kendall agreement, the rank statistics, Adebayo et al.'s sanity checks, and the export's keys."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from conftest import drawn_image, hooks_on
from vit_core import analyses, explain, run_with_capture
from vit_core.export import explanation_export, json_bytes

# ---------------------------------------------------------------------------------- rank statistics


def ranks_loop(values):
    flat = [float(v) for v in np.asarray(values).reshape(-1)]
    return [sum(1 for w in flat if w < v) + (sum(1 for w in flat if w == v) + 1) / 2 for v in flat]


def pearson_loop(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan


def kendall_loop(a, b):
    concordant = discordant = tied_a = tied_b = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        da, db = a[i] - a[j], b[i] - b[j]
        tied_a += da == 0
        tied_b += db == 0
        if da * db > 0:
            concordant += 1
        elif da * db < 0:
            discordant += 1
    pairs = len(a) * (len(a) - 1) // 2
    denominator = math.sqrt((pairs - tied_a) * (pairs - tied_b))
    return (concordant - discordant) / denominator if denominator > 0 else math.nan


def test_rank_statistics_equal_their_loops_and_known_values():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(2, 12))
        a, b = np.round(rng.normal(size=n), trial % 3), np.round(rng.normal(size=n), trial % 2)  # ties in some trials
        np.testing.assert_allclose(explain.average_ranks(a), ranks_loop(a))
        expected = pearson_loop(ranks_loop(a), ranks_loop(b))
        got = explain.spearman(a, b)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)
        expected = kendall_loop(list(a), list(b))
        got = explain.kendall_tau_b(a, b)
        assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)
    x = np.arange(5.0)
    assert explain.spearman(x, x ** 3) == pytest.approx(1.0) and explain.spearman(x, -x) == pytest.approx(-1.0)
    assert explain.kendall_tau_b(x, x) == 1.0 and explain.kendall_tau_b(x, x[::-1]) == -1.0
    assert math.isnan(explain.spearman(x, np.ones(5))) and math.isnan(explain.kendall_tau_b(x, np.ones(5)))
    assert explain.kendall_tau_b([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    np.testing.assert_array_equal(explain.average_ranks([3.0, 1.0, 3.0, 2.0]), [3.5, 1.0, 3.5, 2.0])


# ---------------------------------------------------------------------------------- the verdict rule


def test_the_verdict_rule():
    randoms = np.array([1.0, 2.0, 3.0])  # mean 2, std (ddof 1) 1: the margin is 2
    assert explain.verdict(4.01, randoms, higher_is_better=True).label == "beats random"
    assert explain.verdict(4.0, randoms, higher_is_better=True).label == "not distinguishable from random"  # not beyond
    assert explain.verdict(-0.01, randoms, higher_is_better=True).label == "worse than random"
    assert explain.verdict(-0.01, randoms, higher_is_better=False).label == "beats random"  # lower is better
    v = explain.verdict(3.0, randoms, higher_is_better=False)
    assert (v.gain, v.threshold, v.random_mean, v.random_std) == (-1.0, 2.0, 2.0, 1.0) and not v.beats
    assert explain.verdict(5.0, np.array([1.0]), True).label == "not distinguishable from random"  # one order: no spread
    flat = np.full(8, 0.25)  # every random order scores the same: float noise must not decide
    assert explain.verdict(0.25 + 1e-7, flat, True).label == "not distinguishable from random"
    assert explain.verdict(0.25 + 1e-3, flat, True).label == "beats random"
    assert explain.MARGIN_SDS == 2.0


# ---------------------------------------------------------------------------------- SRG and SaCo (pure)


def saco_loop(s, d):
    total = weight_sum = 0.0
    for i in range(len(s) - 1):
        for j in range(i + 1, len(s)):
            weight = s[i] - s[j] if d[i] >= d[j] else -(s[i] - s[j])
            total += weight
            weight_sum += abs(weight)
    return total / weight_sum if weight_sum else 0.0


def test_saco_equals_the_papers_algorithm_and_known_values():
    rng = np.random.default_rng(1)
    for trial in range(50):
        k = int(rng.integers(2, 12))
        s = np.sort(np.round(rng.normal(size=k), trial % 2 + 1))[::-1]
        d = np.round(rng.normal(size=k), trial % 3)  # equal drops in some trials
        assert explain.saco(s, d) == pytest.approx(saco_loop(list(s), list(d)), abs=1e-12)
    s = np.array([4.0, 3.0, 2.0, 1.0])
    assert explain.saco(s, np.array([0.4, 0.3, 0.2, 0.1])) == 1.0  # effects ordered as the salience
    assert explain.saco(s, np.array([0.1, 0.2, 0.3, 0.4])) == -1.0
    assert explain.saco(s, np.zeros(4)) == 1.0  # equal drops count as agreeing (>=)
    assert explain.saco(np.ones(4), np.array([0.1, 0.2, 0.3, 0.4])) == 0.0  # equal salience sums: 0, not an error
    # the first two groups' effects swapped: w over (0,1), (0,2), (0,3), (1,2), (1,3), (2,3) = (-1, 2, 3, 1, 2, 1) -> 8 / 10
    assert explain.saco(s, np.array([0.3, 0.4, 0.2, 0.1])) == pytest.approx(0.8)


def test_saco_groups_and_srg():
    order = np.arange(25)[::-1]
    groups = explain.saco_groups(order, 10)
    # boundaries round(i 25 / 10), halves to even: 0, 2, 5, 8, 10, 12, 15, 18, 20, 22, 25
    assert [len(g) for g in groups] == [2, 3, 3, 2, 2, 3, 3, 2, 2, 3]
    np.testing.assert_array_equal(np.concatenate(groups), order)
    assert [len(g) for g in explain.saco_groups(np.arange(4), 10)] == [1, 1, 1, 1]  # K = min(10, N)
    deletion, lerf = np.array([1.0, 0.5, 0.2, 0.0]), np.array([1.0, 1.0, 0.9, 0.5])
    x = [0, 0.25, 0.5, 0.75]
    trapezoid = lambda y: sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(3))  # noqa: E731
    assert explain.srg(deletion, lerf) == pytest.approx(trapezoid(lerf) - trapezoid(deletion))
    values = explain.rank_map(np.array([2, 0, 3, 1]), (2, 2))
    np.testing.assert_array_equal(values, [[3.0, 1.0], [4.0, 2.0]])
    np.testing.assert_array_equal(explain.patch_order(values), [2, 0, 3, 1])


# ---------------------------------------------------------------------------------- the tests on a model, against loops


@pytest.mark.parametrize("kind", ["class_token", "no_class_token"])
def test_srg_and_saco_of_maps_and_random_orders_equal_per_step_forwards(family, kind):
    loaded = family[kind]
    g = loaded.geometry
    n, steps, orders_count, groups = g.num_patches, 4, 2, 5
    image = drawn_image(8)
    target = int(np.argmax(run_with_capture(loaded, image).logits))
    rng = np.random.default_rng(4)
    maps = {"m": rng.random(g.grid), "tied": np.round(rng.random(g.grid), 1)}
    judged = explain.judge(loaded, image, maps, target, steps=steps, tests=("srg", "saco"), random_orders=orders_count,
                           seed=2, saco_groups=groups)
    assert list(judged.results) == ["srg", "saco"]

    known = {}

    def p_c(dropped):  # one forward per distinct set, as the loop asks for the same ones again
        key = frozenset(int(i) for i in dropped)
        if key not in known:
            known[key] = float(analyses.softmax(explain.predict_intervened(loaded, image, drop=sorted(key)))[target])
        return known[key]

    def trapezoid(y):
        return sum((y[i] + y[i + 1]) / (2 * steps) for i in range(len(y) - 1))

    def srg_loop(order):
        morf = [p_c(order[:round(k * n / steps)]) for k in range(steps)]
        lerf = [p_c(order[n - round(k * n / steps):]) for k in range(steps)]
        return trapezoid(lerf) - trapezoid(morf)

    def saco_of_loop(values, order):
        parts = [order[round(i * n / groups):round((i + 1) * n / groups)] for i in range(groups)]
        full = p_c([])
        return saco_loop([sum(values[p] for p in part) for part in parts], [full - p_c(part) for part in parts])

    generator = np.random.default_rng(2)
    random_orders = [list(generator.permutation(n)) for _ in range(orders_count)]
    for name, relevance in maps.items():
        flat = list(relevance.reshape(-1))
        order = sorted(range(n), key=lambda i: (-flat[i], i))
        assert judged.results["srg"].values[name] == pytest.approx(srg_loop(order), abs=1e-6)
        assert judged.results["saco"].values[name] == pytest.approx(saco_of_loop(flat, order), abs=1e-5)
    np.testing.assert_allclose(judged.results["srg"].random_values, [srg_loop(o) for o in random_orders], atol=1e-6)
    rank_values = [{p: n - j for j, p in enumerate(o)} for o in random_orders]  # a random order as a map: its ranks
    np.testing.assert_allclose(judged.results["saco"].random_values,
                               [saco_of_loop(v, o) for v, o in zip(rank_values, random_orders, strict=True)], atol=1e-5)


def test_a_random_map_scores_near_zero_on_saco(tiny, image):
    """SaCo of a random map is 0 in expectation (its groups are exchangeable). Over 200 seeded uniform random maps on one
    image: |mean| < 0.08, about 3.5 standard errors of a mean of 200 scores with this spread (about 0.33), while the
    spread itself is far from 0 (the scores are not trivially 0). The full image runs once for all of them."""
    target = int(np.argmax(run_with_capture(tiny, image).logits))
    probs = explain.KeptSetProbs(tiny, explain.model_input(tiny, image), target, "drop")
    n, everything = tiny.geometry.num_patches, np.arange(tiny.geometry.num_patches)
    full = float(probs([everything])[0])
    scores = []
    for chunk in range(4):  # saco_of's definition, 50 maps' removals batched at once
        maps = [np.random.default_rng(seed).random(n) for seed in range(50 * chunk, 50 * (chunk + 1))]
        groups = [explain.saco_groups(explain.patch_order(m)) for m in maps]
        drops = full - probs([np.setdiff1d(everything, g) for parts in groups for g in parts]).reshape(50, -1)
        scores += [explain.saco([m[g].sum() for g in parts], d) for m, parts, d in zip(maps, groups, drops, strict=True)]
    scores = np.array(scores)
    assert scores[0] == pytest.approx(explain.saco_of(probs, np.random.default_rng(0).random(tiny.geometry.grid)))
    assert abs(scores.mean()) < 0.08, scores.mean()
    assert scores.std() > 0.1 and scores.min() >= -1 and scores.max() <= 1
    assert probs.rows == 1 + 200 * explain.SACO_GROUPS  # each map's 10 removals, and the image once


# ---------------------------------------------------------------------------------- the table of one image


def test_judge_gives_the_table_with_the_same_curves_as_faithfulness(tiny, image):
    g = tiny.geometry
    relevance = explain.relevance_maps(tiny, image)
    objects = np.zeros(g.grid, dtype=bool)
    objects[3:9, 4:10] = True
    seen = []
    judged = explain.judge(tiny, image, relevance.maps, relevance.target, mask=objects, steps=4, random_orders=3,
                           progress=lambda fraction, message: seen.append(fraction))
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    assert list(judged.results) == list(explain.TESTS) and judged.methods == tuple(relevance.maps)
    token = explain.faithfulness(tiny, image, relevance.maps, relevance.target, steps=4, random_orders=3)
    pixel = explain.faithfulness(tiny, image, relevance.maps, relevance.target, steps=4, random_orders=3, perturbation="mask")
    for name in token.deletion:
        np.testing.assert_array_equal(judged.curves.deletion[name], token.deletion[name])
        np.testing.assert_array_equal(judged.curves.insertion[name], token.insertion[name])
        np.testing.assert_allclose(judged.pixel_curves.deletion[name], pixel.deletion[name], atol=1e-6)
    np.testing.assert_array_equal(judged.results["deletion_auc"].random_values, token.random_deletion_aucs)
    # pixel masking: the judge takes the unmodified image's p_c from the token pass, so its batches differ (float32)
    np.testing.assert_allclose(judged.results["pixel_insertion_auc"].random_values, pixel.random_insertion_aucs, atol=1e-6)
    located = explain.localisation(relevance.maps, objects)
    baseline = explain.random_localisation(objects)
    for metric in explain.LOCALISATION_METRICS:
        result = judged.results[metric]
        assert (result.random_mean, result.random_std) == baseline[metric] and result.random_values is None
        assert result.values == {m: located[m][metric] for m in relevance.maps}

    rows = judged.rows()
    assert [r["method"] for r in rows] == [*relevance.maps, "random"]
    for row in rows[:-1]:
        for test, result in judged.results.items():
            v = explain.Verdict(row[test], result.random_mean, result.random_std, explain.CONVENTIONS[test][1])
            assert row[f"{test}_verdict"] == v.label and row[f"{test}_gain"] == v.gain
            assert row[f"{test}_threshold"] == v.threshold
    for test, result in judged.results.items():
        assert rows[-1][test] == result.random_mean and rows[-1][f"{test}_std"] == result.random_std
        if result.random_values is not None:
            assert result.random_mean == pytest.approx(result.random_values.mean())
            assert result.random_std == pytest.approx(np.std(result.random_values, ddof=1))
    for method in relevance.maps:  # the curves' verdict is the table's, under deletion and insertion both
        assert judged.curves.beats_random[method] == (judged.results["deletion_auc"].verdict(method).beats
                                                      and judged.results["insertion_auc"].verdict(method).beats)

    flat = explain.judgement_scalars(judged)
    for test, result in judged.results.items():
        assert flat[f"{test}_random"] == result.random_mean and flat[f"{test}_random_std"] == result.random_std
        for method in relevance.maps:
            assert flat[f"{test}_{method}"] == result.values[method]
            assert flat[f"beats_random_{test}_{method}"] == float(result.verdict(method).beats)
    assert len(flat) == len(explain.TESTS) * (2 * len(relevance.maps) + 2)


def test_judge_runs_only_the_tests_asked_for_and_refuses_unknown_ones_and_wrong_masks(tiny, image):
    maps = {"a": np.arange(196.0).reshape(14, 14)}
    judged = explain.judge(tiny, image, maps, 0, steps=3, tests=["saco", "deletion_auc"], random_orders=2)
    assert list(judged.results) == ["deletion_auc", "saco"] and judged.pixel_curves is None
    assert list(explain.judge(tiny, image, maps, 0, steps=3, tests=["saco"], random_orders=2).results) == ["saco"]
    with pytest.raises(ValueError, match="unknown test"):
        explain.judge(tiny, image, maps, 0, tests=["deletion"])
    with pytest.raises(explain.MaskError, match="object_patches"):
        explain.judge(tiny, image, maps, 0, tests=[], mask=np.ones((224, 224), dtype=bool))


# ---------------------------------------------------------------------------------- over a folder


def test_folder_judgement_means_ranks_and_agreement():
    """Two images' scalars of three methods (one with an underscore in its name) under three tests."""
    per_image = [
        {"deletion_auc_raw_attention": 0.3, "deletion_auc_b": 0.1, "deletion_auc_c": 0.2, "deletion_auc_random": 0.25,
         "deletion_auc_random_std": 0.01, "beats_random_deletion_auc_raw_attention": 0.0, "beats_random_deletion_auc_b": 1.0,
         "beats_random_deletion_auc_c": 1.0, "srg_raw_attention": 0.0, "srg_b": 0.5, "srg_c": 0.2, "srg_random": 0.0,
         "saco_raw_attention": 0.1, "saco_b": 0.1, "saco_c": 0.9, "saco_random": 0.0},
        {"deletion_auc_raw_attention": 0.5, "deletion_auc_b": 0.3, "deletion_auc_c": 0.2, "deletion_auc_random": 0.35,
         "deletion_auc_random_std": 0.03, "beats_random_deletion_auc_raw_attention": 0.0, "beats_random_deletion_auc_b": 0.0,
         "beats_random_deletion_auc_c": 1.0, "srg_raw_attention": 0.2, "srg_b": 0.3, "srg_c": math.nan, "srg_random": 0.0,
         "saco_raw_attention": 0.3, "saco_b": 0.1, "saco_c": 0.7, "saco_random": 0.0},
    ]
    means = explain.mean_scalars(per_image)
    assert means["deletion_auc_raw_attention"] == pytest.approx(0.4) and means["srg_c"] == 0.2  # NaN left out
    folder = explain.folder_judgement(means)
    assert folder.methods == ("raw_attention", "b", "c") and folder.tests == ("deletion_auc", "srg", "saco")
    assert folder.means["deletion_auc"] == pytest.approx({"raw_attention": 0.4, "b": 0.2, "c": 0.2, "random": 0.3})
    assert folder.ranks["deletion_auc"] == {"raw_attention": 3.0, "b": 1.5, "c": 1.5}  # lower AUC ranks first; a tie
    assert folder.ranks["srg"] == {"raw_attention": 3.0, "b": 1.0, "c": 2.0}
    assert folder.ranks["saco"] == {"raw_attention": 2.0, "b": 3.0, "c": 1.0}
    assert folder.beats_share["deletion_auc"] == {"raw_attention": 0.0, "b": 0.5, "c": 1.0}
    oriented = {"deletion_auc": [-0.4, -0.2, -0.2], "srg": [0.1, 0.4, 0.2], "saco": [0.2, 0.1, 0.8]}
    for (a, b), tau in folder.agreement.items():
        assert tau == pytest.approx(kendall_loop(oriented[a], oriented[b])), (a, b)
    assert set(folder.agreement) == {("deletion_auc", "srg"), ("deletion_auc", "saco"), ("srg", "saco")}
    rows = folder.rows()
    assert [r["method"] for r in rows] == ["raw_attention", "b", "c"]
    assert rows[2]["deletion_auc"] == pytest.approx(0.2) and rows[2]["deletion_auc_rank"] == 1.5
    assert rows[2]["deletion_auc_beats_share"] == 1.0 and rows[2]["saco_rank"] == 1.0
    assert math.isnan(rows[2]["srg_beats_share"])  # no beats_random_srg_* keys were given
    single = explain.folder_judgement({"srg_only": 1.0, "srg_random": 0.0})
    assert single.methods == ("only",) and math.isnan(explain.folder_judgement(
        {"srg_a": 1.0, "saco_a": 2.0}).agreement[("srg", "saco")])  # one method: no ranking to compare


# ---------------------------------------------------------------------------------- sanity checks


def parameters_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_cascading_randomisation_goes_from_the_top_on_a_private_copy(tiny, image):
    """The callable sees a copy whose head, then last block, ..., first block are re-initialised in turn, cumulatively;
    the shared model, its hooks and torch's global random state are untouched; rho compares with the trained maps."""
    original = parameters_of(tiny.model)
    hooks, rng_state = hooks_on(tiny.model), torch.random.get_rng_state()
    changed_per_call = []

    def explain_maps(loaded, im, target):
        current = parameters_of(loaded.model)
        changed_per_call.append({name.split(".")[0] + ("." + name.split(".")[1] if name.startswith("blocks") else "")
                                 for name, value in current.items() if not torch.equal(value, original[name])})
        norms = explain.token_norms(run_with_capture(loaded, im))  # (L+1, T): maps that depend on the blocks' weights
        return {"last": norms[2, 1:].reshape(14, 14), "first": norms[1, 1:].reshape(14, 14)}  # after block 1, block 0

    stages, cascading = explain.cascading_randomisation(tiny, image, 3, explain_maps, seed=5)
    assert stages == ("head", "block 1", "block 0")
    assert changed_per_call[0] == set()  # the trained model's maps first
    assert changed_per_call[1] == {"head"}  # (norm's reset gives its init: 1 and 0, equal to the random init here)
    assert changed_per_call[2] == {"head", "blocks.1"} and changed_per_call[3] == {"head", "blocks.1", "blocks.0"}
    for name, value in parameters_of(tiny.model).items():
        assert torch.equal(value, original[name]), name
    assert hooks_on(tiny.model) == hooks and torch.equal(torch.random.get_rng_state(), rng_state)
    # the head changes no token; block 1 changes what comes after it; block 0, last re-initialised, changes both
    assert cascading["last"][0] == 1.0 and np.all(cascading["last"][1:] < 0.99)
    assert list(cascading["first"][:2]) == [1.0, 1.0] and cascading["first"][2] < 0.99
    for method, reference in explain_maps(tiny, image, 3).items():  # against a re-initialisation written out
        shadow = explain.sanity.private_copy(tiny)
        for i, (_, modules) in enumerate(explain.randomisation_stages(shadow.model)):
            explain.sanity.reinitialise(modules, 5 + i)
            rho = pearson_loop(ranks_loop(reference), ranks_loop(explain_maps(shadow, image, 3)[method]))
            assert cascading[method][i] == pytest.approx(rho, abs=1e-12), (method, i)


def test_the_default_maps_are_every_method_relevance_maps_has(tiny, image):
    """By default the checks take `relevance_maps(...).maps`, whatever methods it has (AttnLRP and CP-LRP among them
    where supported); on a random-init model re-initialised again the maps change."""
    reference = explain.relevance_maps(tiny, image, 3).maps
    stages, cascading = explain.cascading_randomisation(tiny, image, 3, seed=5)
    assert set(cascading) == set(reference) and len(stages) == 3
    for method, rho in cascading.items():
        assert rho.shape == (3,) and np.all((rho >= -1) & (rho <= 1) | np.isnan(rho)), method


def test_a_map_that_ignores_the_weights_and_the_class_fails_the_sanity_checks(tiny, image):
    """A map made from the pixels alone stays the same whatever the weights and the class: rho 1 everywhere. A map of
    the class index changes with it. Any method names work (the callable decides)."""

    def pixels_only(loaded, im, target):
        brightness = np.asarray(run_with_capture(loaded, im).input_image, dtype=np.float64).mean(axis=-1)  # (H, W)
        ph, pw = loaded.geometry.patch_size
        blocks = brightness.reshape(14, ph, 14, pw).mean(axis=(1, 3))
        return {"pixels": blocks, "class": np.roll(blocks, target)}

    sanity = explain.sanity_checks(tiny, image, 3, pixels_only, seed=1)
    assert sanity.target == 3 and sanity.stages == ("head", "block 1", "block 0")
    np.testing.assert_allclose(sanity.cascading["pixels"], 1.0)
    assert sanity.other_class == explain.sanity.other_class(1000, 3, seed=1) != 3
    assert sanity.other_class_correlation["pixels"] == pytest.approx(1.0)
    assert sanity.other_class_correlation["class"] < 1.0


def test_other_class_is_uniform_among_the_others():
    drawn = [explain.sanity.other_class(4, 2, seed) for seed in range(400)]
    assert set(drawn) == {0, 1, 3}
    assert all(abs(drawn.count(c) - 400 / 3) < 40 for c in (0, 1, 3))
    with pytest.raises(ValueError, match="two outputs"):
        explain.sanity.other_class(1, 0)


# ---------------------------------------------------------------------------------- the export


def test_the_export_with_a_mask_and_every_test(tiny, image):
    cap = run_with_capture(tiny, image)
    mask = np.zeros((image.height, image.width), dtype=bool)
    mask[40:200, 60:260] = True
    arrays, summary = explanation_export(tiny, cap, image, 3, steps=3, mask=mask, tests=explain.FAITHFULNESS_TESTS)
    methods = list(explain.relevance_maps(tiny, image, 3).maps)
    for name in [*methods, "random"]:
        for key in ("deletion", "insertion", "pixel_deletion", "pixel_insertion"):
            assert arrays[f"{key}_{name}"].dtype == np.float32 and arrays[f"{key}_{name}"].shape == (3,), (key, name)
        for key in ("srg", "saco", *explain.LOCALISATION_METRICS):
            assert arrays[f"{key}_{name}"].dtype == np.float64 and arrays[f"{key}_{name}"].shape == (), (key, name)
    np.testing.assert_array_equal(arrays["object_patches"], explain.object_patches(tiny, mask, image.size))
    assert set(summary["tests"]) == set(explain.TESTS) and set(summary["verdicts"]) == set(explain.TESTS)
    assert set(summary["localisation"]) == {*methods, "random"}
    assert summary["localisation"]["random"]["pointing_game"] == pytest.approx(arrays["object_patches"].mean())
    for by_method in summary["verdicts"].values():
        assert set(by_method) == set(methods)
        for verdict in by_method.values():
            assert verdict["verdict"] in ("beats random", "worse than random", "not distinguishable from random")
    for test in ("srg", "saco", *explain.LOCALISATION_METRICS):
        for method in methods:
            assert summary["tests"][test]["values"][method] == pytest.approx(float(arrays[f"{test}_{method}"]))
        assert summary["tests"][test]["random_mean"] == pytest.approx(float(arrays[f"{test}_random"]))
    json.loads(json_bytes(summary))  # strict JSON: NaN would be written as null

    plain_arrays, plain = explanation_export(tiny, cap, image, 3, steps=3)  # --explain alone: the keys as before
    assert not any(k.startswith(("pixel_", "srg_", "saco_", "pointing_game_", "object_")) for k in plain_arrays)
    assert set(plain["verdicts"]) == {"deletion_auc", "insertion_auc"} and "localisation" not in plain
    np.testing.assert_array_equal(plain_arrays["deletion_chefer"], arrays["deletion_chefer"])
