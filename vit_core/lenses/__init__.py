"""Lenses: a per-image analysis as one declared unit, found by name (docs/spec/interface.md, "Your own lens").

A lens is a function of one capture that returns a dict of arrays, declared with the sites it reads:

    from vit_core.lenses import lens

    @lens("qk", sites=["blocks.*.attn.q", "blocks.*.attn.k"])
    def qk(cap):                                        # cap: vit_core.Capture, read with cap.site(name)
        q, k = cap.site("blocks.*.attn.q"), cap.site("blocks.*.attn.k")   # (L, H, T, d_head) each
        return {"scores": q @ k.swapaxes(-1, -2)}       # (L, H, T, T)

`vit-lens analyze --lens FILE.py|module|name` runs every lens a file or module registers (or a built-in lens by
name: `BUILTIN`) on each image; its arrays go into the image's .npz as `<lens>.<key>`. A lens file is code: it
is loaded only from a command line or environment, never from anything a page's user sends.

The built-in per-image analyses are lenses too, one catalog (`catalog()`, declared in `builtin` and
`attention_logits`): each with its definition's heading in docs/spec/analyses.md, its sites, its keys, whether every
image's export holds it (`export_keys()`, what `vit_core.export.image_arrays` writes) and its twin in the browser's
lesson (`browser`: an output of the ONNX graph, `graph:<output>`, or a JavaScript expression over web/src/analyses.js,
`js:<expression>`; `graph_outputs()` is what vit_core.web.graph writes out).

This module imports nothing heavy (no torch, no numpy at import), so that a lens file, and `--help`, load at once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ..sites import SiteError
from . import builtin as _builtin
from .declare import _NAME, Lens, LensError, _declared_by, _registry
from .declare import EXPORTS as EXPORTS  # the public names of vit_core.lenses
from .declare import lens as lens

if TYPE_CHECKING:
    import numpy as np

    from ..capture import Capture

BUILTIN_MODULES = ("vit_core.lenses.builtin", "vit_core.lenses.attention_logits")  # the catalog's modules, in its order


def _module_file_sha256(module: Any) -> str:
    path = getattr(module, "__file__", None)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else ""


def _import_file(path: Path) -> Any:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"vit_lens_user_{path.stem.replace('-', '_')}_{digest}"  # one module per file, whatever its stem
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_lenses(given: str) -> list[Lens]:
    """The lenses `given` declares: a built-in lens's name (`BUILTIN`), a Python file (its path) or an importable
    module's name. Raises LensError in one sentence: not there, can't be imported (the error it raised), declares
    no lens. The file is imported once per process."""
    path = Path(given)
    try:
        if given in BUILTIN:
            module = importlib.import_module(BUILTIN[given])
            return [_registry[(BUILTIN[given], given)]]  # a built-in lens alone, not its module's others
        if given.endswith(".py") or path.exists():
            if not path.is_file():
                raise LensError(f"--lens {given}: no such file.")
            module = _import_file(path)
        else:
            module = importlib.import_module(given)
    except LensError:
        raise
    except SiteError as e:
        raise LensError(f"--lens {given}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a lens file is the user's code: any error it raises on import is theirs to read
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise LensError(f"--lens {given}: can't import it ({reason}).") from None
    found = _declared_by(module.__name__)
    if not found:
        raise LensError(f"--lens {given}: it declares no lens (decorate a function with @lens(\"name\", sites=[...]) "
                        "from vit_core.lenses).")
    sha = _module_file_sha256(module)
    return [replace(f, source=given, sha256=sha) for f in found]


def lenses_of(given: Sequence[str]) -> list[Lens]:
    """Every lens of each of `given` (`load_lenses`), in order. Raises LensError when two have the same name."""
    lenses: dict[str, Lens] = {}
    for one in given:
        for found in load_lenses(one):
            if found.name in lenses and lenses[found.name].source != found.source:
                raise LensError(f"--lens {one}: a lens named {found.name!r} came already from {lenses[found.name].source}.")
            lenses[found.name] = found
    return list(lenses.values())


def configured() -> list[str]:
    """The lens files and modules of $VIT_LENS_LENSES (`vit-lens dashboard --lens`), in order: what a server's pages
    may load, and nothing else."""
    from .. import settings

    return [one.strip() for one in settings.LENSES.text().split(os.pathsep) if one.strip()]


def sites_of(lenses: Iterable[Lens]) -> list[str]:
    """The sites `lenses` read, each once, in order: what `run_with_capture(..., sites=...)` is asked for."""
    return list(dict.fromkeys(site for one in lenses for site in one.sites))


def settings_key(one: Lens, given: Mapping[str, Any] | None = None) -> tuple[tuple[str, Any], ...]:
    """`one`'s settings with `given` over its defaults, as (name, value) pairs in its declared order: hashable, the
    key a cache of its results uses. Raises LensError naming a setting `one` doesn't declare."""
    given = dict(given or {})
    unknown = [key for key in given if key not in one.defaults]
    if unknown:
        have = ", ".join(one.defaults) or "none"
        raise LensError(f"lens {one.name!r} has no setting {unknown[0]!r} (its settings: {have}).")
    return tuple((key, given.get(key, default)) for key, default in one.settings)


