"""The Training dynamics page on the quick zoo (AppTest, no browser): its figures hold exactly what
core/pipelines/dynamics.py returns, the margin moves the PR-rise marks, the cross-seed and form-vs-function
buttons run the ablation engine in place, and a text probe gets a clear message instead of a crash."""

from __future__ import annotations

import numpy as np
import pytest

from core.model.refs import ModelRef
from core.pipelines.dynamics import cross_seed_matrix, training_trajectories
from core.tasks.specs import probe_spec
from tests.app.test_app import chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

MODEL = "induction-neox"
N, T = 32, 64


@pytest.fixture(scope="module")
def traj(quick_zoo):
    return training_trajectories(ModelRef.parse(MODEL), probe_spec("induction", N, T))


def _marks(fig: dict, symbol: str) -> list[float]:
    return [t["x"][0] for t in fig["data"] if t.get("mode") == "markers" and t["marker"].get("symbol") == symbol]


def test_timing_and_identification_show_core_numbers(traj):
    at = open_page(make_app(), "dynamics")
    assert not at.exception, at.exception
    assert errors(at) == []
    fig = chart(at, "dyn_timing")
    heads = list(traj.final_circuit)
    keep = np.asarray(traj.tokens) > 0
    lines = [t for t in fig["data"] if t.get("mode") == "lines"]
    assert len(lines) == 2 * len(heads)  # PR and selectivity per head
    layer, head = heads[0]
    np.testing.assert_allclose(lines[0]["y"], traj.pr[keep, layer, head])
    timings = traj.timing(heads)
    assert sorted(_marks(fig, "triangle-up")) == sorted(t.rise.tokens for t in timings if t.rise.tokens)
    assert sorted(_marks(fig, "star")) == sorted(t.crossing.tokens for t in timings if t.crossing.tokens)
    ident = traj.identification()
    shown = {m.label: m.value for m in at.metric}
    assert shown["fraction of training tokens"] == f"{ident.first_fraction:.3%}"
    jac = chart(at, "dyn_identification")["data"][0]
    np.testing.assert_allclose(jac["y"], np.asarray(ident.jaccards)[keep])
    # a large margin: no head rises by that much, so no ▲ marks
    at.number_input(key="dyn_margin").set_value(50.0).run()
    assert not at.exception and errors(at) == []
    assert _marks(chart(at, "dyn_timing"), "triangle-up") == []


def test_cross_seed_and_form_function_buttons(traj):
    at = open_page(make_app(), "dynamics")
    at.multiselect(key=f"dyn_seed_models-{MODEL}").set_value([MODEL])
    at.number_input(key="dyn_seed_controls").set_value(5)
    at.button(key="dyn_run_cross_seed").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    heat = chart(at, "dyn_cross_seed")["data"][0]
    direct = cross_seed_matrix([ModelRef.parse(MODEL)], probe_spec("induction", N, T), n_controls=5)
    assert heat["z"][0][0] == pytest.approx(direct.cells[0][0]["loss"]["z"])

    stride = len(traj.revisions)  # the first and the last checkpoint only
    at.number_input(key="dyn_ff_stride").set_value(stride).run()
    at.button(key="dyn_run_form_function").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    fig = chart(at, "dyn_form_function")
    points = [t for t in fig["data"] if t.get("mode") == "markers"]
    assert sum(len(t["x"]) for t in points) == 2
    shown = {m.label: int(m.value) for m in at.metric if m.label in ("form and function", "neither",
                                                                     "function without form", "form without function")}
    assert sum(shown.values()) == 2
    # the random-init checkpoint has neither form nor function
    assert shown["neither"] >= 1


def test_text_probe_gets_a_message(quick_zoo):
    at = open_page(make_app(task="text"), "dynamics")
    assert not at.exception, at.exception
    assert any("induction" in i.value for i in at.info)
