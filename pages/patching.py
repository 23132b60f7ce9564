"""Patching: activation patching per head (and per head x position), a group against random controls, a path
between heads, attribution patching with its rank agreement, on the sidebar task's built-in counterfactual
(induction, or IOI's ABC / swapped-subject prompts) or on the pairs of an uploaded probe file. Picked heads go to the ablation lab in one click."""

from pathlib import Path

import streamlit as st

from core.ablation.patching import COMPONENTS, GRADIENT_METRICS, PATCH_METRICS, PatchSettings
from core.errors import HeadLabError
from core.figures.patching import attribution_scatter, controls_strip, head_heatmap, position_heatmap, top_heads
from core.heads import head_name, parse_heads
from core.pipelines.patching import PatchPlan
from core.stats.controls import CONTROL_KINDS
from core.stats.patching import DIRECTIONS
from core.tasks.probe_file import PADDING_SIDES, ProbeFile, read_probe_file
from pages._cache import run_patching_report, stored_patching
from pages._state import remember_probe_file, require_workspace, send_to_ablation_lab
from pages._widgets import built_in_pairs, built_in_source, guarded, new_pick, pair_source, show_figure

EXAMPLE = Path(__file__).resolve().parents[1] / "assets" / "probes" / "ioi_example.jsonl"
UPLOAD = "upload a probe file"
HEAT_KEY, SCATTER_KEY = "patch_heads", "patch_ranks"
STRIP_KEY = "patch_strip_{}"  # the group's and the path's control strips (not "patch_group": the group's text box)
FILE_FORMAT = ("One JSON object per line: `prompt` (text) or `prompt_ids`, `target` (text or token id; of several "
               "tokens the first is scored), `corrupted_prompt` (same token length), optional `corrupted_target` and "
               "`query_pos` (default: the last prompt token). Text is tokenized with the model's own tokenizer.")


def choose_pairs(ws):
    """The pairs to patch: the sidebar probe's built-in counterfactual (induction: the earlier A corrupted; ioi: the
    ABC or swapped-subject prompts), or an uploaded file."""
    built_in = built_in_source(ws.task)
    if pair_source(ws, [built_in, UPLOAD], "patch_source") == built_in:
        return built_in_pairs(ws, "patch")
    left, right = st.columns([3, 1])
    uploaded = left.file_uploader("Probe file (JSONL)", type=["jsonl", "json", "txt"], key="patch_file", help=FILE_FORMAT)
    padding = right.radio("Padding", PADDING_SIDES, horizontal=True, key="patch_padding",
                          help="The side shorter prompts are padded on; the attention mask hides the padding.")
    right.download_button("Example file", EXAMPLE.read_bytes(), EXAMPLE.name, "application/jsonl", key="patch_example",
                          help="A small IOI-style set for the byte-level zoo models, with corrupted pairs.")
    st.caption(FILE_FORMAT)
    if uploaded is None:
        st.info("Upload a probe file of clean/corrupted pairs (the example file shows the format).")
        st.stop()
    probe_file = guarded(lambda: read_probe_file(uploaded.getvalue(), uploaded.name, padding))
    remember_probe_file(probe_file)  # the ablation lab can ablate on these prompts too
    return probe_file


def choose_settings():
    """PatchSettings and PatchPlan from the widgets (HeadLabError shown, page stopped, when invalid)."""
    c1, c2, c3 = st.columns(3)
    direction = c1.radio("Direction", DIRECTIONS, horizontal=True, key="patch_direction",
                         help="denoise: clean activations into the corrupted run (what restores the answer); "
                              "noise: corrupted into the clean run (what breaks it).")
    metric = c2.selectbox("Metric", PATCH_METRICS, key="patch_metric",
                          help="logit_diff: the target's logit minus the corrupted target's (the target logit alone "
                               "when the pairs have none). Scores are normalized: clean 1, corrupted 0.")
    per_position = c3.checkbox("Per head and position", key="patch_per_position",
                               help="Also patch every head at every position alone: one forward each (slower).")
    attribution = c3.checkbox("Attribution patching", True, key="patch_attribution", disabled=metric not in GRADIENT_METRICS,
                              help="Every head's first-order estimate in one forward and backward, ranked against "
                                   "activation patching (Spearman).")
    allow_small_gap = c3.checkbox("Keep a small or reversed gap (flagged)", key="patch_allow_small_gap",
                                  help="Scores divide by the clean-corrupted gap; a gap that is reversed or under 2 "
                                       "standard errors of the per-example gaps is refused unless this is ticked.")
    with st.expander("Group against random controls, and path patching"):
        g1, g2, g3 = st.columns(3)
        group = g1.text_input("Group of heads", key="patch_group", placeholder="e.g. L1H2, L1H3")
        n_controls = int(g2.number_input("Random controls", 1, 500, 20, key="patch_n_controls"))
        kind = g3.radio("Controls", CONTROL_KINDS, horizontal=True, key="patch_control_kind")
        p1, p2, p3 = st.columns(3)
        senders = p1.text_input("Path senders", key="patch_senders", placeholder="e.g. L0H1")
        receivers = p2.text_input("Path receivers", key="patch_receivers", placeholder="e.g. L1H2")
        components = p3.multiselect("Into the receivers'", COMPONENTS, ["k"], key="patch_components")

    def heads(text: str):
        return parse_heads(text) if text.strip() else None

    settings = guarded(lambda: PatchSettings(direction=direction, metric=metric, per_position=per_position,
                                             n_controls=n_controls, controls=kind, allow_small_gap=allow_small_gap))
    plan = guarded(lambda: PatchPlan(attribution=attribution and metric in GRADIENT_METRICS, group=heads(group),
                                     senders=heads(senders), receivers=heads(receivers),
                                     components=tuple(components) or ("k",)))
    return settings, plan


