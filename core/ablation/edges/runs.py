"""Edge patching on a bridge: sender outputs recorded per run, receivers' inputs changed edge by edge.

A receiver reads the residual stream, the sum of its senders' outputs (plus biases that no edge
carries). Patching the edge s -> r on a run changes r's input alone by (source_s - current_s): s's
output on the source run minus its output in the current forward, so every other reader of s is
untouched. The hooks (TransformerBridge, raw weights):
- sender outputs: embed = blocks.0.hook_resid_pre; head h of layer l = hook_z[..., h, :] @ W_O[l, h]
  (core.model.hooks.head_output_weights); MLP l = its output hook (core.model.hooks.mlp_hook_name);
  where the block normalizes the attention output before adding it (Gemma-3's post-attention RMSNorm,
  the bridge's ln1_post), head h's output is hook_z[..., h, :] @ W_O[l, h] * gain / rms(attention
  output), the norm's gain and its 1 / rms of this forward's summed attention output at that position:
  the norm taken as linear with its scale frozen at the forward's own value, so the heads' outputs
  add up exactly to what the attention adds to the residual in every run (post_norm_scales);
- receiver inputs: a head's q / k / v input = blocks.{l}.attn.hook_{q,k,v}_input [row, pos, head,
  d_model] (the residual before the norm, one copy per head while cfg.use_split_qkv_input is on; under
  grouped-query attention one copy per *query* head for k and v too, each through its own copy of
  the group's K / V projection: core.ablation.patching.paths.ungrouped_key_values);
  MLP l = blocks.{l}.ln2.hook_in; the logits = ln_final.hook_in.
The edge methods follow ACDC, EAP and MIB: the base run is the clean prompts and the removed (or
scored) edges take the corrupted run's sender outputs ("resample"), or their mean over the pairs
("mean"). Every metric is read at the query position; "kl" is KL(clean output || run) there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from core.ablation.edges.graph import HEAD_INPUTS, LOGITS, EdgeGraph, edge_graph_of
from core.ablation.patching.paths import split_qkv_inputs
from core.ablation.patching.runs import (PATCH_METRICS, PatchSettings, check_pair_fits, checked_gap, metric_values,
                                         query_logits)
from core.choices import EDGE_METRICS, EDGE_REPLACEMENTS as REPLACEMENTS
from core.errors import HeadLabError
from core.model.hooks import (bridge_hook_names, head_output_weights, hook_name, mask_kwargs, mlp_hook_name, model_device,
                              model_shape)
from core.ablation.edges.memory import (check_edge_run_fits, edge_forward_bytes, edge_pair_bytes,  # noqa: F401
                                        kept_pair_bytes)
from core.model.memory import ForwardShape, chunk_size_for, memory_budget
from core.results import JsonResult
from core.stats.patching import normalized_score
from core.tasks.counterfactual import PatchPair

Hook = tuple[str, Callable]


@dataclass(frozen=True)
class EdgeSettings(JsonResult):
    """Everything besides the model and the pairs that decides an edge result.

    metric: "logit_diff" (default), loss, top1, top5, target_logit, or "kl" (KL of the clean output
    to the run's, at the query); replacement: what a removed edge carries, the corrupted run's sender
    output ("resample") or its mean over the pairs at each position ("mean"); batch_size: pairs per
    forward (None: as many as fit); allow_small_gap: keep (flagged) pairs whose clean-corrupted gap
    the gap rule refuses (core.stats.patching.check_gap).
    """

    metric: str = "logit_diff"
    replacement: str = "resample"
    batch_size: int | None = None
    allow_small_gap: bool = False

    def __post_init__(self) -> None:
        if self.metric not in EDGE_METRICS:
            raise HeadLabError(f"edge metric {self.metric!r} is unknown; use one of {', '.join(EDGE_METRICS)}.")
        if self.replacement not in REPLACEMENTS:
            raise HeadLabError(f"replacement {self.replacement!r} is unknown; use 'resample' (the corrupted run) or 'mean'.")
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", int(self.batch_size))
            if self.batch_size < 1:
                raise HeadLabError(f"batch_size is {self.batch_size}; use at least one pair per forward, or None.")
        object.__setattr__(self, "allow_small_gap", bool(self.allow_small_gap))

    def gap_settings(self) -> PatchSettings:
        """The patching settings whose gap rule the pairs must pass (the pair metric; KL gaps are checked on logit_diff)."""
        metric = "logit_diff" if self.metric == "kl" else self.metric
        return PatchSettings(direction="noise", metric=metric, allow_small_gap=self.allow_small_gap)


@dataclass(frozen=True, eq=False)
class EdgeChunk:
    """One chunk of pairs, run clean and corrupted, with every sender's output on both.

    tokens: [row, pos] clean prompts (the base run); query, target: [row]; other_target: [row] or None;
    attention_mask: [row, pos] or None; clean_acts, source_acts: [sender, row, pos, d_model] (source:
    the corrupted run, or its mean); clean_logprobs: [row, vocab] at the query (for "kl");
    clean_values, corrupted_values: [row] of the pair metric; source_is_run: the source is the corrupted run
    itself (resample), not its mean, so the run with every edge removed is that run.
    """

    tokens: torch.Tensor
    query: torch.Tensor
    target: torch.Tensor
    other_target: torch.Tensor | None
    attention_mask: torch.Tensor | None
    clean_acts: torch.Tensor
    source_acts: torch.Tensor
    clean_logprobs: torch.Tensor
    clean_values: torch.Tensor
    corrupted_values: torch.Tensor
    source_is_run: bool = True

    @property
    def rows(self) -> int:
        return int(self.query.shape[0])


class EdgeHooks:
    """The hooks of one forward: record every sender's output, and (optionally) add on each receiver's input the
    patch of its removed edges, and / or take the metric's gradient there straight into edge scores.

    removed: [sender, receiver] bool tensor or None (no patch); source: [sender, row, pos, d_model], what a
    removed edge carries; embed_override: a function of the embeddings [row, pos, d_model] (EAP-IG's
    interpolation); scale: the fraction of each removed edge's patch applied (1: the whole patch; small: a
    first-order probe); score_diff: [sender, row, pos, d_model] or None, (source - clean) for EAP: the forward
    then needs grad from `embed_input`, the backward fills `scores` [sender, receiver] (below), and no sender
    output but the embeddings is recorded (the differences come from the recorded runs).

    Why it is laid out so (a real model has ~300 senders and ~840 receivers): a patched forward keeps one
    buffer of every sender's (source - current) [sender, row * pos * d_model], filled as the senders are
    computed, and each layer's q, k and v patches come out of one matrix product with the removed-edge
    matrix; the gradient of each receiver input is multiplied into score_diff as the backward reaches it
    (sum over row, pos, d_model of diff_s * grad_r, one matrix product per layer) and then dropped, so
    neither all receivers' gradients nor per-receiver stacks of senders are ever held.
    """

    def __init__(self, model: Any, graph: EdgeGraph, removed: torch.Tensor | None = None,
                 source: torch.Tensor | None = None, embed_override: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 scale: float = 1.0, score_diff: torch.Tensor | None = None):
        self.graph, self.removed, self.source, self.scale = graph, removed, source, float(scale)
        self.embed_override = embed_override
        self.w_o = head_output_weights(model)  # [layer, head, d_head, d_model]
        self.post_norms = post_attention_norms(model)  # per layer: (gain [d_model], eps) or None
        self.mlp_names = mlp_output_hooks(model, graph.n_layers) if not graph.attn_only else []
        self.current: dict[int, torch.Tensor] = {}  # sender index -> its output [row, pos, d_model] in this forward
        self.sender_at = {name: i for i, name in enumerate(graph.senders)}
        self.receiver_at = {name: j for j, name in enumerate(graph.receivers)}
        self.reach = graph.reach.tolist()  # the senders reaching receiver j are a prefix of graph.senders
        self.patch_buffer: torch.Tensor | None = None  # [sender, row * pos * d_model]: source - current, filled up to
        self.filled = 0  # ... this many senders
        self.layer_patch: tuple[int, torch.Tensor | None] | None = None  # (layer, its q/k/v patch [r, row, pos, d])
        self.score_diff = None if score_diff is None else score_diff.reshape(score_diff.shape[0], -1)  # [sender, K]
        self.scores = None if score_diff is None else torch.zeros(graph.mask.shape, dtype=score_diff.dtype,
                                                                  device=score_diff.device)  # [sender, receiver]
        self.embed_input: torch.Tensor | None = None  # the tensor the gradient is taken to (score_diff given)
        self.pending: dict[int, list[tuple[list[int], torch.Tensor]]] = {}  # layer -> gradients [r, K] not yet used
        self.expected = [3 + (0 if graph.attn_only else 1) for _ in range(graph.n_layers)] + [1]  # gradients per group

    # --------------------------------------------------------------------------------- senders

    def _embed(self, x, hook=None):
        if self.embed_override is not None:
            x = self.embed_override(x)
        if self.score_diff is not None:
            x = x.detach().requires_grad_(True)
            self.embed_input = x
        self.current[0] = x
        return x

    def _heads(self, layer: int):
        first = self.sender_at[f"L{layer}H0"]
        w_o = self.w_o[layer]

        def hook(z, hook=None):  # z: [row, pos, head, d_head]
            if self.score_diff is not None:  # scoring reads the recorded senders: none is kept in the graph
                return z
            out = torch.einsum("bphd,hdm->hbpm", z, w_o.to(z.dtype))  # [head, row, pos, d_model]
            for h in range(out.shape[0]):
                self.current[first + h] = out[h]
            return z
        return hook

    def _post_norm(self, layer: int):
        """Scale layer `layer`'s head outputs by the post-attention norm's gain / rms of their sum (frozen scale)."""
        first = self.sender_at[f"L{layer}H0"]
        gain, eps = self.post_norms[layer]

        def hook(x, hook=None):  # x: [row, pos, d_model], the attention output entering the norm
            if self.score_diff is not None:
                return x
            scale = post_norm_scales(x, gain, eps)  # [row, pos, d_model]
            for h in range(self.graph.n_heads):
                self.current[first + h] = self.current[first + h] * scale.to(x.dtype)
            return x
        return hook

    def _mlp(self, layer: int):
        index = self.sender_at[f"MLP{layer}"]

        def hook(x, hook=None):
            if self.score_diff is None:
                self.current[index] = x
            return x
        return hook

    # --------------------------------------------------------------------------------- receivers: patches

    def _fill(self, prefix: int, like: torch.Tensor) -> torch.Tensor:
        """The patch buffer [sender, K] with rows < prefix holding source - current (senders seen so far)."""
        if self.patch_buffer is None:
            self.patch_buffer = torch.zeros(len(self.graph.senders), self.source[0].numel(),
                                            dtype=torch.promote_types(self.source.dtype, like.dtype), device=like.device)
        for s in range(self.filled, prefix):
            self.patch_buffer[s] = (self.source[s] - self.current[s]).reshape(-1)
        self.filled = max(self.filled, prefix)
        return self.patch_buffer

    def _delta(self, receivers: Sequence[int], like: torch.Tensor) -> torch.Tensor | None:
        """The patch of `receivers`' removed edges: [receiver, row, pos, d_model], or None when none is removed."""
        if self.removed is None:
            return None
        prefix = max(self.reach[j] for j in receivers)
        chosen = self.removed[:prefix, list(receivers)]  # [sender, receiver]
        active = torch.nonzero(chosen.any(dim=1)).flatten()
        if active.numel() == 0:
            return None
        buffer = self._fill(prefix, like)
        if 4 * active.numel() >= prefix:  # many senders: one product over the whole prefix, no copy
            diff, weights = buffer[:prefix], chosen
        else:  # a few (one edge at a time): only their rows
            diff, weights = buffer.index_select(0, active), chosen.index_select(0, active)
        delta = weights.to(diff.dtype).T @ diff  # [receiver, K]
        if self.scale != 1.0:
            delta = self.scale * delta
        return delta.reshape((len(receivers),) + tuple(self.source.shape[1:]))

    def _layer_delta(self, layer: int, component: str, like: torch.Tensor) -> torch.Tensor | None:
        """One component's patch [head, row, pos, d_model], the layer's q, k and v computed together (no sender
        is added between the three hooks)."""
        if self.layer_patch is None or self.layer_patch[0] != layer:  # one layer's patch kept at a time
            receivers = [self.receiver_at[f"L{layer}H{h}.{c}"] for c in HEAD_INPUTS for h in range(self.graph.n_heads)]
            self.layer_patch = (layer, self._delta(receivers, like))
        delta = self.layer_patch[1]
        if delta is None:
            return None
        n = self.graph.n_heads
        index = HEAD_INPUTS.index(component)
        return delta[index * n:(index + 1) * n]

    # --------------------------------------------------------------------------------- receivers: gradients

    def _watch(self, group: int, receivers: list[int], x: torch.Tensor) -> torch.Tensor:
        """Score the gradient reaching x ([row, pos, receiver, d_model], or [row, pos, d_model] for one receiver)
        when the backward gets there: grouped per layer, one product with score_diff per group."""
        if self.score_diff is None or not x.requires_grad:
            return x
        x = x.view_as(x)  # a node of its own: its gradient is this input's alone (ln2's input is also the residual)

        def on_grad(grad):
            grad = grad if grad.dim() == 4 else grad[:, :, None]
            flat = grad.permute(2, 0, 1, 3).reshape(len(receivers), -1).to(self.score_diff.dtype)  # [receiver, K]
            self.pending.setdefault(group, []).append((receivers, flat))
            if len(self.pending[group]) == self.expected[group]:
                self._score(group)
            return None

        x.register_hook(on_grad)
        return x

    def _score(self, group: int) -> None:
        """scores[:, receivers] = score_diff . gradient for a group's gradients (senders beyond the reach left 0)."""
        parts = self.pending.pop(group, [])
        if not parts:
            return
        receivers = [j for r, _ in parts for j in r]
        grads = torch.cat([g for _, g in parts])  # [receiver, K]
        prefix = max(self.reach[j] for j in receivers)
        self.scores[:prefix, receivers] = self.score_diff[:prefix] @ grads.T

    def finish_scores(self) -> torch.Tensor:
        """After the backward: score any group not complete (a receiver the metric did not reach); [sender, receiver]
        float, zero off the edges."""
        for group in list(self.pending):
            self._score(group)
        scores = self.scores * torch.from_numpy(self.graph.mask).to(self.scores.device)
        # drop what the forward held: the hooks' closures make reference cycles that only the garbage collector
        # would break, so a run of many passes (EAP-IG) would otherwise keep each pass's tensors for a while
        self.current.clear()
        self.score_diff = self.scores = self.embed_input = None
        return scores

    # --------------------------------------------------------------------------------- hooks

    def _head_inputs(self, layer: int, component: str):
        receivers = [self.receiver_at[f"L{layer}H{h}.{component}"] for h in range(self.graph.n_heads)]
        name = hook_name(f"{component}_input", layer)

        def hook(x, hook=None):  # x: [row, pos, head, d_model]
            delta = self._layer_delta(layer, component, x)
            if delta is not None:
                x = x + delta.permute(1, 2, 0, 3).to(x.dtype)
            return self._watch(layer, receivers, x)
        return name, hook

    def _single_input(self, receiver: str, name: str, group: int):
        j = self.receiver_at[receiver]

        def hook(x, hook=None):  # x: [row, pos, d_model]
            delta = self._delta([j], x)
            if delta is not None:
                x = x + delta[0].to(x.dtype)
            return self._watch(group, [j], x)
        return name, hook

    def sender_hooks(self) -> list[Hook]:
        """The hooks that record the senders' outputs only (no split q/k/v inputs needed)."""
        out: list[Hook] = [(hook_name("resid_pre", 0), self._embed)]
        for layer in range(self.graph.n_layers):
            out.append((hook_name("z", layer), self._heads(layer)))
            if self.post_norms[layer] is not None:
                out.append((post_attention_hook(layer), self._post_norm(layer)))
            if not self.graph.attn_only:
                out.append((self.mlp_names[layer], self._mlp(layer)))
        return out

    def hooks(self) -> list[Hook]:
        """Every hook, senders and receivers (the forward must run under split_qkv_inputs)."""
        out: list[Hook] = [(hook_name("resid_pre", 0), self._embed)]
        for layer in range(self.graph.n_layers):
            out += [self._head_inputs(layer, c) for c in HEAD_INPUTS]
            out.append((hook_name("z", layer), self._heads(layer)))
            if self.post_norms[layer] is not None:
                out.append((post_attention_hook(layer), self._post_norm(layer)))
            if not self.graph.attn_only:
                out.append(self._single_input(f"MLP{layer}", mlp_input_hook(layer), layer))
                out.append((self.mlp_names[layer], self._mlp(layer)))
        out.append(self._single_input(LOGITS, FINAL_INPUT_HOOK, self.graph.n_layers))
        return out

    def stacked(self) -> torch.Tensor:
        """Every sender's output of the forward just run: [sender, row, pos, d_model]."""
        missing = [self.graph.senders[i] for i in range(len(self.graph.senders)) if i not in self.current]
        if missing:
            raise HeadLabError(f"the output of {missing[0]} was never seen: this model's hooks do not match HeadLab's "
                               "edge graph (it needs a TransformerBridge with hook_z and MLP output hooks).")
        return torch.stack([self.current[i] for i in range(len(self.graph.senders))])


