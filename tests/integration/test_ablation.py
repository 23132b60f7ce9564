"""Tests of the ablation engine, control sets, statistics and verdicts (core/ablation.py).

Models are tiny random-init GPT-NeoX checkpoints saved with `save_pretrained` and booted with
TransformerBridge (raw weights), so every engine result can be checked against a hand-made
reference: weights zeroed in the HF model, hand-written hooks, or a full recomputation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from core.ablation.engine import (
    Ablation,
    AblationCancelled,
    AblationResult,
    ablated_logits_fn,
    ablation_study,
    any_layer_random_controls,
    bootstrap_ci,
    closure_verdict,
    compute_means,
    count_any_layer_sets,
    count_matched_sets,
    empirical_rank_p,
    greedy_exact_match,
    is_damaging,
    matched_random_controls,
    query_metrics,
    recipe_verdict,
    run_conditions,
    upper_bound,
    z_score,
)
from core.errors import HeadLabError
from core.heads import HeadSet

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference"
CLOSURE = REFERENCE / "coactivation-closure" / "results"

N_LAYERS, N_HEADS, D_MODEL = 3, 4, 64
D_HEAD = D_MODEL // N_HEADS


# ---------------------------------------------------------------------------------------------
# Tiny models and batches
# ---------------------------------------------------------------------------------------------


def _build(folder: Path, parallel: bool, seed: int = 0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    from transformer_lens.model_bridge import TransformerBridge

    config = GPTNeoXConfig(
        vocab_size=260, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
        intermediate_size=128, max_position_embeddings=64, rotary_pct=1.0, use_parallel_residual=parallel,
        tie_word_embeddings=False, bos_token_id=256, eos_token_id=258, pad_token_id=257,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():  # non-zero biases, so a dropped or misplaced bias shows up
        gen = torch.Generator().manual_seed(seed + 1)
        for name, param in hf.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    hf.save_pretrained(str(folder))
    bridge = TransformerBridge.boot_transformers(str(folder), hf_model=hf, device="cpu")
    bridge.eval()
    return hf, bridge


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("neox_parallel"), parallel=True)


@pytest.fixture(scope="module")
def tiny_sequential(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("neox_sequential"), parallel=False, seed=3)


@dataclass(frozen=True)
class StandInBatch:
    """The fields of ProbeBatch the engine reads, with query positions that vary per example."""

    tokens: torch.Tensor
    query_pos: torch.Tensor
    target: torch.Tensor
    spec: dict


def _batch(n: int = 10, seq_len: int = 20, seed: int = 0) -> StandInBatch:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (n, seq_len), generator=gen)
    query_pos = torch.randint(5, seq_len, (n,), generator=gen)
    target = torch.randint(0, 256, (n,), generator=gen)
    return StandInBatch(tokens, query_pos, target, {"task": "stand-in", "seed": seed})


@torch.no_grad()
def _metrics_from_logits(logits: torch.Tensor, batch) -> dict[str, np.ndarray]:
    rows = torch.arange(batch.tokens.shape[0])
    return {k: v.double().numpy() for k, v in query_metrics(logits[rows, batch.query_pos], batch.target).items()}


def _assert_same(got, want: dict[str, np.ndarray], atol: float = 1e-5) -> None:
    for metric in ("loss", "target_logit"):
        np.testing.assert_allclose(got.values(metric), want[metric], atol=atol, rtol=0)
    for metric in ("top1", "top5"):
        np.testing.assert_array_equal(got.values(metric), want[metric])


# ---------------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------------


def test_prefix_reuse_gives_the_same_logits_as_start_at_layer(tiny):
    """The bridge's own start_at_layer is correct (but runs the lower blocks anyway, so it is not used)."""
    _, model = tiny
    tokens = _batch().tokens
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        resumed = model(cache["blocks.2.hook_in"], start_at_layer=2)
    torch.testing.assert_close(resumed, logits, atol=1e-5, rtol=0)


def test_ablating_nothing_changes_nothing(tiny):
    hf, model = tiny
    batch = _batch()
    clean, (nothing,) = run_conditions(model, batch, [Ablation()])
    with torch.no_grad():
        plain = _metrics_from_logits(hf(batch.tokens).logits, batch)
    _assert_same(clean, plain)
    _assert_same(nothing, plain)
    for metric in ("loss", "top1", "top5", "target_logit"):
        assert np.abs(nothing.delta(clean, metric)).max() <= 1e-5
    with torch.no_grad():
        torch.testing.assert_close(ablated_logits_fn(model, Ablation())(batch.tokens), hf(batch.tokens).logits, atol=1e-5, rtol=0)


