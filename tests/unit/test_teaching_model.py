"""The shipped Shapes ViT: it loads like any timm ViT, reproduces its model card, and training works."""

import json
from pathlib import Path

import numpy as np
import pytest
import timm.data
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer

from tools.teaching import evaluate as ev
from tools.teaching.train import (
    TrainConfig,
    TrainingHeads,
    create_untrained,
    dihedral_augment,
    init_sincos_pos_embed,
    lr_at,
    make_optimizer,
    make_train_set,
    model_transform,
    patch_cover,
    relative_localisation_loss,
    run_steps,
    save,
    token_label_loss,
    train,
    training_losses,
)
from vit_core.teaching.data import CLASS_NAMES, LABELS, OTHER, make_dataset
from vit_core.teaching.model import SHAPES_VIT_TIMM_NAME, batch_transform, load_shapes_vit

ASSET = Path(__file__).resolve().parents[2] / "vit_core" / "assets" / "shapes_vit"


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(2)
    model, config = load_shapes_vit(ASSET)
    metrics = json.loads((ASSET / "metrics.json").read_text())
    return model, config, metrics


def test_files_and_config(shipped):
    model, config, _ = shipped
    assert config["name"] == "vit-lens/shapes-vit"
    assert (ASSET / "MODEL_CARD.md").is_file()
    assert (ASSET / "model.safetensors").stat().st_size <= 10 * 1024 * 1024
    assert (ASSET / "labels.txt").read_text().splitlines() == list(LABELS)  # the 8 shapes, then "other"
    args = config["model_args"]
    assert args["num_classes"] == len(LABELS) and args["class_token"] and args["global_pool"] == "token"
    assert args["depth"] >= 4 and args["num_heads"] >= 4
    assert type(model) is VisionTransformer
    state = load_file(str(ASSET / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in state.values())
    assert state.keys() == model.state_dict().keys()  # strict load, nothing missing or extra
    assert config["pretrained_cfg"]["input_size"] == [3, args["img_size"], args["img_size"]]


def test_registered_with_timm(shipped):
    """timm's own create_model(pretrained=True) gives the bundled weights, and timm resolves its preprocessing."""
    model, config, _ = shipped
    assert SHAPES_VIT_TIMM_NAME in timm.list_models("vit_shapes*")
    via_timm = timm.create_model(SHAPES_VIT_TIMM_NAME, pretrained=True)
    assert type(via_timm) is VisionTransformer
    for (name, a), (_, b) in zip(via_timm.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    data_config = timm.data.resolve_model_data_config(via_timm)
    pre = config["pretrained_cfg"]
    assert data_config["input_size"] == tuple(pre["input_size"])
    assert data_config["mean"] == tuple(pre["mean"]) and data_config["std"] == tuple(pre["std"])
    assert data_config["crop_pct"] == pre["crop_pct"] and data_config["interpolation"] == pre["interpolation"]
    assert via_timm.pretrained_cfg["label_names"] == LABELS
    assert via_timm.pretrained_cfg["num_classes"] == config["model_args"]["num_classes"]


def test_loader_is_strict(tmp_path, shipped):
    """A weights file that misses a tensor of the architecture is refused, not silently half-loaded."""
    from safetensors.torch import save_file

    for name in ("config.json", "labels.txt"):
        (tmp_path / name).write_text((ASSET / name).read_text())
    state = load_file(str(ASSET / "model.safetensors"))
    del state["head.bias"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(RuntimeError, match="head.bias"):
        load_shapes_vit(tmp_path)


def test_timm_eval_transform_matches_training_preprocess(shipped):
    """The model was trained on exactly what timm's eval transform of its pretrained_cfg produces."""
    model, config, _ = shipped
    data_config = timm.data.resolve_model_data_config(model)
    transform = timm.data.create_transform(**data_config, is_training=False)
    images, _, _ = make_dataset(4, seed=99, size=config["model_args"]["img_size"])
    ours = batch_transform(data_config)(torch.from_numpy(images))
    theirs = torch.stack([transform(Image.fromarray(im)) for im in images])
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-6, rtol=0)
    channels_first = torch.from_numpy(images).permute(0, 3, 1, 2)  # (B, H, W, 3) -> (B, 3, H, W), as training stores them
    torch.testing.assert_close(model_transform(model)(channels_first), ours, atol=0, rtol=0)


def test_reproduces_reported_accuracy(shipped):
    model, _, metrics = shipped
    images, _, labels = make_dataset(metrics["test_size"], seed=metrics["test_seed"])
    accuracy = (ev.predict(model, images) == labels).mean()
    assert accuracy >= metrics["test_accuracy"] - 0.01
    assert accuracy >= 0.97  # measured: 97.8 % (450 images, 50 per class)
    assert metrics["accuracy"] >= 0.98  # the card's 2,250-image figure (measured 98.6 %)


def test_second_drawer_shapes_are_recognised(shipped):
    """The independent drawer (never trained on): a fixed set of 256 images, 2 per class x size band x style."""
    from tools.teaching import second_drawer

    model, _, metrics = shipped
    images, labels, meta = second_drawer.make_set(256, seed=ev.SECOND_SEED, size=model.patch_embed.img_size[0])
    correct = ev.predict(model, images) == labels
    assert correct.mean() >= 0.96  # measured on these 256: 99.2 % (99.3 % on the card's 1,024)
    for key in ("size_band", "style"):
        for group, accuracy in ev.accuracy_by([m[key] for m in meta], correct).items():
            assert accuracy >= 0.85, (key, group, accuracy)  # measured: worst 96.9 % (20-35 %)
    assert metrics["second_drawer_accuracy"] >= 0.92 and metrics["second_drawer_worst_group"] >= 0.85


def test_phone_photos_of_drawings_on_paper_are_recognised(shipped):
    """tools/teaching/page_photos.py (never trained on): full-size JPEGs of pen drawings on a sheet, through the upload path."""
    from tools.teaching import page_photos

    model, _, metrics = shipped
    result = ev.evaluate_page_photos(model, page_photos, n=48)  # the first 48 of the card's 240 (6 per class)
    assert result["page_photos_accuracy"] >= 0.9, result  # measured on these 48: see metrics.json for the 240
    assert metrics["page_photos_accuracy"] >= 0.9


def test_other_is_what_is_not_a_shape(shipped):
    """Outside its world: "other" images of the generator are called other, and a real photograph is never
    a confident shape."""
    model, _, metrics = shipped
    images, _, labels = make_dataset(900, seed=12)  # 100 of them "other": of 10, one ambiguous scribble is 10 %
    other = labels == LABELS.index(OTHER)
    assert (ev.predict(model, images[other]) == LABELS.index(OTHER)).mean() >= 0.9  # measured: 97 % (card: 98.8 % of 250)
    photo = ev.outside_world(model)
    assert photo["photo_top_label"] == OTHER or photo["photo_top_probability"] < 0.5, photo
    assert photo["photo_top_label"] == metrics["photo_top_label"]
    assert photo["photo_top_probability"] == pytest.approx(metrics["photo_top_probability"], abs=1e-5)


def test_attention_capture_restores_model(shipped):
    model, _, _ = shipped
    images, masks, _ = make_dataset(8, seed=5, size=model.patch_embed.img_size[0])
    before = [blk.attn.fused_attn for blk in model.blocks]
    logits, patterns = ev.predict_with_attention(model, images)
    assert [blk.attn.fused_attn for blk in model.blocks] == before
    assert all(len(blk.attn.attn_drop._forward_hooks) == 0 for blk in model.blocks)
    t = model.num_prefix_tokens + model.patch_embed.num_patches
    assert patterns.shape == (8, len(model.blocks), model.blocks[0].attn.num_heads, t, t)
    np.testing.assert_allclose(patterns.sum(-1), 1.0, atol=1e-5)
    with torch.no_grad():
        plain = model(model_transform(model)(torch.from_numpy(images))).numpy()
    np.testing.assert_allclose(logits, plain, atol=1e-4)


def test_metric_glue():
    mask = np.zeros((16, 16), dtype=bool)
    mask[3:5, 9:12] = True
    region = ev.object_patches(mask, (8, 8))
    assert region.tolist() == [[False, True], [False, False]]
    assert ev.mass_on(np.array([[1.0, 3.0], [0.0, 0.0]]), region) == 0.75
    np.testing.assert_array_equal(ev.rankdata(np.array([3.0, 1.0, 3.0, 2.0])), [3.5, 1.0, 3.5, 2.0])
    x = np.array([1.0, 2.0, 2.0, 5.0, 7.0])
    assert ev.spearman(x, x**3) == pytest.approx(1.0)
    assert ev.spearman(x, -x) == pytest.approx(-1.0)
    # against the textbook formula on tie-free data: 1 - 6 sum d^2 / (n (n^2 - 1))
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    assert ev.spearman(a, b) == pytest.approx(1 - 6 * (d**2).sum() / (50 * (50**2 - 1)))


def test_learned_structure_reported(shipped):
    model, _, metrics = shipped
    assert ev.pos_embed_grid_spearman(model) == pytest.approx(metrics["pos_embed_spearman"], abs=1e-6)
    assert metrics["pos_embed_spearman_random_start"] >= 0.5  # learned from timm's random start: measured 0.651
    assert metrics["pos_embed_spearman_at_init"] is None
    assert metrics["rollout_object_mass"] > 1.8 * metrics["object_patch_fraction"]  # measured 0.576 vs chance 0.265
    assert metrics["last_layer_cls_object_mass"] >= 0.6
    mad = np.array(metrics["mean_attention_distance_px"])
    assert mad.shape == (len(model.blocks), model.blocks[0].attn.num_heads)
    # the paper's picture: a local and a global head in a first-half layer (met: layer 1, 22.3 to 49.3 px), every
    # last-layer head global (NOT met by the shipped model: one head at 35.6 px, global starts at 37.4; the card
    # says so in its "not reached" line)
    picture = ev.mad_picture(mad, metrics["uniform_attention_distance_px"])
    assert picture["mad_mixed_layers_first_half"]
    assert picture == {k: metrics[k] for k in picture}


def test_card_targets_come_from_one_place(shipped):
    """The metrics table and the "not reached" statement both read ev.TARGETS."""
    _, config, metrics = shipped
    all_met = {**metrics, **{key: t.minimum for key, t in ev.TARGETS.items()}}
    assert "Targets not reached" not in ev.model_card(config, all_met)
    card = ev.model_card(config, {**all_met, "accuracy": 0.5, "last_layer_cls_object_mass": 0.1})
    missed = f"{ev.TARGETS['accuracy'].label}; {ev.TARGETS['last_layer_cls_object_mass'].label}"
    assert f"**Targets not reached by this model: {missed}.**" in card
    assert f"| {ev.TARGETS['accuracy'].label} | 50.00% | >= 98 % | **no** |" in card
    assert f"| {ev.TARGETS['last_layer_cls_object_mass'].label} | 10.0% | >= 60 % | **no** |" in card


def test_sincos_start_is_a_grid_and_stays_trainable():
    model = create_untrained(TrainConfig(pos_embed_init="random"))
    assert ev.pos_embed_grid_spearman(model) < 0.2  # timm's random start (the shipped recipe's) has no grid
    init_sincos_pos_embed(model)
    assert ev.pos_embed_grid_spearman(model) > 0.8  # 0.851 for the 12 x 12 grid at dim 256 (metrics.json)
    assert model.pos_embed.requires_grad
    assert torch.count_nonzero(model.pos_embed[0, 0]) == 0  # the class-token row starts at zero


def test_lr_schedule():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-5)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(99, cfg) < 2e-5
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))


