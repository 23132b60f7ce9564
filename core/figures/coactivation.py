"""Figures of the co-activation proposal and its closure test [CVC], as FigureBundles.

Built from a core.pipelines.coactivation.CoactivationReport, so the page and `python -m core coactivation
--figures DIR` share them: the coupling graph (heads as nodes, edge width by |J|), the J matrix
ordered by community, ARI by k, the community table with the candidate, the closure z-scores per
metric, and (route-conditional) the observed statistic against its random-partition null.

Heads are flat indices f = layer * n_head + head in J, as everywhere in core.stats (spins, ising,
clusters). Node markers carry customdata "L{l}H{h}", so a click or a lasso names heads
(core.figures._style.heads_from_points).
"""

from __future__ import annotations

from typing import Any, Sequence

import networkx as nx
import numpy as np
import plotly.graph_objects as go

from core.figures._style import UNRELIABLE_OPACITY, _legend_on_top, z_reliable
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CLASS_COLORS, CONTROL_COLOR, LAYER_COLORS, PAPER_WIDTH, SCREEN
from core.heads import head_name
from core.results import provenance
from core.stats.inference import METRICS

EDGE_BINS = 4                      # edge widths are drawn in this many |J| bins (one trace each)
EDGE_WIDTHS = (0.6, 1.4, 2.6, 4.2)
POSITIVE_EDGE = "rgba(0,114,178,0.55)"
NEGATIVE_EDGE = "rgba(213,94,0,0.55)"
UNCLASSIFIED_COLOR = CLASS_COLORS["unspecialized"]
COLOR_BY = ("cluster", "class")
MAX_NAMED_HEADS = 60  # a J heatmap over more heads names its community blocks, not every head


def _names(n_layers: int, n_head: int) -> list[str]:
    return [head_name((l, h)) for l in range(n_layers) for h in range(n_head)]


def _prov(report: Any, figure: str, **extra: Any) -> dict:
    return provenance(figure=figure, model=report.model, revision=report.revision, probe_spec=report.probe_spec,
                      settings=report.settings, k=report.proposal.k, k_rule=report.proposal.k_rule,
                      source=_source(report), **extra)


def _source(report: Any) -> str:
    """Which examples the couplings come from."""
    if report.route is None:
        return f"all {report.proposal.n_examples} probe examples"
    return f"routing stratum {report.route.discovery_stratum} ({report.proposal.n_examples} examples)"


def cluster_color(cluster: int) -> str:
    return LAYER_COLORS[int(cluster) % len(LAYER_COLORS)]


def class_color(name: str) -> str:
    return CLASS_COLORS.get(name, UNCLASSIFIED_COLOR)


def default_edge_threshold(J: Any, quantile: float = 0.75) -> float:
    """|J| at this quantile of the off-diagonal couplings: the graph keeps the strongest quarter by default."""
    a = np.abs(np.asarray(J, dtype=np.float64))
    upper = a[np.triu_indices(a.shape[0], 1)]
    return float(np.quantile(upper, quantile)) if upper.size else 0.0


def graph_layout(J: Any, seed: int = 0) -> np.ndarray:
    """Node positions [head, 2] from networkx's spring layout of the full |J| graph (fixed seed).

    Computed on every coupling, not the thresholded ones, so nodes stay put when the threshold moves.
    """
    a = np.abs(np.asarray(J, dtype=np.float64))
    np.fill_diagonal(a, 0.0)
    graph = nx.from_numpy_array(a)
    pos = nx.spring_layout(graph, weight="weight", seed=seed)
    return np.array([pos[i] for i in range(a.shape[0])], dtype=np.float64)


