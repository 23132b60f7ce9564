"""Hard planted models (core/zoo/known/hard.py) and the benchmark's issue-43 measures (benchmark_report.py): the rows
and pairs on hand-checked positions, the per-row resample hook against the tensor it rewrites, the confirmation rule
on hand-made numbers, a short build, ACDC's sweep ROC, separations and true-head ranks on hand-made inputs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from core.cli.known_run import bounds_text
from core.errors import HeadLabError
from core.heads import parse_heads
from core.pipelines import benchmark_cases
from core.pipelines.benchmark_report import (head_to_head_scope, separations, sweep_roc, true_edge_ranks,
                                             true_head_ranks)
from core.tasks.known import known_task
from core.zoo.known import KNOWN_MODELS, edge_text, read_circuit
from core.zoo.known import hard
from core.zoo.known.hard import (HARD_CONFIGS, HARD_RULE, IoiPairSpec, build_hard, guide_keys, hard_rule, ioi_rows,
                                 induction_rows, quiet_rows, row_resample_hooks, training_rows)
from core.zoo.known.planted import BOS, CONFIRMATION, MARK, output_projection, planted_status
from core.zoo.train import build_model


def test_ioi_rows_hold_s_twice_io_once_and_distinct_fillers():
    rows = ioi_rows(np.random.RandomState(0), 50)
    for i, row in enumerate(rows["tokens"]):
        s, io = rows["s_name"][i], rows["io_name"][i]
        assert row[0] == BOS and row[-1] == MARK and s != io
        assert list(np.flatnonzero(row == s)) == [rows["s1"][i], rows["s2"][i]] and list(np.flatnonzero(row == io)) == [rows["io"][i]]
        fillers = [t for t in row[1:-1] if t >= hard.FILLER_LOW]
        assert len(fillers) == len(set(fillers)) == len(row) - 5


def test_ioi_pairs_swap_the_first_s_for_io_and_read_back_through_known_task():
    pair = known_task(IoiPairSpec(n_examples=8, seed=3).to_json()).build_pair()
    rows = ioi_rows(np.random.RandomState(3), 8, hard.SEQ_LEN)
    diff = (pair.clean.tokens != pair.corrupted_tokens).numpy()
    assert (diff.sum(axis=1) == 1).all() and (np.argmax(diff, axis=1) == rows["s1"]).all()
    assert (pair.clean.target.numpy() == rows["io_name"]).all() and (pair.corrupted_target.numpy() == rows["s_name"]).all()
    with pytest.raises(HeadLabError, match="seq_len"):
        IoiPairSpec(n_examples=2, seq_len=5)


def test_guide_keys_point_at_the_planted_positions():
    rows = {"tokens": np.zeros((2, 16), dtype=np.int64), "s1": np.array([2, 3]), "s2": np.array([9, 10]),
            "io": np.array([5, 1]), "p": np.array([1, 3])}
    dup = guide_keys("ioi", rows, "duplicate-token")
    assert dup.sum() == 2 and dup[0, 9, 2] and dup[1, 10, 3]
    assert guide_keys("ioi", rows, "name-mover")[1, 15, 1] and guide_keys("ioi", rows, "s-inhibition")[0, 15, 9]
    induction = guide_keys("induction", rows, "induction")
    assert induction.sum() == 2 and induction[0, 15, 2] and induction[1, 15, 4]
    prev = guide_keys("induction", rows, "previous-token")
    assert prev.sum() == 2 * 15 and prev[0, 5, 4] and not prev[0, 0].any()


def test_induction_rows_answer_the_token_after_the_earlier_a():
    rows = induction_rows(5, 6)
    for i, row in enumerate(rows["tokens"]):
        p = rows["p"][i]
        assert row[-1] == row[p] and rows["target"][i] == row[p + 1]


def test_skip_induction_rows_answer_the_token_two_after_the_earlier_a_and_pairs_swap_a_and_c():
    rows = hard.skip_induction_rows(5, 6)
    for i, row in enumerate(rows["tokens"]):
        p = rows["p"][i]
        assert row[-1] == row[p] and rows["target"][i] == row[p + 2] and list(row).count(row[p]) == 2
    guide = guide_keys("skip-induction", rows, "induction")
    assert guide.sum() == 6 and all(guide[i, 15, rows["p"][i] + 2] for i in range(6))
    cfg = hard.HardConfig(name="hard-skip-induction-s0", seed=0, **hard.SKIP_INDUCTION_RECIPE)  # the seventh round's
    tokens, targets, _, guides = training_rows(cfg, 0)
    assert (tokens[0::2, -1] != MARK).all() and guides["L2H1"][0::2].sum() == cfg.batch_size // 2
    pair = known_task(hard.task_record("skip-induction", 8, 1)).build_pair()
    changed = (pair.clean.tokens != pair.corrupted_tokens).numpy()
    assert (changed.sum(axis=1) == 2).all()
    for i in range(8):  # the corrupted prompt's final token now follows its earlier occurrence by ... D
        tokens, p = pair.corrupted_tokens[i].numpy(), int(pair.clean.induction_pos[i]) - 2
        earlier = int(np.flatnonzero(tokens[:-1] == tokens[-1])[0])
        assert tokens[earlier + 2] == pair.corrupted_target[i] and earlier != p


def test_marked_induction_rows_end_a_marker_guides_rest_the_induction_heads_there_and_pairs_swap_a_and_c():
    rows = hard.marked_induction_rows(5, 6)
    for i, row in enumerate(rows["tokens"]):
        p = rows["p"][i]
        assert row[-1] == hard.INDUCTION_MARK and row[-2] == row[p] and rows["target"][i] == row[p + 1]
        assert list(row).count(row[p]) == 2 and p + 1 < 14  # the pair before the repeated A at q - 1 = 14
    induction, mover = (guide_keys("marked-induction", rows, pattern) for pattern in ("induction", "mover"))
    assert induction.sum() == 12 and all(induction[i, 14, rows["p"][i] + 1] and induction[i, 15, 15] for i in range(6))
    assert mover.sum() == 6 and mover[:, 15, 14].all()
    cfg = hard.HardConfig(name="hard-marked-induction-s0", seed=0, **hard.MARKED_INDUCTION_RECIPE)  # the eighth round's
    assert len(cfg.circuit) == 4 and {layer for layer, _ in cfg.circuit_heads} == {0, 1, 2, 3}
    pair = known_task(hard.task_record("marked-induction", 8, 1)).build_pair()
    changed = (pair.clean.tokens != pair.corrupted_tokens).numpy()
    assert (changed.sum(axis=1) == 2).all()
    for i in range(8):  # the corrupted prompt's repeated A now follows its earlier occurrence by D
        tokens = pair.corrupted_tokens[i].numpy()
        earlier = int(np.flatnonzero(tokens[:-2] == tokens[-2])[0])
        assert tokens[earlier + 1] == pair.corrupted_target[i] != pair.clean.target[i]
    with pytest.raises(HeadLabError, match="marker"):
        hard.MarkedInductionSpec(n_examples=2, seq_len=16, token_low=0, token_high=48, marker=1)


def test_early_answer_weight_adds_the_answer_before_the_last_position_and_older_builds_keep_their_config(tmp_path):
    cfg = hard.HardConfig(name="hard-marked-induction-s0", seed=0, **hard.MARKED_INDUCTION_RECIPE)
    cfg = replace(cfg, steps=1, n_log_checkpoints=2, d_model=32, d_ff=32,
                  formed_check_step=0, max_attempts=1)
    plain = hard.train_hard(replace(cfg, early_answer_weight=0.0), tmp_path / "plain")
    both = hard.train_hard(cfg, tmp_path / "both")
    # step 0, the same initialization and rows: the last position's cross-entropy (about ln 64), then the early one too
    assert 1.8 < both["curves"]["task_loss"][0] / plain["curves"]["task_loss"][0] < 2.2
    built = HARD_CONFIGS["hard-ioi-s0"].to_json()  # a model built before the knob existed ...
    del built["early_answer_weight"]
    assert hard.training_config(built) == hard.training_config(HARD_CONFIGS["hard-ioi-s0"].to_json())  # ... is the recipe's
    assert hard.training_config({**built, "early_answer_weight": 1.0}) != hard.training_config(built)


def test_training_rows_live_heads_per_task_and_randomly_dead_primaries():
    cfg = replace(HARD_CONFIGS["hard-induction-s0"], **hard.INDUCTION_WITH_PREVIOUS_TOKEN_BACKUP)  # two backup pairs
    assert cfg.backup_pairs == [("L1H5", "L2H1"), ("L0H2", "L0H4")]
    tokens, targets, dead, guides = training_rows(cfg, 4)
    again = training_rows(cfg, 4)
    assert torch.equal(tokens, again[0]) and torch.equal(dead, again[2])
    circuit, neighbours = cfg.circuit_heads, cfg.neighbour_heads
    for layer, head in neighbours:
        assert not dead[1::2, layer, head].any() and dead[0::2, layer, head].all()
    for layer, head in circuit:
        assert dead[1::2, layer, head].all()
        if f"L{layer}H{head}" not in {name for pair in cfg.backup_pairs for name in pair}:
            assert not dead[0::2, layer, head].any()  # live on every circuit row
    for primary, backup in cfg.backup_pairs:
        (pl, ph), = parse_heads(primary)
        (bl, bh), = parse_heads(backup)
        assert 0 < int(dead[0::2, pl, ph].sum()) < cfg.batch_size // 2  # resampled on some circuit rows, not all
        assert not (dead[0::2, pl, ph] & dead[0::2, bl, bh]).any()  # never both
    (l0, h0), (l1, h1) = parse_heads("L1H5,L0H2")
    assert not torch.equal(dead[0::2, l0, h0], dead[0::2, l1, h1])  # the pairs are drawn apart
    with pytest.raises(HeadLabError, match="each backup needs its primary"):
        replace(cfg, backup="L2H1")
    assert set(guides) == set(cfg.circuit) | set(cfg.neighbours)
    assert (tokens[0::2, -1] != MARK).all() and (tokens[1::2, -1] == MARK).all()  # induction rows even, ioi odd


def test_row_resample_hook_takes_dead_slices_from_two_rows_before():
    cfg = replace(HARD_CONFIGS["hard-induction-s0"], d_model=64, d_ff=64)
    model = build_model(cfg.model_config(), 0).eval()
    state = {"dead": torch.zeros((6, cfg.n_layers, 8), dtype=torch.bool)}
    state["dead"][:, 1, 3] = True
    state["dead"][2, 1, 5] = True
    seen = {}
    module = output_projection(model, "gpt_neox", 1)
    module.register_forward_pre_hook(lambda m, args: seen.__setitem__("before", args[0].clone()))
    row_resample_hooks(model, cfg, state)
    module.register_forward_pre_hook(lambda m, args: seen.__setitem__("after", args[0].clone()))
    with torch.no_grad():
        model(torch.randint(4, 64, (6, 16)))
    before, after = seen["before"].view(6, 16, 8, 8), seen["after"].view(6, 16, 8, 8)  # [row, pos, head, d_head]
    assert torch.equal(after[:, :, 3], before.roll(2, dims=0)[:, :, 3])
    assert torch.equal(after[2, :, 5], before[0, :, 5]) and torch.equal(after[3, :, 5], before[3, :, 5])
    untouched = [h for h in range(8) if h not in (3, 5)]
    assert torch.equal(after[:, :, untouched], before[:, :, untouched])


def test_a_dropped_backup_and_live_others_leave_the_recipe_s_draws_and_never_kill_both():
    """backup_drop_rate resamples the backup on circuit rows whose primary is live (never both), drawn after the
    primary's draw, which is the recipe's; live_others_rate leaves every head outside the circuit live (quiet) on
    some circuit rows and on no neighbour row."""
    cfg = replace(HARD_CONFIGS["hard-ioi-s0"], backup_drop_rate=0.0, live_others_rate=0.0)
    dropped = replace(cfg, backup_drop_rate=0.5, live_others_rate=0.5, live_others_from=0)
    (pl, ph), = parse_heads(cfg.primary)
    (bl, bh), = parse_heads(cfg.backup)
    _, _, plain, _ = training_rows(cfg, 7)
    _, _, dead, _ = training_rows(dropped, 7)
    assert torch.equal(dead[:, pl, ph], plain[:, pl, ph])  # the primary's draw is the recipe's
    circuit_rows = dead[0::2]
    assert not (circuit_rows[:, pl, ph] & circuit_rows[:, bl, bh]).any() and circuit_rows[:, bl, bh].any()
    quiet = quiet_rows(dropped, 7, dead)
    outside = torch.as_tensor(~cfg.circuit_heads.mask(cfg.n_layers, cfg.n_heads))
    rows = quiet.any(dim=(1, 2))
    assert rows[0::2].any() and not rows[1::2].any() and not (quiet & dead).any()
    assert all(torch.equal(quiet[r], outside) for r in torch.nonzero(rows).flatten().tolist())
    assert not quiet_rows(cfg, 7, plain.clone()).any()  # off
    assert not quiet_rows(replace(dropped, live_others_from=8), 7, dead.clone()).any()  # not before its first step


def test_quiet_heads_add_their_output_but_take_no_gradient():
    """A quiet head's slice reaches the output projection's output unchanged, but no gradient flows into it or into
    its columns of the output weights; a live head's does."""
    cfg = replace(HARD_CONFIGS["hard-induction-s0"], d_model=64, d_ff=64)
    model = build_model(cfg.model_config(), 0).eval()
    tokens = torch.randint(4, 64, (4, 16))
    plain = model(tokens).logits.detach()
    state = {"dead": torch.zeros((4, cfg.n_layers, 8), dtype=torch.bool),
             "quiet": torch.zeros((4, cfg.n_layers, 8), dtype=torch.bool)}
    state["quiet"][:, 1, 3] = True
    seen = {}
    module = output_projection(model, "gpt_neox", 1)
    module.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]) or args[0].retain_grad())
    row_resample_hooks(model, cfg, state)
    out = model(tokens).logits
    assert torch.allclose(out, plain, atol=1e-5)
    out.sum().backward()
    grad_x = seen["x"].grad.view(4, 16, 8, 8)  # [row, pos, head, d_head]
    grad_w = module.weight.grad.view(-1, 8, 8)  # [d_model, head, d_head]
    assert grad_x[:, :, 3].abs().max() == 0 and grad_w[:, 3].abs().max() == 0
    assert grad_x[:, :, 2].abs().max() > 0 and grad_w[:, 2].abs().max() > 0