def test_a_few_training_steps_reduce_the_loss(tmp_path):
    cfg = TrainConfig(embed_dim=32, depth=2, num_heads=2, num_train=256, chunk_size=128, gen_workers=1, steps=40,
                      time_budget_s=0, batch_size=32, lr=3e-3, warmup_steps=5, label_smoothing=0.0, log_every=20,
                      token_label_weight=0.0, drloc_weight=0.0)  # the class loss alone (the others: tests below)
    model, summary = train(cfg)
    torch.manual_seed(cfg.seed)  # train() seeds the same way right before building the model
    init = create_untrained(cfg).eval()
    images, labels, _ = make_train_set(cfg)  # deterministic: the very images train() used
    x = model_transform(init)(images)
    with torch.no_grad():
        loss_init = F.cross_entropy(init(x), labels).item()
        loss_trained = F.cross_entropy(model(x), labels).item()
    assert loss_trained < loss_init - 0.02, (loss_init, loss_trained)
    assert summary["final_loss"] < summary["first_loss"]
    save(model, cfg, summary, tmp_path)
    reloaded, _ = load_shapes_vit(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), model(x))


def test_a_second_stage_starts_from_the_first_stages_weights_and_keeps_its_record(tmp_path):
    small = dict(embed_dim=32, depth=2, num_heads=2, num_train=128, chunk_size=128, gen_workers=1, batch_size=32,
                 log_every=1, token_label_weight=0.0, drloc_weight=0.0)
    first, first_summary = train(TrainConfig(steps=3, **small))
    save(first, TrainConfig(steps=3, **small), first_summary, tmp_path / "first")
    # at learning rate 0 (warmup and floor) the second stage's 2 steps change no weight: it starts where the first ended
    second_cfg = TrainConfig(steps=2, seed=1, lr=0.0, min_lr=0.0, init_from=str(tmp_path / "first"), **small)
    second, second_summary = train(second_cfg)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    save(second, second_cfg, second_summary, tmp_path / "first")  # over the first: its record is read beforehand
    config = json.loads((tmp_path / "first" / "config.json").read_text())
    assert config["train"]["init_from"] == str(tmp_path / "first") and config["train"]["seed"] == 1
    assert [stage["steps"] for stage in config["earlier_stages"]] == [3] and "init_from" in config["earlier_stages"][0]
    with pytest.raises(RuntimeError):  # another architecture's weights are refused
        train(TrainConfig(steps=1, **{**small, "embed_dim": 64}, init_from=str(tmp_path / "first")))


