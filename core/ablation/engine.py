"""The ablation engine: hooks that knock out heads and MLPs, and prefix reuse over many conditions.

Step 3 of the recipe [SPC] and the closure test [CVC] (METHODS.md, "Step 3 and closure") both knock
out a set of heads and measure what breaks at the query position. `run_conditions` computes the
clean run once and then every condition from the clean residual stream entering the condition's
lowest ablated layer (prefix reuse), several conditions stacked in one batch on a GPU when memory
allows (examples per batch and conditions per stack follow core/model/memory.py's estimate of the
free memory; every forward runs under its lean_forward); `ablated_logits_fn` serves sequence
tasks (greedy exact match under an ablation). `stream_conditions` hands out each condition as it
finishes (the app draws them); spec.py says what is ablated and measured, replacements.py what an
ablated activation is replaced by (and the hooks that write it); study.py runs studies.

Why prefix reuse is hand-made: TransformerBridge's `forward(..., start_at_layer=k)` gives the right
logits but still executes blocks 0..k-1 internally (their output is discarded), so it saves no time.
The engine instead records, during the clean forward, the arguments each block receives (attention
mask, rotary position embeddings, ...) and replays blocks k..L-1 itself, then the final norm and
unembedding at the query positions only. A self-check against the clean logits guards this; when it
fails the engine falls back to full forwards and says so in its notes.

Three more cuts, each self-checked (they are what takes a Pythia-160m recipe past 2x a naive loop):
- the last block's MLP runs at the query rows only (nothing after it reads another position; the
  MLP is two thirds of a block's work). Skipped when a condition ablates that MLP;
- in a GPT-NeoX/Pythia model the last block's attention too (`_neox_block_at_query`: keys and values
  at every position, the query, softmax and W_O at the query only): on the quick zoo's 3-layer model
  it halves a live study. Skipped when a condition ablates that block's heads (their hook must run);
- in a parallel-residual block (GPT-NeoX/Pythia, GPT-J: out = x + attn(x) + mlp(x)), ablating heads
  only changes attn(x) by sum_h (replacement_h - z_h) W_O[h]; the condition's residual after its
  lowest ablated layer is the clean one plus that change, so that layer is not replayed at all.
  Every probe mode writes at hook_z from clean statistics, so both cuts hold for each of them.

Between studies on the same model and probe (the lab's clicks, a Ray worker's calls) the clean run is
kept (`CleanRuns`, recorded at every layer; clean_run.py), so a study is its conditions alone.

Precision: a bfloat16/float16 model runs its blocks in that dtype, but the metrics (query_metrics)
and the replacement statistics (means, ...) are computed in float32; the self-check's tolerance is a few units
of the dtype's precision, since a replay may round differently from the full forward.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, GPTNeoXLayer, rotate_half

from core.ablation.clean_run import CleanRuns, Recorder, adds_attention_to_residual, fit_batch, fits_clean_run, replay_block
from core.ablation.replacements import Replacements, ablation_hooks, compute_replacements, replaced_hook_names
from core.ablation.spec import PROBE_MODES, SEQUENCE_MODES, Ablation, ConditionMetrics
from core.stats.metrics import query_metrics
from core.errors import HeadLabError
from core.model.hooks import head_output_weights, hook_name, mask_kwargs, model_device, model_dtype, model_shape
from core.model.memory import ForwardShape, chunk_size_for, forward_bytes, lean_forward, memory_budget
from core.stats.inference import METRICS

# ----------------------------------------------------------------------------------------------
# Sequence tasks
# ----------------------------------------------------------------------------------------------


def ablated_logits_fn(model: Any, ablation: Ablation,
                      replacements: Replacements | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function tokens [batch, pos] -> logits [batch, pos, vocab] with `ablation` applied.

    For sequence tasks (greedy decoding, whose rows are no fixed probe examples): modes SEQUENCE_MODES;
    all but zero need `replacements` from `compute_replacements` over the evaluation set; a
    mean-per-position ablation refuses positions beyond the statistics' length.
    """
    n_layers, n_heads, _ = model_shape(model)
    ablation.validate(n_layers, n_heads)
    if ablation.mode not in SEQUENCE_MODES:
        raise HeadLabError(f"{ablation.mode} ablation needs fixed probe examples; on a sequence task use one of "
                           f"{', '.join(SEQUENCE_MODES)}.")
    stats = replacements or Replacements()
    names = replaced_hook_names(model, ablation)
    for name in names:
        stats.value(ablation, name, (0, 0), 0)  # missing statistics: refused now, not mid-decoding
    device = model_device(model)

    @torch.no_grad()
    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(device)
        if ablation.is_empty:
            return model(tokens)
        for name in names:
            stats.value(ablation, name, (0, 0), int(tokens.shape[1]))  # positions the statistics cover
        return model.run_with_hooks(tokens, fwd_hooks=ablation_hooks(model, [ablation], (0, int(tokens.shape[0])), stats))

    return logits_fn


