"""Control head sets (core/stats/controls.py): matched, any-layer, counts, the upper bound; no model.

The reference draws come from the published closure results in tests/data/reference/.
"""

from __future__ import annotations

import json

import pytest

from core.errors import HeadLabError
from core.heads import HeadSet
from core.stats.controls import (ControlSets, any_layer_random_controls, count_any_layer_sets, count_matched_sets,
                                 matched_random_controls, upper_bound)
from tests.reference_data import CLOSURE


def test_matched_random_controls_respect_layers_disjointness_distinctness_and_seed():
    selection = HeadSet(((2, 1), (2, 5), (5, 0)))
    draws = matched_random_controls(selection, n_layers=8, n_heads=8, n_draws=25, seed=123)
    assert len(draws) == 25 and draws.note == ""
    assert len({d.heads for d in draws}) == 25
    for d in draws:
        assert d.count_per_layer() == {2: 2, 5: 1}
        assert not set(d.heads) & set(selection.heads)
    again = matched_random_controls(selection, 8, 8, 25, seed=123)
    assert [d.heads for d in again] == [d.heads for d in draws]
    other = matched_random_controls(selection, 8, 8, 25, seed=7)
    assert [d.heads for d in other] != [d.heads for d in draws]


def test_matched_draws_reproduce_the_reference_layer0_controls():
    """closure_test_olmo_cluster2 draws 5 L0 heads from the other 11 with RandomState(0)."""
    data = json.loads((CLOSURE / "olmo_1b_ising" / "closure_test.json").read_text())
    selection = HeadSet(tuple((0, h) for h in (0, 1, 2, 10, 13)))
    draws = matched_random_controls(selection, n_layers=16, n_heads=16, n_draws=5, seed=0)
    assert [[h for _, h in d] for d in draws] == [c["heads"] for c in data["matched_random_controls"]]


def test_any_layer_draws_reproduce_the_reference_natural_text_controls():
    data = json.loads((CLOSURE / "olmo_1b_nat_ising" / "closure_test.json").read_text())
    selection = HeadSet(tuple(tuple(h) for h in data["candidate_ablation"]["ablated_heads"]))
    draws = any_layer_random_controls(selection, n_layers=16, n_heads=16, n_draws=5, seed=0)
    assert [d.heads for d in draws] == [HeadSet(tuple(tuple(h) for h in c["heads"])).heads for c in data["controls"]]
    for d in draws:
        assert len(d) == len(selection) and not set(d.heads) & set(selection.heads)


def test_count_matched_sets_and_enumeration():
    assert count_matched_sets(HeadSet(((0, 0),)), n_heads=4) == 3
    assert count_matched_sets(HeadSet(((0, 0), (0, 1))), n_heads=4) == 1
    assert count_matched_sets(HeadSet(((0, 0), (1, 0), (1, 1))), n_heads=4) == 3
    assert count_matched_sets(HeadSet(((0, 0), (0, 1), (0, 2))), n_heads=4) == 0
    assert count_matched_sets(HeadSet(((3, 1), (3, 2))), n_heads=8) == 15
    selection = HeadSet(((0, 0), (1, 0), (1, 1)))
    draws = matched_random_controls(selection, n_layers=2, n_heads=4, n_draws=10)
    assert len(draws) == 3 and draws.n_possible == 3 and "only 3" in draws.note
    assert {d.heads for d in draws} == {((0, h), (1, 2), (1, 3)) for h in (1, 2, 3)}
    exact = matched_random_controls(selection, n_layers=2, n_heads=4, n_draws=3)
    assert len(exact) == 3 and exact.note == ""
    assert count_any_layer_sets(HeadSet(((0, 0),)), n_layers=1, n_heads=3) == 2
    small = any_layer_random_controls(HeadSet(((0, 0),)), n_layers=1, n_heads=3, n_draws=5)
    assert {d.heads for d in small} == {((0, 1),), ((0, 2),)} and "only 2" in small.note


def test_any_layer_controls_and_upper_bound():
    selection = HeadSet(((1, 0), (1, 1), (1, 2)))  # more than half of layer 1 of 4 heads
    with pytest.raises(HeadLabError, match="more than half.*any-layer"):
        matched_random_controls(selection, n_layers=3, n_heads=4, n_draws=5)
    draws = any_layer_random_controls(selection, n_layers=3, n_heads=4, n_draws=6, seed=1)
    assert len({d.heads for d in draws}) == 6
    for d in draws:
        assert len(d) == 3 and not set(d.heads) & set(selection.heads)
    assert upper_bound(HeadSet(((1, 0), (3, 2))), n_heads=2).heads == ((1, 0), (1, 1), (3, 0), (3, 1))


@pytest.mark.parametrize(
    "selection,match",
    [(HeadSet(), "empty"), (HeadSet(((5, 0),)), "outside this model"), (HeadSet(((0, 9),)), "outside this model")],
)
def test_bad_selections(selection, match):
    with pytest.raises(HeadLabError, match=match):
        matched_random_controls(selection, n_layers=4, n_heads=4, n_draws=3)
    with pytest.raises(HeadLabError, match=match):
        any_layer_random_controls(selection, n_layers=4, n_heads=4, n_draws=3)


def test_control_sets_json_keys_and_roundtrip():
    draws = matched_random_controls(HeadSet(((0, 0), (1, 0), (1, 1))), n_layers=2, n_heads=4, n_draws=10)
    data = json.loads(json.dumps(draws.to_json()))
    assert list(data) == ["kind", "sets", "seed", "n_requested", "n_possible", "note"]
    assert data["sets"][0] == [[0, 1], [1, 2], [1, 3]]
    back = ControlSets.from_json(data)
    assert back == draws and isinstance(back.sets[0], HeadSet)
