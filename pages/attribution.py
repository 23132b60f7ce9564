"""Gradient vs causal [HHG]: gradient magnitude against ablation damage per component, hidden heroes,
gradient bloats and their joint ablation; over seeds, rho and how often each component is a hero or a bloat."""

from dataclasses import replace

import pandas as pd
import streamlit as st

from core.ablation.spec import SEQUENCE_MODES, mode_help, mode_label
from core.errors import HeadLabError
from core.figures.attribution import hero_bloat_heatmap, joint_ablation_bars, rank_scatter, rho_strip
from core.heads import head_name, parse_heads
from core.model.refs import read_manifest
from core.pipelines.attribution import manifest_task, sequence_zoo_models, stored_summaries
from core.pipelines.attribution_results import (CLASS_RULES, DEFAULT_THRESHOLD, GRADIENT_VARIANTS,
                                                AttributionSettings, parse_component)
from core.tasks.sequences import NUMBER_HIGH, NUMBER_LOW, OOD_LENGTHS, SEQ_VOCAB_SIZE, TASKS
from pages._cache import run_attribution, stored_attribution
from pages._state import MODEL, require_workspace, send_to_ablation_lab, set_choice
from pages._widgets import guarded, show_figure

SCATTER_KEY = "attr_scatter"
LAST_PICK = "_attr_last_pick"  # the heads last picked on the rank scatter
NUMBERS = (NUMBER_LOW, NUMBER_HIGH + 1)  # the lab's induction probe for these models: the numbers they know


def _group_label(s) -> str:
    """One stored group in words: size and settings."""
    x = s.settings
    return (f"{s.n_models} models · gradient {x.gradient_variant} · {mode_label(x.ablation_mode)} ablation · {x.rule} rule "
            f"(threshold {x.threshold:g}) · {x.n_batches} batches · OOD length {x.ood_length or 'auto'}")


def one_model(ws, settings: AttributionSettings) -> None:
    """Run (or load) the analysis of the workspace model and draw its figures."""
    entry = guarded(lambda: stored_attribution(ws, settings), stop=False)
    run = st.button("Run analysis", type="primary", key="attr_run", disabled=entry is not None,
                    help="Results are kept for this session; the same settings are not computed twice.")
    if run and entry is None:
        failure = None
        with st.status(f"Analysing {ws.model_name} at {ws.revision}...", expanded=True) as status:
            bar = st.progress(0.0, text="loading the model")

            def progress(stage: str, done: int, total: int) -> None:
                bar.progress(min(done / max(total, 1), 1.0), text=f"{stage}: {done}/{total}")

            try:
                entry = run_attribution(ws, settings, progress=progress)
            except HeadLabError as exc:
                failure = str(exc)
                status.update(label="The analysis stopped", state="error", expanded=False)
            else:
                status.update(label=f"Analysed {ws.model_name} in {entry['seconds']:.1f} s", state="complete",
                              expanded=False)
        if failure:
            st.error(failure)
        else:
            st.rerun()  # draw the result with the run button spent

    if entry is None:
        st.info(f"Press **Run analysis**: G over {settings.n_batches} OOD batches, then each of the components ablated "
                "alone and the heroes / bloats together (about 20 s for a 4 x 4 model with 50 batches on one CPU).")
    else:
        result = entry["result"]
        st.caption(f"{result.model} at {result.revision}: {entry['how']}.")
        for note in result.notes:
            st.warning(note, icon=":material/info:")
        m = st.columns(5)
        m[0].metric("OOD length", result.ood_length, help=result.provenance.get("ood_length_rule"))
        m[1].metric("clean exact match", f"{result.clean_accuracy:.2f}")
        m[2].metric("Spearman ρ(G, C)", "undefined" if result.rho is None else f"{result.rho:.2f}",
                    help=None if result.rho_p is None else f"p = {result.rho_p:.3g}")
        m[3].metric("hidden heroes", len(result.members("hero")))
        m[4].metric("gradient bloats", len(result.members("bloat")))
        st.caption("clean exact match by length: " + ", ".join(f"{n}: {a:.2f}" for n, a in sorted(result.accuracy_by_length.items()))
                   + f". Heroes: {', '.join(result.members('hero')) or 'none'}. Bloats: {', '.join(result.members('bloat')) or 'none'}.")

        left, right = st.columns(2)
        with left:
            picked = show_figure(rank_scatter(result), SCATTER_KEY, pickable=True)
        with right:
            show_figure(joint_ablation_bars(result), "attr_joint")
            j = [result.joint_bloats, result.joint_heroes]
            st.dataframe(pd.DataFrame([{
                "kind": x.kind, "members": ", ".join(x.components) or "none", "joint damage": x.joint_damage,
                "mean single damage": (sum(x.single_damages) / len(x.single_damages)) if x.single_damages else None,
                "joint / mean single": x.ratio_to_mean, "joint / sum": x.ratio_to_sum, "note": x.reason} for x in j]),
                hide_index=True, width="stretch")

        # to the ablation lab
        head_options = [c for c in result.components if parse_component(c)[1] is not None]
        select_key = f"attr_send::{result.model}::{result.revision}"
        if select_key not in st.session_state:
            st.session_state[select_key] = [c for c in result.members("hero") if c in head_options]
        picked_names = [head_name(h) for h in picked if head_name(h) in head_options]
        if picked_names and picked_names != st.session_state.get(LAST_PICK):
            st.session_state[select_key] = picked_names  # a new click / lasso on the scatter replaces the choice
        st.session_state[LAST_PICK] = picked_names or None
        s1, s2 = st.columns([3, 1], vertical_alignment="bottom")
        chosen = s1.multiselect("Heads to test in the ablation lab (click or lasso heads on the rank scatter)", head_options,
                                key=select_key)
        s2.button("Open in the ablation lab", key="attr_to_ablation", icon=":material/science:", disabled=not chosen,
                  on_click=send_to_ablation_lab,
                  args=(parse_heads(",".join(chosen)).heads if chosen else (), SEQ_VOCAB_SIZE, NUMBERS))
        st.caption("The ablation lab knocks out heads only (MLPs cannot be picked there) and scores them on its induction "
                   f"probe (for this model over the numbers {NUMBER_LOW}..{NUMBER_HIGH}) against matched-random controls.")
        with st.expander("Every component"):
            st.dataframe(pd.DataFrame(rank_scatter(result).rows), hide_index=True, width="stretch")


