"""Step 1 statistics: the two PR definitions, the PR-integral, top-K; and the OLMo-1B reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import HeadLabError
from core.stats.spectral import (
    PR_DEFINITIONS,
    SpectralResult,
    effective_rank,
    participation_ratio,
    pr_integral,
    pr_per_head,
    rank_heads,
    resolve_k,
    top_k,
)
from tests.reference_data import SPC


# ---------------------------------------------------------------- PR definitions, known answers


def test_rank_one_matrix_has_pr_one_for_both_definitions():
    rng = np.random.default_rng(0)
    x = np.outer(rng.normal(size=50), rng.normal(size=8))  # [50, 8], rank 1
    assert effective_rank(x) == pytest.approx(1.0, abs=1e-9)
    assert participation_ratio(x) == pytest.approx(1.0, abs=1e-9)


def test_isotropic_gaussian_classic_pr_is_about_d_over_one_plus_d_over_n():
    n, d = 2000, 32
    x = np.random.default_rng(1).normal(size=(n, d))
    expected = d / (1 + d / n)  # 31.50
    assert participation_ratio(x) == pytest.approx(expected, rel=0.02)


def test_large_mean_separates_uncentered_entropy_rank_from_centered_classic_pr():
    n, d = 4000, 16
    x = np.random.default_rng(2).normal(size=(n, d)) + 10.0
    # uncentered: one direction carries 1601 of 1616 units of power -> exp(H) ~ 1.081
    p = np.array([1601.0] + [1.0] * 15) / 1616.0
    assert math.exp(-(p * np.log(p)).sum()) == pytest.approx(1.081, abs=1e-3)
    assert effective_rank(x) == pytest.approx(1.08, abs=0.01)
    assert participation_ratio(x) == pytest.approx(d / (1 + d / n), rel=0.02)  # ~15.9
    assert participation_ratio(x) == pytest.approx(15.9, abs=0.25)


def test_squared_singular_values_three_and_one_give_1755_vs_16():
    a, b = math.sqrt(1.5), math.sqrt(0.5)
    # zero-mean columns, so centering changes nothing: X^T X = diag(3, 1)
    x = np.array([[a, 0.0], [-a, 0.0], [0.0, b], [0.0, -b]])
    assert np.allclose(np.linalg.svd(x, compute_uv=False) ** 2, [3.0, 1.0])
    assert effective_rank(x) == pytest.approx(1.7548, abs=1e-4)  # exp(-(.75 ln .75 + .25 ln .25))
    assert participation_ratio(x) == pytest.approx(1.6, abs=1e-12)  # (3+1)^2 / (9+1)


def test_classic_pr_without_eigendecomposition_equals_eigenvalue_formula():
    x = np.random.default_rng(3).normal(size=(40, 6)) @ np.diag([5, 3, 2, 1, 0.5, 0.1]) + 2.0
    lam = np.linalg.eigvalsh(np.cov(x, rowvar=False))
    assert participation_ratio(x) == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-12)


def test_batched_pr_matches_single_matrix_definitions():
    z = torch.randn(300, 2, 3, 8, generator=torch.Generator().manual_seed(4)) * torch.linspace(0.1, 3, 8) + 0.7
    for name, single in PR_DEFINITIONS.items():
        batched = pr_per_head(z, name)  # [layer, head]
        assert batched.shape == (2, 3)
        for layer in range(2):
            for head in range(3):
                assert batched[layer, head] == pytest.approx(single(z[:, layer, head].numpy()), rel=1e-9)
    # chunking over examples (300 > one chunk of 256) does not change the answer
    assert pr_per_head(z.numpy(), "entropy") == pytest.approx(pr_per_head(z, "entropy"), rel=1e-12)


def test_zero_head_output_has_pr_zero_and_unknown_definition_is_a_user_error():
    z = np.zeros((10, 1, 1, 4))
    assert pr_per_head(z, "entropy")[0, 0] == 0.0
    assert pr_per_head(z, "classic")[0, 0] == 0.0
    with pytest.raises(HeadLabError):
        pr_per_head(z, "svd")


# ---------------------------------------------------------------- PR-integral


def test_pr_integral_on_hand_made_trajectory_both_rules_and_dropped_checkpoint():
    tokens = [0, 1, math.e, math.e**3]  # ln = (-, 0, 1, 3); the 0-token checkpoint is dropped
    pr = np.array([5.0, 2.0, 4.0, 0.5])  # max(PR-1, 0) over kept: 1, 3, 0
    trap = pr_integral(pr, tokens)
    assert trap.dropped == (0,)
    assert trap.rule == "trapezoid"
    assert float(trap.integral) == pytest.approx((1 + 3) / 2 * 1 + (3 + 0) / 2 * 2)  # 5
    paper = pr_integral(pr, tokens, rule="paper_sum")
    assert float(paper.integral) == pytest.approx(3 * 1 + 0 * 2)  # 3
    assert pr_integral(pr, tokens, rule="right").rule == "paper_sum"


def test_pr_integral_per_head_shape_and_errors():
    pr = np.ones((3, 2, 2)) * np.array([1.0, 2.0, 3.0])[:, None, None]
    res = pr_integral(pr, [1.0, 10.0, 100.0])
    assert res.integral.shape == (2, 2)
    assert res.dropped == ()
    assert np.allclose(res.integral, (0 + 1) / 2 * math.log(10) + (1 + 2) / 2 * math.log(10))
    with pytest.raises(HeadLabError):
        pr_integral(pr, [0.0, 0.0, 100.0])  # one checkpoint left
    with pytest.raises(HeadLabError):
        pr_integral(pr, [1.0, 10.0])  # length mismatch
    with pytest.raises(HeadLabError):
        pr_integral(pr, [10.0, 1.0, 100.0])  # not increasing
    with pytest.raises(HeadLabError):
        pr_integral(pr, [1.0, 10.0, 100.0], rule="simpson")


# ---------------------------------------------------------------- top-K


def test_top_k_count_fraction_and_tie_break():
    scores = np.array([[1.0, 5.0, 5.0], [7.0, 5.0, np.nan]])
    assert rank_heads(scores) == [(1, 0), (0, 1), (0, 2), (1, 1), (0, 0), (1, 2)]
    assert top_k(scores, 2) == [(1, 0), (0, 1)]
    assert top_k(scores, 0.5) == [(1, 0), (0, 1), (0, 2)]  # round(0.5 * 6) = 3
    assert resolve_k(0.18, 256) == 46  # round(46.08)
    assert resolve_k(0.18, 144) == 26  # round(25.92): Pythia-160M's 26
    for bad in (0, 7, 1.5, -0.2, True, "3"):
        with pytest.raises(HeadLabError):
            resolve_k(bad, 6)


# ---------------------------------------------------------------- OLMo-1B reference


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _olmo_trajectory() -> tuple[np.ndarray, list[float], dict]:
    traj = _load(SPC / "cross_architecture/results/olmo_phase1_trajectory.json")
    n_layers, n_heads = traj["n_layer"], traj["num_heads"]
    pr = np.array([[traj["pr"][f"L{l}_H{h}"] for h in range(n_heads)] for l in range(n_layers)])  # [L, H, ckpt]
    return np.moveaxis(pr, -1, 0), traj["ckpt_tokens_B"], traj  # [ckpt, L, H]


def test_olmo_pr_integral_equals_published_integral_for_all_256_heads():
    pr, tokens, traj = _olmo_trajectory()
    calib = _load(SPC / "cross_architecture/results/null_pr_calibration_olmo.json")
    mech = _load(SPC / "results/olmo_mechinterp.json")
    res = pr_integral(pr, tokens)
    assert res.integral.shape == (16, 16) and res.dropped == ()
    assert np.max(np.abs(res.integral - np.array(calib["real_integral_from_features"]))) < 1e-9
    for entry in mech["classifications"]:
        assert res.integral[entry["layer"], entry["head"]] == pytest.approx(entry["integral"], abs=1e-9)
    # raw token counts give the same integral (units cancel in d ln tokens)
    raw = pr_integral(pr, [t * 1e9 for t in tokens]).integral
    assert np.max(np.abs(raw - res.integral)) < 1e-9
    # the paper's sum is a different number: it must not pass for the reference one
    assert np.max(np.abs(pr_integral(pr, tokens, "paper_sum").integral - res.integral)) > 1.0


def test_olmo_ranking_gives_published_top45_order_and_k_rule():
    pr, tokens, traj = _olmo_trajectory()
    mech = _load(SPC / "results/olmo_mechinterp.json")
    calib = _load(SPC / "cross_architecture/results/null_pr_calibration_olmo.json")
    summary = _load(SPC / "cross_architecture/results/calibration_summary.json")
    published = [(c["layer"], c["head"]) for c in sorted(mech["classifications"], key=lambda c: c["rank"])]
    assert mech["top_k"] == 45
    result = SpectralResult.build(pr, tokens, k=45, revisions=traj["revisions"])
    assert list(result.top_heads) == published
    assert top_k(result.integral, 45) == published
    # the 18% rule gives 46, not the published 45: the published list is the count 45
    assert resolve_k(0.18, 256) == calib["K_candidates"]["conserved_fraction_18pct"] == 46
    for model in summary["per_model"].values():
        assert resolve_k(0.18, model["n_heads"]) == model["K_18pct_band"]
    # final-checkpoint PR equals the calibration file's final PR
    assert np.allclose(pr[-1], np.array(calib["real_pr_final_from_features"]), atol=0, rtol=0)


def test_spectral_result_json_round_trip_keeps_variant_names():
    pr = np.stack([np.full((2, 2), v) for v in (3.0, 2.0, 4.0)])  # [ckpt, L, H]
    pr[:, 1, 1] += 1.0
    res = SpectralResult.build(pr, [0, 10, 100], k=0.5, definition="classic", rule="paper_sum", revisions=["a", "b", "c"])
    assert res.dropped == (0,)
    assert res.ranking[0] == (1, 1) and res.k == 2
    back = SpectralResult.from_json(json.dumps(res.to_json()))
    assert back.definition == "classic" and back.rule == "paper_sum" and back.dropped == (0,)
    assert back.ranking == res.ranking and back.revisions == ("a", "b", "c") and back.k == 2
    assert np.array_equal(back.pr, res.pr) and np.array_equal(back.integral, res.integral)
