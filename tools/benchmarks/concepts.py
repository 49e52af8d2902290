"""Benchmark the concept lens (vit_core.concepts): `vit-lens concepts` end to end, the Concepts tab's work for one
image, and the peak memory of a large run.

    .venv/bin/python -m tools.benchmarks.concepts shapes [--images 2000] [--features 2048] [--k 32] [--epochs 4] [--layer 1,2,3]
                                                   [--steering-images N]
    .venv/bin/python -m tools.benchmarks.concepts vit-b [--images 1000] [--expansion 8] [--k 32] [--epochs 1] [--layer 6]

shapes: the bundled Shapes ViT over --images drawn Shapes images (vit_core.teaching.data, written as PNG into a
temporary folder), layer 2 (or --layer's blocks, e.g. 1,2,3: a dictionary each and the circuit), through the command
itself (`python -m vit_core concepts`, default workers): the collection and the training (and the metrics, the
contact sheet) timed by the command's own stages (concepts.json's "seconds"; circuit.json's), and the wall time and
peak memory of the whole command. Then, for one block, the tab's work for one drawn image with those concepts: its
features from a capture (`image_concepts`, what the tab computes; the capture itself is the page's and is timed
apart) and one concept removed (a forward with the splice). Targets: one block no slower than 77.6 s, three blocks
with the circuit within 5 minutes on 2 cores, under 3 GB; the tab's features within 0.3 s.

peers: the field's TopK trainers against ours at equal budget (the optional extra `peers`: sparsify, overcomplete;
run it with a Python that has them). The bundled Shapes ViT over --images drawn Shapes images, block 2's patch tokens
collected once (into --cache, reused); each trainer gets the same normalised training tokens in the same minibatches
(`run_minibatches`: 1,024 tokens, --epochs epochs, seed 0) and is scored by the same held-out metric (concepts.json's
`fvu` and `dead_fraction` over the held-out tenth of the images, `held_out_fvu`). Ours: `train_sae` with its default
rate and dead window. sparsify 1.3.3: its SparseCoder under its trainer's default step (TrainConfig(): signum, i.e.
SignSGD in a schedule-free wrapper at 5e-3 / sqrt(F / 2^14), AuxK off, b_dec set to the first batch's mean, the
decoder renormalised and its parallel gradient removed each step; evaluated after optimizer.eval(), as its trainer
saves). overcomplete 0.3.0: its TopKSAE trained by its own `train_sae` loop as its README does (Adam 5e-4, MSE,
gradients clipped at 1). Prints one table row per size and trainer: held-out FVU, dead share, seconds.

    /work/venv_peers/bin/python -m tools.benchmarks.concepts peers [--images 1000] [--epochs 4] [--sizes 2048:32,1024:16]

vit-b: vit_base_patch16_224 at random init (seed 0) over --images drawn Shapes images enlarged to 256 px, layer 6,
--expansion x 768 features: wall time of the command and its peak resident memory (the largest of the command's
process and its decoding workers, from getrusage of the children).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from PIL import Image


def draw_folder(folder: Path, count: int, side: int | None = None) -> None:
    from vit_core.teaching.data import LABELS, draw_set

    for first in range(0, count, 250):  # in chunks: a drawn set is held in memory
        drawn = draw_set(min(250, count - first), seed=(46, first))
        for i, (image, label) in enumerate(zip(drawn.images, drawn.labels, strict=True)):
            (folder / LABELS[label]).mkdir(exist_ok=True)
            picture = Image.fromarray(image)
            if side:
                picture = picture.resize((side, side), Image.Resampling.BICUBIC)
            picture.save(folder / LABELS[label] / f"{first + i:05d}.png")


def run_command(args: list[str]) -> tuple[float, int]:
    """`python -m vit_core concepts ARGS`: its wall time (s) and the peak resident memory (MiB) of its processes."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vit_core", "concepts", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the command failed ({done.returncode}):\n{done.stderr[-2000:]}")
    print(done.stdout.strip().splitlines()[-1])
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024


