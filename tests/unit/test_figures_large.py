"""Figures at a real model's size (SmolLM2: 30 layers x 9 heads; Gemma-3: 18 x 4) and at a small one, on
hand-made inputs: labels stay readable (ticks that fit, names only where they do not collide)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from core.ablation.edges import EdgeGraph, EdgeScores
from core.figures.ablation import head_grid
from core.figures.coactivation import MAX_NAMED_HEADS, coupling_heatmap
from core.figures.graph import circuit_graph_figure, drawn_edges
from core.figures.inspector import head_scores


@pytest.mark.parametrize("shape,below", [((30, 9), False), ((18, 4), False), ((3, 12), True), ((2, 4), True)])
def test_the_lab_grid_keeps_a_readable_colour_bar_and_marks_picks_without_an_x(shape, below):
    values = np.exp(np.random.default_rng(0).normal(0, 2, shape))
    fig = head_grid(values, [(0, 1)], "m", "main", "pick").figure
    bar = fig.data[0].marker.colorbar
    assert (bar.orientation == "h") is below  # a grid of a few layers lays its bar below it, at full length
    if below:
        assert bar.lenmode == "pixels" and bar.len >= 300
    assert list(fig.layout.yaxis.tickvals) == list(range(shape[0]))  # every layer labelled
    picked = fig.data[1]
    assert "x" not in picked.marker.symbol  # an x means "at or below the null floor" on the Pattern screen


def test_the_coupling_heatmap_of_270_heads_names_communities_not_heads():
    def report(n_layers: int, n_heads: int, k: int) -> SimpleNamespace:
        n = n_layers * n_heads
        labels = np.arange(n) % k
        return SimpleNamespace(J=np.random.default_rng(1).normal(size=(n, n)), shape=(n_layers, n_heads),
                               cluster_labels=labels, route=None, model="m", revision="main", probe_spec={},
                               settings={}, proposal=SimpleNamespace(
                                   k=k, k_rule="fixed", n_examples=n, selection=SimpleNamespace(
                                       candidate=SimpleNamespace(cluster=0), n_init=1)))

    big = coupling_heatmap(report(30, 9, 4)).figure
    assert list(big.layout.xaxis.ticktext) == [f"community {c} ({n})" for c, n in zip(range(4), (68, 68, 67, 67))]
    assert big.data[0].customdata[0][0] == "L0H0 – L0H0"  # the hover still names both heads
    small = coupling_heatmap(report(3, 4, 3)).figure
    assert len(small.layout.xaxis.ticktext) == 12 <= MAX_NAMED_HEADS


def test_the_circuit_graph_of_a_real_model_names_only_the_nodes_its_edges_touch():
    graph = EdgeGraph(30, 9, parallel_attn_mlp=False)
    values = np.zeros(graph.n_edges)
    for text, value in {"L0H1->L1H2.k": 0.9, "L1H2->logits": 0.5, "embed->L0H1.q": -0.3}.items():
        values[graph.index(text)] = value
    scores = EdgeScores("eap", "logit_diff", 2.0, -2.0, tuple(str(e) for e in graph.edges), values, graph.summary(),
                        {}, {}, {"model": "hand-made"})
    assert len(drawn_edges(scores, 0.3)) == 3
    fig = circuit_graph_figure(scores, threshold=0.3).figure
    nodes = next(t for t in fig.data if t.name == "nodes")
    assert {t for t in nodes.text if t} == {"L0H1", "L1H2", "embed", "logits"}
    assert fig.layout.xaxis.ticktext[1:4] == ("0", "1", "2") and fig.layout.xaxis.title.text == "layer"


def test_the_head_inspector_bars_fit_under_the_top_of_the_axis():
    fig = head_scores([850.0, 2.0, 0.5, 1e-5], ["induction", "duplicate-token", "previous-token", "self"], (17, 3),
                      "m", "main", 30.0, 6.19).figure
    low, high = fig.layout.yaxis.range
    assert low <= math.log10(1e-3) and high > math.log10(850.0)