@torch.no_grad()
def _zeroed_wo_metrics(hf, heads: HeadSet, batch) -> dict[str, np.ndarray]:
    saved = {}
    for layer, head in heads:
        weight = hf.gpt_neox.layers[layer].attention.dense.weight  # [d_model, n_heads*d_head]
        saved.setdefault(layer, weight.data.clone())
        weight.data[:, head * D_HEAD : (head + 1) * D_HEAD] = 0
    try:
        return _metrics_from_logits(hf(batch.tokens).logits, batch)
    finally:
        for layer, weight in saved.items():
            hf.gpt_neox.layers[layer].attention.dense.weight.data.copy_(weight)


@pytest.mark.parametrize("strategy,chunk_size", [("prefix", 1), ("prefix", 3), ("full", 1), ("full", 3), ("auto", None)])
def test_zero_ablation_equals_zeroed_output_weights(tiny, strategy, chunk_size):
    hf, model = tiny
    batch = _batch()
    selections = [HeadSet(((1, 2),)), HeadSet(((0, 1), (2, 3))), HeadSet(((2, 0), (2, 1))), HeadSet(((0, 0),))]
    clean, results = run_conditions(model, batch, [Ablation(s) for s in selections], chunk_size=chunk_size, strategy=strategy)
    for heads, result in zip(selections, results):
        want = _zeroed_wo_metrics(hf, heads, batch)
        _assert_same(result, want)
        assert np.abs(result.values("loss") - clean.values("loss")).max() > 1e-4  # the ablation did something


def test_prefix_reuse_equals_full_recomputation_and_skips_lower_blocks(tiny):
    hf, model = tiny
    batch = _batch(n=9, seed=1)
    conditions = [
        Ablation(HeadSet(((2, 1),))),
        Ablation(HeadSet(((1, 0), (1, 3))), mode="mean"),
        Ablation(HeadSet(((2, 2),)), mlp_layers=(1,)),
        Ablation(mlp_layers=(2,), mode="mean"),
        Ablation(HeadSet(((0, 2),))),
    ]
    calls = {layer: 0 for layer in range(N_LAYERS)}
    handles = [
        hf.gpt_neox.layers[layer].register_forward_pre_hook(lambda *a, layer=layer: calls.__setitem__(layer, calls[layer] + 1))
        for layer in range(N_LAYERS)
    ]
    try:
        clean_p, prefix = run_conditions(model, batch, conditions, strategy="prefix")
        counted = dict(calls)
    finally:
        for handle in handles:
            handle.remove()
    clean_f, full = run_conditions(model, batch, conditions, strategy="full")
    _assert_same(clean_p, {m: clean_f.values(m) for m in ("loss", "top1", "top5", "target_logit")})
    for a, b in zip(prefix, full):
        _assert_same(a, {m: b.values(m) for m in ("loss", "top1", "top5", "target_logit")})
    # clean forward + the mean pre-pass + one condition starting at layer 0; the others start higher
    assert counted[0] == 3
    assert counted[2] == 2 + len(conditions)


@pytest.mark.parametrize("family", ["llama", "olmoe", "hhg", "gpt_neox_norotary"])
def test_prefix_reuse_across_architectures(family, tmp_path):
    """Block replay must match full forwards on every architecture the zoo uses (MoE MLPs included)."""
    from tests.tiny_models import save_tiny_model
    from transformer_lens.model_bridge import TransformerBridge

    save_tiny_model(family, tmp_path)
    model = TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    batch = _batch(n=6, seq_len=16, seed=8)
    conditions = [
        Ablation(HeadSet(((1, 0),))), Ablation(HeadSet(((0, 1), (1, 2))), mode="mean"),
        Ablation(mlp_layers=(1,)), Ablation(mlp_layers=(0,), mode="mean"),
    ]
    notes: list[str] = []
    _, prefix = run_conditions(model, batch, conditions, chunk_size=2, notes=notes)
    _, full = run_conditions(model, batch, conditions, strategy="full")
    assert any(note.startswith("prefix reuse:") for note in notes)
    for a, b in zip(prefix, full):
        _assert_same(a, {m: b.values(m) for m in ("loss", "top1", "top5", "target_logit")})


