"""Each analysis against a naive loop-based reimplementation of its definition and known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vit_core import analyses as A


def random_pattern(rng, layers=3, heads=4, tokens=1 + 16):
    """Random row-stochastic attention (L, H, T, T)."""
    logits = rng.normal(size=(layers, heads, tokens, tokens)) * 2
    e = np.exp(logits)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------- patches


def test_split_patches_matches_loops():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(6 * 4, 5 * 4, 3), dtype=np.uint8)  # 6 x 5 grid of 4 px
    patches = A.split_patches(image, (4, 4))
    assert patches.shape == (30, 4, 4, 3)
    for k in range(30):
        r, c = divmod(k, 5)
        np.testing.assert_array_equal(patches[k], image[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4])


def test_conv_patch_embedding_equals_linear_map_on_flattened_patches():
    rng = np.random.default_rng(1)
    conv = torch.nn.Conv2d(3, 10, kernel_size=(4, 2), stride=(4, 2))
    x = torch.from_numpy(rng.normal(size=(1, 3, 12, 8)).astype(np.float32))
    expected = conv(x).flatten(2).transpose(1, 2)[0].detach().numpy()  # (1, D, 3, 4) -> (12, D)
    patches = A.split_patches(x[0].numpy().transpose(1, 2, 0), (4, 2))  # (12, 4, 2, 3)
    got = A.embed_patches_linear(A.flatten_patches(patches), conv.weight.detach().numpy(), conv.bias.detach().numpy())
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # The flattened order is pixel-major, channel innermost: element 0..2 are the top-left pixel's RGB.
    np.testing.assert_array_equal(A.flatten_patches(patches)[0, :3], patches[0, 0, 0])


# ---------------------------------------------------------------------------------- filters


def test_filters_pca_matches_covariance_eigendecomposition():
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(40, 3, 4, 4)) * np.linspace(0.1, 2, 48).reshape(3, 4, 4)
    pca = A.filters_pca(weight, k=5)
    samples = weight.transpose(0, 2, 3, 1).reshape(40, -1)  # (D, ph*pw*C)
    cov = np.cov(samples, rowvar=False, bias=True)
    eigval, eigvec = np.linalg.eigh(cov)
    order = np.argsort(eigval)[::-1]
    eigval, eigvec = eigval[order], eigvec[:, order]
    assert pca.components.shape == (5, 4, 4, 3)
    for i in range(5):
        component = pca.components[i].reshape(-1)
        assert abs(np.linalg.norm(component) - 1) < 1e-5
        assert abs(abs(component @ eigvec[:, i]) - 1) < 1e-4  # same direction up to sign
    np.testing.assert_allclose(pca.explained_variance_ratio, eigval[:5] / eigval.sum(), rtol=1e-4)
    np.testing.assert_allclose(pca.mean_filter.reshape(-1), samples.mean(0), atol=1e-6)


def test_filters_pca_caps_k_and_explains_everything_with_all_components():
    weight = np.random.default_rng(3).normal(size=(6, 3, 2, 2))
    pca = A.filters_pca(weight, k=28)
    assert pca.components.shape[0] == 6
    assert abs(pca.explained_variance_ratio.sum() - 1) < 1e-5  # 6 samples: rank <= 5, all variance


def test_minmax_scale_per_component():
    x = np.array([[1.0, 3.0], [5.0, 5.0]])
    np.testing.assert_allclose(A.minmax_scale(x, axis=1), [[0, 1], [0.5, 0.5]])


# ---------------------------------------------------------------------------------- position embedding


@pytest.mark.parametrize("prefix,no_embed_class", [(1, False), (2, False), (5, True), (0, False)])
def test_pos_embed_similarity_matches_loops(prefix, no_embed_class):
    rng = np.random.default_rng(4)
    gh, gw, d = 3, 4, 8
    rows = gh * gw + (0 if no_embed_class else prefix)
    pos = rng.normal(size=(rows, d)).astype(np.float32)
    sim = A.pos_embed_similarity(pos, prefix, no_embed_class, (gh, gw))
    patch_rows = pos if no_embed_class else pos[prefix:]
    assert sim.shape == (gh * gw, gh, gw)
    for k in range(gh * gw):
        for j in range(gh * gw):
            a, b = patch_rows[k], patch_rows[j]
            expected = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
            assert abs(sim[k, j // gw, j % gw] - expected) < 1e-5
        assert abs(sim[k, k // gw, k % gw] - 1) < 1e-5


# ---------------------------------------------------------------------------------- attention maps


def test_attention_map_one_head_mean_and_prefix_share():
    rng = np.random.default_rng(5)
    pattern = random_pattern(rng, layers=2, heads=3, tokens=2 + 6)  # 2 prefix tokens, 2 x 3 grid
    for query in (0, 1, 5):
        one = A.attention_map(pattern, 1, 2, query, 2, (2, 3))
        for k in range(6):
            assert one.map[k // 3, k % 3] == pytest.approx(pattern[1, 2, query, 2 + k])
        assert one.prefix_share == pytest.approx(pattern[1, 2, query, 0] + pattern[1, 2, query, 1])
        mean = A.attention_map(pattern, 1, None, query, 2, (2, 3))
        for k in range(6):
            assert mean.map[k // 3, k % 3] == pytest.approx(np.mean([pattern[1, h, query, 2 + k] for h in range(3)]))
        assert mean.map.sum() + mean.prefix_share == pytest.approx(1, abs=1e-5)


# ---------------------------------------------------------------------------------- rollout


def naive_rollout(pattern, fusion, last_layer, prefix, has_cls):
    layers, heads, tokens, _ = pattern.shape
    result = [[float(i == j) for j in range(tokens)] for i in range(tokens)]
    for layer in range(last_layer + 1):
        fused = [[{"mean": np.mean, "max": np.max, "min": np.min}[fusion]([pattern[layer, h, i, j] for h in range(heads)])
                  for j in range(tokens)] for i in range(tokens)]
        a = [[0.5 * fused[i][j] + 0.5 * (i == j) for j in range(tokens)] for i in range(tokens)]
        a = [[v / sum(row) for v in row] for row in a]
        result = [[sum(a[i][m] * result[m][j] for m in range(tokens)) for j in range(tokens)] for i in range(tokens)]
    rows = [result[0]] if has_cls else result[prefix:]
    return np.mean(np.array(rows), axis=0)[prefix:]


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("last_layer", [0, 2])
def test_rollout_matches_naive_product(fusion, last_layer):
    pattern = random_pattern(np.random.default_rng(6), layers=3, heads=2, tokens=1 + 4)
    got = A.attention_rollout(pattern, 1, (2, 2), fusion=fusion, last_layer=last_layer)
    np.testing.assert_allclose(got.reshape(-1), naive_rollout(pattern, fusion, last_layer, 1, True), atol=1e-6)


def test_rollout_without_class_token_averages_patch_rows():
    pattern = random_pattern(np.random.default_rng(7), layers=2, heads=2, tokens=4)
    got = A.attention_rollout(pattern, 0, (2, 2))
    np.testing.assert_allclose(got.reshape(-1), naive_rollout(pattern, "mean", 1, 0, False), atol=1e-6)


def test_rollout_of_identity_attention_keeps_the_class_token_on_itself():
    pattern = np.broadcast_to(np.eye(5, dtype=np.float32), (3, 2, 5, 5))
    np.testing.assert_array_equal(A.attention_rollout(pattern, 1, (2, 2)), np.zeros((2, 2)))
    assert np.allclose(A.rollout_matrix(pattern), np.eye(5))


# ---------------------------------------------------------------------------------- attention distance


def naive_mad(pattern, prefix, grid, patch, renormalize):
    layers, heads = pattern.shape[:2]
    gh, gw = grid
    n = gh * gw
    out = np.zeros((layers, heads))
    for layer in range(layers):
        for h in range(heads):
            total = 0.0
            for i in range(n):
                row = pattern[layer, h, prefix + i, prefix:]
                if renormalize:
                    row = row / row.sum()
                for j in range(n):
                    dy = (i // gw - j // gw) * patch[0]
                    dx = (i % gw - j % gw) * patch[1]
                    total += row[j] * math.hypot(dy, dx)
            out[layer, h] = total / n
    return out


@pytest.mark.parametrize("renormalize", [False, True])
def test_mean_attention_distance_matches_loops(renormalize):
    pattern = random_pattern(np.random.default_rng(8), layers=2, heads=3, tokens=2 + 12)
    got = A.mean_attention_distance(pattern, 2, (3, 4), (8, 6), renormalize=renormalize)
    np.testing.assert_allclose(got, naive_mad(pattern, 2, (3, 4), (8, 6), renormalize), rtol=1e-5)


def test_both_mean_attention_distances_in_one_pass_are_the_two_calls_bit_for_bit():
    for dtype in (np.float32, np.float64):
        pattern = random_pattern(np.random.default_rng(9), layers=2, heads=3, tokens=1 + 12).astype(dtype)
        plain, renormalized = A.mean_attention_distances(pattern, 1, (3, 4), (8, 6))
        np.testing.assert_array_equal(plain, A.mean_attention_distance(pattern, 1, (3, 4), (8, 6)))
        np.testing.assert_array_equal(renormalized, A.mean_attention_distance(pattern, 1, (3, 4), (8, 6), renormalize=True))
        np.testing.assert_allclose(renormalized, naive_mad(pattern, 1, (3, 4), (8, 6), True), rtol=1e-5)
    assert not A._patch_distances_as((3, 4), (8, 6), np.dtype(np.float32)).flags.writeable  # shared: nobody writes it


def test_mean_attention_distance_known_values_on_14x14_grid():
    n = 196
    identity = np.zeros((1, 1, 1 + n, 1 + n), dtype=np.float32)
    identity[0, 0, np.arange(1 + n), np.arange(1 + n)] = 1
    assert A.mean_attention_distance(identity, 1, (14, 14), (16, 16))[0, 0] == pytest.approx(0, abs=1e-6)

    uniform = np.zeros((1, 1, 1 + n, 1 + n), dtype=np.float32)
    uniform[..., 1:] = 1 / n  # every patch query spreads evenly over the 196 patches, nothing to CLS
    mad = A.mean_attention_distance(uniform, 1, (14, 14), (16, 16))[0, 0]
    assert mad == pytest.approx(116.5, abs=0.1)  # analyses.md sanity value
    assert A.uniform_attention_distance((14, 14), (16, 16)) == pytest.approx(mad, rel=1e-5)


def test_prefix_attention_is_left_out_by_default_and_renormalised_on_request():
    n = 4
    half = np.zeros((1, 1, 1 + n, 1 + n), dtype=np.float32)
    half[..., 0] = 0.5
    half[..., 1:] = 0.5 / n  # half of every row goes to the class token
    default = A.mean_attention_distance(half, 1, (2, 2), (10, 10))
    renorm = A.mean_attention_distance(half, 1, (2, 2), (10, 10), renormalize=True)
    assert renorm[0, 0] == pytest.approx(2 * default[0, 0], rel=1e-5)
    assert A.average_over_images([default, renorm])[0, 0] == pytest.approx(1.5 * default[0, 0], rel=1e-5)


# ---------------------------------------------------------------------------------- prediction


def test_softmax_and_top_k():
    logits = np.array([1.0, 3.0, 3.0, -2.0], dtype=np.float32)
    probs = A.softmax(logits)
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    top = A.top_k(logits, ["a", "b", "c", "d"], k=3)
    assert [p.index for p in top] == [1, 2, 0]  # tie broken by the lower index
    assert [p.label for p in top] == ["b", "c", "a"]
    assert top[0].prob == pytest.approx(expected[1])
    assert A.top_k(logits, None, k=1)[0].label == "class 1"
    assert A.softmax(np.array([1000.0, 0.0]))[0] == pytest.approx(1.0)  # no overflow


# ---------------------------------------------------------------------------------- resampling


@pytest.mark.parametrize("prefix,no_embed_class", [(1, False), (5, True)])
def test_resample_pos_embed_keeps_prefix_rows_and_changes_the_grid(prefix, no_embed_class):
    rng = np.random.default_rng(9)
    gh, gw, d = 4, 4, 6
    rows = gh * gw + (0 if no_embed_class else prefix)
    pos = rng.normal(size=(rows, d)).astype(np.float32)
    same = A.resample_pos_embed(pos, (gh, gw), (gh, gw), prefix, no_embed_class)
    np.testing.assert_allclose(same, pos, atol=1e-6)  # no resolution change, no change
    bigger = A.resample_pos_embed(pos, (gh, gw), (6, 8), prefix, no_embed_class)
    assert bigger.shape == (6 * 8 + (0 if no_embed_class else prefix), d)
    if not no_embed_class:
        np.testing.assert_array_equal(bigger[:prefix], pos[:prefix])
    sim = A.pos_embed_similarity(bigger, prefix, no_embed_class, (6, 8))
    assert sim.shape == (48, 6, 8)


def test_resampling_a_smooth_embedding_keeps_it_smooth():
    # An embedding that is a linear function of the patch position stays (nearly) linear.
    ys, xs = np.mgrid[0:4, 0:4]
    pos = np.stack([ys.ravel(), xs.ravel(), np.ones(16)], axis=1).astype(np.float32)  # (16, 3)
    out = A.resample_pos_embed(pos, (4, 4), (8, 8), 0, True)  # (64, 3)
    assert np.all(np.diff(out[:, 1].reshape(8, 8), axis=1) > -1e-3)  # x increases along rows
    assert np.all(np.diff(out[:, 0].reshape(8, 8), axis=0) > -1e-3)  # y increases down columns


def test_prefix_token_shares_against_a_loop():
    rng = np.random.default_rng(11)
    p, n = 3, 4  # e.g. CLS, DIST, one register; 2 x 2 patches
    pattern = rng.random((2, 3, p + n, p + n))
    pattern /= pattern.sum(-1, keepdims=True)
    for head in (None, 0, 2):
        shares = A.prefix_token_shares(pattern, 1, head, 5, p)
        heads = range(3) if head is None else [head]
        expected = [sum(pattern[1, h, 5, j] for h in heads) / len(heads) for j in range(p)]
        np.testing.assert_allclose(shares, expected, rtol=1e-12)
        amap = A.attention_map(pattern, 1, head, 5, p, (2, 2))
        assert shares.sum() == pytest.approx(amap.prefix_share)  # the map's share is their sum
        assert shares.sum() + amap.map.sum() == pytest.approx(1.0)


# ---------------------------------------------------------------------------------- high-norm tokens


def naive_quantile(values, q):
    """The q-quantile by linear interpolation between order statistics (numpy's default), by hand."""
    ordered = sorted(float(v) for v in values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def test_high_norm_fence_is_q3_plus_3_iqr_per_layer_against_a_loop():
    rng = np.random.default_rng(7)
    patch_norms = rng.gamma(4.0, size=(5, 37)).astype(np.float32)  # (L+1, N), an odd N: interpolated quartiles
    fence = A.high_norm_fence(patch_norms)
    assert fence.shape == (5,) and fence.dtype == np.float32
    for layer in range(5):
        q1, q3 = naive_quantile(patch_norms[layer], 0.25), naive_quantile(patch_norms[layer], 0.75)
        assert fence[layer] == pytest.approx(q3 + 3 * (q3 - q1), rel=1e-6)


def test_high_norm_patches_and_rate_against_a_loop_prefix_tokens_never_counted():
    rng = np.random.default_rng(8)
    prefix, n = 5, 64  # CLS + 4 registers
    norms = rng.normal(10, 1, size=(4, prefix + n)).astype(np.float32)  # (L+1, T)
    norms[:, :prefix] = 1000.0  # huge prefix norms: never marked, and not part of the patches' quartiles
    norms[1, prefix + 3] = norms[2, prefix + 3] = 60.0  # a planted outlier in layers 1 and 2
    norms[3, prefix + 10:prefix + 13] = 80.0  # three in layer 3
    high = A.high_norm_patches(norms, prefix)
    assert high.shape == (4, n) and high.dtype == bool
    for layer in range(4):
        patch = norms[layer, prefix:]
        q1, q3 = naive_quantile(patch, 0.25), naive_quantile(patch, 0.75)
        expected = [bool(v > q3 + 3 * (q3 - q1)) for v in patch]
        assert high[layer].tolist() == expected
    assert np.flatnonzero(high[1]).tolist() == [3] and np.flatnonzero(high[2]).tolist() == [3]
    assert np.flatnonzero(high[3]).tolist() == [10, 11, 12]
    np.testing.assert_allclose(A.high_norm_rate(norms, prefix), [sum(row) / n for row in high.tolist()])
    assert A.high_norm_rate(norms, prefix).dtype == np.float32


def test_high_norm_known_values():
    equal = np.full((2, 1 + 16), 3.0, dtype=np.float32)  # every norm the same: IQR 0, fence = the norm, nothing above it
    np.testing.assert_allclose(A.high_norm_fence(equal[:, 1:]), [3.0, 3.0])
    assert not A.high_norm_patches(equal, 1).any()
    assert A.high_norm_rate(equal, 1).tolist() == [0.0, 0.0]
    steps = np.arange(1, 9, dtype=np.float32)  # 1..8: Q1 = 2.75, Q3 = 6.25, fence = 6.25 + 3 * 3.5 = 16.75
    assert float(A.high_norm_fence(steps)) == pytest.approx(16.75)
    with_outlier = np.array([[50.0, *range(1, 9), 100.0]], dtype=np.float32)  # (1, T): a prefix token, then 1..8 and 100
    assert float(A.high_norm_fence(with_outlier[0, 1:])) == pytest.approx(19.0)  # Q1 = 3, Q3 = 7 (9 values): 7 + 3 * 4
    assert A.high_norm_patches(with_outlier, 1).tolist() == [[False] * 8 + [True]]  # only the 100; the prefix 50 not counted
    assert A.high_norm_patches(steps[None], 0).sum() == 0  # no patch of 1..8 is far out


def test_attention_share_to_against_a_loop_and_known_values():
    rng = np.random.default_rng(9)
    pattern = random_pattern(rng, layers=1, heads=3, tokens=5 + 12)[0]  # (H, T, T)
    keys = np.zeros(17, dtype=bool)
    keys[[1, 2, 3, 4, 9]] = True  # four registers and one patch
    total = 0.0
    for h in range(3):
        for q in range(17):
            total += sum(float(pattern[h, q, k]) for k in range(17) if keys[k])
    assert A.attention_share_to(pattern, keys) == pytest.approx(total / (3 * 17), abs=1e-6)
    assert A.attention_share_to(pattern, np.zeros(17, dtype=bool)) == 0.0
    assert A.attention_share_to(pattern, np.ones(17, dtype=bool)) == pytest.approx(1.0, abs=1e-6)  # rows sum to 1
    uniform = np.full((2, 17, 17), 1 / 17, dtype=np.float32)
    assert A.attention_share_to(uniform, keys) == pytest.approx(5 / 17, abs=1e-6)
    identity = np.broadcast_to(np.eye(17, dtype=np.float32), (2, 17, 17))  # each query attends to itself
    assert A.attention_share_to(identity, keys) == pytest.approx(5 / 17, abs=1e-6)  # the share of queries that are keys
    to_first = np.zeros((2, 17, 17), dtype=np.float32)
    to_first[:, :, 0] = 1.0  # everything goes to the class token
    assert A.attention_share_to(to_first, np.arange(17) == 0) == 1.0 and A.attention_share_to(to_first, keys) == 0.0
