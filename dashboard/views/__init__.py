"""The tabs of the One image page, one function per tab, in modules by family.

Views get a `ViewContext` (model, capture, image: `views.context`) and never run the model themselves: everything
comes from the one cached capture, and the analyses of it from `dashboard.caches`. Controls that only change what
is shown live in `@st.fragment`s, so moving them reruns that fragment alone. Figures come from `dashboard.figures`
(pure builders), through the small functions beside each view (`_tokens_png`, `_attention_overlay`, ...): each takes
its source (the `ViewContext`, or the `ModelSource` for figures of the model alone) and the settings it is drawn
with, and `cached_figure` keys the shared cache on exactly those (dashboard/figure_keys.py). Widget keys and the
session's own state are `dashboard.session`'s.

`VIEWS` maps each tab's label to its view function, in the order of the tabs (the label is the `?view=` value): the
lesson's eight stages numbered in the order the paper tells them (`1 Pipeline` ... `8 Why?`), then the research tools
(`RESEARCH_VIEWS`, set apart on the page by views.header.PAGE_CSS). `RENAMED` maps the labels of older links
(`?view=Attention`) to today's (`5 Attention`): the page opens those tabs as before. The Lenses tab shows the built-in
lenses and those of the server's lens files (`views.lenses`).
"""

from __future__ import annotations

from collections.abc import Callable

from dashboard.views import attention, concepts, embeddings, interventions, lens, lenses, pipeline, prediction, registers, why
from dashboard.views.context import ViewContext

LESSON_VIEWS: dict[str, Callable[[ViewContext], None]] = {
    "Pipeline": pipeline.pipeline_view,
    "Patches": pipeline.patches_view,
    "Filters": embeddings.filters_view,
    "Positions": embeddings.positions_view,
    "Attention": attention.attention_view,
    "Distance": attention.distance_view,
    "Prediction": prediction.prediction_view,
    "Why?": why.why_view,
}
RESEARCH_VIEWS: dict[str, Callable[[ViewContext], None]] = {
    "Interventions": interventions.interventions_view,
    "Logit lens": lens.logit_lens_view,
    "Registers & norms": registers.registers_view,
    "Concepts": concepts.concepts_view,
    "Lenses": lenses.lenses_view,
}
RENAMED = {name: f"{i} {name}" for i, name in enumerate(LESSON_VIEWS, start=1)}  # old ?view= label -> tab label
VIEWS: dict[str, Callable[[ViewContext], None]] = {RENAMED[name]: view for name, view in LESSON_VIEWS.items()} | RESEARCH_VIEWS

