"""Spectral signal (Step 1): each head's PR over training and the PR-integral ranking with top-K."""

import streamlit as st

from core.figures.spectral import pr_integral_grid, pr_integral_ranking, pr_trajectories
from core.heads import head_name, parse_heads
from pages._cache import screen_report
from pages._state import PR_DEFINITION, bound, offer_inspect, require_workspace
from pages._widgets import guarded, show_figure

DEFINITIONS = {
    "entropy": "entropy effective rank exp(H(s²/Σs²)) of the uncentered head outputs (reference code)",
    "classic": "classic participation ratio tr(C)²/‖C‖²_F of the centered covariance (paper wording)",
}

st.title("Spectral signal")
ws = require_workspace()

c1, c2 = st.columns([2, 1])
with c1:
    definition = bound(st.radio, "PR definition", PR_DEFINITION, list(DEFINITIONS), horizontal=True,
                       format_func=lambda d: {"entropy": "entropy effective rank", "classic": "classic PR"}[d])
report = guarded(lambda: screen_report(ws, definition))
if report.spectral is None:  # one checkpoint (a user's own model): no trajectory to integrate
    st.info(f"{report.spectral_note} The Pattern screen page shows the screen and its candidate circuit.")
    st.stop()
n_layers, n_heads = report.shape
k = int(c2.number_input("top-K heads", 1, n_layers * n_heads, int(report.spectral.k), key="spectral_k"))
if k != report.spectral.k:
    report = guarded(lambda: screen_report(ws, definition, k))
spectral = report.spectral
st.caption(f"PR definition: **{definition}** — {DEFINITIONS[definition]}. PR-integral rule: {spectral.rule} "
           f"on ln(tokens), I = ∫ max(PR − 1, 0) d ln tokens.")

top = list(spectral.top_heads)
names = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]
highlight_names = st.multiselect("Highlight heads", names, default=[head_name(h) for h in top],
                                 key=f"highlight-{ws.model_name}-{definition}-{k}")
highlight = parse_heads(",".join(highlight_names)).heads if highlight_names else ()

picked = show_figure(pr_trajectories(spectral, report.model, report.probe_spec, highlight, ws.checkpoint.tokens),
                     "spectral_trajectories", pickable=True)
offer_inspect(picked)

left, right = st.columns([3, 2])
with left:
    show_figure(pr_integral_ranking(spectral, report.model, report.probe_spec, k), "spectral_ranking")
with right:
    picked = show_figure(pr_integral_grid(spectral, report.model, report.probe_spec), "spectral_grid", pickable=True)
    offer_inspect(picked)

st.markdown(f"**Top-{k} spectral heads:** {', '.join(head_name(h) for h in top)}")
if spectral.dropped:
    dropped = ", ".join(spectral.revisions[i] for i in spectral.dropped)
    st.caption(f"Left out of the integral (no log of 0 tokens): {dropped}.")
