"""The "Circuit graph" page on the hand-wired known-induction-neox (built into the test HEADLAB_HOME's zoo, well
under a second) through streamlit's AppTest: EAP on the known circuit's own task draws core's scores, the
threshold slider changes what is drawn, a click shows an edge's measured patching effect, the heads reach the
ablation lab, and bad inputs are errors, not tracebacks."""

from __future__ import annotations

import numpy as np
import pytest

from core.ablation.edges import EdgeSettings, edge_attribution
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.pipelines.edges import SCORE_FLOOR
from core.workspace import zoo_dir
from core.zoo.known import HANDWIRED, read_circuit
from tests.app.test_app import chart, errors, make_app, open_page

MODEL = "known-induction-neox"
CONTROLS = 19  # the fewest matched-random sets that can reach p <= 0.05


@pytest.fixture(scope="module")
def known_model():
    """The hand-wired model in the zoo, and core's EAP scores on its task."""
    folder = HANDWIRED[MODEL](zoo_dir() / MODEL)
    circuit = read_circuit(folder)
    scores = edge_attribution(load_model(ModelRef.parse(MODEL)), circuit.build_pair(), EdgeSettings())
    return circuit, scores


def drawn(at) -> int:
    """Edges drawn on the graph: its two-point line traces."""
    return sum(1 for t in chart(at, "graph_chart")["data"] if t.get("mode") == "lines" and t["x"][0] is not None)


def graph_page():
    at = open_page(make_app(model=MODEL, n=32, seq_len=32, token_high=24), "graph")
    assert not at.exception, at.exception
    assert errors(at) == []
    return at


def test_eap_draws_cores_scores_and_the_slider_picks_what_is_drawn(known_model):
    circuit, expected = known_model
    at = graph_page()
    assert at.radio(key="graph_source").value == "the known circuit's task"
    at.number_input(key="graph_controls").set_value(CONTROLS)
    at.button(key="graph_run").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.button(key="graph_run").disabled  # kept in the session: not scored twice

    table = at.dataframe[0].value
    # the default discovered set: of the top 20 edges, those scoring above rounding (most of this hand-wired
    # model's edges score ~1e-17); the slider starts at its smallest |score|
    floor = SCORE_FLOOR * float(np.abs(expected.scores).max())
    top = [(edge, value) for edge, value in expected.top(20) if abs(value) > floor]
    assert 0 < len(top) < 20
    assert any(f"{len(top)} of the top 20 edges score above 1e-06 of the largest" in i.value for i in at.info)
    # the same edges and scores, largest |score| first; edges whose scores tie to rounding may come in either order
    # (the app's chunks and threads are not the test's)
    assert sorted(table["edge"]) == sorted(edge for edge, _ in top)
    scores = dict(top)
    np.testing.assert_allclose(table["score"], [scores[edge] for edge in table["edge"]], atol=1e-5)
    assert np.all(np.diff(np.abs(np.asarray(table["score"], dtype=float))) <= 1e-5)
    assert drawn(at) == len(top)
    at.slider(key="graph_threshold").set_value(0.0).run()
    assert drawn(at) == len(expected.edges) == len(at.dataframe[0].value)
    at.slider(key="graph_threshold").set_value(float(np.abs(expected.scores).max()) * 0.5).run()
    assert 0 < drawn(at) < len(top)
    assert {"CPR (area under faithfulness, ↑)", "verdict"} <= {m.label for m in at.metric}

    assert any(b.proto.label.startswith("JSON edge list") for b in at.download_button)

    # the fallback picker: an edge's measured effect beside its score
    edge = top[0][0]
    at.selectbox(key="graph_item").set_value(f"edge:{edge}").run()
    assert not at.exception and errors(at) == []
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["eap score"] == f"{top[0][1]:.4f}"
    assert float(metrics["gap lost, patched alone"]) == pytest.approx(1.0, abs=0.05)  # embed->L0H1.v carries the answer

    # a node: the sums of its edges' scores and its output patched for every reader (the induction head's
    # activation-patching effect: the whole answer)
    at.slider(key="graph_threshold").set_value(0.0).run()
    at.selectbox(key="graph_item").set_value("node:L1H2").run()
    assert not at.exception and errors(at) == []
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["gap lost, its output patched for every reader"]) == pytest.approx(1.0, abs=0.05)
    assert float(metrics["sum of 1 outgoing scores"]) == pytest.approx(expected.scores[expected.edges.index("L1H2->logits")],
                                                                       abs=1e-4)

    at.button(key="graph_to_ablation").click().run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Ablation lab"]
    heads = sorted({(int(n[1]), int(n[3])) for edge, _ in top for n in edge.replace(".", "->").split("->")
                    if n.startswith("L") and "H" in n})
    assert at.text_input(key="heads_text").value == str(HeadSet(tuple(heads)))


def test_bad_inputs_are_errors_not_tracebacks(known_model):
    at = graph_page()
    at.radio(key="graph_method").set_value("acdc").run()
    at.number_input(key="graph_acdc_threshold").set_value(-0.5).run()
    assert not at.exception, at.exception
    assert any("threshold" in e and ">= 0" in e for e in errors(at))
    assert "graph_run" not in {b.key for b in at.button}  # the page stops before anything can run
    at.number_input(key="graph_acdc_threshold").set_value(0.05).run()
    assert errors(at) == []
    # the sidebar's induction probe draws tokens the 24-token model cannot read: said before anything loads
    # (0..256 is the default that means "the model's ordinary tokens", so a typed range past the vocabulary)
    at.radio(key="graph_source").set_value("built-in induction counterfactual").run()
    at.number_input(key="_w_token_high").set_value(300).run()
    assert not at.exception, at.exception
    assert any("set token_high <= 24" in e for e in errors(at))
