"""Tests of the ablation engine and studies on tiny models (core/ablation/); the pure statistics are in tests/unit.

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

from transformer_lens.model_bridge import TransformerBridge
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

import core.ablation.engine as ablation_module
from core.ablation.clean_run import CleanRuns, clean_block_kwargs
from core.ablation.engine import AblationCancelled, ablated_logits_fn, greedy_exact_match, run_conditions
from core.ablation.replacements import Replacements, compute_replacements
from core.ablation.spec import Ablation
from core.stats.metrics import query_metrics
from core.ablation.study import AblationResult, AblationSettings, ablation_study
from core.bench.live import bench_live
from core.errors import HeadLabError
from core.heads import HeadSet
from core.probe import collect_head_stats
from core.stats.controls import upper_bound
from core.stats.inference import z_score
from core.tasks.induction import InductionProbeSpec
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo, save_tiny_model

N_LAYERS, N_HEADS, D_MODEL = 3, 4, 64
D_HEAD = D_MODEL // N_HEADS


# ---------------------------------------------------------------------------------------------
# Tiny models and batches
# ---------------------------------------------------------------------------------------------


def _build(folder: Path, parallel: bool, seed: int = 0, flat_unembed: bool = False, rotary_pct: float = 1.0):
    """flat_unembed: zero the unembedding, so every logit is exactly 0 (all tokens tied)."""
    config = GPTNeoXConfig(
        vocab_size=260, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
        intermediate_size=128, max_position_embeddings=64, rotary_pct=rotary_pct, use_parallel_residual=parallel,
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
        if flat_unembed:
            hf.get_output_embeddings().weight.zero_()
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
        # every other probe mode: heads only (the parallel-residual shortcut) and with an MLP (replayed)
        Ablation(HeadSet(((1, 1), (2, 0))), mode="mean-per-position"),
        Ablation(HeadSet(((1, 2),)), mode="resample", seed=5),
        Ablation(HeadSet(((1, 2),)), mlp_layers=(2,), mode="resample", seed=6),
        Ablation(HeadSet(((1, 3), (2, 3))), mode="token-wise-mean"),
        Ablation(HeadSet(((2, 0),)), mlp_layers=(1,), mode="token-wise-mean"),
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
    # Block 0 runs in the clean forward and the mean pre-pass only: the one condition starting there
    # ablates heads alone, so this parallel-residual layer is skipped (its clean output + the heads' change).
    assert counted[0] == 2
    # Block 2 (the last) runs whole in the clean forward, the mean pass and the 6 conditions that ablate its
    # heads or an MLP at or after it; the 3 others run it at the query rows (_neox_block_at_query), and the
    # first skips its own start layer 2.
    assert counted[2] == 2 + 6


@pytest.fixture(scope="module")
def tiny_partial_rotary(tmp_path_factory):
    """Pythia's rotary: the first quarter of each head's features rotated, the rest not."""
    return _build(tmp_path_factory.mktemp("neox_partial_rotary"), parallel=True, rotary_pct=0.25)


@pytest.mark.parametrize("kind", ["parallel", "sequential", "partial-rotary"])
@pytest.mark.parametrize("padding", ["none", "left"])
def test_the_last_block_at_the_query_rows_equals_the_whole_block(tiny, tiny_sequential, tiny_partial_rotary, kind,
                                                                 padding):
    """_neox_block_at_query against the bridge's own block at each row's query position, on the block's
    recorded call (rotary cos/sin, the causal mask; with left padding the mask hides the first tokens);
    full rotary and Pythia's partial rotary (the query rotated back to each key position either way)."""
    _, model = {"parallel": tiny, "sequential": tiny_sequential, "partial-rotary": tiny_partial_rotary}[kind]
    batch = _batch(n=6, seed=2)
    last = N_LAYERS - 1
    recorded = {}

    def keep(module, args, kwargs):  # what the engine's recorder keeps (no KV cache)
        recorded["x"] = args[0] if args else kwargs["hidden_states"]
        recorded["kwargs"] = clean_block_kwargs(args, kwargs)[1]

    mask = {}
    if padding == "left":
        pad = torch.ones_like(batch.tokens)
        pad[::2, :3] = 0  # every other row: three padding tokens first
        mask = {"attention_mask": pad}
    handle = model.blocks[last].register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model(batch.tokens, **mask)
        handle.remove()
        x, kwargs = recorded["x"], recorded["kwargs"]
        whole = model.blocks[last](x, **kwargs)
        whole = whole[0] if isinstance(whole, tuple) else whole  # [row, pos, d_model]
        rows = torch.arange(x.shape[0])
        at_query = ablation_module._neox_block_at_query(ablation_module._neox_layer(model, last), x, kwargs, rows,
                                                        batch.query_pos)
    assert at_query.shape == (x.shape[0], 1, x.shape[2])
    torch.testing.assert_close(at_query[:, 0], whole[rows, batch.query_pos], atol=1e-5, rtol=1e-5)


