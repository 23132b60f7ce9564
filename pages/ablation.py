"""Ablation lab (Step 3): pick heads on the grid, ablate them against matched-random controls and the upper bound."""

import numpy as np
import pandas as pd
import streamlit as st

from core.ablation.engine import AblationCancelled
from core.ablation.spec import PROBE_MODES, mode_help
from core.ablation.study import (PROBE_SIZES, STUDY_TARGET_SECONDS, AblationSettings, example_damage,
                                 propose_probe_size, study_seconds, worst_examples)
from core.choices import FREE_LENGTH_TASKS
from core.errors import HeadLabError
from core.figures.ablation import ablation_strip, head_grid, per_example_damage
from core.heads import HeadSet, head_name, parse_heads
from core.stats.controls import CONTROL_KINDS, count_any_layer_sets, count_matched_sets
from core.stats.inference import METRICS, MIN_CLOSURE_CONTROLS, evidence_flags, format_z, verdict_tone
from core.stats.spectral import resolve_k, top_k
from core.tasks.vocab import token_label
from core.threads import load_mark, thread_policy
from pages._cache import (cached_forward_seconds, checkpoint_screen, lab_clean_run_kept, prepare_ablation, run_ablation,
                          screen_report, stored_ablation)
from pages._state import (ABLATION_HEADS, HAND_OFF_NOTE, HEADS_MODEL, HEADS_TEXT, HEADS_URL, LAB_ON_FILE,
                          LAB_ON_WORKSPACE, LAB_PROBE, N_EXAMPLES, SEQ_LEN, ablation_history, open_in_inspector,
                          require_workspace, set_choice, uploaded_probe_file)
from pages._widgets import chart_pick, guarded, show_figure

GRID_KEY = "ablation_grid"  # the grid's container; the chart inside gets a new key after each pick (see _grid_key)
GRID_ROUND = "_ablation_grid_round"  # how many picks the grid has taken this session
URL_HEADS_TAKEN = "_ablation_url_heads_taken"  # the link's heads were read (once a session: later the page writes them)
CANCELLED = "_ablation_cancelled"  # set by the cancel button, read by the running study
CLICK_THREADS = "_ablation_click_threads"  # the thread policy's choice when Run was pressed
LOAD_MARK = "_ablation_load_mark"  # the CPUs' counters at this page's last run: the click measures the load since
PRESET_MESSAGE = "_preset_message"  # why a preset found no heads (shown after the rerun)
PREPARE_SECONDS = 5.0  # a clean run estimated longer is not run when the page opens, but with the first ablation
VERDICT_TITLES = {"recipe": "Recipe verdict [SPC]", "closure_paper": "Closure verdict, paper rule [CVC]",
                  "closure_reference": "Closure verdict, reference rule [CVC]"}


def _grid_key() -> str:
    """The grid chart's key: a new one after each pick, so the next click starts from an empty chart selection."""
    return f"{GRID_KEY}_pick_{st.session_state.get(GRID_ROUND, 0)}"


def _clear_heads() -> None:
    st.session_state[HEADS_TEXT] = ""


def _cancel() -> None:
    st.session_state[CANCELLED] = True


def _choose_threads(backend: str) -> None:
    """At the press of Run: the thread policy on the load since this page last ran (the user looking at it), not on
    a sample after the click, which counts the browser's own reaction to the click and the rerun it draws."""
    if backend == "serial":
        st.session_state[CLICK_THREADS] = thread_policy(since=st.session_state.get(LOAD_MARK))


def _set_heads(heads, empty_message: str) -> None:
    if len(heads):
        st.session_state[HEADS_TEXT] = str(HeadSet(tuple(heads)))
    else:
        st.session_state[PRESET_MESSAGE] = empty_message


def _choose_prompts(ws):
    """The probe file to ablate on (uploaded on the Patching page this session), or None: the sidebar's probe."""
    probe_file = uploaded_probe_file()
    if probe_file is None:
        return None
    choice = st.radio("Prompts", [LAB_ON_WORKSPACE, LAB_ON_FILE], horizontal=True, key=LAB_PROBE,
                      format_func=lambda v: (f"the sidebar's {ws.task} probe" if v == LAB_ON_WORKSPACE else
                                             f"{probe_file.name} ({probe_file.n_examples} prompts, from Patching)"),
                      help="Ablate on the sidebar's probe, or on the clean prompts of the probe file uploaded on the "
                           "Patching page (padded, with the attention mask; scored at each query_pos).")
    return probe_file if choice == LAB_ON_FILE else None


