"""Circuit graph: every head-to-head edge scored by EAP, EAP-IG or ACDC-style pruning on clean/corrupted pairs,
drawn by layer; the faithfulness curve of the top edges (CPR, CMD) and the discovered set against matched-random
edge sets. Click a node or an edge to measure its patching effect; the set's heads go to the ablation lab."""

from pathlib import Path

import pandas as pd
import streamlit as st

from core.ablation.edges import EDGE_METRICS, METHODS, REPLACEMENTS, EdgeSettings
from core.ablation.edges.runs import check_edge_model, edge_chunks, mean_value, run_values
from core.errors import HeadLabError
from core.figures.graph import (EDGE_PICK, NODE_PICK, circuit_graph_figure, edge_controls_strip, edge_list_json,
                                faithfulness_figure, node_totals, picked_items)
from core.pipelines.edges import EdgePlan, check_has_pairs, edges_loaded
from core.pipelines.patching import build_pairs
from core.stats.inference import format_rank_z
from core.store import canonical_json
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.known import known_task
from core.tasks.specs import PAIR_TASKS
from core.tasks.probe_file import PADDING_SIDES, ProbeFile, read_probe_file
from core.zoo.known import known_circuit
from pages._cache import cached_model, check_fits
from pages._state import remember_probe_file, require_workspace, send_to_ablation_lab
from pages._widgets import built_in_pairs, built_in_source, guarded, pair_source, show_figure

EXAMPLE = Path(__file__).resolve().parents[1] / "assets" / "probes" / "ioi_example.jsonl"
KNOWN, UPLOAD = "the known circuit's task", "upload a probe file"
RUNS = "graph_runs"  # session: run key -> EdgeReport (a rerun of the page never recomputes)
EFFECTS = "graph_effects"  # session: (run key, item) -> fraction of the gap lost when the item is patched
CHART, ITEM, THRESHOLD = "graph_chart", "graph_item", "graph_threshold"
NOTHING = "(nothing picked)"
FILE_FORMAT = ("One JSON object per line: `prompt` (text) or `prompt_ids`, `target`, `corrupted_prompt` (same token "
               "length; edge methods need it on every line), optional `corrupted_target` and `query_pos`.")


def known_of(ws):
    """The model's known circuit (circuit.json), or None when it has none."""
    if ws.ref.kind == "hub":
        return None
    try:
        return known_circuit(ws.ref, ws.revision)
    except HeadLabError:
        return None


def choose_pairs(ws, circuit):
    """The pairs: the known circuit's own task, the sidebar probe's built-in counterfactual (induction or IOI), or a file."""
    built_in = built_in_source(ws.task)
    source = pair_source(ws, ([KNOWN] if circuit is not None else []) + [built_in, UPLOAD], "graph_source")
    if source == KNOWN:
        spec = guarded(lambda: known_task(circuit.task))
        st.caption(f"{spec.n_examples} prompts of {spec.seq_len} tokens of the {spec.task} task recorded in "
                   f"circuit.json; {spec.build_pair().spec.get('corruption', '')}.")
        return spec
    if source == built_in:
        if ws.task in PAIR_TASKS:
            guarded(lambda: check_fits(ws))
        return built_in_pairs(ws, "graph")
    left, right = st.columns([3, 1])
    uploaded = left.file_uploader("Probe file (JSONL)", type=["jsonl", "json", "txt"], key="graph_file",
                                  help=FILE_FORMAT)
    padding = right.radio("Padding", PADDING_SIDES, horizontal=True, key="graph_padding")
    right.download_button("Example file", EXAMPLE.read_bytes(), EXAMPLE.name, "application/jsonl", key="graph_example")
    st.caption(FILE_FORMAT)
    if uploaded is None:
        st.info("Upload a probe file of clean/corrupted pairs (the example file shows the format).")
        st.stop()
    probe_file = guarded(lambda: read_probe_file(uploaded.getvalue(), uploaded.name, padding))
    guarded(lambda: check_has_pairs(probe_file))
    remember_probe_file(probe_file)
    return probe_file


