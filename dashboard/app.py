"""ViT Lens: look inside a Vision Transformer, on your own image or on many.

    vit-lens dashboard        (or: streamlit run dashboard/app.py, with ViT Lens installed)

The entry point only navigates: the page settings, the sidebar's model choice shared by every page, and
`st.navigation` over the page scripts of dashboard/page_scripts/ (not `pages/`: Streamlit takes a `pages/` folder
beside the main script for its older file-based pages, and a fresh server then answers a link such as
/lesson?step=4 with "Page not found" before the page): "One image" (the default, URL "/": an image, then one tab
per stage of the forward pass; a link such as `?view=Attention&layer=3` opens that tab and layer) and "Many
images" (/many-images: the attention distance, accuracy and high-norm rate over a set of images) and "Lesson"
(/lesson, a step as /lesson?step=N: the paper's story in ten guided steps on the same model and image,
dashboard/lesson). Every page gets the model chosen here from the session (`session.chosen_model`).
"""

from pathlib import Path

import streamlit as st

from dashboard import model_choice
from dashboard.server import process
from dashboard.upload_limits import upload_limits

# The tab's icon ships with the package: a `:material/...:` page icon is fetched from a font host, offline in vain.
ICON = Path(__file__).resolve().parent / "icon.png"
st.set_page_config(page_title="ViT Lens", page_icon=ICON, layout="wide")
with process.serving(upload_limits):  # `streamlit run dashboard/app.py` too, not only the server start: see process.serving
    page = st.navigation([
        st.Page("page_scripts/one_image.py", title="One image", icon=":material/image:", url_path="one-image", default=True),
        st.Page("page_scripts/many_images.py", title="Many images", icon=":material/photo_library:", url_path="many-images"),
        st.Page("page_scripts/lesson.py", title="Lesson", icon=":material/school:", url_path="lesson"),
    ])
    # One widget for every page, so it keeps its value across pages. After st.navigation: the model choice may rerun
    # the script (a refused or matched model), and a rerun before the page is known reopened /lesson?step=4 as "/".
    model_choice.sidebar()
    page.run()