def test_patch_cover_is_the_object_share_of_each_patch():
    masks = np.zeros((1, 16, 16), dtype=bool)
    masks[0, 0:8, 0:8] = True  # patch (0, 0) full
    masks[0, 8:10, 8:16] = True  # patch (1, 1): 2 of 8 rows
    cover = patch_cover(masks, 8)
    np.testing.assert_allclose(cover[0], [[1.0, 0.0], [0.0, 0.25]])


def test_dihedral_augment_moves_patch_targets_with_their_patches():
    gen = torch.Generator().manual_seed(3)
    images = torch.arange(16 * 3 * 64 * 64, dtype=torch.float32).reshape(16, 3, 64, 64)
    grids = torch.rand(16, 8, 8)
    x, g = dihedral_augment(images, gen, grids)
    # the patch that holds a given pixel block after the transform carries that block's target
    before = patch_sums(images[:, 0], 8)  # (B, 8, 8): one value per patch identifying its pixels
    after = patch_sums(x[:, 0], 8)
    for b in range(16):
        for r in range(8):
            for c in range(8):
                (r0, c0), = np.argwhere(before[b].numpy() == after[b, r, c].item())
                assert g[b, r, c] == grids[b, r0, c0]
    assert not torch.equal(x, images)  # 16 images: some were transformed