def tab_timings(out: Path, repeats: int = 7) -> dict[str, float]:
    import torch

    from vit_core import load_model, run_with_capture
    from vit_core.concepts import image_concepts, load_concepts, logits_with_concept_removed
    from vit_core.teaching.data import sample_image

    torch.set_num_threads(2)
    loaded = load_model("vit-lens/shapes-vit", device="cpu")
    concepts = load_concepts(out)
    image = sample_image("star", seed=3)
    capture, features, removal = [], [], []
    for _ in range(repeats):
        started = time.perf_counter()
        cap = run_with_capture(loaded, image)
        capture.append(time.perf_counter() - started)
        started = time.perf_counter()
        seen = image_concepts(concepts, cap)
        features.append(time.perf_counter() - started)
        started = time.perf_counter()
        logits_with_concept_removed(loaded, cap, concepts, int(seen.strongest[0]))
        removal.append(time.perf_counter() - started)
    return {"capture_s": statistics.median(capture), "features_s": statistics.median(features),
            "removal_s": statistics.median(removal)}


def shapes_tokens(images: int, cache: Path, layer: int = 2):
    """The Shapes ViT, its run over `images` drawn images (drawn into cache/images once) and block `layer`'s patch
    tokens (collected into cache/tokens once): (loaded, plan, Tokens)."""
    from vit_core import load_model
    from vit_core.concepts import TokenStore, collect_shards
    from vit_core.concepts.collect import manifest_of
    from vit_core.concepts.learn import tokens_of
    from vit_core.dataset import plan_run

    folder = cache / "images"
    if not folder.is_dir():
        folder.mkdir(parents=True)
        draw_folder(folder, images)
    loaded = load_model("vit-lens/shapes-vit", device="cpu")
    plan = plan_run(loaded, folder)
    store = TokenStore(cache / "tokens")
    store.open(manifest_of(loaded, plan, layer, None))
    todo = [shard for shard in plan.shards if shard.number not in store.done(plan.shards)]
    if todo:
        collect_shards(loaded, plan, layer, store, todo, batch_size=8)
    return loaded, plan, tokens_of(store, plan, loaded.geometry.num_patches, d_model=loaded.geometry.embed_dim)


def held_out_fvu(tokens, normalisation, reconstruct, num_features: int) -> dict[str, float]:
    """concepts.json's fvu and dead_fraction for any autoencoder: `reconstruct(x_n)` (n, D) -> (x_n^ (n, D), fired
    (F,) bool: the features > 0 on some of these tokens), over the held-out tokens in normalised units."""
    import numpy as np
    import torch

    error, squares, count = 0.0, 0.0, 0
    total = torch.zeros(tokens.chunks[0].tokens.shape[1], dtype=torch.float64)
    fired = torch.zeros(num_features, dtype=torch.bool)
    for chunk in tokens.chunks:
        rows = tokens.rows(chunk, held=True)
        for first in range(0, len(rows), 4096):
            x_n = normalisation.apply(torch.from_numpy(np.asarray(chunk.tokens[rows[first:first + 4096]])))
            with torch.no_grad():
                x_hat, on = reconstruct(x_n)
            error += float((x_n - x_hat).double().pow(2).sum())
            fired |= on
            total += x_n.double().sum(dim=0)
            squares += float(x_n.double().pow(2).sum())
            count += len(x_n)
    return {"fvu": error / (squares - float(total.pow(2).sum()) / count), "dead_fraction": float((~fired).double().mean())}


def train_sparsify(minibatches, d_model: int, num_features: int, k: int, seed: int):
    """sparsify's SparseCoder trained by its trainer's default step on `minibatches`; -> reconstruct(x_n)."""
    import os

    import torch

    os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")  # its own switch to the eager decoder: Triton needs a GPU
    from schedulefree import ScheduleFreeWrapper
    from sparsify import SaeConfig, SparseCoder, TrainConfig
    from sparsify.sign_sgd import SignSGD

    cfg = TrainConfig(SaeConfig(num_latents=num_features, k=k))
    assert cfg.optimizer == "signum" and cfg.auxk_alpha == 0  # the defaults this follows
    torch.manual_seed(seed)
    sae = SparseCoder(d_model, cfg.sae, "cpu", dtype=torch.float32)
    optimiser = ScheduleFreeWrapper(SignSGD([{"params": sae.parameters(),
                                              "lr": cfg.lr or 5e-3 / (num_features / 2 ** 14) ** 0.5}]), momentum=0.95)
    optimiser.train()
    for step, x in enumerate(minibatches):
        if step == 0:
            sae.b_dec.data = x.mean(0)
        sae.set_decoder_norm_to_unit_norm()
        out = sae(x=x, y=x, dead_mask=None, total_variance=(x - x.mean(0)).pow(2).sum())
        (out.fvu + cfg.auxk_alpha * out.auxk_loss + out.multi_topk_fvu / 8).backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        optimiser.step()
        optimiser.zero_grad()
    optimiser.eval()

    def reconstruct(x_n):
        out = sae(x=x_n, y=x_n)
        fired = torch.zeros(num_features, dtype=torch.bool)
        fired[out.latent_indices[out.latent_acts > 0]] = True
        return out.sae_out, fired
    return reconstruct


