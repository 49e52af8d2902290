"""Benchmark the faithfulness curves and the other tests of vit_core.explain on this machine, before and after the
random baseline's orders were deleted from their ends, for ViT-B/16 (random init) and the bundled Shapes ViT.

    .venv/bin/python -m tools.benchmarks.faithfulness [--models vit_base_patch16_224 vit-lens/shapes-vit] [--repeats 2]
                                                      [--sanity]

For each model, one image and the maps of `explain.relevance_maps` (every method it has), S = 10, R = 8 random orders:

- "curves, before": the curves as they ran before that change, copied here (`previous_curves`): the random baseline ran
  each order's deletion (its first n_k dropped) and insertion, 2 S - 1 sets per order; then each method.
- "curves, after": `explain.faithfulness`: the random baseline deletes from each order's end, so that its deletion
  and insertion keep the same sets (S - 1 per order beside the full one); each method as before.
- each further test of `explain.judge` alone (SRG, SaCo, pixel masking; localisation with the Shapes sample's own
  mask), then the whole table; `--sanity`: Adebayo et al.'s checks (a relevance pass per stage).

Times are medians of `--repeats` rounds, each of which runs every row once (other processes share this machine:
interleaving makes their load hit each row alike, but the medians still move by tens of percent).
Beside each, the work it does, which does not move: forwards, perturbed inputs, and patch tokens run through the
blocks (the cost of a ViT's forward grows with them). Targets: all curves of ViT-B/16 within 20 s on the 2-core
CPU, the Shapes ViT's well under 1 s.

A time in seconds says little about the next CPU, so the curves' row also gets its floor on this machine, measured
in the same run: the multiply-adds of the blocks' linears for the tokens it ran (`linear_macs`), at the rate this
CPU runs a block's linears on the judge's lanes (one torch thread each, `explain.forward_lanes`; `product_rate`).
The linears are most of a forward (ViT-B/16: about 9 in 10 of its time in a profile); attention, GELU and the norms
come on top, so the ratio to this floor can't reach 1.
"""

from __future__ import annotations

from vit_core.runtime import one_blas_thread

one_blas_thread()  # before numpy loads

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Callable, Mapping  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from vit_core import TEACHING_MODEL, LoadedModel, explain, load_model  # noqa: E402
from vit_core.explain import perturbation  # noqa: E402
from vit_core.explain.interventions import last_block_for_the_head_only  # noqa: E402
from vit_core.runtime import configure_threads, torch_threads  # noqa: E402
from vit_core.runtime.devices import full_float32  # noqa: E402
from vit_core.teaching.data import draw_sample  # noqa: E402

STEPS, ORDERS = explain.DEFAULT_STEPS, explain.RANDOM_ORDERS


def previous_curves(loaded: LoadedModel, image: Image.Image, maps: Mapping[str, np.ndarray], target: int,
                    probs: explain.KeptSetProbs) -> None:
    """The curves as `explain.faithfulness` ran them before: the random baseline first, each order's
    deletion dropping its first n_k patches and its insertion keeping them (2 S - 1 distinct sets per order), then
    each method's 2 S sets; each unit's sets batched by length, every distinct set run once per call."""
    n = loaded.geometry.num_patches
    units = [explain.random_patch_orders(n, ORDERS, 0)] + [explain.patch_order(maps[m]).reshape(1, n) for m in maps]
    for orders in units:
        rows = [o[d:] for d in explain.deletion_counts(n, STEPS) for o in orders]
        rows += [o[:k] for k in explain.insertion_counts(n, STEPS) for o in orders]
        probs(rows)


Work = Callable[[], "explain.KeptSetProbs | list[explain.KeptSetProbs] | None"]


