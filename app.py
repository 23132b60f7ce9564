"""HeadLab: find attention-head circuits across training and test them causally.

Run with `make app` (http://127.0.0.1:8501). Pages are thin views over `core/`; the workspace
sidebar (pages/_shared.py) keeps the model, checkpoint and probe across pages and in the URL.
"""

import streamlit as st

st.set_page_config(page_title="HeadLab", page_icon=":material/hub:", layout="wide")

PAGES = [
    st.Page("pages/zoo.py", title="Models & training", icon=":material/model_training:", default=True),
    st.Page("pages/spectral.py", title="Spectral signal", icon=":material/show_chart:", url_path="spectral"),
    st.Page("pages/screen.py", title="Pattern screen", icon=":material/grid_on:", url_path="screen"),
    st.Page("pages/ablation.py", title="Ablation lab", icon=":material/science:", url_path="ablation"),
    st.Page("pages/inspector.py", title="Head inspector", icon=":material/search:", url_path="inspector"),
    st.Page("pages/coactivation.py", title="Co-activation", icon=":material/hub:", url_path="coactivation"),
    st.Page("pages/proposers.py", title="Proposers vs disposer", icon=":material/gavel:", url_path="proposers"),
    st.Page("pages/attribution.py", title="Gradient vs causal", icon=":material/compare_arrows:", url_path="attribution"),
    st.Page("pages/dynamics.py", title="Training dynamics", icon=":material/timeline:", url_path="dynamics"),
]

st.navigation(PAGES).run()
