"""The One image page's tabs come from what the view modules register (dashboard.views.registry): the order, the
lesson's numbers and the older links' labels are derived from the registrations, and a clash is refused."""

from __future__ import annotations

import pytest

from dashboard.views import registry


@pytest.fixture
def empty(monkeypatch):
    monkeypatch.setattr(registry, "_tabs", {})


def _draw(ctx) -> None:
    del ctx


def _other(ctx) -> None:
    del ctx


def test_tabs_come_in_their_familys_order_whatever_the_order_of_registration(empty):
    for label, order in (("c", 30), ("a", 10), ("b", 20)):
        registry.register_view(label, lambda ctx: None, family="research", order=order)
    decorated = registry.view("first", family="lesson", order=1)(_draw)
    assert decorated is _draw  # the view function is kept as it is
    assert list(registry.tabs("research")) == ["a", "b", "c"]
    assert registry.tabs("lesson") == {"first": _draw}


def test_a_clash_is_refused_in_one_sentence_and_the_same_function_again_is_not_one(empty):
    registry.register_view("A", _draw, family="research", order=10)
    registry.register_view("A", _draw, family="research", order=10)  # its module imported again
    with pytest.raises(ValueError, match=r"^view 'A' is registered already, by .*test_view_registry\._draw\.$"):
        registry.register_view("A", _other, family="research", order=20)
    with pytest.raises(ValueError, match=r"^view 'B': research place 10 is 'A''s already\.$"):
        registry.register_view("B", _other, family="research", order=10)
    with pytest.raises(ValueError, match=r"^view 'C': family 'extra' is not one of lesson, research\.$"):
        registry.register_view("C", _other, family="extra", order=1)


def test_the_pages_tabs_are_the_registered_ones_in_the_order_of_today():
    from dashboard.views import LESSON_VIEWS, RENAMED, RESEARCH_VIEWS, VIEWS

    assert list(VIEWS) == ["1 Pipeline", "2 Patches", "3 Filters", "4 Positions", "5 Attention", "6 Distance",
                           "7 Prediction", "8 Why?", "Interventions", "Logit lens", "Registers & norms", "Concepts",
                           "Lenses", "Compare"]
    assert RENAMED == {name: f"{i} {name}" for i, name in enumerate(LESSON_VIEWS, start=1)}
    registered = registry.tabs("lesson") | registry.tabs("research")
    assert {RENAMED.get(label, label): draw for label, draw in registered.items()} == VIEWS
    assert all(draw.__module__.startswith("dashboard.views.") for draw in VIEWS.values())
    assert list(RESEARCH_VIEWS) == list(VIEWS)[len(LESSON_VIEWS):]
