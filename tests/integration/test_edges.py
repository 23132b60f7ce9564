"""Edge patching, EAP, EAP-IG and ACDC against brute force, on tiny bridges and a hand-wired known circuit."""

import json

import numpy as np
import pytest
import torch
from transformers import GPTNeoXConfig

from core.ablation.edges import (EdgeGraph, EdgeSettings, acdc, edge_attribution, edge_controls, edge_graph_of,
                                 edge_patching_each, faithfulness_curve)
from core.ablation.edges.acdc import kept_by_each
from core.__main__ import main
from core.ablation.edges.graph import edge_graph_of_config
from core.ablation.edges.runs import check_edge_run_fits, edge_chunks, edge_pair_bytes, mean_value, run_values
from core.errors import HeadLabError
from core.model.loading import load_model
from core.model.memory import ForwardShape, estimate_memory_bytes
from core.model.refs import ModelRef
from core.pipelines.edges import check_has_pairs
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.probe_file import read_probe_file
from core.tasks.specs import probe_spec
from core.zoo.known import HANDWIRED, read_circuit
from tests.tiny_models import save_tiny_model

SMALL_GAP = EdgeSettings(allow_small_gap=True)  # random tiny models have no real answer to lose


@pytest.fixture(scope="module", params=["gpt_neox", "llama"])
def tiny(request, tmp_path_factory):
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    model = load_model(ModelRef.parse(str(folder)))
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples=6, seq_len=10), seed=0).build()
    return model, pair


@pytest.fixture(scope="module")
def induction_circuit(tmp_path_factory):
    folder = HANDWIRED["known-induction-neox"](tmp_path_factory.mktemp("known") / "known-induction-neox")
    circuit = read_circuit(folder)
    return load_model(ModelRef.parse(str(folder))), circuit.build_pair().select(slice(0, 16)), circuit, folder


def test_no_edge_patched_is_the_clean_run_and_every_edge_the_corrupted_run(tiny):
    model, pair = tiny
    graph = edge_graph_of(model)
    chunks, _ = edge_chunks(model, pair, SMALL_GAP, graph)
    clean = float(torch.cat([c.clean_values for c in chunks]).double().mean())
    corrupted = float(torch.cat([c.corrupted_values for c in chunks]).double().mean())
    assert mean_value(model, graph, chunks, np.zeros(graph.n_edges, bool), "logit_diff") == pytest.approx(clean, abs=1e-5)
    assert mean_value(model, graph, chunks, np.ones(graph.n_edges, bool), "logit_diff") == pytest.approx(corrupted, abs=1e-5)
    assert run_values(model, graph, chunks, "kl").clean == 0.0


def test_eap_is_the_first_order_term_of_brute_force_patching(tiny):
    """EAP's estimate of each edge equals d/d(eps) of patching eps of that edge's change, by central differences."""
    model, pair = tiny
    eap = edge_attribution(model, pair, SMALL_GAP)
    eps = 1e-2
    plus, minus = (edge_patching_each(model, pair, SMALL_GAP, scale=s) for s in (eps, -eps))
    derivative = (plus.scores - minus.scores) / (2 * eps)  # importance per unit of patch, in gap units
    gap = eap.clean_value - eap.corrupted_value
    raw_eap, raw_fd = eap.scores * gap, derivative * gap  # back to metric units: the gap of a random model is tiny
    assert np.abs(raw_eap - raw_fd).max() <= 1e-3 * np.abs(raw_fd).max() + 1e-6
    assert np.abs(raw_fd).max() > 0


def test_eap_ig_with_one_step_is_eap_and_more_steps_change_it(tiny):
    model, pair = tiny
    eap = edge_attribution(model, pair, SMALL_GAP)
    one = edge_attribution(model, pair, SMALL_GAP, ig_steps=1)
    five = edge_attribution(model, pair, SMALL_GAP, ig_steps=5)
    np.testing.assert_allclose(one.scores, eap.scores, atol=1e-4 * np.abs(eap.scores).max())
    assert not np.allclose(five.scores, eap.scores)
    assert five.passes["backward"] == 5 * one.passes["backward"]