def test_rotating_one_tensor_equals_transformers_rotary():
    """_rotated (the query at its query row, the keys at every position) is apply_rotary_pos_emb's arithmetic,
    a partial rotary (the first 6 of 8 features) included."""
    gen = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 5, 8, generator=gen)  # [row, head, pos, d_head]
    cos, sin = torch.randn(2, 5, 6, generator=gen), torch.randn(2, 5, 6, generator=gen)  # [row, pos, rotary_dim]
    want_query, want_key = apply_rotary_pos_emb(query, key, cos, sin)
    assert torch.equal(ablation_module._rotated(query, cos[:, None], sin[:, None]), want_query)
    assert torch.equal(ablation_module._rotated(key, cos[:, None], sin[:, None]), want_key)
    at = torch.tensor([4, 1])  # each row's query position
    rows = torch.arange(2)
    one = ablation_module._rotated(query[rows, :, at][:, :, None], cos[rows, at][:, None, None], sin[rows, at][:, None, None])
    assert torch.equal(one[:, :, 0], want_query[rows, :, at])


def test_a_kept_clean_run_serves_later_studies_with_the_same_numbers(tiny):
    """CleanRuns: one clean forward serves studies on other layers and modes; numbers equal a fresh run's;
    another batch is not served from it."""
    _, model = tiny
    batch, other = _batch(n=8, seed=4), _batch(n=8, seed=5)
    studies = [[Ablation(HeadSet(((1, 0), (1, 2))))], [Ablation(HeadSet(((2, 1),)), mode="mean"), Ablation(mlp_layers=(1,))]]
    forwards = []
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        kept = CleanRuns()
        reused = [run_conditions(model, batch, conditions, clean_runs=kept) for conditions in studies]
        assert len(forwards) == 1 + 1  # block 0 ran in the clean forward and the pass measuring means, nothing else
        assert kept.find(model, batch) is not None and kept.find(model, other) is None
        run_conditions(model, other, studies[0], clean_runs=kept)
        assert len(forwards) == 3  # a new clean forward for the other batch
    finally:
        handle.remove()
    for conditions, (clean, results) in zip(studies, reused):
        want_clean, want = run_conditions(model, batch, conditions)
        for got, expected in zip([clean, *results], [want_clean, *want]):
            for metric in ("loss", "target_logit", "top1", "top5"):
                np.testing.assert_array_equal(got.values(metric), expected.values(metric))


@pytest.mark.parametrize("family", ["llama", "olmoe", "hhg", "gpt_neox_norotary"])
def test_prefix_reuse_across_architectures(family, tmp_path):
    """Block replay must match full forwards on every architecture the zoo uses (MoE MLPs included)."""
    save_tiny_model(family, tmp_path)
    model = TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    batch = _batch(n=6, seq_len=16, seed=8)
    conditions = [
        Ablation(HeadSet(((1, 0),))), Ablation(HeadSet(((0, 1), (1, 2))), mode="mean"),
        Ablation(mlp_layers=(1,)), Ablation(mlp_layers=(0,), mode="mean"),
        Ablation(HeadSet(((0, 2),)), mode="mean-per-position"), Ablation(HeadSet(((1, 1),)), mode="resample", seed=2),
        Ablation(HeadSet(((0, 0),)), mlp_layers=(1,), mode="token-wise-mean"),
    ]
    notes: list[str] = []
    _, prefix = run_conditions(model, batch, conditions, chunk_size=2, notes=notes)
    _, full = run_conditions(model, batch, conditions, strategy="full")
    assert any(note.startswith("prefix reuse:") for note in notes)
    assert any(note.startswith("the last block's MLP ran at the query positions only") for note in notes)
    # only parallel-residual blocks (gpt_neox here) skip a start layer; sequential ones (hhg, llama) replay it
    skipped = any(note.startswith("parallel-residual start layers were not replayed") for note in notes)
    assert skipped == (family == "gpt_neox_norotary")
    for a, b in zip(prefix, full):
        _assert_same(a, {m: b.values(m) for m in ("loss", "top1", "top5", "target_logit")})


