"""The analyses over many images (vit_core.dataset): every dataset-level value equals the mean (and std) of
the per-image results of the single-image path (run_with_capture + analyses, explain), for batch sizes that
don't divide the count; labels from folder names; unreadable files skipped; worker processes; hook hygiene;
the files of the `dataset` command."""

from __future__ import annotations

import io
import json
import math
import types
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import drawn_image, encoded, hooks_on
from vit_core import CaptureError, analyses, explain, load_model, recording_hooks_on, run_with_capture
from vit_core.dataset import (
    DatasetError,
    ExactMoments,
    analyze_dataset,
    attention_distances,
    dataset_files,
    folder_labels,
    high_norm_rates,
    list_images,
    reduce_batch,
)

ATOL = 1e-4  # pixels: float32 sums over 196 keys of distances up to ~300 px, in another order


def drawn_sources(count: int, size: tuple[int, int] = (240, 320)) -> list[tuple[str, bytes]]:
    return [(f"image{i}.png", encoded(drawn_image(i, size))) for i in range(count)]


@pytest.fixture(scope="module")
def planted():
    """A 2-block random-init ViT-Ti/16 with one patch position planted far from the rest (a large offset in its
    position embedding): that patch's token has a high norm in every layer, as Darcet et al.'s outlier tokens,
    so the high-norm rates are not all 0."""
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2)
    with torch.no_grad():
        pos = loaded.model.pos_embed  # (1, 1 + N, D)
        pos[0, 1 + 37] += 40.0 * torch.randn(pos.shape[-1], generator=torch.Generator().manual_seed(1))
    return loaded


def per_image(loaded, sources):
    """The single-image path for each source: (MAD (n, L, H), MAD renorm, high-norm rate (n, L+1), top-1 (n,),
    logit-lens top-1 (n, L+1))."""
    g = loaded.geometry
    p = g.num_prefix_tokens
    mad, renorm, rate, top1, lens = [], [], [], [], []
    for _, data in sources:
        cap = run_with_capture(loaded, Image.open(io.BytesIO(data)))
        mad.append(analyses.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size))
        renorm.append(analyses.mean_attention_distance(cap.pattern, p, g.grid, g.patch_size, renormalize=True))
        rate.append(analyses.high_norm_rate(explain.token_norms(cap), p))
        top1.append(int(np.argmax(cap.logits)))
        lens.append(explain.logit_lens(loaded, cap).argmax(axis=-1))
    return np.stack(mad), np.stack(renorm), np.stack(rate), np.array(top1), np.stack(lens)


def assert_equals_per_image(result, loaded, sources, labels=None, expected=None):
    """`expected`: per_image(loaded, sources), when already computed."""
    mad, renorm, rate, top1, lens = expected or per_image(loaded, sources)
    assert result.num_images == len(sources)
    np.testing.assert_allclose(result.mean_attention_distance, mad.mean(axis=0), rtol=0, atol=ATOL)
    np.testing.assert_allclose(result.mean_attention_distance_std, mad.std(axis=0), rtol=0, atol=ATOL)  # ddof 0
    np.testing.assert_allclose(result.mean_attention_distance_renorm, renorm.mean(axis=0), rtol=0, atol=ATOL)
    np.testing.assert_allclose(result.high_norm_rate, rate.mean(axis=0), rtol=0, atol=1e-6)
    if labels is None:
        assert result.accuracy is None and result.logit_lens_accuracy is None
        return
    known = np.array([label is not None for label in labels])
    truth = np.array([-1 if label is None else label for label in labels])[known]
    assert result.accuracy == pytest.approx(float(np.mean(top1[known] == truth)))
    np.testing.assert_allclose(result.logit_lens_accuracy, (lens[known] == truth[:, None]).mean(axis=0), atol=1e-7)


