"""`python -m vit_core analyze IMAGE [IMAGE ...] --model NAME [--weights FILE | --random-init] [--out DIR] [--topk K]
[--explain [--target K] [--steps S]]`

Writes DIR/<name>.npz and DIR/<name>.json per readable image (format: shared/spec/interface.md), each
file written atomically (vit_core.files). A failure (an unreadable image, an output that can't be
written) prints one line on stderr, the other images are still analysed, and the exit status is 2.

Output names: <name> is the image's stem (`photo.jpg` -> `photo.npz`, `photo.json`). When different
inputs share a stem, ignoring case (`a/photo.jpg` and `b/photo.png`, or `a/photo.jpg` and `b/photo.jpg`),
each of them is named `<stem>-<8 hex digits>`, the digits being the start of the SHA-256 of the
input's absolute path, so the same command names the same files again (`photo-3f2a91c0.npz`).
The `.json` records the image it came from under "image".

The installed `vit-lens` command (dashboard/cli.py) is this parser plus a `dashboard` subcommand:
a subcommand added here (`build_parser` and `COMMANDS`) appears there too.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
from pathlib import Path

from .capture import run_with_capture
from .errors import ViTLensError
from .explain import DEFAULT_STEPS
from .export import analysis_arrays, explanation_export, json_bytes, npz_bytes, summary
from .files import write_atomically
from .images import load_image
from .loading import DEFAULT_MODEL, load_model
from .runtime import configure_threads

EXIT_FAILURES = 2


def build_parser(prog: str = "python -m vit_core") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The command-line parser and its subcommands (returned so that `vit-lens` can add `dashboard`)."""
    parser = argparse.ArgumentParser(prog=prog, description="ViT Lens: analyse images with a timm ViT.")
    commands = parser.add_subparsers(dest="command", required=True)
    analyze = commands.add_parser("analyze", help="capture and analyse images; write .npz + .json per image")
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE",
                         help="images; results are named after each stem, or <stem>-<8 hex digits of a hash of "
                              "its absolute path> when inputs share a stem")
    analyze.add_argument("--model", default=DEFAULT_MODEL,
                         help=f"timm model name, hf-hub: id or vit-lens/shapes-vit (default {DEFAULT_MODEL})")
    source = analyze.add_mutually_exclusive_group()
    source.add_argument("--weights", type=Path, help="local weights file (.safetensors, .pth/.pt/.bin, .npz)")
    source.add_argument("--random-init", action="store_true", help="no pretrained weights: random init (seed 0)")
    analyze.add_argument("--labels", type=Path, help="label file (one class name per line, or JSON)")
    analyze.add_argument("--out", type=Path, default=Path("."), help="output folder (default: current)")
    analyze.add_argument("--topk", type=int, default=5, help="predictions in the .json (default 5)")
    analyze.add_argument("--explain", action="store_true",
                         help="add relevance maps, logit lens, token norms and deletion/insertion curves")
    analyze.add_argument("--target", metavar="K",
                         help="with --explain: the class to explain, an index or a label (default: the top-1)")
    analyze.add_argument("--steps", type=_at_least_two, default=DEFAULT_STEPS, metavar="S",
                         help=f"with --explain: steps of the deletion and insertion curves (default {DEFAULT_STEPS})")
    return parser, commands


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


def analyze(args: argparse.Namespace) -> int:
    if not args.explain and (args.target is not None or args.steps != DEFAULT_STEPS):
        _fail("--target and --steps need --explain")
        return EXIT_FAILURES
    try:
        loaded = load_model(args.model, weights=args.weights, pretrained=not args.random_init, labels=args.labels)
    except (ViTLensError, OSError) as e:
        _fail(f"{args.model}: {e}")
        return EXIT_FAILURES
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--out: {_os_reason(e)}")
        return EXIT_FAILURES
    failures = 0
    for path, name in zip(args.images, output_names(args.images), strict=True):
        try:
            image = load_image(path)
            cap = run_with_capture(loaded, image)
            arrays, described = analysis_arrays(loaded, cap), {"image": str(path), **summary(loaded, cap, args.topk)}
            if args.explain:
                extra_arrays, extra_summary = explanation_export(loaded, cap, image, args.target, args.steps)
                arrays, described = {**arrays, **extra_arrays}, {**described, **extra_summary}
            write_atomically(args.out / f"{name}.npz", npz_bytes(arrays))
            write_atomically(args.out / f"{name}.json", json_bytes(described))
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


COMMANDS = {"analyze": analyze}  # subcommand name -> its function of the parsed arguments (exit status)


def run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    configure_threads()
    return COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser()[0].parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