FINAL_INPUT_HOOK = "ln_final.hook_in"  # [row, pos, d_model], the last residual before the final norm


def post_attention_hook(layer: int) -> str:
    """The input of a block's post-attention norm (Gemma-3): the heads' summed output [row, pos, d_model]."""
    return f"blocks.{int(layer)}.ln1_post.hook_in"


def post_attention_norms(model: Any) -> list[tuple[torch.Tensor, float] | None]:
    """Per layer, the post-attention RMSNorm's (gain [d_model], eps), or None where the block has none.

    The gain is read off the module itself, norm(ones) * sqrt(1 + eps), so Gemma's (1 + weight) and the
    plain weight convention both come out right; a post-attention LayerNorm (it subtracts the mean and adds
    a bias, so the heads' shares are not a scaling) is refused.
    """
    out: list[tuple[torch.Tensor, float] | None] = []
    for block in model.blocks:
        bridge = getattr(block, "ln1_post", None)
        if bridge is None:
            out.append(None)
            continue
        norm = getattr(bridge, "original_component", None) or bridge
        eps = getattr(norm, "eps", None)
        eps = float(getattr(norm, "variance_epsilon", 1e-6) if eps is None else eps)
        if "RMS" not in type(norm).__name__:
            raise HeadLabError(f"this model normalizes each attention output with a {type(norm).__name__} before the "
                               "residual; HeadLab splits it among the heads only for an RMSNorm (Gemma-3).")
        weight = next(norm.parameters())
        with torch.no_grad():
            ones = torch.ones(1, weight.shape[-1], dtype=torch.float32, device=weight.device)
            gain = norm(ones.to(weight.dtype)).float()[0] * (1.0 + eps) ** 0.5
        out.append((gain, eps))
    return out


