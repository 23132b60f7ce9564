"""Figures of edge-level circuit discovery (core.pipelines.edges.EdgeReport), shared by the app and exports.

- `circuit_graph_figure`: the edge graph laid out by layer, every edge with |score| >= threshold drawn
  as a line whose width is proportional to |score| (colour: sign; dash: the receiver's input); on a
  large model only the nodes those edges touch are named;
- `faithfulness_figure`: the faithfulness of the top-k edges against the fraction of edges kept, CPR and
  CMD in the title;
- `edge_controls_strip`: the discovered edge set's faithfulness against its matched-random edge sets;
- `edge_list_json`: the scored edge list (sender, receiver, input, score) as JSON for export.

Layout (`node_positions`): x = layer (the embeddings at -1, the logits at n_layers), a layer's heads
spread vertically around 0 (head 0 on top), its MLP at the layer's end (x = layer + MLP_OFFSET, y = 0).
An edge into a head ends a little above (q), at (k) or below (v) the head's marker, so the three
inputs stay apart. Clickable: the nodes' markers and a marker at each drawn edge's midpoint carry
customdata "node:NAME" / "edge:TEXT" (`picked_items` reads a selection back).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import networkx as nx
import numpy as np
import plotly.graph_objects as go

from core.ablation.edges.graph import EMBED, LOGITS, Edge, EdgeGraph, node_layer
from core.errors import HeadLabError
from core.figures._style import _legend_on_top, rank_z_title
from core.figures.bundle import FigureBundle
from core.figures.theme import CANDIDATE_COLOR, CONTROL_COLOR, FADED, SCREEN
from core.results import json_default, provenance

MLP_OFFSET = 0.45  # an MLP sits at its layer's end, between the layer's heads and the next layer's
INPUT_OFFSET = {"q": 0.22, "k": 0.0, "v": -0.22, "": 0.0}  # where an edge into a head's input ends (head units)
INPUT_DASH = {"q": "dot", "k": "dash", "v": "dashdot", "": "solid"}  # "": into an MLP or the logits
INPUT_LABEL = {"q": "into a query (q)", "k": "into a key (k)", "v": "into a value (v)", "": "into an MLP / the logits"}
POSITIVE_COLOR = CANDIDATE_COLOR  # patching the edge loses answer (importance > 0)
NEGATIVE_COLOR = "#0072B2"  # patching the edge helps the answer (importance < 0)
NODE_COLORS = {"embed": "#444444", "head": "#009E73", "mlp": "#E69F00", "logits": "#444444"}
MAX_WIDTH = 8.0  # px, the edge of largest |score| drawn
MIN_WIDTH = 0.4  # px, so that a drawn edge of tiny |score| stays visible
MAX_DRAWN = 400  # edges drawn at most (the largest |score| first): one trace each
NODE_PICK, EDGE_PICK = "node:", "edge:"
LABEL_EVERY_NODE = 80  # a graph with more nodes names only those the drawn edges touch


def _scores_of(report_or_scores: Any) -> tuple[Any, Any]:
    """(EdgeScores, the EdgeReport or None) from either."""
    scores = getattr(report_or_scores, "scores", None)
    if scores is not None and hasattr(scores, "edges") and hasattr(scores, "graph"):
        return scores, report_or_scores
    if hasattr(report_or_scores, "edges") and hasattr(report_or_scores, "graph"):
        return report_or_scores, None
    raise HeadLabError("expected an edge report (core.pipelines.edges) or edge scores (core.ablation.edges).")


def node_kind(node: str) -> str:
    """"embed", "head", "mlp" or "logits"."""
    if node in (EMBED, LOGITS):
        return node
    return "mlp" if node.startswith("MLP") else "head"


def node_positions(graph: EdgeGraph) -> dict[str, tuple[float, float]]:
    """Each node's (x, y): x = layer (embed -1, logits n_layers, an MLP at its layer + MLP_OFFSET); heads
    spread over y = (n_heads - 1) / 2 - h, so head 0 is on top and each layer is centred on 0."""
    out: dict[str, tuple[float, float]] = {}
    for node in graph.senders + (LOGITS,):
        layer = float(node_layer(node, graph.n_layers))
        kind = node_kind(node)
        if kind == "head":
            head = int(node.partition("H")[2])
            out[node] = (layer, (graph.n_heads - 1) / 2 - head)
        else:
            out[node] = (layer + (MLP_OFFSET if kind == "mlp" else 0.0), 0.0)
    return out


def graph_of(report_or_scores: Any) -> nx.DiGraph:
    """The scored edge graph as a networkx DiGraph: nodes with layer, kind and pos; one edge per (sender, receiver)
    pair with its inputs' scores ({"q": .., "k": .., "v": ..} or {"": ..})."""
    scores, _ = _scores_of(report_or_scores)
    graph = EdgeGraph.from_summary(scores.graph)
    positions = node_positions(graph)
    g = nx.DiGraph()
    for node, pos in positions.items():
        g.add_node(node, layer=node_layer(node, graph.n_layers), kind=node_kind(node), pos=pos)
    for text, score in zip(scores.edges, np.asarray(scores.scores, dtype=np.float64)):
        edge = Edge.parse(text)
        if not g.has_edge(edge.sender, edge.receiver):
            g.add_edge(edge.sender, edge.receiver, scores={})
        g.edges[edge.sender, edge.receiver]["scores"][edge.input] = float(score)
    return g