def test_reductions_equal_the_per_image_results(planted):
    sources = drawn_sources(7)
    expected = per_image(planted, sources)
    _, _, rate, top1, lens = expected
    assert rate.max() > 0, "the planted token should be high-norm"
    # labels: right, wrong, unknown; chosen so accuracy and the lens rows are neither all 0 nor all 1
    labels = [int(top1[0]), int(top1[1]), (int(top1[2]) + 1) % 1000, None, int(lens[4, 0]), int(top1[5]), None]
    for batch_size in (3, 4):  # 7 = 3 + 3 + 1 = 4 + 3
        seen = []
        result = analyze_dataset(planted, sources, labels, batch_size=batch_size,
                                 progress=lambda d, t, seen=seen: seen.append((d, t)))
        assert_equals_per_image(result, planted, sources, labels, expected)
        assert result.num_labelled == 5
        assert seen == [(k, 7) for k in range(1, 8)]  # each image as its values come in, whatever the batch
        assert 0 < result.accuracy < 1
        assert result.logit_lens_accuracy[-1] == pytest.approx(result.accuracy)  # the last row is the model's own logits
    assert recording_hooks_on(planted.model) == 0 and hooks_on(planted.model) == 0
    assert all(blk.attn.fused_attn for blk in planted.model.blocks)


@pytest.mark.parametrize("kind", ["registers", "distilled", "no_class_token"])
def test_prefix_tokens_of_every_kind(family, kind):
    """Registers (P = 5), a distillation token (P = 2), no class token (P = 0, mean pooling)."""
    loaded = family[kind]
    sources = drawn_sources(3)
    expected, classes = per_image(loaded, sources), loaded.geometry.num_classes
    top1 = expected[3]
    labels = [int(top1[0]), None, (int(top1[2]) + 1) % classes] if classes else None  # the DINOv2 one has no head
    result = analyze_dataset(loaded, sources, labels, batch_size=2)
    assert_equals_per_image(result, loaded, sources, labels, expected)
    assert result.mean_attention_distance.shape == (loaded.geometry.num_layers, loaded.geometry.num_heads)


def test_device_reductions_equal_the_numpy_definitions():
    rng = np.random.default_rng(0)
    grid, patch, p = (4, 5), (8, 8), 2
    logits = rng.normal(size=(3, 2, p + 20, p + 20)) * 3
    pattern = analyses.softmax(logits)  # (B, H, T, T), rows sum to 1
    distance = torch.from_numpy(analyses.patch_distances(grid, patch)).float()
    default, renorm = attention_distances(torch.from_numpy(pattern), distance, p)
    for b in range(3):
        np.testing.assert_allclose(default[b], analyses.mean_attention_distance(pattern[b:b + 1], p, grid, patch)[0], atol=1e-4)
        np.testing.assert_allclose(renorm[b], analyses.mean_attention_distance(pattern[b:b + 1], p, grid, patch, True)[0],
                                   atol=1e-4)
    norms = np.exp(rng.normal(size=(6, p + 20)) * 1.5).astype(np.float32)  # heavy-tailed: some above the fence
    norms[0, p:] = 1.0  # all equal: IQR 0, nothing above
    rates = high_norm_rates(torch.from_numpy(norms), p).numpy()
    np.testing.assert_array_equal(rates, [analyses.high_norm_rate(n[None], p)[0] for n in norms])
    assert rates.max() > 0 and rates[0] == 0


def test_exact_moments_are_the_exact_mean_and_std_rounded_once():
    values = np.random.default_rng(0).normal(100, 30, size=(11, 3, 4))
    values[0, 0, 0], values[1, 0, 1] = 1e150, -1e-300  # magnitudes a float64 running sum would round away
    moments = ExactMoments()
    for chunk in np.split(values, [1, 5, 6]):
        moments.add(chunk)
    moments.add(values[:0])  # an empty batch changes nothing
    assert moments.count == 11
    for index in np.ndindex(values.shape[1:]):
        column = [Fraction(float(v)) for v in values[(slice(None), *index)]]
        mean = sum(column) / 11
        variance = sum((v - mean) ** 2 for v in column) / 11
        assert moments.mean[index] == float(mean), index
        assert moments.std()[index] == math.sqrt(float(variance)), index


def test_exact_moments_of_a_nan_or_infinity_are_nan_where_they_met_one():
    moments = ExactMoments()
    moments.add(np.array([[1.0, 2.0], [np.nan, 3.0]]))
    moments.add(np.array([[1.0, np.inf]]))
    mean, std = moments.mean, moments.std()
    assert np.isnan(mean).all() and np.isnan(std).all()
    moments = ExactMoments()
    moments.add(np.array([[1.0, 2.0], [np.nan, 4.0]]))
    assert np.isnan(moments.mean[0]) and moments.mean[1] == 3.0 and moments.std()[1] == 1.0


