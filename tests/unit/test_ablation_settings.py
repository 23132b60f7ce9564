"""AblationSettings (validation, hashing, JSON), the per-example damage and worst examples; no model."""

from __future__ import annotations

import json

import pytest

from core.ablation.spec import ConditionMetrics
from core.ablation.study import AblationSettings, example_damage, worst_examples
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
