"""The instrumented pass: hand-made summaries, and equality with a plain full-capture forward on tiny models."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoModelForCausalLM

from core.bench.probe import bench_probe, reference_max_pass, reference_pattern_pass, reference_pr_pass
from core.errors import HeadLabError
from core.probe import (
    FLOAT16_ROW_LIMIT,
    FLOAT32_ROW_LIMIT,
    HeadStats,
    attn_row_dtype,
    check_probe_fits,
    collect_head_stats,
    pattern_summaries,
    summary_weights,
)
from core.stats.selectivity import baseline_positions
from core.tasks import InductionProbeSpec, ProbeBatch, TextProbeSpec
from core.tasks.probe_batch import PATTERNS
from tests.tiny_models import save_tiny_model


def _boot(path):
    hf = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    return TransformerBridge.boot_transformers(str(path), hf_model=hf).eval()


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    return _boot(save_tiny_model("gpt_neox", tmp_path_factory.mktemp("neox"), seed=0))


@pytest.fixture(scope="module")
def olmoe_path(tmp_path_factory):
    return save_tiny_model("olmoe", tmp_path_factory.mktemp("olmoe"), seed=0)


@pytest.fixture(scope="module")
def induction_batch():
    return InductionProbeSpec(n_examples=10, seq_len=40, token_low=0, token_high=256, seed=3).build()


@pytest.fixture(scope="module")
def text_batch():
    # query positions differ per example, so per-example gathering is exercised
    return TextProbeSpec(n_examples=9, seq_len=48, seed=1).build()


# ------------------------------------------------------------------------------ hand-made inputs


def test_pattern_summaries_on_hand_made_rows():
    # one example, q = 11, induction p+1 = 4, duplicate p = 3
    q, seq_len = 11, 12
    tokens = torch.arange(seq_len)[None]
    batch = ProbeBatch(tokens=tokens, query_pos=torch.tensor([q]), target=torch.tensor([4]),
                       induction_pos=torch.tensor([4]), duplicate_pos=torch.tensor([3]), spec={})
    weights = summary_weights(batch)  # [1, key, 7]
    assert weights.shape == (1, seq_len, len(PATTERNS) + 1)
    assert weights[0, :, 6].sum() == pytest.approx(1.0)
    base_keys = baseline_positions(q).tolist()  # q = 11 leaves keys 1..5: all are used
    assert sorted(base_keys) == [1, 2, 3, 4, 5]
    rows = torch.zeros(1, 2, seq_len)
    rows[0, 0] = torch.arange(seq_len, dtype=torch.float32)  # head 0: attention k at key k
    rows[0, 1, 4] = 0.7  # head 1: an induction head with the rest on the first token
    rows[0, 1, 0] = 0.3
    summ, mx = pattern_summaries(rows, weights)
    assert summ.shape == (1, 2, len(PATTERNS) + 1)
    # head 0: induction 4, duplicate 3, previous 10, self 11, first 0, local mean(6..9) = 7.5, baseline mean(1..5) = 3
    assert summ[0, 0].tolist() == pytest.approx([4.0, 3.0, 10.0, 11.0, 0.0, 7.5, 3.0])
    assert summ[0, 1].tolist() == pytest.approx([0.7, 0.0, 0.0, 0.0, 0.3, 0.0, 0.7 / 5])
    assert mx[0].tolist() == pytest.approx([11.0, 0.7])


def test_attn_row_dtype_by_size():
    assert attn_row_dtype(256, 3, 16, 64) == torch.float32  # the zoo probe: tiny
    assert attn_row_dtype(1, 1, 1, FLOAT32_ROW_LIMIT + 1) == torch.float16
    assert attn_row_dtype(1, 1, 1, FLOAT16_ROW_LIMIT + 1) is None
    assert attn_row_dtype(1, 1, 1, FLOAT16_ROW_LIMIT + 1, keep_rows=True) == torch.float16
    assert attn_row_dtype(2, 2, 2, 2, keep_rows=False) is None


# ------------------------------------------------------------------------------ against a plain forward


def _reference(model, batch):
    """Everything from one plain forward with a full activation capture, computed example by example."""
    n_layers = model.cfg.n_layers
    with torch.inference_mode():
        logits, cache = model.run_with_cache(
            batch.tokens, names_filter=lambda n: n.endswith("attn.hook_z") or n.endswith("attn.hook_pattern"))
    z, rows, pats, base, mx = [], [], [], [], []
    for e in range(batch.n_examples):
        q = int(batch.query_pos[e])
        keys = {
            "induction": [int(batch.induction_pos[e])], "duplicate-token": [int(batch.duplicate_pos[e])],
            "previous-token": [q - 1], "self": [q], "first-token": [0], "local": [q - 5, q - 4, q - 3, q - 2],
        }
        bkeys = baseline_positions(q).tolist()
        z.append(torch.stack([cache[f"blocks.{l}.attn.hook_z"][e, q] for l in range(n_layers)]))
        row = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][e, :, q, :] for l in range(n_layers)])  # [L, H, K]
        rows.append(row)
        pats.append(torch.stack([row[:, :, keys[name]].mean(-1) for name in PATTERNS]))
        base.append(row[:, :, bkeys].mean(-1))
        mx.append(row.max(-1).values)
    ar = torch.arange(batch.n_examples)
    logits_q = logits[ar, batch.query_pos]
    return {
        "z_query": torch.stack(z), "attn_query": torch.stack(rows),
        "attn_patterns": torch.stack(pats, dim=1), "attn_baseline": torch.stack(base), "attn_max": torch.stack(mx),
        "loss": torch.nn.functional.cross_entropy(logits_q, batch.target, reduction="none"),
        "top1": (logits_q.argmax(-1) == batch.target).float(),
        "target_logit": logits_q[ar, batch.target],
    }


@pytest.mark.parametrize("which", ["induction", "text"])
def test_instrumented_pass_equals_full_capture(neox, induction_batch, text_batch, which):
    batch = induction_batch if which == "induction" else text_batch
    stats = collect_head_stats(neox, batch, chunk_size=4)
    ref = _reference(neox, batch)
    n, L, H, dh = batch.n_examples, neox.cfg.n_layers, neox.cfg.n_heads, neox.cfg.d_head
    assert stats.z_query.shape == (n, L, H, dh)
    assert stats.attn_query.shape == (n, L, H, batch.seq_len)
    assert stats.attn_patterns.shape == (len(PATTERNS), n, L, H)
    for name, expected in ref.items():
        torch.testing.assert_close(getattr(stats, name), expected, atol=1e-6, rtol=0, msg=name)
    assert stats.router_query is None and stats.n_experts == 0
    assert stats.pattern("induction").shape == (n, L, H)
    assert stats.family == "gpt_neox" and (stats.n_layers, stats.n_heads, stats.d_head) == (L, H, dh)
    torch.testing.assert_close(stats.query_pos, batch.query_pos)


def test_chunked_equals_unchunked(neox, text_batch):
    one = collect_head_stats(neox, text_batch, chunk_size=100)
    many = collect_head_stats(neox, text_batch, chunk_size=2)
    for name, tensor in one.to_tensors().items():
        torch.testing.assert_close(many.to_tensors()[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_summaries_without_rows_match(neox, induction_batch):
    full = collect_head_stats(neox, induction_batch)
    light = collect_head_stats(neox, induction_batch, keep_attn_rows=False)
    assert light.attn_query is None and "attn_query" not in light.to_tensors()
    for name in ("attn_patterns", "attn_baseline", "attn_max", "z_query"):
        torch.testing.assert_close(getattr(light, name), getattr(full, name), atol=0, rtol=0)


def test_reference_passes_agree(neox, induction_batch):
    stats = collect_head_stats(neox, induction_batch, chunk_size=3)
    torch.testing.assert_close(reference_pr_pass(neox, induction_batch), stats.z_query, atol=1e-6, rtol=0)
    pats, base = reference_pattern_pass(neox, induction_batch)
    torch.testing.assert_close(pats, stats.attn_patterns, atol=1e-6, rtol=0)
    torch.testing.assert_close(base, stats.attn_baseline, atol=1e-6, rtol=0)
    torch.testing.assert_close(reference_max_pass(neox, induction_batch), stats.attn_max, atol=1e-6, rtol=0)


def test_progress_and_provenance(neox, induction_batch):
    done = []
    stats = collect_head_stats(neox, induction_batch, chunk_size=4, progress=done.append,
                               provenance={"model": "tiny", "revision": "step000010", "tokens": 20480})
    assert done == [4, 4, 2]
    meta = json.loads(json.dumps(stats.to_json()))  # JSON-ready
    assert meta["model"] == "tiny" and meta["revision"] == "step000010" and meta["tokens"] == 20480
    assert meta["probe_spec"] == induction_batch.spec and meta["code_version"]
    assert meta["shapes"]["z_query"] == list(stats.z_query.shape)
    back = HeadStats.from_tensors(stats.to_tensors(), meta)
    for name, tensor in stats.to_tensors().items():
        assert torch.equal(back.to_tensors()[name], tensor)
    assert back.patterns == tuple(PATTERNS) and back.revision == "step000010"


def test_router_weights_for_tiny_olmoe(olmoe_path, induction_batch):
    model = _boot(olmoe_path)
    stats = collect_head_stats(model, induction_batch, chunk_size=3)
    assert stats.router_query.shape == (induction_batch.n_examples, 2, 4) and stats.n_experts == 4
    torch.testing.assert_close(stats.router_query.sum(-1), torch.ones(induction_batch.n_examples, 2))
    # independent: softmax(ln2 output at q @ router weight^T), router weights from a separately loaded HF model
    hf = AutoModelForCausalLM.from_pretrained(str(olmoe_path), attn_implementation="eager")
    with torch.inference_mode():
        _, cache = model.run_with_cache(induction_batch.tokens, names_filter=lambda n: n.endswith("ln2.hook_out"))
    ar = torch.arange(induction_batch.n_examples)
    for layer in range(2):
        x = cache[f"blocks.{layer}.ln2.hook_out"][ar, induction_batch.query_pos]  # [example, d_model]
        expected = torch.softmax(x @ hf.model.layers[layer].mlp.gate.weight.detach().T, dim=-1)
        torch.testing.assert_close(stats.router_query[:, layer], expected, atol=1e-6, rtol=0)
    # the attention side works for the MoE family too
    ref = _reference(model, induction_batch)
    torch.testing.assert_close(stats.z_query, ref["z_query"], atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.attn_max, ref["attn_max"], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ bad inputs


def _hand_batch(tokens: torch.Tensor) -> ProbeBatch:
    n, seq_len = tokens.shape
    q = torch.full((n,), seq_len - 1)
    return ProbeBatch(tokens=tokens, query_pos=q, target=tokens[:, 2].clone(),
                      induction_pos=torch.full((n,), 2), duplicate_pos=torch.full((n,), 1), spec={"task": "hand"})


def test_probe_longer_than_context_is_refused(neox):
    with pytest.raises(HeadLabError, match="longer than the model's context"):
        collect_head_stats(neox, _hand_batch(torch.randint(0, 256, (2, 65))))  # context is 64


def test_tokens_beyond_vocabulary_are_refused(neox):
    tokens = torch.randint(0, 256, (2, 20))
    tokens[1, 7] = 300  # vocab is 260
    with pytest.raises(HeadLabError, match="vocabulary"):
        collect_head_stats(neox, _hand_batch(tokens))


def test_probe_fits_check_reads_a_spec_against_a_config_or_a_model(neox):
    """One check, two sources: a spec against the HF config before loading, a batch against the loaded model."""
    config = neox.original_model.config  # context 64, vocabulary 260
    spec = InductionProbeSpec(n_examples=2, seq_len=64, token_low=0, token_high=256, seed=0)
    check_probe_fits(spec, config)
    check_probe_fits(spec.build(), neox)
    with pytest.raises(HeadLabError, match="longer than the model's context"):
        check_probe_fits(InductionProbeSpec(2, 65, 0, 256, 0), config)
    with pytest.raises(HeadLabError, match="vocabulary"):
        check_probe_fits(InductionProbeSpec(2, 32, 0, 300, 0), config)
    with pytest.raises(HeadLabError, match="longer than the model's context"):
        check_probe_fits(TextProbeSpec(2, 65, 0), neox)


def test_bad_chunk_size(neox, induction_batch):
    with pytest.raises(HeadLabError, match="chunk_size"):
        collect_head_stats(neox, induction_batch, chunk_size=0)


def test_bench_probe_reports_all_fields(neox, induction_batch):
    result = bench_probe(neox, induction_batch, repeats=1, chunk_size=5)
    for key in ("bare_s", "instrumented_s", "three_pass_s", "overhead_ratio", "speedup_vs_three_pass"):
        assert result[key] > 0
    assert result["overhead_ratio"] == pytest.approx(result["instrumented_s"] / result["bare_s"])
    assert (result["n_examples"], result["seq_len"]) == (10, 40)