def test_detach_resampled_leaves_no_gradient_in_the_donor_rows():
    """A head resampled on every row is only ever a donor: detached, its own slice takes no gradient; not detached,
    the rows it is copied into send gradient back. "idle" detaches the heads of neither task only (L1H3 is a
    neighbour of hard-induction, L1H4 is idle)."""
    cfg = replace(HARD_CONFIGS["hard-induction-s0"], d_model=64, d_ff=64)
    model = build_model(cfg.model_config(), 0).eval()
    tokens = torch.randint(4, 64, (4, 16))
    module = output_projection(model, "gpt_neox", 1)
    inputs, seen = {}, {}
    for detach in hard.DETACH_CHOICES:
        state = {"dead": torch.zeros((4, cfg.n_layers, 8), dtype=torch.bool)}
        state["dead"][:, 1, 3] = state["dead"][:, 1, 4] = True
        hook = module.register_forward_pre_hook(lambda m, args: inputs.__setitem__(detach, args[0]) or args[0].retain_grad())
        handles = row_resample_hooks(model, replace(cfg, detach_resampled=detach), state)  # after: sees the donors
        model(tokens).logits.sum().backward()
        for handle in [*handles, hook]:
            handle.remove()
        grad = inputs[detach].grad.view(4, 16, 8, 8)  # [row, pos, head, d_head]
        seen[detach] = (bool(grad[:, :, 3].abs().max() > 0), bool(grad[:, :, 4].abs().max() > 0))
    assert seen == {"none": (True, True), "idle": (True, False), "all": (False, False)}
    with pytest.raises(HeadLabError, match="detach_resampled"):
        replace(cfg, detach_resampled="yes")


