"""Training dynamics: when a circuit forms, when the recipe can already name it, whether it carries over
between seeds and across a data shift, and how its form (selectivity) and function (closure) relate.

On the IOI task the circuit followed is still the induction circuit (membership is induction selectivity, which
needs a repeated token): its form is measured on the induction probe of the model's own tokens, with the
sidebar's N, T and seed, and its function (the closure tests) on the sidebar's IOI prompts."""

from dataclasses import replace

import pandas as pd
import streamlit as st

from core.figures.dynamics import (cross_seed_figure, data_shift_figure, form_function_figure, identification_figure,
                                   timing_figure)
from core.heads import HeadSet, head_name, parse_heads
from core.pipelines.dynamics import continuations, data_shift_jaccard, seed_peers, zoo_manifests
from core.stats.dynamics import DEFAULT_MARGIN, FORM_FUNCTION_LABELS, IDENTIFIABLE_BAND
from core.tasks.specs import spec_from_json
from pages._cache import (cached_tokenizer_spec, cached_trajectories, model_stamp, run_cross_seed, run_form_function,
                          screen_report, stored_cross_seed, stored_form_function)
from pages._state import PR_DEFINITION, SEQ_LEN, bound, require_workspace
from pages._widgets import format_tokens, guarded, show_figure

DEFINITIONS = {"entropy": "entropy effective rank", "classic": "classic PR"}


st.title("Training dynamics")
ws = require_workspace()
if ws.task not in ("induction", "ioi"):
    st.info("Training dynamics follow the induction circuit (selectivity to p+1): choose the **induction** probe "
            "task (or **ioi**, whose prompts then test the circuit's function) in the sidebar.")
    st.stop()
member_json = None  # the induction probe membership is measured on, when it is not the sidebar's (the IOI task)
member_ws = ws
if ws.task == "ioi":
    seq_len = int(st.session_state.get(SEQ_LEN, 64))
    member_ws = replace(ws, spec=spec_from_json(guarded(lambda: cached_tokenizer_spec(
        ws.model_name, ws.revision, ws.stamp, "induction", ws.spec.n_examples, seq_len, ws.spec.seed))))
    member_json = member_ws.spec_json  # the trajectories' cache key, spelled as the page's other calls spell it
    st.caption(f"IOI task: the circuit followed is the induction circuit. Its form (membership: induction "
               f"selectivity) is measured on {ws.spec.n_examples} induction sequences of {seq_len} of the model's "
               f"own tokens (seed {ws.spec.seed}); its function (the cross-seed and closure ablations below) on the "
               f"sidebar's {ws.spec.n_examples} IOI prompts, scored on the indirect object.")

c1, c2 = st.columns([2, 1])
with c1:
    definition = bound(st.radio, "PR definition", PR_DEFINITION, list(DEFINITIONS), horizontal=True,
                       format_func=lambda d: DEFINITIONS[d])
margin = float(c2.number_input("PR-rise margin (PR units above its running minimum)", min_value=0.01, max_value=100.0,
                               value=DEFAULT_MARGIN, step=0.1, key="dyn_margin"))
guarded(lambda: screen_report(member_ws, definition))  # fills the HeadStats cache with a progress bar the first time
traj = guarded(lambda: cached_trajectories(ws.model_name, member_ws.spec_json, definition, ws.stamp, ws.dtype,
                                           ws.backend))
n_layers, n_heads = traj.shape
final = traj.final_circuit
names = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]
picked = st.multiselect("Heads to follow (default: the final induction circuit)", names,
                        default=[head_name(h) for h in final], key=f"dyn_heads-{ws.model_name}")
heads = parse_heads(",".join(picked)).heads if picked else ()
st.caption(f"Membership: induction selectivity against the uniform baseline ≥ {traj.induction_threshold:.3g}x "
           f"(50x at T = 256, scaled to this probe length). Final circuit of {ws.model_name}: **{final or 'none'}**.")

# ------------------------------------------------------------------ 1. timing
st.subheader("PR rise and threshold crossing")
if not heads:
    st.info("No heads chosen (and no head reaches the membership threshold at the final checkpoint): pick heads above.")
else:
    timing = traj.timing(heads, margin)
    show_figure(timing_figure(traj, heads, margin), "dyn_timing")
    st.dataframe(pd.DataFrame([{
        "head": head_name(t.head), "PR rise": format_tokens(int(t.rise.tokens)) if t.rise.tokens is not None else "never",
        "threshold crossing": format_tokens(int(t.crossing.tokens)) if t.crossing.tokens is not None else "never",
        "lead (decades of tokens)": t.lead_decades, "PR rises first": t.rise_first} for t in timing]),
        hide_index=True, width="stretch")

# ------------------------------------------------------------------ 2. identification
st.subheader("When does the recipe already return the final circuit?")
ident = traj.identification()
m1, m2, m3 = st.columns(3)
if not ident.final_circuit:
    st.info(f"No circuit found: no head of {ws.model_name} reaches the membership threshold at its final checkpoint, "
            "so there is nothing for the recipe to identify earlier.")
m1.metric("earliest identifying checkpoint",
          "no circuit found" if not ident.final_circuit
          else "never" if ident.first.tokens is None else format_tokens(int(ident.first.tokens)),
          help="The first checkpoint t at which the recipe run on checkpoints up to t returns the final circuit "
               "(Jaccard 1).")