def coupling_graph(report: Any, threshold: float | None = None, color_by: str = "cluster",
                   positions: np.ndarray | None = None) -> FigureBundle:
    """Heads as nodes coloured by community (or Step-2 class), edges where |J| > threshold, width by |J|.

    Blue edges: J > 0 (the heads tend to fire together); orange: J < 0. The candidate is outlined.
    threshold: None = the 75th percentile of |J| (default_edge_threshold).
    """
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {COLOR_BY}")
    J = np.asarray(report.J, dtype=np.float64)  # [head, head]
    n_layers, n_head = report.shape
    names = _names(n_layers, n_head)
    n = len(names)
    threshold = default_edge_threshold(J) if threshold is None else float(threshold)
    pos = graph_layout(J) if positions is None else np.asarray(positions, dtype=np.float64)  # [head, 2]
    clusters = np.asarray(report.cluster_labels, dtype=np.int64)  # [head]
    classes = [report.classes[l][h] for l in range(n_layers) for h in range(n_head)]
    candidate = set(report.candidate.heads)

    iu = np.triu_indices(n, 1)
    weights = np.abs(J[iu])
    keep = weights > threshold
    ei, ej, ew, es = iu[0][keep], iu[1][keep], weights[keep], np.sign(J[iu][keep])
    fig = go.Figure()
    if ew.size:
        edges = np.quantile(ew, np.linspace(0, 1, EDGE_BINS + 1)[1:-1]) if ew.size > 1 else np.array([])
        bins = np.searchsorted(edges, ew, side="right")  # [edge] in 0 .. EDGE_BINS-1
        for sign, color, label in ((1.0, POSITIVE_EDGE, "J > 0"), (-1.0, NEGATIVE_EDGE, "J < 0")):
            first = True
            for b in range(EDGE_BINS):
                pick = np.flatnonzero((bins == b) & (es == sign))
                if not pick.size:
                    continue
                xs, ys = [], []
                for e in pick:
                    xs += [pos[ei[e], 0], pos[ej[e], 0], None]
                    ys += [pos[ei[e], 1], pos[ej[e], 1], None]
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(width=EDGE_WIDTHS[b], color=color),
                                         hoverinfo="skip", name=label, legendgroup=label, showlegend=first))
                first = False
    groups = clusters if color_by == "cluster" else np.asarray(classes, dtype=object)
    for group in sorted(set(groups.tolist()), key=str):
        members = np.flatnonzero(groups == group)
        color = cluster_color(group) if color_by == "cluster" else class_color(str(group))
        is_cand = [divmod(int(f), n_head) in candidate for f in members]
        hover = [f"{names[f]}<br>community {clusters[f]}<br>class {classes[f]}" for f in members]
        fig.add_trace(go.Scatter(
            x=pos[members, 0].tolist(), y=pos[members, 1].tolist(), mode="markers+text",
            name=f"community {group}" if color_by == "cluster" else str(group),
            text=[names[f] for f in members], textposition="top center", textfont=dict(size=9),
            customdata=[names[f] for f in members], hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(size=14, color=color, line=dict(width=[3.0 if c else 0.8 for c in is_cand],
                                                        color=["black" if c else "#888" for c in is_cand])),
        ))
    fig.update_layout(template=SCREEN, height=560, dragmode="lasso",
                      title=f"coupling graph: |J| > {threshold:.3g}, nodes by {color_by} (candidate outlined)")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x")
    _legend_on_top(fig)
    rows = [{"kind": "node", "head_name": names[f], "layer": f // n_head, "head": f % n_head,
             "community": int(clusters[f]), "class": classes[f], "x": float(pos[f, 0]), "y": float(pos[f, 1]),
             "candidate": divmod(f, n_head) in candidate} for f in range(n)]
    rows += [{"kind": "edge", "head_name": names[i], "other": names[j], "J": float(J[i, j])}
             for i, j in zip(ei.tolist(), ej.tolist())]
    caption = (f"couplings from {_source(report)}; edges with |J| > {threshold:.3g} ({int(keep.sum())} of "
               f"{weights.size}), width by |J| in {EDGE_BINS} bins, blue J > 0, orange J < 0; spring layout of all "
               "|J| (seed 0). Click or lasso a node to pick its community.")
    return FigureBundle("coactivation-graph", fig, tuple(rows), _prov(report, "coupling_graph", threshold=threshold,
                                                                      color_by=color_by), caption, (PAPER_WIDTH, 480))


def cluster_order(cluster_labels: Sequence[int]) -> np.ndarray:
    """Flat heads sorted by (community, flat index): the order of the J heatmap."""
    labels = np.asarray(cluster_labels, dtype=np.int64)
    return np.lexsort((np.arange(labels.size), labels))


