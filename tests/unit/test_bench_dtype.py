"""The dtype benchmark's comparisons and the top-k recovery count, on hand-made scores with known answers."""

from __future__ import annotations

import json

import numpy as np

from core.bench.dtype import _compare, _top_heads_one_per_layer, ioi_pairs_jsonl, topk_recovery


def test_topk_recovery_counts_the_exact_top_heads_in_the_estimates_top_k():
    exact = np.array([[0.9, -0.8], [0.1, 0.05]])  # by |score|: 0, 1, 2, 3
    estimate = np.array([[0.5, 0.01], [0.4, 0.3]])  # by |score|: 0, 2, 3, 1
    got = topk_recovery(estimate, exact, [1, 2, 3, 4], top=(1, 2))
    assert got["recovered"] == {"m=1": [1, 1, 1, 1], "m=2": [1, 1, 1, 2]}
    assert got["k_recovering_all"] == {"m=1": 1, "m=2": 4}  # head 1 is the estimate's last


def test_compare_reports_the_largest_error_its_share_of_the_spread_and_rank_agreement():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = a + np.array([[0.0, 0.1], [0.0, -0.2]])
    got = _compare(a, b, top=2)
    assert np.isclose(got["max_abs_diff"], 0.2)
    assert np.isclose(got["float32_spread_sd"], np.std([1, 2, 3, 4]))
    assert np.isclose(got["max_diff_over_spread"], 0.2 / np.std([1, 2, 3, 4]))
    assert np.isclose(got["spearman"], 1.0) and got["top2_overlap"] == 2


def test_top_heads_take_at_most_one_per_layer():
    scores = np.array([5.0, 4.0, 3.0, 0.0, 2.0, 1.0])  # 3 layers x 2 heads
    assert tuple(_top_heads_one_per_layer(scores, 2, 2)) == ((0, 0), (1, 0))


def test_ioi_pairs_swap_the_subject_and_the_answers():
    for line in ioi_pairs_jsonl(4).splitlines():
        pair = json.loads(line)
        assert pair["prompt"].endswith(" to") and pair["target"].startswith(" ")
        a, b = pair["target"], pair["corrupted_target"]
        assert a != b and pair["corrupted_prompt"] == pair["prompt"].replace(a, "\0").replace(b, a).replace("\0", b)