def _stats_table(result) -> pd.DataFrame:
    """One row per metric: clean value, the candidate's delta and interval, the controls', z, rank, p, upper bound."""
    table = []
    for metric in METRICS:
        s = result.stats.get(metric)
        if s is None:
            continue
        table.append({"metric": metric, "clean": s["clean"], "candidate Δ": s["candidate_delta"],
                      "95% CI": f"[{s['candidate_ci'][0]:.3g}, {s['candidate_ci'][1]:.3g}]",
                      "control mean Δ": s.get("control_mean"), "control std": s.get("control_std"), "z": _z_text(s),
                      "rank": s.get("rank"), "p": s.get("p"), "upper bound Δ": s.get("upper_bound_delta")})
    return pd.DataFrame(table)


def _z_text(s: dict) -> str:
    """z for the table: "pending" while a run is previewed (no rank yet), "n/a (degenerate)" for controls that do not vary."""
    if "z" not in s:
        return "-"  # no controls ran
    return format_z(s["z"]) if s.get("rank") is not None else "pending"


def _control_sets_notice(selection, kind: str, n_layers: int, n_heads: int) -> int:
    """Say how many distinct control sets the selection has (and when that is too few); returns that number."""
    upper = f"plus the upper bound (every head in layers {', '.join(map(str, selection.layers))})"
    if kind == "matched":
        n_sets = count_matched_sets(selection, n_heads)  # 0: a layer holds more than half its heads
        if not n_sets:
            st.warning(f"{len(selection)} heads selected, more than half of a layer: no disjoint matched control "
                       "exists, so Run is off; choose any-layer controls.")
    else:
        n_sets = count_any_layer_sets(selection, n_layers, n_heads)  # 0: more than half of the model
        if not n_sets:
            st.warning(f"{len(selection)} heads selected, more than half of the model: no disjoint control exists, "
                       "so Run is off; select fewer heads.")
    if n_sets:
        st.caption(f"{len(selection)} heads selected; {n_sets:,} distinct {kind} control sets exist; {upper}.")
    if 0 < n_sets < MIN_CLOSURE_CONTROLS:
        st.warning(f"Only {n_sets} distinct {kind} control set{' exists' if n_sets == 1 else 's exist'} for this "
                   f"selection: the verdicts will be inconclusive (they need at least {MIN_CLOSURE_CONTROLS}). "
                   "Choose fewer heads or the other control kind.")
    return n_sets


def _live_drawer(slot, ws):
    """Draws a running study's previews into `slot`: its table first, then its strip (keys unique within the run)."""
    drawn = []

    def draw(partial) -> None:
        drawn.append(partial)
        upper = " and the upper bound" if partial.upper_bound is not None else ""
        with slot.container():
            st.markdown(f"**Running:** the candidate and {len(partial.controls)} controls{upper} measured so far; "
                        "z and the verdicts come with the last control.")
            st.dataframe(_stats_table(partial), hide_index=True, width="stretch")
            st.plotly_chart(ablation_strip(partial, ws.model_name, ws.revision).figure, key=f"ablation_live_{len(drawn)}",
                            theme=None, width="stretch", config={"displaylogo": False})

    return draw


def _use_probe(n: int, seq_len: int) -> None:
    set_choice(N_EXAMPLES, n)
    set_choice(SEQ_LEN, seq_len)


