"""The command line: `python -m vit_core analyze ...` and `python -m vit_core dataset ...` (or `vit-lens ...`).

    analyze IMAGE [IMAGE ...] --model NAME [--weights FILE | --random-init] [--labels FILE] [--out DIR]
            [--topk K] [--device DEVICE] [--explain [--target K] [--steps S] [--tests all|T,...] [--mask MASK ...]]
            [--lens FILE.py|MODULE|NAME ...]
    dataset FOLDER --model NAME [--weights FILE | --random-init] [--labels FILE] [--out DIR] [--batch-size B]
            [--device DEVICE] [--limit N] [--workers W] [--explain [--steps S] [--tests all|T,...] [--masks DIR]]
            [--table csv|parquet] [--lens FILE.py|MODULE|NAME ...]
            [--shards N | --shard I/N] [--engine local|ray [--address ADDR] [--gpus-per-worker G] [--model-workers M]]
    merge PARTS [PARTS ...] --out DIR [--table csv|parquet]
    compare FOLDER --model A [--weights FILE | --random-init] [--model-b B] [--weights-b FILE | --random-init-b [--seed-b S]]
            --out DIR [--labels FILE] [--explain [--steps S] [--tests all|T,...]] [--batch-size B] [--device DEVICE]
            [--limit N] [--workers W] [--table csv|parquet] [--concepts-layer L] [--shards N | --shard I/N]
            [--engine local|ray [--address ADDR] [--gpus-per-worker G] [--model-workers M]]
    concepts FOLDER --model NAME [--weights FILE | --random-init] --layer L [--features F] [--k K] [--epochs E]
            [--seed S] [--out DIR] [--batch-size B] [--device DEVICE] [--limit N] [--workers W] [--memory-gb G]
            [--shards N | --shard I/N] [--engine local|ray [--address ADDR] [--gpus-per-worker G] [--model-workers M]]

`analyze` writes DIR/<name>.npz and DIR/<name>.json per readable image, and says so in one line on stdout (the image,
its top-1 class with its probability, or "no classifier head", and the two files); `dataset` writes DIR/dataset.npz,
DIR/dataset.json, DIR/mean_attention_distance.png, DIR/images.csv (and DIR/classes.csv with labels) for every
image under FOLDER, in shards whose parts it keeps in DIR/parts (a rerun skips the shards done; `--shard I/N`
runs one shard, `merge` joins the parts of shards run elsewhere; formats: docs/spec/interface.md). Every file is
written atomically (vit_core.images.files): a reader never finds half of one. A failure (an unreadable image, an output
that can't be written) prints one line on stderr, starting with the command's name (`vit-lens:`, or `vit_core:`
under `python -m`), the other images are still analysed, and the exit status is 2. So is a bad `--device` (auto,
cpu, cuda, cuda:N, mps; vit_core.runtime.devices), and a path that isn't there (an IMAGE, a MASK, --weights, --labels,
FOLDER): both are refused before torch is imported or any model loaded, as are the other mistakes that need no
model (vit_core.arguments: an unknown model name or a mistyped --target with the closest names, an --out that can't
be a folder, a FOLDER without images, a folder given to analyze). Ctrl-C ends a command in one line on
stderr with exit status 130; `dataset` says how many shards it kept in DIR/parts for a rerun to build on.

`concepts` collects the residual stream after block L of every patch token under FOLDER (in shards kept in
DIR/tokens, resumable like `dataset`'s parts), trains a TopK sparse autoencoder on all but a held-out tenth of the
images, and writes DIR/concepts.safetensors, DIR/concepts.json and DIR/contact_sheet.png (vit_core.concepts;
docs/spec/interface.md, "Concepts").

`compare` runs two models over FOLDER in one pass (each image decoded once) and writes DIR/a and DIR/b (what
`dataset` writes for each model alone, bit for bit), DIR/compare.csv, .npz, .json and .png (vit_core.compare;
docs/spec/interface.md, "Two models"); its shards are kept in DIR/parts, DIR/a/parts and DIR/b/parts, resumable and run
on Ray as `dataset`'s. With `--concepts-layer L` it also trains one concept dictionary on both models' tokens after
block L and writes DIR/concepts, with the features only in A, only in B and shared.

`dataset` and `merge` end with the count of images and, with labels, the top-1 accuracy and the logit lens's best
layer; with `--explain`, `analyze` prints under each image how many tests each relevance map beats random under,
and `dataset` each map's share of images where it does. `--engine ray` keeps what Ray itself prints in this
process (its start-up warnings, its C++ core's error lines) in DIR/parts/ray.log.

Output names of `analyze`: <name> is the image's stem (`photo.jpg` -> `photo.npz`, `photo.json`). When
different inputs share a stem, ignoring case (`a/photo.jpg` and `b/photo.png`, or `a/photo.jpg` and
`b/photo.jpg`), each of them is named `<stem>-<8 hex digits>`, the digits being the start of the SHA-256
of the input's absolute path, so the same command names the same files again (`photo-3f2a91c0.npz`).
The `.json` records the image it came from under "image", and the device under "device".

The installed `vit-lens` command (dashboard/cli.py) is this parser plus a `dashboard` subcommand:
a subcommand added here (`build_parser` and `COMMANDS`) appears there too.
"""

from __future__ import annotations

from .runtime import no_triton_without_a_gpu, one_blas_thread

one_blas_thread()  # before numpy is imported, which the imports below do
no_triton_without_a_gpu()  # before torch is

import argparse
import atexit
import contextlib
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NoReturn, TextIO

from . import arguments, settings
from .errors import ViTLensError
from .lenses import BUILTIN as BUILTIN_LENSES  # the lens names and their checks import no torch
from .runtime import configure_threads, cpu_quota

# Nothing that imports torch, timm or numpy at module level: `--help` and a mistyped option answer at once
# (importing timm costs seconds). The subcommands import what they run (`_core`); the parser's defaults are
# spelled out below, and tests/unit/test_cli.py checks them against the modules that define them.
if TYPE_CHECKING:
    from .compare import CompareRun, Explain
    from .dataset import DatasetResult, PartStore, RunPlan, Shard
    from .images.files import OutputFolder  # the images package imports numpy and Pillow
    from .loading.model import LoadedModel

EXIT_FAILURES = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
ENGINES = ("local", "ray")
RAY_EXTRA = 'pip install "vit-lens[ray]"'
RAY_LOG = "ray.log"  # in DIR/parts: what Ray itself prints while it runs the shards, away from the command's lines
TABLE_FORMATS = ("csv", "parquet")  # vit_core.dataset.TABLE_FORMATS, without importing the dataset package here
DEFAULT_MODEL = "vit_base_patch16_224"  # vit_core.loading.DEFAULT_MODEL
TEACHING_MODEL = "vit-lens/shapes-vit"  # vit_core.loading.TEACHING_MODEL: the model that works offline
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"  # vit_core.runtime.devices.DEVICE_CHOICES
DEFAULT_STEPS = 10  # vit_core.explain.DEFAULT_STEPS
FAITHFULNESS_TESTS = ("deletion_auc", "insertion_auc", "pixel_deletion_auc", "pixel_insertion_auc", "srg",
                      "saco")  # vit_core.explain.FAITHFULNESS_TESTS
EXPORT_TESTS = ("deletion_auc", "insertion_auc")  # vit_core.export.EXPORT_TESTS
NO_IMAGES = "There are no images to analyse."
TOO_FEW_FOR_CONCEPTS = "learning concepts needs at least 2 images (one is held out)."
CONCEPTS_K, CONCEPTS_EPOCHS, CONCEPTS_MEMORY_GB = 32, 4, 4.0  # `concepts`' defaults (vit_core.concepts.learn: MEMORY_BUDGET)
CIRCUIT_IMAGES = 64  # vit_core.concepts.circuit.CIRCUIT_IMAGES, said here so that --help imports no torch
MAX_LAYERS = 3  # vit_core.concepts.circuit.MAX_LAYERS: parsing --layer imports no torch either


def default_workers() -> int:
    """Decoding processes for `dataset`: one CPU stays with the forward pass, at most 8 (0 on one CPU: decode inline)."""
    return max(0, min(8, cpu_quota() - 1))


