"""Step 2 statistics: selectivity, classes, null floor, fractions; and the OLMo-1B reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import HeadLabError
from core.heads import HeadSet
from core.stats.selectivity import (
    ScreenResult,
    baseline_positions,
    class_counts,
    classify,
    forbidden_positions,
    fraction_at_threshold,
    gather_pattern_attention,
    circuit_members,
    noise_floor,
    null_induction_selectivity,
    null_p99,
    null_target_positions,
    selectivity,
    specialized_fraction,
)
from core.tasks.probe_batch import PATTERNS
from tests.reference_data import REFERENCE, SPC


# ---------------------------------------------------------------- hand-made attention rows
# 2 examples, 1 layer, 6 heads (one per pattern), 20 keys, q = 19, p = (4, 8), p+1 = (5, 9).
# Background 0.01 on every key; head h adds 0.6 at its pattern's target (all four local keys for
# "local"). With q = 19 only 13 keys (1 .. 13) are eligible for the baseline (< 50): all are used,
# and they include p and p+1.
Q, KEYS, BG, PEAK = 19, 20, 0.01, 0.6
P = np.array([4, 8])


def _hand_rows() -> torch.Tensor:
    rows = torch.full((2, 1, 6, KEYS), BG, dtype=torch.float64)
    for i, p in enumerate(P):
        targets = {
            "induction": [p + 1],
            "duplicate-token": [p],
            "previous-token": [Q - 1],
            "self": [Q],
            "first-token": [0],
            "local": [Q - 5, Q - 4, Q - 3, Q - 2],
        }
        for h, name in enumerate(PATTERNS):
            for k in targets[name]:
                rows[i, 0, h, k] += PEAK
    return rows


def _hand_positions():
    return np.full(2, Q), P + 1, P


def test_baseline_draw_excludes_forbidden_positions_and_is_reproducible():
    q = 255
    pos = baseline_positions(q)
    assert len(pos) == 50 and len(set(pos.tolist())) == 50
    assert not set(pos.tolist()) & {0, q, q - 1, q - 2, q - 3, q - 4, q - 5}
    assert pos.min() >= 1 and pos.max() <= q - 6
    assert np.array_equal(pos, baseline_positions(q))
    assert not np.array_equal(pos, baseline_positions(q, seed=1))
    # the reference loop, written out independently
    rng, sample = np.random.RandomState(0), []
    while len(sample) < 50:
        k = rng.randint(1, q)
        if k not in forbidden_positions(q) and k not in sample:
            sample.append(k)
    assert pos.tolist() == sample
    # fewer than 50 eligible: all of them, 1 .. q-6
    assert baseline_positions(19).tolist() == list(range(1, 14))
    with pytest.raises(HeadLabError):
        baseline_positions(6)


def test_selectivity_on_hand_made_rows_for_each_pattern():
    q, p1, p = _hand_positions()
    summ = gather_pattern_attention(_hand_rows(), q, p1, p)
    sel, names = selectivity(summ.targets, summ.baseline)
    assert names == PATTERNS and sel.shape == (6, 1, 6)
    on_target = BG + PEAK  # 0.61
    # heads whose target is inside the baseline keys (p, p+1) raise their own baseline
    raised = (13 * BG + PEAK) / 13
    expected_diag = {
        "induction": on_target / raised,  # 10.863
        "duplicate-token": on_target / raised,
        "previous-token": on_target / BG,  # 61
        "self": on_target / BG,
        "first-token": on_target / BG,
        "local": on_target / BG,
    }
    for h, name in enumerate(PATTERNS):
        assert sel[h, 0, h] == pytest.approx(expected_diag[name], rel=1e-12)
    # off-target: the induction head's attention to q-1 is background
    assert sel[PATTERNS.index("previous-token"), 0, 0] == pytest.approx(BG / raised, rel=1e-12)
    # the duplicate-token head puts 0.6 on p, which is never p+1
    assert sel[0, 0, 1] == pytest.approx(BG / raised, rel=1e-12)
    # uniform baseline: 1/(q+1) = 1/20
    uni, _ = selectivity(summ.targets, baseline="uniform", query_pos=q)
    assert uni[3, 0, 3] == pytest.approx(on_target * 20, rel=1e-12)
    classes = classify(sel, names, threshold=30.0)
    assert classes[0].tolist() == ["unspecialized", "unspecialized", "previous-token", "self", "first-token", "local"]
    assert classify(sel, names, threshold=10.0)[0].tolist() == list(PATTERNS)
    assert classify(sel, names, 30.0, unspecialized_label="unclassified")[0, 0] == "unclassified"


def test_selectivity_is_a_ratio_of_means_not_a_mean_of_ratios():
    targets = {"self": np.array([[[0.1]], [[0.9]]])}  # [example, layer, head]
    base = np.array([[[0.1]], [[0.1 / 9]]])
    sel, _ = selectivity(targets, base)
    assert sel[0, 0, 0] == pytest.approx(0.5 / (0.1 * 10 / 18))  # 9.0, not mean(1, 81) = 41
    with pytest.raises(HeadLabError):
        selectivity(targets, base, baseline="median")
    with pytest.raises(HeadLabError):
        selectivity(targets, None)


def test_gather_uses_each_examples_own_query_position():
    rows = torch.zeros(2, 1, 1, 30)
    rows[0, 0, 0, 19] = 1.0  # self for q = 19
    rows[1, 0, 0, 29] = 1.0  # self for q = 29
    rows[1, 0, 0, 28] = 0.5  # previous-token for q = 29
    summ = gather_pattern_attention(rows, [19, 29], [5, 9], [4, 8])
    assert summ.targets["self"][:, 0, 0].tolist() == [1.0, 1.0]
    assert summ.targets["previous-token"][:, 0, 0].tolist() == [0.0, 0.5]
    with pytest.raises(HeadLabError):
        gather_pattern_attention(rows, [19, 30], [5, 9], [4, 8])  # q beyond the keys


def test_null_positions_exclude_special_keys_and_match_the_reference_loop():
    q, p1, p = np.array([40, 40, 40]), np.array([11, 21, 31]), np.array([10, 20, 30])
    pos = null_target_positions(q, p1, p, n_draws=200, seed=7)  # [draw, example]
    assert pos.shape == (200, 3)
    for i in range(3):
        bad = forbidden_positions(40) | {int(p[i]), int(p1[i])}
        assert not set(pos[:, i].tolist()) & bad
        assert pos[:, i].min() >= 1
    assert np.array_equal(pos, null_target_positions(q, p1, p, n_draws=200, seed=7))
    # the reference's scalar loop, written out independently (the fast path buffers bulk draws)
    rng = np.random.RandomState(7)
    for d in range(200):
        for i in range(3):
            while True:
                k = rng.randint(1, 40)
                if k not in forbidden_positions(40) and k != p[i] and k != p1[i]:
                    break
            assert pos[d, i] == k
    # varying q takes the scalar path; same rule
    mixed = null_target_positions([40, 30], [11, 21], [10, 20], n_draws=50, seed=1)
    assert not set(mixed[:, 1].tolist()) & (forbidden_positions(30) | {20, 21})


def test_null_floor_on_hand_made_rows():
    q, p1, p = _hand_positions()
    rows = torch.full((2, 1, 1, KEYS), 0.02, dtype=torch.float64)
    for i in range(2):
        rows[i, 0, 0, p1[i]] = 0.3  # a perfect-ish induction head; the null never looks at p+1
    null = null_induction_selectivity(rows, q, p1, p, n_draws=25, seed=3)
    assert null.shape == (25, 1, 1)
    baseline = (12 * 0.02 + 0.3) / 13
    assert np.allclose(null, 0.02 / baseline)  # every non-special key holds 0.02
    assert noise_floor(null) == 2.0  # p99 = 0.48 < 2
    real, _ = selectivity(*gather_pattern_attention(rows, q, p1, p)[:2])
    assert real[0, 0, 0] == pytest.approx(0.3 / baseline)
    # a head with graded attention: the null is the mean attention at the drawn keys
    graded = torch.arange(KEYS, dtype=torch.float64).reshape(1, 1, 1, KEYS).repeat(2, 1, 1, 1) / 100
    null_g = null_induction_selectivity(graded, q, p1, p, n_draws=5, seed=3)
    keys = null_target_positions(q, p1, p, n_draws=5, seed=3)
    assert np.allclose(null_g[:, 0, 0], (keys / 100).mean(axis=1) / (np.arange(1, 14).mean() / 100))


def test_null_p99_noise_floor_and_specialized_fraction_hand_made():
    values = np.arange(1, 101, dtype=float)
    null = np.stack([values, 2 * values], axis=1)[:, None, :]  # [draw=100, layer=1, head=2]
    assert null_p99(null, per_head=True)[0].tolist() == pytest.approx([99.01, 198.02])
    assert null_p99(null) == pytest.approx(196.02)  # pooled 200 values: 196 + 0.01 * (198 - 196)
    assert noise_floor(null) == pytest.approx(196.02)
    assert noise_floor(null / 100.0).__float__() == 2.0
    assert noise_floor(null / 1000.0, per_head=True)[0].tolist() == [2.0, 2.0]
    sel = np.array([[1.0, 3.0], [5.0, 0.5]])
    assert specialized_fraction(sel, 2.5) == 0.5
    assert specialized_fraction(sel, np.array([[0.5, 3.0], [1.0, 1.0]])) == 0.5  # 3 > 3 is false
    both = np.stack([sel, np.array([[40.0, 0.0], [0.0, 29.9]])])  # [pattern, layer, head]
    assert fraction_at_threshold(both, 30.0) == 0.25
    assert fraction_at_threshold(sel, 3.0) == 0.5


def test_circuit_members_and_screen_result_round_trip():
    sel_ind = np.array([[10.0, 50.0], [49.9, 120.0]])
    assert circuit_members(sel_ind) == HeadSet(((0, 1), (1, 1)))
    q, p1, p = _hand_positions()
    res = ScreenResult.from_attention(_hand_rows(), q, p1, p, threshold=10.0, n_null_draws=10, null_seed=5)
    assert res.classes[0].tolist() == list(PATTERNS)
    assert res.induction_heads == HeadSet(())  # 10.9x < 50x
    assert res.null.shape == (10, 1, 6) and res.specialized_fraction is not None
    fractions = res.fractions()
    assert fractions["fraction_best_selectivity_at_least_10x"] == 1.0
    back = ScreenResult.from_json(json.dumps(res.to_json()))
    assert back.patterns == res.patterns and back.threshold == 10.0 and back.null_seed == 5
    assert np.array_equal(back.selectivity, res.selectivity) and np.array_equal(back.null, res.null)
    assert back.classes.tolist() == res.classes.tolist()
    assert back.fractions() == fractions


# ---------------------------------------------------------------- OLMo-1B reference


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _olmo_selectivity(mech: dict) -> tuple[np.ndarray, tuple[str, ...]]:
    names = tuple(PATTERNS)
    sel = np.array(
        [[[mech["all_head_selectivity"][f"L{l}_H{h}"][k] for h in range(16)] for l in range(16)] for k in names]
    )
    return sel, names  # [pattern, layer, head]


def test_olmo_class_rule_reproduces_published_counts():
    mech = _load(SPC / "results/olmo_mechinterp.json")
    sup = _load(REFERENCE / "coactivation-closure/results/olmo_1b_ising/supervised_vs_unsupervised.json")
    sel, names = _olmo_selectivity(mech)
    classes = classify(sel, names, threshold=mech["selectivity_threshold"])
    assert class_counts(classes) == sup["supervised_counts"]
    assert sup["supervised_counts"] == {
        "self": 11, "previous-token": 15, "duplicate-token": 4, "first-token": 200, "unspecialized": 26,
    }
    top = classify(sel, names, 30.0, unspecialized_label="unclassified")
    published = mech["classifications"]
    assert [top[c["layer"], c["head"]] for c in published] == [c["classification"] for c in published]
    assert class_counts([top[c["layer"], c["head"]] for c in published]) == mech["class_breakdown_topK"]
    # the >= 30x share METHODS.md contrasts with the specialized fraction: 230 / 256
    assert fraction_at_threshold(sel, 30.0) * 256 == pytest.approx(230)


def test_olmo_natural_text_class_rule_reproduces_published_counts():
    nat = _load(SPC / "cross_architecture/results/olmo_mechinterp_naturaltext.json")
    sel, names = _olmo_selectivity(nat)
    classes = classify(sel, names, 30.0, unspecialized_label="unclassified")
    assert class_counts(classes) == nat["class_breakdown_whole_model"]
    top = [classes[c["layer"], c["head"]] for c in nat["classifications"]]
    assert top == [c["classification"] for c in nat["classifications"]]


def test_olmo_null_floor_and_specialized_fraction():
    null_file = _load(SPC / "cross_architecture/results/null_selectivity_olmo.json")
    mech = _load(SPC / "results/olmo_mechinterp.json")
    summary = _load(SPC / "cross_architecture/results/calibration_summary.json")["per_model"]["olmo_1b"]
    null = np.array(null_file["null_sels_all"])  # [draw=20, layer, head]
    real = np.array(null_file["real_sel"])  # [layer, head]
    sel, names = _olmo_selectivity(mech)
    assert np.array_equal(real, sel[names.index("induction")])
    assert np.max(np.abs(null_p99(null, per_head=True) - np.array(null_file["null_per_head_p99"]))) < 1e-12
    assert null_p99(null) == pytest.approx(null_file["null_global_stats"]["p99"], abs=1e-12)
    assert noise_floor(null) == pytest.approx(2.9916831086830338)
    # specialized fraction, pooled null p99 (default): 11 / 256 with the stored 20-draw null;
    # the calibration's 500-draw null p99 (2.581) gives its published K_above_null_p99 = 12
    assert specialized_fraction(real, null_p99(null)) * 256 == pytest.approx(11)
    assert specialized_fraction(real, summary["null_p99"]) * 256 == pytest.approx(summary["K_above_null_p99"])
    # per-head p99 from only 20 draws is a much lower bar for many heads
    assert specialized_fraction(real, null_p99(null, per_head=True)) * 256 == pytest.approx(42)
    # the calibration's fixed-threshold counts use the same (random-baseline) induction selectivity
    assert fraction_at_threshold(real, 30.0) * 256 == pytest.approx(summary["K_above_30x"])
    assert len(circuit_members(real, 50.0)) == summary["K_above_50x_T_precision"]
    assert len(circuit_members(real, 100.0)) == summary["K_above_100x"]
    assert specialized_fraction(real, 2.0) * 256 == pytest.approx(summary["K_above_2x_T_recall"])


def test_membership_is_judged_against_the_uniform_baseline():
    """A head putting 0.8 of its attention on p+1 at q = 63 is 0.8 * 64 = 51.2x uniform: a member."""
    n, T = 40, 64
    q = np.full(n, T - 1)
    p = np.arange(n) % 10 + 20
    rows = np.full((n, 1, 2, T), 0.2 / (T - 1))
    rows[np.arange(n), 0, 0, p + 1] = 0.8
    rows[np.arange(n), 0, 1, p + 1] = 0.7  # 44.8x uniform: not a member
    for head in range(2):
        rows[:, 0, head] /= rows[:, 0, head].sum(axis=-1, keepdims=True)
    result = ScreenResult.from_attention(rows, q, p + 1, p, n_null_draws=0)
    assert result.membership_baseline == "uniform"
    np.testing.assert_allclose(result.membership[0], rows[:, 0, :, :][np.arange(n), :, p + 1].mean(0) * T)
    assert result.induction_heads.heads == ((0, 0),)
    again = ScreenResult.from_json(result.to_json())
    assert again.induction_heads == result.induction_heads


def test_previous_token_circuit_uses_the_membership_rule_not_the_class_rule():
    """At q = 63 a share s on q-1 is 64 s x uniform. Head 0 (0.5: 32x) and head 1 (0.3: 19.2x) reach a
    19x membership threshold; head 2 (0.25: 16x) does not. Only head 0 is classed previous-token (>= 30x
    against the uniform baseline here), so the class would miss head 1."""
    n, T = 40, 64
    q = np.full(n, T - 1)
    p = np.arange(n) % 10 + 20
    rows = np.zeros((n, 1, 3, T))
    for head, share in enumerate((0.5, 0.3, 0.25)):
        rows[:, 0, head, :] = (1 - share) / (T - 1)
        rows[:, 0, head, T - 2] += share - (1 - share) / (T - 1)
    result = ScreenResult.from_attention(rows, q, p + 1, p, baseline="uniform", induction_threshold=19.0,
                                         n_null_draws=0)
    np.testing.assert_allclose(result.membership_of("previous-token")[0], [32.0, 19.2, 16.0])
    assert result.previous_token_circuit.heads == ((0, 0), (0, 1))
    assert (result.classes == "previous-token").sum() == 1
    assert ScreenResult.from_json(result.to_json()).previous_token_circuit == result.previous_token_circuit


def test_membership_threshold_scales_with_probe_length():
    from core.pipelines.recipe import scaled_induction_threshold
    from core.tasks import InductionProbeSpec

    reference = InductionProbeSpec(n_examples=4, seq_len=256, token_low=100, token_high=10000, seed=0).build()
    zoo = InductionProbeSpec(n_examples=4, seq_len=64, token_low=0, token_high=256, seed=0).build()
    assert scaled_induction_threshold(reference.query_pos) == pytest.approx(50.0)
    assert scaled_induction_threshold(zoo.query_pos) == pytest.approx(12.5)