def patch_sums(channel: torch.Tensor, p: int) -> torch.Tensor:
    """Sum of each patch's pixels: distinct for every patch of an arange image, and invariant to flips."""
    b, h, w = channel.shape
    return channel.reshape(b, h // p, p, w // p, p).sum(dim=(2, 4))


def test_token_label_loss_targets():
    labels = torch.tensor([2])
    cover = torch.tensor([[1.0, 0.0, 0.25]])  # (B, N): full object patch, background patch, a quarter
    num_classes = 8
    perfect = torch.full((1, 3, num_classes + 1), -30.0)
    perfect[0, 0, 2] = 30  # all object
    perfect[0, 1, -1] = 30  # all background
    perfect[0, 2, 2], perfect[0, 2, -1] = np.log(0.25), np.log(0.75)  # the soft target itself
    entropy_of_patch_2 = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))
    assert token_label_loss(perfect, labels, cover).item() == pytest.approx(entropy_of_patch_2 / 3, abs=1e-5)
    wrong = perfect.clone()
    wrong[0, 0, 2], wrong[0, 0, 5] = -30, 30  # patch 0 claims another shape
    assert token_label_loss(wrong, labels, cover).item() > 10


@pytest.mark.parametrize("block", [-1, 0])  # the dense terms on the output, or on block 0's tokens
def test_training_with_token_labels_and_drloc_reduces_all_three_losses(block):
    cfg = TrainConfig(embed_dim=32, depth=2, num_heads=2, num_train=256, chunk_size=128, gen_workers=1, steps=40,
                      batch_size=32, lr=3e-3, warmup_steps=5, label_smoothing=0.0, log_every=20, token_label_weight=1.0,
                      drloc_weight=1.0, token_label_block=block, drloc_block=block)
    _, summary = train(cfg)
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["final_token_loss"] < summary["first_token_loss"]
    assert summary["final_drloc_loss"] < summary["first_drloc_loss"]