def results_of(one: Lens, cap: Capture, settings: Mapping[str, Any] | None = None, loaded: Any = None
               ) -> dict[str, np.ndarray]:
    """`one`'s dict on `cap` with `settings` over its defaults (`settings_key`), its own keys, as numeric numpy arrays
    (`loaded`: the model, for a lens that `needs_model`). Raises LensError in one sentence naming the lens when it
    raises, returns anything but a dict of numeric arrays or other keys than it declares, or when a setting isn't
    one of its own."""
    import numpy as np

    chosen = dict(settings_key(one, settings))  # an unknown setting is the caller's error, said before the lens runs
    if one.needs_model and loaded is None:
        raise LensError(f"lens {one.name!r} reads the model's weights as well as the capture: pass the model (loaded=).")
    try:
        result = one.compute(cap, loaded, **chosen) if one.needs_model else one.compute(cap, **chosen)
        if not isinstance(result, Mapping):
            raise TypeError(f"it returned {type(result).__name__}, not a dict of arrays")
        if one.keys and tuple(result) != one.keys:
            raise TypeError(f"it returned the keys {list(result)}, not its declared {list(one.keys)}")
        arrays = {}
        for key, value in result.items():
            array = np.asarray(value)
            if not isinstance(key, str) or not _NAME.fullmatch(key.replace(".", "_")):
                raise TypeError(f"key {key!r} is not a name")
            if array.dtype.kind not in "biuf":
                raise TypeError(f"{key!r} is {array.dtype}, not numbers")
            arrays[key] = array
        return arrays
    except Exception as e:  # noqa: BLE001 - the lens is the user's code: whatever it raises is said, the other lenses still run
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise LensError(f"lens {one.name!r} failed: {reason}") from None


def arrays_of(one: Lens, cap: Capture, settings: Mapping[str, Any] | None = None, loaded: Any = None
              ) -> dict[str, np.ndarray]:
    """`one`'s arrays on `cap` (`results_of`), keyed `<lens>.<key>`."""
    return {f"{one.name}.{key}": array for key, array in results_of(one, cap, settings, loaded).items()}


def summary(lenses: Iterable[Lens]) -> list[dict[str, Any]]:
    """The `.json`'s "lenses": each lens's name, sites, source and the SHA-256 of its file."""
    return [{"name": one.name, "sites": list(one.sites), "source": one.source, "sha256": one.sha256} for one in lenses]


def catalog() -> list[Lens]:
    """Every built-in lens, in the catalog's order (BUILTIN_MODULES, each in its declaration order): the per-image
    analyses of docs/spec/analyses.md. Imports their modules (attention_logits imports numpy)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    return [found for module in BUILTIN_MODULES for found in _declared_by(module)]


def export_keys(export: str = "image") -> tuple[str, ...]:
    """The keys of every image's export ("image": interface.md, "Command line") or of `analyze --explain`'s
    ("explain") that the catalog computes, in the file's order; light: reads the declarations, imports no numpy."""
    return tuple(key for one in _declared_by(BUILTIN_MODULES[0]) if one.export == export for key in one.keys)


def graph_outputs() -> tuple[str, ...]:
    """The outputs of the lesson's ONNX graph that the catalog's lenses twin, in the catalog's order, each once."""
    return tuple(dict.fromkeys(twin.removeprefix("graph:") for one in catalog() for _, twin in one.browser
                               if twin.startswith("graph:")))


# built-in lens name -> the module that declares it: what `--lens NAME` runs and the Lenses tab offers, the lenses no
# export writes already; attention_logits's module imports numpy, so its name is spelled here
BUILTIN = {one.name: _builtin.__name__ for one in _declared_by(_builtin.__name__) if not one.export} | {
    "attention_logits": BUILTIN_MODULES[1]}