def test_idle_heads_are_reset_once_and_never_trained_again(tmp_path, monkeypatch):
    """idle_reset_step: the heads of neither task get fresh weights at that step and keep them (to the weight decay);
    the circuit's heads keep training."""
    cfg = replace(HARD_CONFIGS["hard-ioi-s0"], steps=5, n_log_checkpoints=2, d_model=48, d_ff=48, idle_reset_step=2,
                  formed_check_step=0)
    built, after_reset = [], []
    monkeypatch.setattr(hard, "build_model", lambda *a: built.append(build_model(*a)) or built[-1])
    real_reset = hard.reset_idle_heads
    monkeypatch.setattr(hard, "reset_idle_heads", lambda model, *a: real_reset(model, *a) or after_reset.extend(
        p[i].detach().clone() for p, i in hard.idle_slices(model, cfg)))
    hard.train_hard(cfg, tmp_path)
    final = [p[i].detach() for p, i in hard.idle_slices(built[0], cfg)]
    assert len(final) == 3 * int(hard.idle_mask(cfg).sum()) == 3 * (48 - 7)
    assert all(torch.allclose(a, b, rtol=1e-3, atol=1e-7) for a, b in zip(after_reset, final))
    assert all(a.abs().max() == 0 for a in after_reset[1::3])  # biases reset to 0
    qkv = built[0].gpt_neox.layers[2].attention.query_key_value.weight  # L2H5 is in the circuit
    assert not torch.allclose(qkv[5 * 18:6 * 18], build_model(cfg.model_config(), cfg.seed).gpt_neox.layers[2]
                              .attention.query_key_value.weight[5 * 18:6 * 18])