def coupling_heatmap(report: Any) -> FigureBundle:
    """J [head, head] with rows and columns ordered by community; community blocks outlined."""
    J = np.asarray(report.J, dtype=np.float64)
    n_layers, n_head = report.shape
    names = _names(n_layers, n_head)
    labels = np.asarray(report.cluster_labels, dtype=np.int64)
    order = cluster_order(labels)
    Jo = J[np.ix_(order, order)]
    ordered = [names[f] for f in order]
    lim = float(np.abs(Jo).max()) or 1.0
    index = list(range(len(ordered)))
    pairs = [[f"{r} – {c}" for c in ordered] for r in ordered]  # hover names, whatever the ticks show
    fig = go.Figure(go.Heatmap(z=Jo.tolist(), x=index, y=index, zmid=0.0, zmin=-lim, zmax=lim, customdata=pairs,
                               colorscale="RdBu_r", colorbar=dict(title="J"),
                               hovertemplate="%{customdata}: J = %{z:.3g}<extra></extra>"))
    start, centres, block_names = 0, [], []
    for c in sorted(set(labels.tolist())):
        size = int((labels == c).sum())
        color = CANDIDATE_COLOR if c == report.proposal.selection.candidate.cluster else "#333"
        width = 3 if c == report.proposal.selection.candidate.cluster else 1
        fig.add_shape(type="rect", x0=start - 0.5, x1=start + size - 0.5, y0=start - 0.5, y1=start + size - 0.5,
                      line=dict(color=color, width=width))
        centres.append(start + (size - 1) / 2)
        block_names.append(f"community {c} ({size})")
        start += size
    side = max(420, min(900, 120 + 16 * len(names)))
    if len(ordered) <= MAX_NAMED_HEADS:  # every head named
        ticks = dict(tickmode="array", tickvals=index, ticktext=ordered, tickfont=dict(size=8))
    else:  # a real model's 270 names would overlap: name the community blocks (the hover names each cell)
        ticks = dict(tickmode="array", tickvals=centres, ticktext=block_names, tickfont=dict(size=10))
    fig.update_layout(template=SCREEN, height=side, title=f"J by community (k = {report.proposal.k})")
    fig.update_xaxes(tickangle=-90, showgrid=False, **ticks)
    fig.update_yaxes(autorange="reversed", showgrid=False, **ticks)
    rows = tuple({"row": ordered[a], "column": ordered[b], "row_community": int(labels[order[a]]),
                  "column_community": int(labels[order[b]]), "J": float(Jo[a, b])}
                 for a in range(len(order)) for b in range(len(order)))
    caption = (f"couplings from {_source(report)}; symmetric, zero diagonal; heads grouped by community of the "
               f"candidate clustering (k-means n_init = {report.proposal.selection.n_init}).")
    return FigureBundle("coactivation-J", fig, rows, _prov(report, "coupling_heatmap"), caption, (PAPER_WIDTH, PAPER_WIDTH))


def ari_by_k_chart(report: Any) -> FigureBundle:
    """ARI, NMI and purity of the spectral clusters against the supervised classes, per k; the chosen k marked."""
    scores = report.proposal.scores
    ks = list(scores.ks)
    fig = go.Figure()
    colors = {"ari": CANDIDATE_COLOR, "nmi": "#0072B2", "purity": CONTROL_COLOR}
    for metric in ("ari", "nmi", "purity"):
        fig.add_trace(go.Scatter(x=ks, y=[getattr(m, metric) for m in scores.metrics], mode="lines+markers",
                                 name=metric.upper() if metric != "purity" else "purity",
                                 line=dict(color=colors[metric])))
    fig.add_vline(x=report.proposal.k, line_dash="dash", line_color="#444", line_width=1,
                  annotation_text=f"k = {report.proposal.k} ({report.proposal.k_rule})", annotation_position="top")
    fig.update_layout(template=SCREEN, height=340, xaxis_title="k (spectral clusters of |J|)",
                      yaxis_title="agreement with Step-2 classes",
                      title=f"ARI by k over the {len(report.labels)} labelled heads")
    fig.update_xaxes(tickmode="array", tickvals=ks)
    # the legend below the axis: on top it covered the chosen k's label (the chart is drawn in a narrow column)
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=-0.3, yanchor="top"), margin=dict(t=80, b=110),
                      height=380)
    rows = tuple({"k": m.k, "ari": m.ari, "nmi": m.nmi, "purity": m.purity, "n_evaluated": m.n_evaluated,
                  "chosen": m.k == report.proposal.k} for m in scores.metrics)
    caption = (f"labels: Step-2 class (≥ {report.settings.get('class_threshold', 30):g}x, else unclassified) of the top-"
               f"{len(report.labels)} heads by PR integral; clusters from {_source(report)} "
               f"(k-means n_init = {scores.n_init if scores.n_init is not None else 'sklearn default'}).")
    return FigureBundle("coactivation-ari-by-k", fig, rows, _prov(report, "ari_by_k"), caption)