def build_parser(prog: str = "python -m vit_core") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The command-line parser and its subcommands (returned so that `vit-lens` can add `dashboard`)."""
    parser = argparse.ArgumentParser(prog=prog, description="ViT Lens: analyse images with a timm ViT.")
    parser.set_defaults(program=prog.split()[-1])  # what the one-line failures start with: vit-lens, vit_core
    commands = parser.add_subparsers(dest="command", required=True)

    analyze = commands.add_parser("analyze", help="capture and analyse images; write .npz + .json per image")
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE",
                         help="images; results are named after each stem, or <stem>-<8 hex digits of a hash of "
                              "its absolute path> when inputs share a stem")
    _add_model_arguments(analyze)
    analyze.add_argument("--topk", type=_positive, default=5, help="predictions in the .json (default 5)")
    analyze.add_argument("--explain", action="store_true",
                         help="add relevance maps, logit lens, token norms and deletion/insertion curves")
    analyze.add_argument("--target", metavar="K",
                         help="with --explain: the class to explain, an index or a label (default: the top-1)")
    _add_steps_argument(analyze)
    analyze.add_argument("--mask", nargs="+", type=Path, metavar="MASK",
                         help="with --explain: one object mask per IMAGE, in the same order (black and white, the image's "
                              "size, the object white): adds the pointing game, relevance mass and rank accuracy")
    analyze.add_argument("--tests", type=_tests, default=EXPORT_TESTS, metavar="all|T[,T...]",
                         help="with --explain: the faithfulness tests to run, 'all' or a comma-separated list of "
                              f"{', '.join(FAITHFULNESS_TESTS)} (default: {','.join(EXPORT_TESTS)})")
    analyze.add_argument("--lens", action="append", default=[], metavar="FILE.py|MODULE|NAME",
                         help="run the lenses a Python file or module declares (@lens from vit_core.lenses), or a "
                              f"built-in lens by name ({', '.join(BUILTIN_LENSES)}), on each image: their arrays go "
                              "into the .npz as <lens>.<key>; repeatable")

    dataset = commands.add_parser("dataset", help="analyse every image under a folder; write dataset.npz, dataset.json "
                                  "and mean_attention_distance.png")
    dataset.add_argument("folder", type=Path, metavar="FOLDER",
                         help="images under it, recursively; subfolders that name a class (index, label or ImageNet "
                              "synset id) give the true labels")
    _add_model_arguments(dataset)
    dataset.add_argument("--batch-size", type=_positive, metavar="B",
                         help="images per decoded batch (default: 32 on a CPU, 64 on a GPU)")
    dataset.add_argument("--limit", type=_positive, metavar="N", help="only the first N images in sorted order")
    workers = default_workers()  # read once: the default and its help
    dataset.add_argument("--workers", type=_not_negative, metavar="W",
                         help=f"processes that decode images, 0: in this one (default: one fewer than the CPUs this "
                              f"process may use, at most 8; {workers} here); with --engine ray, Ray's decoding workers "
                              "(default: the cluster's CPUs the model workers leave)")
    dataset.add_argument("--explain", action="store_true",
                         help="add each image's deletion / insertion AUC of every relevance method and a random "
                              "order, and their means")
    _add_steps_argument(dataset)
    dataset.add_argument("--tests", type=_tests, default=EXPORT_TESTS, metavar="all|T[,T...]",
                         help="with --explain: the faithfulness tests per image, 'all' or a comma-separated list of "
                              f"{', '.join(FAITHFULNESS_TESTS)} (default: {','.join(EXPORT_TESTS)})")
    dataset.add_argument("--masks", type=Path, metavar="DIR",
                         help="with --explain: object masks, DIR/<the image's path under FOLDER, any image suffix> "
                              "(black and white, the image's size, the object white): adds the pointing game, relevance "
                              "mass and rank accuracy of every method and of a random map")
    dataset.add_argument("--lens", action="append", default=[], metavar="FILE.py|MODULE|NAME",
                         help="run these lenses (as analyze's --lens) on every image: the mean and std over images of "
                              "each lens array of one shape on every image go into dataset.npz as <lens>.<key> and "
                              "<lens>.<key>_std; repeatable")
    _add_table_argument(dataset)
    shards = dataset.add_mutually_exclusive_group()
    shards.add_argument("--shards", type=_positive, metavar="N",
                        help="cut the run into N shards, each kept in DIR/parts when done, so that a rerun of the same "
                             "command skips them (default: one per 1,000 images, or the count DIR/parts was made with)")
    shards.add_argument("--shard", metavar="I/N",
                        help="analyse only shard I of N (1 <= I <= N): a deterministic 1/N of the images; run the "
                             "others anywhere, then `merge` their output folders (or share one DIR: the last one "
                             "done writes the results)")
    dataset.add_argument("--engine", choices=ENGINES, default="local",
                         help="local: this process (default); ray: Ray Data workers, on this machine or a cluster "
                              f"(needs {RAY_EXTRA})")
    dataset.add_argument("--address", metavar="ADDR",
                         help="with --engine ray: the cluster to join (e.g. auto, or ray://head:10001); default: start "
                              "Ray on this machine")
    dataset.add_argument("--gpus-per-worker", type=_not_negative_float, metavar="G",
                         help="with --engine ray: GPUs per model worker, fractions allowed (default 1 where the cluster "
                              "has GPUs, else 0)")
    dataset.add_argument("--model-workers", type=_positive, metavar="M",
                         help="forwards at once on a CPU, each at one torch thread: the same values whatever M (default: "
                              f"$VIT_LENS_MODEL_WORKERS, else the CPUs this process may use, {cpu_quota()} here); with "
                              "--engine ray: model workers, each loads the model once (default: the cluster's GPUs / G, "
                              "or 1 without GPUs)")

    concepts = commands.add_parser("concepts", help="learn a TopK sparse autoencoder's features (concepts) of one "
                                   "layer from a folder; write concepts.safetensors, concepts.json and a contact sheet")
    concepts.add_argument("folder", type=Path, metavar="FOLDER", help="images under it, recursively")
    _add_model_arguments(concepts)
    concepts.add_argument("--layer", type=_layers, required=True, metavar="L[,L...]",
                          help="the residual stream after block L (0-based) is what the features describe; 2 or 3 "
                               "increasing blocks (e.g. 1,2,3): one dictionary per block into DIR/layer-L from one "
                               "collection, and DIR/circuit.json, which features of one block feed which of the next")
    concepts.add_argument("--circuit-images", type=_positive, default=None, metavar="N",
                          help="with several blocks: the circuit is measured on the first N held-out images (default "
                               f"{CIRCUIT_IMAGES})")
    concepts.add_argument("--steering-images", type=_positive, default=None, metavar="N",
                          help="the steerable share is measured on the first N held-out images (default: all of them; "
                               "each costs a pass of the later blocks per feature firing on it)")
    concepts.add_argument("--features", type=_positive, metavar="F",
                          help="the autoencoder's features (default: 8 x the model's width)")
    concepts.add_argument("--k", type=_positive, default=CONCEPTS_K, metavar="K",
                          help=f"features active per token (default {CONCEPTS_K})")
    concepts.add_argument("--epochs", type=_positive, default=CONCEPTS_EPOCHS, metavar="E",
                          help=f"passes over the training tokens (default {CONCEPTS_EPOCHS})")
    concepts.add_argument("--seed", type=_not_negative, default=0, metavar="S",
                          help="the training's seed: the same seed, tokens and threads give the same bits (default 0)")
    concepts.add_argument("--lr", type=_not_negative_float, metavar="RATE",
                          help="Adam's learning rate (default: the rule of docs/spec/analyses.md, from F, the batch "
                               "and the run's steps)")
    concepts.add_argument("--stability", action="store_true",
                          help="also train at seed S + 1 and report how many features both seeds find (concepts.json: "
                               "stability, stable_share)")
    concepts.add_argument("--batch-size", type=_positive, metavar="B", help="images per decoded batch (default: 32 on a "
                          "CPU, 64 on a GPU)")
    concepts.add_argument("--limit", type=_positive, metavar="N", help="only the first N images in sorted order")
    concepts.add_argument("--workers", type=_not_negative, metavar="W",
                          help=f"processes that decode images, 0: in this one (default: one fewer than the CPUs "
                               f"this process may use, at most 8; {workers} here); with --engine ray, Ray's decoding "
                               "workers")
    concepts.add_argument("--memory-gb", type=_not_negative_float, default=CONCEPTS_MEMORY_GB, metavar="G",
                          help="training tokens held in memory up to G GiB; beyond, they are read from DIR/tokens one "
                               f"chunk at a time (default {CONCEPTS_MEMORY_GB:g})")
    concepts_shards = concepts.add_mutually_exclusive_group()
    concepts_shards.add_argument("--shards", type=_positive, metavar="N",
                                 help="collect in N shards, each kept in DIR/tokens when done (a rerun skips them)")
    concepts_shards.add_argument("--shard", metavar="I/N",
                                 help="collect only shard I of N into DIR/tokens; the run that finds every shard there "
                                      "(one shared DIR) trains")
    _add_ray_arguments(concepts)

    merge = commands.add_parser("merge", help="merge the parts of a `dataset` run's shards (run on several machines) "
                                "into dataset.npz, dataset.json, the figure and the tables")
    merge.add_argument("parts", nargs="+", type=Path, metavar="PARTS",
                       help="output folders of `dataset --shard I/N` runs (or their parts/ folders)")
    merge.add_argument("--out", type=Path, required=True, help="where the merged files go")
    _add_table_argument(merge)

    _add_compare_parser(commands)

    web = commands.add_parser("export-web", help="write the lesson as a static site whose model runs in each student's "
                              "browser (ONNX Runtime Web): serve the folder from any static host")
    web.add_argument("--model", default=TEACHING_MODEL,
                     help=f"timm ViT name or {TEACHING_MODEL} (default: {TEACHING_MODEL}, bundled, offline); its graph "
                          "must fit the size a class's browsers load (100 MB)")
    web_source = web.add_mutually_exclusive_group()
    web_source.add_argument("--weights", type=Path, help="local weights file (.safetensors, .pth/.pt/.bin, .npz)")
    web_source.add_argument("--random-init", action="store_true", help="no pretrained weights: random init (seed 0)")
    web.add_argument("--labels", type=Path, help="label file (one class name per line, or JSON)")
    web.add_argument("--out", type=Path, required=True, help="the site's folder (index.html and what it loads)")
    web.set_defaults(device="cpu")  # the graph is written on the CPU whatever runs it later
    return parser, commands


def _add_compare_parser(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser("compare", help="run two models over every image under a folder and compare them: "
                                  "DIR/a and DIR/b as `dataset` writes them, compare.csv, .npz, .json and .png")
    compare.add_argument("folder", type=Path, metavar="FOLDER",
                         help="images under it, recursively; subfolders that name a class give the true labels")
    _add_model_arguments(compare)
    compare.add_argument("--model-b", metavar="B", help="model B's name (default: --model, two checkpoints of one "
                         "architecture: give --weights-b or --random-init-b)")
    source_b = compare.add_mutually_exclusive_group()
    source_b.add_argument("--weights-b", type=Path, help="model B's local weights file")
    source_b.add_argument("--random-init-b", action="store_true", help="model B with random weights (seed 0, or --seed-b)")
    compare.add_argument("--seed-b", type=_not_negative, metavar="S",
                         help="with --random-init-b: B's random init under seed S (another than A's 0 compares two random "
                              "inits of one architecture)")
    compare.add_argument("--explain", action="store_true",
                         help="add each model's judge (every relevance method's deletion / insertion AUC and verdict "
                              "against a random order, as dataset --explain) and say which verdicts changed")
    _add_steps_argument(compare)
    compare.add_argument("--tests", type=_tests, default=EXPORT_TESTS, metavar="all|T[,T...]",
                         help=f"with --explain: the faithfulness tests per image (default: {','.join(EXPORT_TESTS)})")
    compare.add_argument("--batch-size", type=_positive, metavar="B",
                         help="pairs of images per decoded batch (default: 8 on a CPU, 64 on a GPU)")
    compare.add_argument("--limit", type=_positive, metavar="N", help="only the first N images in sorted order")
    compare.add_argument("--workers", type=_not_negative, metavar="W",
                         help=f"processes that decode images, 0: in this one (default: one fewer than the CPUs this "
                              f"process may use, at most 8; {default_workers()} here); with --engine ray, Ray's "
                              "decoding workers (default: the cluster's CPUs the model workers leave)")
    _add_table_argument(compare)
    compare.add_argument("--concepts-layer", type=_not_negative, metavar="L",
                         help="also learn ONE concept dictionary on both models' tokens after block L (each normalised "
                              f"by its own statistics; `concepts`' trainer, 8 x the width features, k = {CONCEPTS_K}, "
                              f"{CONCEPTS_EPOCHS} epochs, seed 0) and list the features only in A, only in B and shared "
                              "(DIR/concepts, compare.json's \"concepts\"); --engine local only")
    shards = compare.add_mutually_exclusive_group()
    shards.add_argument("--shards", type=_positive, metavar="N",
                        help="cut the run into N shards, each kept when done, so that a rerun skips them")
    shards.add_argument("--shard", metavar="I/N", help="run only shard I of N into DIR; the run that finds every shard "
                        "there (one shared DIR) writes the results")
    _add_ray_arguments(compare, "both models in each model worker")


def _add_ray_arguments(command: argparse.ArgumentParser, model_worker: str = "each loads the model once") -> None:
    """--engine, --address, --gpus-per-worker and --model-workers (Ray's), as `concepts` and `compare` offer them."""
    command.add_argument("--engine", choices=ENGINES, default="local",
                         help=f"local: this process (default); ray: Ray Data workers (needs {RAY_EXTRA})")
    command.add_argument("--address", metavar="ADDR", help="with --engine ray: the cluster to join (default: start Ray "
                         "on this machine)")
    command.add_argument("--gpus-per-worker", type=_not_negative_float, metavar="G",
                         help="with --engine ray: GPUs per model worker")
    command.add_argument("--model-workers", type=_positive, metavar="M",
                         help=f"with --engine ray: model workers, {model_worker}")


def _add_model_arguments(command: argparse.ArgumentParser) -> None:
    """--model, --weights | --random-init, --labels, --out and --device: the same on every subcommand."""
    command.add_argument("--model", default=DEFAULT_MODEL,
                         help=f"timm model name, hf-hub: id or vit-lens/shapes-vit (default {DEFAULT_MODEL})")
    source = command.add_mutually_exclusive_group()
    source.add_argument("--weights", type=Path, help="local weights file (.safetensors, .pth/.pt/.bin, .npz)")
    source.add_argument("--random-init", action="store_true", help="no pretrained weights: random init (seed 0)")
    command.add_argument("--labels", type=Path, help="label file (one class name per line, or JSON)")
    command.add_argument("--out", type=Path, default=Path("."), help="output folder (default: current)")
    command.add_argument("--device", default="auto", metavar="DEVICE",
                         help=f"where the model runs: {DEVICE_CHOICES} (default auto: CUDA, then Apple MPS, then CPU)")


def _add_table_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--table", choices=TABLE_FORMATS, default="csv",
                         help="the per-image table's format: images.csv (default) or images.parquet")


