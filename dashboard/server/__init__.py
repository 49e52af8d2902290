"""The dashboard's server wing, below its pages: one door that prepares the process and schedules its runs
(`process`), the byte-bounded shared cache (`byte_budget`), saved weights uploads (`uploads`), and the one module
that uses Streamlit's private API, behind a version check (`streamlit_internals`). The server's start, which fills
the pages' caches before the first visitor, stands above them all (`dashboard.serve`)."""
