"""The patching figures' arithmetic on hand-made scores: effects, ranks and the top heads, per direction."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from core.figures.patching import effect, effect_ranks, top_heads

SCORES = np.array([[0.1, 0.9], [0.5, -0.2]])  # [layer, head], clean 1, corrupted 0


def test_denoising_ranks_the_highest_score_first_and_noising_the_lowest():
    np.testing.assert_allclose(effect(SCORES, "noise"), 1.0 - SCORES)
    assert effect_ranks(SCORES, "denoise").tolist() == [[3, 1], [2, 4]]
    assert effect_ranks(SCORES, "noise").tolist() == [[2, 4], [3, 1]]
    assert effect_ranks(np.zeros((1, 3)), "denoise").tolist() == [[1, 2, 3]]  # ties in index order


def test_top_heads_follow_the_direction():
    report = SimpleNamespace(activation=SimpleNamespace(scores=SCORES, direction="denoise"))
    assert top_heads(report, 2) == [(0, 1), (1, 0)]
    report.activation.direction = "noise"
    assert top_heads(report, 9) == [(1, 1), (0, 0), (1, 0), (0, 1)]  # at most every head
