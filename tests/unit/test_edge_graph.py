"""The edge graph, edge sets, the discovered set and curve arithmetic on hand-counted cases (no model)."""

import numpy as np
import pytest

from core.ablation.edges import Edge, EdgeGraph, EdgeScores, matched_random_edge_sets, top_edges
from core.ablation.edges.acdc import check_threshold
from core.ablation.edges.faithfulness import curve_areas, edge_set_verdict, edges_for_fraction
from core.errors import HeadLabError
from core.pipelines.edges import EdgePlan, discovered_edges


def hand_count(n_layers: int, n_heads: int, parallel: bool) -> int:
    """Edges counted by hand: senders before each input; a sequential block's heads also feed its MLP."""
    before = [1 + layer * (n_heads + 1) for layer in range(n_layers)]  # embed + every earlier head and MLP
    into_heads = sum(3 * n_heads * b for b in before)
    into_mlps = sum(b + (0 if parallel else n_heads) for b in before)
    return into_heads + into_mlps + 1 + n_layers * (n_heads + 1)


@pytest.mark.parametrize("shape", [(1, 1, True), (2, 4, True), (2, 4, False), (3, 8, True), (12, 12, True)])
def test_edge_count_matches_the_hand_count(shape):
    graph = EdgeGraph(*shape)
    assert graph.n_edges == hand_count(*shape) == len(graph.edges)
    assert graph.summary()["edges"] == graph.n_edges
    assert sum(graph.summary()["edges_into"].values()) == graph.n_edges


def test_pythia_160m_shape_has_32347_edges():
    # 12 x 12 heads, parallel residual: 36 * 870 into q/k/v, 870 into MLPs, 157 into the logits
    assert EdgeGraph(12, 12, True).n_edges == 36 * 870 + 870 + 157 == 32347


def test_grouped_query_attention_changes_no_edge_and_the_real_models_counts_are_the_hand_counts():
    """Each query head keeps its own q, k and v inputs under GQA; SmolLM2-135M (30 x 9 heads, 3 key/value heads) and
    Gemma-3-270M (18 x 4 heads, 1 key/value head), both sequential, have the hand-counted edges."""
    smollm2, gemma3 = EdgeGraph(30, 9, False, n_key_value_heads=3), EdgeGraph(18, 4, False, n_key_value_heads=1)
    assert smollm2.n_edges == hand_count(30, 9, False) == 123211
    assert gemma3.n_edges == hand_count(18, 4, False) == 10342
    assert gemma3.edges == EdgeGraph(18, 4, False).edges
    assert smollm2.summary()["n_key_value_heads"] == 3 and EdgeGraph(2, 4, True).summary()["n_key_value_heads"] == 4
    assert EdgeGraph.from_summary(gemma3.summary()) == gemma3
    gemma3.index("L0H1->L5H2.k")  # a grouped head's own key input is an edge


def test_which_senders_reach_which_inputs():
    parallel, sequential = EdgeGraph(2, 2, True), EdgeGraph(2, 2, False)
    for graph in (parallel, sequential):
        graph.index("embed->L0H0.q")
        graph.index("L0H1->L1H0.k")
        graph.index("MLP0->L1H1.v")
        graph.index("MLP1->logits")
        with pytest.raises(HeadLabError, match="not an edge"):
            graph.index("L1H0->L0H1.k")  # later into earlier
        with pytest.raises(HeadLabError, match="not an edge"):
            graph.index("L0H0->L0H1.q")  # same layer's heads
    sequential.index("L1H0->MLP1")
    with pytest.raises(HeadLabError, match="not an edge"):
        parallel.index("L1H0->MLP1")  # a parallel block's heads and MLP read the same residual


def test_edge_text_round_trips_and_bad_edges_say_what_to_write():
    graph = EdgeGraph(2, 4, True)
    for edge in graph.edges:
        assert Edge.parse(str(edge)) == edge
        assert graph.index(str(edge)) == graph.edges.index(edge)
    with pytest.raises(HeadLabError, match="which input"):
        Edge.parse("L0H1->L1H0")
    with pytest.raises(HeadLabError, match="one input"):
        Edge.parse("L0H1->MLP1.k")
    with pytest.raises(HeadLabError, match="L0H1->L1H0.k"):
        Edge.parse("L0H1 L1H0")
    with pytest.raises(HeadLabError, match="does not have"):
        graph.index("L0H9->L1H0.k")
    with pytest.raises(HeadLabError, match="does not have"):
        graph.index("L5H0->logits")
    with pytest.raises(HeadLabError, match="only receive"):
        graph.index("logits->L1H0.q")