def candidate_rows(report: Any) -> list[dict]:
    """One row per community: size, heads, composition, purity, isolation, score, and which is the candidate."""
    sel = report.proposal.selection
    out = []
    for c in sel.clusters:
        out.append({
            "community": c.cluster, "size": c.size, "heads": ", ".join(head_name(h) for h in c.heads),
            "layers": ", ".join(map(str, c.layers)),
            "composition": ", ".join(f"{k} {v}" for k, v in sorted(c.composition.items())) or "-",
            "n_classified": c.n_classified, "purity": c.purity, "within_mean_J": c.within_mean_J,
            "outside_mean_J": c.outside_mean_J, "isolation": c.isolation_ratio, "score": c.combined_score,
            "eligible": c.eligible, "candidate": c.cluster == sel.candidate.cluster,
        })
    return out


def candidate_table(report: Any) -> FigureBundle:
    """The community table as a figure (so it exports like the others); the candidate row highlighted."""
    rows = candidate_rows(report)
    columns = ["community", "size", "heads", "composition", "purity", "isolation", "score", "eligible"]

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    fill = [["#FBE3D6" if r["candidate"] else "white" for r in rows]] * len(columns)
    fig = go.Figure(go.Table(
        columnwidth=[1, 0.7, 4, 3, 1, 1, 1, 1],
        header=dict(values=columns, fill_color="#eeeeee", align="left", font=dict(size=12)),
        cells=dict(values=[[cell(r[c]) for r in rows] for c in columns], fill_color=fill, align="left",
                   font=dict(size=11)),
    ))
    sel = report.proposal.selection
    fig.update_layout(template=SCREEN, height=max(220, 90 + 32 * len(rows)),
                      title=f"communities at k = {sel.k}; candidate {sel.candidate.cluster} highlighted")
    caption = (f"score = purity × isolation × min(size, {sel.max_size})/{sel.max_size}, for communities of "
               f"{sel.min_size}..{sel.max_size} heads" + (" (none qualified: all scored)" if sel.fallback else "")
               + "; isolation = mean |J| inside / mean |J| to the rest.")
    return FigureBundle("coactivation-candidates", fig, tuple(rows), _prov(report, "candidate_table"), caption,
                        (PAPER_WIDTH * 2, max(220, 90 + 32 * len(rows))))


