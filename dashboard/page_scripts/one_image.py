"""The "One image" page (the default, URL "/" or /one-image): an image in the sidebar, then one tab per stage of the
forward pass (`?view=Attention&layer=3` opens a tab with its settings)."""

import streamlit as st

from dashboard import caches, downloads, inputs, session
from dashboard.server import process
from dashboard.views import VIEWS
from dashboard.views.attention import record_attention_distances
from dashboard.views.context import ViewContext
from dashboard.views.header import header

request, loaded = session.chosen_model()
with st.sidebar:
    image = inputs.image_ui(loaded.name)

with st.spinner("Running the model on this image..."):
    cap = caches.held_capture(request, loaded, image, session.holder())
    ctx = ViewContext(request, loaded, cap, image)
    record_attention_distances(ctx)  # every image seen joins the session's distance average

with process.new_image_figures_in_turn():  # in a class's burst of uploads, one new image's figures at a time
    with st.sidebar:
        st.divider()
        downloads.downloads_ui(ctx)
        st.caption(f"Weights: {loaded.weights}. One forward pass: {cap.forward_seconds * 1000:.0f} ms.")

    inputs.untrained_warning(loaded)
    header(ctx)

    tabs = st.tabs(list(VIEWS), key=session.K_VIEW, bind="query-params")
    for tab, view in zip(tabs, VIEWS.values(), strict=True):
        if tab.open:  # only the open tab runs: switching tabs reruns the script, the forward pass stays cached
            with tab:
                view(ctx)