def test_matrix_layout_and_heads_of_an_edge_set():
    graph = EdgeGraph(2, 2, True)
    values = np.arange(graph.n_edges, dtype=float) + 1
    matrix = graph.to_matrix(values)
    assert matrix.sum() == values.sum()
    assert not matrix[~graph.mask].any()
    keep = graph.edge_mask(["L0H1->L1H0.k", "L1H0->logits"])
    assert graph.heads_of(keep) == [(0, 1), (1, 0)]


def test_matched_random_edge_sets_keep_every_stratum_count():
    graph = EdgeGraph(3, 4, True)
    keep = graph.edge_mask(["L0H1->L1H0.k", "L0H2->L1H3.k", "embed->L2H0.q", "L2H1->logits", "MLP0->MLP2"])
    draws = matched_random_edge_sets(graph, keep, 50, seed=7)
    strata = graph.strata
    want = np.bincount(strata[keep], minlength=strata.max() + 1)
    for draw in draws:
        assert np.array_equal(np.bincount(strata[draw], minlength=strata.max() + 1), want)
    assert any((d != keep).any() for d in draws)
    again = matched_random_edge_sets(graph, keep, 50, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(draws, again))
    # the two L0 -> L1 key edges share one stratum (sender layer 0, receiver layer 1, input k)
    assert strata[graph.index("L0H1->L1H0.k")] == strata[graph.index("L0H2->L1H3.k")]
    assert strata[graph.index("L0H1->L1H0.k")] != strata[graph.index("L0H1->L1H0.q")]


def test_top_edges_by_magnitude_ties_in_edge_order():
    scores = np.array([0.1, -0.5, 0.5, 0.0, 0.2])
    assert top_edges(scores, 2).tolist() == [False, True, True, False, False]
    assert top_edges(scores, 3).tolist() == [False, True, True, False, True]
    assert top_edges(scores, 2, signed=True).tolist() == [False, False, True, False, True]  # CPR's ranking (MIB)


def test_curve_areas_by_hand():
    # f = 0, 0.5, 1 at x = 0, 0.5, 1: area 0.5; |1 - f| = 1, 0.5, 0: area 0.5
    assert curve_areas([0, 0.5, 1], [0, 0.5, 1]) == pytest.approx((0.5, 0.5))
    # a perfect circuit from the start: f = 1 everywhere on [0.1, 1]
    assert curve_areas([0.1, 1.0], [1.0, 1.0]) == pytest.approx((0.9, 0.0))
    with pytest.raises(HeadLabError):
        curve_areas([0.5, 0.1], [1, 1])
    assert edges_for_fraction(1594, 0.001) == 2 and edges_for_fraction(10, 0.001) == 1


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "x"])
def test_threshold_outside_its_range_is_refused(bad):
    with pytest.raises(HeadLabError, match="threshold"):
        check_threshold(bad)
    assert check_threshold(0) == 0.0


def test_edge_set_verdict_needs_19_distinct_controls_and_10_pairs():
    first = {"rank": 1, "p": 1 / 21, "n_controls": 20}
    assert edge_set_verdict(first, True, 32).label == "beyond its controls"
    assert edge_set_verdict({**first, "rank": 2, "p": 2 / 21}, True, 32).label == "not beyond its controls"
    assert edge_set_verdict({"rank": 1, "p": 1 / 6, "n_controls": 5}, True, 32).label == "inconclusive"
    assert edge_set_verdict(first, False, 32).label == "inconclusive"
    assert edge_set_verdict(first, True, 5).label == "inconclusive"


def test_discovered_set_is_the_top_edges_above_rounding():
    def scores(values, kept=None):
        return EdgeScores("eap", "logit_diff", 1.0, 0.0, tuple(f"e{i}" for i in range(len(values))),
                          np.asarray(values, dtype=np.float64), {}, {}, {}, {}, kept=kept)

    values = [1e-17, -0.5, 1.0, 2e-10, 1e-3, 0.0]
    assert discovered_edges(scores(values), EdgePlan(top=4)).tolist() == [False, True, True, False, True, False]
    assert discovered_edges(scores(values), EdgePlan(top=2)).tolist() == [False, True, True, False, False, False]
    assert not discovered_edges(scores([0.0, 0.0]), EdgePlan(top=2)).any()  # nothing scores: nothing discovered
    kept = np.array([True, False, False, False, False, True])  # ACDC's kept edges stand as they are
    assert discovered_edges(scores(values, kept), EdgePlan(method="acdc")).tolist() == kept.tolist()
