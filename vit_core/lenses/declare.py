"""The declaration of a lens (`@lens`, `Lens`) and the registry of those declared in this process: the part of
vit_core.lenses that its built-in lens modules import (docs/spec/interface.md, "Your own lens"). Imports nothing
heavy."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from ..errors import ViTLensError
from ..sites import canonical

if TYPE_CHECKING:
    from ..capture import Capture

EXPORTS = ("", "image", "explain")  # where a built-in lens's keys are written as they are (Lens.export)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class LensError(ViTLensError):
    """A lens file that can't be used (missing, can't be imported, registers nothing), or a lens that failed on an image."""


@dataclass(frozen=True)
class Lens:
    name: str  # the prefix of its arrays: <name>.<key>
    sites: tuple[str, ...]  # the sites it reads beyond the default capture (vit_core.sites names)
    compute: Callable[[Capture], Mapping[str, Any]]  # capture -> {key: array}
    spec: str = ""  # where its definition is (docs/spec/analyses.md's heading), for built-in lenses
    source: str = ""  # the file or module it was loaded from
    sha256: str = ""  # of that file (a module: of its file), recorded beside the results
    settings: tuple[tuple[str, Any], ...] = ()  # (name, default) of each setting, in order: compute(cap, **settings)
    keys: tuple[str, ...] = ()  # the keys of its dict, when declared (the catalog's are): checked on every result
    export: str = ""  # "image": its keys are in every image's export as they are (`export_keys()`); "explain": in
    # `analyze --explain`'s; "": only asked for by name (`--lens NAME`), as <name>.<key>
    browser: tuple[tuple[str, str], ...] = ()  # (key, its twin in the lesson: "graph:<output>" or "js:<expression>")
    needs_model: bool = False  # computed from the capture and the model's weights: compute(cap, loaded, **settings)

    @property
    def defaults(self) -> dict[str, Any]:
        """Its settings' defaults, name -> value (empty for a lens without settings)."""
        return dict(self.settings)


_SETTING_TYPES = (bool, int, float, str, type(None))  # hashable and JSON-able: a setting keys a cache and a file
_registry: dict[tuple[str, str], Lens] = {}  # every lens declared in this process, by (its module, its name)


def _declared_settings(name: str, settings: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """`settings` (setting -> default) as (name, default) pairs; LensError for a name that isn't an identifier or a
    default that isn't None, a bool, an int, a float or a str."""
    pairs = tuple((settings or {}).items())
    for key, default in pairs:
        if not isinstance(key, str) or not key.isidentifier():
            raise LensError(f"lens {name!r}: setting {key!r} is not a Python name (it is passed as compute(cap, {key}=...)).")
        if not isinstance(default, _SETTING_TYPES):
            raise LensError(f"lens {name!r}: setting {key!r} defaults to a {type(default).__name__}; use None, a bool, "
                            "an int, a float or a str.")
    return pairs


def lens(name: str, sites: Iterable[str] = (), *, spec: str = "", settings: Mapping[str, Any] | None = None,
         keys: Iterable[str] = (), export: str = "", browser: Mapping[str, str] | None = None,
         needs_model: bool = False) -> Callable[[Callable], Callable]:
    """Declare `compute(cap) -> {key: array}` a lens named `name` that reads `sites` (checked here: a name that isn't
    a site raises SiteError). `settings` (setting -> default: None, bool, int, float or str) are passed to it as
    keywords, `compute(cap, **settings)`, and key the results a cache holds (`settings_key`). The catalog's own
    declarations add `keys` (those its dict has), `export`, `browser` and `needs_model` (module docstring).
    Returns the function unchanged."""
    if not _NAME.fullmatch(name):
        raise LensError(f"lens name {name!r}: use letters, digits, _ and - (it prefixes the lens's arrays: <name>.<key>).")
    sites = tuple(sites)
    for site in sites:
        canonical(site)
    declared = _declared_settings(name, settings)
    keys, twins = tuple(keys), tuple((browser or {}).items())
    if any(key not in keys for key, _ in twins) or any(not twin.startswith(("graph:", "js:")) for _, twin in twins):
        raise LensError(f"lens {name!r}: each browser twin is one of its keys -> 'graph:<output>' or 'js:<expression>'.")
    if export not in EXPORTS:
        raise LensError(f"lens {name!r}: export is one of {', '.join(map(repr, EXPORTS))}.")

    def declare(compute: Callable) -> Callable:
        module = getattr(compute, "__module__", "")
        _registry.pop((module, name), None)  # a module imported again declares its lenses again, in its order
        _registry[(module, name)] = Lens(name, sites, compute, spec=spec, source=module, settings=declared, keys=keys,
                                         export=export, browser=twins, needs_model=needs_model)
        return compute

    return declare


def _declared_by(module_name: str) -> list[Lens]:
    return [found for found in _registry.values() if found.source == module_name]
