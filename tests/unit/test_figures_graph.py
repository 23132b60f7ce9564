"""The circuit-graph figures on hand-made edge scores (no model): the threshold filter, widths by |score|,
node positions by layer, picks read back, and the JSON edge list."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.ablation.edges import EdgeGraph, EdgeScores
from core.errors import HeadLabError
from core.figures.graph import (EDGE_PICK, MAX_WIDTH, MIN_WIDTH, NEGATIVE_COLOR, NODE_PICK, POSITIVE_COLOR,
                                circuit_graph_figure, drawn_edges, edge_list_json, edge_widths, graph_of,
                                node_positions, picked_items)

GRAPH = EdgeGraph(2, 3, parallel_attn_mlp=False)  # 2 layers x 3 heads, sequential blocks, MLPs
STRONG = {"L0H1->L1H2.k": 0.9, "embed->L0H1.v": 0.5, "L1H2->logits": -0.3, "MLP0->L1H0.q": 0.05}


def scores(values: dict[str, float] = STRONG, kept: np.ndarray | None = None) -> EdgeScores:
    out = np.zeros(GRAPH.n_edges)
    for text, value in values.items():
        out[GRAPH.index(text)] = value
    return EdgeScores("eap", "logit_diff", 2.0, -2.0, tuple(str(e) for e in GRAPH.edges), out, GRAPH.summary(),
                      {"forward": 4, "backward": 1}, {}, {"model": "hand-made"}, kept=kept)


def lines(bundle) -> list:
    """The edge traces: two-point lines (the legend's traces have no points)."""
    return [t for t in bundle.figure.data if t.mode == "lines" and t.x[0] is not None]


def test_only_edges_at_or_above_the_threshold_are_drawn_largest_first():
    s = scores()
    assert [s.edges[i] for i in drawn_edges(s, 0.3)] == ["L0H1->L1H2.k", "embed->L0H1.v", "L1H2->logits"]
    for threshold, expected in ((0.0, GRAPH.n_edges), (0.05, 4), (0.3, 3), (0.31, 2), (0.95, 0)):
        bundle = circuit_graph_figure(s, threshold=threshold)
        assert len(lines(bundle)) == expected == len(bundle.rows)
        assert f"{expected} of {GRAPH.n_edges} edges" in bundle.figure.layout.title.text
    capped = circuit_graph_figure(s, threshold=0.0, max_edges=2)
    assert [r["edge"] for r in capped.rows] == ["L0H1->L1H2.k", "embed->L0H1.v"]
    assert "the 2 largest drawn" in capped.figure.layout.title.text


def test_widths_follow_the_absolute_score_and_colour_its_sign():
    np.testing.assert_allclose(edge_widths(np.array([0.9, -0.45, 0.0])), [MAX_WIDTH, MAX_WIDTH / 2, MIN_WIDTH])
    assert edge_widths(np.zeros(2)).tolist() == [MIN_WIDTH, MIN_WIDTH]
    bundle = circuit_graph_figure(scores(), threshold=0.05)
    widths = [r["width"] for r in bundle.rows]
    assert widths == sorted(widths, reverse=True) and widths[0] == MAX_WIDTH
    assert widths[1] == pytest.approx(MAX_WIDTH * 0.5 / 0.9) and widths[2] == pytest.approx(MAX_WIDTH * 0.3 / 0.9)
    by_width = {round(t.line.width, 6): t for t in lines(bundle)}
    assert by_width[round(MAX_WIDTH, 6)].line.color == POSITIVE_COLOR
    negative = by_width[round(MAX_WIDTH * 0.3 / 0.9, 6)]
    assert negative.line.color == NEGATIVE_COLOR and negative.line.dash == "solid"  # into the logits
    assert by_width[round(MAX_WIDTH, 6)].line.dash == "dash"  # into a key
    assert by_width[round(MAX_WIDTH * 0.5 / 0.9, 6)].line.dash == "dashdot"  # into a value


def test_nodes_sit_by_layer_heads_spread_mlps_at_the_layers_end():
    pos = node_positions(GRAPH)
    assert pos["embed"] == (-1.0, 0.0) and pos["logits"] == (2.0, 0.0)
    assert [pos[f"L1H{h}"] for h in range(3)] == [(1.0, 1.0), (1.0, 0.0), (1.0, -1.0)]
    assert pos["L0H2"][0] == 0.0 and 0.0 < pos["MLP0"][0] < 1.0 and pos["MLP0"][1] == 0.0
    g = graph_of(scores())
    assert g.number_of_nodes() == len(GRAPH.senders) + 1
    assert g.nodes["L1H2"]["layer"] == 1 and g.nodes["MLP1"]["kind"] == "mlp"
    assert g.edges["L0H1", "L1H2"]["scores"]["k"] == 0.9 and g.edges["L0H1", "L1H2"]["scores"]["q"] == 0.0
    assert not g.has_edge("L1H0", "L0H1")  # a later layer never feeds an earlier one
    # the drawn edge into L1H2's key ends at the head; into its value, below it
    bundle = circuit_graph_figure(scores({"L0H1->L1H2.k": 1.0, "L0H1->L1H2.v": 0.5}), threshold=0.1)
    ends = sorted((t.x[1], t.y[1]) for t in lines(bundle))
    assert ends == [(1.0, pos["L1H2"][1] - 0.22), (1.0, pos["L1H2"][1])]


def test_clicks_name_nodes_and_edges_and_the_json_lists_every_edge():
    bundle = circuit_graph_figure(scores(), threshold=0.3, true_edges=["L0H1->L1H2.k"])
    pickable = {d for t in bundle.figure.data if t.customdata is not None for d in t.customdata}
    assert EDGE_PICK + "L0H1->L1H2.k" in pickable and NODE_PICK + "MLP1" in pickable
    assert EDGE_PICK + "MLP0->L1H0.q" not in pickable  # below the threshold: not drawn, not clickable
    assert [r["known"] for r in bundle.rows] == [True, False, False]
    points = [{"customdata": "edge:L0H1->L1H2.k"}, {"customdata": ["node:L1H2"]}, {"x": 1}, {"customdata": "L1H2"}]
    assert picked_items(points) == ["edge:L0H1->L1H2.k", "node:L1H2"]
    kept = np.zeros(GRAPH.n_edges, dtype=bool)
    kept[GRAPH.index("L0H1->L1H2.k")] = True
    record = json.loads(edge_list_json(scores(kept=kept)))
    assert len(record["edges"]) == GRAPH.n_edges and record["method"] == "eap"
    first = record["edges"][0]
    assert first == {"edge": "L0H1->L1H2.k", "sender": "L0H1", "receiver": "L1H2", "input": "k", "score": 0.9,
                     "kept": True}
    assert record["edges"][2]["input"] == "" and record["edges"][2]["score"] == -0.3
    assert sum(e["kept"] for e in record["edges"]) == 1
    with pytest.raises(HeadLabError, match="edge report"):
        circuit_graph_figure(object())


def test_the_faithfulness_curve_shows_its_areas_and_the_controls_their_rank():
    from core.ablation.edges.faithfulness import EdgeControls, FaithfulnessCurve, curve_areas
    from core.figures.graph import edge_controls_strip, faithfulness_figure
    from core.stats.inference import Verdict

    fractions, f = (0.01, 0.1, 1.0), (0.2, 0.9, 1.0)
    cpr, cmd = curve_areas(fractions, f)
    curve = FaithfulnessCurve("eap", "logit_diff", fractions, (1, 4, 39), f, cpr, cmd, 2.0, -2.0, 39, {})
    bundle = faithfulness_figure(curve)
    assert f"CPR {cpr:.3f}" in bundle.figure.layout.title.text and f"CMD {cmd:.3f}" in bundle.figure.layout.title.text
    assert [r["n_edges"] for r in bundle.rows] == [1, 4, 39] and bundle.figure.layout.xaxis.type == "log"
    stats = {"rank": 1, "p": 0.05, "z": 3.0, "n_controls": 19, "control_mean": 0.1, "control_std": 0.1}
    controls = EdgeControls("logit_diff", ("L0H1->L1H2.k",), 0.95, tuple([0.1] * 19), stats, ((0, 1), (1, 2)), True,
                            123, Verdict("beyond its controls", "rank 1 and p <= 0.05"), {})
    strip = edge_controls_strip(controls)
    assert "rank 1/20" in strip.figure.layout.title.text and "beyond its controls" in strip.figure.layout.title.text
    assert strip.rows[-1]["faithfulness"] == 0.95 and len(strip.rows) == 20
    with pytest.raises(HeadLabError, match="no faithfulness curve"):
        faithfulness_figure(None)