def _passing(cfg):
    denoise = np.zeros((cfg.n_layers, cfg.n_heads))
    noise = np.ones_like(denoise)
    for layer, head in cfg.circuit_heads:
        denoise[layer, head], noise[layer, head] = 0.5, 0.5
    top1 = {"clean": 1.0, "true_ablated": 0.1, "others_ablated": 0.98, "neighbour_clean": 0.95, "neighbours_ablated": 0.1}
    for primary, backup in cfg.backup_pairs:
        top1.update({hard.ablated_key(primary): 0.95, hard.ablated_key(primary, backup): 0.2})
    return denoise, noise, top1, {edge: 0.3 for edge in cfg.edges}


def test_hard_rule_on_hand_made_numbers():
    cfg = HARD_CONFIGS["hard-ioi-s0"]
    denoise, noise, top1, edges = _passing(cfg)
    assert hard_rule(denoise, noise, cfg, top1, edges)["confirmed"]
    # a primary and its backup are exempt from the per-head effect bound (each alone moves little) ...
    denoise[4, 2] = noise[4, 2] = 0.01
    assert hard_rule(denoise, noise, cfg, top1, edges)["confirmed"]
    # ... other circuit heads are not, and a backup that does not take over fails, as do idle neighbours
    denoise[1, 3] = 0.1
    bad = hard_rule(denoise, noise, cfg, {**top1, "L4H2 ablated": 0.5, "neighbours_ablated": 0.9}, {**edges, cfg.edges[0]: 0.05})
    assert not bad["confirmed"] and len(bad["failures"]) == 4
    assert any("L1H3 denoise" in f for f in bad["failures"]) and any("no backup took over" in f for f in bad["failures"])
    assert bad["top1_drops"]["L4H2 ablated"] == pytest.approx(0.5) and HARD_RULE["primary_alone_top1_drop_max"] == 0.2
    # two backup pairs: each pair checked, and no circuit head left under the per-head bound
    cfg = replace(HARD_CONFIGS["hard-induction-s0"], **hard.INDUCTION_WITH_PREVIOUS_TOKEN_BACKUP)
    denoise, noise, top1, edges = _passing(cfg)
    denoise[0, 2] = denoise[0, 4] = denoise[1, 5] = denoise[2, 1] = 0.0
    good = hard_rule(denoise, noise, cfg, top1, edges)
    assert good["confirmed"] and good["min_true_effect"] is None
    bad = hard_rule(denoise, noise, cfg, {**top1, "L0H2+L0H4 ablated": 0.8}, edges)
    assert bad["failures"] == ["the primary L0H2 and its backup L0H4 ablated cost only 0.200 top-1"]