def _add_steps_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument("--steps", type=_at_least_two, default=DEFAULT_STEPS, metavar="S",
                         help=f"with --explain: steps of the deletion and insertion curves (default {DEFAULT_STEPS})")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs at least 1, got {value}")
    return value


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"can't be negative, got {value}")
    return value


def _layers(text: str) -> tuple[int, ...]:
    """--layer: one block, or up to MAX_LAYERS increasing blocks separated by commas."""
    layers = tuple(_not_negative(part) for part in text.split(","))
    if not 1 <= len(layers) <= MAX_LAYERS or any(b <= a for a, b in zip(layers, layers[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"give 1 to {MAX_LAYERS} blocks in increasing order, got {text}")
    return layers


def _not_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"can't be negative, got {text}")
    return value


def _tests(text: str) -> tuple[str, ...]:
    if text.strip() == "all":
        return FAITHFULNESS_TESTS
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in chosen if t not in FAITHFULNESS_TESTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown test(s) {', '.join(unknown) or text!r}; choose 'all' or among "
                                         f"{', '.join(FAITHFULNESS_TESTS)}")
    return chosen


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"needs at least 2 steps, got {value}")
    return value


def output_names(paths: list[Path]) -> list[str]:
    """The name of each input's results (without .npz / .json), in the order of `paths`.

    The stem where no other input (a different absolute path) has the same stem, ignoring case (a
    case-insensitive file system would otherwise merge them); else the stem, '-' and the first 8 hex
    digits of the SHA-256 of the absolute path, more digits in the unlikely case that is not enough.
    """
    absolute = [os.path.abspath(p) for p in paths]
    holders: dict[str, set[str]] = {}  # case-folded stem -> the absolute paths that have it
    for path, where in zip(paths, absolute, strict=True):
        holders.setdefault(path.stem.casefold(), set()).add(where)
    for digits in (8, 16, 64):
        names = [path.stem if len(holders[path.stem.casefold()]) == 1
                 else f"{path.stem}-{hashlib.sha256(where.encode()).hexdigest()[:digits]}"
                 for path, where in zip(paths, absolute, strict=True)]
        owner = {}  # case-folded name -> the absolute path it names
        if all(owner.setdefault(name.casefold(), where) == where for name, where in zip(names, absolute, strict=True)):
            return names
    raise AssertionError("SHA-256 prefixes of 64 digits collided")  # pragma: no cover


_program = "vit_core"  # the command's name, set by `run` from the parser that read the arguments


def _fail(message: str) -> None:
    print(f"{_program}: {message}", file=sys.stderr)


def _unreachable(path: Path) -> str | None:
    """Why `path` can't be opened ("No such file or directory"), or None. Checked before any model is loaded: a
    mistyped name is answered at once, not after seconds of importing torch and loading weights."""
    try:
        os.stat(path)
    except OSError as e:
        return f"{e.strerror or e}."
    return None


def _inputs_missing(args: argparse.Namespace) -> bool:
    """Says in one line each whether --weights or --labels names a file that isn't there (True: the command stops)."""
    missing = False
    for option, path in (("--weights", args.weights), ("--labels", args.labels)):
        why = path is not None and _unreachable(path)
        if why:
            _fail(f"{option} {path}: {why}")
            missing = True
    return missing


def _refused_before_loading(args: argparse.Namespace) -> bool:
    """Says in one line each whether --model names no model or --out can't be the output folder (True: the command
    stops): before torch is imported, so these mistakes are answered at once (vit_core.arguments)."""
    refused = False
    why = arguments.model_refused(args.model)
    if why:
        _fail(f"{args.model}: {why}")
        refused = True
    why = arguments.out_refused(args.out)
    if why:
        _fail(f"--out {args.out}: {why}")
        refused = True
    if getattr(args, "random_init", False) and args.model == arguments.TEACHING_MODEL:  # as --weights is: never ignored
        _fail(f"--random-init: {args.model} comes with its own weights and has no random init; for a random ViT, name "
              "a timm architecture (e.g. --model vit_tiny_patch16_224 --random-init).")
        refused = True
    return refused


def _shard_parsed(args: argparse.Namespace) -> bool:
    """`--shard I/N` read into `args.shard` (None without it); False after a one-line failure for one that isn't."""
    from .dataset import ShardError, parse_shard

    try:
        args.shard = parse_shard(args.shard) if args.shard else None
    except ShardError as e:
        _fail(str(e))
        return False
    return True


def _too_few_images(folder: Path, needed: int, message: str) -> bool:
    """Says in one line whether FOLDER holds fewer than `needed` images (True: the command stops), before torch is
    imported; the run's listing (dataset.plan_run) says the same of what remains after --limit and the run's own
    files."""
    from .images.listing import has_images  # numpy and Pillow, no torch

    if has_images(folder, needed):
        return False
    _fail(f"{folder}: {message}")
    return True


