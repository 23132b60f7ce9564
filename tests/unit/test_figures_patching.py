"""The patching figures' arithmetic on hand-made scores: effects, ranks and the top heads, per direction."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from core.figures.patching import effect, effect_ranks, top_heads
from core.stats.inference import spearman

SCORES = np.array([[0.1, 0.9], [0.5, -0.2]])  # [layer, head], clean 1, corrupted 0


def test_denoising_ranks_the_highest_score_first_and_noising_the_lowest():
    np.testing.assert_allclose(effect(SCORES, "noise"), 1.0 - SCORES)
    assert effect_ranks(SCORES, "denoise").tolist() == [[3, 1], [2, 4]]
    assert effect_ranks(SCORES, "noise").tolist() == [[2, 4], [3, 1]]
    assert effect_ranks(np.zeros((1, 3)), "denoise").tolist() == [[2, 2, 2]]  # ties share their average rank


def test_ranks_on_ties_are_the_ones_spearman_correlates():
    """The figure's ranks and Spearman's rho use one ranking: rho of the two rank vectors (Pearson) is the rho."""
    a = np.array([[0.5, 0.5], [0.1, 0.9]])  # a tie at the top-left
    b = np.array([[0.4, 0.6], [0.2, 0.6]])  # a tie on the right
    ra, rb = effect_ranks(a, "denoise").ravel(), effect_ranks(b, "denoise").ravel()
    assert ra.tolist() == [2.5, 2.5, 4.0, 1.0]
    assert rb.tolist() == [3.0, 1.5, 4.0, 1.5]
    rho, _ = spearman(a.ravel(), b.ravel())
    assert abs(np.corrcoef(ra, rb)[0, 1] - rho) < 1e-12


def test_top_heads_follow_the_direction():
    report = SimpleNamespace(activation=SimpleNamespace(scores=SCORES, direction="denoise"))
    assert top_heads(report, 2) == [(0, 1), (1, 0)]
    report.activation.direction = "noise"
    assert top_heads(report, 9) == [(1, 1), (0, 0), (1, 0), (0, 1)]  # at most every head
    report.activation.scores, report.activation.direction = np.zeros((1, 3)), "denoise"
    assert top_heads(report, 2) == [(0, 0), (0, 1)]  # ties in index order
