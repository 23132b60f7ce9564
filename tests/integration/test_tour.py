"""The README tour's key claims hold on the quick zoo the test suite trains (one thread per model, as
`make app` trains it): the candidate induction circuit, the previous-token circuit, the spectral top
six as a set, and the recipe's verdict, against docs/measurements/tour-recipe.json.

Exact figures (deltas, the spectral order) may differ on another CPU (docs/zoo.md); the README marks
them as one machine's and quotes these claims as what holds everywhere. The recipe run is the one
test_screen_zoo.py makes (the same arguments), so its passes come from the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.model.refs import ModelRef
from core.pipelines.recipe import run_recipe
from core.tasks.specs import probe_spec

pytestmark = pytest.mark.zoo

TOUR = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "tour-recipe.json"


def test_the_quick_zoo_gives_the_tours_circuits_and_verdict(quick_zoo):
    tour = json.loads(TOUR.read_text())
    out = run_recipe(ModelRef.parse(tour["model"]), probe_spec("induction"), n_controls=20)
    assert out["screen"]["candidate_circuit"] == tour["screen"]["candidate_circuit"]
    assert out["screen"]["previous_token_circuit"] == tour["screen"]["previous_token_circuit"]
    assert set(out["screen"]["top_k_spectral"][:6]) == set(tour["screen"]["top_k_spectral"][:6])
    assert out["candidate"]["summary"]["selection"] == tour["candidate"]["summary"]["selection"]
    assert out["verdict"]["label"] == tour["verdict"]["label"] == "causal"
