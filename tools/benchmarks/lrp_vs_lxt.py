"""ViT Lens's AttnLRP and CP-LRP against lxt's, same weights, same input: the largest differences.

    .venv/bin/python -m tools.benchmarks.lrp_vs_lxt [--lxt-python PYTHON]
    .venv/bin/python -m tools.benchmarks.lrp_vs_lxt --epsilon-effect [MODEL]     # no lxt needed

A small timm ViT (class token, 2 blocks, width 32, 32 x 32 input, 8 px patches, weights drawn so that every
non-linearity is exercised) is copied into torchvision's `VisionTransformer` (the architecture lxt 2.1 supports);
lxt explains that copy in a separate process (it patches torch's classes process-wide, which must not happen in
ours), ViT Lens explains the timm model (`vit_core.explain.lrp`). Variants, each with the same rules on both sides:

- `cplrp`: lxt's own patch map for torchvision's ViT (`lxt.efficient.models.vit_torch.cp_LRP`: identity rule on
  GELU, std held constant in LayerNorm, query and key detached); linears and the patch convolution by their gradient
  (lxt's eps -> 0). Ours: CP-LRP, the eps-rule everywhere, eps 1e-12: ViT Lens's default 1e-6 moves this model's
  maps by about 1e-4 of their largest value, a ViT-B/16's by 2e-3 to 6e-3, correlation above 0.99999
  (`--epsilon-effect`).
- `attnlrp`: lxt's GELU and LayerNorm patches, and torchvision's attention written out with lxt's uniform rule as
  lxt applies it to every Hugging Face attention (`lxt.efficient.patches.wrap_attention_forward`: gradient / 4 at q
  and k, / 2 at v). Ours: AttnLRP, the eps-rule everywhere.
- `cplrp_gamma`: `cplrp` plus zennit's Gamma rule through lxt's zennit patch, as lxt's ViT example does
  (examples/vit_torch.py): gamma 0.25 on the patch convolution and 0.1 on every `nn.Linear` that runs as a module
  (the MLPs and the head; torch's attention uses its out_proj weights without calling the module). Ours: the same
  gamma on the same layers.

lxt 2.1 can't be installed beside this project's packages (it needs transformers < 4.55, which needs
huggingface_hub < 1.0; the project has huggingface_hub 2.x), so it runs in another interpreter: one with lxt,
zennit and torchvision (`--lxt-python`, or $VIT_LENS_LXT_PYTHON). Set one up with, for example,

    python -m venv /tmp/lxt && /tmp/lxt/bin/pip install lxt==2.1 "transformers==4.54.1" torchvision

Prints, per variant: the largest |ours - lxt| per pixel and per patch, each relative to the largest |lxt| value, and
the correlation of the two pixel maps. `--epsilon-effect` prints what ViT Lens's default eps (1e-6) changes against
eps 1e-12, per method: the largest pixel difference relative to the largest |value| at 1e-12, and the maps'
correlation, for the model above and for MODEL (default ViT-B/16, random init scrambled by `lively`, two seeds).
tests/unit/test_lrp_lxt.py runs the same comparison where such an interpreter is given.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

LXT_PYTHON_ENV = "VIT_LENS_LXT_PYTHON"
VARIANTS = ("cplrp", "attnlrp", "cplrp_gamma")
CONV_GAMMA, LINEAR_GAMMA = 0.25, 0.1
ARCH = dict(img_size=32, patch_size=8, embed_dim=32, num_heads=2, depth=2, num_classes=5)
TARGET = 3
LXT_EPSILON = 1e-12  # lxt's efficient mode differentiates linears plainly (eps -> 0); ViT Lens's default is 1e-6


# ----------------------------------------------------------------------------------------------
# The worker: runs in the interpreter that has lxt (no vit_core import)


def _attnlrp_mha_forward(self, query, key, value, need_weights=False, **kwargs):
    """torchvision's self-attention (batch first, q = k = v = the tokens) written out, with lxt's uniform rule as
    `lxt.efficient.patches.wrap_attention_forward` puts it on every Hugging Face attention."""
    import torch.nn.functional as F
    from lxt.efficient.rules import divide_gradient

    b, t, d = query.shape
    h = self.num_heads
    q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
    q, k, v = (u.reshape(b, t, h, d // h).transpose(1, 2) for u in (q, k, v))  # (B, H, T, hd)
    q, k, v = divide_gradient(q, 4), divide_gradient(k, 4), divide_gradient(v, 2)
    pattern = (q @ k.transpose(-2, -1) / (d // h) ** 0.5).softmax(dim=-1)
    out = (pattern @ v).transpose(1, 2).reshape(b, t, d)
    return F.linear(out, self.out_proj.weight, self.out_proj.bias), None


def worker(folder: Path) -> None:
    """Reads folder/job.pt (variant, torchvision config, state dict, input, target), writes folder/result.npz
    (relevance (3, H, W) = input * gradient after lxt's patches, logits (C,))."""
    from functools import partial

    from lxt.efficient import monkey_patch
    from lxt.efficient.patches import layer_norm_forward, non_linear_forward, patch_method
    from torchvision.models import vision_transformer

    job = torch.load(folder / "job.pt", weights_only=True)
    variant = job["variant"]
    if variant == "attnlrp":
        monkey_patch(vision_transformer, {
            vision_transformer.nn.GELU: partial(patch_method, non_linear_forward, keep_original=True),
            vision_transformer.nn.LayerNorm: partial(patch_method, layer_norm_forward),
            vision_transformer.nn.MultiheadAttention: partial(patch_method, _attnlrp_mha_forward),
        })
    else:
        monkey_patch(vision_transformer)  # lxt's default for torchvision's ViT: CP-LRP
    model = vision_transformer.VisionTransformer(**job["config"]).eval()
    model.load_state_dict(job["state_dict"])
    for param in model.parameters():
        param.requires_grad_(False)
    composite = None
    if variant == "cplrp_gamma":
        import zennit.rules as z_rules
        from lxt.efficient import monkey_patch_zennit
        from zennit.composites import LayerMapComposite

        monkey_patch_zennit()
        composite = LayerMapComposite([(torch.nn.Conv2d, z_rules.Gamma(job["conv_gamma"])),
                                       (torch.nn.Linear, z_rules.Gamma(job["linear_gamma"]))])
        composite.register(model)
    x = job["x"].clone().requires_grad_(True)
    logits = model(x)
    logits[0, job["target"]].backward()
    if composite is not None:
        composite.remove()
    np.savez(folder / "result.npz", relevance=(x * x.grad)[0].detach().numpy(), logits=logits[0].detach().numpy())


# ----------------------------------------------------------------------------------------------
# This side: the timm model, its torchvision copy, ViT Lens's maps


def timm_model() -> torch.nn.Module:
    """The timm ViT compared, with O(1) weights (seeded): random init's tiny ones leave GELU and softmax nearly linear."""
    from tools.benchmarks.lrp import lively
    from vit_core import load_model

    return lively(load_model("vit_tiny_patch16_224", pretrained=False, seed=0, device="cpu", **ARCH).model)


def torchvision_copy(model: torch.nn.Module) -> tuple[dict, dict[str, torch.Tensor]]:
    """(torchvision VisionTransformer kwargs, its state dict) holding `model`'s weights."""
    s = model.state_dict()
    config = dict(image_size=ARCH["img_size"], patch_size=ARCH["patch_size"], num_layers=ARCH["depth"],
                  num_heads=ARCH["num_heads"], hidden_dim=ARCH["embed_dim"], mlp_dim=4 * ARCH["embed_dim"],
                  num_classes=ARCH["num_classes"])
    state = {"conv_proj.weight": s["patch_embed.proj.weight"], "conv_proj.bias": s["patch_embed.proj.bias"],
             "class_token": s["cls_token"], "encoder.pos_embedding": s["pos_embed"],
             "encoder.ln.weight": s["norm.weight"], "encoder.ln.bias": s["norm.bias"],
             "heads.head.weight": s["head.weight"], "heads.head.bias": s["head.bias"]}
    for i in range(ARCH["depth"]):
        ours, theirs = f"blocks.{i}.", f"encoder.layers.encoder_layer_{i}."
        pairs = {"norm1": "ln_1", "norm2": "ln_2", "attn.proj": "self_attention.out_proj", "mlp.fc1": "mlp.0",
                 "mlp.fc2": "mlp.3"}
        for a, b in pairs.items():
            state[f"{theirs}{b}.weight"], state[f"{theirs}{b}.bias"] = s[f"{ours}{a}.weight"], s[f"{ours}{a}.bias"]
        state[f"{theirs}self_attention.in_proj_weight"] = s[f"{ours}attn.qkv.weight"]
        state[f"{theirs}self_attention.in_proj_bias"] = s[f"{ours}attn.qkv.bias"]
    return config, {k: v.detach().clone().contiguous() for k, v in state.items()}


def ours(model: torch.nn.Module, x: torch.Tensor, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """ViT Lens's input relevance (3, H, W) and logits for a variant's rules."""
    from vit_core.explain import lrp

    choice = lrp.EPSILON_ONLY
    if variant == "cplrp_gamma":
        linears = [f"blocks.{i}.mlp.fc{j}" for i in range(ARCH["depth"]) for j in (1, 2)] + ["head"]
        choice = lrp.GammaChoice("lxt example", (("patch_embed.proj", CONV_GAMMA), *((n, LINEAR_GAMMA) for n in linears)))
    method = "attnlrp" if variant == "attnlrp" else "cplrp"
    result = lrp.input_relevance(model, x, TARGET, methods=(method,), choices=(choice,), epsilon=LXT_EPSILON)
    return result.pixels[(method, choice.name)], result.logits


def compare(lxt_python: str) -> dict[str, dict[str, float]]:
    """Per variant: the largest pixel and patch differences relative to lxt's largest value, the correlation of the
    pixel maps, and the largest logit difference. Raises RuntimeError with lxt's stderr if its side fails."""
    from vit_core.explain import lrp

    model = timm_model()
    x = torch.randn(1, 3, ARCH["img_size"], ARCH["img_size"], generator=torch.Generator().manual_seed(1))
    config, state = torchvision_copy(model)
    grid = (ARCH["img_size"] // ARCH["patch_size"],) * 2
    patch = (ARCH["patch_size"],) * 2
    figures = {}
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"variant": variant, "config": config, "state_dict": state, "x": x, "target": TARGET,
                        "conv_gamma": CONV_GAMMA, "linear_gamma": LINEAR_GAMMA}, Path(folder) / "job.pt")
            run = subprocess.run([lxt_python, str(Path(__file__).resolve()), "--worker", folder], capture_output=True,
                                 text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            if run.returncode != 0:
                raise RuntimeError(f"lxt's side ({variant}) failed:\n{run.stderr[-3000:]}")
            with np.load(Path(folder) / "result.npz") as result:
                theirs, their_logits = result["relevance"], result["logits"]
        mine, my_logits = ours(model, x, variant)
        scale = float(np.abs(theirs).max())
        patches_mine, patches_theirs = (lrp.patch_relevance(p, patch, grid) for p in (mine, theirs))
        figures[variant] = {
            "pixel": float(np.abs(mine - theirs).max()) / scale,
            "patch": float(np.abs(patches_mine - patches_theirs).max()) / float(np.abs(patches_theirs).max()),
            "correlation": float(np.corrcoef(mine.reshape(-1), theirs.reshape(-1))[0, 1]),
            "logits": float(np.abs(my_logits - their_logits).max()),
        }
    return figures


def epsilon_effect(model: torch.nn.Module, x: torch.Tensor, target: int) -> dict[str, tuple[float, float]]:
    """Per method: (largest |map at lrp.EPSILON - map at LXT_EPSILON| / largest |map at LXT_EPSILON|, their correlation)."""
    from vit_core.explain import lrp

    maps = {eps: lrp.input_relevance(model, x, target, methods=("attnlrp", "cplrp"), epsilon=eps).pixels
            for eps in (lrp.EPSILON, LXT_EPSILON)}
    figures = {}
    for key, default in maps[lrp.EPSILON].items():
        reference = maps[LXT_EPSILON][key]
        figures[key[0]] = (float(np.abs(default - reference).max() / np.abs(reference).max()),
                           float(np.corrcoef(default.reshape(-1), reference.reshape(-1))[0, 1]))
    return figures


def print_epsilon_effect(model_name: str) -> None:
    """`epsilon_effect` on the compared model, then on `model_name` at its own input size, weights seeds 0 and 1."""
    from tools.benchmarks.lrp import lively
    from vit_core import load_model

    x = torch.randn(1, 3, ARCH["img_size"], ARCH["img_size"], generator=torch.Generator().manual_seed(1))
    runs = [("the compared model", timm_model(), x)]
    base = load_model(model_name, pretrained=False, seed=0, device="cpu").model
    size = base.patch_embed.img_size
    for seed in (0, 1):
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(seed + 1))
        runs.append((f"{model_name}, seed {seed}", lively(base, seed=seed), x))
    for name, model, x in runs:
        for method, (pixel, correlation) in epsilon_effect(model, x, TARGET).items():
            print(f"{name:36s} {method:8s} eps 1e-6 against 1e-12: max |difference| / max |value| {pixel:.1e};"
                  f" correlation {correlation:.7f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lxt-python", default=os.environ.get(LXT_PYTHON_ENV, sys.executable),
                        help=f"an interpreter with lxt 2.1, zennit and torchvision (default: ${LXT_PYTHON_ENV}, else this one)")
    parser.add_argument("--epsilon-effect", nargs="?", const="vit_base_patch16_224", metavar="MODEL",
                        help="what ViT Lens's default eps changes against 1e-12 (no lxt needed)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker))
        return
    if args.epsilon_effect:
        print_epsilon_effect(args.epsilon_effect)
        return
    print(f"lxt side: {args.lxt_python}")
    for variant, f in compare(args.lxt_python).items():
        print(f"{variant:12s} max |ours - lxt| / max |lxt|: pixels {f['pixel']:.2e}, patches {f['patch']:.2e};"
              f" correlation {f['correlation']:.7f}; logits differ by {f['logits']:.1e}")


if __name__ == "__main__":
    main()