@torch.no_grad()
def greedy_exact_match(logits_fn: Callable[[torch.Tensor], torch.Tensor], prompts: torch.Tensor, answers: torch.Tensor) -> float:
    """Share of sequences whose greedy continuation equals the answer exactly.

    prompts: [batch, prompt_len], answers: [batch, answer_len]; decodes answer_len tokens.
    """
    tokens = prompts.clone()
    for _ in range(answers.shape[1]):
        logits = logits_fn(tokens)  # [batch, pos, vocab]
        next_token = logits[:, -1, :].argmax(dim=-1).to(tokens.device)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
    decoded = tokens[:, prompts.shape[1] :]
    return float((decoded == answers.to(decoded.device)).all(dim=1).float().mean())


def exact_match_under_ablation(
    model: Any, ablation: Ablation, evaluate: Callable[[Callable[[torch.Tensor], torch.Tensor]], float],
    replacements: Replacements | None = None,
) -> float:
    """Run a sequence-task evaluator (takes a logits_fn, returns an accuracy) with `ablation` applied."""
    return float(evaluate(ablated_logits_fn(model, ablation, replacements)))


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


class AblationCancelled(HeadLabError):
    """Raised when the app's cancel() callback asks the engine to stop."""


def run_tail(model: Any, recorder: Recorder, start: int, resid: torch.Tensor, rows: int, index, repeat: int,
              query_pos: torch.Tensor, last_mlp_at_query: bool = False,
              last_attention_at_query: bool = False) -> torch.Tensor:
    """Blocks start..L-1 from `resid` [row, pos, d_model], then final norm + unembed at query_pos [row] -> [row, vocab].

    last_mlp_at_query: the last block's MLP sees only the query rows [row, 1, d_model]; its output
    broadcasts over positions in the residual add, which is right at the query rows (all that is read).
    last_attention_at_query: a GPT-NeoX last block runs at the query rows altogether (_neox_block_at_query:
    keys and values at every position, the rest at the query); only when no hook reads that block.
    """
    x = resid
    n_layers = len(model.blocks)
    rows_index = torch.arange(x.shape[0], device=x.device)
    query_block = (last_attention_at_query and last_mlp_at_query and start < n_layers
                   and _neox_layer(model, n_layers - 1) is not None)
    handle = None
    if last_mlp_at_query and start < n_layers and not query_block:

        def query_rows_only(module, args, kwargs):
            hidden = args[0] if args else kwargs.pop("hidden_states")
            picked = hidden[rows_index, query_pos][:, None, :]  # [row, 1, d_model]
            return (picked,) + tuple(args[1:]), kwargs

        handle = model.blocks[n_layers - 1].mlp.register_forward_pre_hook(query_rows_only, with_kwargs=True)
    try:
        for layer in range(start, n_layers):
            if query_block and layer == n_layers - 1:
                kwargs = {key: fit_batch(value, rows, index, repeat) for key, value in recorder.calls[layer][1].items()}
                picked = _neox_block_at_query(_neox_layer(model, layer), x, kwargs, rows_index, query_pos)
                return model.unembed(model.ln_final(picked))[:, 0, :]
            x = replay_block(model, recorder, layer, x, rows, index, repeat)
    finally:
        if handle is not None:
            handle.remove()
    picked = x[rows_index, query_pos][:, None, :]  # [row, 1, d_model]
    logits = model.unembed(model.ln_final(picked))
    return logits[:, 0, :]


def _neox_layer(model: Any, layer: int) -> GPTNeoXLayer | None:
    """Block `layer`'s Hugging Face GPTNeoXLayer when it is one (with its GPTNeoXAttention inside the bridge), else None."""
    hf_layer = getattr(model.blocks[layer], "original_component", None)
    if not isinstance(hf_layer, GPTNeoXLayer):
        return None
    return hf_layer if isinstance(getattr(hf_layer.attention, "original_component", None), GPTNeoXAttention) else None


