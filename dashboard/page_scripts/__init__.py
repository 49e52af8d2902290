"""The page scripts of the dashboard: `st.navigation` in dashboard/app.py runs them as scripts, in every script run
after the sidebar's model choice. Not for importing: a page draws itself when it runs."""