def drawn_edges(scores: Any, threshold: float = 0.0, max_edges: int = MAX_DRAWN) -> np.ndarray:
    """Indices of the edges drawn at `threshold`: |score| >= threshold, the largest |score| first, at most max_edges."""
    values = np.abs(np.asarray(scores.scores, dtype=np.float64))
    order = np.argsort(-values, kind="stable")
    keep = order[values[order] >= float(threshold)]
    return keep[: int(max_edges)]


def edge_widths(values: np.ndarray) -> np.ndarray:
    """Line widths proportional to |value| (MAX_WIDTH at the largest), never below MIN_WIDTH."""
    values = np.abs(np.asarray(values, dtype=np.float64))
    top = float(values.max()) if values.size else 0.0
    if top <= 0:
        return np.full(values.shape, MIN_WIDTH)
    return np.maximum(MAX_WIDTH * values / top, MIN_WIDTH)


def node_totals(scores: Any) -> dict[str, dict[str, float]]:
    """Per node: the sum of its incoming and of its outgoing edges' scores (and their count)."""
    out: dict[str, dict[str, float]] = {}
    for text, score in zip(scores.edges, np.asarray(scores.scores, dtype=np.float64)):
        edge = Edge.parse(text)
        for node, side in ((edge.sender, "out"), (edge.receiver, "in")):
            entry = out.setdefault(node, {"in": 0.0, "out": 0.0, "n_in": 0, "n_out": 0})
            entry[side] += float(score)
            entry[f"n_{side}"] += 1
    return out


def _prov(scores: Any, report: Any, figure: str, **extra) -> dict:
    where = {} if report is None else {"model": report.model, "revision": report.revision, "plan": report.plan.to_json()}
    return provenance(figure=figure, method=scores.method, metric=scores.metric, edges=scores.provenance, **where,
                      **extra)