def test_eap_ig_of_the_embedding_edges_adds_up_to_the_measured_gap_under_both_rules(tiny):
    """Completeness, against the two measured runs: the embeddings reach the model only through their edges, so
    the path integral of those edges' scores from the corrupted to the clean embeddings is the whole gap (sum 1
    in gap units). HeadLab's rule (clean end in) and MIB's (corrupted end in) are Riemann sums of it from either
    side; their mean is the trapezoid rule, exact to second order. A wrong path (endpoints, direction) fails."""
    model, pair = tiny
    embed = np.array([e.startswith("embed->") for e in edge_attribution(model, pair, SMALL_GAP).edges])
    right, left = (edge_attribution(model, pair, SMALL_GAP, ig_steps=16, ig_rule=r).scores[embed].sum()
                   for r in ("right", "left"))
    assert abs(right - 1) < 0.08 and abs(left - 1) < 0.08 and (right - 1) * (left - 1) < 0
    assert (right + left) / 2 == pytest.approx(1.0, abs=0.005)
    with pytest.raises(HeadLabError, match="rule 'middle' is unknown"):
        edge_attribution(model, pair, SMALL_GAP, ig_steps=2, ig_rule="middle")


def test_acdc_keeps_exactly_what_brute_force_keeps_on_a_hand_wired_circuit(induction_circuit):
    model, pair, circuit, _ = induction_circuit
    each = edge_patching_each(model, pair)
    pruned = acdc(model, pair, 0.05)
    assert np.array_equal(pruned.kept, kept_by_each(each, 0.05))
    kept = {pruned.edges[i] for i in np.nonzero(pruned.kept)[0]}
    assert kept and kept <= set(circuit.edge_texts)  # every kept edge is a true edge
    # the circuit alone carries the whole answer; the rest of the graph none of it
    assert pruned.settings["final_distance"] < 0.05


def test_eap_ig_finds_the_saturated_key_edge_that_eap_misses_and_the_curve_and_controls_see_the_circuit(induction_circuit):
    """The hand-wired induction head's softmax is saturated, so its gradient w.r.t. the key (K-composition with
    the previous-token head) is ~0 at the clean run: EAP scores that edge ~0 although patching it undoes the
    answer. EAP-IG takes its gradients between the runs, where the softmax is not saturated."""
    model, pair, circuit, _ = induction_circuit
    exercised = {"embed->L0H1.v", "L0H1->L1H2.k", "L1H2->logits"}  # the true edges the counterfactual changes
    each = edge_patching_each(model, pair)
    eap = edge_attribution(model, pair)
    ig = edge_attribution(model, pair, ig_steps=5)
    assert {edge for edge, _ in each.top(3)} == exercised <= set(circuit.edge_texts)
    key = EdgeGraph.from_summary(eap.graph).index("L0H1->L1H2.k")
    assert each.scores[key] == pytest.approx(1.0, abs=0.02) and abs(eap.scores[key]) < 0.01
    top = {edge for edge, _ in ig.top(3)}
    assert top == exercised
    curve = faithfulness_curve(model, pair, ig.scores, fractions=(0.01, 0.03, 0.1, 1.0))
    assert curve.n_edges_kept == (1, 3, 10, 102)
    assert curve.faithfulness[1] == pytest.approx(1.0, abs=0.02) and curve.faithfulness[-1] == pytest.approx(1.0)
    # MIB's rule: CMD from the top edges by |score|, CPR from the top edges by signed score. Negated scores keep the
    # same |score| curve (and CMD) but put the edges that help last, so CPR falls.
    flipped = faithfulness_curve(model, pair, -ig.scores, fractions=(0.01, 0.03, 0.1, 1.0))
    assert flipped.faithfulness == pytest.approx(curve.faithfulness) and flipped.cmd == pytest.approx(curve.cmd)
    assert curve.faithfulness_signed[1] == pytest.approx(1.0, abs=0.02) and flipped.faithfulness_signed[1] < 0.1
    assert flipped.cpr < curve.cpr - 0.3
    graph = EdgeGraph.from_summary(eap.graph)
    controls = edge_controls(model, pair, graph.edge_mask(top), n_controls=19)
    assert controls.faithfulness == pytest.approx(1.0, abs=0.02)
    assert controls.stats["rank"] == 1 and controls.verdict.label == "beyond its controls"
    assert controls.heads == ((0, 1), (1, 2))