def seeds(ws, task: str) -> None:
    """The stored per-seed results of this task: rho per seed, hero / bloat frequencies."""
    st.subheader("Over seeds (stored results)")
    summaries = guarded(lambda: stored_summaries(task), stop=False) or []
    if not summaries:
        st.info(f"No stored per-seed {task} results yet. `python -m core attribution --zoo-preset paper --task {task}` "
                "analyses every seed of the paper preset (stored, resumable) and its figures appear here.")
        return

    index = 0
    if len(summaries) > 1:
        index = st.selectbox("Stored results analysed alike", range(len(summaries)), key="attr_group",
                             format_func=lambda i: _group_label(summaries[i]))
    else:
        st.caption(_group_label(summaries[0]))
    summary = summaries[index]
    other_task = next(t for t in TASKS if t != task)
    same_settings = replace(summary.settings, task=other_task)
    partners = [s for s in (guarded(lambda: stored_summaries(other_task), stop=False) or []) if s.settings == same_settings][:1]
    m = st.columns(4)
    m[0].metric("models", summary.n_models)
    m[1].metric("mean ρ ± std", "undefined" if summary.rho_mean is None else f"{summary.rho_mean:.2f} ± {summary.rho_std:.2f}")
    m[2].metric("ρ range", "undefined" if summary.rho_min is None else f"{summary.rho_min:.2f} .. {summary.rho_max:.2f}")
    m[3].metric("skipped", len(summary.skipped))
    left, right = st.columns([2, 3])
    with left:
        show_figure(rho_strip([summary] + partners, highlight=ws.model_name), "attr_rho_strip")
    with right:
        show_figure(hero_bloat_heatmap(summary), "attr_heatmap")
    st.dataframe(pd.DataFrame([{"kind": kind, **values} for kind, values in summary.joint.items()]), hide_index=True,
                 width="stretch")
    if summary.skipped:
        with st.expander(f"{len(summary.skipped)} model(s) skipped"):
            for name, reason in summary.skipped:
                st.markdown(f"- **{name}**: {reason}")


