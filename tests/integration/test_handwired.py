"""The hand-wired known models (core/zoo/known/handwired.py), built into a temporary HEADLAB_HOME and loaded
through HeadLab's loader, prove their circuits by construction:

- ablating the true heads (under circuit.ablation) takes the logit difference (clean answer - corrupted
  answer, +10 to +12 clean) to under a tenth of its clean value; ablating every other head together moves
  it by under 1e-3 of itself; both numbers are the bounds circuit.json records;
- the previous-token and induction heads attend where their roles say (weight >= 0.99);
- HeadLab's ablation study and activation patching run on them unchanged, and patching ranks the true heads
  first; the two-hop model's backup carries a third of the answer; the two-task model's other heads move
  the loss but not the logit difference;
- a circuit.json naming heads the model lacks, and a folder without circuit.json, are refused clearly.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from core.ablation.engine import run_conditions
from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.ablation.spec import Ablation
from core.ablation.study import AblationSettings, ablation_study
from core.errors import HeadLabError
from core.heads import HeadSet, parse_heads
from core.model.hooks import hook_name, model_shape
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.zoo.known import CIRCUIT_FILE, HANDWIRED, known_circuit
from core.zoo.known.handwired import logit_diff_under

NAMES = tuple(HANDWIRED)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every hand-wired model built into a fresh HEADLAB_HOME: name -> (folder, circuit, loaded model)."""
    home = tmp_path_factory.mktemp("handwired-home")
    saved = os.environ.get("HEADLAB_HOME")
    os.environ["HEADLAB_HOME"] = str(home)
    try:
        out = {}
        for name in NAMES:
            folder = HANDWIRED[name]()
            assert folder == home / "zoo" / name
            ref = ModelRef.parse(name)  # a zoo name, like any trained model
            out[name] = (folder, known_circuit(ref), load_model(ref))
        yield out
    finally:
        if saved is None:
            os.environ.pop("HEADLAB_HOME", None)
        else:
            os.environ["HEADLAB_HOME"] = saved


def _everyone(model) -> HeadSet:
    n_layers, n_heads, _ = model_shape(model)
    return HeadSet(tuple((l, h) for l in range(n_layers) for h in range(n_heads)))


@pytest.mark.parametrize("name", NAMES)
def test_folder_is_a_complete_zoo_model(built, name):
    folder, circuit, _ = built[name]
    checkpoint = folder / "checkpoints" / "step0000000"
    assert (folder / "manifest.json").is_file() and (checkpoint / "config.json").is_file()
    assert list(checkpoint.glob("*.safetensors")) and (checkpoint / "tokenizer.json").is_file()
    assert json.loads((folder / CIRCUIT_FILE).read_text()) == json.loads((checkpoint / CIRCUIT_FILE).read_text())
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    assert circuit.name == name and circuit.kind == "handwired" and len(circuit.distractors) >= 6
    assert set(circuit.heads) | set(circuit.distractors) == set(_everyone(built[name][2]))


@pytest.mark.parametrize("name", NAMES)
def test_ablation_proves_the_circuit(built, name):
    _, circuit, model = built[name]
    others = HeadSet(tuple(h for h in _everyone(model) if h not in circuit.heads))
    conditions = [Ablation(circuit.heads, mode=circuit.ablation), Ablation(others, mode=circuit.ablation)]
    clean, (true_ablated, others_ablated), corrupted = logit_diff_under(model, circuit, conditions)
    bounds = circuit.bounds
    assert clean > 9.9 and corrupted < -9.9  # +g clean, -g corrupted by construction
    assert abs(true_ablated) <= bounds["true_ablated_max"] == pytest.approx(0.1 * clean, abs=1e-5)
    assert abs(others_ablated - clean) <= bounds["others_change_max"] == pytest.approx(1e-3 * clean, abs=1e-5)
    for key, value in (("clean", clean), ("corrupted", corrupted), ("true_ablated", true_ablated),
                       ("others_ablated", others_ablated)):
        assert bounds[key] == pytest.approx(value, abs=1e-4)  # the recorded bounds are these measurements


@pytest.mark.parametrize("name", NAMES)
def test_attention_patterns_match_the_roles(built, name):
    _, circuit, model = built[name]
    batch = circuit.build_batch()
    prev_head = next(h for h in circuit.heads if circuit.roles[f"L{h[0]}H{h[1]}"].startswith("previous-token"))
    induction = next(h for h in circuit.heads if circuit.roles[f"L{h[0]}H{h[1]}"].startswith("induction"))
    store = {}
    names = {hook_name("pattern", layer) for layer in (prev_head[0], induction[0])}
    with torch.no_grad():
        model.run_with_hooks(batch.tokens, fwd_hooks=[(n, lambda t, hook: store.__setitem__(hook.name, t)) for n in names])
    prev = store[hook_name("pattern", prev_head[0])][:, prev_head[1]]  # [example, query, key]
    assert prev.diagonal(offset=-1, dim1=1, dim2=2).min() > 0.99  # every query on its previous token
    ind = store[hook_name("pattern", induction[0])][:, induction[1]]
    rows = torch.arange(batch.n_examples)
    assert ind[rows, batch.query_pos, batch.induction_pos].min() > 0.99  # the final A on the token after the earlier A


