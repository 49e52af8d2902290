"""ViT Lens: look inside a Vision Transformer, on your own image.

    vit-lens dashboard        (or: streamlit run dashboard/app.py, with ViT Lens installed)

Sidebar: model, image, downloads. Main area: a header, then one tab per stage of the forward pass.
"""

import streamlit as st

from dashboard import inputs, process, state, views, why_views

st.set_page_config(page_title="ViT Lens", page_icon=":material/visibility:", layout="wide")
process.configure_torch_threads()

with st.sidebar:
    st.title("ViT Lens")
    st.caption("Look inside a Vision Transformer, on your own image.")
    request = inputs.model_ui()
    request, loaded = inputs.load_model_ui(request)
    image = inputs.image_ui(loaded.name)

with st.spinner("Running the model on this image..."):
    cap = state.held_capture(request, loaded, image)
    state.record_attention_distances(request, image, cap)  # every image seen joins the session's distance average
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

process.freeze_long_lived_heap()  # after the first full page: Streamlit's per-rerun gc.collect gets cheap
