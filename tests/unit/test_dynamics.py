"""Known-answer tests of training dynamics on hand-made arrays: core/stats/dynamics.py (threshold
crossing, PR rise, Jaccard, identification, timing, form/function labels, seed specificity), the
result types of core/pipelines/dynamics.py built by hand, and the figure builders on the same inputs.
No model runs here; the drivers are tested on tiny fake zoo models in tests/integration/test_dynamics.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.errors import HeadLabError
from core.heads import HeadSet
from core.pipelines.dynamics import (DataShift, FormFunction, Trajectories, continuations, data_shift_jaccard,
                                     seed_peers)
from core.stats.dynamics import (
    HeadTiming,
    Identification,
    Mark,
    circuits_by_checkpoint,
    earliest_identifying_checkpoint,
    form_function_labels,
    jaccard,
    pr_rise,
    running_minimum,
    seed_specificity,
    threshold_crossing,
    timing_events,
)

TOKENS = [0, 10, 100, 1000, 2000, 4000]


# ---------------------------------------------------------------------------------------------
# threshold crossing and PR rise


def test_threshold_crossing_first_checkpoint_at_or_above():
    # 12.5 is reached exactly at index 2 (>=), later values do not matter
    assert threshold_crossing(TOKENS, [1, 5, 12.5, 20, 3, 40], 12.5) == Mark(2, 100.0)
    assert threshold_crossing(TOKENS, [1, 5, 12.4, 20, 3, 40], 12.5) == Mark(3, 1000.0)


def test_threshold_crossing_never_and_nan():
    assert threshold_crossing(TOKENS, [1, 2, 3, 4, 5, 6], 50) == Mark(None, None)
    assert threshold_crossing(TOKENS, [np.nan, np.nan, 60, 1, 1, 1], 50) == Mark(2, 100.0)


def test_threshold_crossing_rejects_bad_input():
    with pytest.raises(HeadLabError, match="one value per checkpoint"):
        threshold_crossing([0, 1, 2], [1, 2], 1)
    with pytest.raises(HeadLabError, match="sorted"):
        threshold_crossing([0, 100, 10], [1, 2, 3], 1)


def test_running_minimum_skips_nan():
    np.testing.assert_array_equal(running_minimum([6, 3, np.nan, 4, 1, 2]), [6, 3, 3, 3, 1, 1])
    assert np.isnan(running_minimum([np.nan, 2])[0])


def test_pr_rise_counts_from_the_bottom_of_the_dip():
    # running minimum [6, 3, 1.2, 1.2, 1.2, 1.2]; PR - minimum [0, 0, 0, 0.3, 0.6, 2.8] -> index 4 at margin 0.5
    pr = [6.0, 3.0, 1.2, 1.5, 1.8, 4.0]
    assert pr_rise(TOKENS, pr, 0.5) == Mark(4, 2000.0)
    assert pr_rise(TOKENS, pr, 0.25) == Mark(3, 1000.0)
    assert pr_rise(TOKENS, pr, 3.0) == Mark(None, None)


def test_pr_rise_margin_is_inclusive_and_positive():
    assert pr_rise([1, 2, 3], [2.0, 1.0, 1.5], 0.5) == Mark(2, 3.0)
    assert pr_rise([1, 2, 3], [1.0, 2.0, 3.0], 1.0) == Mark(1, 2.0)  # a monotone rise from the start
    assert pr_rise([1, 2, 3], [3.0, 2.0, 1.0], 0.1) == Mark(None, None)  # only falls: never rises
    with pytest.raises(HeadLabError, match="positive"):
        pr_rise([1, 2], [1, 2], 0.0)


# ---------------------------------------------------------------------------------------------
# Jaccard, circuits, identification


def test_jaccard_known_values():
    a = [(1, 1), (1, 2), (1, 3)]
    b = [(1, 2), (1, 3), (1, 4)]
    assert jaccard(a, b) == 0.5  # 2 shared of 4
    assert jaccard(a, a) == 1.0
    assert jaccard([], []) == 1.0
    assert jaccard([], [(0, 0)]) == 0.0
    assert jaccard(HeadSet(((0, 1),)), [(0, 1), (0, 1)]) == 1.0  # duplicates do not count twice


def test_circuits_by_checkpoint_uses_at_least_threshold():
    membership = np.zeros((2, 2, 3))  # [checkpoint, layer, head]
    membership[0, 1, 2] = 12.5
    membership[1, 0, 0] = 12.4
    membership[1, 1, 1] = 50.0
    circuits = circuits_by_checkpoint(membership, 12.5)
    assert circuits == (HeadSet(((1, 2),)), HeadSet(((1, 1),)))


def test_earliest_identifying_checkpoint_first_and_stable():
    A, B = (1, 1), (1, 2)
    circuits = [[], [A], [A, B], [A], [A, B], [A, B]]
    ident = earliest_identifying_checkpoint(TOKENS, circuits)
    assert ident.jaccards == (0.0, 0.5, 1.0, 0.5, 1.0, 1.0)
    assert ident.first == Mark(2, 100.0) and ident.first_fraction == pytest.approx(100 / 4000)
    assert ident.stable == Mark(4, 2000.0) and ident.stable_fraction == pytest.approx(0.5)
    assert ident.sizes == (0, 1, 2, 1, 2, 2)
    assert ident.final_circuit == HeadSet((A, B))
    again = Identification.from_json(ident.to_json())
    assert again == ident


def test_earliest_identifying_checkpoint_against_another_reference():
    A, B = (1, 1), (1, 2)
    ident = earliest_identifying_checkpoint([1, 2, 3], [[A], [A], [A, B]], final=[A])
    assert ident.first == Mark(0, 1.0) and ident.stable == Mark(None, None) and ident.stable_fraction is None
    assert ident.first_fraction == pytest.approx(1 / 3)


def test_no_final_circuit_is_never_identified():
    # no head ever joins: an empty set "matching" the empty final set from 0 tokens is no finding
    ident = earliest_identifying_checkpoint([0, 10, 20], [[], [], []])
    assert ident.first == ident.stable == Mark(None, None)
    assert ident.first_fraction is None and ident.stable_fraction is None
    assert ident.final_circuit == HeadSet()


def test_earliest_identifying_checkpoint_rejects_mismatch():
    with pytest.raises(HeadLabError, match="one circuit per checkpoint"):
        earliest_identifying_checkpoint([1, 2], [[(0, 0)]])


# ---------------------------------------------------------------------------------------------
# timing over heads


def _toy_trajectories() -> tuple[np.ndarray, np.ndarray]:
    """pr, membership [checkpoint 6, layer 2, head 2]; L1H0 rises at 100 tokens and crosses at 2000."""
    pr = np.ones((6, 2, 2))
    membership = np.ones((6, 2, 2))
    pr[:, 1, 0] = [5.0, 1.1, 2.0, 3.0, 4.0, 4.0]  # min 1.1 at index 1, +0.9 at index 2
    membership[:, 1, 0] = [1, 1, 2, 8, 20, 30]  # >= 12.5 at index 4
    pr[:, 1, 1] = [2.0, 2.0, 2.0, 2.0, 2.0, 3.0]  # rises only at index 5
    membership[:, 1, 1] = [1, 1, 20, 30, 30, 30]  # crosses at index 2: after-the-fact rise
    return pr, membership


def test_timing_events_and_lead():
    pr, membership = _toy_trajectories()
    first, second = timing_events(TOKENS, pr, membership, [(1, 0), (1, 1)], threshold=12.5, margin=0.5)
    assert first.rise == Mark(2, 100.0) and first.crossing == Mark(4, 2000.0)
    assert first.rise_first and first.lead_decades == pytest.approx(math.log10(20))
    assert second.rise == Mark(5, 4000.0) and second.crossing == Mark(2, 100.0)
    assert not second.rise_first and second.lead_decades == pytest.approx(math.log10(100 / 4000))
    assert HeadTiming.from_json(first.to_json()) == first


def test_timing_without_rise_or_crossing_has_no_lead():
    timing = HeadTiming((0, 0), Mark(None, None), Mark(3, 10.0))
    assert timing.lead_decades is None and not timing.rise_first
    at_zero = HeadTiming((0, 0), Mark(0, 0.0), Mark(3, 10.0))
    assert at_zero.lead_decades is None and at_zero.rise_first  # 0 tokens has no logarithm


def test_trajectories_roundtrip_and_derived_figures():
    pr, membership = _toy_trajectories()
    traj = Trajectories("toy", {"task": "induction"}, tuple(f"r{i}" for i in range(6)), tuple(map(float, TOKENS)),
                        pr, membership, 12.5)
    assert traj.final_circuit == HeadSet(((1, 0), (1, 1)))
    assert traj.identification().first == Mark(4, 2000.0)  # both heads members from index 4 on
    assert [t.head for t in traj.timing()] == [(1, 0), (1, 1)]
    again = Trajectories.from_json(traj.to_json())
    np.testing.assert_array_equal(again.pr, pr)
    np.testing.assert_array_equal(again.membership, membership)
    assert again.tokens == traj.tokens and again.induction_threshold == 12.5


def test_data_shift_jaccard_final_and_per_checkpoint():
    pr = np.ones((3, 2, 2))
    base_m = np.zeros((3, 2, 2))
    base_m[-1, 1, 0] = base_m[-1, 1, 1] = 20  # base final circuit {L1H0, L1H1}
    shifted_m = np.zeros((3, 2, 2))
    shifted_m[0, 1, 0] = shifted_m[0, 1, 1] = 20  # starts identical
    shifted_m[1, 1, 0] = 20  # loses L1H1
    shifted_m[2, 1, 0] = shifted_m[2, 0, 1] = 20  # {L1H0, L0H1}: 1 shared of 3
    base = Trajectories("base", {}, ("a", "b", "c"), (1.0, 2.0, 3.0), pr, base_m, 12.5)
    shifted = Trajectories("shifted", {}, ("x", "y", "z"), (0.0, 5.0, 9.0), pr, shifted_m, 12.5)
    shift = data_shift_jaccard(base, shifted)
    assert shift.jaccards == (1.0, 0.5, pytest.approx(1 / 3))
    assert shift.jaccard == pytest.approx(1 / 3)
    assert DataShift.from_json(shift.to_json()) == shift
    other = Trajectories("other", {}, ("x",), (1.0,), np.ones((1, 3, 2)), np.zeros((1, 3, 2)), 12.5)
    with pytest.raises(HeadLabError, match="differ in shape"):
        data_shift_jaccard(base, other)


# ---------------------------------------------------------------------------------------------
# form/function and seed specificity


def test_form_function_labels():
    labels = form_function_labels([True, False, True, False], [True, True, False, False])
    assert labels == ("form and function", "function without form", "form without function", "neither")
    with pytest.raises(HeadLabError):
        form_function_labels([True], [True, False])


def test_form_function_flags_and_counts():
    cells = ({"closure_verdict": "pass"}, {"closure_verdict": "fail"}, {"closure_verdict": "pass"})
    ff = FormFunction("m", HeadSet(((1, 0),)), ("a", "b", "c"), (1.0, 2.0, 3.0), (1.0, 30.0, 40.0), cells, 12.5, {})
    assert ff.form == (False, True, True) and ff.function == (True, False, True)
    assert ff.counts() == {"form and function": 1, "function without form": 1, "form without function": 1, "neither": 0}
    assert FormFunction.from_json(ff.to_json()).labels == ff.labels


def _cell(z: float, delta: float) -> dict:
    return {"loss": {"z": z, "candidate_delta": delta}}


def test_seed_specificity_splits_diagonal_and_medians():
    cells = [[_cell(10, 4.0), _cell(0.5, 0.1), None],
             [_cell(-1.0, 0.0), _cell(8, 3.0), _cell(2.5, 1.0)],
             [_cell(0.0, 0.2), {"loss": {"z": None, "candidate_delta": 1}}, _cell(12, 5.0)]]
    spec = seed_specificity(cells)
    assert sorted(spec["diagonal_z"]) == [8, 10, 12]
    assert sorted(spec["off_diagonal_z"]) == [-1.0, 0.0, 0.5, 2.5]
    assert spec["median_diagonal_z"] == 10 and spec["median_off_diagonal_z"] == 0.25
    assert spec["median_diagonal_delta"] == 4.0 and spec["median_off_diagonal_delta"] == pytest.approx(0.15)
    with pytest.raises(HeadLabError, match="square"):
        seed_specificity([[None, None]])
    assert seed_specificity([[None]])["median_diagonal_z"] is None


# ---------------------------------------------------------------------------------------------
# figure builders (core/figures/dynamics.py) on the same hand-made inputs


def test_timing_figure_marks_rise_and_crossing():
    from core.figures.dynamics import timing_figure

    pr, membership = _toy_trajectories()
    traj = Trajectories("toy", {}, tuple(f"r{i}" for i in range(6)), tuple(map(float, TOKENS)), pr, membership, 12.5)
    bundle = timing_figure(traj, [(1, 0)], margin=0.5)
    marks = {t.marker.symbol: (t.x[0], t.y[0]) for t in bundle.figure.data if t.mode == "markers"}
    assert marks["triangle-up"] == (100.0, 2.0)  # PR rise of L1H0 at index 2
    assert marks["star"] == (2000.0, 20.0)  # crossing at index 4
    lines = [t for t in bundle.figure.data if t.mode == "lines"]
    assert list(lines[0].x) == TOKENS[1:]  # 0 tokens has no place on the log axis
    assert "step" not in bundle.caption and "r0" in bundle.caption
    assert sum(r["pr_rise"] for r in bundle.rows) == 1 and sum(r["threshold_crossing"] for r in bundle.rows) == 1


def test_identification_and_cross_seed_figures():
    from core.pipelines.dynamics import CrossSeedMatrix
    from core.figures.dynamics import cross_seed_figure, identification_figure

    A, B = (1, 1), (1, 2)
    ident = earliest_identifying_checkpoint(TOKENS, [[], [A], [A, B], [A], [A, B], [A, B]])
    bundle = identification_figure([("toy", ident)])
    line = bundle.figure.data[0]
    assert list(line.y) == [0.5, 1.0, 0.5, 1.0, 1.0]
    assert bundle.figure.data[1].x[0] == pytest.approx(100 / 4000)
    cells = ((_cell(10, 4.0), _cell(0.5, 0.1)), (None, _cell(8, 3.0)))
    matrix = CrossSeedMatrix(("a", "b"), ("L1H1", "L1H2"), cells, (("", ""), ("no circuit", "")), {"n_controls": 5})
    heat = cross_seed_figure(matrix).figure.data[0]
    assert list(heat.z[0]) == [10, 0.5] and heat.z[1][0] is None and heat.z[1][1] == 8
    assert heat.text[1][0] == "—"


def test_form_function_and_closure_split_figures():
    from core.figures.dynamics import closure_splits_figure, form_function_figure

    cells = ({"closure_verdict": "pass", "target_logit": {"z": -5.0}}, {"closure_verdict": "fail", "target_logit": {"z": 0.5}})
    ff = FormFunction("m", HeadSet(((1, 0),)), ("a", "b"), (1.0, 2.0), (2.0, 30.0), cells, 12.5, {"n_controls": 5})
    bundle = form_function_figure(ff)
    named = {t.name: (list(t.x), list(t.y)) for t in bundle.figure.data if t.mode == "markers"}
    assert named["function without form (1)"] == ([2.0], [-5.0])
    assert named["form without function (1)"] == ([30.0], [0.5])
    summary = {"candidate": ["L0H1"], "closure": [{"kind": "matched", "split": "all", "n": 8, "verdict_paper": "fail",
                                                   "verdict_reference": "fail",
                                                   "delta": {m: 0.1 for m in ("loss", "top1", "top5", "target_logit")},
                                                   "z": {"loss": 1.0, "top1": -2.0, "top5": 0.0, "target_logit": -3.0}}]}
    bars = closure_splits_figure("m", summary).figure.data[0]
    assert list(bars.y) == [1.0, -2.0, 0.0, -3.0]


def _manifest(family: str, task: str, n_heads: int = 4, init_from: str | None = None, **model) -> dict:
    return {"family": family, "task": task,
            "config": {"model": {"family": family, "n_layers": 2, "n_heads": n_heads, "n_kv_heads": None, **model},
                       "train": {"seed": 0, "init_from": init_from}}}


def test_seed_peers_and_continuations_from_manifests():
    manifests = {
        "induction-neox": _manifest("gpt_neox", "induction"),
        "induction-neox-s1": {**_manifest("gpt_neox", "induction"), "config": {  # an older manifest: no n_kv_heads key
            "model": {"family": "gpt_neox", "n_layers": 2, "n_heads": 4}, "train": {"seed": 1}}},
        "induction-olmoe": _manifest("olmoe", "induction"),  # same shape, another architecture
        "duplicate-neox": _manifest("gpt_neox", "duplicate"),  # same architecture, another task
        "induction-neox-wide": _manifest("gpt_neox", "induction", d_model=128),
        "induction-neox-shifted": _manifest("gpt_neox", "induction", init_from="induction-neox"),
    }
    assert seed_peers("induction-neox", manifests) == ["induction-neox-s1"]
    assert seed_peers("duplicate-neox", manifests) == []
    assert seed_peers("not-in-the-zoo", manifests) == []
    assert continuations("induction-neox", manifests) == ["induction-neox-shifted"]
    assert continuations("duplicate-neox", manifests) == []  # never the unrelated induction-olmoe