def test_explained_aucs_equal_the_per_image_faithfulness():
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, img_size=64)  # 4 x 4 patches: fast
    sources = drawn_sources(3, size=(80, 96))
    seen = []
    result = analyze_dataset(loaded, sources, batch_size=2, explain=True, steps=3, progress=lambda d, t: seen.append((d, t)),
                             forwards=2)
    expected_deletion, expected_insertion = {}, {}
    for _, data in sources:
        image = Image.open(io.BytesIO(data))
        relevance = explain.relevance_maps(loaded, image)  # target: the top-1
        faith = explain.faithfulness(loaded, image, relevance.maps, relevance.target, steps=3)
        for name in faith.deletion_auc:
            expected_deletion.setdefault(name, []).append(faith.deletion_auc[name])
            expected_insertion.setdefault(name, []).append(faith.insertion_auc[name])
    assert list(result.deletion_auc) == [*relevance.maps, "random"]
    for name in expected_deletion:
        assert result.deletion_auc[name] == pytest.approx(np.mean(expected_deletion[name]), abs=1e-6)
        assert result.insertion_auc[name] == pytest.approx(np.mean(expected_insertion[name]), abs=1e-6)
    assert seen == [(1, 3), (2, 3), (3, 3)]  # files: each image once its explanation is in
    arrays = result.arrays()
    assert arrays["deletion_auc_random"].dtype == np.float64 and arrays["deletion_auc_random"].shape == ()
    assert {f"insertion_auc_{name}" for name in expected_deletion} <= set(arrays)
    assert recording_hooks_on(loaded.model) == 0 and hooks_on(loaded.model) == 0
    alone = analyze_dataset(loaded, sources, batch_size=2, explain=True, steps=3, forwards=1)
    for key, value in result.arrays().items():  # two forwards at once or one: the same bits, explanations included
        assert np.asarray(value).tobytes() == np.asarray(alone.arrays()[key]).tobytes(), key


# ---------------------------------------------------------------------------------- files, folders, failures


def write_folder(root: Path, layout: dict[str, bytes]) -> Path:
    for relative, data in layout.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_unreadable_files_are_reported_and_skipped(tiny):
    good = drawn_sources(3)
    truncated = encoded(drawn_image(9))[:200]
    sources = [good[0], ("notes.png", b"just some text"), good[1], ("empty.jpg", b""), ("cut.png", truncated), good[2]]
    seen = []
    result = analyze_dataset(tiny, sources, batch_size=4, progress=lambda d, t: seen.append((d, t)))
    assert [name for name, _ in result.failures] == ["notes.png", "empty.jpg", "cut.png"]
    assert all(reason.endswith(".") and "\n" not in reason for _, reason in result.failures)  # one sentence each
    assert dict(result.failures)["empty.jpg"] == "The file is empty."
    assert seen == [(3, 6), (4, 6), (6, 6)]  # a batch's failures counted with its next image
    assert_equals_per_image(result, tiny, good)
    assert json.loads(dataset_files(result, tiny.geometry)["dataset.json"])["failures"] == [
        f"{name}: {reason}" for name, reason in result.failures]


def test_nothing_readable_or_labels_that_dont_fit_are_errors(tiny):
    with pytest.raises(ValueError, match="outside the model's classes 0..999"):
        analyze_dataset(tiny, drawn_sources(2), [0, 1000])
    with pytest.raises(ValueError, match="1 labels for 2 images"):
        analyze_dataset(tiny, drawn_sources(2), [0])
    with pytest.raises(DatasetError, match="None of the 2 images could be read"):
        analyze_dataset(tiny, [("a.png", b"x"), ("b.png", b"")])
    with pytest.raises(DatasetError, match="no images"):
        analyze_dataset(tiny, [])


