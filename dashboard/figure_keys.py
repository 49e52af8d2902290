"""Cache keys of figures, derived from what the figure builder takes, so that no key can miss a value. No Streamlit here.

A figure is `build(source, *settings, **options)`:
- `build` is a module-level function (no lambda, no closure): it sees nothing but its arguments and
  the module's constants, and its qualified name says which figure it is;
- `source` names the arrays the figure is drawn from by a stable identity (`source.cache_key`: the
  model key, and for per-image figures the image's sha256), never by hashing them;
- settings and options are small hashable values (numbers, strings, booleans, None, tuples of them).
The key is all of that, written with `repr` (so 1, 1.0, True and "1" stay different).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

_SCALARS = (bool, int, float, str, type(None))


class FigureSource(Protocol):
    @property
    def cache_key(self) -> str: ...


def check_builder(build: Callable[..., Any]) -> None:
    """Raise TypeError unless `build` is a module-level function (what it draws is then fixed by its arguments)."""
    if not inspect.isfunction(build) or build.__closure__ is not None or "<" in build.__qualname__:
        raise TypeError(f"a figure builder must be a module-level function, not {build!r}: a lambda or closure "
                        "would draw values the cache key does not hold")


def check_setting(value: Any) -> None:
    """Raise TypeError unless `value` is a small hashable setting (arrays go by their source's identity)."""
    if isinstance(value, tuple):
        for item in value:
            check_setting(item)
    elif type(value) not in _SCALARS:
        raise TypeError(f"a figure setting must be a number, string, bool, None or a tuple of them, not "
                        f"{type(value).__name__}: pass arrays through the figure's source instead")


def figure_key(build: Callable[..., Any], source: FigureSource, settings: tuple, options: dict[str, Any]) -> str:
    """The cache key of `build(source, *settings, **options)`."""
    check_builder(build)
    for value in (*settings, *options.values()):
        check_setting(value)
    return repr((f"{build.__module__}.{build.__qualname__}", source.cache_key, settings, tuple(sorted(options.items()))))
