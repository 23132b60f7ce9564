"""Head inspector: one head's attention on chosen probe examples, its score for every pattern, its PR
trajectory, and which examples ablating it hurt most."""

import numpy as np
import pandas as pd
import streamlit as st

from core.ablation.engine import DAMAGE_SIGN, Ablation, run_conditions
from core.errors import HeadLabError
from core.figures.bundle import (attention_pattern, attention_row, head_grid, head_pr, head_scores, heads_from_points,
                          token_label, worst_examples)
from core.heads import HeadSet, head_name
from pages._shared import (ablation_store, cached_batch, cached_full_pattern, cached_model, checkpoint_screen,
                           checkpoint_stats, current_head, guarded, require_workspace, screen_report, show_figure,
                           sync_url)

GRID_KEY = "inspector_grid"

st.title("Head inspector")
ws = require_workspace()
stats = guarded(lambda: checkpoint_stats(ws))
here = guarded(lambda: checkpoint_screen(ws))
batch = cached_batch(ws.spec_json)
patterns = list(here.patterns)
n_layers, n_heads = here.induction_selectivity.shape
names = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]

# A click on this page's grid picks the head (any page's grid sets it through the session and the URL).
grid_state = st.session_state.get(GRID_KEY)
try:
    picked = heads_from_points(grid_state["selection"]["points"] if grid_state else [])
except (KeyError, TypeError, HeadLabError):
    picked = []
if picked and picked != st.session_state.get("_inspector_last"):
    st.session_state["head"] = head_name(picked[0])
st.session_state["_inspector_last"] = picked or None

strongest = tuple(int(i) for i in np.unravel_index(np.nanargmax(here.induction_selectivity), (n_layers, n_heads)))
head = head_name(current_head(n_layers, n_heads, fallback=strongest))
# The head box follows both the user and the rest of the app: whichever changed since the last run wins.
synced = st.session_state.get("_head_synced")
if st.session_state.get("_w_head") in names and st.session_state["_w_head"] != synced:
    head = st.session_state["_w_head"]  # picked in the box
st.session_state["_w_head"] = head
top_left, top_right = st.columns([1, 3])
chosen = top_left.selectbox("Head", names, key="_w_head")
st.session_state["head"] = st.session_state["_head_synced"] = chosen
head = divmod(names.index(chosen), n_heads)
sync_url()
layer, h = head
top_right.markdown(f"### {head_name(head)} — class **{here.classes[layer, h]}** at `{ws.revision}`")

with st.expander("Pick a head on the grid", expanded=False):
    show_figure(head_grid(here.induction_selectivity, [head], ws.model_name, ws.revision,
                          "click a head (colour: induction selectivity)", classes=here.classes),
                GRID_KEY, pickable=True, stretch=False)

# ------------------------------------------------------------------ examples and attention
history = [e for e in st.session_state.get("ablation_history", [])
           if head in e["result"].selection and e["model"] == ws.model_name and e["revision"] == ws.revision
           and e["probe"] == ws.spec_json]
default = worst_examples(history[0]["result"], "loss", 3) if history else [0]
examples = st.multiselect("Probe examples (up to 4; after an ablation, the ones it hurt most come first)",
                          list(range(batch.n_examples)), default=default, max_selections=4,
                          key=f"examples-{ws.model_name}-{ws.revision}-{ws.spec_json}-{head_name(head)}")

if examples:
    full = guarded(lambda: cached_full_pattern(ws.model_name, ws.revision, ws.spec_json, layer, h, tuple(examples),
                                               ws.stamp), stop=False)  # [example, q, k]
    tabs = st.tabs([f"example {e}" for e in examples])
    for i, (tab, ex) in enumerate(zip(tabs, examples)):
        q = int(batch.query_pos[ex])
        tokens = batch.tokens[ex].tolist()
        with tab:
            st.caption(f"query q = {q} ('{token_label(tokens[q])}'), target '{token_label(int(batch.target[ex]))}', "
                       f"earlier occurrence p = {int(batch.duplicate_pos[ex])}")
            if stats.attn_query is not None:
                row = stats.attn_query[ex, layer, h].float().numpy()
            elif full is not None:
                row = full[i, q]
            else:
                row = None
            left, right = st.columns([3, 2])
            with left:
                if row is not None:
                    show_figure(attention_row(row, tokens, q, int(batch.induction_pos[ex]), int(batch.duplicate_pos[ex]),
                                              head, ex, ws.model_name, ws.revision), f"inspector_row_{ex}")
            with right:
                if full is not None:
                    show_figure(attention_pattern(full[i], tokens, q, head, ex, ws.model_name, ws.revision),
                                f"inspector_pattern_{ex}", stretch=False)

# ------------------------------------------------------------------ scores and PR
floor = here.noise_floor
left, right = st.columns(2)
with left:
    show_figure(head_scores(here.selectivity[:, layer, h], patterns, head, ws.model_name, ws.revision, here.threshold,
                            None if floor is None else float(floor), float(here.membership[layer, h]),
                            here.induction_threshold, here.membership_baseline), "inspector_scores")
with right:
    report = guarded(lambda: screen_report(ws), stop=False)
    if report is not None:
        show_figure(head_pr(report.spectral, head, report.model, report.probe_spec, ws.checkpoint.tokens), "inspector_pr")

# ------------------------------------------------------------------ which examples ablating it hurt most
st.subheader("Examples an ablation hurt most")


def damage_table(damage: np.ndarray, clean_loss: np.ndarray, n: int = 8) -> pd.DataFrame:
    order = np.argsort(-damage, kind="stable")[:n]
    return pd.DataFrame([{"example": int(i), "Δ loss": float(damage[i]), "clean loss": float(clean_loss[i]),
                          "target": token_label(int(batch.target[i]))} for i in order])


if history:
    latest = history[0]["result"]
    st.markdown(f"Group ablation **{latest.selection}** ({history[0]['label'].split(' · ')[0]}), which includes {head_name(head)}:")
    st.dataframe(damage_table(DAMAGE_SIGN["loss"] * latest.candidate.delta(latest.clean, "loss"), latest.clean.loss),
                 hide_index=True, width="stretch")
key = ("single", ws.model_name, ws.revision, ws.spec_json, ws.stamp, head)
store = ablation_store()
if key not in store and st.button(f"Ablate {head_name(head)} alone", key="inspector_single"):
    try:
        with st.spinner(f"Ablating {head_name(head)} on {batch.n_examples} probe examples..."):
            model = cached_model(ws.model_name, ws.revision, ws.stamp)
            clean, (alone,) = run_conditions(model, batch, [Ablation(HeadSet((head,)), label=head_name(head))])
        store[key] = (clean, alone)
    except HeadLabError as exc:
        st.error(str(exc))
if key in store:
    clean, alone = store[key]
    st.markdown(f"{head_name(head)} ablated alone (zero): mean Δ loss {float(alone.delta(clean, 'loss').mean()):+.4f}")
    st.dataframe(damage_table(alone.delta(clean, "loss"), clean.loss), hide_index=True, width="stretch")
elif not history:
    st.info("Run an ablation that includes this head in the Ablation lab, or ablate it alone here.")
