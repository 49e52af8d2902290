"""The One image page's tabs, each registered by the module that draws it: a label, a family and a place in its family.

    from dashboard.views.registry import view

    @view("Compare", family="research", order=60)
    def compare_view(ctx: ViewContext) -> None:
        ...

A lesson tab ("lesson") is shown as "<its place> <label>" (`5 Attention`), its `order` being its stage in the paper's
story; a research tool ("research") as its label, after the lesson's tabs. `dashboard.views` imports every view module
and builds `VIEWS` and `RENAMED` from what they registered (`tabs`), so a tab is added, moved or renamed in its own
module and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dashboard.views.context import ViewContext

FAMILIES = ("lesson", "research")  # in the order of the tab row

View = Callable[["ViewContext"], None]


@dataclass(frozen=True)
class Tab:
    label: str  # a lesson tab's name without its number; a research tool's tab label
    family: str  # one of FAMILIES
    order: float  # its place within its family (smaller first)
    draw: View


_tabs: dict[str, Tab] = {}  # every registered tab, by label


def _name(draw: View) -> str:
    return f"{draw.__module__}.{draw.__qualname__}"


def register_view(label: str, draw: View, *, family: str, order: float) -> View:
    """Register `draw(ctx)` as the tab `label` of `family`, at `order` within it; returns `draw` unchanged. Raises
    ValueError for an unknown family, or a label or (family, order) another view has already."""
    if family not in FAMILIES:
        raise ValueError(f"view {label!r}: family {family!r} is not one of {', '.join(FAMILIES)}.")
    known = _tabs.get(label)
    if known is not None and _name(known.draw) != _name(draw):  # the same function again: its module imported again
        raise ValueError(f"view {label!r} is registered already, by {_name(known.draw)}.")
    clash = next((t for t in _tabs.values() if t.label != label and (t.family, t.order) == (family, order)), None)
    if clash is not None:
        raise ValueError(f"view {label!r}: {family} place {order} is {clash.label!r}'s already.")
    _tabs[label] = Tab(label, family, order, draw)
    return draw


def view(label: str, *, family: str, order: float) -> Callable[[View], View]:
    """`register_view` as a decorator of the view function."""
    return lambda draw: register_view(label, draw, family=family, order=order)


def tabs(family: str) -> dict[str, View]:
    """The views of `family` registered so far, label -> view, in their order."""
    return {t.label: t.draw for t in sorted((t for t in _tabs.values() if t.family == family), key=lambda t: t.order)}