m2.metric("fraction of training tokens", "—" if ident.first_fraction is None else f"{ident.first_fraction:.3%}",
          help=f"[SPC]: identifiable from {IDENTIFIABLE_BAND[0]:.1%}-{IDENTIFIABLE_BAND[1]:.0%} of the tokens.")
m3.metric("stable from", "—" if ident.stable_fraction is None else f"{ident.stable_fraction:.3%}",
          help="From this checkpoint on, every checkpoint returns the final circuit.")
if ident.final_circuit:
    show_figure(identification_figure([(ws.model_name, ident)]), "dyn_identification")

# ------------------------------------------------------------------ 3. cross-seed ablation
st.subheader("Cross-seed ablation")
st.caption("Each model's final circuit ablated in each model, against matched-random head sets of the target model "
           "(same layers and counts). [SPC] finds circuits seed-specific: a circuit does little outside its own model.")
manifests = zoo_manifests()
options = sorted([ws.model_name] + seed_peers(ws.model_name, manifests))  # same task and architecture, from scratch
if len(options) == 1:
    st.caption(f"No other seed of {ws.model_name} in the zoo (a model of the same task and architecture); the paper "
               "preset trains several (python -m core zoo --preset paper).")
s1, s2 = st.columns([3, 1])
models = s1.multiselect("Models (seeds)", options, default=options, key=f"dyn_seed_models-{ws.model_name}")
seed_controls = int(s2.number_input("Random draws", 1, 200, 20, key="dyn_seed_controls"))
matrix = stored_cross_seed(tuple(models), ws.spec_json, seed_controls, ws.dtype, member_json)
if st.button("Run cross-seed ablation", key="dyn_run_cross_seed", disabled=not models) and matrix is None:
    with st.spinner(f"Ablating {len(models)} circuits in {len(models)} models..."):
        matrix = guarded(lambda: run_cross_seed(tuple(models), ws.spec_json, seed_controls, ws.dtype, ws.backend,
                                                member_json), stop=False)
if matrix is not None:
    show_figure(cross_seed_figure(matrix), "dyn_cross_seed")
    for a, row in enumerate(matrix.reasons):
        for b, reason in enumerate(row):
            if reason:
                st.caption(f"{matrix.models[a]} in {matrix.models[b]}: {reason}")

# ------------------------------------------------------------------ 4. data shift
st.subheader("Circuit membership across a data shift")
d1, d2 = st.columns(2)
bases = [ws.model_name] + sorted(m for m in manifests if m != ws.model_name and continuations(m, manifests))
base_name = d1.selectbox("Base model", bases, key="dyn_shift_base")
shift_options = continuations(base_name, manifests)  # only a model trained on from this one's weights
if not shift_options:
    st.info(f"No zoo model continues {base_name} on other data (a model trained with init_from {base_name}), so "
            "there is no data shift to show: the paper preset's induction-neox-shifted continues induction-neox-s0 "
            "on another distribution (python -m core zoo --preset paper).")
else:
    shifted_name = d2.selectbox("Continued on other data", shift_options, key="dyn_shift_model")
    base_traj = guarded(lambda: cached_trajectories(base_name, member_ws.spec_json, definition, model_stamp(base_name),
                                                    ws.dtype, ws.backend), stop=False)
    shifted_traj = guarded(lambda: cached_trajectories(shifted_name, member_ws.spec_json, definition,
                                                       model_stamp(shifted_name), ws.dtype, ws.backend), stop=False)
    if base_traj is not None and shifted_traj is not None:
        shift = guarded(lambda: data_shift_jaccard(base_traj, shifted_traj), stop=False)
        if shift is not None:
            st.metric("Jaccard of the final circuits", f"{shift.jaccard:.2f}", help="[SPC]: 1.00 across a data shift.")
            show_figure(data_shift_figure(shift), "dyn_data_shift")

# ------------------------------------------------------------------ 5. form vs function
st.subheader("Form vs function over training")
st.caption("At each checkpoint the chosen heads are ablated against random head sets (closure test, paper rule: every "
           "delta damaging and z(target logit) < −1.8) and their mean membership selectivity is compared with the "
           "threshold. [CVC] finds function without form and form without function.")
f1, f2 = st.columns(2)
ff_controls = int(f1.number_input("Random draws per checkpoint", 1, 100, 5, key="dyn_ff_controls"))
stride = int(f2.number_input("Test every n-th checkpoint (the last always)", 1, max(1, len(traj.revisions)), 1,
                             key="dyn_ff_stride"))
chosen_revisions = tuple(sorted(set(traj.revisions[::stride]) | {traj.revisions[-1]}, key=traj.revisions.index))
circuit = HeadSet(tuple(heads))
ff = stored_form_function(ws, circuit, ff_controls, chosen_revisions, member_json)
if st.button(f"Run the closure test at {len(chosen_revisions)} checkpoints", key="dyn_run_form_function",
             disabled=not heads) and ff is None:
    with st.spinner("Ablating the heads at every chosen checkpoint..."):
        ff = guarded(lambda: run_form_function(ws, circuit, ff_controls, chosen_revisions, member_json), stop=False)
if ff is not None:
    counts = ff.counts()
    cols = st.columns(len(FORM_FUNCTION_LABELS))
    for col, label in zip(cols, FORM_FUNCTION_LABELS):
        col.metric(label, counts[label])
    show_figure(form_function_figure(ff), "dyn_form_function")