def _hf(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face module inside a TransformerBridge component (the module itself when it is one).
    Called directly it skips the bridge's hook plumbing, which nothing reads in a block run at the query."""
    return getattr(module, "original_component", module)


def _neox_block_at_query(layer: GPTNeoXLayer, x: torch.Tensor, kwargs: dict, rows_index: torch.Tensor,
                         query_pos: torch.Tensor) -> torch.Tensor:
    """A GPT-NeoX block's output at each row's query position only: x [row, pos, d_model] -> [row, 1, d_model].

    Why: nothing after the last block reads another position, and its attention over every query
    position (scores and softmax over [row, head, pos, pos]) is most of a condition's time on a small
    model. Keys and values are projected at every position (not the queries); the query, attention
    weights, W_O and the MLP only at the query. Instead of rotating every key, the one query is rotated
    back to each key position: q . R_p k = (R_p^T q) . k, with R_p^T q = q cos_p - rotate_half(q) sin_p
    (the two halves of a rotary feature share an angle). The rest is transformers' eager GPTNeoXAttention
    (softmax in float32) and GPTNeoXLayer; the engine's self-check compares it with the clean logits.
    kwargs: the block's recorded call (position_embeddings (cos, sin), attention_mask [row or 1, 1, pos, pos]).
    """
    attention = layer.attention.original_component  # GPTNeoXAttention: query_key_value, dense
    n_rows, n_pos, d_model = x.shape
    d_head = attention.head_size
    projection = _hf(attention.query_key_value)  # nn.Linear: out features [head, (q, k, v), d_head]
    weight = projection.weight.view(-1, 3, d_head, d_model)
    bias = None if projection.bias is None else projection.bias.view(-1, 3, d_head)
    n_heads = weight.shape[0]
    h = _hf(layer.input_layernorm)(x)  # [row, pos, d_model]
    kv = torch.nn.functional.linear(h, weight[:, 1:].reshape(-1, d_model), None if bias is None else bias[:, 1:].reshape(-1))
    key, value = kv.view(n_rows, n_pos, n_heads, 2, d_head).permute(3, 0, 2, 1, 4)  # [row, head, pos, d_head] each
    h_query = h[rows_index, query_pos]  # [row, d_model]
    query = torch.nn.functional.linear(h_query, weight[:, 0].reshape(-1, d_model), None if bias is None else bias[:, 0].reshape(-1))
    query = query.view(n_rows, n_heads, 1, d_head)
    cos, sin = kwargs["position_embeddings"]  # [row or 1, pos, rotary_dim] each
    cos_rows = rows_index if cos.shape[0] > 1 else torch.zeros_like(rows_index)
    query = _rotated(query, cos[cos_rows, query_pos][:, None, None], sin[cos_rows, query_pos][:, None, None])
    rotary_dim = cos.shape[-1]
    q_rot = query[..., :rotary_dim]  # [row, head, 1, rotary_dim]
    back = q_rot * cos[:, None] - rotate_half(q_rot) * sin[:, None]  # [row, head, pos, rotary_dim]
    scores = (back * key[..., :rotary_dim]).sum(-1, keepdim=True).transpose(2, 3)  # [row, head, 1, pos]
    if rotary_dim < d_head:  # the features without rotary
        scores = scores + torch.matmul(query[..., rotary_dim:], key[..., rotary_dim:].transpose(2, 3))
    scores = scores * attention.scaling + _query_mask(kwargs.get("attention_mask"), rows_index, query_pos, n_pos,
                                                      scores.dtype)
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    z = torch.matmul(weights, value)  # [row, head, 1, d_head]
    attn_out = _hf(attention.dense)(z.transpose(1, 2).reshape(n_rows, 1, -1))  # [row, 1, d_model]
    x_query = x[rows_index, query_pos][:, None, :]
    post_norm = _hf(layer.post_attention_layernorm)
    if layer.use_parallel_residual:
        return layer.mlp(post_norm(x_query)) + attn_out + x_query
    attn_out = attn_out + x_query
    return layer.mlp(post_norm(attn_out)) + attn_out


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on one tensor: x [row, head, pos, d_head] with cos and sin
    broadcasting to its first rotary_dim features (the rest pass unrotated). One tensor so the
    query is rotated at its query position only."""
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


def _query_mask(mask: torch.Tensor | None, rows_index: torch.Tensor, query_pos: torch.Tensor, n_pos: int,
                dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of each row's query row [row, 1, 1, pos]: the recorded mask's row
    (float: added as is; bool: True = may attend), or causal when none was recorded."""
    if mask is not None and mask.dtype != torch.bool:
        rows = mask[rows_index if mask.shape[0] > 1 else torch.zeros_like(rows_index), 0, query_pos]  # [row, pos]
        return rows[:, None, None, :].to(dtype)
    if mask is None:
        allowed = torch.arange(n_pos, device=query_pos.device)[None, :] <= query_pos[:, None]
    else:
        allowed = mask[rows_index if mask.shape[0] > 1 else torch.zeros_like(rows_index), 0, query_pos]
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=query_pos.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return blocked[:, None, None, :]


def _head_change(weights: torch.Tensor, z: torch.Tensor, chunk: Sequence[Ablation], layer: int, rows: tuple[int, int],
                 replacements: Replacements | None) -> torch.Tensor:
    """What ablating `chunk`'s heads at `layer` adds to that block's output: [cond*row, pos, d_model].

    weights: W_O of the layer [head, d_head, d_model]; z: the clean hook_z of probe examples
    rows[0]..rows[1]-1 [row, pos, head, d_head]. Each condition's ablated heads change by
    (replacement - z), the replacement any hook_z mode writes (not reference-slice, which writes after W_O);
    only those heads are multiplied through W_O (a study ablates a few heads of a layer).
    """
    n_rows, n_pos = z.shape[:2]
    stats = replacements or Replacements()
    replacement = None
    changes = []
    for ablation in chunk:
        heads = [head for l, head in ablation.heads if l == layer]
        if not heads:
            changes.append(torch.zeros(n_rows, n_pos, weights.shape[-1], dtype=z.dtype, device=z.device))
            continue
        if replacement is None:  # one mode and seed per chunk: the same statistics for every condition
            replacement = stats.value(ablation, hook_name("z", layer), rows, n_pos).to(z.device, z.dtype)
        index = torch.tensor(heads, device=z.device)
        diff = torch.broadcast_to(replacement, z.shape).index_select(2, index) - z.index_select(2, index)
        changes.append((diff.reshape(n_rows * n_pos, -1) @ weights.index_select(0, index).to(z.dtype).reshape(-1, weights.shape[-1]))
                       .view(n_rows, n_pos, -1))  # [row, pos, d_model]
    return changes[0] if len(changes) == 1 else torch.cat(changes)


def _replay_tolerance(model: Any) -> float:
    """Relative tolerance of the prefix-reuse self-check: 1e-4 in float32, 8 units of rounding in half precision."""
    return max(1e-4, 8 * torch.finfo(model_dtype(model)).eps)


def _example_bytes(model: Any, seq_len: int, n_kept: int) -> int:
    """Bytes one example adds to an example batch (core.model.memory.forward_bytes): the clean forward
    with its full logits [pos, vocab], the residuals kept for prefix reuse (n_kept x [pos, d_model]),
    and a condition's forward (query logits only). The last is counted on top because glibc does not
    always hand what the clean forward freed to the condition forwards that follow (measured on CPU:
    up to 1.6x the clean forward's own peak)."""
    shape = ForwardShape.of_model(model)
    clean = forward_bytes(shape, seq_len, logit_rows=seq_len)
    return clean + n_kept * seq_len * shape.d_model * shape.element_size + forward_bytes(shape, seq_len, logit_rows=1)


def _auto_example_batch(model: Any, n: int, seq_len: int, n_kept: int, device: torch.device) -> int:
    """Examples per clean forward that fit in the device's free memory (a power of two in [1, n])."""
    per_example = _example_bytes(model, seq_len, n_kept)
    return chunk_size_for(per_example, n, memory_budget(device), "the ablation engine's clean forward")


def _auto_chunk(model: Any, rows: int, seq_len: int, n_conditions: int, full_logits: bool, device: torch.device) -> int:
    """Conditions stacked per forward: 1 on the CPU (a loop is not slower there), as many as memory allows on a GPU.

    Asked after the clean forward, so the free memory already excludes the residuals it keeps.
    full_logits: whether a condition runs a full forward (no prefix reuse) and unembeds every position.
    """
    if device.type != "cuda":
        return 1
    per_condition = rows * forward_bytes(ForwardShape.of_model(model), seq_len, seq_len if full_logits else 1)
    return chunk_size_for(per_condition, n_conditions, memory_budget(device), "stacked ablation conditions")


def _condition_logits(model: Any, rec: Recorder, chunk: Sequence[Ablation], start: int, rows: int, query: torch.Tensor,
                      replacements: Replacements | None, n_rows: int | None = None,
                      start_weights: torch.Tensor | None = None, last_mlp_at_query: bool = False) -> torch.Tensor:
    """One stacked forward of `chunk` from the clean run `rec` recorded on `rows` examples: logits at
    the query positions [cond*n_rows, vocab], condition-major (n_rows: the first n_rows examples only).

    start_weights: W_O of layer `start` [head, d_head, d_model] to skip replaying that layer
    (parallel-residual blocks: the clean output plus _head_change); last_mlp_at_query: see run_tail.
    """
    n_layers = len(model.blocks)
    n_rows = rows if n_rows is None else n_rows
    index = None if n_rows == rows else torch.arange(n_rows, device=query.device)
    reps = len(chunk)
    examples = (rec.lo, rec.lo + n_rows)
    hooks = ablation_hooks(model, chunk, examples, replacements) if not all(a.is_empty for a in chunk) else []
    first = start + 1 if start_weights is not None else start
    resid = rec.resid_before(first)[:n_rows]
    resid = resid if reps == 1 else resid.repeat(reps, 1, 1)  # [cond*row, pos, d_model]
    if start_weights is not None:
        resid = resid + _head_change(start_weights, rec.z[start][:n_rows], chunk, start, examples, replacements)
    last_mlp_at_query = last_mlp_at_query and not any(n_layers - 1 in a.mlp_layers for a in chunk)
    last_attention_at_query = not any(n_layers - 1 in a.heads.layers for a in chunk)  # no hook reads that attention
    with model.hooks(fwd_hooks=hooks):
        return run_tail(model, rec, first, resid, rows, index, reps, query[:n_rows].repeat(reps), last_mlp_at_query,
                         last_attention_at_query)


def logits_differ(got: torch.Tensor, want: torch.Tensor, model: Any) -> bool:
    """Whether two logit tensors differ by more than the replay tolerance (relative to want's scale)."""
    scale = 1.0 + float(want.abs().max())
    return float((got.float() - want.float()).abs().max()) > _replay_tolerance(model) * scale


def _gather(parts: list[dict[str, torch.Tensor]], label: str, ablation: Ablation | None) -> ConditionMetrics:
    """One condition's metrics from its example chunks' parts ({metric: [row]} each)."""
    arrays = {name: torch.cat([p[name] for p in parts]).double().cpu().numpy() for name in METRICS}
    return ConditionMetrics(label, ablation, **arrays)


def run_conditions(model: Any, batch: Any, conditions: Sequence[Ablation], **options: Any) -> tuple[ConditionMetrics, list[ConditionMetrics]]:
    """(clean, [metrics of each condition, in order]): `stream_conditions` collected (options: its keyword arguments)."""
    streamed = dict(stream_conditions(model, batch, conditions, **options))  # {None: clean, i: condition i}
    return streamed.pop(None), [streamed[i] for i in range(len(conditions))]


@torch.no_grad()
def stream_conditions(
    model: Any,
    batch: Any,
    conditions: Sequence[Ablation],
    chunk_size: int | None = None,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    strategy: str = "auto",
    notes: list[str] | None = None,
    clean_runs: CleanRuns | None = None,
) -> Iterator[tuple[int | None, ConditionMetrics]]:
    """The clean run and every condition's per-example metrics at the query position, as each finishes.

    batch: has tokens [example, pos], query_pos [example], target [example] and attention_mask (a
    ProbeBatch; a padded one's mask goes into every forward and its statistics average real tokens only).
    Yields (None, clean) first, then (i, metrics of conditions[i]) once per condition; condition 0
    comes first (a study's candidate: what a reader waits for), the others in the engine's order.
    chunk_size: conditions stacked into one forward (default: 1 on the CPU, memory-sized on CUDA).
    Examples per forward: as many as fit in the free memory (_auto_example_batch).
    strategy: "auto" (prefix reuse, self-checked; falls back to full forwards), "prefix", or "full".
    progress(done, total) is called as condition evaluations finish; cancel() -> True stops the run
    (AblationCancelled). Explanations of what was done go to `notes` when a list is given.
    clean_runs: where the clean run is kept between calls on the same model and batch (see CleanRuns).
    """
    if strategy not in ("auto", "prefix", "full"):
        raise HeadLabError(f"engine strategy {strategy!r} is unknown; use 'auto', 'prefix' or 'full'.")
    notes = [] if notes is None else notes
    n_layers, n_heads, _ = model_shape(model)
    conditions = list(conditions)
    for ablation in conditions:
        if not isinstance(ablation, Ablation):
            raise HeadLabError("conditions must be Ablation objects; build them with Ablation(heads=HeadSet(...)).")
        if ablation.mode not in PROBE_MODES:
            raise HeadLabError(f"{ablation.mode} ablation is for the [HHG] sequence tasks only (not a head ablation); "
                               f"on a probe use one of {', '.join(PROBE_MODES)}.")
        ablation.validate(n_layers, n_heads)
    device = torch.device(device) if device is not None else model_device(model)
    tokens_all = batch.tokens
    mask_all = getattr(batch, "attention_mask", None)  # [example, pos] or None
    query_all = batch.query_pos.to(device)
    target_all = batch.target.to(device)
    n, seq_len = int(tokens_all.shape[0]), int(tokens_all.shape[1])

    # condition order: grouped by (start layer, mode, seed) so one stacked forward shares them; condition 0's
    # group first (the order of groups changes no number: each group's stacks are the same either way)
    group_of = [(a.start_layer(n_layers), a.mode, a.seed) for a in conditions]
    order = sorted(range(len(conditions)), key=lambda i: (group_of[i] != group_of[0], group_of[i], i))
    groups: dict[tuple[int, str, int], list[int]] = {}
    for i in order:
        groups.setdefault(group_of[i], []).append(i)
    first_start = min([key[0] for key in groups] or [n_layers])
    starts = sorted({key[0] for key in groups if key[0] < n_layers}) if strategy != "full" else []
    # parallel-residual start layers are skipped: their clean output and z are kept instead
    shortcut_starts = [start for start in starts if adds_attention_to_residual(model, start)]
    n_kept = 1 + len(starts) + 2 * len(shortcut_starts)
    ex_size = _auto_example_batch(model, n, seq_len, n_kept, device)
    recorded_first, recorded_starts, recorded_z = first_start, starts, shortcut_starts  # what the clean forward records
    if clean_runs is not None and strategy != "full" and ex_size >= n and fits_clean_run(model, n, seq_len):
        recorded_first, recorded_starts = 0, list(range(n_layers))  # every layer: the kept run serves any conditions
        recorded_z = [start for start in recorded_starts if adds_attention_to_residual(model, start)]
    else:
        clean_runs = None
    example_chunks = [(s, min(s + ex_size, n)) for s in range(0, n, ex_size)]

    total = len(example_chunks) * (1 + len(conditions))
    done = 0
    clean_parts: list[dict[str, torch.Tensor]] = []
    cond_parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in conditions]
    use_prefix = strategy != "full"
    last_mlp_at_query = use_prefix
    output_weights = head_output_weights(model) if shortcut_starts else None  # [layer, head, d_head, d_model]

    def check_cancel() -> None:
        if cancel is not None and cancel():
            raise AblationCancelled("the ablation run was cancelled; start it again to get results.")

    with lean_forward(model):  # one layer's activations alive at a time: what the example batch assumes
        stats = compute_replacements(model, tokens_all, conditions, batch_size=ex_size, attention_mask=mask_all)

        for c_index, (lo, hi) in enumerate(example_chunks):
            check_cancel()
            tokens = tokens_all[lo:hi].to(device)
            mask = None if mask_all is None else mask_all[lo:hi].to(device)
            query, target = query_all[lo:hi], target_all[lo:hi]
            rows = hi - lo
            kept = None if clean_runs is None else clean_runs.find(model, batch)
            if kept is not None:
                rec, clean_q = kept
            else:
                keep = recorded_starts + [start + 1 for start in recorded_z]
                recorder = Recorder(model, recorded_first if use_prefix else n_layers, keep, recorded_z if use_prefix else (), lo)
                with recorder as rec:
                    logits = model(tokens, **mask_kwargs(mask))  # [row, pos, vocab]; the blocks' recorded kwargs carry it
                clean_q = logits[torch.arange(rows, device=device), query]  # [row, vocab]
                del logits
                if clean_runs is not None:
                    clean_runs.hold(model, batch, rec, clean_q)
            clean_parts.append(query_metrics(clean_q, target))
            last_examples = c_index == len(example_chunks) - 1  # where the clean run and every condition finish
            if last_examples:
                yield None, _gather(clean_parts, "clean", None)
            done += 1
            if progress is not None:
                progress(done, total)

            if use_prefix and c_index == 0 and strategy == "auto" and conditions:
                # Self-checks on a few rows: the replay gives the clean logits back (with, else without,
                # the last MLP at the query rows); skipping a start layer gives what replaying it gives.
                probe = min(rows, 8)
                clean_chunk = [Ablation()]

                def replay_differs(at_query: bool) -> bool:
                    try:
                        replay = _condition_logits(model, rec, clean_chunk, first_start, rows, query, stats, probe,
                                                   last_mlp_at_query=at_query)
                    except RuntimeError:  # a block that cannot take the query rows alone
                        return True
                    return logits_differ(replay, clean_q[:probe], model)

                if replay_differs(True):
                    last_mlp_at_query = False
                    if replay_differs(False):
                        use_prefix = False
                        notes.append("prefix reuse did not reproduce the clean logits for this model; every condition ran a full forward instead.")
                heads_only = [(start, conditions[i]) for (start, _, _), members in groups.items() if start in shortcut_starts
                              for i in members if start not in conditions[i].mlp_layers]
                if use_prefix and heads_only:
                    start, ablation = heads_only[0]
                    skipped = _condition_logits(model, rec, [ablation], start, rows, query, stats, 2, output_weights[start])
                    if logits_differ(skipped, _condition_logits(model, rec, [ablation], start, rows, query, stats, 2), model):
                        shortcut_starts = []
                        notes.append("skipping the lowest ablated layer did not match replaying it; every start layer was replayed.")

            for (start, _, _), members in groups.items():
                size = int(chunk_size or _auto_chunk(model, rows, seq_len, len(members), not use_prefix, device))
                for k in range(0, len(members), size):
                    check_cancel()
                    chunk = [conditions[i] for i in members[k : k + size]]
                    reps = len(chunk)
                    if use_prefix:
                        skip_start = start in shortcut_starts and not any(start in a.mlp_layers for a in chunk)
                        out_q = _condition_logits(model, rec, chunk, start, rows, query, stats,
                                                  start_weights=output_weights[start] if skip_start else None,
                                                  last_mlp_at_query=last_mlp_at_query)
                    else:
                        hooks = ablation_hooks(model, chunk, (lo, hi), stats) if not all(a.is_empty for a in chunk) else []
                        query_rep = query.repeat(reps)
                        masks = mask_kwargs(None if mask is None else mask.repeat(reps, 1))
                        out = model.run_with_hooks(tokens.repeat(reps, 1), fwd_hooks=hooks, **masks)
                        out_q = out[torch.arange(rows * reps, device=device), query_rep]
                        del out
                    metrics = query_metrics(out_q, target.repeat(reps))
                    for j, i in enumerate(members[k : k + size]):
                        cond_parts[i].append({name: value[j * rows : (j + 1) * rows] for name, value in metrics.items()})
                    done += reps
                    if progress is not None:
                        progress(done, total)
                    for i in members[k : k + size] if last_examples else ():
                        yield i, _gather(cond_parts[i], conditions[i].label or conditions[i].describe(), conditions[i])
            del rec

    if use_prefix and conditions:
        notes.append(
            "prefix reuse: the clean residual stream entering each condition's lowest ablated layer was reused; "
            "only the blocks from there on were recomputed."
        )
        if last_mlp_at_query:
            notes.append("the last block's MLP ran at the query positions only"
                         + (" (a GPT-NeoX block's attention too, where the condition left its heads alone)."
                            if _neox_layer(model, n_layers - 1) is not None else "."))
        if shortcut_starts:
            notes.append("parallel-residual start layers were not replayed: the clean block output plus the ablated "
                         "heads' change through W_O was used.")