def interleaved(variants: dict[str, Work], repeats: int) -> dict[str, tuple[float, str]]:
    """Per variant, the median seconds over `repeats` rounds that run every variant once (so that another process's
    load hits each alike), and the work of its last run (the caches it returns)."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    work: dict[str, str] = {}
    for _ in range(repeats):
        for name, fn in variants.items():
            started = time.perf_counter()
            result = fn()
            seconds[name].append(time.perf_counter() - started)
            caches = result if isinstance(result, list) else [result] if result is not None else []
            work[name] = (f"{sum(c.forwards for c in caches):5d} forwards {sum(c.rows for c in caches):6d} inputs "
                          f"{sum(c.patches for c in caches):8d} patch tokens") if caches else ""
    return {name: (statistics.median(seconds[name]), work[name]) for name in variants}


class Counting:
    """Every KeptSetProbs made while inside: the benchmark reads their counters (the library keeps none of them)."""

    def __enter__(self) -> list[explain.KeptSetProbs]:
        self.made: list[explain.KeptSetProbs] = []
        self.cls = perturbation.KeptSetProbs
        made = self.made

        class Counted(self.cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                made.append(self)

        for module in (perturbation, explain.evaluation):
            module.KeptSetProbs = Counted
        return made

    def __exit__(self, *exc) -> None:
        for module in (perturbation, explain.evaluation):
            module.KeptSetProbs = self.cls


def linear_macs(loaded: LoadedModel, tokens: int, prefix_rows: int) -> int:
    """Multiply-adds of the blocks' linears for `tokens` tokens in `prefix_rows` kept-set rows, as
    `explain.run_from_embedded` runs them: every block for every token, except a last block run for the head only
    (class-token pooling), where only the keys and values are made for every token and the rest for the prefix tokens."""
    def macs(block: torch.nn.Module) -> int:
        return sum(m.in_features * m.out_features for m in block.modules() if isinstance(m, torch.nn.Linear))

    blocks = list(loaded.model.blocks)
    if not last_block_for_the_head_only(loaded.model):
        return tokens * sum(macs(b) for b in blocks)
    last = blocks[-1]
    kv = last.attn.qkv.in_features * last.attn.qkv.out_features * 2 // 3  # keys and values: for every token
    prefix = prefix_rows * loaded.geometry.num_prefix_tokens
    return tokens * (sum(macs(b) for b in blocks[:-1]) + kv) + prefix * (macs(last) - kv)


def product_rate(loaded: LoadedModel, rounds: int = 6, seconds: float = 0.5) -> float:
    """FLOP/s of this CPU on the first block's linears, each in turn on the judge's largest batch (DROP_BATCH sets of
    every token: its products run fastest there), summed over the judge's lanes: as many threads as
    `explain.forward_lanes` gives, one torch thread each, in the library's float32 (its choice of MKL or oneDNN).
    Each lane keeps its fastest of `rounds` rounds of `seconds`: another process's work only slows a round, so the
    floor stays a lower bound on a busy machine."""
    rows = perturbation.DROP_BATCH * loaded.geometry.num_tokens
    linears = [m for m in loaded.model.blocks[0].modules() if isinstance(m, torch.nn.Linear)]
    flop = sum(2.0 * rows * m.in_features * m.out_features for m in linears)  # one pass over them
    lanes = explain.forward_lanes(loaded, jobs=64)
    best: list[float] = []

    def lane() -> None:
        inputs = [torch.randn(rows, m.in_features) for m in linears]
        rates = []
        with torch_threads(1), torch.inference_mode(), full_float32(loaded.device):
            for m, x in zip(linears, inputs, strict=True):
                m(x)  # the library's choice made, the kernels warm
            for _ in range(rounds):
                count, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds:
                    for m, x in zip(linears, inputs, strict=True):
                        m(x)
                    count += 1
                rates.append(flop * count / (time.perf_counter() - started))
        best.append(max(rates))

    threads = [threading.Thread(target=lane) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(best)


def bench_model(name: str, repeats: int, sanity: bool) -> None:
    loaded = load_model(name, pretrained=False, seed=0) if name != TEACHING_MODEL else load_model(name)
    if name == TEACHING_MODEL:
        sample = draw_sample(np.random.default_rng(3), label=2)  # a triangle, with its silhouette
        image, mask = Image.fromarray(sample.image), sample.region
    else:
        image, mask = Image.fromarray(np.asarray(draw_sample(np.random.default_rng(3), size=256, label=2).image)), None
    relevance = explain.relevance_maps(loaded, image)
    maps, target = relevance.maps, relevance.target
    g = loaded.geometry
    print(f"\n== {name} ({'bundled' if name == TEACHING_MODEL else 'random init'}): {g.num_patches} patches, "
          f"{g.num_layers} blocks, {len(maps)} maps ({', '.join(maps)}), S = {STEPS}, R = {ORDERS}, "
          f"median of {repeats}")
    x = explain.model_input(loaded, image)

    def before():
        probs = explain.KeptSetProbs(loaded, x, target)
        previous_curves(loaded, image, maps, target, probs)
        return probs

    counted: list[explain.KeptSetProbs] = []  # the last "after" run's, for the floor

    def after():
        with Counting() as made:
            explain.faithfulness(loaded, image, maps, target)
        counted[:] = made
        return made

    def judged(tests, objects=None):
        def run():
            with Counting() as made:
                explain.judge(loaded, image, maps, target, tests=tests, mask=objects)
            return made
        return run

    objects = None if mask is None else explain.object_patches(loaded, mask, image.size)
    rows = [("curves, before (old random baseline)", before), ("curves, after (explain.faithfulness)", after),
            ("curves + SRG", judged(["deletion_auc", "insertion_auc", "srg"])),
            ("SaCo alone", judged(["saco"])),
            ("pixel masking curves alone", judged(["pixel_deletion_auc", "pixel_insertion_auc"])),
            ("the whole table (judge, every test)", judged(explain.FAITHFULNESS_TESTS, objects))]
    if objects is not None:
        rows.insert(5, ("localisation alone (no forward)", judged([], objects)))
    if sanity:
        rows.append(("sanity checks (relevance_maps per stage)",
                     lambda: explain.sanity_checks(loaded, image, target) and None))
    explain.faithfulness(loaded, image, maps, target, steps=2)  # warm-up: allocator, oneDNN's kernels
    results = interleaved(dict(rows), repeats)
    for label, (seconds, work) in results.items():
        print(f"{label:45s} {seconds:8.2f} s   {work}")
    after_seconds = results["curves, after (explain.faithfulness)"][0]
    ratio = results["curves, before (old random baseline)"][0] / after_seconds
    print(f"curves before / after: {ratio:.2f}x")
    tokens = sum(p.patches + p.rows * g.num_prefix_tokens for p in counted)  # every token, prefix tokens included
    work = linear_macs(loaded, tokens, sum(p.rows for p in counted))
    rate = product_rate(loaded)
    floor = 2.0 * work / rate
    print(f"curves' floor on this CPU: {work / 1e9:.0f} G multiply-adds of the blocks' linears ({tokens} tokens) "
          f"at {rate / 1e9:.0f} GFLOP/s ({explain.forward_lanes(loaded, 64)} lanes) = {floor:.2f} s; "
          f"the curves took {after_seconds / floor:.2f}x that")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit_base_patch16_224", TEACHING_MODEL])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sanity", action="store_true", help="also time the sanity checks")
    args = parser.parse_args()
    threads = configure_threads()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"torch {torch.__version__}, {threads} threads, {cpu}")
    for name in args.models:
        bench_model(name, args.repeats, args.sanity)


if __name__ == "__main__":
    main()