def test_head_change_is_the_ablated_heads_through_w_o():
    """_head_change on hand-made numbers: 2 heads of size 1, d_model 2, zero and mean replacement."""
    weights = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])  # [head, d_head, d_model]: head 0 -> x, head 1 -> 2y
    z = torch.tensor([[[[3.0], [5.0]]]])  # [row=1, pos=1, head=2, d_head=1]
    chunk = [Ablation(HeadSet(((0, 1),))), Ablation(HeadSet(((0, 0), (0, 1))))]
    change = ablation_module._head_change(weights, z, chunk, 0, (0, 1), None)
    # condition 0 zeroes head 1: -5 * 2y; condition 1 zeroes both: -3x - 10y
    assert torch.equal(change, torch.tensor([[[0.0, -10.0]], [[-3.0, -10.0]]]))
    means = Replacements({("position", "blocks.0.attn.hook_z"): torch.tensor([[[1.0], [4.0]]])})  # [pos, head, d_head]
    mean_chunk = [Ablation(HeadSet(((0, 1),)), mode="mean-per-position")]
    change = ablation_module._head_change(weights, z, mean_chunk, 0, (0, 1), means)
    assert torch.equal(change, torch.tensor([[[0.0, -2.0]]]))  # (4 - 5) * 2y


def test_failed_self_check_falls_back_to_full_forwards(tiny, monkeypatch):
    hf, model = tiny
    batch = _batch(seed=9)
    real_tail = ablation_module.run_tail
    monkeypatch.setattr(ablation_module, "run_tail", lambda *a, **k: real_tail(*a, **k) + 1.0)
    notes: list[str] = []
    heads = HeadSet(((2, 1),))
    _, (got,) = run_conditions(model, batch, [Ablation(heads)], notes=notes)
    assert any("full forward" in note for note in notes)
    _assert_same(got, _zeroed_wo_metrics(hf, heads, batch))


def test_stacked_conditions_and_example_chunks_match_the_loop(tiny, monkeypatch):
    _, model = tiny
    batch = _batch(n=11, seed=2)
    conditions = [Ablation(HeadSet(((l, h),))) for l in range(N_LAYERS) for h in (0, 3)]
    _, loop = run_conditions(model, batch, conditions, chunk_size=1)
    monkeypatch.setattr(ablation_module, "_auto_example_batch", lambda *args: 4)  # 11 examples in chunks of 4, 4, 3
    _, stacked = run_conditions(model, batch, conditions, chunk_size=4)
    for a, b in zip(loop, stacked):
        _assert_same(b, {m: a.values(m) for m in ("loss", "top1", "top5", "target_logit")})


def test_mean_per_position_ablation_equals_hand_computed_means(tiny):
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
    ablation = Ablation(HeadSet(((layer, head),)), mode="mean-per-position")
    _, (got,) = run_conditions(model, batch, [ablation])
    _assert_same(got, want)
    means = compute_replacements(model, batch.tokens, ablation).values[("position", f"blocks.{layer}.attn.hook_z")]
    torch.testing.assert_close(means[:, head], mean, atol=1e-6, rtol=0)


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


def test_mlp_mean_per_position_ablation_equals_hand_computed_means(tiny_sequential):
    _, model = tiny_sequential
    batch = _batch(n=7, seed=6)
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens)
        name = "blocks.2.hook_mlp_out" if "blocks.2.hook_mlp_out" in cache else "blocks.2.mlp.hook_out"
        mean = cache[name].mean(dim=0)  # [pos, d_model]
        want = _metrics_from_logits(
            model.run_with_hooks(batch.tokens, fwd_hooks=[(name, lambda out, hook: mean.expand_as(out).clone())]), batch
        )
    _, (got,) = run_conditions(model, batch, [Ablation(mlp_layers=(2,), mode="mean-per-position")])
    _assert_same(got, want)