def test_edge_methods_refuse_what_they_cannot_do(tiny, tmp_path):
    model, pair = tiny
    with pytest.raises(HeadLabError, match="zero gradient"):
        edge_attribution(model, pair, EdgeSettings(metric="kl", allow_small_gap=True))
    with pytest.raises(HeadLabError, match="ig-steps"):
        edge_attribution(model, pair, SMALL_GAP, ig_steps=0)
    with pytest.raises(HeadLabError, match="threshold"):
        acdc(model, pair, -1.0, SMALL_GAP)
    with pytest.raises(HeadLabError, match="one score per edge"):
        faithfulness_curve(model, pair, np.zeros(3), SMALL_GAP)
    with pytest.raises(HeadLabError, match="empty"):
        edge_controls(model, pair, np.zeros(edge_graph_of(model).n_edges, bool), SMALL_GAP)
    with pytest.raises(HeadLabError, match="gap"):  # a random model's pairs fail the gap rule unless allowed
        edge_attribution(model, pair)
    probe = tmp_path / "clean_only.jsonl"
    probe.write_text(json.dumps({"prompt": "abcabc", "target": "a"}) + "\n")
    with pytest.raises(HeadLabError, match="edge methods need clean/corrupted pairs"):
        check_has_pairs(read_probe_file(probe))


def test_cli_bad_threshold_is_one_line_and_exit_2(tmp_path, capsys):
    folder = save_tiny_model("gpt_neox", tmp_path / "m")
    status = main(["edges", str(folder), "--method", "acdc", "--threshold", "-1", "--n", "4", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert status == 2 and "threshold" in err and "Traceback" not in err


def test_cli_acdc_on_a_known_model_finds_its_edges_beyond_their_controls(induction_circuit, tmp_path, capsys):
    _, _, circuit, folder = induction_circuit
    out = tmp_path / "edges.json"
    status = main(["edges", str(folder), "--known-task", "--method", "acdc", "--controls", "19", "--json", str(out)])
    printed = capsys.readouterr().out
    assert status == 0 and "beyond its controls" in printed
    report = json.loads(out.read_text())
    assert set(report["discovered"]) <= set(circuit.edge_texts) and report["discovered"]
    assert report["controls"]["verdict"]["label"] == "beyond its controls"
    assert report["curve"]["faithfulness"][-1] == pytest.approx(1.0)


def test_an_edge_run_too_large_for_the_memory_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    pythia_160m = GPTNeoXConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                                vocab_size=50304, use_parallel_residual=True)
    one_pair = edge_pair_bytes(ForwardShape.of_config(pythia_160m), edge_graph_of_config(pythia_160m), 128, grad=True)
    need = check_edge_run_fits(pythia_160m, 128, torch.float32, grad=True, available_bytes=2**40)
    assert need == estimate_memory_bytes(pythia_160m) + one_pair
    assert check_edge_run_fits(pythia_160m, 128, torch.float32, grad=False, available_bytes=2**40) < need  # ACDC: no grad
    assert check_edge_run_fits(pythia_160m, 128, torch.float32, grad=True, available_bytes=2 * need) == need  # half the free
    with pytest.raises(HeadLabError, match=r"edge run on this model needs ~.* GB for the weights .*--seq-len"):
        check_edge_run_fits(pythia_160m, 128, torch.float32, grad=True, available_bytes=2 * need - 2)
    # the command says so in one line, before any weight is read
    folder = save_tiny_model("gpt_neox", tmp_path / "m")
    monkeypatch.setattr("core.model.memory.available_memory_bytes", lambda device="cpu": 10_000)
    monkeypatch.setattr("core.pipelines.edges.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    status = main(["edges", str(folder), "--n", "4", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert status == 2 and "edge run on this model needs" in err and "Traceback" not in err
