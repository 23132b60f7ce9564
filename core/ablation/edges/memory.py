"""Memory of an edge run: what each pair keeps, and what one pair adds to a patched forward or a gradient pass.

The counts are those of core.ablation.edges.runs.EdgeHooks (float32 bytes; a residual is T x d_model):
- kept for every pair of the run: the clean and corrupted runs' sender outputs, [sender, T, d_model] twice;
- a patched forward (no grad): one layer's activations with the per-head q/k/v residual copies (3 x n_heads,
  each also normed; under GQA the k and v copies are per query head too), the logits at the query row,
  and PATCH_SENDER_COPIES residuals per sender: the buffer of (source - current), the forward's own sender
  outputs, the rows a sparse patch selects, and the allocator's slack;
- a gradient pass: every layer's activations kept for the backward, the query row's logits and their
  gradient, and SCORE_SENDER_COPIES residuals per sender: (source - clean) in float32, a layer's
  receiver gradients with their copies, and the allocator's slack.
tests/integration/test_memory.py checks that the estimate bounds the measured peak on a tiny model;
docs/measurements/edges-memory-smollm2.json records the same on SmolLM2-135M.
"""

from __future__ import annotations

from typing import Any

import torch

from core.ablation.edges.graph import EdgeGraph, edge_graph_of_config
from core.errors import HeadLabError
from core.model.memory import SAFETY_FRACTION, ForwardShape, estimate_memory_bytes, forward_bytes, memory_budget

PATCH_SENDER_COPIES = 6
SCORE_SENDER_COPIES = 4


def kept_pair_bytes(shape: ForwardShape, graph: EdgeGraph, seq_len: int) -> int:
    """Bytes of one pair's sender outputs, clean and corrupted ([sender, pos, d_model] twice, float32): kept for
    every pair of the run (ACDC and the curves revisit every chunk)."""
    return 2 * len(graph.senders) * int(seq_len) * shape.d_model * 4


def edge_forward_bytes(shape: ForwardShape, graph: EdgeGraph, seq_len: int, grad: bool) -> int:
    """Peak bytes one pair adds to one patched edge forward, or (grad) to one gradient pass: module docstring."""
    residual = int(seq_len) * shape.d_model * 4
    senders = len(graph.senders) * residual
    logits = forward_bytes(shape, seq_len, logit_rows=1) - forward_bytes(shape, seq_len, logit_rows=0)  # the query row
    layer = forward_bytes(shape, seq_len, logit_rows=0) + 3 * graph.n_heads * residual * 2
    if not grad:
        return layer + logits + PATCH_SENDER_COPIES * senders
    return (graph.n_layers + 1) * layer + 2 * logits + SCORE_SENDER_COPIES * senders


def edge_pair_bytes(shape: ForwardShape, graph: EdgeGraph, seq_len: int, grad: bool) -> int:
    """Peak bytes one clean/corrupted pair adds to an edge run: its kept sender outputs and its forward."""
    return kept_pair_bytes(shape, graph, seq_len) + edge_forward_bytes(shape, graph, seq_len, grad)


def check_edge_run_fits(config: Any, seq_len: int, dtype: torch.dtype, grad: bool, device: str = "cpu",
                        available_bytes: int | None = None) -> int:
    """Refuse, before the model is loaded, an edge run whose weights and one pair cannot fit; returns the bytes.

    The weights as core.model.memory estimates them, plus one pair of `seq_len` tokens (edge_pair_bytes,
    with gradients for EAP and EAP-IG), against the share of the free memory HeadLab may use.
    """
    weights = estimate_memory_bytes(config, dtype)
    one_pair = edge_pair_bytes(ForwardShape.of_config(config, dtype), edge_graph_of_config(config), seq_len, grad)
    budget = memory_budget(device, available_bytes)
    if weights + one_pair > budget:
        raise HeadLabError(
            f"an edge run on this model needs ~{(weights + one_pair) / 1e9:.2f} GB: {weights / 1e9:.2f} GB for the "
            f"weights and {one_pair / 1e9:.2f} GB for one pair of {int(seq_len)} tokens"
            f"{' with its gradients' if grad else ''}, more than the {budget / 1e9:.2f} GB HeadLab may use "
            f"({SAFETY_FRACTION:.0%} of the free memory); use shorter pairs (--seq-len), a smaller dtype "
            "(--dtype bfloat16) or another device (--device cuda).")
    return weights + one_pair
