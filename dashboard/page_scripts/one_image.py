"""The "One image" page (the default, URL "/" or /one-image): an image in the sidebar, a one-line header, then one
tab per stage of the forward pass, numbered in the lesson's order, and the research tools (`?view=5+Attention&layer=3`
opens a tab with its settings; the older `?view=Attention` and `&head=2` too). With Draw on, the canvas sits in the main area
beside the crop the model sees and its prediction."""

import streamlit as st

from dashboard import caches, downloads, inputs, session
from dashboard.server import process
from dashboard.views import RENAMED, VIEWS
from dashboard.views.attention import head_label, record_attention_distances
from dashboard.views.context import ViewContext
from dashboard.views.header import compact_page, drawing_result, header

compact_page()
request, loaded = session.chosen_model()
# a link's older tab label, head number or token index, as the widgets' labels (the page runs again once)
session.open_link(RENAMED, head_label, loaded.geometry.token_name, loaded.geometry.num_heads, loaded.geometry.num_tokens)
top = st.container()  # the header, filled once the image is known
canvas_col = result_col = None
if session.drawing_on():  # the canvas beside what the model makes of it, above the tabs
    canvas_col, result_col = st.columns([1, 2], gap="medium")
with st.sidebar:
    image, source = inputs.image_and_source_ui(loaded.name, canvas_area=canvas_col)
    inputs.shown_caption(image, source)
with top:  # a refused file or drawing is said first in the main area, where the user looks
    inputs.refusal_ui()

with st.spinner("Running the model on this image..."):
    cap = caches.held_capture(request, loaded, image, session.holder())
    ctx = ViewContext(request, loaded, cap, image)
    record_attention_distances(ctx)  # every image seen joins the session's distance average

with process.new_image_turn:  # in a class's burst of uploads, one new image's figures at a time
    with st.sidebar:
        st.divider()
        downloads.downloads_ui(ctx)
        st.caption(f"Weights: {loaded.weights}. One forward pass: {cap.forward_seconds * 1000:.0f} ms.")

    with top:
        header(ctx, source)  # random weights are marked there
    if result_col is not None:
        drawing_result(ctx, result_col)

    tabs = st.tabs(list(VIEWS), key=session.K_VIEW, bind="query-params")
    for tab, view in zip(tabs, VIEWS.values(), strict=True):
        if tab.open:  # only the open tab runs: switching tabs reruns the script, the forward pass stays cached
            with tab:
                view(ctx)