def test_dense_terms_on_an_earlier_block_leave_the_later_blocks_to_the_class_token():
    """Read from block 0 of 2, token labels and DRLoc send no gradient into block 1 (nor the final norm); the class
    loss does. Read from the output, they reach block 1."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 96, 96), torch.tensor([0, 1, 2, 8])
    cover, pairs = torch.rand(4, 12, 12), torch.randint(144, (4, 8, 2))

    def dense_grad_into_last_block(block: int) -> float:
        cfg = TrainConfig(embed_dim=32, depth=2, num_heads=2, token_label_block=block, drloc_block=block)
        model, heads = create_untrained(cfg), TrainingHeads(cfg, 9)
        losses = training_losses(model, heads, (x, y, cover), cfg, pairs)
        (losses.token_loss + losses.drloc_loss).backward(retain_graph=True)
        dense = sum(p.grad.abs().sum().item() for p in model.blocks[1].parameters() if p.grad is not None)
        assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0  # block 0 learns from them either way
        model.zero_grad()
        losses.loss.backward()
        assert model.blocks[1].attn.qkv.weight.grad.abs().sum() > 0  # the class loss reaches the last block
        return dense

    assert dense_grad_into_last_block(0) == 0
    assert dense_grad_into_last_block(-1) > 0
    with pytest.raises(ValueError, match="drloc_block 2"):
        TrainConfig(depth=2, token_label_block=0, drloc_block=2)


def test_position_embedding_has_its_own_learning_rate():
    """pos_embed_lr_scale puts the position embedding alone in a group whose lr run_steps scales; at 1x the groups
    are the usual two (decay, no decay)."""
    def trained_groups(scale: float) -> tuple[list[dict], dict]:
        cfg = TrainConfig(embed_dim=32, depth=2, num_heads=2, pos_embed_lr_scale=scale, token_label_block=0,
                          drloc_block=0, num_train=64, chunk_size=64, gen_workers=1, steps=2, batch_size=16,
                          warmup_steps=0)
        model = create_untrained(cfg)
        heads = TrainingHeads(cfg, model.num_classes)
        opt = make_optimizer(cfg, list(model.named_parameters()) + list(heads.named_parameters()))
        run_steps(model, heads, opt, make_train_set(cfg), cfg)
        pos = [g for g in opt.param_groups if any(p is model.pos_embed for p in g["params"])]
        assert len(pos) == 1
        return opt.param_groups, pos[0]

    plain, _ = trained_groups(1.0)
    assert len(plain) == 2 and all(g["lr"] == plain[0]["lr"] for g in plain)
    scaled, pos_group = trained_groups(10.0)
    assert len(scaled) == 3 and len(pos_group["params"]) == 1 and pos_group["weight_decay"] == 0.0
    assert pos_group["lr"] == pytest.approx(10 * scaled[0]["lr"]) and scaled[0]["lr"] == pytest.approx(plain[0]["lr"])
    assert sum(len(g["params"]) for g in scaled) == sum(len(g["params"]) for g in plain)


def test_relative_localisation_loss_targets():
    """DRLoc's target is the pair's grid offset over the grid side; a localiser that reads positions exactly scores 0."""
    grid = (3, 4)  # 3 rows, 4 columns: token 6 is row 1, column 2
    tokens = torch.zeros(1, 12, 2)
    tokens[0, :, 0] = torch.arange(12) % 4  # each token carries its own (column, row)
    tokens[0, :, 1] = torch.arange(12) // 4

    class Exact(torch.nn.Module):
        def forward(self, a, b):  # (column, row) of each -> (dx / 4, dy / 3)
            return torch.stack([(a[..., 0] - b[..., 0]) / 4, (a[..., 1] - b[..., 1]) / 3], dim=-1)

    pairs = torch.tensor([[[6, 0], [0, 11], [5, 5]]])  # (B=1, P=3, 2)
    assert relative_localisation_loss(Exact(), tokens, grid, pairs).item() == pytest.approx(0, abs=1e-7)

    class Zero(torch.nn.Module):
        def forward(self, a, b):
            return torch.zeros(*a.shape[:-1], 2)

    # |offsets|: (6, 0) -> (2/4, 1/3); (0, 11) -> (3/4, 2/3); (5, 5) -> (0, 0); mean over 6 numbers
    expected = (2 / 4 + 1 / 3 + 3 / 4 + 2 / 3) / 6
    assert relative_localisation_loss(Zero(), tokens, grid, pairs).item() == pytest.approx(expected, rel=1e-6)


def test_dashboard_shape_examples_are_classified_right():
    """The shape examples the dashboard offers with the bundled model (its first page offline) are
    predicted right, through the app's own path: example bytes -> decode -> load_model -> capture."""
    from dashboard import caches
    from vit_core import decode_image, load_model, run_with_capture
    from vit_core.loading import TEACHING_MODEL

    loaded = load_model(TEACHING_MODEL)
    for name in CLASS_NAMES:
        cap = run_with_capture(loaded, decode_image(caches.example_bytes(f"Shape: {name}")).image)
        assert loaded.labels[int(np.argmax(cap.logits))] == name, name
