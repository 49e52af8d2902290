"""The command line: `python -m vit_core analyze ...` and `python -m vit_core dataset ...` (or `vit-lens ...`).

    analyze IMAGE [IMAGE ...] --model NAME [--weights FILE | --random-init] [--labels FILE] [--out DIR]
            [--topk K] [--device DEVICE] [--explain [--target K] [--steps S]]
    dataset FOLDER --model NAME [--weights FILE | --random-init] [--labels FILE] [--out DIR] [--batch-size B]
            [--device DEVICE] [--limit N] [--workers W] [--explain [--steps S]]

`analyze` writes DIR/<name>.npz and DIR/<name>.json per readable image; `dataset` writes DIR/dataset.npz,
DIR/dataset.json and DIR/mean_attention_distance.png for every image under FOLDER (formats:
docs/spec/interface.md). Every file is written atomically (vit_core.files): a reader never finds half of
one. A failure (an unreadable image, an output that can't be written) prints one line on stderr, the
other images are still analysed, and the exit status is 2. So is a bad `--device` (auto, cpu, cuda,
cuda:N, mps; vit_core.devices), refused before any model is loaded.

Output names of `analyze`: <name> is the image's stem (`photo.jpg` -> `photo.npz`, `photo.json`). When
different inputs share a stem, ignoring case (`a/photo.jpg` and `b/photo.png`, or `a/photo.jpg` and
`b/photo.jpg`), each of them is named `<stem>-<8 hex digits>`, the digits being the start of the SHA-256
of the input's absolute path, so the same command names the same files again (`photo-3f2a91c0.npz`).
The `.json` records the image it came from under "image", and the device under "device".

The installed `vit-lens` command (dashboard/cli.py) is this parser plus a `dashboard` subcommand:
a subcommand added here (`build_parser` and `COMMANDS`) appears there too.
"""

from __future__ import annotations

from .runtime import one_blas_thread

one_blas_thread()  # before numpy is imported, which the imports below do

import argparse
import hashlib
import logging
import os
import sys
from pathlib import Path

from . import settings
from .capture import run_with_capture
from .devices import DEVICE_CHOICES, describe_device, resolve_device
from .errors import ViTLensError
from .explain import DEFAULT_STEPS
from .export import analysis_arrays, explanation_export, json_bytes, npz_bytes, summary
from .files import OutputFolder, read_input
from .images import MAX_FILE_BYTES, load_image
from .loading import DEFAULT_MODEL, load_model
from .model import LoadedModel
from .runtime import configure_threads, cpu_quota

EXIT_FAILURES = 2


def default_workers() -> int:
    """Decoding processes for `dataset`: one CPU stays with the forward pass, at most 8 (0 on one CPU: decode inline)."""
    return max(0, min(8, cpu_quota() - 1))


