"""The concept lens (vit_core.concepts): the TopK autoencoder against a plain loop, a splice with an exact
reconstruction against the model's own logits, a planted concept recovered as one feature, seeded training
bit-identical (also in another process), shards collecting the same tokens as one process, and the command's files.
All on the bundled Shapes ViT and images the tests draw themselves."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_core import __main__ as core_cli
from vit_core import load_model, recording_hooks_on, run_with_capture
from vit_core.concepts import (
    Concepts,
    ConceptsError,
    Normalisation,
    TokenStore,
    TopKSAE,
    TrainingSettings,
    collect_shards,
    concepts_bytes,
    held_out,
    image_concepts,
    load_concepts,
    logits_spliced,
    logits_with_concept_removed,
    patch_crop,
    residual_after,
    spliced_logits,
)
from vit_core.concepts.collect import TokenChunk, manifest_of
from vit_core.concepts.learn import Tokens, feature_statistics, learned_concepts
from vit_core.concepts.sae import initialised_sae, train_sae
from vit_core.dataset import plan_run
from vit_core.explain.passes import model_input
from vit_core.teaching.data import LABELS, draw_set

LAYER = 2


@pytest.fixture(scope="module")
def shapes():
    return load_model("vit-lens/shapes-vit", device="cpu")


@pytest.fixture(scope="module")
def drawn():
    return draw_set(36, seed=46)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, drawn) -> Path:
    """12 drawn Shapes images in class folders, and a file that is not an image."""
    root = tmp_path_factory.mktemp("shapes")
    for i in range(12):
        (root / LABELS[drawn.labels[i]]).mkdir(exist_ok=True)
        Image.fromarray(drawn.images[i]).save(root / LABELS[drawn.labels[i]] / f"{i:02d}.png")
    (root / "notes.txt").write_text("not an image")
    return root


def random_concepts(d_model: int = 16, num_features: int = 40, k: int = 5, seed: int = 0) -> Concepts:
    """An autoencoder with random weights and biases and a non-trivial normalisation."""
    generator = torch.Generator().manual_seed(seed)
    sae = TopKSAE(d_model, num_features, k)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    normalisation = Normalisation(np.linspace(-1, 1, d_model).astype(np.float32), 1.7)
    return Concepts(sae.eval(), normalisation, "test", "random", 0)


def test_topk_encoding_and_decoding_equal_a_plain_loop():
    concepts = random_concepts()
    sae, norm = concepts.sae, concepts.normalisation
    x = np.random.default_rng(0).normal(size=(7, 16)).astype(np.float32)
    W_enc, b_enc = sae.W_enc.detach().numpy().astype(np.float64), sae.b_enc.detach().numpy().astype(np.float64)
    W_dec, b_pre = sae.W_dec.detach().numpy().astype(np.float64), sae.b_pre.detach().numpy().astype(np.float64)
    expected_codes = np.zeros((7, 40))
    expected_reconstruction = np.zeros((7, 16))
    for n in range(7):
        x_n = [(x[n, d] - norm.mean[d]) / norm.scale for d in range(16)]
        pre = [sum(W_enc[f, d] * (x_n[d] - b_pre[d]) for d in range(16)) + b_enc[f] for f in range(40)]
        for f in sorted(range(40), key=lambda f: -pre[f])[:5]:
            expected_codes[n, f] = max(pre[f], 0.0)
        for d in range(16):
            value = b_pre[d] + sum(expected_codes[n, f] * W_dec[d, f] for f in range(40))
            expected_reconstruction[n, d] = value * norm.scale + norm.mean[d]
    codes = concepts.encode(x)
    assert ((codes > 0).sum(axis=1) <= 5).all()
    np.testing.assert_allclose(codes, expected_codes, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(concepts.decode(codes), expected_reconstruction, rtol=1e-5, atol=1e-4)


def exact_concepts(d_model: int, layer: int) -> Concepts:
    """An autoencoder that reconstructs every token exactly: features +e_d and -e_d (F = 2D), k = D, no bias, no
    normalisation; z_+d = ReLU(x_d), z_-d = ReLU(-x_d), so W_dec z = x."""
    sae = TopKSAE(d_model, 2 * d_model, d_model)
    eye = torch.eye(d_model)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye]))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=1))
    return Concepts(sae.eval(), Normalisation(np.zeros(d_model, dtype=np.float32), 1.0), "vit-lens/shapes-vit", "", layer)


def test_the_residual_after_block_l_is_the_captures(shapes, drawn):
    cap = run_with_capture(shapes, Image.fromarray(drawn.images[0]))
    with torch.inference_mode():
        tokens = residual_after(shapes, model_input(shapes, cap), LAYER)[0].numpy()  # (T, D)
    np.testing.assert_allclose(tokens, cap.tokens[LAYER + 1], rtol=1e-5, atol=1e-5)


def test_a_splice_with_an_exact_reconstruction_gives_the_models_own_logits(shapes, drawn):
    exact = exact_concepts(shapes.geometry.embed_dim, LAYER)
    for i in range(3):
        cap = run_with_capture(shapes, Image.fromarray(drawn.images[i]))
        np.testing.assert_allclose(logits_spliced(shapes, cap, exact), cap.logits, rtol=1e-5, atol=1e-5)
        seen = image_concepts(exact, cap)
        assert seen.error == pytest.approx(0.0, abs=1e-10)
    assert recording_hooks_on(shapes.model) == 0
    # Removing a feature that fires changes the logits: the splice does reach the forward pass.
    removed = logits_with_concept_removed(shapes, cap, exact, int(seen.strongest[0]))
    assert not np.allclose(removed, cap.logits, atol=1e-4)
    assert recording_hooks_on(shapes.model) == 0


def patch_tokens_of(shapes, images: np.ndarray) -> np.ndarray:
    """float32 (n, N, D): the patch tokens after LAYER of each image."""
    x = torch.cat([model_input(shapes, Image.fromarray(image)) for image in images])
    with torch.inference_mode():
        return residual_after(shapes, x, LAYER)[:, shapes.geometry.num_prefix_tokens:].numpy().copy()


def tokens_in_memory(tokens: np.ndarray, held: np.ndarray | None = None) -> Tokens:
    n, num_patches, d = tokens.shape
    return Tokens([TokenChunk(tokens.reshape(n * num_patches, d), np.arange(n))], num_patches,
                  np.zeros(n, dtype=bool) if held is None else held)


def test_a_planted_concept_is_recovered_as_one_feature(shapes, drawn):
    """A fixed direction added to the residual stream after block L on chosen patches of chosen images: one feature
    fires on those patches and almost nowhere else (precision and recall >= 0.9)."""
    tokens = patch_tokens_of(shapes, drawn.images)  # (36, N, D)
    n, num_patches, d = tokens.shape
    rng = np.random.default_rng(1)
    direction = rng.normal(size=d)
    direction *= 2.0 * np.linalg.norm(tokens - tokens.mean(axis=(0, 1)), axis=-1).mean() / np.linalg.norm(direction)
    planted = np.zeros((n, num_patches), dtype=bool)
    for image in rng.choice(n, size=n // 2, replace=False):
        planted[image, rng.choice(num_patches, size=num_patches // 5, replace=False)] = True
    tokens = tokens + planted[..., None] * direction.astype(np.float32)
    collection = tokens_in_memory(tokens)
    concepts = learned_concepts(shapes, collection, LAYER, TrainingSettings(num_features=128, k=8, epochs=6,
                                                                           batch_tokens=256))
    fires = concepts.encode(tokens.reshape(n * num_patches, d)) > 0  # (n N, F)
    truth = planted.reshape(-1)
    true_positives = (fires & truth[:, None]).sum(axis=0)
    precision = true_positives / np.maximum(fires.sum(axis=0), 1)
    recall = true_positives / truth.sum()
    best = int(np.argmax(2 * precision * recall / np.maximum(precision + recall, 1e-12)))
    print(f"planted concept: feature {best}, precision {precision[best]:.3f}, recall {recall[best]:.3f}")
    assert precision[best] >= 0.9 and recall[best] >= 0.9


def synthetic_batches(seed: int = 3):
    tokens = torch.from_numpy(np.random.default_rng(seed).normal(size=(2000, 24)).astype(np.float32))

    def batches(epoch, generator):
        order = torch.randperm(len(tokens), generator=generator)
        for first in range(0, len(order), 256):
            yield tokens[order[first:first + 256]]
    return batches


def sae_digest(sae: TopKSAE) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(sae.state_dict().items()):
        digest.update(key.encode() + value.numpy().tobytes())
    return digest.hexdigest()


SETTINGS = TrainingSettings(num_features=64, k=4, epochs=2, seed=7)


def test_seeded_training_is_bit_identical_when_rerun_also_in_another_process():
    first = sae_digest(train_sae(synthetic_batches(), 24, 2000, SETTINGS))
    assert sae_digest(train_sae(synthetic_batches(), 24, 2000, SETTINGS)) == first
    assert sae_digest(train_sae(synthetic_batches(), 24, 2000, TrainingSettings(64, 4, epochs=2, seed=8))) != first
    code = textwrap.dedent(f"""
        import torch
        torch.set_num_threads({torch.get_num_threads()})
        from unit.test_concepts import SETTINGS, sae_digest, synthetic_batches
        from vit_core.concepts import train_sae
        print(sae_digest(train_sae(synthetic_batches(), 24, 2000, SETTINGS)))
    """)
    tests = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tests,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == first


def test_the_rate_and_the_dead_window_follow_the_run_as_the_spec_gives_them():
    """analyses.md, "Training": Gao et al.'s rate times sqrt(8192 / S) between 1 and 4, held for 80 % of the steps then
    falling linearly to 0; --lr replaces the peak; the dead window 20 F / k tokens, at least a batch, at most 10^7."""
    gao = 2e-4 / np.sqrt(2048 / 2 ** 14)
    settings = TrainingSettings(num_features=2048, k=32)  # E = 4, B = 1,024
    assert settings.steps(129_600) == 506.25
    assert settings.lr(129_600) == pytest.approx(4 * gao)  # sqrt(8192 / 506.25) = 4.02: capped at 4
    assert settings.lr(4 * 129_600) == pytest.approx(gao * np.sqrt(8192 / 2025))
    assert settings.lr(10 ** 7) == pytest.approx(gao)  # a long run: Gao et al.'s rate as it is
    assert TrainingSettings(2048, 32, learning_rate=1e-3).lr(129_600) == 1e-3
    rates = [settings.rate_at(t, 129_600) for t in range(508)]  # S' = 507: decay from step 405.6
    assert rates[:406] == [settings.lr(129_600)] * 406
    assert rates[406] == pytest.approx(4 * gao * (507 - 406) / (507 - 405.6)) and rates[506] > 0 and rates[507] == 0
    assert all(a >= b for a, b in zip(rates[:-1], rates[1:], strict=True))
    assert settings.dead_window(129_600) == 1280
    assert TrainingSettings(num_features=64, k=32).dead_window(10 ** 6) == 1024  # at least one batch
    assert TrainingSettings(num_features=2 ** 24, k=8).dead_window(10 ** 9) == 10 ** 7
    assert TrainingSettings(2048, 32, dead_after=77).dead_window(129_600) == 77


def test_the_decoder_columns_stay_unit_norm_and_dead_features_get_the_auxk_gradient():
    sae = train_sae(synthetic_batches(), 24, 2000, TrainingSettings(num_features=64, k=4, epochs=1, dead_after=256))
    np.testing.assert_allclose(sae.W_dec.detach().norm(dim=0).numpy(), 1.0, rtol=1e-5)
    untrained = initialised_sae(24, 64, 4, seed=0)
    assert not torch.equal(untrained.W_enc, sae.W_enc)


@pytest.mark.parametrize("dead_count", [3, 40])  # fewer dead than k_aux (all of them chosen), and more
def test_auxk_chooses_the_largest_dead_pre_activations_as_a_masked_choice_over_every_feature(dead_count):
    """AuxK's k_aux largest pre-activations among the dead features, chosen from the dead columns alone: the same
    loss and gradients, bit for bit, as the choice over all F columns with the living masked to -inf."""
    from torch.nn import functional as F

    from vit_core.concepts.sae import auxk_loss, chosen_pre_activations, sparse_decode

    generator = torch.Generator().manual_seed(3)
    sae = initialised_sae(24, 64, 4, seed=0)
    x_n = torch.randn(50, 24, generator=generator)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[torch.randperm(64, generator=generator)[:dead_count]] = True
    residual = torch.randn(50, 24, generator=generator)

    def loss_and_gradients(loss_of) -> list[bytes]:
        sae.zero_grad(set_to_none=True)
        centred = x_n - sae.b_pre
        with torch.no_grad():
            pre = centred @ sae.W_enc.T + sae.b_enc
        loss = loss_of(pre, centred)
        loss.backward()
        return [loss.detach().numpy().tobytes()] + [p.grad.numpy().tobytes() for p in (sae.W_enc, sae.b_enc, sae.b_pre)]

    def masked_choice(pre: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
        _, indices = pre.masked_fill(~dead, float("-inf")).topk(min(12, dead_count), dim=-1)
        estimate = sparse_decode(sae, F.relu(chosen_pre_activations(sae, centred, pre, indices)), indices)
        return (residual - estimate).pow(2).sum(-1).mean() / residual.pow(2).sum(-1).mean()

    chosen = loss_and_gradients(lambda pre, centred: auxk_loss(sae, pre, centred, residual, dead, 12))
    assert chosen == loss_and_gradients(masked_choice)
    assert auxk_loss(sae, torch.zeros(50, 64), x_n, residual, torch.zeros(64, dtype=torch.bool), 12).item() == 0


def collected(shapes, folder: Path, out: Path, num_shards: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    plan = plan_run(shapes, folder, num_shards=num_shards)
    store = TokenStore(out)
    store.open(manifest_of(shapes, plan, LAYER, None))
    collect_shards(shapes, plan, LAYER, store, list(plan.shards), batch_size=batch_size)
    chunks = store.chunks(plan.shards, mmap=False, num_patches=shapes.geometry.num_patches,
                          d_model=shapes.geometry.embed_dim)
    return np.concatenate([c.tokens for c in chunks]), np.concatenate([c.images for c in chunks])


def test_shards_collect_the_same_tokens_as_one_process(shapes, folder, tmp_path):
    one_tokens, one_images = collected(shapes, folder, tmp_path / "one", 1, 5)
    shard_tokens, shard_images = collected(shapes, folder, tmp_path / "three", 3, 2)
    assert one_images.tolist() == shard_images.tolist() == list(range(12))
    assert one_tokens.tobytes() == shard_tokens.tobytes()
    assert one_tokens.shape == (12 * shapes.geometry.num_patches, shapes.geometry.embed_dim)


def test_the_hold_out_is_a_tenth_chosen_by_name():
    names = [f"img{i:03d}.png" for i in range(50)]
    mask = held_out(names)
    assert mask.sum() == 5
    assert held_out(list(reversed(names)))[::-1].tolist() == mask.tolist()  # by name, not by position
    assert held_out(["a.png", "b.png"]).sum() == 1 and held_out(["a.png"]).sum() == 0


def test_concepts_round_trip_through_safetensors_and_refuse_other_files(tmp_path):
    concepts = random_concepts()
    (tmp_path / "concepts.safetensors").write_bytes(concepts_bytes(concepts))
    back = load_concepts(tmp_path)
    assert (back.model, back.layer, back.sae.k) == ("test", 0, 5)
    x = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
    assert back.encode(x).tobytes() == concepts.encode(x).tobytes()
    (tmp_path / "other.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConceptsError):
        load_concepts(tmp_path / "other.safetensors")


def concepts_file_digest() -> str:
    """The SHA-256 of concepts.safetensors for an autoencoder seeded-trained on synthetic tokens."""
    sae = train_sae(synthetic_batches(), 24, 2000, SETTINGS)
    normalisation = Normalisation(np.linspace(-1, 1, 24).astype(np.float32), 1.5)
    concepts = Concepts(sae, normalisation, "vit-lens/shapes-vit", "bundled: ünïcode", 2)
    return hashlib.sha256(concepts_bytes(concepts)).hexdigest()


def test_the_concepts_file_has_the_same_bytes_in_another_process_and_reads_with_safetensors_own_loader(tmp_path):
    """safetensors' own writer orders __metadata__ at random per process; ours writes one layout. Another process
    (another hash seed) gives the same SHA-256, and the library reads back the same tensors and metadata."""
    from safetensors import safe_open
    from safetensors.torch import load, save

    first = concepts_file_digest()
    code = textwrap.dedent(f"""
        import torch
        torch.set_num_threads({torch.get_num_threads()})
        from unit.test_concepts import concepts_file_digest
        print(concepts_file_digest())
    """)
    tests = Path(__file__).resolve().parent.parent
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tests,
                             env={**__import__("os").environ, "PYTHONHASHSEED": seed,
                                  "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == first
    concepts = random_concepts()
    ours = concepts_bytes(concepts)
    from vit_core.concepts.sae import concepts_tensors

    tensors, metadata = concepts_tensors(concepts)
    library = load(save(tensors, metadata=metadata))
    read = load(ours)
    assert sorted(read) == sorted(library) == sorted(tensors)
    for key in tensors:
        assert read[key].dtype == library[key].dtype and read[key].shape == library[key].shape
        assert read[key].numpy().tobytes() == library[key].numpy().tobytes()
    path = tmp_path / "concepts.safetensors"
    path.write_bytes(ours)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata
    header_length = int.from_bytes(ours[:8], "little")
    assert header_length % 8 == 0
    assert list(json.loads(ours[8:8 + header_length])) == sorted(json.loads(ours[8:8 + header_length]))


def test_feature_statistics_equal_their_definitions():
    concepts = random_concepts(num_features=12, k=3)
    tokens = np.random.default_rng(2).normal(size=(5, 6, 16)).astype(np.float32)  # 5 images of 6 patches
    stats = feature_statistics(concepts, tokens_in_memory(tokens), top=4)
    z = concepts.encode(tokens.reshape(30, 16))
    np.testing.assert_allclose(stats.firing_rate, (z > 0).mean(axis=0))
    np.testing.assert_allclose(stats.mean_activation, z.sum(axis=0) / np.maximum((z > 0).sum(axis=0), 1), rtol=1e-5)
    for f in range(12):
        rows = np.argsort(-z[:, f], kind="stable")[:4]
        np.testing.assert_allclose(stats.top_activation[:, f], z[rows, f])
        assert (stats.top_image[:, f] * 6 + stats.top_patch[:, f]).tolist() == rows.tolist() or \
            np.allclose(z[stats.top_image[:, f] * 6 + stats.top_patch[:, f], f], z[rows, f])  # ties in any order


def test_a_patch_crop_centres_the_patch_at_every_edge():
    crop = np.zeros((96, 96, 3), dtype=np.uint8)
    for row, col in ((0, 0), (11, 11), (5, 7)):
        assert patch_crop(crop, (8, 8), row, col).shape == (64, 64, 3)


def test_the_command_writes_the_concepts_files(shapes, folder, tmp_path, capsys):
    out = tmp_path / "concepts"
    common = [str(folder), "--model", "vit-lens/shapes-vit", "--layer", str(LAYER), "--features", "64", "--k", "4",
              "--epochs", "2", "--workers", "0", "--out", str(out)]
    assert core_cli.main(["concepts", *common, "--shard", "1/2"]) == 0
    assert not (out / "concepts.safetensors").exists() and "1 of 2 shards" in capsys.readouterr().out
    assert core_cli.main(["concepts", *common, "--shard", "2/2"]) == 0
    said = capsys.readouterr().out
    assert "images (" in said
    # No silent stage after the collection: each one's progress lines (stdout is no terminal here), to its end.
    ends = [line.split(":")[0] for line in said.splitlines() if "(100%)" in line and "done in" in line]
    assert ends == ["tokens", "training", "metrics", "steering", "features", "sheet"], said
    trained = 2 * 11 * shapes.geometry.num_patches  # epochs x training images x their patch tokens
    assert f"training: {trained:,} of {trained:,} tokens" in said and "metrics: 1 of 1 images" in said, said
    summary = json.loads((out / "concepts.json").read_text())
    assert (summary["model"], summary["layer"], summary["num_features"], summary["k"]) == ("vit-lens/shapes-vit", 2, 64, 4)
    assert summary["images"] == 12 and summary["held_out_images"] == 1 and summary["steering_images"] == 1
    for key in ("fvu", "dead_fraction", "spliced_top1_agreement", "spliced_kl"):
        assert np.isfinite(summary[key]), key
    assert 0 < summary["fvu"] < 1.5 and 0 <= summary["dead_fraction"] <= 1
    features = summary["features"]
    assert [f["index"] for f in features] == list(range(64))
    top = next(f for f in features if f["top"])["top"]
    assert len(top) <= 20 and set(top[0]) == {"file", "row", "col", "activation"}
    assert (folder / top[0]["file"]).is_file()
    assert [t["activation"] for t in top] == sorted((t["activation"] for t in top), reverse=True)
    concepts = load_concepts(out)
    assert (concepts.model, concepts.layer) == ("vit-lens/shapes-vit", LAYER)
    assert Image.open(out / "contact_sheet.png").size[0] > 64
    # One held-out image: the summary's splice values are that image's own.
    name = [n for n, h in zip(plan_run(shapes, folder).names, held_out(plan_run(shapes, folder).names), strict=True) if h][0]
    x = model_input(shapes, Image.open(folder / name))
    from vit_core.concepts import reconstructed
    plain = spliced_logits(shapes, x, LAYER, None).log_softmax(-1).double()
    spliced = spliced_logits(shapes, x, LAYER, reconstructed(concepts)).log_softmax(-1).double()
    assert summary["spliced_kl"] == pytest.approx(float((plain.exp() * (plain - spliced)).sum()), rel=1e-4, abs=1e-7)


def test_stability_compares_the_dictionary_with_the_one_of_the_next_seed(shapes, folder, tmp_path, capsys):
    """--stability: concepts.json's stability and stable_share are the alive features' largest decoder cosines to the
    dictionary trained at seed + 1 on the same tokens (trained again here), and steerable_share their steers."""
    from dataclasses import replace

    from vit_core.concepts.learn import held_out_metrics, tokens_of
    from vit_core.concepts.quality import decoder_match

    out = tmp_path / "concepts"
    assert core_cli.main(["concepts", str(folder), "--model", "vit-lens/shapes-vit", "--layer", str(LAYER), "--features",
                          "48", "--k", "4", "--epochs", "1", "--workers", "0", "--seed", "3", "--stability",
                          "--steering-images", "5", "--out", str(out)]) == 0  # 5: more than the 1 held out
    said = capsys.readouterr().out
    assert "stability: " in said and "stable)" in said.splitlines()[-1]
    summary = json.loads((out / "concepts.json").read_text())
    first = load_concepts(out)
    plan = plan_run(shapes, folder)
    tokens = tokens_of(TokenStore(out), plan, shapes.geometry.num_patches)
    settings = TrainingSettings(num_features=48, k=4, epochs=1, seed=3)
    second = learned_concepts(shapes, tokens, LAYER, replace(settings, seed=4))
    match = decoder_match(first.sae, second.sae)
    alive = held_out_metrics(first, tokens)["alive"]
    assert alive.any()
    assert [f["stability"] for f in summary["features"]] == pytest.approx(match.tolist(), abs=1e-6)
    assert summary["stability"] == pytest.approx(match[alive].mean())
    assert summary["stable_share"] == pytest.approx((match[alive] > 0.9).mean())
    steers = np.array([f["steers"] for f in summary["features"]])
    assert summary["steerable_share"] == pytest.approx(steers[alive].mean()) and not steers[~alive].any()
    assert summary["steering_images"] == 1
    assert summary["learning_rate"] == settings.lr(tokens.count(held=False))


def test_the_command_refuses_what_it_cant_use(folder, tmp_path, capsys):
    common = ["--model", "vit-lens/shapes-vit", "--out", str(tmp_path / "o")]
    assert core_cli.main(["concepts", str(folder), *common, "--layer", "9"]) == 2
    assert "blocks 0..3" in capsys.readouterr().err
    assert core_cli.main(["concepts", str(folder), *common, "--layer", "1", "--features", "4", "--k", "8"]) == 2
    assert core_cli.main(["concepts", str(folder), "--model", "vit-lens/shapes-vit", "--layer", "1",
                          "--out", str(folder / "inside")]) == 2
    assert "inside FOLDER" in capsys.readouterr().err


def test_tokens_over_the_memory_budget_are_chunked_on_disk_and_trained_from_there(shapes, folder, tmp_path):
    """Chunks of one image each, mapped from disk (a budget of 0 bytes): the same tokens as one chunk in memory, and a
    seeded training from disk that gives the same bits again."""
    from vit_core.concepts import concepts_files
    from vit_core.concepts.learn import tokens_of

    plan = plan_run(shapes, folder, num_shards=2)
    store = TokenStore(tmp_path)
    store.open(manifest_of(shapes, plan, LAYER, None))
    collect_shards(shapes, plan, LAYER, store, list(plan.shards), batch_size=4, chunk_bytes=1)
    mapped = tokens_of(store, plan, shapes.geometry.num_patches, memory_budget=0)
    assert len(mapped.chunks) == 12 and all(isinstance(c.tokens, np.memmap) for c in mapped.chunks)
    in_memory, _ = collected(shapes, folder, tmp_path / "whole", 1, 12)
    assert np.concatenate([np.asarray(c.tokens) for c in mapped.chunks]).tobytes() == in_memory.tobytes()
    settings = TrainingSettings(num_features=32, k=4, epochs=1, batch_tokens=128)
    first, summary = concepts_files(shapes, plan, store, LAYER, settings, memory_budget=0)
    again, _ = concepts_files(shapes, plan, store, LAYER, settings, memory_budget=0)
    assert first["concepts.safetensors"] == again["concepts.safetensors"]
    assert 0 < summary["fvu"] < 1.5