def test_engine_on_a_real_probe_batch(tiny):
    hf, model = tiny
    batch = InductionProbeSpec(n_examples=6, seq_len=24, token_low=0, token_high=256, seed=0).build()
    heads = HeadSet(((1, 1), (2, 2)))
    _, (got,) = run_conditions(model, batch, [Ablation(heads)])
    _assert_same(got, _zeroed_wo_metrics(hf, heads, batch))


def test_probe_and_engine_score_tied_logits_alike(tmp_path):
    """A zeroed unembedding ties every token: both clean runs score chance (k / vocab), not 0 or 1."""
    _, model = _build(tmp_path, parallel=True, seed=11, flat_unembed=True)
    batch = InductionProbeSpec(n_examples=6, seq_len=24, token_low=0, token_high=256, seed=0).build()
    stats = collect_head_stats(model, batch)
    clean, (ablated,) = run_conditions(model, batch, [Ablation(HeadSet(((1, 0),)))])
    vocab = 260
    for metric, want in (("top1", 1 / vocab), ("top5", 5 / vocab), ("loss", np.log(vocab)), ("target_logit", 0.0)):
        probe = getattr(stats, metric).double().numpy()  # [example]
        np.testing.assert_array_equal(probe, clean.values(metric))
        np.testing.assert_allclose(clean.values(metric), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(ablated.values(metric), clean.values(metric))


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
    ablation = Ablation(HeadSet(((1, 0),)), mode="mean-per-position")
    with pytest.raises(HeadLabError, match="compute_replacements"):
        ablated_logits_fn(model, ablation)
    tokens = _batch().tokens
    means = compute_replacements(model, tokens, ablation)
    fn = ablated_logits_fn(model, ablation, means)
    assert fn(tokens[:, :12]).shape == (tokens.shape[0], 12, 260)
    with pytest.raises(HeadLabError, match="positions"):
        fn(torch.zeros(2, tokens.shape[1] + 1, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# The study and its result
# ---------------------------------------------------------------------------------------------


def test_ablation_study_result_roundtrip(tiny):
    _, model = tiny
    batch = _batch(n=8, seed=7)
    result = ablation_study(model, batch, HeadSet(((1, 0),)), AblationSettings(n_controls=5, n_boot=200))
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
        ablation_study(model, batch, HeadSet(), AblationSettings(n_controls=3))
    with pytest.raises(HeadLabError, match="more than half"):
        ablation_study(model, batch, HeadSet(((1, 0), (1, 1), (1, 2))), AblationSettings(n_controls=3))
    with pytest.raises(HeadLabError, match="outside this model"):
        ablation_study(model, batch, HeadSet(((7, 0),)), AblationSettings(n_controls=3))
    with pytest.raises(HeadLabError, match="not defined"):
        ablation_study(model, batch, HeadSet(((1, 0),)), AblationSettings(n_controls=3, metrics=("loss", "exact_match")))
    with pytest.raises(HeadLabError, match="outside this model"):
        run_conditions(model, batch, [Ablation(mlp_layers=(9,))])
    with pytest.raises(HeadLabError, match="mode"):
        Ablation(HeadSet(((0, 0),)), mode="median")
    # more than half of a layer is fine when any-layer controls are asked for
    ok = ablation_study(model, batch, HeadSet(((1, 0), (1, 1), (1, 2))), AblationSettings(n_controls=2, controls="any-layer", n_boot=50))
    assert len(ok.controls) == 2 and "recipe" not in ok.verdicts


def test_bench_live_times_both_ways_with_the_same_numbers(tmp_path, monkeypatch):
    """`bench live` on a fake zoo model: both ways timed every repeat, the candidate before the verdict, same numbers."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), "tiny-live-neox", "gpt_neox", steps=(0,))
    result = bench_live("tiny-live-neox", heads="L1H0,L1H2", n_controls=3, n_examples=8, seq_len=16, repeats=2, threads=1)
    assert result["identical"] is True and result["threads"] == 1 and result["selection"] == "L1H0,L1H2"
    for way in ("own_clean_run", "kept_clean_run"):
        times = result["times_s"][way]
        assert len(times["candidate"]) == len(times["verdict"]) == 2
        assert all(0 < c <= v for c, v in zip(times["candidate"], times["verdict"]))
    assert result["speedup_verdict_kept_vs_own"] > 0