def circuit_graph_figure(report_or_scores: Any, threshold: float = 0.0, max_edges: int = MAX_DRAWN,
                         true_edges: Iterable[str] = (), selected: str | None = None) -> FigureBundle:
    """The edge graph by layer: every edge with |score| >= threshold (at most max_edges, the largest first) as a
    line of width proportional to |score|; red where patching the edge loses answer, blue where it helps.

    true_edges: edges known to be the circuit (a known model's circuit.json), marked in the hover and the rows;
    selected: a node or edge text drawn highlighted (the one the page shows the effect of).
    """
    scores, report = _scores_of(report_or_scores)
    graph = EdgeGraph.from_summary(scores.graph)
    g = graph_of(scores)
    pos = nx.get_node_attributes(g, "pos")
    values = np.asarray(scores.scores, dtype=np.float64)
    chosen = drawn_edges(scores, threshold, max_edges)
    widths = edge_widths(values[chosen])
    truth = set(true_edges)
    discovered = set(() if report is None else report.discovered)
    fig = go.Figure()
    rows, mid_x, mid_y, mid_data, mid_text = [], [], [], [], []
    for index, width in zip(chosen[::-1], widths[::-1]):  # the strongest drawn last, on top
        text = scores.edges[index]
        edge = Edge.parse(text)
        (x0, y0), (x1, y1) = pos[edge.sender], pos[edge.receiver]
        y1 = y1 + INPUT_OFFSET[edge.input]
        value = float(values[index])
        color = POSITIVE_COLOR if value > 0 else NEGATIVE_COLOR if value < 0 else FADED  # 0: e.g. ACDC, untested
        highlight = selected == text
        fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                 opacity=1.0 if highlight or selected is None else 0.75,
                                 line=dict(width=float(width) + (2 if highlight else 0), color=color,
                                           dash=INPUT_DASH[edge.input])))
        marks = [m for m, on in (("known circuit edge", text in truth), ("discovered", text in discovered)) if on]
        mid_x.append((x0 + x1) / 2)
        mid_y.append((y0 + y1) / 2)
        mid_data.append(EDGE_PICK + text)
        mid_text.append(f"{text}: score {value:.4f}" + (f" ({', '.join(marks)})" if marks else ""))
        rows.append({"edge": text, "sender": edge.sender, "receiver": edge.receiver, "input": edge.input,
                     "score": value, "width": float(width), "known": text in truth, "discovered": text in discovered})
    rows.reverse()  # largest |score| first
    fig.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers", name="edges", customdata=mid_data, text=mid_text,
                             hovertemplate="%{text}<extra></extra>", showlegend=False,
                             marker=dict(size=7, color="rgba(80,80,80,0.25)", line=dict(width=0))))
    totals = node_totals(scores)
    names = list(pos)
    hover = []
    for node in names:
        t = totals.get(node, {"in": 0.0, "out": 0.0, "n_in": 0, "n_out": 0})
        hover.append(f"{node}: {t['n_out']} edges out, sum {t['out']:.3f}; {t['n_in']} in, sum {t['in']:.3f}")
    # a large model (a real one has 300 nodes): only the nodes the drawn edges touch are named and drawn full size
    touched = {n for i in chosen for n in (Edge.parse(scores.edges[i]).sender, Edge.parse(scores.edges[i]).receiver)}
    large = len(names) > LABEL_EVERY_NODE
    on = [not large or n in touched or n in (EMBED, LOGITS) or n == selected for n in names]
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in names], y=[pos[n][1] for n in names], mode="markers+text", name="nodes",
        text=[n if shown else "" for n, shown in zip(names, on)], textposition="top center",
        textfont=dict(size=10 if large else 12), customdata=[NODE_PICK + n for n in names], hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>", showlegend=False,
        marker=dict(size=[18 if n == selected else 13 if shown else 6 for n, shown in zip(names, on)], symbol=[
            "square" if node_kind(n) == "mlp" else "diamond" if node_kind(n) in (EMBED, LOGITS) else "circle"
            for n in names], color=[NODE_COLORS[node_kind(n)] if shown else "#cccccc" for n, shown in zip(names, on)],
            line=dict(width=[3 if n == selected else 1 if shown else 0 for n, shown in zip(names, on)], color="#222"))))
    inputs_drawn = {Edge.parse(scores.edges[i]).input for i in chosen}
    for component in ("q", "k", "v", ""):  # legend: the inputs drawn (dash), then the signs (colour)
        if component in inputs_drawn:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=INPUT_LABEL[component],
                                     line=dict(color="#555", dash=INPUT_DASH[component], width=2)))
    for name, color in (("patching loses answer (score > 0)", POSITIVE_COLOR),
                        ("patching helps (score < 0)", NEGATIVE_COLOR)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color=color, width=4)))
    ticks = list(range(-1, graph.n_layers + 1))
    many = graph.n_layers > 12  # "layer 17" under each of 30 layers collides: numbers, and the axis named once
    labels = ["embed"] + [str(l) if many else f"layer {l}" for l in range(graph.n_layers)] + ["logits"]
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=labels, showgrid=False, zeroline=False,
                     range=[-1.5, graph.n_layers + 0.5], title_text="layer" if many else None)
    spread = (graph.n_heads - 1) / 2
    fig.update_yaxes(visible=False, range=[-spread - 0.8, spread + 0.9])
    shown = f"{len(chosen)} of {len(values)} edges with |score| ≥ {threshold:.3g}"
    if len(chosen) == max_edges and np.sum(np.abs(values) >= threshold) > max_edges:
        shown += f" (the {max_edges} largest drawn)"
    fig.update_layout(template=SCREEN, height=max(380, 140 + (55 if graph.n_heads > 6 else 70) * graph.n_heads),
                      title=f"circuit graph ({scores.method}, {scores.metric}): {shown}")
    _legend_on_top(fig)
    caption = ("score: the fraction of the clean-corrupted gap lost when the edge alone is patched (its first-order "
               "estimate for EAP / EAP-IG; ACDC: the distance increase when tested). Width ∝ |score|; dash: the "
               "receiver's input. Click a node or an edge's midpoint to see its patching effect.")
    return FigureBundle(f"circuit-graph-{scores.method}", fig, tuple(rows),
                        _prov(scores, report, "circuit_graph", threshold=float(threshold), n_drawn=len(chosen)),
                        caption, paper_size=(720, 480))


