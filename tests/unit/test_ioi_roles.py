"""core/stats/ioi_roles.py on hand-made arrays with known answers: attention gathers, direct effects, copy scores,
role labels, Jaccard stability and the per-KV-group view."""

import numpy as np
import pytest

from core.errors import HeadLabError
from core.stats.ioi_roles import (copy_scores, direct_effects, gathered_attention, group_role_summary, head_roles,
                                  jaccard, kv_group_view, mean_pairwise_jaccard)


def test_gathered_attention_picks_each_examples_key():
    rows = np.zeros((2, 1, 2, 4))  # [example, layer, head, key]
    rows[0, 0, 0, 1], rows[1, 0, 0, 3] = 0.8, 0.4  # head 0 attends to each example's own IO position
    rows[0, 0, 1, 3], rows[1, 0, 1, 1] = 1.0, 1.0  # head 1 attends to the other position
    out = gathered_attention(rows, np.array([1, 3]))
    assert out.shape == (1, 2)
    assert out[0, 0] == pytest.approx(0.6) and out[0, 1] == pytest.approx(0.0)
    with pytest.raises(HeadLabError, match="outside"):
        gathered_attention(rows, np.array([1, 4]))


def test_direct_effects_are_mean_dot_products():
    head_out = np.zeros((2, 1, 2, 3))
    head_out[:, 0, 0] = [[1, 0, 0], [0, 2, 0]]
    head_out[:, 0, 1] = [[0, 0, 5], [0, 0, 5]]
    direction = np.array([[2.0, 0, 0], [0, 1.0, 0]])
    out = direct_effects(head_out, direction)
    assert out[0, 0] == pytest.approx((2 + 2) / 2) and out[0, 1] == pytest.approx(0.0)
    with pytest.raises(HeadLabError, match="direction"):
        direct_effects(head_out, direction[:1])


def test_copy_score_counts_names_in_their_own_top_k():
    logits = np.array([[9.0, 1, 2, 3, 0, 0],   # name 0 (id 0) first: copied
                       [0.0, 0, 0, 9, 8, 7],   # name 1 (id 1) outside the top-2: not copied
                       [0.0, 0, 5, 6, 0, 0]])  # name 2 (id 2) second: copied at k = 2
    assert copy_scores(logits, [0, 1, 2], k=2) == pytest.approx(2 / 3)
    assert copy_scores(logits, [0, 1, 2], k=1) == pytest.approx(1 / 3)


def test_head_roles_first_rule_that_holds():
    z = np.zeros((1, 6))
    io, s2, eff, cp, dup, ind, prev = (z.copy() for _ in range(7))
    io[0, 0], eff[0, 0], cp[0, 0] = 0.6, 0.5, 0.9     # name mover (effect 0.5 of a logit diff of 2 = 0.25)
    io[0, 1], eff[0, 1], cp[0, 1] = 0.6, -0.5, 0.9    # negative name mover
    s2[0, 2], eff[0, 2] = 0.5, 0.01                   # S-inhibition: attends to S2, no direct effect
    ind[0, 3] = 0.5                                   # induction
    dup[0, 4] = 0.5                                   # duplicate-token
    io[0, 5], eff[0, 5], cp[0, 5] = 0.6, 0.5, 0.1     # attends and writes but does not copy: no role
    labels = head_roles(io, s2, eff, cp, dup, ind, prev, logit_diff=2.0)
    assert list(labels[0]) == ["name mover", "negative name mover", "S-inhibition", "induction", "duplicate-token", ""]
    prev[0, 5] = 0.4
    assert head_roles(io, s2, eff, cp, dup, ind, prev, 2.0)[0, 5] == "previous-token"


def test_jaccard_and_mean_pairwise():
    assert jaccard({1, 2, 3}, {2, 3, 4}) == pytest.approx(0.5)
    assert jaccard(set(), set()) == 1.0
    # pairs: (a, b) 0.5, (a, c) 1/5, (b, c) 1/2 ... computed by hand
    a, b, c = {1, 2, 3}, {2, 3, 4}, {3, 4, 5}
    assert mean_pairwise_jaccard([a, b, c]) == pytest.approx((0.5 + 0.2 + 0.5) / 3)
    with pytest.raises(HeadLabError, match="two"):
        mean_pairwise_jaccard([a])


def test_kv_group_view_says_whether_a_group_shares_a_role():
    classes = np.array([["induction", "induction", "induction", "", "previous-token", ""]], dtype=object)
    records = kv_group_view(classes, n_kv_heads=2)  # groups of 3 query heads: h // 3
    assert [r["heads"] for r in records] == [[0, 1, 2], [3, 4, 5]]
    assert records[0]["shared"] and not records[1]["shared"]
    summary = group_role_summary(records, ("induction", "previous-token"))
    assert summary["induction"] == {"groups_with_role": 1, "groups_all_heads": 1, "heads": 3}
    assert summary["previous-token"] == {"groups_with_role": 1, "groups_all_heads": 0, "heads": 1}
    with pytest.raises(HeadLabError, match="KV groups"):
        kv_group_view(classes, n_kv_heads=4)
