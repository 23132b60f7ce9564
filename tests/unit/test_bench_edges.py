"""The agreement statistics of `bench edges` (core/bench/edges.py) on hand-made scores with known answers."""

import numpy as np
import pytest

from core.bench.edges import agreement, check_sample, top_k_overlap
from core.errors import HeadLabError


def test_top_k_overlap_counts_shared_edges_by_absolute_score():
    exact = np.array([0.9, -0.8, 0.1, 0.0, 0.05])
    estimate = np.array([0.2, 0.0, -0.7, 0.01, 0.3])  # |.| top 2: edges 2, 4; exact's: 0, 1
    assert top_k_overlap(estimate, exact, 2) == 0.0
    assert top_k_overlap(estimate, exact, 3) == pytest.approx(2 / 3)  # {2, 4, 0} & {0, 1, 2} = {0, 2}
    assert top_k_overlap(exact, exact, 4) == 1.0
    assert top_k_overlap(-exact, exact, 2) == 1.0  # the sign does not choose a circuit's edges
    assert top_k_overlap(estimate, exact, 99) == 1.0  # k beyond the edges: every edge in both sets


def test_agreement_above_the_floor_ignores_the_tail_that_dominates_spearman():
    """Three large edges ranked right and 97 near-zero edges ranked backwards: Spearman over every edge is
    negative, above the floor it is 1, and the top 3 match."""
    tail = np.linspace(1e-4, 1e-3, 97)
    exact = np.concatenate([[0.9, 0.5, 0.2], tail])
    estimate = np.concatenate([[0.3, 0.2, 0.1], tail[::-1] / 10])
    a = agreement(estimate, exact, floor=0.01, top_k=(3, 10, 100))
    assert a["n_edges"] == 100 and a["n_above_floor"] == 3
    assert a["spearman"] < 0 and a["spearman_above_floor"] == pytest.approx(1.0)
    assert a["sign_agreement_above_floor"] == 1.0
    assert a["top_k"] == {"3": 1.0, "10": pytest.approx(0.3)}  # k = 100 is every edge: left out
    assert a["pearson"] == pytest.approx(np.corrcoef(estimate, exact)[0, 1])


def test_agreement_is_undefined_where_it_cannot_be_measured():
    exact = np.array([0.5, 0.001, 0.002, 0.0])
    a = agreement(np.array([-0.4, 0.0, 0.0, 0.0]), exact, floor=0.01, top_k=(1,))
    assert a["spearman_above_floor"] is None and a["n_above_floor"] == 1  # fewer than 3 edges above it
    assert a["sign_agreement_above_floor"] == 0.0 and a["top_k"] == {"1": 1.0}
    assert agreement(np.zeros(4), exact, top_k=())["spearman"] is None  # a constant estimate has no ranks
    with pytest.raises(HeadLabError, match="same edges"):
        agreement(np.zeros(3), exact)


def test_the_sample_is_checked_before_any_work():
    check_sample(None, 0)
    check_sample(200, 20, 123211)
    for bad, says in (((2, 20), "--sample-edges is 2"), ((10, 20, 5), "from 3 to the model's 5"),
                      ((10, -1), "--sample-top is -1")):
        with pytest.raises(HeadLabError, match=says):
            check_sample(*bad)