def _probe_size_panel(ws, selection, n_controls: int, n_layers: int, history: list) -> float:
    """Propose the probe size that answers in about STUDY_TARGET_SECONDS here (fewer examples, then for a
    random-token task shorter sequences) and say what it costs in power; returns the estimated seconds of a study
    at the workspace's probe."""
    n_now, seq_len = ws.spec.n_examples, ws.spec.seq_len
    def per_example_at(length: int) -> float:
        return cached_forward_seconds(ws.model_name, ws.revision, ws.stamp, ws.dtype, length)

    per_example = per_example_at(seq_len)
    kept = ws.backend == "serial" and lab_clean_run_kept(ws)  # Ray workers keep their own
    start = min(selection.layers) if selection is not None and len(selection) else n_layers // 2
    fraction = (n_layers - start) / n_layers  # a condition replays the blocks from its lowest ablated layer on
    n_conditions = n_controls + 2  # the candidate, the controls and the upper bound
    free_length = ws.task in FREE_LENGTH_TASKS  # IOI prompts are as long as their templates
    proposal = propose_probe_size(per_example_at, n_now, seq_len, n_conditions, fraction, kept, free_length)
    sizes = sorted({*PROBE_SIZES, n_now})  # larger sizes too: what more examples would buy
    seconds_now = study_seconds(per_example, n_now, n_conditions, fraction, kept)
    # when even the smallest probe is slow, the controls are what to cut: how many fit the target at that size
    budget = (STUDY_TARGET_SECONDS / (per_example * proposal.n_examples)
              - (0.0 if kept and proposal.n_examples == n_now else 1.0))
    controls_fit = int(budget / fraction) - 2 if fraction > 0 else n_controls
    runs_here = [h for h in history if h["model"] == ws.model_name]
    sd = None
    if runs_here:
        last = runs_here[0]["result"]
        sd = float(np.std(example_damage(last.clean, last.candidate, "loss"), ddof=1))
    changed = (proposal.n_examples, proposal.seq_len) != (n_now, seq_len)
    shorter = f" of {proposal.seq_len} tokens" if proposal.seq_len != seq_len else ""
    if changed and proposal.fits:
        headline = f"; N = {proposal.n_examples}{shorter} answers in about {proposal.seconds:.0f} s"
    elif not proposal.fits:
        headline = f"; even N = {proposal.n_examples} takes about {proposal.seconds:.0f} s here"
    else:
        headline = ""
    with st.expander(f"Probe size: about {seconds_now:.0f} s per study at N = {n_now} here" + headline,
                     expanded=seconds_now > STUDY_TARGET_SECONDS):
        st.caption(f"One example of {seq_len} tokens takes {per_example * 1000:.0f} ms through {ws.model_name} "
                   f"({ws.dtype}) on this machine now. A study is the clean forward"
                   f"{' (kept: not rerun)' if kept else ''} and {n_conditions} conditions (the candidate, "
                   f"{n_controls} controls, the upper bound), each replaying layers {start}..{n_layers - 1} "
                   f"(from the lowest ablated layer). The proposal is the largest probe that answers in about "
                   f"{STUDY_TARGET_SECONDS:.0f} s. Estimates; a busy machine is slower.")
        p_min = 1 / (n_controls + 1)
        rows = []
        for n in sizes:
            row = {"N examples": n,
                   "est. seconds": round(study_seconds(per_example, n, n_conditions, fraction, kept and n == n_now), 1),
                   "SE of each Δ, vs N now": f"{np.sqrt(n_now / n):.2f}x"}
            if sd is not None:
                row["SE of Δ loss (nats)"] = f"{sd / np.sqrt(n):.3g}"
            row["smallest p"] = f"{p_min:.3g}"
            rows.append(row)
        st.dataframe(pd.DataFrame(rows), hide_index=True)
        st.caption(f"Power: the standard error of every Δ grows as 1/√N"
                   + (f" (SE column: the per-example sd of Δ loss, {sd:.3g} nats, from this session's last run on "
                      f"{ws.model_name})" if sd is not None else "")
                   + f". The rank p cannot go below 1/(controls + 1) = {p_min:.3g} with {n_controls} controls, "
                   f"whatever N; the closure verdicts need at least {MIN_CLOSURE_CONTROLS} controls. Fewer examples "
                   "leave p's floor alone but widen each Δ's interval, so a small effect ranks less reliably.")
        if proposal.seq_len != seq_len:
            st.caption(f"Even N = {proposal.n_examples} of {seq_len} tokens takes about "
                       f"{study_seconds(per_example, proposal.n_examples, n_conditions, fraction, False):.0f} s here, so "
                       f"the proposal also shortens the sequences to {proposal.seq_len} tokens (one example of "
                       f"{proposal.seq_len} tokens timed at {per_example_at(proposal.seq_len) * 1000:.0f} ms). Each "
                       "example gives the model less context: on the "
                       "induction probe the earlier A B sits closer to the query, and the repeat probe's loss "
                       "averages over fewer repeated tokens.")
        if not proposal.fits and 1 <= controls_fit < n_controls:
            st.caption(f"To answer in about {STUDY_TARGET_SECONDS:.0f} s at N = {proposal.n_examples}, use "
                       f"{controls_fit} controls: the smallest p then is {1 / (controls_fit + 1):.3g}"
                       + (f", and the closure verdicts, which need {MIN_CLOSURE_CONTROLS}, are inconclusive"
                          if controls_fit < MIN_CLOSURE_CONTROLS else "") + ". Or choose bfloat16 in the sidebar.")
        if changed:
            st.button(f"Use N = {proposal.n_examples}{shorter} (about {proposal.seconds:.0f} s with its clean run)",
                      key="use_proposed_n", on_click=_use_probe, args=(proposal.n_examples, proposal.seq_len),
                      help="Sets the sidebar's probe for the whole workspace (every page measures on it).")
    return seconds_now