def choose_settings():
    """EdgeSettings and EdgePlan from the widgets (a HeadLabError shown, the page stopped, when invalid)."""
    c1, c2, c3 = st.columns(3)
    method = c1.radio("Method", METHODS, horizontal=True, key="graph_method",
                      format_func={"eap": "EAP", "eap-ig": "EAP-IG", "acdc": "ACDC"}.get,
                      help="EAP: gradient x activation difference, one forward and backward per batch; EAP-IG: the "
                           "gradient integrated along the corrupted -> clean embeddings; ACDC: greedy pruning by patching.")
    ig_steps = int(c1.number_input("EAP-IG steps", 1, 100, 5, key="graph_ig_steps", disabled=method != "eap-ig"))
    threshold = c1.number_input("ACDC threshold", value=0.01, step=0.005, format="%.4f", key="graph_acdc_threshold",
                                disabled=method != "acdc",
                                help="An edge is removed when patching it raises the distance from the clean run by "
                                     "less than this (a finite number >= 0).")
    metric = c2.selectbox("Metric", EDGE_METRICS, key="graph_metric",
                          help="logit_diff: the target's logit minus the corrupted target's; kl: KL of the clean output "
                               "to the run's (EAP-IG or ACDC only: its gradient is zero at the clean run).")
    replacement = c2.radio("A patched edge carries", REPLACEMENTS, horizontal=True, key="graph_replacement",
                           help="resample: the corrupted run's sender output; mean: its mean over the pairs.")
    top = int(c2.number_input("Discovered set: top edges (EAP, EAP-IG)", 1, 10_000, 20, key="graph_top"))
    n_controls = int(c3.number_input("Matched-random edge sets", 0, 500, 20, key="graph_controls",
                                     help="0: none; 19 or more can reach p <= 0.05."))
    curve = c3.checkbox("Faithfulness curve", True, key="graph_curve")
    allow_small_gap = c3.checkbox("Keep a small or reversed gap (flagged)", key="graph_allow_small_gap")
    settings = guarded(lambda: EdgeSettings(metric=metric, replacement=replacement, allow_small_gap=allow_small_gap))
    plan = guarded(lambda: EdgePlan(method=method, ig_steps=ig_steps, threshold=threshold, top=top, curve=curve,
                                    n_controls=n_controls))
    return settings, plan


def run_key(ws, pairs, settings, plan) -> tuple:
    # pairs.to_json() holds a probe file's SHA-256: another file is another run
    return (ws.model_name, ws.revision, ws.stamp, ws.dtype, canonical_json(pairs.to_json()), settings, plan)


def patch_pair(model, pairs):
    """The pairs on the loaded model (a probe file tokenized by its tokenizer)."""
    if isinstance(pairs, (InductionCounterfactualSpec, ProbeFile)):
        return build_pairs(model, pairs)
    return pairs.build()


def run(ws, pairs, settings, plan, key) -> None:
    failure = None
    with st.status(f"Scoring the edges of {ws.model_name} at {ws.revision}...", expanded=True) as status:
        bar = st.progress(0.0, text="loading the model")

        def progress(stage: str, done: int, total: int) -> None:
            bar.progress(min(done / max(total, 1), 1.0), text=f"{stage}: {done}/{total}")

        try:
            model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
            report = edges_loaded(model, ws.model_name, ws.checkpoint, pairs, settings, plan, progress)
        except HeadLabError as exc:
            failure = str(exc)
            status.update(label="Edge run stopped", state="error", expanded=False)
        else:
            st.session_state.setdefault(RUNS, {})[key] = report
            status.update(label=f"Scored in {sum(report.seconds.values()):.1f} s", state="complete", expanded=False)
    if failure:
        st.error(failure)
    else:
        st.rerun()  # draw the report with the run button spent


def patched_effect(ws, pairs, settings, key, item: str, edges: list[str]) -> float:
    """The fraction of the clean-corrupted gap lost when `edges` are patched together (an edge alone, or every
    edge out of a node: its output replaced for every reader), measured once per run and item."""
    store = st.session_state.setdefault(EFFECTS, {})
    if (key, item) not in store:
        model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
        graph = check_edge_model(model)
        chunks, _ = edge_chunks(model, patch_pair(model, pairs), settings, graph)
        values = run_values(model, graph, chunks, settings.metric)
        patched = mean_value(model, graph, chunks, graph.edge_mask(edges), settings.metric)
        store[(key, item)] = float(1.0 - values.score(patched))
    return store[(key, item)]