def build_parser(prog: str = "python -m vit_core") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The command-line parser and its subcommands (returned so that `vit-lens` can add `dashboard`)."""
    parser = argparse.ArgumentParser(prog=prog, description="ViT Lens: analyse images with a timm ViT.")
    commands = parser.add_subparsers(dest="command", required=True)

    analyze = commands.add_parser("analyze", help="capture and analyse images; write .npz + .json per image")
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE",
                         help="images; results are named after each stem, or <stem>-<8 hex digits of a hash of "
                              "its absolute path> when inputs share a stem")
    _add_model_arguments(analyze)
    analyze.add_argument("--topk", type=int, default=5, help="predictions in the .json (default 5)")
    analyze.add_argument("--explain", action="store_true",
                         help="add relevance maps, logit lens, token norms and deletion/insertion curves")
    analyze.add_argument("--target", metavar="K",
                         help="with --explain: the class to explain, an index or a label (default: the top-1)")
    _add_steps_argument(analyze)

    dataset = commands.add_parser("dataset", help="analyse every image under a folder; write dataset.npz, dataset.json "
                                  "and mean_attention_distance.png")
    dataset.add_argument("folder", type=Path, metavar="FOLDER",
                         help="images under it, recursively; subfolders that name a class (index, label or ImageNet "
                              "synset id) give the true labels")
    _add_model_arguments(dataset)
    dataset.add_argument("--batch-size", type=_positive, metavar="B",
                         help="images per forward (default: 8 on a CPU, 64 on a GPU)")
    dataset.add_argument("--limit", type=_positive, metavar="N", help="only the first N images in sorted order")
    workers = default_workers()  # read once: the default and its help
    dataset.add_argument("--workers", type=_not_negative, default=workers, metavar="W",
                         help=f"processes that decode images, 0: in this one (default {workers}: "
                              "the CPUs this process may use, less one, at most 8)")
    dataset.add_argument("--explain", action="store_true",
                         help="add the mean deletion / insertion AUC of every relevance method and a random order")
    _add_steps_argument(dataset)
    return parser, commands


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


def _fail(message: str) -> None:
    print(f"vit_core: {message}", file=sys.stderr)


def _load(args: argparse.Namespace) -> tuple[LoadedModel, OutputFolder] | None:
    """The model the arguments name, on their device, and the output folder made and opened (refused if it is a
    symlink: results land only in the folder named); None after saying why not."""
    try:
        device = resolve_device(args.device)  # before the model: a bad device costs no load
    except ViTLensError as e:
        _fail(f"--device: {e}")
        return None
    try:
        loaded = load_model(args.model, weights=args.weights, pretrained=not args.random_init, labels=args.labels,
                            device=device)
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


def analyze(args: argparse.Namespace) -> int:
    if not args.explain and (args.target is not None or args.steps != DEFAULT_STEPS):
        _fail("--target and --steps need --explain")
        return EXIT_FAILURES
    opened = _load(args)
    if opened is None:
        return EXIT_FAILURES
    loaded, out = opened
    with out:
        return _analyze_each(args, loaded, out)


def _analyze_each(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """`analyze`'s loop: each image read (a regular file, at most images.MAX_FILE_BYTES), analysed and written; a failure
    is one line and the next image goes on. Returns the exit status."""
    device_name = describe_device(loaded.device)
    failures = 0
    for path, name in zip(args.images, output_names(args.images), strict=True):
        try:
            image = load_image(read_input(path, MAX_FILE_BYTES), loaded.decode_min_side)  # an unreadable path: its own line
            cap = run_with_capture(loaded, image)
            arrays, described = analysis_arrays(loaded, cap), {"image": str(path), **summary(loaded, cap, args.topk),
                                                           "device": device_name}
            if args.explain:
                extra_arrays, extra_summary = explanation_export(loaded, cap, image, args.target, args.steps)
                arrays, described = {**arrays, **extra_arrays}, {**described, **extra_summary}
            out.write(f"{name}.npz", npz_bytes(arrays))
            out.write(f"{name}.json", json_bytes(described))
            logging.getLogger(__name__).info("%s -> %s", path, args.out / f"{name}.npz")
        except ViTLensError as e:
            failures += 1
            _fail(f"{path}: {e}")
        except OSError as e:  # an output that can't be written, a file gone since: this image only
            failures += 1
            _fail(f"{path}: {_os_reason(e)}")
    return EXIT_FAILURES if failures else 0


def _os_reason(error: OSError) -> str:
    """One line for an OSError: the file it concerns, and what the system said."""
    return f"{error.filename}: {error.strerror or error}." if error.filename else f"{error.strerror or error}."


def dataset(args: argparse.Namespace) -> int:
    if not args.explain and args.steps != DEFAULT_STEPS:
        _fail("--steps needs --explain")
        return EXIT_FAILURES
    if not args.folder.is_dir():
        _fail(f"{args.folder}: not a folder")
        return EXIT_FAILURES
    opened = _load(args)
    if opened is None:
        return EXIT_FAILURES
    loaded, out = opened
    with out:
        return _dataset_run(args, loaded, out)


def _dataset_run(args: argparse.Namespace, loaded: LoadedModel, out: OutputFolder) -> int:
    """`dataset` once the model is loaded: the images analysed, a line per one that failed, the three files written."""
    # Imported here: `analyze` need not load the DataLoader, matplotlib's figure or tqdm.
    from tqdm import tqdm

    from .dataset import analyze_dataset, dataset_files, folder_labels, list_images

    # Sorted regular files, the first N with --limit. Each is read by the decoder as a regular file of at most
    # images.MAX_FILE_BYTES (vit_core.files.read_input): one too large is a failure like an unreadable image.
    paths = list_images(args.folder)[: args.limit]
    labels = folder_labels(loaded, args.folder, paths)
    sources = [(str(path), path) for path in paths]  # decoded in the workers: only the paths travel
    # On a terminal only: a bar in a log file or a test's captured output is noise.
    with tqdm(total=len(paths) * (2 if args.explain else 1), unit="image" if not args.explain else "step",
              desc="forward + explain" if args.explain else "images", disable=not sys.stderr.isatty(),
              file=sys.stderr, dynamic_ncols=True) as bar:
        try:
            result = analyze_dataset(loaded, sources, labels, batch_size=args.batch_size, workers=args.workers,
                                     explain=args.explain, steps=args.steps,
                                     progress=lambda done, total: bar.update(done - bar.n))
        except ViTLensError as e:
            bar.close()
            _fail(f"{args.folder}: {e}")
            return EXIT_FAILURES
    for name, reason in result.failures:
        _fail(f"{name}: {reason}")
    failures = len(result.failures)
    for name, data in dataset_files(result, loaded.geometry).items():
        try:
            out.write(name, data)
        except OSError as e:
            failures += 1
            _fail(_os_reason(e))
    logging.getLogger(__name__).info("%d images of %s -> %s", result.num_images, args.folder, args.out)
    return EXIT_FAILURES if failures else 0


COMMANDS = {"analyze": analyze, "dataset": dataset}  # subcommand name -> its function of the parsed arguments (exit status)


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings.check_all()
    except settings.SettingError as e:
        _fail(str(e))
        return EXIT_FAILURES
    configure_threads()
    return COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser()[0].parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
