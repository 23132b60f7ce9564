"""Statistics of ablation deltas (core/stats/inference.py): z, rank and p, bootstrap, direction, verdicts.

Hand-made numbers, and the published closure statistics reproduced from tests/data/reference/
(tests/data/reference/README.md, section (a)); no model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.errors import HeadLabError
from core.stats.inference import (MIN_VERDICT_EXAMPLES, Verdict, below_minimum, bootstrap_ci, closure_verdict,
                                  empirical_rank_p, evidence_flags, format_rank_z, format_z, is_damaging,
                                  negligible_spread, recipe_verdict, verdict_tone, z_score)
from tests.reference_data import CLOSURE


def test_z_score_hand_made():
    assert z_score(3.0, [1.0, 2.0, 3.0]) == pytest.approx(1.0 / np.sqrt(2.0 / 3.0))
    assert z_score(1.5, [1.0, 1.0, 1.0]) is None  # no spread: no z (the reference's 1e-9 floor gave 5e8)
    assert z_score(1.5, [2.0]) is None  # one control: no spread by construction
    assert z_score(7.0, [6.84, 6.84 + 1e-8]) is None  # a spread of rounding size is no spread
    assert z_score(-1.0, [0.0, 2.0]) == pytest.approx(-2.0)
    with pytest.raises(HeadLabError):
        z_score(1.0, [])


def test_empirical_rank_p_hand_made():
    rp = empirical_rank_p(5.0, [1.0, 2.0, 5.0, 6.0], damage_sign=+1)
    assert (rp.rank, rp.p) == (3, pytest.approx(3 / 5))
    rp = empirical_rank_p(-0.5, [-0.1, -0.6, 0.0], damage_sign=-1)
    assert (rp.rank, rp.p) == (2, pytest.approx(2 / 4))
    rp = empirical_rank_p(19.0, list(range(19)), damage_sign=+1)
    assert (rp.rank, rp.p) == (1, pytest.approx(1 / 20))


def test_bootstrap_ci_hand_made():
    assert bootstrap_ci([0.25] * 30) == (pytest.approx(0.25), pytest.approx(0.25))
    deltas = np.array([0.0, 1.0] * 200)  # mean 0.5, standard error 0.5 / sqrt(400) = 0.025
    low, high = bootstrap_ci(deltas, n_boot=4000, seed=0)
    assert low == pytest.approx(0.5 - 1.96 * 0.025, abs=0.006)
    assert high == pytest.approx(0.5 + 1.96 * 0.025, abs=0.006)
    assert bootstrap_ci(deltas, seed=3) == bootstrap_ci(deltas, seed=3)
    narrow = bootstrap_ci(deltas, level=0.5, seed=0)
    assert low < narrow[0] < narrow[1] < high


def test_direction_checks():
    assert is_damaging("loss", 0.1) and not is_damaging("loss", -0.1)
    for metric in ("top1", "top5", "target_logit", "acc_top1", "mean_logit_B"):
        assert is_damaging(metric, -0.1) and not is_damaging(metric, 0.1)
    with pytest.raises(HeadLabError, match="not defined"):
        is_damaging("exact_match", 0.1)


def _recipe_case(n=19, cand_loss=1.0, cand_top1=-0.5, clean_top1=0.6, ub_top1=-0.58, best_control=0.18):
    controls = {"loss": list(np.linspace(0.0, best_control, n)), "top1": list(np.linspace(0.0, -0.05, n))}
    return recipe_verdict({"loss": cand_loss, "top1": cand_top1}, controls, clean_top1, {"top1": ub_top1})


def test_recipe_verdict_hand_made():
    assert _recipe_case().label == "causal"
    assert _recipe_case(best_control=1.2).label == "not causal"  # one control hurts the loss more
    assert _recipe_case(cand_top1=-0.01).label == "not causal"  # top-1 barely moves
    assert _recipe_case(ub_top1=-0.3).label == "not causal"  # upper bound removes only 50%
    assert _recipe_case(clean_top1=0.1, ub_top1=-0.1).label == "inconclusive"
    assert _recipe_case(n=18).label == "inconclusive"
    loose = recipe_verdict({"loss": 1.0, "top1": -0.5}, {"loss": [0.1] * 5, "top1": [0.0] * 5}, 0.6, {"top1": -0.58}, min_controls=5)
    assert loose.label == "causal" and "5" in loose.rule
    flat = recipe_verdict({"loss": 1.0, "top1": -0.5}, {"loss": [0.1] * 5, "top1": [0.0] * 5}, 0.6, {"top1": 0.001}, min_controls=5)
    assert "upper bound removes 0% of clean top-1 (< 90%)." in flat.reasons  # never "-0%"


def test_closure_verdict_hand_made():
    ctrl = {"loss": [0.0, 0.1, 0.2], "top1": [0.0, -0.01, -0.02], "target_logit": [0.0, -0.1, -0.2]}
    strong = {"loss": 1.0, "top1": -0.2, "target_logit": -2.0}
    assert closure_verdict(strong, ctrl).label == "pass"
    assert closure_verdict(strong, ctrl, rule="reference").label == "pass"
    assert closure_verdict(strong, ctrl, headline="loss").label == "pass"
    weak = {"loss": 0.15, "top1": -0.015, "target_logit": -0.15}  # damaging but inside the controls
    assert closure_verdict(weak, ctrl).label == "fail"
    assert "z_target_logit = -0.61 is not beyond -1.8." in closure_verdict(weak, ctrl).reasons
    assert "z_loss = +0.61 is not beyond +1.8." in closure_verdict(weak, ctrl, headline="loss").reasons
    assert closure_verdict(weak, ctrl, rule="reference").label == "fail"
    mixed = {"loss": 1.0, "top1": 0.05, "target_logit": -2.0}  # top-1 goes up: not every delta is damage
    assert closure_verdict(mixed, ctrl).label == "fail"
    wrong = {"loss": -1.0, "top1": -0.01, "target_logit": -0.1}
    verdict = closure_verdict(wrong, ctrl)
    assert verdict.label == "fails in the wrong direction" and "lowers the loss" in verdict.reasons[0]
    with pytest.raises(HeadLabError, match="does not define"):
        closure_verdict({"loss": 1.0}, {"loss": [0.0, 0.1]}, headline="logit")
    with pytest.raises(HeadLabError, match="not defined"):
        closure_verdict({"exact_match": -0.3}, {"exact_match": [0.0]})
    with pytest.raises(HeadLabError, match="rule"):
        closure_verdict(strong, ctrl, rule="vibes")


def test_format_z():
    assert format_z(None) == "n/a (degenerate)"
    assert format_z(-2.345) == "-2.35"


def test_closure_verdict_degenerate_controls_is_inconclusive():
    # induction-olmoe, any-layer: one control set exists; the candidate hurts the loss *less* than it
    cand = {"loss": 6.25, "top1": -0.6, "target_logit": -7.4}
    one = {"loss": [6.84], "top1": [-0.75], "target_logit": [-7.66]}
    for rule in ("paper", "reference"):
        verdict = closure_verdict(cand, one, rule=rule)
        assert verdict.label == "inconclusive"
        assert verdict.reasons[0].startswith("only 1 distinct control set was measured")
        assert "+6.25" not in verdict.reasons[1] and "-7.4" in verdict.reasons[1]  # the headline metric, logit
        assert verdict.z == {"loss": None, "top1": None, "target_logit": None}
    assert "only 2 distinct control sets were" in closure_verdict(cand, {m: v * 2 for m, v in one.items()}).reasons[0]
    # three distinct sets that change the headline metric alike: no spread and no z; the rank speaks, with its p
    flat = {"loss": [0.1, 0.2, 0.3], "top1": [0.0, -0.01, -0.02], "target_logit": [-0.5, -0.5, -0.5]}
    strong = {"loss": 1.0, "top1": -0.2, "target_logit": -2.0}
    verdict = closure_verdict(strong, flat)
    assert verdict.label == "pass" and "spread on target_logit is 0 or negligible" in verdict.reasons[0]
    assert "rank instead: 1 of 4, p = 0.25 (3 controls cannot reach p <= 0.05; 19 can)." in verdict.reasons[0]
    assert verdict.z["target_logit"] is None and verdict.z["loss"] == pytest.approx((1.0 - 0.2) / np.std([0.1, 0.2, 0.3]))
    assert closure_verdict(strong, flat, headline="loss").label == "pass"  # the loss spread is real
    assert closure_verdict(strong, flat, min_controls=4, headline="loss").label == "inconclusive"
    assert closure_verdict(strong, flat, min_controls=4).label == "inconclusive"  # too few sets, spread or none


def test_closure_verdict_zero_spread_takes_the_rules_limit_and_gives_rank_and_p():
    # a hand-wired model: 20 control sets leave the answer alone to rounding, the true circuit removes it
    flat = {"loss": [1e-7 * (i % 3) for i in range(20)], "top1": [0.0] * 20, "target_logit": [-1e-7] * 20}
    circuit = {"loss": 5.0, "top1": -0.9, "target_logit": -10.0}
    for rule in ("paper", "reference"):
        verdict = closure_verdict(circuit, flat, rule=rule)
        assert verdict.label == "pass", verdict.reasons
        assert verdict.z["target_logit"] is None
        assert verdict.reasons[0].endswith("no z is shown; the verdict reads the rank instead: 1 of 21, p = 0.0476.")
    # a group that does nothing beyond the controls: beyond them only by rounding, or not damage at all
    assert closure_verdict({**circuit, "target_logit": -1e-7 - 1e-9}, flat).label == "fail"
    assert closure_verdict({**circuit, "target_logit": -1e-7 - 1e-9}, flat).reasons[-1].endswith("more than rounding.")
    idle = closure_verdict({"loss": 0.0, "top1": 0.0, "target_logit": 0.0}, {**flat, "target_logit": [-11.5] * 20})
    assert idle.label == "fail" and "loss delta +0 is not damage." in idle.reasons
    # 9 controls (a 2 x 4 model's matched sets for one head per layer): the same limit, and the p it cannot reach
    few = closure_verdict(circuit, {m: v[:9] for m, v in flat.items()})
    assert few.label == "pass" and "1 of 10, p = 0.1 (9 controls cannot reach p <= 0.05; 19 can)." in few.reasons[0]


def _reference_deltas(baseline: dict, candidate: dict, controls: list[dict], metrics: dict[str, str]):
    cand = {ours: candidate[theirs] - baseline[theirs] for ours, theirs in metrics.items()}
    ctrl = {ours: [c[theirs] - baseline[theirs] for c in controls] for ours, theirs in metrics.items()}
    return cand, ctrl


def test_reference_olmo_natural_text_passes():
    data = json.loads((CLOSURE / "olmo_1b_nat_ising" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "target_logit": "mean_logit_target"}
    cand, ctrl = _reference_deltas(data["baseline"], data["candidate_ablation"], data["controls"], metrics)
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert z["loss"] == pytest.approx(36.44, abs=0.005)
    assert z["top1"] == pytest.approx(-50.59, abs=0.005)
    assert z["target_logit"] == pytest.approx(-50.93, abs=0.005)
    assert z["loss"] == pytest.approx(data["summary"]["z_dloss"], abs=1e-6)
    assert closure_verdict(cand, ctrl).label == "pass"
    assert closure_verdict(cand, ctrl, rule="reference").label == "pass"
    assert empirical_rank_p(cand["loss"], ctrl["loss"], +1).rank == 1


def test_reference_olmo_synthetic_passes():
    data = json.loads((CLOSURE / "olmo_1b_ising" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "top5": "acc_top5", "target_logit": "mean_logit_B"}
    cand, ctrl = _reference_deltas(data["baseline"], data["ablate_cluster2"], data["matched_random_controls"], metrics)
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert round(z["loss"], 2) == 1.83
    assert round(z["top1"], 2) == -1.97
    assert round(z["top5"], 2) == -2.13
    assert round(z["target_logit"], 2) == -2.68
    verdict = closure_verdict(cand, ctrl)
    assert verdict.label == "pass" and "paper" in verdict.rule
    assert closure_verdict(cand, ctrl, headline="loss").label == "pass"
    assert closure_verdict(cand, ctrl, rule="reference").label == "pass"


def test_reference_olmoe_route_conditional_fails_in_the_wrong_direction():
    data = json.loads((CLOSURE / "olmoe_route_conditioned" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "target_logit": "mean_logit_target"}
    split = "cluster1"
    cand, ctrl = _reference_deltas(
        data["baseline"][split], data["candidate_ablation"][split], [c[split] for c in data["controls"]], metrics
    )
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert round(z["loss"], 2) == -5.64
    assert round(z["top1"], 2) == -0.22
    assert round(z["target_logit"], 2) == -2.97
    assert z["loss"] == pytest.approx(data["summary"]["z_candidate_vs_controls_cluster1"], abs=1e-6)
    for rule in ("paper", "reference"):
        assert closure_verdict(cand, ctrl, rule=rule).label == "fails in the wrong direction"


def test_verdict_json_keys_and_roundtrip():
    ctrl = {"loss": [0.0, 0.1, 0.2], "top1": [0.0, -0.01, -0.02], "target_logit": [0.0, -0.1, -0.2]}
    verdict = closure_verdict({"loss": 1.0, "top1": -0.2, "target_logit": -2.0}, ctrl)
    data = json.loads(json.dumps(verdict.to_json()))
    assert list(data) == ["label", "rule", "reasons", "z"] and isinstance(data["reasons"], list)
    assert Verdict.from_json(data) == verdict
    assert Verdict.from_json({"label": "pass", "rule": "r"}) == Verdict("pass", "r")  # older files: no reasons, no z


def test_a_verdict_from_too_few_examples_is_inconclusive():
    from_one = below_minimum(Verdict("pass", "paper", ("every delta is damage",)), n_examples=1)
    assert from_one.label == "inconclusive" and from_one.rule == "paper"
    assert from_one.reasons[0].startswith("only 1 example: a verdict needs at least 10") and "'pass'" in from_one.reasons[0]
    assert from_one.reasons[1:] == ("every delta is damage",)
    assert below_minimum(Verdict("causal", "recipe"), n_examples=MIN_VERDICT_EXAMPLES).label == "causal"
    assert below_minimum(Verdict("not causal", "recipe"), n_examples=9).label == "inconclusive"
    already = below_minimum(Verdict("inconclusive", "recipe", ("only 2 control draws ran",)), n_examples=1)
    assert already.label == "inconclusive" and already.reasons[1] == "only 2 control draws ran"
    assert already.reasons[0].startswith("only 1 example: a verdict needs at least 10;")  # the minimum is stated too


def test_no_z_where_the_controls_spread_is_negligible_beside_the_delta():
    # the newcomer's tour: controls at -0.00004 +- 0.000005, candidate +5.569 -> z was printed +1.08e+06
    controls = [-0.00004 - 0.000005, -0.00004 + 0.000005] * 10
    assert np.std(controls) == pytest.approx(5e-6) and negligible_spread(5.569, controls)
    assert z_score(5.569, controls) is None
    # the rule's edge: |delta - mean| > 1000 sd hides the z, up to 1000 sd it is shown
    around = [-1.0, 1.0]  # mean 0, sd 1
    assert z_score(999.0, around) == pytest.approx(999.0) and z_score(1001.0, around) is None
    assert z_score(-1001.0, around) is None
    text = format_rank_z(1, 1 / 21, 20, z_score(5.569, controls))
    assert text.startswith("rank 1 of 21, p = 0.0476; z n/a (degenerate)") and "[no z: the controls' spread" in text
    assert "1e+06" not in text and "z unreliable" not in text


def test_closure_with_a_negligible_spread_reads_the_rank():
    controls = {"loss": [-0.00004 - 0.000005, -0.00004 + 0.000005] * 10, "top1": [0.0, -0.01] * 10,
                "target_logit": [0.001, -0.001] * 10}
    verdict = closure_verdict({"loss": 5.569, "top1": -0.5, "target_logit": -4.0}, controls, headline="loss")
    assert verdict.label == "pass" and verdict.z["loss"] is None
    assert "spread on loss is 0 or negligible" in verdict.reasons[0] and "1 of 21, p = 0.0476." in verdict.reasons[0]


def test_evidence_flags_and_tone_are_the_clis_rules():
    assert evidence_flags(20, 2.5) == ()
    assert evidence_flags(12, 2.5) == ("inconclusive: 12 controls cannot reach p < 0.05; the smallest p is 1/13, "
                                       "use at least 19",)
    three = evidence_flags(3, 4.0)
    assert three[0] == "z unreliable: fewer than 10 controls" and three[1].startswith("inconclusive: 3 controls")
    assert evidence_flags(3, None)[0].startswith("no z:") and len(evidence_flags(3, None)) == 2
    assert evidence_flags(3) == three  # no z in question: the control-count flags alone
    # a closure pass from 3 controls (p = 0.25) is not shown as a success: the CLI calls that inconclusive
    assert verdict_tone("pass", 3) == "caution" and verdict_tone("pass", 19) == "good"
    assert verdict_tone("causal", 20) == "good" and verdict_tone("inconclusive", 50) == "caution"
    assert verdict_tone("fail", 3) == verdict_tone("not causal", 20) == verdict_tone("fails in the wrong direction", 20) == "bad"