st.title("Ablation lab")
ws = require_workspace()
here = guarded(lambda: checkpoint_screen(ws))
sel_induction = here.induction_selectivity  # [layer, head]
n_layers, n_heads = sel_induction.shape
classes = here.classes  # [layer, head]
# the text box's own state is dropped on other pages: keep a copy, re-bound to the key every run
st.session_state[HEADS_TEXT] = st.session_state.get(HEADS_TEXT, st.session_state.get(ABLATION_HEADS, ""))
picked_on = st.session_state.get(HEADS_MODEL, ws.model_name)
if picked_on != ws.model_name and st.session_state[HEADS_TEXT]:  # heads of another model mean nothing here
    st.info(f"The head selection {st.session_state[HEADS_TEXT]} was made on {picked_on}; it is cleared for "
            f"{ws.model_name}.")
    st.session_state[HEADS_TEXT] = ""
st.session_state[HEADS_MODEL] = ws.model_name
if HEADS_URL in st.query_params and not st.session_state.get(URL_HEADS_TAKEN):  # a shared link's heads, once
    st.session_state[URL_HEADS_TAKEN] = True
    if not st.session_state[HEADS_TEXT]:
        st.session_state[HEADS_TEXT] = st.query_params[HEADS_URL]  # parsed against this model below

if st.session_state.get(HAND_OFF_NOTE):
    st.info(st.session_state.pop(HAND_OFF_NOTE))
if st.session_state.pop(CANCELLED, False):
    st.warning("The ablation run was cancelled; nothing was stored. Press Run ablation to start it again.")

# A click on the grid toggles a head in or out of the selection; a box or lasso adds the heads inside it
# (read before the text box is drawn). Streamlit does not pass the shift key, so no gesture replaces the selection.
picked, by_area = chart_pick(_grid_key())
if picked:
    try:
        current = parse_heads(st.session_state[HEADS_TEXT], n_layers, n_heads)
    except HeadLabError:
        current = HeadSet()  # an empty box, or typed text that does not parse: the pick starts afresh
    st.session_state[HEADS_TEXT] = str(current.union(picked) if by_area else current.toggled(picked))
    st.session_state[GRID_ROUND] = st.session_state.get(GRID_ROUND, 0) + 1