def picked_items(points: Iterable[dict]) -> list[str]:
    """The nodes ("node:L1H2") and edges ("edge:L0H1->L1H2.k") a selection on the graph names, in order."""
    out: list[str] = []
    for point in points or ():
        data = point.get("customdata") if isinstance(point, dict) else None
        if isinstance(data, (list, tuple)):
            data = data[0] if data else None
        if isinstance(data, str) and data.startswith((NODE_PICK, EDGE_PICK)) and data not in out:
            out.append(data)
    return out


def edge_list(report_or_scores: Any) -> list[dict]:
    """Every scored edge, the largest |score| first: edge, sender, receiver, input, score (and kept, discovered)."""
    scores, report = _scores_of(report_or_scores)
    values = np.asarray(scores.scores, dtype=np.float64)
    discovered = set(() if report is None else report.discovered)
    kept = None if scores.kept is None else np.asarray(scores.kept, dtype=bool)
    out = []
    for i in np.argsort(-np.abs(values), kind="stable"):
        edge = Edge.parse(scores.edges[i])
        row = {"edge": scores.edges[i], "sender": edge.sender, "receiver": edge.receiver, "input": edge.input,
               "score": float(values[i])}
        if kept is not None:
            row["kept"] = bool(kept[i])
        if report is not None:
            row["discovered"] = scores.edges[i] in discovered
        out.append(row)
    return out


def edge_list_json(report_or_scores: Any) -> str:
    """The JSON export of an edge run: method, metric, the runs' values, the discovered set and every edge."""
    scores, report = _scores_of(report_or_scores)
    record = {"method": scores.method, "metric": scores.metric, "clean_value": scores.clean_value,
              "corrupted_value": scores.corrupted_value, "threshold": scores.threshold, "graph": scores.graph,
              "discovered": [] if report is None else list(report.discovered),
              "heads": [] if report is None else [f"L{l}H{h}" for l, h in report.heads],
              "edges": edge_list(report_or_scores),
              "provenance": _prov(scores, report, "edge_list")}
    return json.dumps(record, indent=2, default=json_default)


