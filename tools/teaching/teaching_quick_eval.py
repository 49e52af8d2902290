"""Quick figures of a trained Shapes ViT directory, for comparing training runs (a sweep), not for the card.

    python -m tools.teaching.teaching_quick_eval DIR [--threads 2] [--images 450]

Prints one JSON line: accuracy (generator, second drawer, phone photos of pages), the attention figures,
the mean-attention-distance picture and the position embedding's Spearman, on fewer images than
``python -m tools.teaching.evaluate`` (which writes the model card) uses; then the (L, H) distances.
"""

import argparse
import json
import time

import torch

from vit_core.teaching.model import load_shapes_vit

from . import evaluate as ev
from . import page_photos, second_drawer

KEYS = ("accuracy", "accuracy_per_size_band", "accuracy_photographed", "rollout_object_mass", "last_layer_cls_object_mass",
        "object_patch_fraction", "mad_mixed_layers_first_half", "mad_last_layer_all_global")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=450, help="held-out generator images")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, config = load_shapes_vit(args.model_dir)
    generator = ev.evaluate_generator(model, eval_size=args.images, mad_images=128)
    second = ev.evaluate_second_drawer(model, second_drawer)
    photos = ev.evaluate_page_photos(model, page_photos, n=120)
    out = {k: generator[k] for k in KEYS} | {
        "second_drawer": second["second_drawer_accuracy"], "second_worst_group": second["second_drawer_worst_group"],
        "page_photos": photos["page_photos_accuracy"], "spearman": ev.pos_embed_grid_spearman(model),
        "final_loss": config["train"]["final_loss"], "seconds": round(time.perf_counter() - t0, 1)}
    print(args.model_dir, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    print("MAD", [[round(v, 1) for v in row] for row in generator["mean_attention_distance_px"]])


if __name__ == "__main__":
    main()