def _load(args: argparse.Namespace) -> tuple[LoadedModel, OutputFolder] | None:
    """The model the arguments name, on their device, and the output folder made and opened (refused if it is a
    symlink: results land only in the folder named); None after saying why not."""
    from .errors import OfflineError
    from .images.files import OutputFolder
    from .loading import load_model
    from .runtime.devices import resolve_device

    configure_threads()  # imports torch: only once the arguments are known to be usable
    try:
        device = resolve_device(args.device)  # before the model: a bad device costs no load
    except ViTLensError as e:
        _fail(f"--device: {e}")
        return None
    try:
        loaded = load_model(args.model, weights=args.weights, pretrained=not args.random_init, labels=args.labels,
                            device=device)
    except OfflineError as e:  # its advice names the bundled model; here that takes the option that picks it
        _fail(f"{args.model}: {e} Add --model {TEACHING_MODEL} to use it.")
        return None
    except (ViTLensError, OSError) as e:
        _fail(f"{args.model}: {e}")
        return None
    try:
        if not args.out.is_symlink():  # a link is refused by OutputFolder, not made
            args.out.mkdir(parents=True, exist_ok=True)
        out = OutputFolder(args.out)
    except OSError as e:
        _fail(f"--out: {_os_reason(e)}")
        return None
    return loaded, out


def _with_model(args: argparse.Namespace,
                run: Callable[[argparse.Namespace, LoadedModel, OutputFolder], int]) -> int:
    """`run(args, model, output folder)` once `_load` has the model and the folder open; its exit status."""
    opened = _load(args)
    if opened is None:
        return EXIT_FAILURES
    loaded, out = opened
    with out:
        return run(args, loaded, out)


def analyze(args: argparse.Namespace) -> int:
    if not args.explain and (args.target is not None or args.steps != DEFAULT_STEPS or args.mask
                             or args.tests != EXPORT_TESTS):
        _fail("--target, --steps, --mask and --tests need --explain")
        return EXIT_FAILURES
    if args.mask and len(args.mask) != len(args.images):
        _fail(f"--mask: {len(args.mask)} mask(s) for {len(args.images)} image(s); give one per image, in the same order")
        return EXIT_FAILURES
    if _inputs_missing(args) or _refused_before_loading(args) or not _lenses_loaded(args):
        return EXIT_FAILURES
    why = arguments.target_refused(args.target, args.model, args.labels)
    if why:
        _fail(f"--target: {why}")
        return EXIT_FAILURES
    given = len(args.images)
    args.images, args.mask = _present(args.images, args.mask)
    if not args.images:
        return EXIT_FAILURES
    status = _with_model(args, _analyze_each)
    return EXIT_FAILURES if len(args.images) < given else status


def _present(images: list[Path], masks: list[Path] | None) -> tuple[list[Path], list[Path] | None]:
    """The images (and their masks) that are there, the others said in one line each: before the model loads, so a
    mistyped name is answered at once, and the images that are there are still analysed."""
    kept, kept_masks = [], []
    for image, mask in zip(images, masks or [None] * len(images), strict=True):
        why = _unreachable(image)
        if why:
            _fail(f"{image}: {why}")
            continue
        if image.is_dir():
            _fail(f"{image}: a folder; analyze reads image files (for every image in a folder: vit-lens dataset "
                  f"{image})")
            continue
        why = mask is not None and _unreachable(mask)
        if why:
            _fail(f"{image}: --mask {mask}: {why}")
            continue
        kept.append(image)
        kept_masks.append(mask)
    return kept, kept_masks if masks else None


def _lenses_loaded(args: argparse.Namespace) -> bool:
    """Imports the --lens files into `args.lenses` before any model loads; one line and False when one can't be used."""
    from .lenses import LensError, lenses_of

    try:
        args.lenses = lenses_of(args.lens)
    except LensError as e:
        _fail(str(e))
        return False
    return True


def _steps_refused(args: argparse.Namespace, loaded: LoadedModel) -> bool:
    """Says in one line whether --steps asks for more steps than the model has patches (True: the command stops): a
    curve removes at least one patch per step, and each step holds a copy of the image in memory."""
    patches = loaded.geometry.num_patches
    if args.explain and args.steps > patches:
        _fail(f"--steps {args.steps}: {args.model} has {patches} patches, so at most {patches} steps")
        return True
    return False


