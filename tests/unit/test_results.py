"""The result-dataclass JSON helper: round trips on hand-made results, and provenance."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest

from core.results import JsonResult, dumps, jsonable, package_versions, provenance


@dataclass(frozen=True)
class Inner(JsonResult):
    name: str
    heads: tuple[tuple[int, int], ...]


@dataclass(frozen=True, eq=False)
class Outer(JsonResult):
    J: np.ndarray
    order: np.ndarray = field(metadata={"dtype": "int64"})
    composition: dict[int, dict[str, int]] = field(default_factory=dict)
    inner: Optional[Inner] = None
    scores: list[float] = field(default_factory=list)
    added_later: float = 0.5


def test_round_trip_keeps_types_and_values():
    original = Outer(J=np.array([[0.0, 1.5], [1.5, 0.0]]), order=np.array([2, 0, 1]),
                     composition={3: {"induction": 2}}, inner=Inner("c", ((1, 2), (0, 3))), scores=[0.25, np.float64(1.0)])
    data = json.loads(dumps(original.to_json()))
    assert data["composition"] == {"3": {"induction": 2}}
    back = Outer.from_json(data)
    assert np.array_equal(back.J, original.J) and back.J.dtype == np.float64
    assert back.order.dtype == np.int64 and back.order.tolist() == [2, 0, 1]
    assert back.composition == {3: {"induction": 2}}
    assert back.inner == Inner("c", ((1, 2), (0, 3)))
    assert back.scores == [0.25, 1.0]


def test_missing_field_takes_default_and_missing_required_field_is_named():
    data = Outer(J=np.zeros((1, 1)), order=np.zeros(1, dtype=int)).to_json()
    del data["added_later"]
    assert Outer.from_json(data).added_later == 0.5
    del data["J"]
    with pytest.raises(KeyError, match="'J'"):
        Outer.from_json(data)


def test_jsonable_handles_numpy_scalars_sets_and_nested_keys():
    assert jsonable({(1): np.int64(3), "s": {3, 1}}) == {"1": 3, "s": [1, 3]}
    assert isinstance(jsonable(np.float32(0.5)), float)


def test_provenance_drops_none_and_records_versions():
    record = provenance(model="m", revision=None)
    assert record["model"] == "m" and "revision" not in record
    assert set(package_versions()) >= {"headlab", "torch", "numpy"}
    assert record["versions"]["headlab"] == package_versions()["headlab"]
