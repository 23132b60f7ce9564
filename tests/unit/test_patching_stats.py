"""Patching's arithmetic and settings on hand-made numbers: the normalized score, controls, metric values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.ablation.patching import PatchSettings, metric_values
from core.errors import HeadLabError
from core.stats.patching import against_controls, base_score, check_direction, normalized_score


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