def _analyze_each(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """`analyze`'s loop: each image read (a regular file, at most images.MAX_FILE_BYTES), analysed and written; a failure
    is one line and the next image goes on; a result written is one line on stdout (`_result_line`). Returns the
    exit status."""
    if _steps_refused(args, loaded):
        return EXIT_FAILURES
    from .capture import run_with_capture
    from .export import analysis_arrays, explanation_export, json_bytes, npz_bytes, summary
    from .images import MAX_FILE_BYTES, load_image
    from .images.files import read_input
    from .lenses import sites_of
    from .runtime.devices import describe_device

    device_name = describe_device(loaded.device)
    failures = 0
    masks = args.mask or [None] * len(args.images)
    for path, name, mask_path in zip(args.images, output_names(args.images), masks, strict=True):
        try:
            image = load_image(read_input(path, MAX_FILE_BYTES), loaded.decode_min_side)  # an unreadable path: its own line
            mask = None if mask_path is None else _read_mask(mask_path)
            cap = run_with_capture(loaded, image, sites=sites_of(args.lenses))
            arrays, described = analysis_arrays(loaded, cap), {"image": str(path), **summary(loaded, cap, args.topk),
                                                           "device": device_name}
            if args.lenses:
                lens_arrays, described["lenses"], failed = _lens_results(args.lenses, cap)
                arrays |= lens_arrays
                for sentence in failed:
                    failures += 1
                    _fail(f"{path}: {sentence}")
            if args.explain:
                extra_arrays, extra_summary = explanation_export(loaded, cap, image, args.target, args.steps,
                                                                 mask=mask, tests=args.tests)
                arrays, described = {**arrays, **extra_arrays}, {**described, **extra_summary}
            out.write(f"{name}.npz", npz_bytes(arrays))
            out.write(f"{name}.json", json_bytes(described))
            print(result_line(path, prediction_text(loaded, cap), [args.out / f"{name}.npz", args.out / f"{name}.json"]),
                  flush=True)
            if args.explain:
                print(f"  {trust_line(described['verdicts'])}", flush=True)
        except ViTLensError as e:
            failures += 1
            _fail(f"{path}: {e}")
        except OSError as e:  # an output that can't be written, a file gone since: this image only
            failures += 1
            _fail(f"{path}: {_os_reason(e, path)}")
    return EXIT_FAILURES if failures else 0


def _lens_results(lenses: list, cap) -> tuple[dict, list[dict], list[str]]:
    """Every lens's arrays on `cap` (`<lens>.<key>`), the .json's "lenses" (each with "failed": its sentence when it
    raised) and the sentences of those that failed: one lens failing leaves the others' arrays."""
    from .lenses import LensError, arrays_of, summary

    arrays, described, failed = {}, summary(lenses), []
    for one, entry in zip(lenses, described, strict=True):
        try:
            arrays |= arrays_of(one, cap)
        except LensError as e:
            entry["failed"] = str(e)
            failed.append(str(e))
    return arrays, described, failed


def prediction_text(loaded: LoadedModel, cap) -> str:
    """The top-1 class with its probability, 'circle (93.1%)'; for a model without a classifier head (DINOv2, a
    SigLIP image tower), whose outputs are pooled features and not classes, says so instead."""
    from .analyses import top_k

    if not loaded.geometry.num_classes:
        return f"no classifier head (the model outputs {cap.logits.shape[-1]} pooled features, not classes)"
    top = top_k(cap.logits, loaded.labels, 1)[0]
    return f"{top.label} ({top.prob:.1%})"


def result_line(image: Path, prediction: str, written: list[Path]) -> str:
    """`analyze`'s line on stdout for an image done: the image, its prediction, the files written."""
    return f"{image}: {prediction} -> {', '.join(map(str, written))}"


def trust_line(verdicts: dict[str, dict[str, dict]]) -> str:
    """`analyze --explain`'s line under an image's: from the .json's "verdicts" (test -> method -> {"verdict", ...}),
    each method with the number of tests under which its map beats the random baseline, most first, and the tests
    under which it is worse than random."""
    from .explain.perturbation import BEATS, WORSE

    tests = list(verdicts)
    methods = list(dict.fromkeys(m for by_method in verdicts.values() for m in by_method))
    beaten = {m: sum(verdicts[t].get(m, {}).get("verdict") == BEATS for t in tests) for m in methods}
    parts = []
    for m in sorted(methods, key=lambda m: -beaten[m]):
        worse = [t for t in tests if verdicts[t].get(m, {}).get("verdict") == WORSE]
        parts.append(f"{m} {beaten[m]}" + (f" (worse than random: {', '.join(worse)})" if worse else ""))
    return f"which to trust, tests where the map beats random of {len(tests)} ({', '.join(tests)}): {', '.join(parts)}"


def folder_lines(result: DatasetResult) -> list[str]:
    """What `dataset` and `merge` say after the count of images: with labels, the top-1 accuracy and the logit lens's
    best layer; with explanations, each method's share of images where its map beats random (dataset.json has all)."""
    lines = []
    if result.accuracy is not None:
        correct = round(result.accuracy * result.num_labelled)
        line = f"top-1 accuracy {result.accuracy:.1%} ({correct:,} of {result.num_labelled:,} labelled images)"
        lens = result.logit_lens_accuracy
        if lens is not None and len(lens):
            row = int(lens.argmax())  # row 0: the embeddings; row b + 1: the tokens after block b
            where = "on the embeddings" if row == 0 else f"after block {row - 1}"
            line += f"; logit lens best {where} ({float(lens[row]):.1%})"
        lines.append(line)
    judged = result.which_to_trust()
    if judged is not None and judged.tests:
        share = {m: sum(judged.beats_share[t].get(m, 0.0) for t in judged.tests) / len(judged.tests)
                 for m in judged.methods}
        best_first = ", ".join(f"{m} {share[m]:.0%}" for m in sorted(judged.methods, key=lambda m: -share[m]))
        lines.append(f"which to trust, images where the map beats random (mean over {', '.join(judged.tests)}): "
                     f"{best_first}")
    return lines


def _read_mask(path: Path):
    """The object mask (H, W) bool of `path`; an unusable one raises ImageError naming the mask, not the image."""
    from .explain import mask_from_file
    from .images import MAX_FILE_BYTES
    from .images.files import read_input

    try:
        return mask_from_file(read_input(path, MAX_FILE_BYTES))
    except ViTLensError as e:
        raise type(e)(f"--mask {path}: {e}") from e


def _os_reason(error: OSError, named: Path | None = None) -> str:
    """One line for an OSError: the file it concerns (unless that is `named`, which the line names already), and
    what the system said."""
    if error.filename and str(error.filename) != str(named):
        return f"{error.filename}: {error.strerror or error}."
    return f"{error.strerror or error}."


def dataset(args: argparse.Namespace) -> int:
    if not args.explain and (args.steps != DEFAULT_STEPS or args.tests != EXPORT_TESTS or args.masks):
        _fail("--steps, --tests and --masks need --explain")
        return EXIT_FAILURES
    if args.masks and not args.masks.is_dir():
        _fail(f"--masks {args.masks}: not a folder")
        return EXIT_FAILURES
    if not args.folder.is_dir():
        _fail(f"{args.folder}: not a folder")
        return EXIT_FAILURES
    if _inputs_missing(args) or _refused_before_loading(args):
        return EXIT_FAILURES
    if _too_few_images(args.folder, 1, NO_IMAGES) or not _engine_options_checked(args) or not _lenses_loaded(args):
        return EXIT_FAILURES
    return _with_model(args, _dataset_run)


def _engine_options_checked(args: argparse.Namespace) -> bool:
    """The engine options `dataset`, `concepts` and `compare` share, checked before the model loads (each refusal one
    line on stderr); `args.shard` parsed into (index, count) in place. Returns whether they can be used."""
    ray_only = [option for option, value in (("--address", args.address), ("--gpus-per-worker", args.gpus_per_worker),
                                             ("--model-workers", args.model_workers if args.command != "dataset" else None))
                if value is not None]
    if args.engine != "ray" and ray_only:
        _fail(f"{', '.join(ray_only)} {'needs' if len(ray_only) == 1 else 'need'} --engine ray")
        return False
    if args.command == "concepts" and args.engine == "ray" and len(args.layer) > 1:
        _fail(f"--layer {','.join(map(str, args.layer))}: several blocks are collected by --engine local only")
        return False
    if args.command == "compare" and args.engine == "ray" and args.concepts_layer is not None:
        _fail(f"--concepts-layer {args.concepts_layer}: the two models' tokens are collected by --engine local only")
        return False
    if not _shard_parsed(args):
        return False
    if args.engine == "ray":
        from .dataset.ray_engine import RayMissingError, import_ray

        try:
            import_ray()  # before the model: a missing extra costs no load
        except RayMissingError as e:
            _fail(str(e))
            return False
    return True


def _dataset_run(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """`dataset` once the model is loaded: the run planned (its shards, the manifest checked or written), the shards
    not done yet analysed (each one's part written when done), and when every shard is done the files written."""
    from .dataset import DatasetError, PartStore, manifest_of, plan_run

    if _steps_refused(args, loaded):
        return EXIT_FAILURES
    store = PartStore(args.out)
    try:
        found = store.manifest()
        count = args.shard[1] if args.shard else args.shards
        plan = plan_run(loaded, args.folder, limit=args.limit, num_shards=count, outputs=args.out,
                        resumed_shards=(found or {}).get("shards"))
        if not plan.paths:
            raise DatasetError(NO_IMAGES)
        manifest = manifest_of(loaded, plan, weights_file=args.weights, labels_file=args.labels, limit=args.limit,
                               explain=args.explain, steps=args.steps, tests=args.tests, masks=args.masks,
                               lenses=args.lenses)
        store.open(manifest)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return EXIT_FAILURES
    asked = [plan.shards[args.shard[0] - 1]] if args.shard else list(plan.shards)
    done = store.done(plan.shards)
    todo = [shard for shard in asked if shard.number not in done]
    if len(todo) < len(asked):
        print(f"{len(asked) - len(todo)} of {len(asked)} shards already done in {store.path}: skipped", flush=True)
    try:
        _run_shards(args, loaded, plan, store, todo, manifest["files_sha256"])
    except KeyboardInterrupt:  # each part is written whole or not at all: the ones there are a rerun's head start
        kept = len(store.done(plan.shards))
        _fail(f"interrupted; {kept} of {len(plan.shards)} shards kept in {store.path}, rerun to finish")
        return EXIT_INTERRUPTED
    except ViTLensError as e:
        ray_log = f" (Ray's own lines: {store.path / RAY_LOG})" if args.engine == "ray" else ""
        _fail(f"{args.folder}: {e}{ray_log}")
        return EXIT_FAILURES
    except OSError as e:  # a part that can't be written (a full disk): the shards written so far stay
        _fail(_os_reason(e))
        return EXIT_FAILURES
    if len(store.done(plan.shards)) < len(plan.shards):
        return _shards_written(store, plan, todo, manifest["files_sha256"])
    return _write_merged(args, [store], out, str(args.folder))


def _run_shards(args: argparse.Namespace, loaded: LoadedModel, plan: RunPlan, store: PartStore, todo: list[Shard],
                files_sha256: str) -> None:
    """The shards `todo` analysed by the engine asked for, with progress (`_progress_shown`)."""
    # Imported here: `analyze` need not load the DataLoader, Ray or tqdm.
    from .dataset import MaskFolder, default_batch_size, run_shards

    total = sum(shard.size for shard in todo)
    masks = MaskFolder(args.folder.resolve(), args.masks.resolve()) if args.masks else None
    desc = "forward + explain" if args.explain else "images"
    batch_size = args.batch_size or default_batch_size(loaded.device)
    if args.engine == "local":
        workers = default_workers() if args.workers is None else args.workers
        with _progress_shown(sys.stderr, sys.stdout, total, desc) as progress:
            run_shards(loaded, plan, store, todo, files_sha256, batch_size=batch_size, workers=workers,
                       explain=args.explain, steps=args.steps, tests=args.tests, masks=masks, progress=progress,
                       lenses=args.lenses, forwards=args.model_workers)
        return
    from .dataset.ray_engine import run_shards_on_ray

    spec = _model_spec(args.model, args.weights, args.random_init, args.labels)
    stdout = sys.stdout  # the progress lines' stream: inside `_on_ray` sys.stdout is Ray's log
    with _on_ray(args, store.path / RAY_LOG) as (console, workers, threads), \
            _progress_shown(console, stdout, total, desc) as progress:
        run_shards_on_ray(spec, loaded, plan, store, todo, files_sha256, workers=workers, batch_size=batch_size,
                          explain=args.explain, steps=args.steps, tests=args.tests, masks=masks, threads=threads,
                          progress=progress, lenses=args.lenses)


@contextlib.contextmanager
def _progress_shown(console: TextIO, stdout: TextIO, total: int, desc: str) -> Iterator[Callable[[int, int], None]]:
    """progress(done, of) for the block: tqdm's bar on `console` when that is a terminal, and one line per few percent
    on `stdout` when that is not a terminal (a batch job's log). `stdout`: taken before a Ray block (`_on_ray`), which
    sends sys.stdout to Ray's log."""
    from tqdm import tqdm

    from .dataset.progress import ProgressLines

    lines = ProgressLines(stdout, desc) if not stdout.isatty() else None
    with tqdm(total=total, unit="image", desc=desc, disable=not console.isatty(), file=console, dynamic_ncols=True) as bar:
        def progress(done: int, of: int) -> None:
            bar.update(done - bar.n)
            if lines:
                lines.update(done, of)

        yield progress


def _model_spec(name: str, weights: Path | None, random_init: bool, labels: Path | None, seed: int = 0):
    """How a Ray worker builds a model of the command line: its files by absolute path (a worker's directory is not
    this one's)."""
    from .dataset.ray_engine import ModelSpec

    return ModelSpec(name, weights=str(weights.resolve()) if weights else None, pretrained=not random_init,
                     labels=str(labels.resolve()) if labels else None, seed=seed)


@contextlib.contextmanager
def _on_ray(args: argparse.Namespace, log: Path) -> Iterator[tuple[TextIO, object, int | None]]:
    """Ray for the block (--address's cluster, else one started on this machine), what it prints kept in `log`
    (ray_output_to): the stream for the command's bar, the workers (--model-workers, --gpus-per-worker, --workers)
    and each model worker's torch threads (on this machine its CPUs shared among them; a cluster's nodes their own)."""
    from .dataset.ray_engine import ray_output_to, ray_plan, ray_session

    with ray_output_to(log) as console, ray_session(args.address) as ray:
        workers = ray_plan(ray, args.model_workers, args.gpus_per_worker, args.workers or None)
        yield console, workers, None if args.address else max(1, cpu_quota() // workers.model_workers)


def _shards_written(store: PartStore, plan: RunPlan, todo: list[Shard], files_sha256: str) -> int:
    """After a run that leaves shards to do: this run's failures, one line each, and where the run stands."""
    from .dataset import PartsError

    failures = 0
    for shard in todo:
        try:
            totals, _ = store.read(shard, files_sha256)
        except PartsError as e:  # a part changed under the run: said, and the others still counted
            failures += 1
            _fail(str(e))
            continue
        for name, reason in totals.failures:
            failures += 1
            _fail(f"{name}: {reason}")
    done = store.done(plan.shards)
    print(f"{len(done)} of {len(plan.shards)} shards done in {store.path}; the results are written when all are "
          "(run the others into the same folder, or merge their folders: vit-lens merge DIR... --out DIR)", flush=True)
    return EXIT_FAILURES if failures else 0


def _write_merged(args: argparse.Namespace, stores: list[PartStore], out: OutputFolder, what: str) -> int:
    """Every shard's part merged, each failure one line on stderr, and the files written into `out`; `what` names
    the run in a message that refuses the parts."""
    from .dataset import DatasetError, PartsError, dataset_files, merged_result

    try:
        result, geometry, _ = merged_result(stores)
    except (DatasetError, PartsError) as e:
        _fail(f"{what}: {e}")
        return EXIT_FAILURES
    for name, reason in [*result.failures, *result.totals.lens_failures]:
        _fail(f"{name}: {reason}")
    failures = len(result.failures) + len(result.totals.lens_failures)
    for name, data in dataset_files(result, geometry, args.table).items():
        try:
            out.write(name, data)
        except OSError as e:
            failures += 1
            _fail(_os_reason(e))
    skipped = f", {len(result.skipped)} files skipped (listed in dataset.json)" if result.skipped else ""
    print(f"{result.num_images:,} images analysed{skipped} -> {args.out}", flush=True)
    for line in folder_lines(result):
        print(line, flush=True)
    logging.getLogger(__name__).info("%d images -> %s", result.num_images, args.out)
    return EXIT_FAILURES if failures else 0


def concepts(args: argparse.Namespace) -> int:
    """`concepts`: the arguments checked before the model loads (the folder, the output folder outside it, the Ray
    options, --shard, the Ray extra), then `_concepts_run`."""
    if not args.folder.is_dir():
        _fail(f"{args.folder}: not a folder")
        return EXIT_FAILURES
    if args.out.resolve().is_relative_to(args.folder.resolve()):  # its contact sheet would be an image of the next run
        _fail(f"--out {args.out}: inside FOLDER; write the concepts elsewhere")
        return EXIT_FAILURES
    if _inputs_missing(args) or _refused_before_loading(args):
        return EXIT_FAILURES
    if _too_few_images(args.folder, 2, TOO_FEW_FOR_CONCEPTS):
        return EXIT_FAILURES
    if args.circuit_images is not None and len(args.layer) == 1:
        _fail("--circuit-images needs several blocks in --layer (e.g. --layer 1,2)")
        return EXIT_FAILURES
    if args.features is not None and args.k > args.features:
        _fail(f"--k {args.k}: at most --features ({args.features}) features can be active")
        return EXIT_FAILURES
    if not _engine_options_checked(args):
        return EXIT_FAILURES
    return _with_model(args, _concepts_run)


UNREADABLE_FOLDER = "A folder that can't be read"  # vit_core.images.listing's reason for one


def _concepts_run(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """`concepts` once the model is loaded: the shards not collected yet collected (each kept when done, for every
    block at once), and when every shard is there each block's autoencoder trained and its files written (into DIR,
    or DIR/layer-L for several blocks), then with several blocks the circuit between them (DIR/circuit.json)."""
    from .concepts import TokenStore, TrainingSettings
    from .concepts.collect import check_layer, manifest_of
    from .concepts.learn import features_refused
    from .dataset import DatasetError, plan_run

    layers = args.layer
    folders = [args.out] if len(layers) == 1 else [args.out / f"layer-{layer}" for layer in layers]
    stores = [TokenStore(folder) for folder in folders]
    try:
        for layer in layers:
            check_layer(loaded, layer)
        features = args.features or 8 * loaded.geometry.embed_dim
        if args.k > features:
            raise DatasetError(f"--k {args.k}: at most --features ({features}) features can be active.")
        too_many = features_refused(features, loaded.geometry.embed_dim, TrainingSettings(features, args.k).batch_tokens)
        if too_many:  # before anything is collected: F x D bounded by the machine's memory
            raise DatasetError(too_many)
        found = stores[0].manifest()
        plan = plan_run(loaded, args.folder, limit=args.limit, num_shards=args.shard[1] if args.shard else args.shards,
                        resumed_shards=(found or {}).get("shards"))
        if len(plan.paths) < 2:
            raise DatasetError(f"{len(plan.paths)} image(s): {TOO_FEW_FOR_CONCEPTS}")
        for store, layer in zip(stores, layers, strict=True):
            store.open(manifest_of(loaded, plan, layer, args.limit))
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return EXIT_FAILURES
    for name, reason in plan.not_images:  # a folder whose files can't be listed is said, as an unreadable image is
        if reason.startswith(UNREADABLE_FOLDER):
            _fail(f"{name}: {reason}")
    asked = [plan.shards[args.shard[0] - 1]] if args.shard else list(plan.shards)
    collected = set.intersection(*(store.done(plan.shards) for store in stores))
    todo = [shard for shard in asked if shard.number not in collected]
    if len(todo) < len(asked):
        print(f"{len(asked) - len(todo)} of {len(asked)} shards already collected in {stores[0].path}: skipped", flush=True)
    started = time.perf_counter()
    try:
        _collect_concept_tokens(args, loaded, plan, stores, todo)
    except KeyboardInterrupt:
        _fail(f"interrupted; {len(stores[0].done(plan.shards))} of {len(plan.shards)} shards kept in {stores[0].path}, "
              "rerun to finish")
        return EXIT_INTERRUPTED
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return EXIT_FAILURES
    done = set.intersection(*(store.done(plan.shards) for store in stores))
    if len(done) < len(plan.shards):
        print(f"{len(done)} of {len(plan.shards)} shards collected in {stores[0].path}; the concepts are learned when all "
              "are (run the others into the same --out)", flush=True)
        return 0
    settings = TrainingSettings(num_features=features, k=args.k, epochs=args.epochs, seed=args.seed,
                                learning_rate=args.lr or None)
    collect_seconds = time.perf_counter() - started if todo else None
    failures, dictionaries = 0, []
    for folder, store, layer in zip(folders, stores, layers, strict=True):
        learned = _concepts_of_layer(args, loaded, plan, store, layer, settings, out if folder == args.out else None,
                                     folder, collect_seconds, prefix="" if len(layers) == 1 else f"block {layer}: ")
        if learned is None:
            return EXIT_FAILURES
        failures += learned[1]
        dictionaries.append(learned[0])
    if len(layers) > 1 and not _circuit_written(args, loaded, plan, dictionaries, out):
        return EXIT_FAILURES
    return EXIT_FAILURES if failures else 0


def _concepts_of_layer(args: argparse.Namespace, loaded: LoadedModel, plan: RunPlan, store, layer: int, settings,
                       out: OutputFolder | None, folder: Path, collect_seconds: float | None, prefix: str):
    """One block's autoencoder trained and its files written into `out` (or `folder`, made here): (its Concepts, its
    failures' count), or None when it failed (said)."""
    from .concepts import concepts_files, load_concepts
    from .images.files import OutputFolder

    try:
        with _stage_bars() as progress:
            files, summary = concepts_files(loaded, plan, store, layer, settings,
                                            memory_budget=int(args.memory_gb * 2 ** 30), progress=progress,
                                            collect_seconds=collect_seconds, stability=args.stability,
                                            steering_images=args.steering_images)
        if out is None:
            folder.mkdir(parents=True, exist_ok=True)
            with OutputFolder(folder) as written_to:
                written = [written_to.write(name, data) for name, data in files.items()]
        else:
            written = [out.write(name, data) for name, data in files.items()]
        learned = load_concepts(written[0].parent)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return None
    if prefix:
        print(f"{prefix}concepts -> {folder}", flush=True)
    if not prefix or layer == args.layer[0]:
        for failure in summary["failures"]:
            _fail(f"{failure['file']}: {failure['reason']}")
    print(f"{prefix}{summary['images']:,} images ({summary['held_out_images']:,} held out), {settings.num_features:,} "
          f"features, k = {args.k}: held-out fvu {summary['fvu']:.3f}, dead {summary['dead_fraction']:.1%}, spliced "
          f"top-1 agreement {summary['spliced_top1_agreement']:.1%}, KL {summary['spliced_kl']:.3g}, steerable "
          f"{summary['steerable_share']:.1%}"
          + (f" (on {summary['steering_images']:,} of the {summary['held_out_images']:,} held-out images)"
             if summary["steering_images"] < summary["held_out_images"] else "")
          + (f", stability {summary['stability']:.3f} ({summary['stable_share']:.1%} stable)" if args.stability else "")
          + f" -> {', '.join(map(str, written))}",
          flush=True)
    return learned, len(summary["failures"])


def _circuit_written(args: argparse.Namespace, loaded: LoadedModel, plan: RunPlan, dictionaries: list,
                     out: OutputFolder) -> bool:
    """DIR/circuit.json from the dictionaries of the listed blocks (vit_core.concepts.circuit), and a line saying it."""
    import json

    from .concepts.circuit import CIRCUIT_FILE, circuit_json, circuit_of

    workers = default_workers() if args.workers is None else args.workers
    started = time.perf_counter()
    try:
        with _stage_bars() as progress:
            pairs = circuit_of(loaded, plan, dictionaries, workers, progress=lambda done, of: progress("circuit", done, of),
                               images=args.circuit_images or CIRCUIT_IMAGES)
        content = circuit_json(pairs, args.layer)
        content["seconds"] = round(time.perf_counter() - started, 3)
        path = out.write(CIRCUIT_FILE, json.dumps(content, indent=1).encode())
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return False
    strong = sum(edge["removal_effect"] >= 0.5 for edge in content["edges"])
    print(f"circuit of blocks {', '.join(map(str, args.layer))}: {len(content['edges']):,} edges ({strong:,} with a removal "
          f"effect of at least 0.5) in {content['seconds']:.1f} s -> {path}", flush=True)
    return True


@contextlib.contextmanager
def _stage_bars() -> Iterator[Callable[[str, int, int], None]]:
    """progress(stage, done, of) for `concepts`' stages after the collection (concepts.STAGES: training, metrics,
    features, sheet): a tqdm bar per stage on a terminal (stderr), each stage's progress lines on stdout otherwise,
    so that no stage is minutes of silence."""
    from tqdm import tqdm

    from .concepts import STAGES
    from .dataset.progress import ProgressLines

    bars: dict[str, tqdm] = {}
    lines: dict[str, ProgressLines] = {}

    def progress(stage: str, done: int, of: int) -> None:
        if stage not in bars:
            for bar in bars.values():  # the stage before has ended
                bar.close()
            unit = STAGES[stage]
            bars[stage] = tqdm(total=of, unit=unit.rstrip("s"), desc=stage, disable=not sys.stderr.isatty(),
                               file=sys.stderr, dynamic_ncols=True)
            if not sys.stdout.isatty():
                lines[stage] = ProgressLines(sys.stdout, stage, items=unit, per=unit)
        bars[stage].update(done - bars[stage].n)
        if stage in lines:
            lines[stage].update(done, of)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def _collect_concept_tokens(args: argparse.Namespace, loaded: LoadedModel, plan: RunPlan, stores: list,
                            todo: list[Shard]) -> None:
    """The shards `todo` collected by the engine asked for (the local engine: every listed block at once into its
    store), with progress (`_progress_shown`, on stderr)."""
    from .concepts.collect import collect_layers
    from .dataset import default_batch_size

    batch_size = args.batch_size or default_batch_size(loaded.device)
    with _progress_shown(sys.stderr, sys.stdout, sum(shard.size for shard in todo), "tokens") as progress:
        if args.engine == "local":
            workers = default_workers() if args.workers is None else args.workers
            collect_layers(loaded, plan, args.layer, stores, todo, batch_size=batch_size, workers=workers,
                           progress=progress)
            return
        from .concepts.ray_collect import collect_shards_on_ray

        with _on_ray(args, stores[0].path / RAY_LOG) as (_, workers, threads):
            collect_shards_on_ray(_model_spec(args.model, args.weights, args.random_init, args.labels), loaded, plan,
                                  args.layer[0], stores[0], todo, workers=workers, batch_size=batch_size, threads=threads,
                                  progress=progress)


def merge(args: argparse.Namespace) -> int:
    missing = [str(path) for path in args.parts if not path.is_dir()]
    if missing:  # said before the dataset package (torch) is imported
        _fail(f"{', '.join(missing)}: not a folder")
        return EXIT_FAILURES
    from .dataset import PartStore
    from .images.files import OutputFolder

    try:
        if not args.out.is_symlink():
            args.out.mkdir(parents=True, exist_ok=True)
        out = OutputFolder(args.out)
    except OSError as e:
        _fail(f"--out: {_os_reason(e)}")
        return EXIT_FAILURES
    with out:
        return _write_merged(args, [PartStore.found_in(path) for path in args.parts], out, "merge")


def export_web(args: argparse.Namespace) -> int:
    """`export-web`: the static lesson's folder (vit_core.web.site), one line on stdout saying where and how big."""
    for option, path in (("--weights", args.weights), ("--labels", args.labels)):
        reason = _unreachable(path) if path is not None else None
        if reason:
            _fail(f"{option}: {reason}")
            return EXIT_FAILURES
    if _refused_before_loading(args):
        return EXIT_FAILURES
    from .web.target import WEB_ROOT, target_refused  # the standard library only: said before torch is imported

    why = target_refused(args.out, WEB_ROOT)
    if why:
        _fail(f"--out {args.out}: {why}")
        return EXIT_FAILURES
    opened = _load(args)
    if opened is None:
        return EXIT_FAILURES
    loaded, out = opened
    out.close()  # the site writes its own files and folders
    from .web.site import write_site

    try:
        sizes = write_site(loaded, args.out)
    except (ViTLensError, OSError) as e:
        _fail(f"export-web: {e}")
        return EXIT_FAILURES
    print(f"{len(sizes)} files, {sum(sizes.values()) / 2**20:.1f} MB -> {args.out / 'index.html'} (serve the folder from "
          f"any static host, e.g. python -m http.server --directory {args.out})", flush=True)
    return 0


def compare(args: argparse.Namespace) -> int:
    """`compare`: the arguments checked before any model loads (the folder, --out outside it, both models' names and
    files, --shard and the engine's options), then both models loaded and `_compare_run`."""
    if not args.explain and (args.steps != DEFAULT_STEPS or args.tests != EXPORT_TESTS):
        _fail("--steps and --tests need --explain")
        return EXIT_FAILURES
    if not args.folder.is_dir():
        _fail(f"{args.folder}: not a folder")
        return EXIT_FAILURES
    if args.out.resolve().is_relative_to(args.folder.resolve()):  # its figures would be images of the next run
        _fail(f"--out {args.out}: inside FOLDER; write the comparison elsewhere")
        return EXIT_FAILURES
    args.model_b = args.model_b or args.model
    if _inputs_missing(args) or _refused_before_loading(args):
        return EXIT_FAILURES
    why = args.weights_b is not None and _unreachable(args.weights_b)
    if why:
        _fail(f"--weights-b {args.weights_b}: {why}")
        return EXIT_FAILURES
    why = arguments.model_refused(args.model_b)
    if why:
        _fail(f"--model-b {args.model_b}: {why}")
        return EXIT_FAILURES
    if args.seed_b is not None and not args.random_init_b:
        _fail(f"--seed-b {args.seed_b}: a seed is for a random init; add --random-init-b")
        return EXIT_FAILURES
    if args.random_init_b and args.model_b == arguments.TEACHING_MODEL:
        _fail(f"--random-init-b: {args.model_b} comes with its own weights; for its architecture with random weights, "
              "add --model-b vit_shapes_patch8_96 --random-init-b.")
        return EXIT_FAILURES
    if _too_few_images(args.folder, 1, NO_IMAGES):
        return EXIT_FAILURES
    if not _engine_options_checked(args):
        return EXIT_FAILURES
    return _with_model(args, _compare_with_b)


def _compare_with_b(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """Model B loaded on A's device (its weights refused as --weights is), then `_compare_run`."""
    from .compare import with_names_of
    from .loading import load_model

    try:
        loaded_b = load_model(args.model_b, weights=args.weights_b, pretrained=not args.random_init_b, labels=args.labels,
                              seed=args.seed_b or 0, device=loaded.device)
    except (ViTLensError, OSError) as e:
        option = "--weights-b" if args.weights_b is not None else "--model-b"
        _fail(f"{option} {args.weights_b or args.model_b}: {e}")
        return EXIT_FAILURES
    if _steps_refused(args, loaded) or _steps_refused(argparse.Namespace(**{**vars(args), "model": args.model_b}), loaded_b):
        return EXIT_FAILURES
    return _compare_run(args, loaded, with_names_of(loaded_b, loaded), out)


def _compare_run(args: argparse.Namespace, loaded: LoadedModel, loaded_b: LoadedModel, out: OutputFolder) -> int:
    """The run planned (manifests written or checked), the shards not done run (each one's parts written when done),
    and when every shard is done the files written; one line per failure, Ctrl-C in one line."""
    from .compare import Explain, plan_compare, todo_of, write_files

    explain = Explain(args.steps, tuple(args.tests)) if args.explain else None
    try:
        run = plan_compare(loaded, loaded_b, args.folder, args.out, limit=args.limit,
                           num_shards=args.shard[1] if args.shard else args.shards, weights=(args.weights, args.weights_b),
                           labels=(args.labels, args.labels), explain=explain)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return EXIT_FAILURES
    asked, todo = todo_of(run, args.shard)
    if len(todo) < len(asked):
        print(f"{len(asked) - len(todo)} of {len(asked)} shards already done in {run.store.path}: skipped", flush=True)
    concepts = _compare_concepts_planned(args, run)
    if concepts is False:
        return EXIT_FAILURES
    try:
        _run_pair_shards(args, run, todo, explain, concepts)
        if concepts is not None:  # the shards whose comparison an earlier run without --concepts-layer did
            _collect_pair_tokens(args, run, concepts, asked)
    except KeyboardInterrupt:  # each part is written whole or not at all: the ones there are a rerun's head start
        _fail(f"interrupted; {len(run.store.done(run.shards))} of {len(run.shards)} shards kept in {args.out}, rerun to "
              "finish")
        return EXIT_INTERRUPTED
    except ViTLensError as e:
        ray_log = f" (Ray's own lines: {run.store.path / RAY_LOG})" if args.engine == "ray" else ""
        _fail(f"{args.folder}: {e}{ray_log}")
        return EXIT_FAILURES
    except OSError as e:
        _fail(_os_reason(e))
        return EXIT_FAILURES
    done = run.store.done(run.shards)
    if concepts is not None:
        from .compare.concepts import collected

        done &= collected(concepts, run.shards)
    if len(done) < len(run.shards):  # this run's failures, one line each, as dataset's _shards_written says them
        failures = _compare_failures(run, todo)
        print(f"{len(done)} of {len(run.shards)} shards done in {args.out}; the results are written when all are (run "
              "the others into the same folder)", flush=True)
        return EXIT_FAILURES if failures else 0
    try:
        outcome = _shared_concepts_written(args, run, concepts, out)
        a, b, files = write_files(run, out, args.table, outcome)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.out}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return EXIT_FAILURES
    failures = sorted(set(a.failures) | set(b.failures))
    for name, reason in failures:
        _fail(f"{name}: {reason}")
    import json

    summary = json.loads(files["compare.json"])
    print(compare_line(summary, a.skipped, args.out), flush=True)
    if "explain" in summary:
        changed = summary["explain"]["verdict_changed"]
        print("verdicts against random that changed from A to B: " + ", ".join(
            f"{key.removeprefix('beats_random_')} {v['changed']} of {v['images']}" for key, v in changed.items()), flush=True)
    return EXIT_FAILURES if failures else 0


def _compare_concepts_planned(args: argparse.Namespace, run: CompareRun):
    """--concepts-layer's two token stores, their manifests written or checked (None: not asked for, or the models
    can't share a dictionary there, which compare.json says); False when refused (said)."""
    from .compare.concepts import concepts_skipped, token_stores

    if args.concepts_layer is None or concepts_skipped(run.pair.a.geometry, run.pair.b.geometry, args.concepts_layer):
        return None
    try:
        return token_stores(run.pair, args.out, args.concepts_layer, args.limit)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.folder}: {_os_reason(e) if isinstance(e, OSError) else e}")
        return False


def _collect_pair_tokens(args: argparse.Namespace, run: CompareRun, stores, asked: list[Shard]) -> None:
    """The shards of `asked` whose tokens at --concepts-layer are not collected yet, collected, with progress."""
    from .compare.concepts import collect_pair_tokens, collected
    from .compare.engine import pair_batch_size

    there = collected(stores, run.shards)
    todo = [shard for shard in asked if shard.number not in there]
    if not todo:
        return
    workers = default_workers() if args.workers is None else args.workers
    with _progress_shown(sys.stderr, sys.stdout, sum(shard.size for shard in todo), "tokens (two models)") as progress:
        collect_pair_tokens(run.pair, args.concepts_layer, stores, todo, workers=workers, progress=progress,
                            batch_size=args.batch_size or pair_batch_size(run.pair.a.device))


def _shared_concepts_written(args: argparse.Namespace, run: CompareRun, stores, out: OutputFolder):
    """With --concepts-layer: the shared dictionary trained and DIR/concepts written, and a line saying it; the
    outcome for compare.json (its lists, or why the models can't share one). Raises ViTLensError, OSError."""
    from .compare.concepts import concepts_skipped, shared_concepts
    from .compare.files import ConceptsOutcome
    from .concepts import TrainingSettings
    from .images.files import OutputFolder

    if args.concepts_layer is None:
        return None
    why = concepts_skipped(run.pair.a.geometry, run.pair.b.geometry, args.concepts_layer)
    if why:
        return ConceptsOutcome(skipped=why)
    settings = TrainingSettings(num_features=8 * run.pair.a.geometry.embed_dim, k=CONCEPTS_K, epochs=CONCEPTS_EPOCHS)
    files, summary = shared_concepts(run.pair, args.concepts_layer, stores, settings)
    for name, data in files.items():
        folder = out.path / Path(name).parent
        folder.mkdir(parents=True, exist_ok=True)
        with OutputFolder(folder) as written_to:
            written_to.write(Path(name).name, data)
    counts = summary["counts"]
    print(f"concepts of block {args.concepts_layer}: {counts['only_a']:,} only in A, {counts['only_b']:,} only in B, "
          f"{counts['shared']:,} shared, {counts['dead']:,} dead -> {out.path / 'concepts'}", flush=True)
    return ConceptsOutcome(summary=summary)


def _run_pair_shards(args: argparse.Namespace, run: CompareRun, todo: list[Shard], explain: Explain | None,
                     stores=None) -> None:
    """The shards `todo` of a comparison run by the engine asked for, with progress (`_progress_shown`); with
    --concepts-layer's token `stores`, the tokens of those not collected yet from the same decoding."""
    from .compare import run_pair_shards
    from .compare.concepts import collected, pair_token_writers
    from .compare.engine import pair_batch_size

    total, desc = sum(shard.size for shard in todo), "images (two models)"
    batch_size = args.batch_size or pair_batch_size(run.pair.a.device)
    if args.engine == "local":
        workers = default_workers() if args.workers is None else args.workers
        there = collected(stores, run.shards) if stores else set()
        tokens = (pair_token_writers(run.pair, args.concepts_layer, stores, [s for s in todo if s.number not in there])
                  if stores else contextlib.nullcontext())
        with _progress_shown(sys.stderr, sys.stdout, total, desc) as progress, tokens as decoded:
            run_pair_shards(run.pair, run.store, todo, run.files_sha256, batch_size=batch_size, workers=workers,
                            progress=progress, explain=explain, decoded=decoded)
        return
    from .compare.ray_engine import run_pair_shards_on_ray

    specs = (_model_spec(args.model, args.weights, args.random_init, args.labels),
             _model_spec(args.model_b, args.weights_b, args.random_init_b, args.labels, seed=args.seed_b or 0))
    stdout = sys.stdout  # the progress lines' stream: inside `_on_ray` sys.stdout is Ray's log
    with _on_ray(args, run.store.path / RAY_LOG) as (console, workers, threads), \
            _progress_shown(console, stdout, total, desc) as progress:
        run_pair_shards_on_ray(specs, run.pair, run.store, todo, run.files_sha256, workers=workers, batch_size=batch_size,
                               explain=explain, threads=threads, progress=progress)


def _compare_failures(run, todo: list) -> int:
    """The failures of both models in the shards `todo`, one line each on stderr (an image once); their count."""
    from .dataset import PartsError

    failed: dict[str, str] = {}
    for shard in todo:
        for store in run.store.stores:
            try:
                totals, _ = store.read(shard, run.files_sha256)
            except PartsError as e:
                failed.setdefault(str(store.part_path(shard)), str(e))
                continue
            for name, reason in totals.failures:
                failed.setdefault(name, reason)
    for name, reason in failed.items():
        _fail(f"{name}: {reason}")
    return len(failed)


def compare_line(summary: dict, skipped: tuple, out: Path) -> str:
    """`compare`'s last line: the images, the agreement, the mean KL, the most changed head, where the files are."""
    parts = [f"{summary['num_images']:,} images compared"]
    if skipped:
        parts.append(f"{len(skipped)} files skipped (listed in a/dataset.json)")
    if summary["agreement"] is not None:
        parts.append(f"same top-1 on {summary['agreement']:.1%} ({summary['changed']:,} changed), mean KL "
                     f"{summary['kl_mean']:.3g} nats")
    if summary["heads_most_changed"]:
        top = summary["heads_most_changed"][0]
        parts.append(f"most changed head: block {top['block']} head {top['head']} (JS {top['js']:.3g})")
    return ", ".join(parts) + f" -> {out}"


# subcommand name -> its function of the parsed arguments (exit status)
COMMANDS = {"analyze": analyze, "dataset": dataset, "merge": merge, "concepts": concepts, "compare": compare,
            "export-web": export_web}


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: a KeyboardInterrupt, which the command turns into one line and exit status 130. A second one while
    the command winds down (worker processes stopping, Ray shutting down) ends the process at once, also quietly."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(EXIT_INTERRUPTED))
    raise KeyboardInterrupt


class _ReaderMayLeave:
    """A standard stream whose reader may leave before the command ends (`| head -1`, a closed log pipe). From the
    first write the pipe refuses, the stream's file descriptor points at /dev/null: the rest of what the command
    prints is dropped, and the run goes on to write all its files, as it does when nobody reads its output."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._drop_the_rest()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._drop_the_rest()

    def _drop_the_rest(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):  # what the pipe refused, still buffered, goes to /dev/null
            self.stream.flush()

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)


@contextlib.contextmanager
def _readers_may_leave() -> Iterator[None]:
    """sys.stdout and sys.stderr as `_ReaderMayLeave` for the block, where they are files (a test's captured streams
    are not, and have no reader to lose)."""
    own = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        with contextlib.suppress(AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last
            stream.fileno()
            own[name] = stream
            setattr(sys, name, _ReaderMayLeave(stream))
    try:
        yield
    finally:
        for name, stream in own.items():
            setattr(sys, name, stream)


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; returns the exit status."""
    global _program
    _program = getattr(args, "program", _program)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with _readers_may_leave():
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    try:
        settings.check_all()
    except settings.SettingError as e:
        _fail(str(e))
        return EXIT_FAILURES
    own_signals = threading.current_thread() is threading.main_thread()  # signal.signal works there only
    before = signal.signal(signal.SIGINT, _interrupted) if own_signals else None
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        _fail("interrupted")
        return EXIT_INTERRUPTED
    finally:
        if own_signals:  # None: a handler set outside Python, which can't be put back; Python's own then
            signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser()[0].parse_args(argv))


def exit_process(code: int) -> NoReturn:
    """End this process with `code` once a command is done: its exit handlers run (Ray's shutdown, multiprocessing's
    workers, temporary folders, logging), the standard streams are flushed, and the process ends without Python
    tearing its modules down one by one, which after torch and timm takes about a second of a 2-core machine
    (docs/performance.md). Where a thread other than this one is still working, Python's own exit waits for it.
    For the `python -m vit_core` and `vit-lens` processes only: inside another program it would end that program."""
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.current_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_process(main())
