"""Pure figure builders of the dashboard, one module per family of views (arrays in, PNG bytes or one plotly
figure out; no Streamlit): `base` has what they share (encoding, colour maps, overlays, the patch grid, the
clickable image, mosaics, fonts, heat maps). The Fig. 7 (right) distance figure is `vit_core.plots`', shared with
the `dataset` command."""
