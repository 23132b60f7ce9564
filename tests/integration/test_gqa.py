"""Grouped-query attention (8 query heads sharing 2 key/value heads): HeadLab's per-head views
and ablations against hand computations from the Hugging Face model's own modules.

Under GQA the key/value projections have fewer heads than the queries, and query head h reads
key/value head h // (n_heads / n_kv_heads). A tool that indexed hook_v or W_V by query head, or
ablated a key/value head instead of one query head, would fail these tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.ablation.engine import ablated_logits_fn, run_conditions
from core.ablation.spec import Ablation
from core.stats.metrics import query_metrics
from core.heads import HeadSet
from core.model.hooks import hook_name, model_shape
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.tasks.probe_batch import ProbeBatch
from tests.tiny_models import save_tiny_model, tiny_config

N_HEADS, N_KV_HEADS = 8, 2
GROUP = N_HEADS // N_KV_HEADS


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    folder = save_tiny_model("llama_gqa", tmp_path_factory.mktemp("gqa") / "llama_gqa", seed=5)
    return load_model(ModelRef.parse(str(folder)))


def _tokens(batch: int = 3, pos: int = 12) -> torch.Tensor:
    return torch.randint(0, 256, (batch, pos), generator=torch.Generator().manual_seed(11))


def test_the_fixture_is_grouped_query_attention(bridge):
    config = tiny_config("llama_gqa")
    assert (config.num_attention_heads, config.num_key_value_heads) == (N_HEADS, N_KV_HEADS)
    assert model_shape(bridge)[1] == N_HEADS  # HeadLab counts query heads
    v_proj = bridge.blocks[0].attn.original_component.v_proj
    assert v_proj.weight.shape[0] == N_KV_HEADS * model_shape(bridge)[2]


def test_hook_z_of_each_query_head_is_its_pattern_times_its_groups_values(bridge):
    """z[b, q, h] = sum_k pattern[b, h, q, k] * v[b, k, h // GROUP]; v from the HF v_proj's output."""
    n_layers, n_heads, d_head = model_shape(bridge)
    values = {}  # layer -> v_proj output [batch, pos, kv_head * d_head]
    handles = [bridge.blocks[l].attn.original_component.v_proj.register_forward_hook(
        lambda mod, inp, out, l=l: values.__setitem__(l, out)) for l in range(n_layers)]
    try:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(_tokens())
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(n_layers):
        v = values[layer].unflatten(-1, (N_KV_HEADS, d_head))  # [batch, pos, kv_head, d_head]
        pattern = cache[hook_name("pattern", layer)]  # [batch, head, q, k]
        z = cache[hook_name("z", layer)]  # [batch, pos, head, d_head]
        assert z.shape[2] == N_HEADS and pattern.shape[1] == N_HEADS
        for head in range(N_HEADS):
            expected = torch.einsum("bqk,bkd->bqd", pattern[:, head], v[:, :, head // GROUP])
            torch.testing.assert_close(z[:, :, head], expected, atol=1e-5, rtol=0)
        # the heads of one group share values but not patterns: they are distinct heads
        assert not torch.allclose(z[:, :, 0], z[:, :, 1])


def _hf_logits_without(bridge, heads: list[tuple[int, int]], tokens: torch.Tensor) -> torch.Tensor:
    """The HF model's logits with the o_proj input columns of `heads` set to zero (by hand)."""
    d_head = model_shape(bridge)[2]
    hf = bridge.original_model

    def zero_columns(layer):
        def hook(module, args):
            x = args[0].clone()  # [batch, pos, head * d_head]
            for l, h in heads:
                if l == layer:
                    x[..., h * d_head:(h + 1) * d_head] = 0
            return (x,)
        return hook

    handles = [hf.model.layers[l].self_attn.o_proj.register_forward_pre_hook(zero_columns(l))
               for l in range(len(hf.model.layers))]
    try:
        with torch.no_grad():
            return hf(tokens).logits
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 6)], [(0, 2), (1, 5)]])
def test_ablating_query_heads_matches_zeroing_their_o_proj_columns(bridge, heads):
    tokens = _tokens()
    ablation = Ablation(heads=HeadSet(heads))
    expected = _hf_logits_without(bridge, heads, tokens)
    torch.testing.assert_close(ablated_logits_fn(bridge, ablation)(tokens), expected, atol=1e-5, rtol=0)
    # the engine's prefix-reuse path (replayed blocks, query-position unembedding) agrees too
    query = torch.tensor([11, 7, 9])
    target = torch.tensor([5, 6, 7])
    batch = ProbeBatch(tokens=tokens, query_pos=query, target=target, induction_pos=query - 3, duplicate_pos=query - 4)
    _, (result,) = run_conditions(bridge, batch, [ablation], strategy="prefix")
    hand = query_metrics(expected[torch.arange(3), query].float(), target)
    for metric in ("loss", "target_logit"):
        np.testing.assert_allclose(result.values(metric), hand[metric].numpy(), atol=1e-4, rtol=0)


def test_one_query_head_is_not_its_whole_group(bridge):
    """Ablating head 1 alone differs from ablating heads 0-3, which share head 1's keys and values."""
    tokens = _tokens()
    one = ablated_logits_fn(bridge, Ablation(heads=HeadSet([(0, 1)])))(tokens)
    group = ablated_logits_fn(bridge, Ablation(heads=HeadSet([(0, h) for h in range(GROUP)])))(tokens)
    torch.testing.assert_close(group, _hf_logits_without(bridge, [(0, h) for h in range(GROUP)], tokens), atol=1e-5, rtol=0)
    assert (one - group).abs().max() > 1e-3