def faithfulness_figure(report_or_curve: Any) -> FigureBundle:
    """Faithfulness of the top-k edges against the fraction of the graph's edges kept (log x), CPR and CMD."""
    curve = getattr(report_or_curve, "curve", report_or_curve)
    if curve is None or not hasattr(curve, "faithfulness"):
        raise HeadLabError("this edge run has no faithfulness curve; run it with the curve on.")
    x, f = list(curve.fractions), list(curve.faithfulness)
    signed = list(getattr(curve, "faithfulness_signed", ()) or ())
    fig = go.Figure(go.Scatter(x=x, y=f, mode="lines+markers", name="top by |score| (CMD)",
                               customdata=list(curve.n_edges_kept), marker=dict(color=CANDIDATE_COLOR, size=8),
                               line=dict(color=CANDIDATE_COLOR),
                               hovertemplate="%{customdata} edges (%{x:.3g}): faithfulness %{y:.3f}<extra></extra>"))
    if signed:
        fig.add_trace(go.Scatter(x=x, y=signed, mode="lines+markers", name="top by signed score (CPR)",
                                 customdata=list(curve.n_edges_kept), marker=dict(color=CONTROL_COLOR, size=7),
                                 line=dict(color=CONTROL_COLOR, dash="dash"),
                                 hovertemplate="%{customdata} edges (%{x:.3g}): faithfulness %{y:.3f}<extra></extra>"))
    for level, label in ((1.0, "full model"), (0.0, "every edge patched")):
        fig.add_hline(y=level, line_color="#999", line_width=1, line_dash="dot", annotation_text=label)
    fig.update_xaxes(title_text="fraction of edges kept", type="log")
    fig.update_yaxes(title_text="faithfulness (full model 1, empty 0)")
    fig.update_layout(template=SCREEN, height=380,
                      title=f"faithfulness ({curve.method}, {curve.metric}): CPR {curve.cpr:.3f} (↑), "
                            f"CMD {curve.cmd:.3f} (↓)")
    rows = tuple({"fraction": float(a), "n_edges": int(k), "faithfulness": float(v),
                  "faithfulness_signed": float(w) if signed else None}
                 for a, k, v, w in zip(curve.fractions, curve.n_edges_kept, curve.faithfulness, signed or curve.faithfulness))
    caption = (f"faithfulness of the circuit of the top-k edges, the other edges patched [MIB]; as MIB's evaluation "
               f"code: CPR = area under the curve of the top edges by signed score, CMD = area of |1 - f| for the top "
               f"edges by |score|, over the linear fraction axis; {curve.n_edges} edges in all.")
    return FigureBundle(f"faithfulness-{curve.method or 'edges'}", fig, rows,
                        provenance(figure="faithfulness_curve", curve=curve.provenance), caption)


def edge_controls_strip(report_or_controls: Any) -> FigureBundle:
    """The discovered edge set's faithfulness against matched-random edge sets (same count per stratum)."""
    controls = getattr(report_or_controls, "controls", report_or_controls)
    if controls is None or not hasattr(controls, "control_faithfulness"):
        raise HeadLabError("this edge run has no matched-random controls; run it with at least one control.")
    values = np.asarray(controls.control_faithfulness, dtype=np.float64)
    jitter = np.random.RandomState(0).uniform(-0.18, 0.18, size=values.size)  # fixed: the same picture every time
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=jitter.tolist(), y=values.tolist(), mode="markers", name="matched-random edge sets",
                             marker=dict(color=CONTROL_COLOR, size=7, opacity=0.8),
                             hovertemplate="random set: %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[1.0], y=[controls.faithfulness], mode="markers", name="discovered set",
                             marker=dict(color=CANDIDATE_COLOR, size=14, symbol="diamond"),
                             hovertemplate="discovered set: %{y:.3f}<extra></extra>"))
    for level, label in ((0.0, "every edge patched"), (1.0, "full model")):
        fig.add_hline(y=level, line_color="#999", line_width=1, line_dash="dot", annotation_text=label)
    fig.update_xaxes(tickmode="array", tickvals=[0.0, 1.0], ticktext=["random sets", "discovered"], range=[-0.5, 1.5],
                     showgrid=False)
    fig.update_yaxes(title_text="faithfulness (full model 1, empty 0)")
    s = controls.stats
    fig.update_layout(template=SCREEN, height=420,
                      title=f"{len(controls.edges)} edges vs {values.size} random sets: {controls.verdict.label}"
                            + f"<br><sup>{rank_z_title(s['rank'], s['p'], values.size, s['z'])}</sup>")
    _legend_on_top(fig)
    fig.update_layout(margin=dict(t=125), title=dict(y=0.96))  # room for the title's second line
    rows = [{"condition": f"random set {i}", "faithfulness": float(v)} for i, v in enumerate(values)]
    rows.append({"condition": "discovered set", "faithfulness": float(controls.faithfulness), **s,
                 "verdict": controls.verdict.label})
    caption = ("random edge sets with the same number of edges per (sender layer, receiver layer, input), run the "
               "same way; rank 1 = the most faithful; p = rank / (sets + 1); " + controls.verdict.rule)
    return FigureBundle("edge-controls", fig, tuple(rows),
                        provenance(figure="edge_controls", controls=controls.provenance), caption)