def show_effect(ws, pairs, settings, key, report, item: str) -> None:
    """What patching the picked node or edge does, beside its score (an edge) or its edges' sums (a node)."""
    scores = report.scores
    if item.startswith(EDGE_PICK):
        edge = item[len(EDGE_PICK):]
        index = scores.edges.index(edge)
        lost = guarded(lambda: patched_effect(ws, pairs, settings, key, item, [edge]), stop=False)
        c = st.columns(3)
        c[0].metric(f"{scores.method} score", f"{scores.scores[index]:.4f}")
        c[1].metric("gap lost, patched alone", "—" if lost is None else f"{lost:.4f}",
                    help="Measured: the clean run with this edge alone carrying the corrupted sender output.")
        c[2].metric("in the discovered set", "yes" if edge in report.discovered else "no")
        return
    node = item[len(NODE_PICK):]
    totals = node_totals(scores).get(node, {"in": 0.0, "out": 0.0, "n_in": 0, "n_out": 0})
    outgoing = [e for e in scores.edges if e.startswith(f"{node}->")]
    patched = outgoing or [e for e in scores.edges if e.partition("->")[2].partition(".")[0] == node]
    lost = guarded(lambda: patched_effect(ws, pairs, settings, key, item, patched), stop=False)
    c = st.columns(3)
    c[0].metric(f"sum of {totals['n_out']} outgoing scores", f"{totals['out']:.4f}")
    c[1].metric(f"sum of {totals['n_in']} incoming scores", f"{totals['in']:.4f}")
    what = "its output patched for every reader" if outgoing else "every edge into it patched"
    c[2].metric(f"gap lost, {what}", "—" if lost is None else f"{lost:.4f}",
                help="Measured. For a head this is its activation-patching effect (its output from the corrupted "
                     "run, the rest of the model clean).")