st.title("Gradient vs causal")
ws = require_workspace()
st.caption("[HHG] For a model trained on sequence reversal or sorting: each head's and MLP's gradient magnitude G "
           "on out-of-distribution (OOD) lengths against its causal importance C (the drop in OOD exact match when "
           "it is ablated). This page uses the model's own task, not the sidebar's probe.")

# ------------------------------------------------------------------ which task
trained_for = guarded(lambda: manifest_task(ws.ref))
if trained_for is None and ws.ref.kind == "zoo":  # an imported pretrained model's manifest names no task
    manifest = guarded(lambda: read_manifest(ws.ref.name, missing_ok=True)) or {}
    if manifest.get("kind") == "imported":
        trained_for = "language modelling (an imported pretrained model)"
if trained_for is not None and trained_for not in TASKS:
    # a normal state (the workspace holds another kind of model), not an error
    st.info(f"{ws.model_name} was trained for {trained_for!r}, not sequence reversal or sorting; gradient vs causal "
            "needs a reverse or sort model: pick one below or in the sidebar.")
    choices = guarded(sequence_zoo_models, stop=False) or {}
    if choices:
        cols = st.columns(min(len(choices), 4))
        for i, (name, task) in enumerate(choices.items()):
            cols[i % len(cols)].button(f"Analyse {name} ({task})", key=f"attr_use_{name}", on_click=set_choice,
                                       args=(MODEL, name))
    else:
        st.info("The zoo has no reverse or sort model yet: train the quick zoo (it holds reverse-hhg) on the "
                "Models & training page, or `python -m core zoo --preset paper` for the 10+10 [HHG] seeds.")
    st.stop()
if trained_for is None:
    task = st.radio("Task the model was trained on", list(TASKS), horizontal=True, key="attr_task",
                    help="This model has no HeadLab manifest, so only its vocabulary can be checked against the task.")
else:
    task = trained_for
    st.markdown(f"**{ws.model_name}** at `{ws.revision}`, trained for **{task}**.")

# ------------------------------------------------------------------ settings
c1, c2, c3 = st.columns(3)
variant = c1.radio("Gradient variant", list(GRADIENT_VARIANTS), horizontal=True, key="attr_variant",
                   help="paper: a head's W_V and W_O slices together (an MLP's output matrix), norm / sqrt(weights); "
                        "reference: the head's W_V rows (the MLP's output matrix), unnormalised.")
mode = c2.radio("Ablation", list(SEQUENCE_MODES), horizontal=True, key="attr_mode",
                help=mode_help(SEQUENCE_MODES, "mean") + ".")
rule = c3.radio("Threshold rule", list(CLASS_RULES), horizontal=True, key="attr_rule",
                help="paper: bloat d ≥ 6, hero d ≤ −6; reference code: strict > and <.")
c1, c2, c3 = st.columns(3)
ood_choice = c1.radio("OOD length", ["auto", "given"], horizontal=True, key="attr_ood_choice",
                      help=f"auto: the first of {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1} whose clean exact match lies "
                           "in [0.20, 0.75] (reference rule).")
ood_length = None
if ood_choice == "given":
    ood_length = int(c1.number_input("Length (numbers per sequence)", 1, 40, OOD_LENGTHS.start, key="attr_ood_length"))
n_batches = int(c2.number_input("OOD batches for G", 1, 1000, 50, key="attr_n_batches",
                                help="The paper averages 50 batches; fewer run faster and are noisier."))
threshold = float(c3.number_input("Rank-difference threshold", 1.0, 100.0, DEFAULT_THRESHOLD, 1.0, key="attr_threshold"))
with st.expander("Evaluation details"):
    e1, e2, e3 = st.columns(3)
    n_examples = int(e1.number_input("Evaluation examples per accuracy", 10, 10_000, 500, key="attr_n_examples"))
    batch_size = int(e2.number_input("Gradient batch size", 1, 1024, 64, key="attr_batch_size"))
    seed = int(e3.number_input("Seed", 0, 2**31 - 1, 0, key="attr_seed"))
settings = guarded(lambda: AttributionSettings(
    task=task, gradient_variant=variant, n_batches=n_batches, batch_size=batch_size, ablation_mode=mode,
    n_examples=n_examples, seed=seed, threshold=threshold, rule=rule, ood_length=ood_length), stop=False)

if settings is not None:
    one_model(ws, settings)
seeds(ws, task)