def train_overcomplete(minibatches, d_model: int, num_features: int, k: int, seed: int, epochs: int):
    """overcomplete's TopKSAE trained by its own train_sae loop as its README does; -> reconstruct(x_n)."""
    import matplotlib.cm
    import matplotlib.pyplot
    import torch

    if not hasattr(matplotlib.cm, "get_cmap"):  # overcomplete 0.3.0's plotting module, imported with its package, uses
        matplotlib.cm.get_cmap = matplotlib.pyplot.get_cmap  # the name matplotlib 3.9 removed; the SAE doesn't plot
    from overcomplete.sae import TopKSAE, train_sae

    batches = iter(minibatches)
    per_epoch = [[] for _ in range(epochs)]

    class Epochs:  # train_sae iterates its loader once per epoch: each pass yields that epoch's minibatches
        done = 0

        def __iter__(self):
            epoch, Epochs.done = Epochs.done, Epochs.done + 1
            return iter(per_epoch[epoch])

    all_batches = list(batches)
    size = -(-len(all_batches) // epochs)
    for i, x in enumerate(all_batches):
        per_epoch[min(i // size, epochs - 1)].append(x)
    torch.manual_seed(seed)
    sae = TopKSAE(d_model, nb_concepts=num_features, top_k=k, device="cpu")
    optimiser = torch.optim.Adam(sae.parameters(), lr=5e-4)
    train_sae(sae, Epochs(), lambda x, x_hat, pre, codes, dictionary: (x - x_hat).square().mean(), optimiser,
              nb_epochs=epochs, monitoring=0, device="cpu")
    sae.eval()

    def reconstruct(x_n):
        _, codes, x_hat = sae(x_n)
        return x_hat, (codes > 0).any(dim=0)
    return reconstruct


def timed_row(name: str, train, tokens, normalisation, num_features: int, k: int) -> dict:
    """Trains with `train()` (-> reconstruct), scores it by `held_out_fvu`, prints and returns the table row."""
    started = time.perf_counter()
    reconstruct = train()
    seconds = time.perf_counter() - started
    row = {"trainer": name, "F": num_features, "k": k, **held_out_fvu(tokens, normalisation, reconstruct, num_features),
           "seconds": round(seconds)}
    print(f"| {num_features:,}, {k} | {name} | {row['fvu']:.4f} | {100 * row['dead_fraction']:.2f} % | {row['seconds']} |",
          flush=True)
    return row


def train_ours(batches, loaded, tokens, normalisation, settings):
    """Our train_sae on the minibatches; -> reconstruct(x_n), checked to score as concepts.json's held_out_metrics."""
    from vit_core.concepts import train_sae
    from vit_core.concepts.learn import held_out_metrics
    from vit_core.concepts.sae import Concepts

    sae = train_sae(batches, tokens.chunks[0].tokens.shape[1], tokens.count(held=False), settings)

    def reconstruct(x_n):
        z = sae.encode(x_n)
        return sae.decode(z), (z > 0).any(dim=0)
    product = held_out_metrics(Concepts(sae, normalisation, loaded.name, loaded.weights, 2), tokens)
    here = held_out_fvu(tokens, normalisation, reconstruct, settings.num_features)
    assert abs(here["fvu"] - product["fvu"]) < 1e-9 and here["dead_fraction"] == product["dead_fraction"]
    return reconstruct


def peers(images: int, epochs: int, sizes: list[tuple[int, int]], cache: Path, seed: int = 0) -> list[dict]:
    """The table: per size, ours, sparsify and overcomplete on the same minibatches, scored alike."""
    import os

    import numpy as np
    import torch

    from vit_core.concepts import TrainingSettings
    from vit_core.concepts.learn import normalisation_of, training_batches
    from vit_core.concepts.sae import run_minibatches

    torch.set_num_threads(int(os.environ.get("PEERS_THREADS", "2")))
    loaded, plan, tokens = shapes_tokens(images, cache)
    normalisation = normalisation_of([np.asarray(c.tokens[tokens.rows(c, False)]) for c in tokens.chunks])
    d_model, train_tokens = tokens.chunks[0].tokens.shape[1], tokens.count(held=False)
    rows = []
    for num_features, k in sizes:
        settings = TrainingSettings(num_features=num_features, k=k, epochs=epochs, seed=seed)
        batches = training_batches(tokens, normalisation, settings.batch_tokens, 2 ** 33)
        print(f"tokens: {train_tokens:,} training, {tokens.count(held=True):,} held out; {epochs} epochs of "
              f"{settings.batch_tokens:,}-token minibatches ({settings.steps(train_tokens):,.0f} steps); ours: rate "
              f"{settings.lr(train_tokens):.3g}, dead after {settings.dead_window(train_tokens):,} tokens", flush=True)
        trainers = {
            "ViT Lens": partial(train_ours, batches, loaded, tokens, normalisation, settings),
            "sparsify 1.3.3": partial(train_sparsify, run_minibatches(batches, settings), d_model, num_features, k, seed),
            "overcomplete 0.3.0": partial(train_overcomplete, run_minibatches(batches, settings), d_model, num_features,
                                          k, seed, epochs),
        }
        for name, train in trainers.items():
            rows.append(timed_row(name, train, tokens, normalisation, num_features, k))
    return rows


def layer_result(out: Path) -> dict:
    """One block's figures from its concepts.json: the stages' seconds and the metrics."""
    summary = json.loads((out / "concepts.json").read_text())
    return {"stages_s": summary["seconds"], "fvu": round(summary["fvu"], 4), "dead_fraction": round(summary["dead_fraction"], 4),
            "spliced_top1_agreement": summary["spliced_top1_agreement"], "spliced_kl": round(summary["spliced_kl"], 4),
            "steerable_share": summary["steerable_share"],
            "tokens_mib": round(sum(p.stat().st_size for p in (out / "tokens").rglob("tokens-*.npy")) / 2 ** 20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=("shapes", "vit-b", "peers"))
    parser.add_argument("--sizes", default="2048:32,1024:16", help="peers: F:k pairs")
    parser.add_argument("--cache", type=Path, help="peers: where the drawn images and tokens are kept (default: a "
                        "temporary folder)")
    parser.add_argument("--images", type=int)
    parser.add_argument("--features", type=int)
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--layer", help="a block, or 2 or 3 (shapes: e.g. 1,2,3): their dictionaries and the circuit")
    parser.add_argument("--steering-images", type=int, help="the command's --steering-images (default: all held out)")
    args = parser.parse_args()
    if args.which == "peers":
        sizes = [tuple(int(v) for v in size.split(":")) for size in args.sizes.split(",")]
        print("| F, k | trainer | held-out FVU | dead | seconds |\n| --- | --- | --- | --- | --- |")
        if args.cache:
            peers(args.images or 1000, args.epochs or 4, sizes, args.cache)
        else:
            with tempfile.TemporaryDirectory() as temporary:
                peers(args.images or 1000, args.epochs or 4, sizes, Path(temporary))
        return
    with tempfile.TemporaryDirectory() as temporary:
        folder, out = Path(temporary) / "images", Path(temporary) / "concepts"
        folder.mkdir()
        if args.which == "shapes":
            images, features, epochs, layer = args.images or 2000, args.features or 2048, args.epochs or 4, args.layer or "2"
            draw_folder(folder, images)
            command = [str(folder), "--model", "vit-lens/shapes-vit"]
        else:
            images, epochs, layer = args.images or 1000, args.epochs or 1, args.layer or "6"
            features = args.features or args.expansion * 768
            draw_folder(folder, images, side=256)
            command = [str(folder), "--model", "vit_base_patch16_224", "--random-init"]
        steering = ["--steering-images", str(args.steering_images)] if args.steering_images else []
        seconds, peak_mib = run_command([*command, "--layer", str(layer), "--features", str(features), "--k", str(args.k),
                                         "--epochs", str(epochs), *steering, "--out", str(out)])
        result = {"which": args.which, "images": images, "features": features, "k": args.k, "epochs": epochs,
                  "layer": layer, "command_s": round(seconds, 1), "peak_rss_mib": peak_mib}
        if "," in layer:  # one dictionary per block in out/layer-L, and the circuit between them
            for block in layer.split(","):
                result[f"block {block}"] = layer_result(out / f"layer-{block}")
            circuit = json.loads((out / "circuit.json").read_text())
            result |= {"circuit_s": circuit["seconds"], "circuit_edges": len(circuit["edges"])}
        else:
            result |= layer_result(out)
            if args.which == "shapes":
                result |= {key: round(value, 4) for key, value in tab_timings(out).items()}
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