def post_norm_scales(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """gain / rms(x) per position, float32 [row, pos, d_model]: RMSNorm(x) == x * this, so it splits among x's parts."""
    inverse_rms = torch.rsqrt(x.detach().float().pow(2).mean(dim=-1, keepdim=True) + eps)
    return inverse_rms * gain




def mlp_output_hooks(model: Any, n_layers: int) -> list[str]:
    """Each layer's MLP output hook (core.model.hooks.mlp_hook_name's choice), the hook names read once."""
    names = bridge_hook_names(model)
    out = []
    for layer in range(n_layers):
        found = [hook_name(kind, layer) for kind in ("mlp_out", "mlp_module_out") if hook_name(kind, layer) in names]
        out.append(found[0] if found else mlp_hook_name(model, layer))  # mlp_hook_name says what is missing
    return out


def mlp_input_hook(layer: int) -> str:
    """The MLP's input: the residual entering its norm, [row, pos, d_model]."""
    return f"blocks.{int(layer)}.ln2.hook_in"


# ------------------------------------------------------------------------------------- runs


def check_edge_model(model: Any) -> EdgeGraph:
    """The model's edge graph, refused with a clear message when its hooks cannot carry edges."""
    n_layers, _, _ = model_shape(model)
    if not hasattr(model, "set_use_split_qkv_input"):
        raise HeadLabError("this model offers no per-head attention inputs (set_use_split_qkv_input); edge methods need "
                           "a TransformerLens TransformerBridge.")
    graph = edge_graph_of(model)
    names = set(getattr(model, "hook_dict", {}))
    needed = [FINAL_INPUT_HOOK] + ([mlp_input_hook(l) for l in range(n_layers)] if not graph.attn_only else [])
    absent = [n for n in needed if n not in names]
    if absent:
        raise HeadLabError(f"this model has no hook {absent[0]}; edge methods read each MLP's and the logits' input there.")
    return graph


def edge_values(logits_q: torch.Tensor, chunk: EdgeChunk, metric: str) -> torch.Tensor:
    """The metric per pair [row] at the query: the pair metric, or KL(clean || run) for "kl"."""
    if metric == "kl":
        logprobs = torch.log_softmax(logits_q.float(), dim=-1)
        return (chunk.clean_logprobs.exp() * (chunk.clean_logprobs - logprobs)).sum(dim=-1)
    return metric_values(logits_q, chunk.target, chunk.other_target, metric)


def pair_metric(settings: EdgeSettings) -> str:
    """The metric the pairs' own values are measured in (logit_diff stands for KL's gap)."""
    return "logit_diff" if settings.metric == "kl" else settings.metric


def edges_per_chunk(model: Any, pair: PatchPair, graph: EdgeGraph, settings: EdgeSettings, grad: bool = False) -> int:
    """Pairs per forward: settings.batch_size, else as many as the free memory holds once every pair's sender
    outputs are set aside (HeadLabError when none fits)."""
    if settings.batch_size is not None:
        return min(settings.batch_size, pair.n_examples)
    shape = ForwardShape.of_model(model)
    return chunk_size_for(edge_forward_bytes(shape, graph, pair.seq_len, grad), pair.n_examples,
                          memory_budget(model_device(model)), "edge patching",
                          reserved=pair.n_examples * kept_pair_bytes(shape, graph, pair.seq_len))


@torch.no_grad()
def _record(model: Any, graph: EdgeGraph, tokens: torch.Tensor, query: torch.Tensor,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One plain forward (no per-head inputs: nothing is patched): (query logits [row, vocab], sender outputs
    [sender, row, pos, d_model])."""
    hooks = EdgeHooks(model, graph)
    logits_q = query_logits(model, tokens, query, hooks.sender_hooks(), mask)
    return logits_q, hooks.stacked()


def edge_chunks(model: Any, pair: PatchPair, settings: EdgeSettings, graph: EdgeGraph,
                grad: bool = False) -> tuple[list[EdgeChunk], dict]:
    """Every chunk of pairs run clean and corrupted (kept together: ACDC and the curves revisit them all),
    and the clean-corrupted gap of the pair metric, checked by the gap rule before anything else runs.
    """
    check_pair_fits(model, pair)
    device = model_device(model)
    metric = pair_metric(settings)
    chunks = []
    for part in pair.chunks(edges_per_chunk(model, pair, graph, settings, grad)):
        query, target = part.clean.query_pos.to(device), part.clean.target.to(device)
        other = None if part.corrupted_target is None else part.corrupted_target.to(device)
        mask = None if part.attention_mask is None else part.attention_mask.to(device)
        tokens, corrupted = part.clean.tokens.to(device), part.corrupted_tokens.to(device)
        clean_q, clean_acts = _record(model, graph, tokens, query, mask)
        corrupted_q, corrupted_acts = _record(model, graph, corrupted, query, mask)
        chunks.append(EdgeChunk(tokens, query, target, other, mask, clean_acts, corrupted_acts,
                                torch.log_softmax(clean_q.float(), dim=-1),
                                metric_values(clean_q, target, other, metric),
                                metric_values(corrupted_q, target, other, metric)))
    if settings.replacement == "mean":
        total = sum(c.source_acts.double().sum(dim=1) for c in chunks)  # [sender, pos, d_model]
        mean = (total / pair.n_examples).float()
        chunks = [EdgeChunk(c.tokens, c.query, c.target, c.other_target, c.attention_mask, c.clean_acts,
                            mean[:, None].expand_as(c.source_acts).to(c.source_acts.dtype), c.clean_logprobs,
                            c.clean_values, c.corrupted_values, source_is_run=False) for c in chunks]
    gap = checked_gap([c.clean_values for c in chunks], [c.corrupted_values for c in chunks], settings.gap_settings())
    return chunks, gap


@torch.no_grad()
def removed_run_values(model: Any, graph: EdgeGraph, chunk: EdgeChunk, removed: torch.Tensor, metric: str,
                       scale: float = 1.0) -> torch.Tensor:
    """The clean run with the `removed` edges ([sender, receiver] bool) carrying the source: metric [row]."""
    hooks = EdgeHooks(model, graph, removed=removed, source=chunk.source_acts, scale=scale)
    with split_qkv_inputs(model):
        logits_q = query_logits(model, chunk.tokens, chunk.query, hooks.hooks(), chunk.attention_mask)
    return edge_values(logits_q, chunk, metric)


def removed_matrix(graph: EdgeGraph, removed_edges: np.ndarray, device: torch.device) -> torch.Tensor:
    """[edge] bool (True: removed) as the hooks' [sender, receiver] bool tensor."""
    return torch.from_numpy(graph.to_matrix(np.asarray(removed_edges, dtype=bool))).to(device)


@dataclass(frozen=True)
class RunValues:
    """Mean metric of the clean run, the corrupted run (every edge removed) and a removed-edge run."""

    clean: float
    corrupted: float

    def score(self, value: float | np.ndarray) -> float | np.ndarray:
        """On HeadLab's patching scale: clean 1, every edge removed (the corrupted run) 0."""
        return normalized_score(value, self.clean, self.corrupted)


def mean_value(model: Any, graph: EdgeGraph, chunks: Sequence[EdgeChunk], removed_edges: np.ndarray, metric: str) -> float:
    """The mean metric over every pair with `removed_edges` ([edge] bool) patched."""
    device = chunks[0].tokens.device
    removed = removed_matrix(graph, removed_edges, device)
    total = sum(float(removed_run_values(model, graph, c, removed, metric).double().sum()) for c in chunks)
    return total / sum(c.rows for c in chunks)


def run_values(model: Any, graph: EdgeGraph, chunks: Sequence[EdgeChunk], metric: str) -> RunValues:
    """The clean run's and the every-edge-removed run's mean metric (for "kl": 0 and KL(clean || all removed)).

    With every edge removed the receivers read the source run's residuals, so under "resample" that run is the
    corrupted run already recorded (the same value to float rounding: tests/integration/test_edges.py) and no
    forward is spent on it; under "mean" (and for "kl") it is run."""
    n = sum(c.rows for c in chunks)
    if metric == "kl":
        return RunValues(0.0, mean_value(model, graph, chunks, np.ones(graph.n_edges, dtype=bool), metric))
    clean = sum(float(c.clean_values.double().sum()) for c in chunks) / n
    if all(c.source_is_run for c in chunks):
        return RunValues(clean, sum(float(c.corrupted_values.double().sum()) for c in chunks) / n)
    corrupted = mean_value(model, graph, chunks, np.ones(graph.n_edges, dtype=bool), metric)
    return RunValues(clean, corrupted)
