"""Path patching: sender heads -> receiver heads, through the receivers' queries, keys or values.

The method of the IOI paper [Wang et al. 2022]: per chunk of examples, on the base run (the
corrupted prompts when denoising, the clean ones when noising),
1. patch the senders' hook_z from the source run and freeze every other head at its base-run z
   (MLPs and norms recompute), and record the residual stream entering each receiver's layer (the run stops at
   the last receiver's layer: nothing after it is read);
2. run the base prompts again with only the receivers' chosen inputs (q, k and/or v) read from
   that recorded residual, everything else recomputed, and measure the metric.
So only what the senders send into the receivers' chosen inputs (directly, or through MLPs)
changes. Step 2 uses TransformerLens's per-head attention inputs (`cfg.use_split_qkv_input`,
hooks blocks.{l}.attn.hook_{q,k,v}_input [batch, pos, head, d_model]), switched on for the run and
restored after. Under grouped-query attention (GQA: n_key_value_heads < n_heads) the key and value
inputs are per *query* head too (MIB's convention, TransformerLens's ungroup_grouped_query_attention):
for the run each query head gets its own copy of its group's K and V projection
(`ungrouped_key_values`), so patching into receiver L5H2's keys changes query head 2's keys alone and
leaves the other heads of its group reading the unpatched residual. TransformerLens 4.3's own `patching.get_act_patch_direct_path` patches one sender
into one receiver at a time with MLPs frozen; groups of senders and receivers, with random sender
groups as controls, need this module.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from core.ablation.clean_run import replay_block
from core.ablation.patching.runs import (ChunkRuns, Hook, PatchSettings, Progress, check_pair_fits, checked_gap,
                                         patch_provenance, patched_run, run_chunks)
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.hooks import hook_name, mask_kwargs, model_shape
from core.results import JsonResult
from core.stats.controls import ControlSets, check_selection, matched_random_controls
from core.stats.patching import against_controls, normalized_score
from core.tasks.counterfactual import PatchPair

COMPONENTS = ("q", "k", "v")


@dataclass(frozen=True, eq=False)
class PathPatching(JsonResult):
    """Senders -> receivers' components, and random sender groups into the same receivers as controls.

    score, control_scores: normalized (clean 1, corrupted 0); stats: z, rank, p against the controls;
    identity_max_diff: the largest logit change when the senders are patched from the base run itself
    (float rounding only, about 1e-5 on float32: step 2 runs the attention on split per-head inputs, whose
    sums round differently from the plain forward that gave the base logits).
    """

    direction: str
    metric: str
    clean_value: float
    corrupted_value: float
    senders: HeadSet
    receivers: HeadSet
    components: tuple[str, ...]
    score: float
    control_sets: ControlSets
    control_scores: tuple[float, ...]
    stats: dict
    identity_max_diff: float
    provenance: dict
    gap: dict = field(default_factory=dict)  # the per-example clean-corrupted gap (core.stats.patching.gap_stats)


def check_components(components: Sequence[str] | str) -> tuple[str, ...]:
    """Receiver inputs as a sorted tuple of "q", "k", "v" (a string like "k" or "q,k" is accepted)."""
    items = components.replace(",", " ").split() if isinstance(components, str) else list(components)
    if not items or any(c not in COMPONENTS for c in items):
        raise HeadLabError(f"receiver components {components!r} are not understood; use any of q, k, v (e.g. 'k' or 'q,k').")
    return tuple(sorted(set(items), key=COMPONENTS.index))


def _check_route(model: Any, senders: HeadSet, receivers: HeadSet) -> None:
    if max(senders.layers) >= min(receivers.layers):
        raise HeadLabError(f"every sender must sit in a layer before every receiver; senders reach layer "
                           f"{max(senders.layers)} and receivers start at layer {min(receivers.layers)}.")
    if not hasattr(model, "set_use_split_qkv_input"):
        raise HeadLabError("this model offers no per-head attention inputs (set_use_split_qkv_input); path patching "
                           "needs a TransformerLens TransformerBridge.")


def key_value_heads(model: Any) -> int:
    """The number of key/value heads (n_heads unless the model shares them among query heads, GQA)."""
    n_heads = int(model.cfg.n_heads)
    return int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)


def _projection(module: Any) -> torch.nn.Linear:
    """The nn.Linear behind a bridge's LinearBridge (or the module itself)."""
    return getattr(module, "original_component", None) or module


