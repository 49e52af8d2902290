"""`python -m vit_core analyze IMAGE [IMAGE ...] --model NAME [--weights FILE | --random-init] [--out DIR] [--topk K]
[--explain [--target K] [--steps S]]`

Writes DIR/<stem>.npz and DIR/<stem>.json per readable image (format: shared/spec/interface.md).
A failure prints one line on stderr, the other images are still analysed, and the exit status is 2.

The installed `vit-lens` command (dashboard/cli.py) is this parser plus a `dashboard` subcommand:
a subcommand added here (`build_parser` and `COMMANDS`) appears there too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .capture import run_with_capture
from .errors import ViTLensError
from .explain import DEFAULT_STEPS
from .export import analysis_arrays, explanation_export, json_bytes, npz_bytes, summary
from .images import load_image
from .loading import DEFAULT_MODEL, load_model
from .runtime import configure_threads

EXIT_FAILURES = 2


def build_parser(prog: str = "python -m vit_core") -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The command-line parser and its subcommands (returned so that `vit-lens` can add `dashboard`)."""
    parser = argparse.ArgumentParser(prog=prog, description="ViT Lens: analyse images with a timm ViT.")
    commands = parser.add_subparsers(dest="command", required=True)
    analyze = commands.add_parser("analyze", help="capture and analyse images; write .npz + .json per image")
    analyze.add_argument("images", nargs="+", type=Path, metavar="IMAGE")
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
    args.out.mkdir(parents=True, exist_ok=True)
    failures = 0
    for path in args.images:
        try:
            image = load_image(path)
            cap = run_with_capture(loaded, image)
            arrays, described = analysis_arrays(loaded, cap), summary(loaded, cap, args.topk)
            if args.explain:
                extra_arrays, extra_summary = explanation_export(loaded, cap, image, args.target, args.steps)
                arrays, described = {**arrays, **extra_arrays}, {**described, **extra_summary}
            (args.out / f"{path.stem}.npz").write_bytes(npz_bytes(arrays))
            (args.out / f"{path.stem}.json").write_bytes(json_bytes(described))
            logging.getLogger(__name__).info("%s -> %s", path, args.out / f"{path.stem}.npz")
        except ViTLensError as e:
            failures += 1
            _fail(f"{path}: {e}")
    return EXIT_FAILURES if failures else 0


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