def test_short_build_writes_confirmation_and_on_a_pass_circuit_json(tmp_path, monkeypatch):
    """The first initialization fails the chain check (a top-1 no model reaches at step 2) and the second, the
    last allowed, runs to the end unchecked: the manifest records both, the checkpoints are the second's."""
    name = "hard-induction-s0"
    cfg = replace(HARD_CONFIGS[name], steps=4, n_log_checkpoints=2, d_model=64, d_ff=64, pair_examples=8,
                  formed_check_step=2, formed_top1_min=1.01, max_attempts=2)
    folder = build_hard(name, tmp_path / name, cfg=cfg)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["init_seed"] == cfg.seed + hard.INIT_SEED_STRIDE and manifest["final"]["steps"] == 4
    assert [(a["init_seed"], a["stopped_at_step"]) for a in manifest["failed_attempts"]] == [(cfg.seed, 2)]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == sorted(c["revision"] for c in manifest["checkpoints"])
    with pytest.raises(HeadLabError, match="max_attempts"):
        replace(cfg, formed_check_step=4)
    record = planted_status(folder)
    assert record is not None and not record["confirmed"] and not (folder / "circuit.json").exists()
    monkeypatch.setattr(benchmark_cases, "zoo_dir", lambda: tmp_path)  # the benchmark leaves it out and says why
    cases, notes = benchmark_cases.known_cases([name])
    assert cases == [] and len(notes) == 1 and "failed its confirmation rule" in notes[0] and record["failures"][0] in notes[0]
    assert set(record["top1"]) >= {"clean", "L1H5 ablated", "L1H5+L2H1 ablated", "L2H1 ablated", "neighbours_ablated"}
    assert set(record["path_patching"]) == set(cfg.edges) and record["edge_sweep"] == {}  # swept only when confirmed
    monkeypatch.setattr(hard, "train_hard", lambda *a, **k: pytest.fail("a complete model was retrained"))
    assert build_hard(name, folder, cfg=cfg) == folder
    with pytest.raises(HeadLabError, match="another config"):
        build_hard(name, folder, cfg=replace(cfg, steps=5))
    monkeypatch.setattr(hard, "hard_rule", lambda *a, **k: {"confirmed": True, "failures": [], "max_other_abs_effect": 0.0,
                                                             "min_true_effect": 1.0, "top1_drops": {}})
    swept = []  # the edge sweep: every edge from an earlier head into a circuit head's q, k, v; one outsider over the bar
    monkeypatch.setattr(hard, "edge_path_score", lambda model, pair, text: swept.append(text) or (
        -0.25 if text == "L0H6->L1H5.v" else 0.3 if text in cfg.edges else 0.05))
    record = hard.install_hard(cfg, folder)
    assert record["confirmed"] and record["measured_edges"] == ["L0H6->L1H5.v"]
    assert len(record["edge_sweep"]) == len(set(swept)) == 8 * 3 + 16 * 3  # into L1H5 and L2H1; L0H2 reads no head
    assert all(swept.count(edge) == 1 for edge in cfg.edges)  # the planted edges' scores reused, not patched again
    circuit = read_circuit(folder)
    assert [edge_text(e) for e in circuit.measured_edges] == ["L0H6->L1H5.v"] and len(circuit.true_edges) == 3
    # a confirmation from before the edge sweep is redone on the next build, without training
    stale = json.loads((folder / CONFIRMATION).read_text())
    del stale["edge_sweep"]
    (folder / CONFIRMATION).write_text(json.dumps(stale))
    assert build_hard(name, folder, cfg=cfg) == folder and "edge_sweep" in planted_status(folder)
    assert str(circuit.heads) == "L0H2,L1H5,L2H1" and str(circuit.distractors) == "L1H3,L2H5,L4H2"
    assert circuit.roles["L2H1"].startswith("backup") and circuit.task["task"] == "known-induction"
    assert all((folder / "checkpoints" / c["revision"] / "circuit.json").is_file() for c in manifest["checkpoints"])
    assert {n for n in KNOWN_MODELS if n.startswith("hard-")} == set(HARD_CONFIGS) and len(HARD_CONFIGS) == 6
    assert HARD_CONFIGS["hard-ioi-s0"].n_layers * HARD_CONFIGS["hard-ioi-s0"].n_heads == 48