def test_worker_processes_give_the_same_result(tiny, tmp_path):
    layout = {f"class{i % 2}/image{i}.png": data for i, (_, data) in enumerate(drawn_sources(5))}
    layout["broken.png"] = b"GIF89a but not really"
    paths = list_images(write_folder(tmp_path, layout))
    sources = [(path.name, path) for path in paths]
    in_process = analyze_dataset(tiny, sources, batch_size=2, workers=0)
    in_workers = analyze_dataset(tiny, sources, batch_size=2, workers=2)
    for key, value in in_process.arrays().items():
        np.testing.assert_array_equal(in_workers.arrays()[key], value, err_msg=key)
    assert in_workers.failures == in_process.failures == (("broken.png", in_process.failures[0][1]),)
    assert in_process.num_images == 5


def test_list_images_is_recursive_sorted_and_keeps_image_suffixes(tmp_path):
    data = encoded(drawn_image(0, (48, 48)))
    write_folder(tmp_path, {"b/z.PNG": data, "a.jpg": data, "b/a/deep.webp": data, "notes.txt": b"x", "b/c.tiff": data,
                            ".hidden/x.png": data, "b/.x.png": data, "model.safetensors": b"x"})
    assert [p.relative_to(tmp_path).as_posix() for p in list_images(tmp_path)] == [
        "a.jpg", "b/a/deep.webp", "b/c.tiff", "b/z.PNG"]


def test_folder_labels_by_index_name_and_synset(tmp_path):
    shapes = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=1, num_classes=4,
                        labels=("circle", "square, box", "triangle", "other"))
    paths = [tmp_path / rel for rel in ("2/a.png", "Square/b.png", "square, box/c.png", "CIRCLE/d/e.png", "unknown/f.png",
                                        "g.png", "7/h.png", "box/i.png")]
    # "7": no such class index; "box": a later comma-separated part, not the label's first
    assert folder_labels(shapes, tmp_path, paths) == [2, 1, 1, 0, None, None, None, None]
    assert folder_labels(shapes, tmp_path, [tmp_path / "photos/a.png", tmp_path / "b.png"]) is None

    imagenet = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=1)  # a 1000-class head: ImageNet labels
    assert imagenet.labels is not None and imagenet.labels[0].startswith("tench")
    paths = [tmp_path / rel for rel in ("n01440764/x.JPEG", "n01443537/y.JPEG", "goldfish/z.png", "n99999999/w.png")]
    assert folder_labels(imagenet, tmp_path, paths) == [0, 1, 1, None]


def test_hooks_removed_when_the_forward_raises(tiny):
    model = tiny.model
    model.train()

    def boom(self, x):
        raise RuntimeError("boom")

    model.blocks[1].mlp.forward = types.MethodType(boom, model.blocks[1].mlp)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            reduce_batch(tiny, torch.zeros(2, 3, 224, 224), logit_lens=True)
        assert model.training  # the caller's mode is back
    finally:
        del model.blocks[1].mlp.forward
        model.eval()
    assert recording_hooks_on(model) == 0 and hooks_on(model) == 0
    assert all(blk.attn.fused_attn for blk in model.blocks)


def test_arrays_and_files_follow_the_interface_table(tiny):
    sources = drawn_sources(3)
    g = tiny.geometry
    L, H = g.num_layers, g.num_heads
    unlabelled = analyze_dataset(tiny, sources, batch_size=2)
    labelled = analyze_dataset(tiny, sources, [0, 1, None], batch_size=2)
    expected = {
        "num_images": (np.int64, ()),
        "mean_attention_distance": (np.float32, (L, H)),
        "mean_attention_distance_std": (np.float32, (L, H)),
        "mean_attention_distance_renorm": (np.float32, (L, H)),
        "high_norm_rate": (np.float32, (L + 1,)),
    }
    C = g.num_classes
    with_labels = {**expected, "accuracy": (np.float64, ()), "logit_lens_accuracy": (np.float32, (L + 1,)),
                   "class_images": (np.int64, (C,)), "class_correct": (np.int64, (C,)),
                   "confusion": (np.int64, (2, 3))}  # 2 labelled images of 2 true classes: 2 (true, predicted) cells
    for result, table, names in ((unlabelled, expected, set()), (labelled, with_labels, {"classes.csv"})):
        arrays = result.arrays()
        assert {key: (a.dtype.type, a.shape) for key, a in arrays.items()} == table
        files = dataset_files(result, g)
        assert set(files) == {"dataset.npz", "dataset.json", "mean_attention_distance.png", "images.csv", *names}
        with np.load(io.BytesIO(files["dataset.npz"])) as npz:
            assert set(npz.files) == set(table)
            for key in table:
                np.testing.assert_array_equal(npz[key], arrays[key])
        summary = json.loads(files["dataset.json"])
        assert summary["model"] == tiny.name and summary["weights"] == tiny.weights and summary["device"] == "CPU"
        assert summary["num_images"] == 3 and summary["failures"] == []
        assert summary["accuracy"] == result.accuracy
    assert int(labelled.arrays()["num_images"]) == 3
    assert not labelled.mean_attention_distance.flags.writeable and not labelled.logit_lens_accuracy.flags.writeable