@pytest.mark.parametrize("name", NAMES)
def test_study_and_patching_run_unchanged(built, name):
    _, circuit, model = built[name]
    pair = circuit.build_pair()
    settings = AblationSettings(n_controls=3, mode=circuit.ablation, n_boot=50, include_upper_bound=False)
    result = ablation_study(model, circuit.build_batch(), circuit.heads, settings)
    assert result.stats["top1"]["clean"] == 1.0 and result.stats["top1"]["candidate_delta"] < -0.7
    patching = activation_patching(model, pair, PatchSettings(direction="noise", n_controls=1))
    scores = patching.scores  # [layer, head]: clean 1, corrupted 0 (noising: corrupted z into the clean run)
    damage = 1.0 - scores
    truth = circuit.heads.mask(*scores.shape)
    assert damage[truth].min() > 0.25 and np.abs(damage[~truth]).max() < 1e-4  # true heads move it, no other does
    # attention is sharp but not saturated: the gradient still sees K-composition, so attribution ranks every true
    # head above every other head (the early heads only faintly: a linear estimate of a switch)
    attribution = np.abs(1.0 - np.asarray(attribution_patching(model, pair, PatchSettings(direction="noise")).scores))
    assert attribution[truth].min() > 10 * attribution[~truth].max()


def test_twohop_backup_carries_a_third(built):
    _, circuit, model = built["known-twohop-llama"]
    mover, backup = parse_heads("L2H0"), parse_heads("L2H1")
    clean, (without_mover, without_backup), _ = logit_diff_under(
        model, circuit, [Ablation(mover, mode=circuit.ablation), Ablation(backup, mode=circuit.ablation)])
    assert without_mover == pytest.approx(clean / 3, rel=0.01) and without_backup == pytest.approx(2 * clean / 3, rel=0.01)


def test_twotask_other_task_moves_the_loss_not_the_metric(built):
    _, circuit, model = built["known-twotask-neox"]
    batch = circuit.build_batch()
    task_two = parse_heads("L0H1, L1H1")
    clean, (ablated,) = run_conditions(model, batch, [Ablation(task_two, mode="zero")])
    assert ablated.mean("loss") < clean.mean("loss") - 0.05  # the echo logit took softmax mass from the answer
    _, (ld,), _ = logit_diff_under(model, circuit, [Ablation(task_two, mode="zero")])
    assert ld == pytest.approx(circuit.bounds["clean"], abs=1e-4)


def test_bad_circuit_files(built, tmp_path):
    folder = built["known-induction-neox"][0]
    copy = tmp_path / "model"
    shutil.copytree(folder / "checkpoints" / "step0000000", copy)
    data = json.loads((copy / CIRCUIT_FILE).read_text())
    (copy / CIRCUIT_FILE).write_text(json.dumps({**data, "heads": data["heads"] + ["L3H0"]}))
    with pytest.raises(HeadLabError, match=r"names head L3H0, which this model lacks \(2 layers x 4 heads"):
        known_circuit(str(copy))
    (copy / CIRCUIT_FILE).write_text(json.dumps({**data, "edges": data["edges"] + ["L0H1->L1H7.k"]}))
    with pytest.raises(HeadLabError, match="L1H7, which is not one of its heads"):
        known_circuit(str(copy))
    (copy / CIRCUIT_FILE).unlink()
    with pytest.raises(HeadLabError, match="has no circuit.json, so this model has no known circuit"):
        known_circuit(str(copy))


def test_known_command_lists_and_refuses(built, tmp_path, capsys):
    from core.__main__ import main

    out = tmp_path / "known.json"
    assert main(["known", "--json", str(out)]) == 0
    rows = {row["name"]: row for row in json.loads(out.read_text())["models"]}
    for name in NAMES:
        assert rows[name]["built"] and rows[name]["kind"] == "handwired"
        assert rows[name]["heads"] == [f"L{l}H{h}" for l, h in built[name][1].heads]
        assert rows[name]["bounds"] == built[name][1].bounds
    assert "known-induction-neox" in capsys.readouterr().out
    assert main(["known", "--build", "no-such-model"]) == 2
    assert "unknown known model(s) no-such-model" in capsys.readouterr().err