def run(ws, pairs, settings, plan) -> None:
    failure = None
    with st.status(f"Patching {ws.model_name} at {ws.revision}...", expanded=True) as status:
        bar = st.progress(0.0, text="loading the model")

        def progress(stage: str, done: int, total: int) -> None:
            bar.progress(min(done / max(total, 1), 1.0), text=f"{stage} patching: {done}/{total}")

        try:
            report = run_patching_report(ws, pairs, settings, plan, progress)
        except HeadLabError as exc:
            failure = str(exc)
            status.update(label="Patching stopped", state="error", expanded=False)
        else:
            seconds = sum(report.seconds.values())
            status.update(label=f"Patched in {seconds:.1f} s", state="complete", expanded=False)
    if failure:
        st.error(failure)
    else:
        st.rerun()  # draw the report with the run button spent


def show(report, pairs) -> None:
    act = report.activation
    for note in report.notes + act.notes:
        st.info(note, icon=":material/info:")
    m = st.columns(4)
    m[0].metric(f"clean {act.metric}", f"{act.clean_value:.4g}")
    m[1].metric(f"corrupted {act.metric}", f"{act.corrupted_value:.4g}")
    m[2].metric("identity check", f"{act.identity_max_diff:.1e}",
                help="The largest logit change when the base run is patched with its own activations (0 expected).")
    m[3].metric("Spearman ρ (attribution, activation)", "—" if report.spearman is None else f"{report.spearman:.2f}")
    # a new click or lasso on the heatmap or the rank scatter replaces the heads to send (read before drawing them)
    select_key = f"patch_send::{report.model}::{report.revision}"
    picked_grid, picked_scatter = new_pick(HEAT_KEY), new_pick(SCATTER_KEY)
    picked = picked_grid or picked_scatter
    if picked:
        st.session_state[select_key] = [head_name(h) for h in picked]
    n_layers, n_heads = act.scores.shape
    options = [head_name((l, h)) for l in range(n_layers) for h in range(n_heads)]
    if select_key not in st.session_state:
        st.session_state[select_key] = [head_name(h) for h in top_heads(report)]
    s1, s2 = st.columns([3, 1], vertical_alignment="bottom")
    chosen = s1.multiselect("Heads to test in the ablation lab (click or lasso heads on the heatmap or the rank "
                            "scatter; the top three by default)", options, key=select_key)
    s2.button("Open in the ablation lab", key="patch_to_ablation", icon=":material/science:", disabled=not chosen,
              on_click=send_to_ablation_lab, args=(parse_heads(",".join(chosen)).heads if chosen else (),),
              kwargs={"probe_file": pairs if isinstance(pairs, ProbeFile) else None},
              help="The lab ablates the heads on the prompts patched here (an uploaded file's clean prompts).")

    left, right = st.columns(2)
    with left:
        show_figure(head_heatmap(report), HEAT_KEY, pickable=True)
    with right:
        if report.attribution is not None:
            show_figure(attribution_scatter(report), SCATTER_KEY, pickable=True)
    if act.position_scores is not None:
        show_figure(position_heatmap(report), "patch_positions")
    strips = [which for which in ("group", "path") if getattr(report, which) is not None]
    for column, which in zip(st.columns(max(len(strips), 1)), strips):
        with column:
            show_figure(controls_strip(report, which), STRIP_KEY.format(which))


st.title("Patching")
ws = require_workspace()
st.caption("Counterfactual patching on clean/corrupted pairs: each head's activations taken from the other run. "
           "Denoising asks what is sufficient to restore the clean answer, noising what is necessary for it; "
           "groups and paths are judged against random head sets patched the same way.")
pairs = choose_pairs(ws)
settings, plan = choose_settings()
report = guarded(lambda: stored_patching(ws, pairs, settings, plan), stop=False)
if st.button("Run patching", type="primary", key="patch_run", disabled=report is not None,
             help="Results are kept for this session; the same pairs and settings are not patched twice."):
    run(ws, pairs, settings, plan)
if report is None:
    st.info("Press **Run patching**: one forward per head (and per head and position when asked).")
else:
    show(report, pairs)