def test_distance_figure_is_a_png(tiny):
    result = analyze_dataset(tiny, drawn_sources(2))
    data = dataset_files(result, tiny.geometry)["mean_attention_distance.png"]  # vit_core.plots, as the dashboard's
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as im:
        assert im.width > 400 and im.height > 250


def test_bfloat16_autocast_runs_and_stays_close(tiny):
    """The GPU fast mode (the benchmark's --dtype bfloat16) on the CPU: the hooks take bf16 tokens and whatever
    dtype the pattern has under autocast, and the distances stay near the float32 ones."""
    sources = drawn_sources(3)
    exact = analyze_dataset(tiny, sources, [0, 1, 2], batch_size=2)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        fast = analyze_dataset(tiny, sources, [0, 1, 2], batch_size=2)
    np.testing.assert_allclose(fast.mean_attention_distance, exact.mean_attention_distance, rtol=0.02)
    np.testing.assert_allclose(fast.mean_attention_distance_renorm, exact.mean_attention_distance_renorm, rtol=0.02)
    assert fast.arrays().keys() == exact.arrays().keys()
    assert fast.mean_attention_distance.dtype == np.float32 and fast.logit_lens_accuracy.dtype == np.float32


def test_a_file_gone_before_its_explanation_is_reported(tmp_path):
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=0, depth=2, img_size=64)
    paths = list_images(write_folder(tmp_path, {name: data for name, data in drawn_sources(2, size=(80, 96))}))
    sources = [(path.name, path) for path in paths]

    def remove_second(done, total):  # called after the first image's explanation, before the second's
        if done == 1:
            paths[1].unlink()

    result = analyze_dataset(loaded, sources, batch_size=2, explain=True, steps=2, progress=remove_second)
    assert result.num_images == 2  # both were in the reductions
    assert [name for name, _ in result.failures] == ["image1.png"]
    assert result.failures[0][1].startswith("No explanation: Could not read image1.png")
    assert "random" in result.deletion_auc  # from the first image alone


def test_an_attention_that_bypasses_the_hook_is_an_error_not_a_wrong_distance(tiny):
    attn = tiny.model.blocks[0].attn
    original = attn.forward

    def always_fused(*args, **kwargs):  # ignores the un-fused switch: no pattern reaches the reduction
        attn.fused_attn = True
        return original(*args, **kwargs)

    attn.forward = always_fused
    try:
        with pytest.raises(CaptureError, match="one attention pattern per block"):
            analyze_dataset(tiny, drawn_sources(1))
    finally:
        del attn.forward
        attn.fused_attn = True
    assert recording_hooks_on(tiny.model) == 0 and hooks_on(tiny.model) == 0


def test_the_batch_forward_runs_in_full_float32_for_the_model_device(monkeypatch, tiny):
    """As a capture: on a GPU, TF32 off for the pass (recorded here by a stand-in for devices.full_float32)."""
    import vit_core.dataset.reductions
    from unit.test_devices import full_float32_recorded

    with full_float32_recorded(monkeypatch, tiny, vit_core.dataset.reductions) as (asked, heads_seen):
        analyze_dataset(tiny, drawn_sources(3), [0, 1, 2], batch_size=2)
    assert asked == [tiny.device] * 3  # one pass per image on a CPU (dataset.forward_images)
    assert heads_seen and all(heads_seen)  # the model's head and every logit-lens row