def test_failed_self_check_falls_back_to_full_forwards(tiny, monkeypatch):
    import core.ablation.engine as ablation_module

    hf, model = tiny
    batch = _batch(seed=9)
    real_tail = ablation_module._run_tail
    monkeypatch.setattr(ablation_module, "_run_tail", lambda *a, **k: real_tail(*a, **k) + 1.0)
    notes: list[str] = []
    heads = HeadSet(((2, 1),))
    _, (got,) = run_conditions(model, batch, [Ablation(heads)], notes=notes)
    assert any("full forward" in note for note in notes)
    _assert_same(got, _zeroed_wo_metrics(hf, heads, batch))


def test_stacked_conditions_and_example_chunks_match_the_loop(tiny):
    _, model = tiny
    batch = _batch(n=11, seed=2)
    conditions = [Ablation(HeadSet(((l, h),))) for l in range(N_LAYERS) for h in (0, 3)]
    _, loop = run_conditions(model, batch, conditions, chunk_size=1)
    _, stacked = run_conditions(model, batch, conditions, chunk_size=4, example_batch_size=4)
    for a, b in zip(loop, stacked):
        _assert_same(b, {m: a.values(m) for m in ("loss", "top1", "top5", "target_logit")})


def test_mean_ablation_equals_hand_computed_means(tiny):
    _, model = tiny
    batch = _batch(n=8, seed=4)
    layer, head = 1, 2
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
        mean = cache[f"blocks.{layer}.attn.hook_z"][:, :, head, :].mean(dim=0)  # [pos, d_head]

        def replace(z, hook):
            z = z.clone()
            z[:, :, head, :] = mean
            return z

        want = _metrics_from_logits(model.run_with_hooks(batch.tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", replace)]), batch)
    _, (got,) = run_conditions(model, batch, [Ablation(HeadSet(((layer, head),)), mode="mean")])
    _assert_same(got, want)
    means = compute_means(model, batch.tokens, Ablation(HeadSet(((layer, head),)), mode="mean"))
    torch.testing.assert_close(means[f"blocks.{layer}.attn.hook_z"][:, head], mean, atol=1e-6, rtol=0)


@pytest.mark.parametrize("which", ["tiny", "tiny_sequential"])
def test_mlp_zero_ablation_equals_zeroed_mlp_output_weights(which, request):
    hf, model = request.getfixturevalue(which)
    batch = _batch(seed=5)
    layer = 1
    dense = hf.gpt_neox.layers[layer].mlp.dense_4h_to_h
    weight, bias = dense.weight.data.clone(), dense.bias.data.clone()
    with torch.no_grad():
        dense.weight.data.zero_()
        dense.bias.data.zero_()
        want = _metrics_from_logits(hf(batch.tokens).logits, batch)
        dense.weight.data.copy_(weight)
        dense.bias.data.copy_(bias)
    _, (got,) = run_conditions(model, batch, [Ablation(mlp_layers=(layer,))])
    _assert_same(got, want)


def test_mlp_mean_ablation_equals_hand_computed_means(tiny_sequential):
    _, model = tiny_sequential
    batch = _batch(n=7, seed=6)
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
        name = "blocks.2.hook_mlp_out" if "blocks.2.hook_mlp_out" in cache else "blocks.2.mlp.hook_out"
        mean = cache[name].mean(dim=0)  # [pos, d_model]
        want = _metrics_from_logits(
            model.run_with_hooks(batch.tokens, fwd_hooks=[(name, lambda out, hook: mean.expand_as(out).clone())]), batch
        )
    _, (got,) = run_conditions(model, batch, [Ablation(mlp_layers=(2,), mode="mean")])
    _assert_same(got, want)


def test_engine_on_a_real_probe_batch(tiny):
    from core.tasks.induction import InductionProbeSpec, make_induction_probe

    hf, model = tiny
    batch = make_induction_probe(InductionProbeSpec(n_examples=6, seq_len=24, token_low=0, token_high=256, seed=0))
    heads = HeadSet(((1, 1), (2, 2)))
    _, (got,) = run_conditions(model, batch, [Ablation(heads)])
    _assert_same(got, _zeroed_wo_metrics(hf, heads, batch))


def test_progress_and_cancel(tiny):
    _, model = tiny
    batch = _batch(n=6)
    seen = []
    run_conditions(model, batch, [Ablation(HeadSet(((1, h),))) for h in range(3)], progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (4, 4) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    with pytest.raises(AblationCancelled, match="cancelled"):
        run_conditions(model, batch, [Ablation(HeadSet(((1, 0),)))], cancel=lambda: True)


def test_sequence_helpers(tiny):
    _, model = tiny
    # a hand-made logits_fn that always predicts "last token + 1": answers 1 and 3 are right, 2 is not
    def plus_one(tokens):
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 20)
        logits[torch.arange(tokens.shape[0])[:, None], torch.arange(tokens.shape[1])[None, :], (tokens + 1) % 20] = 1.0
        return logits

    prompts = torch.tensor([[1, 2], [5, 6], [7, 8]])
    answers = torch.tensor([[3, 4], [7, 9], [9, 10]])
    assert greedy_exact_match(plus_one, prompts, answers) == pytest.approx(2 / 3)
    ablation = Ablation(HeadSet(((1, 0),)), mode="mean")
    with pytest.raises(HeadLabError, match="compute_means"):
        ablated_logits_fn(model, ablation)
    tokens = _batch().tokens
    means = compute_means(model, tokens, ablation)
    fn = ablated_logits_fn(model, ablation, means)
    assert fn(tokens[:, :12]).shape == (tokens.shape[0], 12, 260)
    with pytest.raises(HeadLabError, match="positions"):
        fn(torch.zeros(2, tokens.shape[1] + 1, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# Control sets
# ---------------------------------------------------------------------------------------------


def test_matched_random_controls_respect_layers_disjointness_distinctness_and_seed():
    selection = HeadSet(((2, 1), (2, 5), (5, 0)))
    draws = matched_random_controls(selection, n_layers=8, n_heads=8, n_draws=25, seed=123)
    assert len(draws) == 25 and draws.note == ""
    assert len({d.heads for d in draws}) == 25
    for d in draws:
        assert d.count_per_layer() == {2: 2, 5: 1}
        assert not set(d.heads) & set(selection.heads)
    again = matched_random_controls(selection, 8, 8, 25, seed=123)
    assert [d.heads for d in again] == [d.heads for d in draws]
    other = matched_random_controls(selection, 8, 8, 25, seed=7)
    assert [d.heads for d in other] != [d.heads for d in draws]


def test_matched_draws_reproduce_the_reference_layer0_controls():
    """closure_test_olmo_cluster2 draws 5 L0 heads from the other 11 with RandomState(0)."""
    data = json.loads((CLOSURE / "olmo_1b_ising" / "closure_test.json").read_text())
    selection = HeadSet(tuple((0, h) for h in (0, 1, 2, 10, 13)))
    draws = matched_random_controls(selection, n_layers=16, n_heads=16, n_draws=5, seed=0)
    assert [[h for _, h in d] for d in draws] == [c["heads"] for c in data["matched_random_controls"]]


def test_any_layer_draws_reproduce_the_reference_natural_text_controls():
    data = json.loads((CLOSURE / "olmo_1b_nat_ising" / "closure_test.json").read_text())
    selection = HeadSet(tuple(tuple(h) for h in data["candidate_ablation"]["ablated_heads"]))
    draws = any_layer_random_controls(selection, n_layers=16, n_heads=16, n_draws=5, seed=0)
    assert [d.heads for d in draws] == [HeadSet(tuple(tuple(h) for h in c["heads"])).heads for c in data["controls"]]
    for d in draws:
        assert len(d) == len(selection) and not set(d.heads) & set(selection.heads)


def test_count_matched_sets_and_enumeration():
    assert count_matched_sets(HeadSet(((0, 0),)), n_heads=4) == 3
    assert count_matched_sets(HeadSet(((0, 0), (0, 1))), n_heads=4) == 1
    assert count_matched_sets(HeadSet(((0, 0), (1, 0), (1, 1))), n_heads=4) == 3
    assert count_matched_sets(HeadSet(((0, 0), (0, 1), (0, 2))), n_heads=4) == 0
    assert count_matched_sets(HeadSet(((3, 1), (3, 2))), n_heads=8) == 15
    selection = HeadSet(((0, 0), (1, 0), (1, 1)))
    draws = matched_random_controls(selection, n_layers=2, n_heads=4, n_draws=10)
    assert len(draws) == 3 and draws.n_possible == 3 and "only 3" in draws.note
    assert {d.heads for d in draws} == {((0, h), (1, 2), (1, 3)) for h in (1, 2, 3)}
    exact = matched_random_controls(selection, n_layers=2, n_heads=4, n_draws=3)
    assert len(exact) == 3 and exact.note == ""
    assert count_any_layer_sets(HeadSet(((0, 0),)), n_layers=1, n_heads=3) == 2
    small = any_layer_random_controls(HeadSet(((0, 0),)), n_layers=1, n_heads=3, n_draws=5)
    assert {d.heads for d in small} == {((0, 1),), ((0, 2),)} and "only 2" in small.note


def test_any_layer_controls_and_upper_bound():
    selection = HeadSet(((1, 0), (1, 1), (1, 2)))  # more than half of layer 1 of 4 heads
    with pytest.raises(HeadLabError, match="more than half.*any-layer"):
        matched_random_controls(selection, n_layers=3, n_heads=4, n_draws=5)
    draws = any_layer_random_controls(selection, n_layers=3, n_heads=4, n_draws=6, seed=1)
    assert len({d.heads for d in draws}) == 6
    for d in draws:
        assert len(d) == 3 and not set(d.heads) & set(selection.heads)
    assert upper_bound(HeadSet(((1, 0), (3, 2))), n_heads=2).heads == ((1, 0), (1, 1), (3, 0), (3, 1))


@pytest.mark.parametrize(
    "selection,match",
    [(HeadSet(), "empty"), (HeadSet(((5, 0),)), "outside this model"), (HeadSet(((0, 9),)), "outside this model")],
)
def test_bad_selections(selection, match):
    with pytest.raises(HeadLabError, match=match):
        matched_random_controls(selection, n_layers=4, n_heads=4, n_draws=3)
    with pytest.raises(HeadLabError, match=match):
        any_layer_random_controls(selection, n_layers=4, n_heads=4, n_draws=3)


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def test_z_score_hand_made():
    assert z_score(3.0, [1.0, 2.0, 3.0]) == pytest.approx(1.0 / np.sqrt(2.0 / 3.0))
    assert z_score(1.5, [1.0, 1.0, 1.0]) == pytest.approx(0.5 / 1e-9)
    assert z_score(-1.0, [0.0, 2.0]) == pytest.approx(-2.0)
    with pytest.raises(HeadLabError):
        z_score(1.0, [])


def test_empirical_rank_p_hand_made():
    rp = empirical_rank_p(5.0, [1.0, 2.0, 5.0, 6.0], damage_sign=+1)
    assert (rp.rank, rp.p) == (3, pytest.approx(3 / 5))
    rp = empirical_rank_p(-0.5, [-0.1, -0.6, 0.0], damage_sign=-1)
    assert (rp.rank, rp.p) == (2, pytest.approx(2 / 4))
    rp = empirical_rank_p(19.0, list(range(19)), damage_sign=+1)
    assert (rp.rank, rp.p) == (1, pytest.approx(1 / 20))


def test_bootstrap_ci_hand_made():
    assert bootstrap_ci([0.25] * 30) == (pytest.approx(0.25), pytest.approx(0.25))
    deltas = np.array([0.0, 1.0] * 200)  # mean 0.5, standard error 0.5 / sqrt(400) = 0.025
    low, high = bootstrap_ci(deltas, n_boot=4000, seed=0)
    assert low == pytest.approx(0.5 - 1.96 * 0.025, abs=0.006)
    assert high == pytest.approx(0.5 + 1.96 * 0.025, abs=0.006)
    assert bootstrap_ci(deltas, seed=3) == bootstrap_ci(deltas, seed=3)
    narrow = bootstrap_ci(deltas, level=0.5, seed=0)
    assert low < narrow[0] < narrow[1] < high


def test_direction_checks():
    assert is_damaging("loss", 0.1) and not is_damaging("loss", -0.1)
    for metric in ("top1", "top5", "target_logit", "acc_top1", "mean_logit_B"):
        assert is_damaging(metric, -0.1) and not is_damaging(metric, 0.1)
    with pytest.raises(HeadLabError, match="not defined"):
        is_damaging("exact_match", 0.1)


def _recipe_case(n=19, cand_loss=1.0, cand_top1=-0.5, clean_top1=0.6, ub_top1=-0.58, best_control=0.18):
    controls = {"loss": list(np.linspace(0.0, best_control, n)), "top1": list(np.linspace(0.0, -0.05, n))}
    return recipe_verdict({"loss": cand_loss, "top1": cand_top1}, controls, clean_top1, {"top1": ub_top1})


def test_recipe_verdict_hand_made():
    assert _recipe_case().label == "causal"
    assert _recipe_case(best_control=1.2).label == "not causal"  # one control hurts the loss more
    assert _recipe_case(cand_top1=-0.01).label == "not causal"  # top-1 barely moves
    assert _recipe_case(ub_top1=-0.3).label == "not causal"  # upper bound removes only 50%
    assert _recipe_case(clean_top1=0.1, ub_top1=-0.1).label == "inconclusive"
    assert _recipe_case(n=18).label == "inconclusive"
    loose = recipe_verdict({"loss": 1.0, "top1": -0.5}, {"loss": [0.1] * 5, "top1": [0.0] * 5}, 0.6, {"top1": -0.58}, min_controls=5)
    assert loose.label == "causal" and "5" in loose.rule


def test_closure_verdict_hand_made():
    ctrl = {"loss": [0.0, 0.1, 0.2], "top1": [0.0, -0.01, -0.02], "target_logit": [0.0, -0.1, -0.2]}
    strong = {"loss": 1.0, "top1": -0.2, "target_logit": -2.0}
    assert closure_verdict(strong, ctrl).label == "pass"
    assert closure_verdict(strong, ctrl, rule="reference").label == "pass"
    assert closure_verdict(strong, ctrl, headline="loss").label == "pass"
    weak = {"loss": 0.15, "top1": -0.015, "target_logit": -0.15}  # damaging but inside the controls
    assert closure_verdict(weak, ctrl).label == "fail"
    assert "z_target_logit = -0.61 is not beyond -1.8." in closure_verdict(weak, ctrl).reasons
    assert "z_loss = +0.61 is not beyond +1.8." in closure_verdict(weak, ctrl, headline="loss").reasons
    assert closure_verdict(weak, ctrl, rule="reference").label == "fail"
    mixed = {"loss": 1.0, "top1": 0.05, "target_logit": -2.0}  # top-1 goes up: not every delta is damage
    assert closure_verdict(mixed, ctrl).label == "fail"
    wrong = {"loss": -1.0, "top1": -0.01, "target_logit": -0.1}
    verdict = closure_verdict(wrong, ctrl)
    assert verdict.label == "fails in the wrong direction" and "lowers the loss" in verdict.reasons[0]
    with pytest.raises(HeadLabError, match="does not define"):
        closure_verdict({"loss": 1.0}, {"loss": [0.0, 0.1]}, headline="logit")
    with pytest.raises(HeadLabError, match="not defined"):
        closure_verdict({"exact_match": -0.3}, {"exact_match": [0.0]})
    with pytest.raises(HeadLabError, match="rule"):
        closure_verdict(strong, ctrl, rule="vibes")


# ---------------------------------------------------------------------------------------------
# Reproducing the published closure statistics (reference/MANIFEST.md section (a))
# ---------------------------------------------------------------------------------------------


def _reference_deltas(baseline: dict, candidate: dict, controls: list[dict], metrics: dict[str, str]):
    cand = {ours: candidate[theirs] - baseline[theirs] for ours, theirs in metrics.items()}
    ctrl = {ours: [c[theirs] - baseline[theirs] for c in controls] for ours, theirs in metrics.items()}
    return cand, ctrl


def test_reference_olmo_natural_text_passes():
    data = json.loads((CLOSURE / "olmo_1b_nat_ising" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "target_logit": "mean_logit_target"}
    cand, ctrl = _reference_deltas(data["baseline"], data["candidate_ablation"], data["controls"], metrics)
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert z["loss"] == pytest.approx(36.44, abs=0.005)
    assert z["top1"] == pytest.approx(-50.59, abs=0.005)
    assert z["target_logit"] == pytest.approx(-50.93, abs=0.005)
    assert z["loss"] == pytest.approx(data["summary"]["z_dloss"], abs=1e-6)
    assert closure_verdict(cand, ctrl).label == "pass"
    assert closure_verdict(cand, ctrl, rule="reference").label == "pass"
    assert empirical_rank_p(cand["loss"], ctrl["loss"], +1).rank == 1


def test_reference_olmo_synthetic_passes():
    data = json.loads((CLOSURE / "olmo_1b_ising" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "top5": "acc_top5", "target_logit": "mean_logit_B"}
    cand, ctrl = _reference_deltas(data["baseline"], data["ablate_cluster2"], data["matched_random_controls"], metrics)
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert round(z["loss"], 2) == 1.83
    assert round(z["top1"], 2) == -1.97
    assert round(z["top5"], 2) == -2.13
    assert round(z["target_logit"], 2) == -2.68
    verdict = closure_verdict(cand, ctrl)
    assert verdict.label == "pass" and "paper" in verdict.rule
    assert closure_verdict(cand, ctrl, headline="loss").label == "pass"
    assert closure_verdict(cand, ctrl, rule="reference").label == "pass"


def test_reference_olmoe_route_conditional_fails_in_the_wrong_direction():
    data = json.loads((CLOSURE / "olmoe_route_conditioned" / "closure_test.json").read_text())
    metrics = {"loss": "loss", "top1": "acc_top1", "target_logit": "mean_logit_target"}
    split = "cluster1"
    cand, ctrl = _reference_deltas(
        data["baseline"][split], data["candidate_ablation"][split], [c[split] for c in data["controls"]], metrics
    )
    z = {m: z_score(cand[m], ctrl[m]) for m in metrics}
    assert round(z["loss"], 2) == -5.64
    assert round(z["top1"], 2) == -0.22
    assert round(z["target_logit"], 2) == -2.97
    assert z["loss"] == pytest.approx(data["summary"]["z_candidate_vs_controls_cluster1"], abs=1e-6)
    for rule in ("paper", "reference"):
        assert closure_verdict(cand, ctrl, rule=rule).label == "fails in the wrong direction"


# ---------------------------------------------------------------------------------------------
# The study and its result
# ---------------------------------------------------------------------------------------------


def test_ablation_study_result_roundtrip(tiny):
    _, model = tiny
    batch = _batch(n=8, seed=7)
    result = ablation_study(model, batch, HeadSet(((1, 0),)), n_controls=5, n_boot=200)
    assert len(result.controls) == 3 and any("only 3" in note for note in result.notes)
    assert set(result.verdicts) == {"recipe", "closure_paper", "closure_reference"}
    assert result.verdicts["recipe"].label in ("inconclusive", "causal", "not causal")
    stats = result.stats["loss"]
    assert stats["candidate_delta"] == pytest.approx(result.candidate.mean("loss") - result.clean.mean("loss"))
    assert stats["z"] == pytest.approx(z_score(stats["candidate_delta"], stats["control_deltas"]))
    assert stats["candidate_ci"][0] <= stats["candidate_delta"] <= stats["candidate_ci"][1]
    assert result.upper_bound.ablation.heads == upper_bound(HeadSet(((1, 0),)), N_HEADS)
    back = AblationResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.to_json() == result.to_json()


def test_ablation_study_bad_input(tiny):
    _, model = tiny
    batch = _batch(n=4)
    with pytest.raises(HeadLabError, match="empty"):
        ablation_study(model, batch, HeadSet(), n_controls=3)
    with pytest.raises(HeadLabError, match="more than half"):
        ablation_study(model, batch, HeadSet(((1, 0), (1, 1), (1, 2))), n_controls=3)
    with pytest.raises(HeadLabError, match="outside this model"):
        ablation_study(model, batch, HeadSet(((7, 0),)), n_controls=3)
    with pytest.raises(HeadLabError, match="not defined"):
        ablation_study(model, batch, HeadSet(((1, 0),)), n_controls=3, metrics=("loss", "exact_match"))
    with pytest.raises(HeadLabError, match="outside this model"):
        run_conditions(model, batch, [Ablation(mlp_layers=(9,))])
    with pytest.raises(HeadLabError, match="mode"):
        Ablation(HeadSet(((0, 0),)), mode="resample")
    # more than half of a layer is fine when any-layer controls are asked for
    ok = ablation_study(model, batch, HeadSet(((1, 0), (1, 1), (1, 2))), n_controls=2, controls="any-layer", n_boot=50)
    assert len(ok.controls) == 2 and "recipe" not in ok.verdicts
