"""AttnLRP and CP-LRP against the plain forward, on this machine: medians of interleaved rounds; and how well they
conserve the explained logit, per family.

    .venv/bin/python -m tools.benchmarks.lrp [--models vit_base_patch16_224 vit-lens/shapes-vit] [--repeats 7]
    .venv/bin/python -m tools.benchmarks.lrp --conservation

Per model (a random init for timm names, seed 0; the bundled weights for the Shapes ViT), one drawn image:

- plain forward: timm's own forward (fused attention, no hooks, no gradient), its linears on the library chosen as in
  every pass of ViT Lens (`devices.full_float32`, vit_core.runtime.onednn), and on torch's default library;
- AttnLRP, CP-LRP: one LRP forward and its backward (`explain.input_relevance`, the eps-rule), each alone; both
  (one forward, two backwards); both with every gamma choice (`explain.gamma_candidates`: one forward, six backwards);
- `relevance_maps(methods=("attnlrp", "cplrp"))` with the per-image gamma choice (its faithfulness test at
  `LRP_CHOICE_STEPS` steps) and without;
- Grad-CAM alone (its backward stops at `blocks[-1].norm1`) against Chefer + Grad-CAM (the backward to block 0).

Target: each LRP method within 3x of the plain forward (its linears as every pass's: vit_core.runtime.onednn's choice, the
same library as the LRP forward's).

`--conservation`: for a small member of each family (tools/vit_families.py, weights scrambled by `lively`), both
methods and every gamma choice: |input relevance + every absorbed share - y_c| / |y_c|; and with biases and constants
zeroed, |input relevance - y_c| / |y_c| for CP-LRP (AttnLRP: plus the softmax's share) at eps 1e-6 and 1e-12.
"""

from __future__ import annotations

from vit_core.runtime import configure_threads, one_blas_thread

one_blas_thread()  # before numpy loads

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tools.benchmarks.benchmark import interleaved_times  # noqa: E402
from tools.vit_families import LRP_FAMILIES  # noqa: E402
from vit_core import TEACHING_MODEL, explain, load_model, preprocess  # noqa: E402
from vit_core.runtime.devices import full_float32  # noqa: E402


