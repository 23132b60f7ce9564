"""The known-circuit record (core/zoo/known/truth.py) on hand-made JSON: a round trip and every error path,
and the known tasks' pairs (core/tasks/known.py): every planted token unique, the swap moves every role."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.refs import ModelRef
from core.tasks.known import SwapInductionSpec, TwoHopSpec, known_task
from core.zoo.known.truth import (CIRCUIT_FILE, FORMAT, KnownCircuit, edge_text, parse_edge, read_circuit,
                                  write_circuit)

TASK = {"task": "known-induction", "n_examples": 8, "seq_len": 16, "token_low": 0, "token_high": 12, "seed": 3}


def circuit(**changes) -> KnownCircuit:
    fields = dict(name="toy", kind="handwired", heads=HeadSet(((0, 1), (1, 0))),
                  roles={"L0H1": "previous-token", "L1H0": "induction"},
                  edges=(("embed", "L0H1", "v"), ("L0H1", "L1H0", "k"), ("L1H0", "logits", "")),
                  distractors=HeadSet(((0, 0),)), ablation="zero", task=dict(TASK),
                  bounds={"clean": 9.5, "true_ablated": 0.0}, notes=("made by hand",))
    fields.update(changes)
    return KnownCircuit(**fields)


def record(**changes) -> dict:
    data = circuit().to_json()
    data.update(changes)
    return data


def write_json(folder, data, shape=(2, 2)) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CIRCUIT_FILE).write_text(json.dumps(data))
    if shape is not None:
        (folder / "config.json").write_text(json.dumps({"num_hidden_layers": shape[0], "num_attention_heads": shape[1]}))


def test_round_trip(tmp_path):
    original = circuit()
    path = write_circuit(tmp_path, original)
    assert path == tmp_path / CIRCUIT_FILE
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["heads"] == ["L0H1", "L1H0"]
    assert data["edges"] == ["embed->L0H1.v", "L0H1->L1H0.k", "L1H0->logits"]
    back = read_circuit(tmp_path, 2, 2)
    assert back.to_json() == original.to_json()
    assert back.heads == original.heads and back.edges == original.edges and back.distractors == original.distractors
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, nothing left over


def test_heads_as_pairs_and_edges_as_triples(tmp_path):
    write_json(tmp_path, record(heads=[[0, 1], [1, 0]], edges=[["L0H1", "L1H0", "k"]]))
    back = read_circuit(tmp_path)
    assert back.heads == HeadSet(((0, 1), (1, 0))) and back.edges == (("L0H1", "L1H0", "k"),)


def test_folder_without_circuit(tmp_path):
    with pytest.raises(HeadLabError, match="has no circuit.json, so this model has no known circuit; pick a known model"):
        read_circuit(tmp_path)


def test_head_the_model_lacks(tmp_path):
    write_json(tmp_path, record(heads=["L0H1", "L1H0", "L2H0"], roles={}), shape=(2, 2))
    with pytest.raises(HeadLabError, match=r"names head L2H0, which this model lacks \(2 layers x 2 heads: L0H0 .. L1H1\)"):
        read_circuit(tmp_path)
    with pytest.raises(HeadLabError, match=r"names head L1H0, which this model lacks \(1 layers x 4 heads"):
        read_circuit(tmp_path, 1, 4)  # the shape given wins over the folder's config.json


def test_distractor_the_model_lacks(tmp_path):
    write_json(tmp_path, record(distractors=["L0H7"]), shape=(2, 2))
    with pytest.raises(HeadLabError, match="names distractor L0H7, which this model lacks"):
        read_circuit(tmp_path)


def test_edge_through_a_layer_the_model_lacks(tmp_path):
    write_json(tmp_path, record(edges=["MLP4->L1H0.q"]), shape=(2, 2))
    with pytest.raises(HeadLabError, match="MLP4->L1H0.q.*through MLP4, a layer this model lacks"):
        read_circuit(tmp_path)


@pytest.mark.parametrize("edge, message", [
    ("L0H1->L1H0.x", "enters head L1H0 through 'x'; a head's inputs are q, k and v"),
    ("L0H1->L1H0", "enters head L1H0 through ''"),
    ("L0H1->logits.q", "only a head has q, k and v inputs"),
    ("L0H1->L1H0.k->logits", "is not understood"),
    ("head1->L1H0.k", "starts at 'head1', which is no sender"),
    ("L0H1->output", "ends at 'output', which is no receiver"),
])
def test_bad_edge_text(tmp_path, edge, message):
    write_json(tmp_path, record(edges=[edge]))
    with pytest.raises(HeadLabError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        read_circuit(tmp_path)


def test_edge_against_the_flow_and_edge_outside_the_heads(tmp_path):
    write_json(tmp_path, record(edges=["L1H0->L0H1.k"]))
    with pytest.raises(HeadLabError, match="whose sender does not come before its receiver"):
        read_circuit(tmp_path)
    write_json(tmp_path, record(edges=["L0H0->L1H0.k"]))
    with pytest.raises(HeadLabError, match="through L0H0, which is not one of its heads"):
        read_circuit(tmp_path)


def test_measured_edges_may_start_outside_the_heads_but_end_at_one(tmp_path):
    """A measured edge (found by patching, KnownCircuit.measured_edges) may come from a head outside the circuit; it
    must end at a circuit head, come before its receiver and not repeat a built edge; the truth holds both lists."""
    base = record()  # heads L0H1, L1H0; L0H0 a distractor
    write_json(tmp_path, record(measured_edges=["L0H0->L1H0.v"]))
    circuit = read_circuit(tmp_path)
    assert [edge_text(e) for e in circuit.true_edges] == [*base["edges"], "L0H0->L1H0.v"]
    assert KnownCircuit.from_json(circuit.to_json()) == circuit
    for edges, message in ((["L1H0->L0H1.k"], "does not come before"), (["L0H0->L1H1.q"], "which is not one of its heads"),
                           ([base["edges"][1]], "both as an edge and as a measured edge")):
        write_json(tmp_path, record(measured_edges=edges))
        with pytest.raises(HeadLabError, match=message):
            read_circuit(tmp_path)


def test_unknown_format_and_unreadable_file(tmp_path):
    write_json(tmp_path, record(format="headlab-known-circuit/9"))
    with pytest.raises(HeadLabError, match="in format 'headlab-known-circuit/9', which this HeadLab does not read"):
        read_circuit(tmp_path)
    write_json(tmp_path, {k: v for k, v in record().items() if k != "format"})
    with pytest.raises(HeadLabError, match="in format None"):
        read_circuit(tmp_path)
    (tmp_path / CIRCUIT_FILE).write_text("{not json")
    with pytest.raises(HeadLabError, match="is unreadable"):
        read_circuit(tmp_path)
    (tmp_path / CIRCUIT_FILE).write_text("[1, 2]")
    with pytest.raises(HeadLabError, match="is not a JSON object"):
        read_circuit(tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"kind": "guessed"}, "has kind 'guessed'"),
    ({"ablation": "shuffle"}, "holds under ablation 'shuffle'"),
    ({"metric": "accuracy"}, "is scored by 'accuracy'"),
    ({"distractors": ["L0H1"]}, "both as circuit heads and as distractors"),
    ({"roles": {"L0H0": "busy"}}, "gives a role to L0H0, which is not one of its heads"),
    ({"heads": ["L0X1"]}, 'cannot read head "L0X1"'),
    ({"bounds": {"clean": "high"}}, "bounds must map names to numbers"),
    ({"edges": "L0H1->L1H0.k"}, "edges must be a JSON list"),
])
def test_bad_fields(tmp_path, changes, message):
    write_json(tmp_path, record(**changes))
    with pytest.raises(HeadLabError, match=message):
        read_circuit(tmp_path)


def test_missing_field(tmp_path):
    data = record()
    del data["heads"]
    write_json(tmp_path, data)
    with pytest.raises(HeadLabError, match="lacks heads"):
        read_circuit(tmp_path)


def test_hub_model_has_no_known_circuit():
    with pytest.raises(HeadLabError, match="hub model EleutherAI/pythia-14m has no known circuit"):
        read_circuit(ModelRef("EleutherAI/pythia-14m", "hub"))


def test_edge_text_round_trip():
    for text in ("L0H0->L1H0.k", "embed->L0H1.v", "L1H0->logits", "MLP0->L1H2.q", "L0H1->MLP1"):
        assert edge_text(parse_edge(text)) == text
    assert parse_edge(["L0H0", "L1H0", "q"]) == ("L0H0", "L1H0", "q")


def test_circuit_rebuilds_its_task():
    pair = circuit().build_pair()
    batch = circuit().build_batch()
    assert torch.equal(pair.clean.tokens, batch.tokens) and pair.n_examples == 8
    with pytest.raises(HeadLabError, match="known-circuit task 'mystery' is unknown"):
        circuit(task={"task": "mystery"}).build_pair()
    with pytest.raises(HeadLabError, match="incomplete or malformed"):
        known_task({"task": "known-induction", "n_examples": 4})


def test_swap_induction_pairs():
    spec = SwapInductionSpec(n_examples=64, seq_len=20, token_low=2, token_high=14, seed=1)
    pair = spec.build_pair()
    clean, corrupted = pair.clean.tokens, pair.corrupted_tokens
    q = spec.seq_len - 1
    assert pair.clean.spec["task"] == "known-induction" and known_task(spec.to_json()) == spec
    for i in range(spec.n_examples):
        row, bad = clean[i].tolist(), corrupted[i].tolist()
        a, b, d = row[q], int(pair.clean.target[i]), int(pair.corrupted_target[i])
        p = int(pair.clean.duplicate_pos[i])
        assert row[p] == a and row[p + 1] == b and row.count(a) == 2 and row.count(b) == 1 and row.count(d) == 1
        r = row.index(d) - 1
        c = row[r]
        assert row.count(c) == 1 and len({a, b, c, d}) == 4 and min(row) >= 2 and max(row) < 14
        # corrupted: A and C swapped, so the final A follows A D
        assert bad[p] == c and bad[r] == a and bad[r + 1] == d and bad[q] == a
        assert sum(x != y for x, y in zip(row, bad)) == 2
    assert spec.build_pair().clean.tokens.equal(clean)  # seeded


def test_two_hop_pairs():
    spec = TwoHopSpec(n_examples=64, seq_len=24, token_low=0, token_high=16, seed=2)
    pair = spec.build_pair()
    q = spec.seq_len - 1
    for i in range(spec.n_examples):
        row, bad = pair.clean.tokens[i].tolist(), pair.corrupted_tokens[i].tolist()
        a, c, g = row[q], int(pair.clean.target[i]), int(pair.corrupted_target[i])
        p = int(pair.clean.induction_pos[i]) - 1
        b = row[p + 1]
        assert row[p] == a and row.count(a) == 2 and row.count(b) == 2 and row.count(c) == 1
        assert row[row.index(c) + 1] == b  # C B: hop two reads the token before the other B
        f = bad[bad.index(a) + 1]  # corrupted: hop one finds F after the earlier A ...
        assert bad.count(f) == 2 and bad[bad.index(g) + 1] == f  # ... hop two G before the other F
        assert sum(x != y for x, y in zip(row, bad)) == 2


def test_task_checks():
    with pytest.raises(HeadLabError, match="must hold at least 7 tokens"):
        TwoHopSpec(n_examples=4, seq_len=24, token_low=0, token_high=6)
    with pytest.raises(HeadLabError, match="use at least 10"):
        TwoHopSpec(n_examples=4, seq_len=9, token_low=0, token_high=16)
    with pytest.raises(HeadLabError, match="cannot read"):
        SwapInductionSpec(n_examples=4, seq_len=16, token_low=0, token_high=30).check_vocab(24)


def test_docs_models_section_cites_only_committed_measurements():
    """Every decimal figure in docs/known-circuits.md's "The models" section is in the committed `known --json`."""
    from tests.unit.test_docs_numbers import _numbers, figures

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs" / "known-circuits.md").read_text()
    section = text.split("## The models", 1)[1].split("\n## ", 1)[0]
    numbers = _numbers(json.loads((repo / "docs" / "measurements" / "known-handwired.json").read_text()))
    shown = figures(section)
    assert len(shown) >= 10
    for figure in shown:
        decimals = len(figure.split(".")[1])
        assert any(round(abs(x), decimals) == float(figure) for x in numbers), f"{figure} is in no committed measurement"
