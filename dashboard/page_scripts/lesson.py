"""The "Lesson" page (URL /lesson, a step as /lesson?step=N): the ViT paper's story in ten steps on the sidebar's
model and image (dashboard/lesson)."""

import streamlit as st

from dashboard import caches, inputs, session
from dashboard.lesson.ui import lesson
from dashboard.server import process
from dashboard.views.attention import record_attention_distances
from dashboard.views.context import ViewContext
from dashboard.views.header import compact_page

# A projector's 1280 px go to the step: the inputs (image, drawing, model) stay one click away, behind the sidebar's
# button. Only the page opened here starts so; a student who opens the sidebar keeps it open across the steps.
st.set_page_config(initial_sidebar_state="collapsed")
compact_page()  # the explorer's page CSS: less padding, so the step's figure fits the first screen
request, loaded = session.chosen_model()
with st.sidebar:  # the canvas stays here: the step's figure is the main area's (it follows every stroke)
    image, source = inputs.image_and_source_ui(loaded.name)
    inputs.shown_caption(image, source)
inputs.refusal_ui()  # a refused file or drawing: said in the main area, above the step's figure

with st.spinner("Running the model on this image..."):
    cap = caches.held_capture(request, loaded, image, session.holder())
    ctx = ViewContext(request, loaded, cap, image)
    record_attention_distances(ctx)  # every image seen joins the session's distance average, as on One image

with process.new_image_turn:  # in a class's burst of uploads, one new image's figures at a time
    lesson(ctx)