def test_a_model_that_fails_the_rule_is_retrained_from_the_next_initialization(tmp_path, monkeypatch):
    """An unconfirmed attempt is recorded with its failures; with attempts to spare the next initialization trains,
    also when the build is run again under a larger max_attempts (it takes up where the last build stopped). A model
    built under other restart knobs is still the recipe's (RESTART_FIELDS), another training is not."""
    name = "hard-induction-s1"
    cfg = replace(HARD_CONFIGS[name], steps=3, n_log_checkpoints=2, d_model=32, d_ff=32, formed_check_step=0,
                  max_attempts=1)
    calls = []

    def confirm(cfg, folder):  # the first attempt fails the rule, the second passes
        calls.append(json.loads((folder / "manifest.json").read_text())["init_seed"])
        return {"confirmed": len(calls) == 2, "failures": [] if len(calls) == 2 else ["clean top-1 0.5 < 0.9"],
                "bounds": {}, "measured_edges": [], "edge_sweep": {}}

    monkeypatch.setattr(hard, "confirm_hard", confirm)
    folder = build_hard(name, tmp_path / name, cfg=cfg)
    assert calls == [cfg.seed] and not (folder / "circuit.json").exists()
    assert build_hard(name, folder, cfg=cfg) == folder and calls == [cfg.seed]  # no attempt left: kept as it is
    folder = build_hard(name, folder, cfg=replace(cfg, max_attempts=3))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert calls == [cfg.seed, cfg.seed + hard.INIT_SEED_STRIDE] == [a["init_seed"] for a in manifest["failed_attempts"]] + [manifest["init_seed"]]
    assert manifest["failed_attempts"][0]["failures"] == ["clean top-1 0.5 < 0.9"] and (folder / "circuit.json").is_file()
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == sorted(c["revision"] for c in manifest["checkpoints"])
    assert build_hard(name, folder, cfg=replace(cfg, max_attempts=5, formed_check_step=1)) == folder and len(calls) == 2
    with pytest.raises(HeadLabError, match="another config"):
        build_hard(name, folder, cfg=replace(cfg, backup_rate=0.3))


