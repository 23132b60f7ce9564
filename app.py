"""HeadLab: find attention-head circuits across training and test them causally.

Run with `make app` (http://127.0.0.1:8501). Pages are thin views over `core/`.
"""

import streamlit as st

st.set_page_config(page_title="HeadLab", page_icon=":material/hub:", layout="wide")

PAGES = [
    st.Page("pages/zoo.py", title="Models & training", icon=":material/model_training:", default=True),
]

st.navigation(PAGES).run()
