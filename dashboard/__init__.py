"""ViT Lens dashboard (Streamlit). Entry point: `streamlit run dashboard/app.py`."""
