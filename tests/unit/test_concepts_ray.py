"""The concepts' token collection on Ray (vit_core.concepts.ray_collect) on a local Ray of 2 CPUs: the same tokens, to
the bit, as one process."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vit_core import load_model
from vit_core.concepts import TokenStore, collect_shards
from vit_core.concepts.collect import manifest_of
from vit_core.dataset import plan_run
from vit_core.teaching.data import draw_set

ray = pytest.importorskip("ray", reason='the Ray engine\'s tests need Ray: pip install "vit-lens[ray]"')

from vit_core.concepts.ray_collect import collect_shards_on_ray  # noqa: E402
from vit_core.dataset.ray_engine import ModelSpec, RayPlan, workers_at_this_niceness  # noqa: E402

LAYER = 1
SPEC = ModelSpec("vit-lens/shapes-vit")


@pytest.fixture(scope="module")
def local_ray():
    with workers_at_this_niceness():  # as the engine's own Ray: its workers not starved beside other work
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def tokens_of(store: TokenStore, plan) -> tuple[np.ndarray, np.ndarray]:
    chunks = store.chunks(plan.shards, mmap=False, num_patches=144, d_model=256)  # the Shapes ViT's
    return np.concatenate([c.tokens for c in chunks]), np.concatenate([c.images for c in chunks])


def test_ray_collects_the_same_tokens_as_one_process(local_ray, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(draw_set(7, seed=5).images):
        Image.fromarray(image).save(folder / f"{i}.png")
    (folder / "broken.png").write_text("not an image")
    loaded = load_model(SPEC.name, device="cpu")
    plan = plan_run(loaded, folder, num_shards=3)
    here, there = TokenStore(tmp_path / "local"), TokenStore(tmp_path / "ray")
    for store in (here, there):
        store.open(manifest_of(loaded, plan, LAYER, None))
    collect_shards(loaded, plan, LAYER, here, list(plan.shards), batch_size=3)
    collect_shards_on_ray(SPEC, loaded, plan, LAYER, there, list(plan.shards), batch_size=2, threads=1,
                          workers=RayPlan(model_workers=1, gpus_per_worker=0, decoders=1))
    (tokens, images), (ray_tokens, ray_images) = tokens_of(here, plan), tokens_of(there, plan)
    assert images.tolist() == ray_images.tolist() and len(images) == 7
    assert tokens.tobytes() == ray_tokens.tobytes()
    assert here.failures(plan.shards) == there.failures(plan.shards) == [("broken.png", here.failures(plan.shards)[0][1])]


def test_the_command_with_engine_ray_writes_the_same_concepts(local_ray, tmp_path):
    """`vit-lens concepts --engine ray` on the Ray the test started: the same tokens and the same autoencoder as the
    one-process command."""
    from safetensors.torch import load_file

    from vit_core import __main__ as core_cli

    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(draw_set(6, seed=9).images):
        Image.fromarray(image).save(folder / f"{i}.png")
    common = [str(folder), "--model", SPEC.name, "--layer", str(LAYER), "--features", "32", "--k", "4", "--epochs", "1",
              "--batch-size", "2"]
    assert core_cli.main(["concepts", *common, "--out", str(tmp_path / "local"), "--workers", "0"]) == 0
    assert core_cli.main(["concepts", *common, "--out", str(tmp_path / "ray"), "--engine", "ray"]) == 0
    local, on_ray = load_file(tmp_path / "local" / "concepts.safetensors"), load_file(tmp_path / "ray" / "concepts.safetensors")
    assert all(local[key].numpy().tobytes() == on_ray[key].numpy().tobytes() for key in local)
