"""Patching's arithmetic and settings on hand-made numbers: the normalized score, controls, metric values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.ablation.patching import PatchSettings, metric_values
from core.errors import HeadLabError
from core.stats.inference import controls_for_p, format_rank_z
from core.stats.patching import against_controls, base_score, check_direction, check_gap, gap_stats, normalized_score


def test_normalized_score_puts_clean_at_one_and_corrupted_at_zero():
    assert normalized_score(5.0, clean=5.0, corrupted=1.0) == 1.0
    assert normalized_score(1.0, clean=5.0, corrupted=1.0) == 0.0
    assert normalized_score(3.0, clean=5.0, corrupted=1.0) == 0.5
    assert normalized_score(-1.0, clean=5.0, corrupted=1.0) == -0.5  # worse than the corrupted run
    # a metric where lower is better (loss): the scale still runs corrupted 0 -> clean 1
    assert normalized_score(2.0, clean=1.0, corrupted=3.0) == 0.5
    grid = normalized_score(np.array([[1.0, 3.0], [5.0, 7.0]]), clean=5.0, corrupted=1.0)
    assert grid.shape == (2, 2) and np.allclose(grid, [[0.0, 0.5], [1.0, 1.5]])


def test_normalized_score_refuses_a_pair_with_nothing_to_recover():
    with pytest.raises(HeadLabError, match="score the same"):
        normalized_score(1.0, clean=2.0, corrupted=2.0)


def test_base_score_and_directions():
    assert base_score("denoise") == 0.0 and base_score("noise") == 1.0
    with pytest.raises(HeadLabError, match="'denoise' or 'noise'"):
        check_direction("sideways")


def test_against_controls_in_each_direction():
    # denoising: more restoration is more effect; controls 0.1, 0.2, 0.3 (mean 0.2, population std sqrt(2/300))
    out = against_controls(0.9, [0.1, 0.2, 0.3], "denoise")
    assert out["z"] == pytest.approx(0.7 / np.sqrt(2 / 300))
    assert (out["rank"], out["p"]) == (1, 0.25)
    assert out["control_mean"] == pytest.approx(0.2)
    # noising: more breakage (a lower score) is more effect
    low = against_controls(0.1, [0.5, 0.6, 0.7], "noise")
    assert low["z"] < 0 and (low["rank"], low["p"]) == (1, 0.25)
    high = against_controls(0.9, [0.5, 0.6, 0.7], "noise")
    assert (high["rank"], high["p"]) == (4, 1.0)


def test_metric_values_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, -1.0]])  # [row, vocab]
    target, other = torch.tensor([2, 0]), torch.tensor([0, 1])
    assert metric_values(logits, target, other, "logit_diff").tolist() == [2.0, 4.0]
    assert metric_values(logits, target, None, "logit_diff").tolist() == [3.0, 4.0]
    loss = metric_values(logits, target, None, "loss")
    assert torch.allclose(loss, torch.logsumexp(logits, dim=1) - torch.tensor([3.0, 4.0]))
    assert metric_values(logits, target, None, "top1").tolist() == [1.0, 1.0]


def test_patch_settings_validate_and_round_trip():
    settings = PatchSettings(direction="noise", metric="logit", per_position=True, n_controls=5, batch_size=4)
    assert settings.metric == "target_logit"  # reference names are read as HeadLab's
    assert PatchSettings.from_json(settings.to_json()) == settings
    for bad, message in ((dict(metric="accuracy"), "patching metric"), (dict(direction="up"), "direction"),
                         (dict(n_controls=0), "n_controls"), (dict(batch_size=0), "batch_size"),
                         (dict(controls="nearby"), "control kind"), (dict(control_seed=-1), "control_seed")):
        with pytest.raises(HeadLabError, match=message):
            PatchSettings(**bad)


def test_gap_stats_on_hand_made_pairs():
    # gaps 1, 2, 3: mean 2, sd (ddof=1) 1, se 1/sqrt(3)
    gap = gap_stats([3.0, 4.0, 5.0], [2.0, 2.0, 2.0], "logit_diff")
    assert gap["n_examples"] == 3 and gap["gap_mean"] == pytest.approx(2.0) and gap["gap_sd"] == pytest.approx(1.0)
    assert gap["gap_se"] == pytest.approx(1 / np.sqrt(3)) and gap["gap_ratio"] == pytest.approx(2 * np.sqrt(3))
    # loss: lower is better, so a clean loss below the corrupted one is a positive gap
    assert gap_stats([1.0, 1.0], [3.0, 2.0], "loss")["gap_mean"] == pytest.approx(1.5)
    one = gap_stats([4.431], [4.501], "logit_diff")
    assert one["gap_sd"] is None and one["gap_se"] is None and one["gap_mean"] == pytest.approx(-0.07)


def test_gap_rule_refuses_reversed_small_and_single_gaps_unless_forced():
    good = check_gap(gap_stats([3.0, 4.0, 5.0], [2.0, 2.0, 2.0], "logit_diff"), "logit_diff")  # 3.46 se
    assert good["gap_ok"] and good["gap_note"] == ""
    # the one-record probe: corrupted 4.501 above clean 4.431
    with pytest.raises(HeadLabError, match="corrupted run scores better.*more pairs, another metric"):
        check_gap(gap_stats([4.431], [4.501], "logit_diff"), "logit_diff")
    with pytest.raises(HeadLabError, match="one example"):
        check_gap(gap_stats([4.5], [4.4], "logit_diff"), "logit_diff")
    # gaps +3, -2, +0.4, -1: mean 0.1, far under 2 se
    noisy = gap_stats([3.0, -2.0, 0.4, -1.0], [0.0, 0.0, 0.0, 0.0], "logit_diff")
    with pytest.raises(HeadLabError, match="under 2 standard errors.*per-example sd"):
        check_gap(noisy, "logit_diff")
    forced = check_gap(noisy, "logit_diff", allow_small_gap=True)
    assert not forced["gap_ok"] and forced["gap_note"].startswith("forced:")
    # a gap just past 2 se passes; zero spread (top-1 1 -> 0 on every example) passes
    assert check_gap({"n_examples": 4, "gap_mean": 2.01, "gap_sd": 2.0, "gap_se": 1.0, "gap_ratio": 2.01}, "m")["gap_ok"]
    assert check_gap(gap_stats([1.0, 1.0], [0.0, 0.0], "top1"), "top1")["gap_ok"]


def test_controls_report_their_count_and_flag_z_below_ten():
    few = against_controls(0.9, [0.1, 0.2, 0.3], "denoise")
    assert few["n_controls"] == 3 and few["z_reliable"] is False and "ddof=0" in few["z_convention"]
    many = against_controls(0.9, list(np.linspace(0.0, 0.5, 10)), "denoise")
    assert many["n_controls"] == 10 and many["z_reliable"] is True


def test_rank_p_needs_nineteen_controls_for_five_percent():
    assert controls_for_p(0.05) == 19 and controls_for_p(0.01) == 99 and controls_for_p(0.5) == 1
    assert 1 / (controls_for_p(0.05) + 1) <= 0.05 < 1 / controls_for_p(0.05)
    text = format_rank_z(1, 1 / 3, 2, 20.4)
    assert text.startswith("rank 1 of 3, p = 0.333; z +20.4 (2 controls, population sd (ddof=0)")
    assert "z unreliable" in text and "inconclusive" in text and "at least 19" in text
    full = format_rank_z(1, 1 / 21, 20, 2.5)
    assert full.startswith("rank 1 of 21, p = 0.0476") and "unreliable" not in full and "inconclusive" not in full