def test_known_lists_a_hard_model_by_the_top1_its_circuit_records():
    row = {"built": True, "ablation": "resample", "bounds": {"clean": 14.86, "corrupted": -14.1, "top1_clean": 0.9609,
                                                             "top1_true_ablated": 0.0469, "top1_others_ablated": 0.9766}}
    assert bounds_text(row) == "  top-1 0.961 clean, 0.047 circuit ablated, 0.977 others ablated (resample)"
    row["bounds"].update(true_ablated=2.6864, others_ablated=31.54)  # a planted model records the logit difference
    assert bounds_text(row) == "  logit diff 14.86 clean, 2.686 circuit ablated, 31.54 others ablated (resample)"
    assert bounds_text({**row, "built": False}) == ""


def test_sweep_roc_on_hand_made_points():
    truth = np.array([True, True, False, False, False])
    roc = sweep_roc([0.01, 0.1], [[0, 1, 2], [0]], truth)
    assert [(p["tpr"], p["fpr"]) for p in roc["points"]] == [(1.0, 1 / 3), (0.5, 0.0)]
    # (0,0) -> (0,0.5) -> (1/3,1) -> (1,1): 0 + (1/3)(0.5 + 1)/2 + (2/3)(1)
    assert roc["auc"] == pytest.approx(0.25 + 2 / 3)
    # only false edges kept (tpr 0, fpr 2/3): (0,0) -> (2/3,0) -> (1,1), area (1/3)(1/2): below chance
    assert sweep_roc([0.1], [[2, 3]], truth)["auc"] == pytest.approx(1 / 6)
    assert sweep_roc([0.1], [[0, 1]], truth)["auc"] == 1.0


