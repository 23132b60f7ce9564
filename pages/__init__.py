"""Streamlit pages: thin views that read the workspace state, call core, and draw figures."""
