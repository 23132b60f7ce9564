"""Head inspector: one head's attention on chosen probe examples, its score for every pattern, its PR
trajectory, and which examples ablating it hurt most."""

import numpy as np
import pandas as pd
import streamlit as st

from core.ablation.study import example_damage, worst_examples
from core.figures.ablation import head_grid
from core.figures.inspector import attention_pattern, attention_row, head_scores
from core.figures.spectral import head_pr
from core.heads import head_name
from core.tasks.vocab import token_label
from pages._cache import (cached_batch, cached_full_pattern, checkpoint_screen, checkpoint_stats, run_single_ablation,
                          screen_report, stored_single_ablation)
from pages._state import HEAD, ablation_history, current_head, require_workspace, sync_url, widget_key
from pages._widgets import guarded, new_pick, show_figure

GRID_KEY = "inspector_grid"
HEAD_BOX = widget_key(HEAD)  # the head select box
HEAD_SYNCED = "_head_synced"  # the head the box showed last run (to tell who changed it since)


def damage_table(damage: np.ndarray, clean_loss: np.ndarray, target: np.ndarray, n: int = 8) -> pd.DataFrame:
    """The n examples with the largest damage [example]: Δ loss, clean loss, target token."""
    return pd.DataFrame([{"example": int(i), "Δ loss": float(damage[i]), "clean loss": float(clean_loss[i]),
                          "target": token_label(int(target[i]))} for i in worst_examples(damage, n)])


st.title("Head inspector")
ws = require_workspace()
stats = guarded(lambda: checkpoint_stats(ws))
here = guarded(lambda: checkpoint_screen(ws))
batch = cached_batch(ws.spec_json)
patterns = list(here.patterns)
n_layers, n_heads = here.induction_selectivity.shape
names = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]

# A click on this page's grid picks the head (any page's grid sets it through the session and the URL).
picked = new_pick(GRID_KEY)
if picked:
    st.session_state[HEAD] = head_name(picked[0])

strongest = tuple(int(i) for i in np.unravel_index(np.nanargmax(here.induction_selectivity), (n_layers, n_heads)))
head = head_name(current_head(n_layers, n_heads, fallback=strongest))
# The head box follows both the user and the rest of the app: whichever changed since the last run wins.
synced = st.session_state.get(HEAD_SYNCED)
if st.session_state.get(HEAD_BOX) in names and st.session_state[HEAD_BOX] != synced:
    head = st.session_state[HEAD_BOX]  # picked in the box
st.session_state[HEAD_BOX] = head
top_left, top_right = st.columns([1, 3])
chosen = top_left.selectbox("Head", names, key=HEAD_BOX)
st.session_state[HEAD] = st.session_state[HEAD_SYNCED] = chosen
head = divmod(names.index(chosen), n_heads)
sync_url()
layer, h = head
top_right.markdown(f"### {head_name(head)} — class **{here.classes[layer, h]}** at `{ws.revision}`")

with st.expander("Pick a head on the grid", expanded=False):
    show_figure(head_grid(here.induction_selectivity, [head], ws.model_name, ws.revision,
                          "click a head (colour: induction selectivity)", classes=here.classes),
                GRID_KEY, pickable=True, stretch=False)

# ------------------------------------------------------------------ examples and attention
history = [e for e in ablation_history()
           if head in e["result"].selection and e["model"] == ws.model_name and e["revision"] == ws.revision
           and e["probe"] == ws.spec_json]
hurt = history[0]["result"] if history else None  # the latest ablation that included this head
default = worst_examples(example_damage(hurt.clean, hurt.candidate, "loss"), 3) if hurt else [0]
examples = st.multiselect("Probe examples (up to 4; after an ablation, the ones it hurt most come first)",
                          list(range(batch.n_examples)), default=default, max_selections=4,
                          key=f"examples-{ws.model_name}-{ws.revision}-{ws.spec_json}-{head_name(head)}")

if examples:
    full = guarded(lambda: cached_full_pattern(ws.model_name, ws.revision, ws.spec_json, layer, h, tuple(examples),
                                               ws.stamp, ws.dtype), stop=False)  # [example, q, k]
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
    if report is not None and report.spectral is None:  # one checkpoint: no PR trajectory to draw
        st.info(report.spectral_note)
    elif report is not None:
        show_figure(head_pr(report.spectral, head, report.model, report.probe_spec, ws.checkpoint.tokens), "inspector_pr")

# ------------------------------------------------------------------ which examples ablating it hurt most
st.subheader("Examples an ablation hurt most")
if history:
    latest = history[0]["result"]
    st.markdown(f"Group ablation **{latest.selection}** ({history[0]['label'].split(' · ')[0]}), which includes {head_name(head)}:")
    st.dataframe(damage_table(example_damage(latest.clean, latest.candidate, "loss"), latest.clean.loss, batch.target),
                 hide_index=True, width="stretch")
alone = stored_single_ablation(ws, head)
if alone is None and st.button(f"Ablate {head_name(head)} alone", key="inspector_single"):
    with st.spinner(f"Ablating {head_name(head)} on {batch.n_examples} probe examples..."):
        alone = guarded(lambda: run_single_ablation(ws, head), stop=False)
if alone is not None:
    clean, ablated = alone
    st.markdown(f"{head_name(head)} ablated alone (zero): mean Δ loss {float(ablated.delta(clean, 'loss').mean()):+.4f}")
    st.dataframe(damage_table(example_damage(clean, ablated, "loss"), clean.loss, batch.target), hide_index=True,
                 width="stretch")
elif not history:
    st.info("Run an ablation that includes this head in the Ablation lab, or ablate it alone here.")
