"""patch --top-k: attribution ranks every head, activation patching runs on the top k only.

On a hand-built 3 x 3 model: the k heads patched exactly are the k largest by |attribution effect|,
their scores equal a full activation-patching scan's, the other heads keep attribution's estimate,
and the report names which is which.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.ablation.patching.activation import HeadPatching
from core.cli.patch_run import report_lines, top_k_from_args
from core.errors import HeadLabError
from core.pipelines.patching import DEFAULT_TOP_K, PatchPlan, check_top_k, effect_size, run_patching
from tests.hand_model import random_hand_model
from tests.integration.test_patching import hand_pair

N_LAYERS, N_HEADS = 3, 3


@pytest.fixture(scope="module")
def model():
    return random_hand_model(seed=4, n_layers=N_LAYERS, n_heads=N_HEADS, d_vocab=8, n_ctx=16)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_top_k_patches_the_heads_attribution_ranks_first(model, direction):
    pair = hand_pair(seed=3)
    settings = PatchSettings(allow_small_gap=True, direction=direction, batch_size=4)
    every = activation_patching(model, pair, settings)
    attribution = attribution_patching(model, pair, settings)
    report = run_patching(model, pair, settings, PatchPlan(top_k=4))
    act = report.activation
    assert act.exact.sum() == 4
    want = np.argsort(-effect_size(attribution.scores, direction).ravel(), kind="stable")[:4]
    assert set(np.flatnonzero(act.exact.ravel()).tolist()) == set(want.tolist())
    np.testing.assert_allclose(act.scores[act.exact], every.scores[act.exact], atol=1e-9)
    np.testing.assert_allclose(act.scores[~act.exact], attribution.scores[~act.exact], atol=1e-12)
    assert any("top-k" in note for note in report.notes)
    lines = "\n".join(report_lines(report, top=9))
    assert "(estimate)" in lines and "patched exactly (4 of 9 heads" in lines


def test_top_k_at_or_above_the_head_count_patches_every_head(model):
    pair = hand_pair(seed=3)
    settings = PatchSettings(allow_small_gap=True, batch_size=4)
    every = activation_patching(model, pair, settings)
    for top_k in (None, N_LAYERS * N_HEADS, DEFAULT_TOP_K):
        act = run_patching(model, pair, settings, PatchPlan(top_k=top_k)).activation
        assert act.exact is None
        np.testing.assert_array_equal(act.scores, every.scores)


def test_without_attribution_every_head_is_patched_and_said_so(model):
    report = run_patching(model, hand_pair(seed=3), PatchSettings(allow_small_gap=True), PatchPlan(attribution=False, top_k=2))
    assert report.activation.exact is None
    assert any("every head was activation-patched" in note for note in report.notes)


def test_a_partial_scan_round_trips_through_json(model):
    act = activation_patching(model, hand_pair(seed=3), PatchSettings(allow_small_gap=True), heads=[(0, 1), (2, 2)])
    assert np.isnan(act.scores).sum() == N_LAYERS * N_HEADS - 2
    back = HeadPatching.from_json(act.to_json())
    assert back.exact.dtype == bool and back.exact_heads() == [(0, 1), (2, 2)]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "7"])
def test_check_top_k_refuses_what_is_not_a_head_count(bad):
    with pytest.raises(HeadLabError, match="top-k"):
        check_top_k(bad)


def test_top_k_from_the_command_line():
    assert top_k_from_args(None, 270, True, "logit_diff") == DEFAULT_TOP_K
    assert top_k_from_args("all", 270, True, "logit_diff") is None
    assert top_k_from_args("12", 270, True, "logit_diff") == 12
    assert top_k_from_args("9", 9, False, "top1") == 9  # every head: nothing to rank
    for text, message in [("0", "at least 1"), ("-2", "at least 1"), ("271", "at most 270"), ("1.5", "whole number"),
                          ("lots", "whole number")]:
        with pytest.raises(HeadLabError, match=message):
            top_k_from_args(text, 270, True, "logit_diff")
    with pytest.raises(HeadLabError, match="needs attribution"):
        top_k_from_args("5", 270, False, "logit_diff")
    with pytest.raises(HeadLabError, match="needs attribution"):
        top_k_from_args("5", 270, True, "top1")