def closure_z_chart(report: Any) -> FigureBundle:
    """z of each metric for every control kind and split, with the ±threshold lines; verdicts in the legend."""
    closure = report.closure
    if closure is None:
        raise ValueError("this report has no closure test")
    fig = go.Figure()
    rows = []
    reliable = z_reliable(closure.n_controls)  # below 10 controls: bars greyed out
    palette = {("matched", "all"): "#0072B2", ("any-layer", "all"): "#009E73", ("matched", "on"): "#56B4E9",
               ("matched", "off"): "#9ecae1", ("any-layer", "on"): "#74c476", ("any-layer", "off"): "#c7e9c0"}
    for s in closure.splits:
        z = [s.z(m) for m in METRICS]
        name = f"{s.kind}, {s.split} (n={s.n_examples}): {s.verdicts['paper'].label} / {s.verdicts['reference'].label}"
        fig.add_trace(go.Bar(x=list(METRICS), y=z, name=name, marker_color=palette.get((s.kind, s.split), "#888"),
                             opacity=1.0 if reliable else UNRELIABLE_OPACITY,
                             customdata=[[s.stats[m].get("rank"), s.stats[m].get("p")] for m in METRICS],
                             hovertemplate="%{x}: rank %{customdata[0]}, p = %{customdata[1]:.3g}; z = %{y:.3g}"
                                           "<extra></extra>"))
        for m in METRICS:
            st = s.stats[m]
            rows.append({"kind": s.kind, "split": s.split, "n_examples": s.n_examples, "metric": m,
                         "candidate_delta": st["candidate_delta"], "control_mean": st.get("control_mean"),
                         "control_std": st.get("control_std"), "rank": st.get("rank"), "p": st.get("p"),
                         "n_controls": len(st.get("control_deltas", ())), "z": st.get("z"), "damaging": st["damaging"],
                         "verdict_paper": s.verdicts["paper"].label,
                         "verdict_reference": s.verdicts["reference"].label})
    for y in (closure.z_threshold, -closure.z_threshold):
        fig.add_hline(y=y, line_dash="dot", line_color="#444", line_width=1)
    fig.update_layout(template=SCREEN, barmode="group", height=400, yaxis_title="z vs random controls",
                      title=f"closure of {closure.selection}: {closure.n_controls} controls per kind "
                            f"(verdicts paper / reference)")
    _legend_on_top(fig)
    fig.update_layout(margin=dict(t=60 + 22 * len(closure.splits)), legend=dict(orientation="v"))
    caption = ("z = (candidate Δ − control mean) / control std (ddof 0); damage is loss up, top-1 / top-5 / target "
               f"logit down. Paper rule: every Δ damaging and z_{'target_logit' if closure.headline == 'logit' else 'loss'}"
               f" beyond ±{closure.z_threshold:g}; reference rule: every Δ damaging and outside the control range on "
               "one metric; Δ loss < 0 with z_loss < −threshold fails in the wrong direction."
               + ("" if reliable else f" Greyed: {closure.n_controls} controls per kind (fewer than 10), so z is "
                  f"unreliable; the smallest rank p is 1/{closure.n_controls + 1}."))
    return FigureBundle("coactivation-closure-z", fig, tuple(rows),
                        _prov(report, "closure_z", selection=str(closure.selection), n_controls=closure.n_controls,
                              control_seed=closure.control_seed, skipped=closure.skipped), caption)


def route_null_chart(report: Any) -> FigureBundle:
    """The route-conditional statistic (best within-stratum ARI, max over strata) against its null draws."""
    route = report.route
    if route is None:
        raise ValueError("this report has no route-conditional analysis")
    null = np.asarray(route.null.null_max, dtype=np.float64)
    rng = np.random.RandomState(0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=rng.uniform(-0.15, 0.15, null.size).tolist(), y=null.tolist(), mode="markers",
                             name=f"random partitions ({null.size})", marker=dict(color=CONTROL_COLOR, size=8),
                             hovertemplate="null: %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[1.0], y=[route.statistic.max_ari], mode="markers", name="routing strata",
                             marker=dict(color=CANDIDATE_COLOR, size=14, symbol="diamond"),
                             hovertemplate="observed: %{y:.3f}<extra></extra>"))
    fig.update_xaxes(tickmode="array", tickvals=[0, 1], ticktext=["null", "observed"], range=[-0.6, 1.6], showgrid=False)
    z = route.null.z_max
    fig.update_layout(template=SCREEN, height=340, yaxis_title="max over strata of best ARI",
                      title=f"route-conditional statistic vs {route.null.partition} random partitions: z = "
                            f"{'-' if z is None else f'{z:+.2f}'}")
    _legend_on_top(fig)
    rows = [{"draw": i, "seed": s, "null_max_ari": float(v)} for i, (s, v) in enumerate(zip(route.null.seeds, null))]
    rows.append({"draw": "observed", "seed": route.strata_seed, "null_max_ari": route.statistic.max_ari})
    caption = (f"strata sizes {list(route.sizes)} (k-means on router weights at q, K = {route.n_strata}); null: the same "
               f"per-stratum pipeline on {null.size} random partitions of these sizes; z with ddof 0.")
    return FigureBundle("coactivation-route-null", fig, tuple(rows), _prov(report, "route_null"), caption)


def coactivation_bundles(report: Any, threshold: float | None = None) -> list[FigureBundle]:
    """Every co-activation figure of a report (for the CLI export)."""
    out = [coupling_graph(report, threshold, "cluster"), coupling_heatmap(report), ari_by_k_chart(report),
           candidate_table(report)]
    if report.closure is not None:
        out.append(closure_z_chart(report))
    if report.route is not None:
        out.append(route_null_chart(report))
    return out
