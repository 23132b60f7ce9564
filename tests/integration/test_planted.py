"""Planted-circuit models (core/zoo/known/planted.py): the resample hook, the tasks' pairs, a short build
(loadable, atomic, skipped when complete) and the confirmation rule on hand-made scores."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef, read_manifest
from core.tasks.known import known_task
from core.zoo.known import KNOWN_MODELS, read_circuit
from core.zoo.known import planted
from core.zoo.known.planted import (CONFIRMATION, PLANTED, PLANTED_CONFIGS, RULE, build_planted, confirmation_rule,
                                    head_columns, output_projection, pattern_keys, planted_status, planting_hooks,
                                    resample_slices, task_record, training_batch)
from core.zoo.train import build_model


# ----------------------------------------------------------------------------------- the resample hook


def test_resample_slices_replace_exactly_the_named_heads_columns():
    x = torch.arange(3 * 2 * 8, dtype=torch.float32).reshape(3, 2, 8)  # [batch 3, pos 2, 4 heads x d_head 2]
    columns = head_columns([0, 2], n_heads=4, d_head=2)
    assert columns.tolist() == [True, True, False, False, True, True, False, False]
    out = resample_slices(x, columns)
    for row in range(3):
        source = (row - 1) % 3  # rows rolled by one: row r reads row r-1
        assert torch.equal(out[row][:, [0, 1, 4, 5]], x[source][:, [0, 1, 4, 5]])
        assert torch.equal(out[row][:, [2, 3, 6, 7]], x[row][:, [2, 3, 6, 7]])


@pytest.mark.parametrize("task", ["induction", "two-back"])  # a GPT-NeoX and a Llama recipe
def test_planting_hooks_resample_only_non_circuit_heads_in_the_model(task):
    cfg = replace(PLANTED_CONFIGS[planted.planted_name(task, 0)], d_model=32, d_ff=64)
    model_cfg = cfg.model_config()
    model = build_model(model_cfg, 0).eval()
    seen: dict[tuple[str, int], torch.Tensor] = {}

    def recorder(tag, layer):
        def hook(module, args):
            seen[(tag, layer)] = args[0].detach().clone()
        return hook

    handles = [output_projection(model, cfg.family, l).register_forward_pre_hook(recorder("before", l)) for l in range(2)]
    handles += planting_hooks(model, cfg.family, cfg.circuit_heads, 2, 4, model_cfg.d_head)
    handles += [output_projection(model, cfg.family, l).register_forward_pre_hook(recorder("after", l)) for l in range(2)]
    tokens, _ = training_batch(cfg.task, 0, 4, cfg.seq_len, 0)
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    d = model_cfg.d_head
    for layer in range(2):
        before, after = seen[("before", layer)], seen[("after", layer)]  # [batch, pos, 4 * d_head]
        for head in range(4):
            cols = slice(head * d, (head + 1) * d)
            expected = before[:, :, cols] if (layer, head) in cfg.circuit_heads else before.roll(1, dims=0)[:, :, cols]
            assert torch.equal(after[:, :, cols], expected), (layer, head)


# ----------------------------------------------------------------------------------- tasks and pairs


def test_pattern_keys_on_hand_made_tokens():
    tokens = torch.tensor([[3, 5, 0, 6, 1, 5, 0]])  # BOS, x=5 NO, x=6 NO, x=5 YES
    dup = pattern_keys("duplicate-or-first", tokens)[0]
    assert dup[5].nonzero().flatten().tolist() == [1]  # the second 5 looks at the first
    assert dup[3].nonzero().flatten().tolist() == [0]  # 6 has no earlier copy: BOS
    assert not dup[2].any()  # labels are not content
    ind = pattern_keys("induction", torch.tensor([[7, 8, 9, 7, 8]]))[0]
    assert ind[3].nonzero().flatten().tolist() == [1]  # after the earlier 7
    assert ind[4].nonzero().flatten().tolist() == [2]
    assert pattern_keys("two-back", tokens)[0][4].nonzero().flatten().tolist() == [2]


def test_training_batches_are_pure_functions_of_seed_and_step():
    for task in planted.TASKS:
        a, b = training_batch(task, 7, 4, 32, 1), training_batch(task, 7, 4, 32, 1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[1].any()
        assert not torch.equal(a[0], training_batch(task, 8, 4, 32, 1)[0])


def test_pairs_change_one_position_and_read_back_through_known_task():
    dup = known_task(task_record("duplicate", 16, 3)).build_pair()
    changed = (dup.clean.tokens != dup.corrupted_tokens)
    assert changed.sum(dim=1).tolist() == [1] * 16  # only the x at p differs
    assert torch.equal(changed.nonzero()[:, 1], dup.clean.duplicate_pos)
    assert dup.clean.target.tolist() == [0, 1] * 8 and torch.equal(dup.corrupted_target, 1 - dup.clean.target)
    q = dup.seq_len - 1
    rows = torch.arange(16)
    is_dup = (dup.clean.tokens[rows, dup.clean.duplicate_pos] == dup.clean.tokens[:, q])
    assert is_dup.tolist() == [True, False] * 8  # YES prompts hold the last x at p, NO prompts do not
    back = known_task(task_record("two-back", 8, 0)).build_pair()
    assert ((back.clean.tokens != back.corrupted_tokens).nonzero()[:, 1] == back.seq_len - 3).all()
    assert torch.equal(back.clean.target, back.clean.tokens[:, -3])
    assert torch.equal(back.corrupted_target, back.corrupted_tokens[:, -3])
    with pytest.raises(HeadLabError, match="even"):
        known_task({"task": "planted-duplicate", "n_examples": 4, "seq_len": 31}).build_pair()


# ----------------------------------------------------------------------------------- the confirmation rule


def _scores(true_effect=0.9, other=0.0):
    denoise = np.full((2, 4), other)
    denoise[0, 1] = denoise[1, 2] = true_effect
    noise = 1.0 - denoise
    return denoise, noise


GOOD_TOP1 = {"clean": 0.98, "true_ablated": 0.02, "others_ablated": 0.97}
CIRCUIT = HeadSet(((0, 1), (1, 2)))


def test_confirmation_rule_on_hand_made_scores():
    verdict = confirmation_rule(*_scores(), CIRCUIT, GOOD_TOP1, {"L0H1->L1H2.k": 0.9})
    assert verdict["confirmed"] and verdict["failures"] == []
    assert verdict["min_true_effect"] == pytest.approx(0.9) and verdict["max_other_abs_effect"] == pytest.approx(0.0)
    weak = confirmation_rule(*_scores(true_effect=0.15), CIRCUIT, GOOD_TOP1)
    assert not weak["confirmed"] and any("L0H1 denoise effect 0.150" in f for f in weak["failures"])
    busy = confirmation_rule(*_scores(other=-0.06), CIRCUIT, GOOD_TOP1)  # |effect| counts, either sign
    assert not busy["confirmed"] and any("L0H0 (not in the circuit)" in f for f in busy["failures"])
    assert confirmation_rule(*_scores(other=0.049), CIRCUIT, GOOD_TOP1)["confirmed"]
    denoise, noise = _scores()
    noise[1, 0] = 0.9  # noising moves a non-circuit head by 0.1
    assert any("L1H0" in f and "noise" in f for f in confirmation_rule(denoise, noise, CIRCUIT, GOOD_TOP1)["failures"])
    for top1, text in (({**GOOD_TOP1, "clean": 0.8}, "clean top-1"), ({**GOOD_TOP1, "others_ablated": 0.9}, "every other"),
                       ({**GOOD_TOP1, "true_ablated": 0.8}, "the circuit ablated")):
        assert any(text in f for f in confirmation_rule(*_scores(), CIRCUIT, top1)["failures"])
    assert not confirmation_rule(*_scores(), CIRCUIT, GOOD_TOP1, {"L0H1->L1H2.k": 0.1})["confirmed"]
    with pytest.raises(HeadLabError, match="outside this model"):
        confirmation_rule(*_scores(), HeadSet(((2, 0),)), GOOD_TOP1)


# ----------------------------------------------------------------------------------- a short build


def _short(name: str):
    return replace(PLANTED_CONFIGS[name], steps=6, n_log_checkpoints=2, d_model=32, d_ff=64, pair_examples=16)


def test_registry_holds_three_tasks_by_three_seeds():
    names = [n for n in KNOWN_MODELS if n.startswith("planted-")]
    assert names == list(PLANTED) and len(names) == 9
    assert {PLANTED_CONFIGS[n].task for n in names} == set(planted.TASKS)
    assert {PLANTED_CONFIGS[n].family for n in names} == {"gpt_neox", "llama"}


def test_short_build_is_loadable_atomic_and_skipped_when_complete(tmp_path, monkeypatch):
    name = "planted-induction-neox-s0"
    cfg = _short(name)
    folder = tmp_path / name
    # an interrupted build leaves nothing behind
    def stop(step, total):
        if step == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        build_planted(name, folder, progress=stop, cfg=cfg)
    assert not folder.exists() and list(tmp_path.iterdir()) == []
    # six steps cannot learn the task: the model is written, the seed reported as failed, no circuit.json
    build_planted(name, folder, cfg=cfg)
    record = planted_status(folder)
    assert record is not None and not record["confirmed"] and record["failures"]
    assert not (folder / "circuit.json").exists()
    manifest = read_manifest(folder)
    assert manifest["complete"] and [c["step"] for c in manifest["checkpoints"]] == [0, 1, 6]
    bridge = load_model(ModelRef(str(folder), "local"))
    assert bridge.cfg.n_layers == 2 and bridge.cfg.n_heads == 4
    with pytest.raises(HeadLabError, match="no circuit.json"):
        read_circuit(folder)
    # complete: skipped (nothing trained again); another config: refused
    monkeypatch.setattr(planted, "train_planted", lambda *a, **k: pytest.fail("a complete model was retrained"))
    assert build_planted(name, folder, cfg=cfg) == folder
    with pytest.raises(HeadLabError, match="another config"):
        build_planted(name, folder, cfg=replace(cfg, steps=7))


def test_confirmed_build_writes_circuit_json_beside_the_manifest_and_every_checkpoint(tmp_path, monkeypatch):
    """With the rule relaxed (a 6-step model cannot pass it), the confirmed path writes the ground truth."""
    for key, value in {"clean_top1_min": -1.0, "true_effect_min": -np.inf, "other_effect_max": np.inf,
                       "others_ablated_top1_drop_max": np.inf, "true_ablated_top1_drop_min": -np.inf,
                       "edge_score_min": -np.inf}.items():
        monkeypatch.setitem(RULE, key, value)
    name = "planted-two-back-llama-s1"
    folder = build_planted(name, tmp_path / name, cfg=_short(name))
    record = planted_status(folder)
    assert record["confirmed"] and (folder / CONFIRMATION).is_file()
    circuit = read_circuit(folder)
    assert circuit.kind == "planted" and circuit.ablation == "resample" and str(circuit.heads) == "L0H2"
    assert str(circuit.distractors) == "L1H0" and circuit.task["task"] == "planted-two-back"
    assert {"clean", "corrupted", "true_ablated", "others_ablated", "top1_clean"} <= set(circuit.bounds)
    for checkpoint in read_manifest(folder)["checkpoints"]:
        assert read_circuit(folder / "checkpoints" / checkpoint["revision"]) == circuit
    pair = circuit.build_pair()
    assert pair.n_examples == 16 and pair.clean.spec["task"] == "planted-two-back"
    assert np.asarray(record["patching"]["denoise"]["scores"]).shape == (2, 4)
    assert set(record["pattern_attention"]) == {"L0H2", "L1H0"}