grid_box = st.container()  # drawn last (it outlines the heads parsed below), shown first
preset_col, control_col = st.columns([2, 3], gap="large")
with preset_col:
    st.markdown("**Presets**")
    p1, p2 = st.columns(2)
    if p1.button("Induction circuit", key="preset_circuit",
                 help=f"The screened induction circuit at this checkpoint: induction selectivity against the "
                      f"{here.membership_baseline} baseline ≥ {here.induction_threshold:.3g}x."):
        _set_heads(here.induction_heads, f"No head reaches the membership threshold ({here.induction_threshold:.3g}x "
                                         f"against the {here.membership_baseline} baseline) at {ws.revision}; "
                                         "try a later checkpoint or another preset.")
    if p2.button("Previous-token circuit", key="preset_prev",
                 help=f"The heads the induction heads compose with, chosen by the same rule: previous-token "
                      f"selectivity against the {here.membership_baseline} baseline ≥ {here.induction_threshold:.3g}x."):
        _set_heads(here.previous_token_circuit,
                   f"No head reaches the membership threshold on previous-token selectivity "
                   f"({here.induction_threshold:.3g}x against the {here.membership_baseline} baseline) at {ws.revision}.")
    p3, p4 = st.columns([2, 1])
    k = int(p4.number_input("K", 1, n_layers * n_heads, resolve_k(0.18, n_layers * n_heads), key="preset_k"))
    if p3.button("Top-K spectral heads", key="preset_topk", help="The K heads with the largest PR-integral (Step 1)."):
        report = guarded(lambda: screen_report(ws), stop=False)
        if report is not None and report.spectral is None:  # one checkpoint: no PR-integral to rank by
            st.session_state[PRESET_MESSAGE] = report.spectral_note
        elif report is not None:
            _set_heads(top_k(report.spectral.integral, k), "The spectral ranking is empty.")
    message = st.session_state.pop(PRESET_MESSAGE, None)
    if message:
        st.info(message)
with control_col:
    text = st.text_input("Heads to ablate", key=HEADS_TEXT, placeholder="e.g. L1H0, L1H3 or L1H*",
                         help='Heads as "L{layer}H{head}", counted from 0; "L1H*" is every head of layer 1.')
    st.session_state[ABLATION_HEADS] = text
    if text.strip():  # a shared link reopens with these heads
        st.query_params[HEADS_URL] = text
    elif HEADS_URL in st.query_params:
        del st.query_params[HEADS_URL]
    selection = None
    if text.strip():
        try:
            selection = parse_heads(text, n_layers, n_heads)
        except HeadLabError as exc:
            st.error(str(exc))
    c1, c2 = st.columns(2)
    n_controls = int(c1.number_input("Random draws N", 1, 1000, 20, key="n_controls"))
    seed = int(c2.number_input("Control seed", 0, 2**31 - 1, 123, key="control_seed"))
    control_kind = c1.radio("Controls", list(CONTROL_KINDS), horizontal=True, key="control_kind",
                            help="matched: the same number of heads in each of the same layers; any-layer: same size anywhere.")
    mode = c2.selectbox("Ablation", list(PROBE_MODES), key="ablation_mode",
                        help="What an ablated head's output (hook_z, before W_O, every position) is replaced by: "
                             + mode_help(PROBE_MODES) + ".")
    lab_file = _choose_prompts(ws)
    n_sets = 0 if selection is None else _control_sets_notice(selection, control_kind, n_layers, n_heads)
    run = st.button("Run ablation", type="primary", disabled=n_sets == 0, key="run_ablation", on_click=_choose_threads,
                    args=(ws.backend,))
    st.session_state[LOAD_MARK] = load_mark()

with grid_box:
    chosen = selection.heads if selection is not None else ()
    grid = head_grid(sel_induction, chosen, ws.model_name, ws.revision,
                     "pick heads: a click adds or removes one, a box or lasso adds",
                     classes=classes)
    with st.container(key=GRID_KEY):
        show_figure(grid, _grid_key(), pickable=True, stretch=False)
    st.button("Clear selection", key="clear_heads", on_click=_clear_heads, disabled=not text.strip(),
              icon=":material/deselect:")
# the clean run (here or in the Ray workers) before the click, unless it is slow: then the first Run does it, with progress
guarded(lambda: prepare_ablation(ws, lab_file, max_seconds=PREPARE_SECONDS), stop=False)
history = ablation_history()
study_seconds = _probe_size_panel(ws, selection, n_controls, n_layers, history) if lab_file is None else None

