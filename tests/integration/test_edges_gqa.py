"""Edges and path patching under grouped-query attention, on a tiny Llama (8 query heads, 2 key/value heads)
and a tiny Gemma-3 (4 query heads, 2 key/value heads, QK-norm, post-attention and post-MLP norms, scaled
embeddings, a 4-token sliding window on layer 1 shorter than the 10-token prompts).

Each query head is a node; its k and v inputs are its own copies of the residual that enter its group's
K and V projections. The hand computation here reads the Hugging Face modules' weights and recomputes one
query head's attention with its keys (or values, or queries) taken from a patched residual, the other heads
of its group untouched: HeadLab's edge patching and path patching must give the same logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from core.ablation.edges import EdgeSettings, edge_attribution, edge_controls, edge_graph_of
from core.ablation.edges.runs import (EdgeHooks, edge_chunks, mean_value, post_attention_hook, post_norm_scales,
                                      removed_matrix, removed_run_values, run_values)
from core.ablation.patching.paths import key_value_heads, path_run, split_qkv_inputs
from core.ablation.patching.runs import PatchSettings, metric_values, run_chunks
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.specs import probe_spec
from tests.tiny_models import save_tiny_model

SMALL_GAP = EdgeSettings(allow_small_gap=True)  # random tiny models have no real answer to lose
RECEIVER_LAYER, RECEIVER_HEAD = 1, 2  # head 2 shares its key/value head with a neighbour in both models


@pytest.fixture(scope="module", params=["llama_gqa", "gemma3"])
def grouped(request, tmp_path_factory):
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param), seed=3)
    model = load_model(ModelRef.parse(str(folder)))
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples=4, seq_len=10), seed=0).build()
    return request.param, model, pair


def _senders(model, graph, tokens):
    """Every sender's output on a plain run of `tokens` [sender, row, pos, d_model] (and the run's logits)."""
    hooks = EdgeHooks(model, graph)
    with torch.no_grad(), split_qkv_inputs(model):
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks.hooks())
    return hooks.stacked(), logits


def _layer_inputs(model, tokens, layer):
    """A plain forward's (residual entering `layer` [row, pos, d_model], z [row, pos, head, d_head], position
    embeddings (cos, sin)), read from the bridge's hooks and the attention's own arguments."""
    seen = {}

    def keep(module, args, kwargs):
        seen["rotary"] = kwargs["position_embeddings"]

    handle = model.blocks[layer].attn.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (
                f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z"))
    finally:
        handle.remove()
    return cache[f"blocks.{layer}.hook_resid_pre"], cache[f"blocks.{layer}.attn.hook_z"], seen["rotary"]


def _hand_head(model, layer, head, resid_q, resid_k, resid_v, rotary):
    """Query head `head`'s z [row, pos, d_head] by hand from the HF modules: its query from resid_q, the keys
    and values of its group's K / V projection from resid_k and resid_v (each [row, pos, d_model], before
    the norm), QK-norm when the model has it, RoPE, causal (and sliding-window) mask, softmax."""
    attention = model.blocks[layer].attn.original_component
    norm = model.blocks[layer].ln1.original_component
    config = attention.config
    n_heads, n_kv, d_head = config.num_attention_heads, config.num_key_value_heads, attention.head_dim
    kv = head // (n_heads // n_kv)

    def project(name, resid, index):
        weight = getattr(attention, name).original_component.weight[index * d_head:(index + 1) * d_head]
        return norm(resid) @ weight.T  # [row, pos, d_head]

    q, k, v = project("q_proj", resid_q, head), project("k_proj", resid_k, kv), project("v_proj", resid_v, kv)
    if hasattr(attention, "q_norm"):
        q, k = attention.q_norm.original_component(q), attention.k_norm.original_component(k)
    cos, sin = rotary
    q, k = apply_rotary_pos_emb(q[:, None], k[:, None], cos, sin)  # [row, 1, pos, d_head]
    scores = (q @ k.transpose(-1, -2))[:, 0] * attention.scaling  # [row, query pos, key pos]
    t = scores.shape[-1]
    distance = torch.arange(t)[:, None] - torch.arange(t)[None, :]
    allowed = distance >= 0
    window = getattr(attention, "sliding_window", None)
    if window is not None:
        allowed &= distance < window
    pattern = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return pattern @ v


def _logits_with_head_z(model, tokens, layer, head, z_head):
    """The plain forward's logits with one head's hook_z replaced by `z_head` [row, pos, d_head]."""
    def replace(z, hook=None):
        z = z.clone()
        z[:, :, head] = z_head.to(z.dtype)
        return z

    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", replace)])


def test_the_fixtures_share_key_value_heads(grouped):
    family, model, _ = grouped
    assert key_value_heads(model) < model.cfg.n_heads
    if family == "gemma3":  # a sliding window shorter than the prompts, on the receiver layer
        assert model.blocks[RECEIVER_LAYER].attn.original_component.sliding_window == 4


def test_with_nothing_patched_the_per_query_head_path_is_the_model_and_its_senders_add_up(grouped):
    """Per-query-head k/v inputs (ungrouped K / V projections) reproduce the plain forward's logits; the senders'
    outputs (on Gemma the heads' shares of the post-attention norm at its frozen scale) sum to every residual."""
    _, model, pair = grouped
    graph = edge_graph_of(model)
    tokens = pair.clean.tokens
    with torch.no_grad():
        plain = model(tokens)
    seen = {}

    def keep(x, hook):
        seen[hook.name] = x.detach()
        return x

    hooks = EdgeHooks(model, graph)
    names = ["ln_final.hook_in", "blocks.1.attn.hook_k_input", "blocks.1.attn.hook_v_input", "blocks.1.ln2.hook_in"]
    with torch.no_grad(), split_qkv_inputs(model):
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks.hooks() + [(n, keep) for n in names])
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    assert key_value_heads(model) < model.cfg.n_heads  # ungrouping is undone after the run
    acts = hooks.stacked()  # [sender, row, pos, d_model]
    n_heads = graph.n_heads
    assert seen["blocks.1.attn.hook_k_input"].shape[2] == seen["blocks.1.attn.hook_v_input"].shape[2] == n_heads
    before_layer_1 = acts[: 1 + n_heads + 1].sum(0)  # embed, layer 0's heads and MLP
    scale = float(seen["ln_final.hook_in"].abs().max())
    for name in ("blocks.1.attn.hook_k_input", "blocks.1.attn.hook_v_input"):
        for h in range(n_heads):
            torch.testing.assert_close(seen[name][:, :, h], before_layer_1, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(acts[: 1 + 2 * n_heads + 1].sum(0), seen["blocks.1.ln2.hook_in"], atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(acts.sum(0), seen["ln_final.hook_in"], atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("component", ["k", "v", "q"])
def test_an_edge_into_one_grouped_heads_input_is_that_heads_attention_by_hand(grouped, component):
    """embed -> L1H2.{k,v,q}: query head 2's keys (values, queries) from the patched residual, every other head
    of its group on the clean one; HeadLab's patched logits equal the hand computation's."""
    _, model, pair = grouped
    graph = edge_graph_of(model)
    clean, corrupted = pair.clean.tokens, pair.corrupted_tokens
    clean_acts, _ = _senders(model, graph, clean)
    corrupted_acts, _ = _senders(model, graph, corrupted)
    edge = f"embed->L{RECEIVER_LAYER}H{RECEIVER_HEAD}.{component}"
    hooks = EdgeHooks(model, graph, removed=removed_matrix(graph, graph.edge_mask([edge]), clean.device),
                      source=corrupted_acts)
    with torch.no_grad(), split_qkv_inputs(model):
        patched = model.run_with_hooks(clean, fwd_hooks=hooks.hooks())

    resid, z, rotary = _layer_inputs(model, clean, RECEIVER_LAYER)
    with torch.no_grad():
        same = _hand_head(model, RECEIVER_LAYER, RECEIVER_HEAD, resid, resid, resid, rotary)
        torch.testing.assert_close(same, z[:, :, RECEIVER_HEAD], atol=1e-5, rtol=0)  # the hand attention is the model's
        moved = resid + (corrupted_acts[0] - clean_acts[0])  # the embeddings' change, into this one input
        inputs = {c: (moved if c == component else resid) for c in "qkv"}
        z_head = _hand_head(model, RECEIVER_LAYER, RECEIVER_HEAD, inputs["q"], inputs["k"], inputs["v"], rotary)
    expected = _logits_with_head_z(model, clean, RECEIVER_LAYER, RECEIVER_HEAD, z_head)
    assert (expected - model(clean)).abs().max() > 1e-3  # the edge matters
    torch.testing.assert_close(patched, expected, atol=2e-5, rtol=0)


def test_path_patching_into_one_grouped_heads_keys_is_that_heads_attention_by_hand(grouped):
    """Senders L0H0, L0H3 -> receiver L1H2's keys (noising): step 2 reads the recorded residual into head 2's
    k input alone; the result equals head 2 recomputed by hand with keys from that residual."""
    _, model, pair = grouped
    settings = PatchSettings(direction="noise", allow_small_gap=True)
    senders, receivers = HeadSet([(0, 0), (0, 3)]), HeadSet([(RECEIVER_LAYER, RECEIVER_HEAD)])
    runs = next(iter(run_chunks(model, pair, settings)))
    recorded = {}

    def freeze(z, hook=None):
        out = runs.base_z[0].to(z.dtype).clone()
        out[:, :, [0, 3]] = runs.source_z[0][:, :, [0, 3]].to(z.dtype)
        return out

    def keep(x, hook=None):
        recorded["resid"] = x.detach()
        return x

    with torch.no_grad():
        model.run_with_hooks(runs.base_tokens, fwd_hooks=[("blocks.0.attn.hook_z", freeze),
                                                          (f"blocks.{RECEIVER_LAYER}.hook_resid_pre", keep)])
    _, logits_q = path_run(model, runs, senders, receivers, ("k",), runs.source_z, "logit_diff")
    resid, _, rotary = _layer_inputs(model, runs.base_tokens, RECEIVER_LAYER)
    with torch.no_grad():
        z_head = _hand_head(model, RECEIVER_LAYER, RECEIVER_HEAD, resid, recorded["resid"], resid, rotary)
    expected = _logits_with_head_z(model, runs.base_tokens, RECEIVER_LAYER, RECEIVER_HEAD, z_head)
    expected_q = expected[torch.arange(expected.shape[0]), runs.query]
    torch.testing.assert_close(logits_q, expected_q, atol=2e-5, rtol=0)


def test_eap_is_the_first_order_term_of_brute_force_patching_under_gqa(grouped):
    """As for full multi-head attention (test_edges.py): EAP equals d/d(eps) of patching eps of an edge alone,
    here for every edge into grouped head L1H2's keys and values (one forward
    per edge and sign, so not the whole graph)."""
    _, model, pair = grouped
    pair = pair.select(slice(0, 2))
    graph = edge_graph_of(model)
    eap = edge_attribution(model, pair, SMALL_GAP)
    chunks, _ = edge_chunks(model, pair, SMALL_GAP, graph)
    chosen = [i for i, e in enumerate(graph.edges) if e.receiver_input in ("L1H2.k", "L1H2.v")]
    eps = 1e-2
    derivative = []
    for i in chosen:
        alone = removed_matrix(graph, np.arange(graph.n_edges) == i, chunks[0].tokens.device)
        plus, minus = (float(removed_run_values(model, graph, chunks[0], alone, "logit_diff", s).double().mean())
                       for s in (eps, -eps))
        derivative.append((plus - minus) / (2 * eps))  # d(metric) per unit of the edge's patch
    gap = eap.clean_value - eap.corrupted_value
    raw_eap, raw_fd = -eap.scores[chosen] * gap, np.asarray(derivative)
    assert np.abs(raw_eap - raw_fd).max() <= 1e-3 * np.abs(raw_fd).max() + 1e-6
    assert np.abs(raw_fd).max() > 1e-4  # edges into a grouped head's keys and values move the metric


def _direct_eap_change(model, graph, chunk) -> np.ndarray:
    """EAP's estimated change of the summed metric per edge [edge], by its definition and nothing of EdgeHooks' layout:
    a zero leaf added at every receiver input of a plain split-input forward (full logits), the metric's gradient
    to each leaf, and (source - clean) . gradient summed over rows, positions and d_model in float64."""
    names = {}  # hook name -> receiver indices (one per head for q/k/v, else one)
    for layer in range(graph.n_layers):
        for c in "qkv":
            names[f"blocks.{layer}.attn.hook_{c}_input"] = [graph.receivers.index(f"L{layer}H{h}.{c}")
                                                             for h in range(graph.n_heads)]
        names[f"blocks.{layer}.ln2.hook_in"] = [graph.receivers.index(f"MLP{layer}")]
    names["ln_final.hook_in"] = [graph.receivers.index("logits")]
    leaves = {}

    def add_leaf(x, hook):
        leaves[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + leaves[hook.name]

    with torch.enable_grad(), split_qkv_inputs(model):
        logits = model.run_with_hooks(chunk.tokens, fwd_hooks=[(n, add_leaf) for n in names])
        picked = logits[torch.arange(chunk.tokens.shape[0]), chunk.query]  # [row, vocab]
        values = metric_values(picked, chunk.target, chunk.other_target, "logit_diff")
        grads = torch.autograd.grad(values.sum(), [leaves[n] for n in names])
    diff = (chunk.source_acts - chunk.clean_acts).double()  # [sender, row, pos, d_model]
    change = np.zeros(graph.mask.shape)
    for (name, receivers), grad in zip(names.items(), grads):
        grad = grad.double() if grad.dim() == 4 else grad.double()[:, :, None]  # [row, pos, receiver, d_model]
        for k, j in enumerate(receivers):
            change[:, j] = torch.einsum("sbpm,bpm->s", diff, grad[:, :, k]).numpy()
    senders, receivers = graph.edge_index
    return (change * graph.mask)[senders, receivers]


def test_eap_equals_its_definition_computed_directly(grouped):
    """EdgeHooks takes the receivers' gradients into the scores inside the backward, a layer at a time; the same
    scores come from a zero leaf at each receiver input and a float64 product afterwards (the layout it replaced)."""
    _, model, pair = grouped
    graph = edge_graph_of(model)
    eap = edge_attribution(model, pair, SMALL_GAP)
    chunks, _ = edge_chunks(model, pair, SMALL_GAP, graph, grad=True)
    change = sum(_direct_eap_change(model, graph, c) for c in chunks) / pair.n_examples
    expected = -change / (eap.clean_value - eap.corrupted_value)
    np.testing.assert_allclose(eap.scores, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    assert np.abs(expected).max() > 0


def test_no_edge_patched_is_clean_every_edge_corrupted_and_the_controls_run_under_gqa(grouped):
    _, model, pair = grouped
    graph = edge_graph_of(model)
    chunks, _ = edge_chunks(model, pair, SMALL_GAP, graph)
    values = run_values(model, graph, chunks, "logit_diff")
    assert mean_value(model, graph, chunks, np.zeros(graph.n_edges, bool), "logit_diff") == pytest.approx(values.clean, abs=1e-5)
    corrupted = float(torch.cat([c.corrupted_values for c in chunks]).double().mean())
    assert values.corrupted == pytest.approx(corrupted, abs=1e-5)  # every edge patched is the corrupted run
    keep = graph.edge_mask(["embed->L1H2.k", "L0H1->L1H2.v", "L1H2->logits"])
    controls = edge_controls(model, pair, keep, SMALL_GAP, n_controls=2)
    assert len(controls.control_faithfulness) == 2 and np.isfinite(controls.faithfulness)
    assert controls.heads == ((0, 1), (1, 2))


def test_a_post_attention_layernorm_is_split_among_heads_by_its_frozen_scale():
    """The Gemma post-norm share: gain / rms of the summed attention output, so the shares add to the norm's output."""
    parts = torch.randn(3, 2, 5, 8, generator=torch.Generator().manual_seed(0))  # [head, row, pos, d_model]
    gain = torch.linspace(0.5, 2.0, 8)
    x = parts.sum(0)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    torch.testing.assert_close((parts * post_norm_scales(x, gain, 1e-6)).sum(0), expected, atol=1e-5, rtol=0)
    assert post_attention_hook(3) == "blocks.3.ln1_post.hook_in"
