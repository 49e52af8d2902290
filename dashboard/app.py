"""ViT Lens: look inside a Vision Transformer, on your own image or on many.

    vit-lens dashboard        (or: streamlit run dashboard/app.py, with ViT Lens installed)

Two pages with one sidebar model choice: "One image" (the default: an image, then one tab per stage of
the forward pass) and "Many images" (dashboard/many_images.py: the attention distance, accuracy and
high-norm rate over a set of images).
"""

from functools import partial

import streamlit as st

import vit_core
from dashboard import inputs, many_images, process, state, views, why_views
from dashboard.image_choice import ImageChoice
from dashboard.models import ModelRequest
from vit_core.loading import LoadedModel

st.set_page_config(page_title="ViT Lens", page_icon=":material/visibility:", layout="wide")
process.configure_torch_threads()
process.keep_made_downloads_for_a_while()  # `streamlit run dashboard/app.py` too, not only dashboard.serve


def one_image_page(request: ModelRequest, loaded: LoadedModel) -> None:
    """Sidebar: image, then downloads. Main area: a header, then one tab per stage of the forward pass."""
    with st.sidebar:
        image = inputs.image_ui(loaded.name)

    with st.spinner("Running the model on this image..."):
        cap = state.held_capture(request, loaded, image)
        state.record_attention_distances(request, image, cap)  # every image seen joins the session's distance average
    with process.new_image_figures_in_turn():  # in a class's burst of uploads, one new image's figures at a time
        image_figures(request, loaded, cap, image)


def image_figures(request: ModelRequest, loaded: LoadedModel, cap: vit_core.Capture, image: ImageChoice) -> None:
    """Sidebar: downloads. Main area: a header, then the open tab's stage of the forward pass."""
    ctx = views.ViewContext(request, loaded, cap, image)

    with st.sidebar:
        st.divider()
        inputs.export_ui(loaded, cap, ctx.stem)
        why_views.export_ui(ctx)
        st.caption(f"Weights: {loaded.weights}. One forward pass: {cap.forward_seconds * 1000:.0f} ms.")

    inputs.untrained_warning(loaded)
    views.header(ctx)

    tabs = st.tabs(list(views.VIEWS), key=state.K_VIEW, bind="query-params")
    for tab, view in zip(tabs, views.VIEWS.values(), strict=True):
        if tab.open:  # only the open tab runs: switching tabs reruns the script, the forward pass stays cached
            with tab:
                view(ctx)


with st.sidebar:  # the same model choice on both pages (one widget, so it keeps its value across pages)
    st.title("ViT Lens")
    st.caption("Look inside a Vision Transformer, on your own image.")
    request = inputs.model_ui()
    request, loaded = inputs.load_model_ui(request)

# The single-image page stays the default (URL "/"), so its links (?view=Attention&layer=3) open as before.
# The many-images page is a file that st.navigation runs as a script (so AppTest.switch_page can open it);
# it finds this run's model in the session (many_images.hand_over_model).
many_images.hand_over_model(request, loaded)
page = st.navigation([
    st.Page(partial(one_image_page, request, loaded), title="One image", icon=":material/image:",
            url_path="one-image", default=True),
    st.Page("many_images.py", title="Many images", icon=":material/photo_library:", url_path="many-images"),
])
page.run()

process.freeze_long_lived_heap()  # after the first full page: Streamlit's per-rerun gc.collect gets cheap
