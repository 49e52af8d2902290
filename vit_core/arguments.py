"""What the command line can refuse before torch is imported (5-15 s on a busy machine): a model name timm doesn't
know, a --target no class is called, an --out that can't be a folder. Each refusal is one sentence, with "Did you
mean ...?" where a close name exists (difflib). No torch, timm or numpy here.

timm's names are read from its installed source, not by importing it: every `@register_model` function and every
name of a `register_model_deprecations` table (tests/unit/test_cli.py checks the two against timm's own registry).
A name this reading doesn't find is refused; where timm's files can't be read, nothing is refused here and
vit_core.loading.names refuses after the import, in the same words (`unknown_model_message`).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import os
import re
from pathlib import Path

TEACHING_MODEL = "vit-lens/shapes-vit"  # vit_core.teaching.model.TEACHING_MODEL, which imports timm
TEACHING_LABELS = Path(__file__).parent / "assets" / "shapes_vit" / "labels.txt"  # its classes, one a line

_REGISTERED = re.compile(r"@register_model\s*\n\s*def\s+(\w+)\s*\(")
_DEPRECATIONS = re.compile(r"register_model_deprecations\(\s*__name__\s*,\s*\{(.*?)\}\s*\)", re.S)
_TABLE_KEY = re.compile(r"['\"]([\w.-]+)['\"]\s*:")


def did_you_mean(word: str, choices: list[str]) -> str:
    """' Did you mean a, b?' with the choices closest to `word` (difflib's ratio of at least 0.6), or ''."""
    close = difflib.get_close_matches(word, choices, n=3)
    return f" Did you mean {', '.join(close)}?" if close else ""


@functools.cache
def timm_model_names() -> frozenset[str]:
    """The architecture names timm registers (its current and deprecated ones, and the bundled model's), read from
    the source files; empty where they can't be found or read (then nothing is refused before the import)."""
    spec = importlib.util.find_spec("timm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    names: set[str] = set()
    ours = Path(__file__).parent / "teaching" / "model.py"  # registers the bundled model's architecture in timm
    try:
        for source in [*(Path(spec.submodule_search_locations[0]) / "models").glob("*.py"), ours]:
            text = source.read_text(encoding="utf-8")
            names.update(_REGISTERED.findall(text))
            for table in _DEPRECATIONS.findall(text):
                names.update(_TABLE_KEY.findall(table))
    except OSError:
        return frozenset()
    return frozenset(names)


def model_candidates(names: frozenset[str] | set[str]) -> list[str]:
    """The names a mistyped model name is compared with: the ViT family's (ViT, DeiT) and the bundled model."""
    return sorted(n for n in names if "vit" in n or n.startswith("deit")) + [TEACHING_MODEL]


def unknown_model_message(name: str, names: frozenset[str] | set[str]) -> str:
    """The sentence for a model name timm doesn't know, with the closest of `model_candidates(names)`."""
    if name == TEACHING_MODEL.split("/", 1)[1]:  # `shapes-vit`: the bundled model without its owner
        return f"timm has no model called {name!r}. Did you mean {TEACHING_MODEL}?"
    return f"timm has no model called {name!r}.{did_you_mean(name, model_candidates(names))}"


def model_refused(name: str) -> str | None:
    """Why `name` names no model ViT Lens could load, said before torch is imported, or None (the bundled model, an
    "hf-hub:" id, a name timm registers, or timm's files unread: the loader checks those)."""
    if name == TEACHING_MODEL or name.startswith("hf-hub:"):
        return None
    names = timm_model_names()
    arch = name.split(".", 1)[0]  # timm's split_model_name_tag: the pretrained tag after the first '.'
    if not names or arch in names:
        return None
    return unknown_model_message(name, names)


def target_message(target: str, labels: list[str]) -> str:
    """The sentence for a --target no class is called (explain.resolve_target's rule: a label, or the first
    comma-separated part of one, ignoring case), with the closest labels."""
    choices = list(dict.fromkeys(part for label in labels for part in (label.lower(), label.split(",")[0].strip().lower())))
    return f"no class is labelled {target!r}.{did_you_mean(target.strip().lower(), choices)}"


def target_refused(target: str | None, model: str, labels_file: Path | None) -> str | None:
    """Why --target names no class of the bundled model, said before it loads, or None: an index, no target, or
    another model's classes (known only once it loads: explain.resolve_target says it then, with the same hint)."""
    if target is None or labels_file is not None or model != TEACHING_MODEL:
        return None
    wanted = target.strip().lower()
    if wanted.isascii() and wanted.isdigit():
        return None
    labels = TEACHING_LABELS.read_text(encoding="utf-8").splitlines()
    if any(wanted in (label.lower(), label.split(",")[0].strip().lower()) for label in labels):
        return None
    return target_message(target, labels)


def out_refused(out: Path) -> str | None:
    """Why --out can't be the output folder, said before the model loads, or None: it is a file, or the nearest
    folder above it that exists is not one this user may write into (the folder is made there once the model is
    loaded)."""
    if out.exists() and not out.is_dir():
        return "a file, not a folder."
    if out.is_dir():
        return None if os.access(out, os.W_OK | os.X_OK) else "Permission denied."
    above = Path(os.path.abspath(out)).parent
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        return f"{above} is a file, not a folder."
    return None if os.access(above, os.W_OK | os.X_OK) else f"{above}: Permission denied."