def lively(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A deep copy with O(1) activations: random init's tiny weights leave GELU nearly linear and the softmax nearly
    uniform. Matrices N(0, 1/fan_in), norm and layer-scale gains 1 + N(0, 0.2), biases, tokens and position rows
    N(0, 0.3), seeded."""
    model = copy.deepcopy(model).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if param.dim() >= 2 and name.endswith("weight"):
                param.copy_(noise / np.sqrt(param[0].numel()))
            elif name.endswith("weight") or name.endswith("gamma"):
                param.copy_(1 + 0.2 * noise)
            else:
                param.copy_(0.3 * noise)
    return model


def without_biases(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with every bias, position embedding and prefix token zeroed."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or name.split(".")[-1] in ("pos_embed", "cls_token", "reg_token", "dist_token"):
                param.zero_()
    return model


def conservation() -> None:
    print("\n== conservation: |input relevance + absorbed shares - y_c| / |y_c| (biases kept), and with biases and "
          "constants zeroed |input (+ softmax share) - y_c| / |y_c|")
    for family, (name, kwargs) in LRP_FAMILIES.items():
        model = lively(load_model(name, pretrained=False, seed=0, device="cpu", **kwargs).model)
        h, w = model.patch_embed.img_size
        x = torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(1))
        top = lambda logits: int(np.argmax(logits))  # noqa: E731 - a one-line target picker
        full = explain.input_relevance(model, x, top, choices=explain.gamma_candidates(model), shares=True)
        y = float(full.logits[full.target])
        gaps = [abs(float(p.astype(np.float64).sum()) + sum(full.shares[k].values()) - y) / abs(y)
                for k, p in full.pixels.items()]
        bare = without_biases(model)
        zeroed = {}
        for eps in (1e-6, 1e-12):
            r = explain.input_relevance(bare, x, top, epsilon=eps, shares=True)
            yb = float(r.logits[r.target])
            zeroed[eps] = {m: abs(float(r.pixels[(m, "epsilon")].astype(np.float64).sum())
                                  + r.shares[(m, "epsilon")].get("softmax", 0.0) - yb) / abs(yb) for m in explain.LRP_METHODS}
        print(f"{family:28s} with shares: max {max(gaps):.1e} over {len(gaps)} (method, gamma) | zeroed, eps 1e-6: "
              f"AttnLRP {zeroed[1e-6]['attnlrp']:.1e} CP-LRP {zeroed[1e-6]['cplrp']:.1e}; eps 1e-12: AttnLRP "
              f"{zeroed[1e-12]['attnlrp']:.1e} CP-LRP {zeroed[1e-12]['cplrp']:.1e}")


def drawn_image(size: tuple[int, int] = (375, 500)) -> Image.Image:
    """A smooth gradient with a few bright rectangles (seeded), as the tests draw."""
    rng = np.random.default_rng(0)
    h, w = size
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x / w, y / h, 0.5 + 0.5 * np.sin((x + y) / 17.0)], axis=-1) * 200
    for _ in range(4):
        top, left = rng.integers(0, h - 60), rng.integers(0, w - 60)
        img[top:top + 60, left:left + 60] = rng.integers(0, 256, size=3)
    return Image.fromarray(img.astype(np.uint8))


def benchmark(name: str, repeats: int) -> None:
    loaded = load_model(name, pretrained=False, seed=0)
    image = drawn_image()
    _, x = preprocess(loaded, image)  # (1, 3, H, W)
    model = loaded.model
    with torch.inference_mode():
        target = int(model(x)[0].argmax())
    choices = explain.gamma_candidates(model)

    def plain(as_chosen: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                if as_chosen:
                    with full_float32(loaded.device):
                        model(x)
                else:
                    model(x)
        return run

    def lrp(methods: tuple[str, ...], with_choices: bool = False) -> Callable[[], None]:
        def run() -> None:
            with loaded.lock, full_float32(loaded.device):
                explain.input_relevance(model, x, target, methods=methods,
                                        choices=choices if with_choices else (explain.EPSILON_ONLY,))
        return run

    def maps(**kwargs) -> Callable[[], None]:
        return lambda: explain.relevance_maps(loaded, image, target, **kwargs)

    variants = {
        "plain forward (linears as chosen)": plain(True),
        "plain forward (torch's default)": plain(False),
        "AttnLRP": lrp(("attnlrp",)),
        "CP-LRP": lrp(("cplrp",)),
        "AttnLRP + CP-LRP (1 forward, 2 backwards)": lrp(explain.LRP_METHODS),
        f"both x {len(choices)} gamma choices (6 backwards)": lrp(explain.LRP_METHODS, with_choices=True),
        "relevance_maps(attnlrp, cplrp), eps only": maps(methods=explain.LRP_METHODS, choose_gamma=False),
        f"relevance_maps(attnlrp, cplrp), gamma chosen (S={explain.LRP_CHOICE_STEPS})": maps(methods=explain.LRP_METHODS),
        "relevance_maps(gradcam)": maps(methods=("gradcam",)),
        "relevance_maps(chefer, gradcam)": maps(methods=("chefer", "gradcam")),
    }
    times = interleaved_times(variants, repeats, warmups=1)
    base = times["plain forward (linears as chosen)"]
    g = loaded.geometry
    print(f"\n== {name} ({'bundled weights' if name == TEACHING_MODEL else 'random init'}), {g.num_tokens} tokens, "
          f"{g.num_layers} blocks; median of {repeats} interleaved rounds, {torch.get_num_threads()} torch threads")
    for variant, samples in times.items():
        ratio = statistics.median(t / b for t, b in zip(samples, base, strict=True))
        print(f"{variant:62s} {statistics.median(samples) * 1e3:9.1f} ms  {ratio:5.2f}x plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit_base_patch16_224", TEACHING_MODEL])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--conservation", action="store_true", help="print the conservation errors per family instead")
    args = parser.parse_args()
    configure_threads()
    if args.conservation:
        conservation()
        return
    for name in args.models:
        benchmark(name, args.repeats)


if __name__ == "__main__":
    main()
