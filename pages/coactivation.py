"""Co-activation [CVC]: Ising communities of heads from their co-activation, and the closure test of a community."""

import dataclasses

import pandas as pd
import streamlit as st

from core.figures.ablation import ablation_strip
from core.figures.coactivation import (ari_by_k_chart, candidate_rows, candidate_table, closure_z_chart, coupling_graph,
                                       coupling_heatmap, default_edge_threshold, route_null_chart)
from core.pipelines.closure import DEFAULT_N_CONTROLS
from core.pipelines.coactivation import DEFAULT_N_NULL, DEFAULT_STRATA, CoactivationSettings, default_settings
from core.stats.inference import METRICS, format_z
from pages._cache import cached_proposal, checkpoint_stats, run_closure, stored_closure
from pages._state import N_EXAMPLES, require_workspace, send_to_ablation_lab, set_choice
from pages._widgets import export_buttons, guarded, new_pick, show_figure

GRAPH_KEY = "coact_graph"
BEST = "best ARI"
COMMUNITY = "coact_community"  # the community select box
PROPOSAL = "_coact_proposal"  # the proposal settings of the last run (a new proposal starts at its candidate)
CLOSURE = "coact_closure"  # the closure test on show (None: none yet)



def _community_cells(row: dict) -> dict:
    """A community's table row as text (the full head list; numbers to 3 significant digits)."""
    def text(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    columns = ("community", "size", "heads", "composition", "purity", "isolation", "score", "eligible", "candidate")
    return {c: text(row[c]) for c in columns}


def _use_n(n: int) -> None:
    set_choice(N_EXAMPLES, n)


st.title("Co-activation")
st.caption("Co-activation proposes, ablation disposes [CVC]: spins = each head's max attention at the query, split at "
           "its median; a pseudolikelihood Ising model couples them; spectral clusters of |J| are the communities; "
           "the candidate community is then ablated against random controls.")
ws = require_workspace()
stats = guarded(lambda: checkpoint_stats(ws))
n_layers, n_heads = int(stats.attn_max.shape[1]), int(stats.attn_max.shape[2])
n_total = n_layers * n_heads
defaults = default_settings(n_total)

with st.expander("Settings", expanded=False):
    c1, c2, c3, c4 = st.columns(4)
    route = c1.toggle("Route-conditional (MoE)", key="coact_route",
                      help="Strata from the router weights at the query (k-means), one Ising fit per stratum, a "
                           "random-partition null, and closure on / off the discovery stratum.")
    top_k = int(c2.number_input("Labelled heads (top-K by PR integral)", 2, n_total, defaults["top_k"], key=f"coact_top_k-{ws.model_name}",
                                help="Default max(round(0.18 × heads), min(heads, 16))."))
    ks = c3.multiselect("k to score by ARI", list(range(2, n_total)), default=defaults["ks"], key=f"coact_ks-{ws.model_name}")
    fixed = c4.selectbox("k of the candidate", [BEST] + list(range(2, n_total)), key=f"coact_k-{ws.model_name}")
    c5, c6, c7, c8 = st.columns(4)
    min_size = int(c5.number_input("Smallest candidate", 1, n_total, defaults["min_size"], key=f"coact_min_size-{ws.model_name}"))
    max_size = int(c6.number_input("Largest candidate", 1, n_total, defaults["max_size"], key=f"coact_max_size-{ws.model_name}"))
    n_init = int(c7.number_input("k-means n_init (candidate)", 1, 100, 1, key="coact_n_init",
                                 help="The reference re-clusters with n_init = 1 for the candidate."))
    drop_constant = c8.checkbox("Leave constant heads out", key="coact_drop_constant",
                                help="A head whose spin never changes cannot be fitted; leave it out (zero couplings).")
    n_strata, n_null = DEFAULT_STRATA, DEFAULT_N_NULL
    if route:
        r1, r2 = st.columns(2)
        n_strata = int(r1.number_input("Routing strata K", 2, 16, DEFAULT_STRATA, key="coact_strata"))
        n_null = int(r2.number_input("Random partitions (null)", 1, 200, DEFAULT_N_NULL, key="coact_null"))

if ws.spec.n_examples < n_total:  # the fit needs a spin sample per head at least: say so, and offer the size
    enough = -(-n_total // 8) * 8
    st.info(f"Co-activation fits one spin per head, so it needs at least as many probe examples as heads: "
            f"{ws.model_name} has {n_total} heads and the sidebar's probe {ws.spec.n_examples} examples.")
    st.button(f"Use N = {enough} examples", key="coact_use_n", on_click=_use_n, args=(enough,),
              help="Sets the sidebar's N examples for the whole workspace (every page measures on it).")
    st.stop()
if not ks:
    st.error("Pick at least one k to score (reference: 4, 6, 8, 10, 12).")
    st.stop()
settings = guarded(lambda: CoactivationSettings(
    route_conditional=bool(route), top_k=top_k, ks=tuple(sorted(ks)), k=None if fixed == BEST else int(fixed),
    n_init=n_init, min_size=min_size, max_size=max_size, drop_constant=bool(drop_constant), n_strata=n_strata,
    n_null=n_null, run_closure=False))
proposal_args = (ws.model_name, ws.revision, ws.spec_json, ws.stamp, settings)
report = guarded(lambda: cached_proposal(ws.model_name, ws.revision, ws.spec_json, ws.stamp, settings, ws.dtype))
selection = report.proposal.selection
best = report.proposal.scores.metric(report.proposal.scores.best_k)

m1, m2, m3, m4 = st.columns(4)
m1.metric("k", report.proposal.k, help=f"{report.proposal.k_rule}; scored k: {', '.join(map(str, report.proposal.scores.ks))}")
m2.metric(f"ARI at best k = {best.k}", f"{best.ari:.3f}", help=f"over the {len(report.labels)} labelled heads")
m3.metric("candidate", f"{selection.candidate.size} heads", help=str(report.candidate))
if report.route is not None:
    z = report.route.null.z_max
    m4.metric("route statistic vs null", "—" if z is None else f"z = {z:+.2f}",
              help=f"best within-stratum ARI {report.route.statistic.max_ari:.3f}; null "
                   f"{report.route.null.null_max_mean:.3f} ± {report.route.null.null_max_std:.3f}")
if not report.proposal.fit.converged:  # only with allow_unconverged: the pipeline refuses it otherwise
    st.warning(f"The Ising fit did not converge in {report.proposal.fit.n_iter} iterations: its couplings are not the optimum.")
for note in report.notes:
    st.caption(f"Note: {note}")

# A click or lasso on the graph picks the community of the first node it hits (read before the box is drawn).
communities = [c.cluster for c in selection.clusters]
cluster_of = {h: c.cluster for c in selection.clusters for h in c.heads}
picked = new_pick(GRAPH_KEY)
if picked:
    st.session_state[COMMUNITY] = cluster_of.get(picked[0], selection.candidate.cluster)
if (st.session_state.get(COMMUNITY) not in communities
        or st.session_state.get(PROPOSAL) != proposal_args):  # a new proposal starts at its candidate
    st.session_state[COMMUNITY] = selection.candidate.cluster
st.session_state[PROPOSAL] = proposal_args

left, right = st.columns([3, 2])
with left:
    g1, g2 = st.columns(2)
    color_by = g1.radio("Colour nodes by", ["cluster", "class"], horizontal=True, key="coact_color_by")
    quantile = g2.slider("Show couplings above this quantile of |J|", 0.0, 0.99, 0.75, 0.01, key="coact_quantile")
    threshold = default_edge_threshold(report.J, quantile)
    show_figure(coupling_graph(report, threshold, color_by), GRAPH_KEY, pickable=True)
with right:
    show_figure(coupling_heatmap(report), "coact_heatmap")

left, right = st.columns([2, 3])
with left:
    show_figure(ari_by_k_chart(report), "coact_ari")
with right:
    st.markdown(f"**Communities at k = {selection.k}** (candidate {selection.candidate.cluster})")
    table = candidate_table(report)
    # st.table wraps long cells (a community of a real model names dozens of heads); st.dataframe clipped them
    st.table(pd.DataFrame([_community_cells(row) for row in candidate_rows(report)]).set_index("community"))
    caption, export = st.columns([5, 1])
    caption.caption(table.caption)
    with export:
        export_buttons(table, "coact_table")

if report.route is not None:
    st.subheader("Routing strata")
    left, right = st.columns([3, 2])
    with left:
        show_figure(route_null_chart(report), "coact_route_null")
    with right:
        st.dataframe(pd.DataFrame([{"stratum": s.stratum, "examples": s.n_examples, "best k": s.best_k, "ARI": s.ari,
                                    "NMI": s.nmi, "purity": s.purity, "constant heads": s.n_constant_heads,
                                    "discovery": s.stratum == report.route.discovery_stratum}
                                   for s in report.route.statistic.per_stratum]), hide_index=True, width="stretch")
        st.caption(f"The communities above come from stratum {report.route.discovery_stratum} (best ARI); the closure "
                   "test reports every example, and those on and off that stratum.")

# ------------------------------------------------------------------ a community: to the lab, or its closure here
st.subheader("Test a community")
a1, a2, a3 = st.columns([3, 1, 1])
labels = {c.cluster: f"community {c.cluster}" + (" (candidate)" if c.cluster == selection.candidate.cluster else "")
          + f": {', '.join(f'L{l}H{h}' for l, h in c.heads)}" for c in selection.clusters}
community = a1.selectbox("Community (or click a node on the graph)", communities, format_func=lambda c: labels[c],
                         key=COMMUNITY)
n_controls = int(a2.number_input("Controls per kind", 1, 100, DEFAULT_N_CONTROLS, key="coact_controls"))
control_seed = int(a3.number_input("Control seed", 0, 2**31 - 1, 123, key="coact_control_seed"))
heads = report.community(community)
b1, b2 = st.columns(2)
b1.button("Send to the ablation lab", key="coact_send", icon=":material/science:",
          help="Opens the ablation lab with these heads typed in.", on_click=send_to_ablation_lab, args=(heads,))
run = b2.button("Run its closure test here", key="coact_run_closure", type="primary",
                help="Ablate it against random controls from the same layers and from any layer, every metric.")

test = stored_closure(ws, heads, n_controls, control_seed, report.route)
if run and test is None:
    bar = st.progress(0.0, text="Loading the model...")
    test = guarded(lambda: run_closure(ws, heads, n_controls, control_seed, report.route,
                                       progress=lambda done, total: bar.progress(min(done / total, 1.0),
                                                                                 text=f"condition passes: {done}/{total}")),
                   stop=False)
    bar.empty()
if run or test is not None:
    st.session_state[CLOSURE] = test
test = st.session_state.get(CLOSURE)
if test is None:
    st.info("Pick a community (the candidate is preselected) and run its closure test, or send it to the ablation lab.")
    st.stop()

st.markdown(f"**Closure test of {test.selection}** — {test.n_controls} controls per kind, seed {test.control_seed}")
for kind, reason in test.skipped.items():
    st.warning(f"{kind} controls skipped: {reason}")
rows = []
for s in test.splits:
    row = {"controls": s.kind, "examples": s.split, "n": s.n_examples}
    for m in METRICS:
        row[f"Δ {m}"] = s.stats[m]["candidate_delta"]
        row[f"z {m}"] = format_z(s.stats[m].get("z"))
    row["paper rule"] = s.verdicts["paper"].label
    row["reference rule"] = s.verdicts["reference"].label
    rows.append(row)
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
for s in test.splits:
    for rule, verdict in s.verdicts.items():
        body = (f"**{s.kind} controls, {s.split} examples, {rule} rule: {verdict.label}**  \nrule — {verdict.rule}\n\n"
                + "\n".join(f"- {reason}" for reason in verdict.reasons))
        if verdict.label == "pass":
            st.success(body, icon=":material/check_circle:")
        elif verdict.label in ("fails in the wrong direction", "inconclusive"):
            st.warning(body, icon=":material/swap_vert:")
        else:
            st.info(body, icon=":material/cancel:")
show_figure(closure_z_chart(dataclasses.replace(report, closure=test)), "coact_closure_z")
kind = st.radio("Strip plot of", list(test.results), horizontal=True, key="coact_strip_kind")
show_figure(ablation_strip(test.results[kind], ws.model_name, ws.revision), "coact_strip")
