"""The Co-activation page on the quick zoo (AppTest, no browser): it draws core's report, runs a
community's closure test in place, sends a community to the ablation lab, runs the route-conditional
analysis on the MoE model, and shows clear errors for a dense model asked for routes and for a probe
with fewer examples than heads."""

from __future__ import annotations

import numpy as np
import pytest

from core.figures.coactivation import cluster_order
from core.model.refs import ModelRef
from core.pipelines.coactivation import CoactivationSettings, coactivation
from core.tasks.specs import probe_spec
from tests.app.test_app import chart, errors, make_app, open_page

pytestmark = pytest.mark.zoo

DENSE, MOE = "induction-neox", "induction-olmoe"
N = 64        # at least the 36 heads of the dense model
N_MOE = 128   # 4 routing strata of at least 8 examples each
T = 64


def _report(model: str, n: int, route: bool = False):
    return coactivation(ModelRef.parse(model), None, probe_spec("induction", n, T),
                        CoactivationSettings(route_conditional=route, run_closure=False))


def _verdict_text(at) -> str:
    return " ".join(b.value for b in [*at.success, *at.info, *at.warning])


def test_page_draws_core_report_runs_closure_and_sends_to_the_lab(quick_zoo):
    expected = _report(DENSE, N)
    at = open_page(make_app(model=DENSE, n=N), "coactivation")
    assert not at.exception, at.exception
    assert errors(at) == []
    heat = chart(at, "coact_heatmap")["data"][0]
    order = cluster_order(expected.cluster_labels)
    np.testing.assert_allclose(np.asarray(heat["z"], dtype=float), expected.J[np.ix_(order, order)])
    graph = chart(at, "coact_graph")
    nodes = {d for t in graph["data"] if t.get("mode") == "markers+text" for d in t["customdata"]}
    assert len(nodes) == 36
    ari = chart(at, "coact_ari")["data"][0]
    assert ari["y"] == [m.ari for m in expected.proposal.scores.metrics]
    n_charts = len(at.get("plotly_chart"))
    assert len(at.download_button) == 5 * (n_charts + 1)  # every chart and the community table export 5 ways
    assert at.selectbox(key="coact_community").value == expected.proposal.selection.candidate.cluster

    at.button(key="coact_run_closure").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    shown = _verdict_text(at)
    test = at.session_state["coact_closure"]
    assert test.selection == expected.candidate and test.n_controls == 5
    for s in test.splits:
        for rule, verdict in s.verdicts.items():
            assert f"{s.kind} controls, {s.split} examples, {rule} rule: {verdict.label}" in shown
    bars = chart(at, "coact_closure_z")["data"]
    assert [b["y"] for b in bars] == [[s.z(m) for m in ("loss", "top1", "top5", "target_logit")] for s in test.splits]

    at.button(key="coact_send").click().run()
    assert not at.exception, at.exception
    assert at.text_input(key="heads_text").value == str(expected.candidate)  # the ablation lab, heads typed in


def test_route_conditional_on_the_moe_model(quick_zoo):
    expected = _report(MOE, N_MOE, route=True)
    at = open_page(make_app(model=MOE, n=N_MOE), "coactivation")
    at.toggle(key="coact_route").set_value(True).run()
    assert not at.exception, at.exception
    assert errors(at) == []
    null = chart(at, "coact_route_null")["data"]
    assert null[1]["y"] == [expected.route.statistic.max_ari]
    assert f"z = {expected.route.null.z_max:+.2f}" in chart(at, "coact_route_null")["layout"]["title"]["text"]
    assert at.selectbox(key="coact_community").value == expected.proposal.selection.candidate.cluster
    at.button(key="coact_run_closure").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.session_state["coact_closure"].selection == expected.candidate
    table = at.dataframe[-1].value
    assert set(table["examples"]) == {"all", "on", "off"}
    on = expected.route.sizes[expected.route.discovery_stratum]
    assert set(table.loc[table["examples"] == "on", "n"]) == {on}


def test_clear_errors(quick_zoo):
    at = open_page(make_app(model=DENSE, n=N), "coactivation")
    at.toggle(key="coact_route").set_value(True).run()
    assert not at.exception, at.exception
    assert any("this model has no routers" in e for e in errors(at))
    few = open_page(make_app(model=DENSE, n=32), "coactivation")
    assert not few.exception, few.exception
    assert errors(few) == []  # too few examples for the heads is said plainly, with the size that works
    assert any("36 heads and the sidebar's probe 32 examples" in i.value for i in few.info)
    assert any(b.label == "Use N = 40 examples" for b in few.button)
