"""Attribution patching: activation patching of every head at once, to first order.

Patching head h's z from the source run into the base run changes the metric by about
grad_z(metric on the base run) . (source z - base z) (a first-order Taylor step), summed over
d_head and positions. One forward of the source run, then one forward and one backward of the
base run per chunk give that estimate for every head (and every head x position) together,
where activation patching needs one forward per head. It is exact when the metric is linear in
the patched z (e.g. the last layer of a model without a final norm); elsewhere its ranks are
compared with activation patching's (core/pipelines/patching.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from core.ablation.patching.runs import (GRADIENT_METRICS, PatchSettings, Progress, check_pair_fits, examples_per_chunk,
                                         checked_gap, metric_values, patch_provenance, query_logits,
                                         z_recorders)
from core.errors import HeadLabError
from core.model.hooks import hook_name, model_device, model_dtype, model_shape
from core.model.memory import lean_forward
from core.results import JsonResult
from core.stats.patching import normalized_score
from core.tasks.counterfactual import PatchPair


@dataclass(frozen=True, eq=False)
class HeadAttribution(JsonResult):
    """The first-order estimate of each head's activation-patching score, on the same normalized scale.

    scores: [layer, head]; position_scores: [layer, head, pos] (they sum over pos to the head's
    change); clean_value, corrupted_value: the runs' mean metric.
    """

    direction: str
    metric: str
    clean_value: float
    corrupted_value: float
    scores: np.ndarray
    position_scores: np.ndarray
    provenance: dict
    gap: dict = field(default_factory=dict)  # the per-example clean-corrupted gap (core.stats.patching.gap_stats)


@contextmanager
def float32_weights(model: Any) -> Iterator[None]:
    """The model in float32 for the forward and backward, restored to its dtype after.

    A float16 / bfloat16 backward rounds every gradient to 3 (or 2) significant digits; float32
    weights make the first-order estimate's arithmetic float32. float16 and bfloat16 convert to
    float32 and back exactly, so the restored weights are bit-identical (the loaded model is shared).
    """
    dtype = model_dtype(model)
    if dtype == torch.float32 or dtype == torch.float64:
        yield
        return
    model.to(torch.float32)
    try:
        yield
    finally:
        model.to(dtype)


def attribution_patching(model: Any, pair: PatchPair, settings: PatchSettings = PatchSettings(),
                         progress: Progress | None = None) -> HeadAttribution:
    """Every head's estimated score from one source forward and one base forward + backward per chunk.

    Runs in float32 whatever the model's dtype (float32_weights). progress(done, total) counts examples.
    """
    if settings.metric not in GRADIENT_METRICS:
        raise HeadLabError(f"attribution patching needs a metric with a gradient ({', '.join(GRADIENT_METRICS)}); "
                           f"{settings.metric} is a step function.")
    check_pair_fits(model, pair)
    n_layers, n_heads, _ = model_shape(model)
    device = model_device(model)
    effect = torch.zeros(n_layers, pair.seq_len, n_heads, dtype=torch.float64)  # summed over examples and d_head
    values_of: dict[str, list] = {"clean": [], "corrupted": []}  # per chunk [row]
    base_side, source_side = ("corrupted", "clean") if settings.direction == "denoise" else ("clean", "corrupted")
    done = 0
    with float32_weights(model), lean_forward(model):
        for chunk in pair.chunks(examples_per_chunk(model, pair, settings, grad=True)):
            query, target = chunk.clean.query_pos.to(device), chunk.clean.target.to(device)
            other = None if chunk.corrupted_target is None else chunk.corrupted_target.to(device)
            tokens = {"clean": chunk.clean.tokens.to(device), "corrupted": chunk.corrupted_tokens.to(device)}
            mask = None if chunk.attention_mask is None else chunk.attention_mask.to(device)
            source_z: dict[int, torch.Tensor] = {}
            with torch.no_grad():
                logits_q = query_logits(model, tokens[source_side], query, z_recorders(n_layers, source_z), mask)
                values_of[source_side].append(metric_values(logits_q, target, other, settings.metric).detach())
            base_z: dict[int, torch.Tensor] = {}
            leaves: dict[int, torch.Tensor] = {}

            def add_leaf(layer: int):
                def hook(z, hook=None):
                    # z + 0: the metric's gradient w.r.t. this zero leaf is its gradient w.r.t. z
                    base_z[layer] = z.detach()
                    leaves[layer] = torch.zeros_like(z, requires_grad=True)
                    return z + leaves[layer]
                return hook

            with torch.enable_grad():
                hooks = [(hook_name("z", layer), add_leaf(layer)) for layer in range(n_layers)]
                values = metric_values(query_logits(model, tokens[base_side], query, hooks, mask), target, other, settings.metric)
                grads = torch.autograd.grad(values.sum(), [leaves[layer] for layer in range(n_layers)], allow_unused=True)
            values_of[base_side].append(values.detach())
            for layer, grad in enumerate(grads):
                if grad is not None:  # [row, pos, head, d_head]
                    step = source_z[layer].double() - base_z[layer].double()
                    effect[layer] += (grad.double() * step).sum(dim=(0, 3)).cpu()
            done += chunk.n_examples
            if progress is not None:
                progress(done, pair.n_examples)
    n = pair.n_examples
    gap = checked_gap(values_of["clean"], values_of["corrupted"], settings)
    sums = {side: float(sum(float(v.double().sum()) for v in chunks)) for side, chunks in values_of.items()}
    clean, corrupted = sums["clean"] / n, sums["corrupted"] / n
    base = sums[base_side] / n
    per_position = (effect / n).permute(0, 2, 1).numpy()  # [layer, head, pos]: the mean metric's change
    scores = normalized_score(base + per_position.sum(axis=2), clean, corrupted)
    position_scores = normalized_score(base + per_position, clean, corrupted)
    return HeadAttribution(settings.direction, settings.metric, clean, corrupted, scores, position_scores,
                           patch_provenance(model, pair, settings, "attribution patching",
                                            estimate="grad . (source z - base z), summed over d_head and positions",
                                            gradient_dtype="float32"), gap)