def test_separations_and_true_head_ranks_on_hand_made_rows():
    rows = [{"level": "head", "task": "t", "measure": "roc_auc", "method": m, "n_scored": 3, "mean": mean, "low": low,
             "high": high} for m, mean, low, high in (("a", 0.9, 0.85, 0.95), ("b", 0.6, 0.5, 0.7), ("c", 0.8, 0.65, 0.9))]
    found = separations(rows)
    assert [(s["above"], s["below"]) for s in found] == [("a", "b")]
    close = [{**rows[0], "mean": 0.9998, "low": 0.9997, "high": 0.9999}, {**rows[1], "mean": 0.9994, "low": 0.9993,
                                                                          "high": 0.9995}]
    assert separations(close) == [] and len(separations(close, min_gap=0.0)) == 1  # disjoint, but 0.0004 apart
    result = {"case": {"name": "m", "task": "t", "truth": ["L0H1", "L1H0"]},
              "methods": [{"method": "x", "scores": [[0.0, 3.0], [1.0, 1.0]]}, {"method": "y", "scores": None}]}
    (ranks,) = true_head_ranks([result])
    assert ranks["ranks"] == {"L0H1": 1.0, "L1H0": 2.5} and ranks["n_heads"] == 4


def test_head_to_head_scope_and_true_edge_ranks_on_hand_made_edges():
    edges = ["embed->L0H0.q", "L0H0->L1H0.k", "L0H0->L1H1.q", "L0H0->logits", "MLP0->L1H0.v", "L1H0->logits"]
    scores = np.array([0.5, 0.4, 0.1, 0.9, 0.2, 0.3])
    truth = np.array([False, True, False, False, False, True])
    scores_in, truth_in, sweep_in = head_to_head_scope(edges, scores, truth, {"thresholds": [0.1, 0.3],
                                                                              "kept": [[1, 3, 5], [2]]})
    assert scores_in.tolist() == [0.4, 0.1] and truth_in.tolist() == [True, False]
    assert sweep_in == {"thresholds": [0.1, 0.3], "kept": [[0], [1]]}
    assert head_to_head_scope(edges, scores, np.array([True] + [False] * 5)) is None  # no true edge between heads
    result = {"case": {"name": "m", "task": "t", "edges": ["L0H0->L1H0.k", "L1H0->logits"]},
              "edge_methods": [{"method": "x", "edges": edges, "scores": scores.tolist()}, {"method": "y", "scores": None}]}
    (ranks,) = true_edge_ranks([result])
    assert ranks["ranks"] == {"L0H0->L1H0.k": 3.0, "L1H0->logits": 4.0}
    assert ranks["ranks_head_to_head"] == {"L0H0->L1H0.k": 1.0} and ranks["n_head_to_head"] == 2
    assert ranks["n_false_above"] == 2 and [e for e, _ in ranks["false_above"]] == ["L0H0->logits", "embed->L0H0.q"]
