"""Capture and explanations on a GPU against the CPU, same weights, same image: the largest differences.

    .venv/bin/python -m tools.benchmarks.gpu_parity [--model vit_base_patch16_224]

Random-init weights (seed 0, as the tests' models), one drawn 500 x 375 image. Prints, per captured
array, the largest absolute difference and the largest value, and the top-5 agreement.
"""

import argparse
import time

import numpy as np
from PIL import Image

from vit_core import load_model, run_with_capture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    image = Image.fromarray((np.linspace(0, 255, 500)[None, :, None] * rng.uniform(0.5, 1, (375, 1, 3))).astype(np.uint8))
    captures = {}
    for device in ("cpu", "cuda"):
        loaded = load_model(args.model, pretrained=False, device=device)
        run_with_capture(loaded, image)  # warm-up
        t = time.perf_counter()
        captures[device] = run_with_capture(loaded, image)
        print(device, loaded.device_name, f"capture {1e3 * (time.perf_counter() - t):.1f} ms")
    cpu, gpu = captures["cpu"], captures["cuda"]
    for name in ("logits", "pattern", "tokens", "final_tokens"):
        a, b = np.asarray(getattr(cpu, name)), np.asarray(getattr(gpu, name))
        print(f"{name:11s} {a.shape}  max |cpu - cuda| {np.abs(a - b).max():.2e}  max |cpu| {np.abs(a).max():.2e}")
    top5 = [list(np.argsort(-np.asarray(c.logits))[:5]) for c in (cpu, gpu)]
    print("top-5 equal:", top5[0] == top5[1])


if __name__ == "__main__":
    main()
