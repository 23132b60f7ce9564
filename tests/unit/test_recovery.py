"""Recovery measures on hand-made scores: known answers, ties, the permutation baseline, the seed interval."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from core.errors import HeadLabError
from core.stats.recovery import (MEASURES, _average_precision_many, _precision_at_k_many, _roc_auc_many,
                                 average_precision, precision_at_k, recovery, recovery_all, roc_auc, seed_interval)

TRUTH = np.array([[1, 0, 0], [0, 1, 0]], dtype=bool)  # [layer, head]: two true heads of six


def test_perfect_and_reversed_rankings():
    perfect = np.array([[0.9, 0.1, 0.2], [0.3, 0.8, 0.0]])
    assert roc_auc(perfect, TRUTH) == 1.0
    assert average_precision(perfect, TRUTH) == 1.0
    assert precision_at_k(perfect, TRUTH) == 1.0
    assert roc_auc(-perfect, TRUTH) == 0.0
    assert precision_at_k(-perfect, TRUTH) == 0.0
    # reversed: the two true heads are last of six, found at places 5 and 6 -> (1/5 + 2/6) / 2
    assert average_precision(-perfect, TRUTH) == pytest.approx((1 / 5 + 2 / 6) / 2)


def test_hand_computed_answers_with_ties():
    scores = np.array([0.9, 0.5, 0.5, 0.1])
    truth = np.array([True, True, False, False])
    # pairs (true, false): 0.9>0.5, 0.9>0.1, 0.5=0.5 (one half), 0.5>0.1 -> 3.5 of 4
    assert roc_auc(scores, truth) == pytest.approx(0.875)
    # thresholds 0.9 (1 of 1 true, recall 1/2) and 0.5 (2 of 3, recall 1): 1/2 * 1 + 1/2 * 2/3
    assert average_precision(scores, truth) == pytest.approx(0.5 + 1 / 3)
    # k = 2: 0.9 is true; place 2 falls in the tie {true, false}: expected 1/2 -> (1 + 0.5) / 2
    assert precision_at_k(scores, truth) == pytest.approx(0.75)
    assert precision_at_k(scores, truth, k=3) == pytest.approx(2 / 3)
    assert precision_at_k(scores, truth, k=1) == 1.0


def test_constant_score_is_chance():
    truth = np.array([1, 0, 0, 1, 0], dtype=bool)
    flat = np.full(5, 3.0)
    assert roc_auc(flat, truth) == 0.5
    assert average_precision(flat, truth) == pytest.approx(0.4)  # the share of true components
    assert precision_at_k(flat, truth) == pytest.approx(0.4)
    result = recovery(flat, truth, "roc_auc", n_draws=200)
    assert result.baseline_mean == 0.5 and result.p == 1.0  # every draw ties the observed value


def test_vectorised_measures_match_scikit_learn_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n = int(rng.integers(4, 40))
        scores = rng.integers(0, 5, size=n).astype(float)  # many ties
        truths = rng.random((6, n)) < 0.3
        truths[:, 0], truths[:, 1] = True, False
        np.testing.assert_allclose(_roc_auc_many(scores, truths), [roc_auc_score(t, scores) for t in truths])
        np.testing.assert_allclose(_average_precision_many(scores, truths),
                                   [average_precision_score(t, scores) for t in truths])
        # precision@k by brute force: the mean over every tie-breaking order is the expected value
        k = int(truths[0].sum())
        orders = [np.lexsort((rng.random(n), -scores)) for _ in range(3000)]
        brute = np.mean([truths[0][o[:k]].mean() for o in orders])
        assert _precision_at_k_many(scores, truths[:1], k)[0] == pytest.approx(brute, abs=0.03)


def test_permutation_baseline_and_p():
    rng = np.random.default_rng(0)
    truth = np.zeros(40, dtype=bool)
    truth[:6] = True
    scores = rng.normal(size=40) + 3.0 * truth  # a good method
    results = recovery_all(scores, truth, n_draws=1000, seed=7)
    assert set(results) == set(MEASURES)
    auc = results["roc_auc"]
    assert auc.value > 0.9 and abs(auc.baseline_mean - 0.5) < 0.02
    assert auc.p < 0.01 and auc.n_draws == 1000 and auc.n_true == 6 and auc.n_components == 40
    assert abs(results["precision_at_k"].baseline_mean - 6 / 40) < 0.02  # expected precision of a random pick
    assert results["precision_at_k"].k == 6
    assert results["average_precision"].baseline_mean < results["average_precision"].value
    # seeded: the same seed gives the same baseline, another seed another one
    assert recovery(scores, truth, "roc_auc", 1000, seed=7) == auc
    assert recovery(scores, truth, "roc_auc", 1000, seed=8).baseline_mean != auc.baseline_mean
    noise = recovery(rng.normal(size=40), truth, "roc_auc", 1000, seed=7)
    assert noise.p > 0.01  # pure noise is rarely extreme against its own permutations


def test_bad_truths_and_scores_refused():
    with pytest.raises(HeadLabError, match="no true"):
        roc_auc([0.1, 0.2], [False, False])
    with pytest.raises(HeadLabError, match="only true"):
        average_precision([0.1, 0.2], [True, True])
    with pytest.raises(HeadLabError, match="NaN"):
        roc_auc([0.1, np.nan], [True, False])
    with pytest.raises(HeadLabError, match="3 scores for 2"):
        roc_auc([0.1, 0.2, 0.3], [True, False])
    with pytest.raises(HeadLabError, match="True/False"):
        roc_auc([0.1, 0.2], [2, 0])
    with pytest.raises(HeadLabError, match="1 <= k"):
        precision_at_k([0.1, 0.2], [True, False], k=3)
    with pytest.raises(HeadLabError, match="unknown"):
        recovery([0.1, 0.2], [True, False], "f1")
    with pytest.raises(HeadLabError, match="at least one draw"):
        recovery([0.1, 0.2], [True, False], n_draws=0)


def test_seed_interval():
    one = seed_interval([0.8])
    assert one.mean == 0.8 and one.low is None and one.high is None and one.n_seeds == 1
    values = [0.7, 0.8, 0.9]
    pooled = seed_interval(values, n_boot=2000, seed=3)
    assert pooled.mean == pytest.approx(0.8)
    assert 0.7 - 1e-12 <= pooled.low < pooled.mean < pooled.high <= 0.9 + 1e-12  # a percentile interval of seed means
    assert seed_interval(values, n_boot=2000, seed=3) == pooled
    same = seed_interval([0.5, 0.5, 0.5])
    assert same.low == same.high == 0.5
    with pytest.raises(HeadLabError, match="at least one model"):
        seed_interval([])
