"""The tabs of the One image page, one function per tab, in modules by family.

Views get a `ViewContext` (model, capture, image: `views.context`) and never run the model themselves: everything
comes from the one cached capture, and the analyses of it from `dashboard.caches`. Controls that only change what
is shown live in `@st.fragment`s, so moving them reruns that fragment alone. Figures come from `dashboard.figures`
(pure builders), through the small functions beside each view (`_tokens_png`, `_attention_overlay`, ...): each takes
its source (the `ViewContext`, or the `ModelSource` for figures of the model alone) and the settings it is drawn
with, and `cached_figure` keys the shared cache on exactly those (dashboard/figure_keys.py). Widget keys and the
session's own state are `dashboard.session`'s.

Each view module registers its tabs (`dashboard.views.registry`): a new tab is one decorator on its view function,

    @view("Compare", family="research", order=60)   # from dashboard.views.registry import view

and its module's name in the import below. `VIEWS` maps each tab's label to its view function, in the order of the
tabs (the label is the `?view=` value): the lesson's eight stages (`LESSON_VIEWS`) numbered in the order the paper
tells them (`1 Pipeline` ... `8 Why?`), then the research tools (`RESEARCH_VIEWS`, set apart on the page by
views.header.PAGE_CSS). `RENAMED` maps the labels of older links (`?view=Attention`) to today's (`5 Attention`): the
page opens those tabs as before. The Lenses tab shows the built-in lenses and those of the server's lens files
(`views.lenses`).
"""

from __future__ import annotations

from collections.abc import Callable

from dashboard.views import (  # noqa: F401 - each registers its tabs
    attention,
    compare,
    concepts,
    embeddings,
    interventions,
    lens,
    lenses,
    pipeline,
    prediction,
    registers,
    why,
)
from dashboard.views.context import ViewContext
from dashboard.views.registry import register_view, tabs

# concepts.py's tab is registered here, by the same call its decorator would make.
register_view("Concepts", concepts.concepts_view, family="research", order=40)

LESSON_VIEWS: dict[str, Callable[[ViewContext], None]] = tabs("lesson")
RESEARCH_VIEWS: dict[str, Callable[[ViewContext], None]] = tabs("research")
RENAMED = {name: f"{i} {name}" for i, name in enumerate(LESSON_VIEWS, start=1)}  # old ?view= label -> tab label
VIEWS: dict[str, Callable[[ViewContext], None]] = {RENAMED[name]: view for name, view in LESSON_VIEWS.items()} | RESEARCH_VIEWS
