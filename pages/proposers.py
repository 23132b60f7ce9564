"""Proposers vs disposer: spectral, pattern-screen, co-activation and gradient proposals, one closure test."""

import pandas as pd
import streamlit as st

from core.figures.proposers import proposers_figure
from core.pipelines.proposers import PROPOSERS
from pages._cache import run_proposers, stored_proposers
from pages._state import require_workspace, send_to_ablation_lab
from pages._widgets import guarded, show_figure

st.title("Proposers vs disposer")
st.caption(f"{len(PROPOSERS)} ways to propose a circuit on this checkpoint, each judged by the same closure test: the "
           "same random controls, the same seed, both closure rules of [CVC]. "
           + "; ".join(f"**{p.name}**: {p.summary}" for p in PROPOSERS) + ".")
ws = require_workspace()

left, mid, right = st.columns(3)
n_controls = int(left.number_input("Random controls per proposal", 5, 100, 20, key="pvd_controls"))
kind = mid.selectbox("Controls", ("any-layer", "matched"), key="pvd_kind",
                     help="any-layer: random heads of the same size anywhere (proposals sit in different layers); "
                          "matched: same count in each of the same layers.")
size = int(right.number_input("Heads per spectral / gradient proposal (0 = the screen circuit's size)", 0, 64, 0,
                              key="pvd_size"))

report = stored_proposers(ws, size, n_controls, kind)
if st.button("Propose and dispose", type="primary", key="pvd_run") and report is None:
    with st.status("Running the four proposers and their closure tests...", expanded=True) as status:
        report = guarded(lambda: run_proposers(ws, size, n_controls, kind, progress=lambda text: status.write(text)))
        status.update(label="Done", state="complete", expanded=False)

if report is None:
    st.info("Press **Propose and dispose**. The screen over all checkpoints is cached after the first run; "
            f"each proposal then costs one ablation pass per control ({n_controls} controls).")
    st.stop()

survivors = report.survivors()
if survivors:
    st.success(f"Survive closure (paper rule): {', '.join(survivors)}")
else:
    st.warning("No proposal survives closure (paper rule) on this checkpoint.")
show_figure(proposers_figure(report), key="pvd_fig")
st.dataframe(pd.DataFrame(report.rows()), hide_index=True, width="stretch")

st.markdown("**Send a proposal to the ablation lab**")
cols = st.columns(len(report.disposals))
for col, disposal in zip(cols, report.disposals):
    heads = disposal.proposal.heads
    col.button(disposal.proposal.method, key=f"pvd_send_{disposal.proposal.method}", disabled=len(heads) == 0,
               help=disposal.proposal.rationale, on_click=send_to_ablation_lab, args=(heads,))
