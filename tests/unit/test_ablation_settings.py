"""AblationSettings (validation, hashing, JSON), the per-example damage, worst examples and the lab's probe-size
proposal; no model."""

from __future__ import annotations

import json

import pytest

from core.ablation.spec import ConditionMetrics
from core.ablation.study import AblationSettings, example_damage, propose_probe_size, study_seconds, worst_examples
from core.errors import HeadLabError


def test_settings_defaults_hash_and_json_roundtrip():
    default = AblationSettings()
    assert (default.n_controls, default.controls, default.mode, default.seed) == (20, "matched", "zero", 123)
    assert default.metrics == ("loss", "top1", "top5", "target_logit")
    same = AblationSettings(n_controls=20.0, metrics=["loss", "acc_top1", "top5", "mean_logit_B"])  # coerced, canonical
    assert same == default and hash(same) == hash(default)
    assert len({default, same, AblationSettings(seed=7)}) == 2  # usable as a cache key
    other = AblationSettings(n_controls=5, controls="any-layer", mode="mean", metrics=("loss",), chunk_size=2)
    data = json.loads(json.dumps(other.to_json()))
    assert data["metrics"] == ["loss"] and data["controls"] == "any-layer" and data["chunk_size"] == 2
    assert AblationSettings.from_json(data) == other
    assert AblationSettings.from_json({"n_controls": 3}) == AblationSettings(n_controls=3)


@pytest.mark.parametrize("kwargs,match", [
    ({"controls": "nearby"}, "control kind 'nearby'"),
    ({"mode": "median"}, "ablation mode 'median'"),
    ({"mode": "reference-slice"}, "ablation mode 'reference-slice' is not one of a probe's"),
    ({"metrics": ("loss", "exact_match")}, "metric 'exact_match' is not defined"),
    ({"metrics": ()}, "metrics is empty"),
    ({"n_controls": 0}, "n_controls is 0"),
    ({"n_boot": 0}, "n_boot is 0"),
    ({"chunk_size": 0}, "chunk_size is 0"),
    ({"z_threshold": -1.8}, "z_threshold is -1.8"),
    ({"min_controls": 0}, "min_controls is 0"),
    ({"min_clean_top1": 1.5}, "min_clean_top1 is 1.5"),
    ({"min_upper_bound_fraction": -0.1}, "min_upper_bound_fraction is -0.1"),
])
def test_settings_name_the_bad_argument(kwargs, match):
    with pytest.raises(HeadLabError, match=match):
        AblationSettings(**kwargs)


def _metrics(label: str, loss, top1) -> ConditionMetrics:
    return ConditionMetrics(label, None, loss, top1, top1, [0.0] * len(loss))


def test_example_damage_is_signed_so_positive_is_worse():
    clean = _metrics("clean", [1.0, 1.0, 1.0], [1.0, 1.0, 0.0])
    ablated = _metrics("cand", [1.5, 0.5, 3.0], [0.0, 1.0, 0.0])
    assert example_damage(clean, ablated, "loss").tolist() == [0.5, -0.5, 2.0]
    assert example_damage(clean, ablated, "top1").tolist() == [1.0, 0.0, 0.0]  # losing top-1 is damage
    assert example_damage(clean, ablated, "acc_top1").tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(HeadLabError, match="not defined"):
        example_damage(clean, ablated, "exact_match")


def test_worst_examples_worst_first_and_stable():
    damage = [0.5, 2.0, -1.0, 2.0, 0.0]
    assert worst_examples(damage, 2) == [1, 3]  # ties keep example order
    assert worst_examples(damage, 3) == [1, 3, 0]
    assert worst_examples(damage, None) == [1, 3, 0, 4, 2]
    assert worst_examples(damage, 10) == [1, 3, 0, 4, 2]


def test_study_seconds_counts_the_clean_forward_unless_kept_and_each_conditions_replay():
    # 0.1 s per example, 8 examples, 22 conditions replaying half the blocks: 0.8 * (1 + 11) = 9.6 s, kept 8.8 s
    assert study_seconds(0.1, 8, 22, 0.5, clean_kept=False) == pytest.approx(9.6)
    assert study_seconds(0.1, 8, 22, 0.5, clean_kept=True) == pytest.approx(8.8)


def test_probe_size_proposal_fewer_examples_first_then_shorter_sequences_where_the_length_is_free():
    def proportional(per_example_64):  # seconds of one example, proportional to its length
        return lambda length: per_example_64 * length / 64
    # a study costs per_example * n * 11 (clean 1 + 20 conditions * 0.5): 0.01 s/example fits 64 examples in 10 s
    fast = propose_probe_size(proportional(0.01), 256, 64, 20, 0.5, clean_kept=False, free_length=True)
    assert (fast.n_examples, fast.seq_len, fast.fits) == (64, 64, True) and fast.seconds == pytest.approx(7.04)
    # 0.14 s per example of 64 tokens: 8 examples take 12.32 s; at 48 tokens 9.24 s, the longest that fits
    asked = []
    slow = propose_probe_size(lambda t: asked.append(t) or 0.14 * t / 64, 8, 64, 20, 0.5, clean_kept=False,
                              free_length=True)
    assert (slow.n_examples, slow.seq_len, slow.fits) == (8, 48, True) and slow.seconds == pytest.approx(9.24)
    assert sorted(set(asked), reverse=True) == [64, 56, 48]  # shorter lengths timed only as far as needed
    # the same where the length is fixed (IOI's templates): the fewest examples, not fitting
    fixed = propose_probe_size(proportional(0.14), 8, 64, 20, 0.5, clean_kept=False, free_length=False)
    assert (fixed.n_examples, fixed.seq_len, fixed.fits) == (8, 64, False) and fixed.seconds == pytest.approx(12.32)
    # a kept clean run counts only for the probe now: 8 x 64 kept is 11.2 s, still over; 8 x 56 with its own run 10.78
    kept = propose_probe_size(proportional(0.14), 8, 64, 20, 0.5, clean_kept=True, free_length=True)
    assert (kept.n_examples, kept.seq_len) == (8, 48)
    # a forward that is not proportional to its length (a fixed part): the timing decides, not the proportion
    fixed_part = propose_probe_size(lambda t: 0.07 + 0.07 * t / 64, 8, 64, 20, 0.5, clean_kept=False, free_length=True)
    assert fixed_part.seq_len == 32 and fixed_part.seconds == pytest.approx(0.105 * 8 * 11)
    hopeless = propose_probe_size(proportional(10.0), 8, 64, 20, 0.5, clean_kept=False, free_length=True)
    assert (hopeless.n_examples, hopeless.seq_len, hopeless.fits) == (8, 64, False)