@contextmanager
def ungrouped_key_values(model: Any) -> Iterator[None]:
    """Under GQA, for the duration: every query head owns a copy of its group's K and V projection.

    Query head h reads key/value head h // (n_heads / n_kv_heads) (repeat_kv's order), so repeating each
    group's rows of k_proj / v_proj that many times gives a model with one key/value head per query head
    whose every output is the grouped model's, bit for bit; its hook_{k,v}_input then have one residual
    copy per query head. Weights, the attention's num_key_value_groups and the configs' n_key_value_heads
    are restored after. A model without GQA is left as it is.
    """
    n_heads, n_kv = int(model.cfg.n_heads), key_value_heads(model)
    if n_kv == n_heads:
        yield
        return
    if n_heads % n_kv:
        raise HeadLabError(f"this model has {n_heads} query heads and {n_kv} key/value heads, which do not divide; "
                           "HeadLab cannot tell which query heads share a key/value head.")
    group = n_heads // n_kv
    configs = list({id(c): c for c in [model.cfg] + [block.attn.config for block in model.blocks]}.values())
    saved: list[tuple[Any, str, Any]] = []  # (object, attribute, value) to put back
    try:
        for block in model.blocks:
            attention = block.attn.original_component
            for name in ("k_proj", "v_proj"):
                linear = _projection(getattr(attention, name))
                rows = linear.weight.shape[0]  # n_kv * d_head
                saved += [(linear, "weight", linear.weight), (linear, "bias", linear.bias),
                          (linear, "out_features", linear.out_features)]
                weight = linear.weight.detach().reshape(n_kv, rows // n_kv, -1).repeat_interleave(group, dim=0)
                linear.weight = torch.nn.Parameter(weight.reshape(group * rows, -1), requires_grad=False)
                if linear.bias is not None:
                    bias = linear.bias.detach().reshape(n_kv, rows // n_kv).repeat_interleave(group, dim=0)
                    linear.bias = torch.nn.Parameter(bias.flatten(), requires_grad=False)
                linear.out_features = group * rows
            saved.append((attention, "num_key_value_groups", getattr(attention, "num_key_value_groups", 1)))
            attention.num_key_value_groups = 1
        for config in configs:
            saved.append((config, "n_key_value_heads", config.n_key_value_heads))
            config.n_key_value_heads = n_heads
        yield
    finally:
        for owner, attribute, value in reversed(saved):
            setattr(owner, attribute, value)


@contextmanager
def split_qkv_inputs(model: Any) -> Iterator[None]:
    """Per-head q/k/v inputs on for the duration (they cost 3 x n_heads copies of the residual); flags restored.

    Under GQA the key/value inputs are per query head too (ungrouped_key_values).
    """
    saved_split = bool(getattr(model.cfg, "use_split_qkv_input", False))
    saved_attn_in = bool(getattr(model.cfg, "use_attn_in", False))
    with ungrouped_key_values(model):
        try:
            if saved_attn_in:  # the two per-head forks exclude each other
                model.set_use_attn_in(False)
            model.set_use_split_qkv_input(True)
            yield
        finally:
            model.set_use_split_qkv_input(saved_split)
            if saved_attn_in:
                model.set_use_attn_in(True)


def _sender_hooks(runs: ChunkRuns, senders: HeadSet, source_z: Sequence[torch.Tensor], last_layer: int) -> list[Hook]:
    """Step 1's z hooks: senders from `source_z`, every other head frozen at its base-run z (layers < last_layer)."""
    hooks = []
    for layer in range(last_layer):
        index = [h for l, h in senders if l == layer]

        def hook(z, hook=None, layer=layer, index=index):
            out = runs.base_z[layer].to(z.dtype).clone()  # [row, pos, head, d_head]
            if index:
                out[:, :, index] = source_z[layer][:, :, index].to(z.dtype)
            return out

        hooks.append((hook_name("z", layer), hook))
    return hooks


def _receiver_hooks(recorded: dict[int, torch.Tensor], receivers: HeadSet, components: tuple[str, ...],
                    fired: list[str]) -> list[Hook]:
    """Step 2's hooks: each receiver's chosen inputs [row, pos, head, d_model] read from the recorded residual."""
    hooks = []
    for layer in receivers.layers:
        index = [h for l, h in receivers if l == layer]
        for component in components:
            name = hook_name(f"{component}_input", layer)

            def hook(x, hook=None, layer=layer, index=index, name=name):
                fired.append(name)
                x = x.clone()
                x[:, :, index] = recorded[layer][:, :, None, :].to(x.dtype)
                return x

            hooks.append((name, hook))
    return hooks


@torch.no_grad()
def path_run(model: Any, runs: ChunkRuns, senders: HeadSet, receivers: HeadSet, components: tuple[str, ...],
             source_z: Sequence[torch.Tensor], metric: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two steps on one chunk: (metric values [row], query logits [row, vocab])."""
    recorded: dict[int, torch.Tensor] = {}  # layer -> the residual entering it [row, pos, d_model]
    last = max(receivers.layers)
    hooks = _sender_hooks(runs, senders, source_z, last)
    if runs.replay is not None:  # step 1 from the lowest sender's layer: below it every head is the base run's
        first = min(senders.layers)
        x = runs.replay.resid_before(first)
        with model.hooks(fwd_hooks=hooks):
            for layer in range(first, last):
                if layer in receivers.layers:
                    recorded[layer] = x
                x = replay_block(model, runs.replay, layer, x)
        recorded[last] = x
    else:
        def keep(layer: int):
            def hook(x, hook=None):
                recorded[layer] = x.detach()
                return x
            return hook

        hooks += [(hook_name("resid_pre", layer), keep(layer)) for layer in receivers.layers if layer < last]
        # step 1 stops where the last receiver's layer begins: the residual entering it is all it still needs
        recorded[last] = model.run_with_hooks(runs.base_tokens, fwd_hooks=hooks, stop_at_layer=last,
                                              **mask_kwargs(runs.attention_mask)).detach()
    fired: list[str] = []
    receiver_hooks = _receiver_hooks(recorded, receivers, components, fired)
    with split_qkv_inputs(model):
        out = patched_run(model, runs, receiver_hooks, metric, start=min(receivers.layers))
    missing = sorted({name for name, _ in receiver_hooks} - set(fired))
    if missing:
        raise HeadLabError(f"{missing[0]} never ran: this model's attention has no per-head input there, so path "
                           "patching cannot reach the receivers.")
    return out


def path_patching(model: Any, pair: PatchPair, senders: HeadSet, receivers: HeadSet,
                  components: Sequence[str] | str = ("k",), settings: PatchSettings = PatchSettings(),
                  progress: Progress | None = None) -> PathPatching:
    """Senders -> receivers' `components`, and settings.n_controls matched-random sender groups (same receivers).

    progress(done, total) counts example-conditions.
    """
    n_layers, n_heads, _ = model_shape(model)
    senders = check_selection(senders, n_layers, n_heads)
    receivers = check_selection(receivers, n_layers, n_heads)
    components = check_components(components)
    _check_route(model, senders, receivers)
    check_pair_fits(model, pair)
    # matched controls whatever settings.controls says: in the senders' own layers, so before every receiver too
    sets = matched_random_controls(senders, n_layers, n_heads, settings.n_controls, settings.control_seed)
    groups = [senders] + list(sets)
    sums = np.zeros(len(groups))
    clean_values, corrupted_values = [], []
    identity = 0.0
    done, total = 0, len(groups) * pair.n_examples
    for runs in run_chunks(model, pair, settings):
        clean_values.append(runs.clean_values)
        corrupted_values.append(runs.corrupted_values)
        _, same = path_run(model, runs, senders, receivers, components, runs.base_z, settings.metric)
        identity = max(identity, float((same.float() - runs.base_logits.float()).abs().max()))
        for i, group in enumerate(groups):
            values, _ = path_run(model, runs, group, receivers, components, runs.source_z, settings.metric)
            sums[i] += float(values.double().sum())
            done += runs.rows
            if progress is not None:
                progress(done, total)
    n = pair.n_examples
    gap = checked_gap(clean_values, corrupted_values, settings)
    clean = float(sum(float(v.double().sum()) for v in clean_values)) / n
    corrupted = float(sum(float(v.double().sum()) for v in corrupted_values)) / n
    scores = np.asarray(normalized_score(sums / n, clean, corrupted))
    score, control_scores = float(scores[0]), tuple(float(s) for s in scores[1:])
    return PathPatching(settings.direction, settings.metric, clean, corrupted, senders, receivers, components, score,
                        sets, control_scores, against_controls(score, control_scores, settings.direction), identity,
                        patch_provenance(model, pair, settings, "path patching (IOI method)",
                                         route="senders' hook_z -> receivers' hook_{q,k,v}_input; other heads frozen"),
                        gap)
