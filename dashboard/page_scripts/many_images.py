"""The "Many images" page (/many-images): the model of the sidebar over a set of images, reduced per layer and head
(the paper's Fig. 7 right for the set, accuracy and logit-lens accuracy per layer, accuracy per class and the
confusion matrix, the high-norm token rate), with a row per image; and the concepts of a `vit-lens concepts` run
over the set."""

import streamlit as st

from dashboard import session, text
from dashboard.views import many_images

request, loaded = session.chosen_model()
st.header("Many images")
st.markdown(text.MANY_INTRO)
make_set = many_images.set_ui(loaded)
many_images.run_ui(request, loaded, make_set)
many_images.concepts_ui(request, loaded, make_set)
run = session.latest_many_run()
if run is not None:
    many_images.results_ui(run, request)