# ------------------------------------------------------------------ run
if run and selection is not None:
    settings = AblationSettings(n_controls=n_controls, controls=control_kind, mode=mode, seed=seed)
    entry = stored_ablation(ws, selection, settings, lab_file)
    if entry is None:
        cancel_slot = st.empty()
        cancel_slot.button("Cancel run", key="cancel_ablation", on_click=_cancel, icon=":material/cancel:")
        first = ("Loading the model..." if study_seconds is None else
                 f"Running the clean forward and {n_controls + 2} conditions (about {study_seconds:.0f} s here)...")
        bar = st.progress(0.0, text=first)
        live = st.empty()  # the candidate's deltas as soon as they are measured, then the controls filling the strip
        try:
            entry = run_ablation(
                ws, selection, settings,
                progress=lambda done, total: bar.progress(min(done / total, 1.0), text=f"condition passes: {done}/{total}"),
                cancel=lambda: bool(st.session_state.get(CANCELLED)),
                on_preview=_live_drawer(live, ws),
                probe_file=lab_file,
                threads=st.session_state.pop(CLICK_THREADS, None),
            )
        except AblationCancelled:
            st.warning("The ablation run was cancelled; nothing was stored.")
        except HeadLabError as exc:
            st.error(str(exc))
        bar.empty()
        live.empty()
        cancel_slot.empty()
    if entry is not None:
        number = len(history) + 1
        label = (f"#{number} · {entry['result'].selection} · {len(entry['result'].controls)} {control_kind} · {mode} · "
                 f"{ws.model_name}@{ws.revision}" + ("" if lab_file is None else f" · {lab_file.name}"))
        history.insert(0, {**entry, "label": label})

# ------------------------------------------------------------------ results
if not history:
    st.info("Pick heads and press **Run ablation**: the group is knocked out together with N matched-random "
            "groups and the upper bound, and the verdict names its rule.")
    st.stop()

labels = [h["label"] for h in history]
shown = st.selectbox("Runs this session (latest first; results are cached)", range(len(history)),
                     format_func=lambda i: labels[i])
entry = history[shown]
result = entry["result"]

st.subheader("Verdict")
if result.control_sets.note:  # too few distinct controls: said here, beside the verdicts it weakens
    st.warning(result.control_sets.note[0].upper() + result.control_sets.note[1:], icon=":material/warning:")
for name, verdict in result.verdicts.items():  # the CLI's flags and colour rule (core/stats/inference.py)
    flags = evidence_flags(len(result.controls))
    body = (f"**{VERDICT_TITLES.get(name, name)}: {verdict.label}**  \nrule — {verdict.rule}\n\n"
            + "\n".join(f"- {reason}" for reason in verdict.reasons) + "".join(f"\n- [{flag}]" for flag in flags))
    tone = verdict_tone(verdict.label, len(result.controls))
    if tone == "good":
        st.success(body, icon=":material/check_circle:")
    elif tone == "caution":
        st.warning(body, icon=":material/help:")
    else:
        st.info(body, icon=":material/cancel:")
batch_spec = entry["batch"].spec
prompts = (f" on the {entry['batch'].n_examples} prompts of {batch_spec['name']}"
           if batch_spec.get("task") == "probe-file" else "")
st.caption(f"{len(result.controls)} {result.control_sets.kind} controls + upper bound on {entry['model']} at "
           f"{entry['revision']}{prompts}; ran in {entry['seconds']:.1f} s.")

st.dataframe(_stats_table(result), hide_index=True, width="stretch")

show_figure(ablation_strip(result, entry["model"], entry["revision"]), "ablation_strip")

st.subheader("Per-example damage")
metric = st.radio("Metric", [m for m in METRICS if m in result.stats], horizontal=True, key="damage_metric")
show_figure(per_example_damage(result, entry["model"], entry["revision"], metric), "ablation_damage")
run_batch = entry["batch"]
damage = example_damage(result.clean, result.candidate, metric)  # [example], + = worse
worst = worst_examples(damage, 8)
st.dataframe(pd.DataFrame([{
    "example": int(i), "damage": float(damage[i]), f"clean {metric}": float(result.clean.values(metric)[i]),
    "query token": token_label(int(run_batch.tokens[i, int(run_batch.query_pos[i])])),
    "target": token_label(int(run_batch.target[i])),
} for i in worst]), hide_index=True, width="stretch")
i1, i2 = st.columns([1, 3], vertical_alignment="bottom")
target = i1.selectbox("Ablated head", [head_name(h) for h in result.selection], key="inspect_ablated")
i2.button("Open it in the head inspector", key="open_inspector", icon=":material/search:", on_click=open_in_inspector,
          args=(target,))
st.caption("The head inspector shows its attention on the examples this run hurt most.")
for note in result.notes:
    if note != result.control_sets.note:
        st.caption(f"Note: {note}")
