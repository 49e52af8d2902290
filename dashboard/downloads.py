"""The sidebar's downloads of the One image page: every array of the image (.npz, the format of
`python -m vit_core analyze`), its summary (.json), and the arrays with the explanations (.npz).

The arrays are those the views computed (`caches.analysis_arrays`, `caches.explanation_arrays`: nothing is
computed a second time for a download), made on click on a download lane below the pages' priority
(`process.low_priority`) and written without holding the GIL (`vit_core.serving.npz_bytes`).
"""

from __future__ import annotations

import streamlit as st

from dashboard import caches
from dashboard.server import process
from dashboard.views.context import ViewContext
from vit_core import export, serving


def downloads_ui(ctx: ViewContext) -> None:
    request, loaded, image, cap = ctx.request, ctx.loaded, ctx.image, ctx.cap

    def npz() -> bytes:  # made on click, on a download lane
        return serving.npz_bytes(caches.analysis_arrays(request, loaded, image, cap))

    st.download_button("All arrays of this image (.npz)", data=process.low_priority(npz),
                       file_name=f"{ctx.stem}.npz", mime="application/zip", key="dl_npz", on_click="ignore",
                       icon=":material/download:", help="input crop, logits, attention of every layer and head, tokens, "
                                                        "distances, rollout, filters: the format of `python -m vit_core analyze`")
    st.download_button("Summary (.json)", data=export.json_bytes(export.summary(loaded, cap)), file_name=f"{ctx.stem}.json",
                       mime="application/json", key="dl_json", on_click="ignore", icon=":material/download:")
    if loaded.geometry.num_classes:
        explained_ui(ctx)


def explained_ui(ctx: ViewContext) -> None:
    """Every array of this image plus the explanation keys (interface.md), built on click from what the views
    computed: the deletion / insertion curves are in it once computed in the Why? tab."""
    request, loaded, image, cap = ctx.request, ctx.loaded, ctx.image, ctx.cap

    def npz() -> bytes:  # made on click, on a download lane
        return serving.npz_bytes(caches.analysis_arrays(request, loaded, image, cap)
                                 | caches.explanation_arrays(request, loaded, image, cap))

    st.download_button("All arrays + explanations (.npz)", data=process.low_priority(npz),
                       file_name=f"{ctx.stem}_explained.npz", mime="application/zip", key="dl_npz_explained",
                       on_click="ignore", icon=":material/download:",
                       help="the arrays above plus the target class, every relevance map, the logit lens and the token "
                            "norms; the deletion and insertion curves once computed in the Why? tab")