def test_default_batch_is_small_on_a_cpu_and_large_on_an_accelerator():
    from vit_core.dataset import default_batch_size, forward_images

    assert default_batch_size(torch.device("cpu")) == 32
    assert default_batch_size(torch.device("meta")) == 64
    assert forward_images(torch.device("cpu")) == 1 and forward_images(torch.device("meta")) == 64


def _values_of(batches):
    return {key: np.concatenate([getattr(b, key) for b in batches])
            for key in ("distance", "distance_renorm", "high_norm_rate", "top1", "probability", "lens_top1")}


def test_an_images_values_are_the_same_bits_whatever_else_was_in_its_batch(tiny):
    """A matrix product's library chooses its algorithm by shape: every forward has forward_images images, so
    splitting the same images into other batches moves no bit."""
    x = torch.randn(5, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    whole = _values_of([reduce_batch(tiny, x, logit_lens=True)])
    for split in ([1, 1, 1, 1, 1], [2, 3], [4, 1]):
        parts = torch.split(x, split)
        got = _values_of([reduce_batch(tiny, part, logit_lens=True) for part in parts])
        for key, value in whole.items():
            assert value.tobytes() == got[key].tobytes(), (split, key)


def test_on_an_accelerator_every_forward_has_the_same_images_padded_with_zeros(tiny, monkeypatch):
    """Where forward_images is above one (an accelerator's 64; 4 here, on the CPU), a short batch is padded to it
    with zero images and their values dropped: the same bits for an image alone as among others."""
    from vit_core.dataset import reductions

    monkeypatch.setattr(reductions, "forward_images", lambda device: 4)
    shapes = []
    original = reductions._reduce_forward
    monkeypatch.setattr(reductions, "_reduce_forward",
                        lambda loaded, x, *a: shapes.append(tuple(x.shape)) or original(loaded, x, *a))
    x = torch.randn(5, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    whole = _values_of([reduce_batch(tiny, x, logit_lens=True)])
    alone = _values_of([reduce_batch(tiny, x[i:i + 1], logit_lens=True) for i in range(5)])
    assert {s[0] for s in shapes} == {4} and len(shapes) == 2 + 5
    assert all(len(v) == 5 for v in whole.values())
    for key, value in whole.items():
        assert value.tobytes() == alone[key].tobytes(), key


def test_a_pools_forwards_run_at_one_torch_thread_and_the_callers_count_is_kept(tiny):
    """Each worker's forward runs at one torch thread, also after its first operator (torch gives a thread the count
    last set by any thread when that thread first reads it), and the caller's count is what it was."""
    from vit_core.dataset import forward_pool

    caller = torch.get_num_threads()
    seen = []

    def run(model, item):
        model.model(torch.zeros(1, 3, 224, 224))  # the thread's first operators
        return torch.get_num_threads()

    with forward_pool(tiny, 2) as pool:
        seen = pool.map(run, range(4))
    assert seen == [1, 1, 1, 1]
    assert torch.get_num_threads() == caller


@pytest.mark.parametrize("workers", [None, 2])
def test_forwards_are_reported_in_order_as_they_finish_not_at_the_batchs_end(tiny, workers):
    """map_forwards' each(i) comes in the caller's thread once item i and those before it are done: the last item here
    waits until the first has been reported, which a report at the batch's end would never allow."""
    import threading

    from vit_core.dataset import forward_pool
    from vit_core.dataset.workers import map_forwards

    first_reported, seen = threading.Event(), []

    def run(model, item):
        if item == 3 and not first_reported.wait(timeout=60):
            raise AssertionError("item 0 was not reported before the last item ran")
        return item * 10

    def each(index):
        seen.append((index, threading.current_thread() is threading.main_thread()))
        first_reported.set()

    if workers is None:
        assert map_forwards(None, tiny, run, range(4), each) == [0, 10, 20, 30]
    else:
        with forward_pool(tiny, workers) as pool:
            assert map_forwards(pool, tiny, run, range(4), each) == [0, 10, 20, 30]
    assert seen == [(i, True) for i in range(4)]


def test_a_pool_keeps_what_it_makes_once_made_on_a_worker_at_one_torch_thread(tiny):
    import threading

    from vit_core.dataset import forward_pool

    made = []

    def make():
        made.append((threading.current_thread().name, torch.get_num_threads()))
        return len(made)

    with forward_pool(tiny, 2) as pool:
        assert [pool.once("a", make), pool.once("a", make), pool.once("b", make)] == [1, 1, 2]
    assert len(made) == 2 and all(name.startswith("vit-lens-forward") and threads == 1 for name, threads in made)


def _pooled_and_eager(loaded, x, monkeypatch):
    """reduce_batch of x through a pool of two workers and without one (eager, one forward after another), and what
    each call of traced_reductions gave."""
    from vit_core.dataset import forward_pool, reductions

    traces = []
    original = reductions.traced_reductions
    monkeypatch.setattr(reductions, "traced_reductions", lambda *a: traces.append(original(*a)) or traces[-1])
    with forward_pool(loaded, 2) as pool:
        pooled = _values_of([reduce_batch(loaded, x[:3], True, pool=pool), reduce_batch(loaded, x[3:], True, pool=pool)])
    return pooled, _values_of([reduce_batch(loaded, x, True)]), traces


def test_a_pools_forwards_run_one_trace_with_the_eager_forwards_bits(tiny, monkeypatch):
    """On a CPU a pool records the reduced forward once, as TorchScript, and runs every image through it: the same
    bits as the eager hooked forward, on images other than the two it was checked on, with the logit lens too."""
    from vit_core.dataset import reductions

    eager_forwards = []
    original = reductions._reduce_forward
    monkeypatch.setattr(reductions, "_reduce_forward", lambda *a, **k: eager_forwards.append(1) or original(*a, **k))
    x = torch.randn(7, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    pooled, eager, traces = _pooled_and_eager(tiny, x, monkeypatch)
    assert len(traces) == 1 and traces[0] is not None  # recorded once for both batches, and kept
    assert len(eager_forwards) == 3 + 7  # the trace's two checks and its recording; then the 7 images without a pool
    for key, value in eager.items():
        assert value.tobytes() == pooled[key].tobytes(), key
    assert recording_hooks_on(tiny.model) == 0 and hooks_on(tiny.model) == 0


def test_a_model_with_someone_elses_hook_or_a_branch_on_its_pixels_stays_eager(monkeypatch):
    """A trace would drop a hook's Python and keep one side of a branch: such a model's pool runs the eager forward,
    whose values (the hook's doubling, each image's own side of the branch) are those without a pool."""
    loaded = load_model("vit_tiny_patch16_224", pretrained=False, seed=3, depth=2)
    x = torch.randn(5, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    x[1:, :, :, :112] += 1.0  # images 1..4 brighter on the left, image 0 as drawn

    handle = loaded.model.blocks[0].mlp.register_forward_hook(lambda m, i, o: 2 * o)
    try:
        pooled, eager, traces = _pooled_and_eager(loaded, x, monkeypatch)
    finally:
        handle.remove()
    assert traces == [None]
    for key, value in eager.items():
        assert value.tobytes() == pooled[key].tobytes(), key

    embed = loaded.model.patch_embed
    original = embed.forward

    def branching(image):  # doubles the embeddings of an image brighter on its left than on its right
        tokens = original(image)
        return 2 * tokens if float(image[..., :112].sum()) > float(image[..., 112:].sum()) else tokens

    monkeypatch.setattr(embed, "forward", branching)
    pooled, eager, traces = _pooled_and_eager(loaded, x, monkeypatch)
    assert traces == [None]  # the check on the first image mirrored took the other side
    for key, value in eager.items():
        assert value.tobytes() == pooled[key].tobytes(), key


def test_a_model_whose_forward_is_long_is_not_traced(tiny, monkeypatch):
    """Above TRACED_FORWARD_MACS a trace's recording costs more than it saves: the pool runs eager, same bits."""
    from vit_core.dataset import reductions

    monkeypatch.setattr(reductions, "TRACED_FORWARD_MACS", tiny.multiply_adds)  # tiny is just too long now
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    pooled, eager, traces = _pooled_and_eager(tiny, x, monkeypatch)
    assert traces == []
    for key, value in eager.items():
        assert value.tobytes() == pooled[key].tobytes(), key
