"""The tabs of the One image page, one function per tab, in modules by family.

Views get a `ViewContext` (model, capture, image: `views.context`) and never run the model themselves: everything
comes from the one cached capture, and the analyses of it from `dashboard.caches`. Controls that only change what
is shown live in `@st.fragment`s, so moving them reruns that fragment alone. Figures come from `dashboard.figures`
(pure builders), through the small functions beside each view (`_tokens_png`, `_attention_overlay`, ...): each takes
its source (the `ViewContext`, or the `ModelSource` for figures of the model alone) and the settings it is drawn
with, and `cached_figure` keys the shared cache on exactly those (dashboard/figure_keys.py). Widget keys and the
session's own state are `dashboard.session`'s.

`VIEWS` maps each tab's label to its view function, in the order of the tabs (the label is the `?view=` value).
"""

from __future__ import annotations

from collections.abc import Callable

from dashboard.views import attention, embeddings, interventions, lens, pipeline, prediction, registers, why
from dashboard.views.context import ViewContext

VIEWS: dict[str, Callable[[ViewContext], None]] = {
    "Pipeline": pipeline.pipeline_view,
    "Patches": pipeline.patches_view,
    "Filters": embeddings.filters_view,
    "Positions": embeddings.positions_view,
    "Attention": attention.attention_view,
    "Distance": attention.distance_view,
    "Prediction": prediction.prediction_view,
    "Why?": why.why_view,
    "Interventions": interventions.interventions_view,
    "Logit lens": lens.logit_lens_view,
    "Registers & norms": registers.registers_view,
}