def show(ws, pairs, settings, key, report, circuit) -> None:
    s = report.scores
    for note in report.notes:
        st.info(note, icon=":material/info:")
    m = st.columns(4)
    m[0].metric(f"clean {s.metric}", f"{s.clean_value:.4g}")
    m[1].metric(f"every edge patched {s.metric}", f"{s.corrupted_value:.4g}")
    m[2].metric("edges in the graph", f"{len(s.edges):,}")
    m[3].metric("discovered set", f"{len(report.discovered)} edges")  # its heads are listed below
    true_edges = () if circuit is None else circuit.edge_texts
    if circuit is not None:
        found = sorted(set(report.discovered) & set(true_edges))
        missed = sorted(set(true_edges) - set(report.discovered))
        st.caption(f"Known circuit (circuit.json): {len(true_edges)} edges; the discovered set holds {len(found)} of "
                   f"them{': ' + ', '.join(found) if found else ''}."
                   + (f" Missed by {s.method}: {', '.join(missed)}." if missed else " None missed."))

    heads = report.heads
    s1, s2 = st.columns([3, 1], vertical_alignment="bottom")
    s1.markdown("**Heads of the discovered set:** " + (", ".join(f"L{l}H{h}" for l, h in heads) or "none"))
    # a model with a small vocabulary (a known model) gets an induction probe it can read in the lab
    vocab = int(cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype).cfg.d_vocab)
    token_range = (int(getattr(pairs, "token_low", 0)), int(getattr(pairs, "token_high", min(vocab, 256))))
    s2.button("Send heads to the ablation lab", key="graph_to_ablation", icon=":material/science:", disabled=not heads,
              on_click=send_to_ablation_lab, args=(heads, vocab, token_range),
              kwargs={"probe_file": pairs if isinstance(pairs, ProbeFile) else None},
              help="Opens the ablation lab with these heads typed in (an uploaded file's clean prompts as its probe).")

    # a click on a node or an edge's midpoint picks it (read before the picker is drawn)
    chart_state = st.session_state.get(CHART)
    picks = picked_items(chart_state["selection"]["points"] if chart_state and "selection" in chart_state else [])
    if picks and picks != st.session_state.get("_graph_last_pick"):
        st.session_state[ITEM] = picks[0]
    st.session_state["_graph_last_pick"] = picks or None

    top = float(max(abs(s.scores).max(), 1e-9))
    if st.session_state.get("_graph_threshold_run") != key:  # a new run: the slider starts at the discovered set
        kept = sorted((abs(float(s.scores[s.edges.index(e)])) for e in report.discovered), reverse=True)
        st.session_state[THRESHOLD] = min(kept[-1], top) if kept else top
        st.session_state["_graph_threshold_run"] = key
    threshold = st.slider("Draw edges with |score| at least", 0.0, top, key=THRESHOLD, step=top / 500, format="%.4f")
    item = st.session_state.get(ITEM)
    bundle = circuit_graph_figure(report, threshold, true_edges=true_edges,
                                  selected=None if not item or item == NOTHING else item.partition(":")[2])
    show_figure(bundle, CHART, pickable=True)
    options = [NOTHING] + [NODE_PICK + n for n in dict.fromkeys(
        [r["sender"] for r in bundle.rows] + [r["receiver"] for r in bundle.rows])] + [EDGE_PICK + r["edge"] for r in bundle.rows]
    if st.session_state.get(ITEM) not in options:
        st.session_state[ITEM] = NOTHING
    item = st.selectbox("Patching effect of (click a node or an edge's midpoint, or choose)", options, key=ITEM)
    if item != NOTHING:
        show_effect(ws, pairs, settings, key, report, item)
    st.dataframe(pd.DataFrame(bundle.rows, columns=["edge", "score", "input", "width", "known", "discovered"]),
                 hide_index=True, width="stretch", height=240)
    st.download_button("JSON edge list (every edge)", edge_list_json(report),
                       f"edges-{ws.model_name.replace('/', '_')}-{s.method}.json", "application/json",
                       key="graph_edge_json", icon=":material/download:", on_click="ignore")

    left, right = st.columns(2)
    if report.curve is not None:
        with left:
            c = st.columns(2)
            c[0].metric("CPR (area under faithfulness, ↑)", f"{report.curve.cpr:.4f}")
            c[1].metric("CMD (area of |1 - f|, ↓)", f"{report.curve.cmd:.4f}")
            show_figure(faithfulness_figure(report), "graph_curve_fig")
    if report.controls is not None:
        e = report.controls
        with right:
            st.metric("verdict", e.verdict.label, help=e.verdict.rule)  # the whole column: the labels are long
            st.caption(f"discovered set's faithfulness {e.faithfulness:.3f}; "
                       + format_rank_z(e.stats["rank"], e.stats["p"], e.stats["n_controls"], e.stats["z"])
                       + f"; random sets {e.stats['control_mean']:.3f} ± {e.stats['control_std']:.3f}. "
                       + " ".join(e.verdict.reasons))
            show_figure(edge_controls_strip(report), "graph_controls_fig")


st.title("Circuit graph")
ws = require_workspace()
st.caption("Edge-level circuit discovery: every edge from the embeddings, a head or an MLP into a later head's "
           "query, key or value, an MLP or the logits, scored on clean/corrupted pairs by how much of the answer "
           "patching it alone loses. The discovered set is tested against random edge sets of the same shape.")
circuit = known_of(ws)
pairs = choose_pairs(ws, circuit)
settings, plan = choose_settings()
key = run_key(ws, pairs, settings, plan)
report = st.session_state.get(RUNS, {}).get(key)
if st.button("Run", type="primary", key="graph_run", disabled=report is not None,
             help="Results are kept for this session; the same pairs and settings are not scored twice."):
    run(ws, pairs, settings, plan, key)
if report is None:
    st.info("Press **Run**: EAP takes one forward and backward per batch, EAP-IG one per step, ACDC one forward per "
            "edge tested; then the curve and the controls one forward per circuit.")
else:
    show(ws, pairs, settings, key, report, circuit)
