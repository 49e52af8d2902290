"""The dashboard's server process, apart from its pages: the start (`serve`), thread and priority tuning
(`process`), the byte-bounded shared cache (`byte_budget`), saved weights uploads (`uploads`), and the one
module that uses Streamlit's private API, behind a version check (`streamlit_internals`)."""
