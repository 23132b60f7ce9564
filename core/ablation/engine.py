"""The ablation engine: hooks that knock out heads and MLPs, and prefix reuse over many conditions.

Step 3 of the recipe [SPC] and the closure test [CVC] (METHODS.md, "Step 3 and closure") both knock
out a set of heads and measure what breaks at the query position. `run_conditions` computes the
clean run once and then every condition from the clean residual stream entering the condition's
lowest ablated layer (prefix reuse), several conditions stacked in one batch on a GPU when memory
allows (examples per batch and conditions per stack follow core/model/memory.py's estimate of the
free memory; every forward runs under its lean_forward); `ablated_logits_fn` serves sequence
tasks (greedy exact match under an ablation). What to ablate and what is measured are in spec.py;
studies over conditions (controls, statistics) in study.py.

Why prefix reuse is hand-made: TransformerBridge's `forward(..., start_at_layer=k)` gives the right
logits but still executes blocks 0..k-1 internally (their output is discarded), so it saves no time.
The engine instead records, during the clean forward, the arguments each block receives (attention
mask, rotary position embeddings, ...) and replays blocks k..L-1 itself, then the final norm and
unembedding at the query positions only. A self-check against the clean logits guards this; when it
fails the engine falls back to full forwards and says so in its notes.

Precision: a bfloat16/float16 model runs its blocks in that dtype, but the metrics (query_metrics)
and the means of mean ablation are computed in float32; the self-check's tolerance is a few units
of the dtype's precision, since a replay may round differently from the full forward.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch

from core.ablation.spec import Ablation, ConditionMetrics, query_metrics
from core.errors import HeadLabError
from core.model.hooks import hook_name, mlp_hook_name, model_device, model_dtype, model_shape
from core.model.memory import ForwardShape, chunk_size_for, forward_bytes, lean_forward, memory_budget
from core.stats.inference import METRICS

# ----------------------------------------------------------------------------------------------
# Hooks
# ----------------------------------------------------------------------------------------------


def _head_mask_rows(ablations: Sequence[Ablation], layer: int, n_heads: int, rows_per: int, device) -> torch.Tensor | None:
    """Bool [condition*rows_per, head]: which heads of `layer` each row ablates; None if none."""
    mask = torch.zeros(len(ablations), n_heads, dtype=torch.bool)
    for i, ablation in enumerate(ablations):
        for l, h in ablation.heads:
            if l == layer:
                mask[i, h] = True
    if not bool(mask.any()):
        return None
    return mask.repeat_interleave(rows_per, dim=0).to(device)


def _ablation_hooks(
    model: Any, ablations: Sequence[Ablation], rows_per: int, means: dict[str, torch.Tensor] | None, device
) -> list[tuple[str, Callable]]:
    """Forward hooks that apply `ablations` to a batch stacked condition-major: row = condition*rows_per + example.

    All ablations in one call share a mode. Means ([pos, ...]) are sliced to the current length.
    """
    n_layers, n_heads, _ = model_shape(model)
    mode = ablations[0].mode
    hooks: list[tuple[str, Callable]] = []
    touched = sorted({layer for a in ablations for layer in a.layers})
    for layer in touched:
        head_rows = _head_mask_rows(ablations, layer, n_heads, rows_per, device)
        if head_rows is not None:
            name = hook_name("z", layer)
            mean = None if mode == "zero" else _need_mean(means, name)

            def z_hook(z, hook=None, rows=head_rows, mean=mean):
                # z: [row, pos, head, d_head]; rows: [row, head]
                replacement = torch.zeros((), dtype=z.dtype, device=z.device) if mean is None else mean[None, : z.shape[1]].to(z.dtype)
                return torch.where(rows[:, None, :, None], replacement, z)

            hooks.append((name, z_hook))
        mlp_rows = torch.tensor([layer in a.mlp_layers for a in ablations], dtype=torch.bool)
        if bool(mlp_rows.any()):
            name = mlp_hook_name(model, layer)
            mean = None if mode == "zero" else _need_mean(means, name)
            rows = mlp_rows.repeat_interleave(rows_per).to(device)

            def mlp_hook(out, hook=None, rows=rows, mean=mean):
                # out: [row, pos, d_model]; rows: [row]
                replacement = torch.zeros((), dtype=out.dtype, device=out.device) if mean is None else mean[None, : out.shape[1]].to(out.dtype)
                return torch.where(rows[:, None, None], replacement, out)

            hooks.append((name, mlp_hook))
    return hooks


def _need_mean(means: dict[str, torch.Tensor] | None, name: str) -> torch.Tensor:
    if means is None or name not in means:
        raise HeadLabError(f"mean ablation needs the clean mean of {name}; compute it with compute_means(model, tokens, ablation).")
    return means[name]


def _mean_hook_names(model: Any, ablations: Iterable[Ablation]) -> list[str]:
    names: set[str] = set()
    for ablation in ablations:
        if ablation.mode != "mean":
            continue
        names.update(hook_name("z", layer) for layer in ablation.heads.layers)
        names.update(mlp_hook_name(model, layer) for layer in ablation.mlp_layers)
    return sorted(names)


@torch.no_grad()
def compute_means(model: Any, tokens: torch.Tensor, ablation: Ablation | Iterable[Ablation], batch_size: int | None = None) -> dict[str, torch.Tensor]:
    """Per-position means over the examples of every activation a mean ablation replaces.

    tokens: [example, pos]. Returns {hook name: [pos, head, d_head] or [pos, d_model]} (float32).
    For sequence tasks pass the evaluation set. batch_size: examples per forward (default: as many
    as fit in the free memory).
    """
    ablations = [ablation] if isinstance(ablation, Ablation) else list(ablation)
    names = sorted({name for a in ablations for name in _mean_hook_names(model, [Ablation(a.heads, a.mlp_layers, "mean")])})
    device = model_device(model)
    sums: dict[str, torch.Tensor] = {}

    def accumulate(act, hook):
        total = act.detach().float().sum(dim=0)
        sums[hook.name] = total if hook.name not in sums else sums[hook.name] + total
        return act

    size = int(batch_size or _auto_example_batch(model, int(tokens.shape[0]), int(tokens.shape[1]), 0, device))
    with lean_forward(model):
        for start in range(0, tokens.shape[0], size):
            chunk = tokens[start : start + size].to(device)
            model.run_with_hooks(chunk, fwd_hooks=[(name, _renamed(accumulate, name)) for name in names])
    return {name: sums[name] / tokens.shape[0] for name in names}


def _renamed(fn: Callable, name: str) -> Callable:
    """A hook that sees `hook.name == name` even when the bridge resolves an alias to another point."""

    class _Named:
        pass

    tag = _Named()
    tag.name = name

    def hook(act, hook=None):
        return fn(act, tag)

    return hook


def ablated_logits_fn(model: Any, ablation: Ablation, means: dict[str, torch.Tensor] | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function tokens [batch, pos] -> logits [batch, pos, vocab] with `ablation` applied.

    For sequence tasks (greedy decoding): mean ablation needs `means` from `compute_means` over the
    evaluation set; positions beyond the means' length are refused.
    """
    n_layers, n_heads, _ = model_shape(model)
    ablation.validate(n_layers, n_heads)
    if ablation.mode == "mean":
        for name in _mean_hook_names(model, [ablation]):
            _need_mean(means, name)
    device = model_device(model)

    @torch.no_grad()
    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.to(device)
        if ablation.is_empty:
            return model(tokens)
        if means is not None and ablation.mode == "mean":
            longest = min(int(means[name].shape[0]) for name in _mean_hook_names(model, [ablation]))
            if tokens.shape[1] > longest:
                raise HeadLabError(
                    f"mean ablation has means for {longest} positions but the input has {tokens.shape[1]}; "
                    "compute the means on sequences at least as long."
                )
        hooks = _ablation_hooks(model, [ablation], tokens.shape[0], means, device)
        return model.run_with_hooks(tokens, fwd_hooks=hooks)

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
    model: Any, ablation: Ablation, evaluate: Callable[[Callable[[torch.Tensor], torch.Tensor]], float], means: dict[str, torch.Tensor] | None = None
) -> float:
    """Run a sequence-task evaluator (takes a logits_fn, returns an accuracy) with `ablation` applied."""
    return float(evaluate(ablated_logits_fn(model, ablation, means)))


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


class AblationCancelled(HeadLabError):
    """Raised when the app's cancel() callback asks the engine to stop."""


def _block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _clean_block_kwargs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block's recorded call arguments without the residual and without any KV cache."""
    rest = tuple(args[1:])
    clean = {}
    for key, value in kwargs.items():
        if key == "hidden_states":
            continue
        if key in ("use_cache", "output_attentions"):
            value = False
        elif type(value).__name__.endswith("Cache") or key in ("layer_past", "past_key_value", "past_key_values"):
            value = None
        clean[key] = value
    return rest, clean


def _fit_batch(value: Any, rows: int, index: torch.Tensor | None, repeat: int) -> Any:
    """Adapt a recorded tensor argument with batch dim `rows` to `index` rows repeated `repeat` times.

    Tensors whose rows are all equal (a causal mask without padding) collapse to one broadcasting row.
    """
    if isinstance(value, tuple):
        return tuple(_fit_batch(v, rows, index, repeat) for v in value)
    if isinstance(value, list):
        return [_fit_batch(v, rows, index, repeat) for v in value]
    # batch-shaped arguments (masks, position ids) are at least 2-D; 1-D ones (cache_position) are per position
    if not isinstance(value, torch.Tensor) or value.ndim < 2 or value.shape[0] != rows or rows == 1:
        return value
    if bool((value == value[:1]).all()):
        return value[:1]
    picked = value if index is None else value[index]
    return picked.repeat(repeat, *([1] * (picked.ndim - 1)))


class _Recorder:
    """Records, in the clean forward, what every block from `first` on receives; and the final residual."""

    def __init__(self, model: Any, first: int, keep: Iterable[int] = ()):
        self.model = model
        self.first = first
        self.keep = set(keep)  # layers whose input residual is kept (the conditions' start layers)
        self.inputs: dict[int, torch.Tensor] = {}
        self.calls: dict[int, tuple[tuple, dict]] = {}
        self.final: torch.Tensor | None = None
        self.handles = []

    def __enter__(self) -> "_Recorder":
        for layer, block in enumerate(self.model.blocks):
            if layer >= self.first:
                self.handles.append(block.register_forward_pre_hook(self._pre(layer), with_kwargs=True))
        self.handles.append(self.model.ln_final.register_forward_pre_hook(self._final, with_kwargs=True))
        return self

    def _pre(self, layer: int):
        def hook(module, args, kwargs):
            if layer in self.keep:
                self.inputs[layer] = _block_input(args, kwargs).detach()
            self.calls[layer] = _clean_block_kwargs(args, kwargs)

        return hook

    def _final(self, module, args, kwargs):
        self.final = _block_input(args, kwargs).detach()

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def _run_tail(model: Any, recorder: _Recorder, start: int, resid: torch.Tensor, rows: int, index, repeat: int, query_pos: torch.Tensor) -> torch.Tensor:
    """Blocks start..L-1 from `resid` [row, pos, d_model], then final norm + unembed at query_pos [row] -> [row, vocab]."""
    x = resid
    n_layers = len(model.blocks)
    for layer in range(start, n_layers):
        args, kwargs = recorder.calls[layer]
        args = _fit_batch(args, rows, index, repeat)
        kwargs = {key: _fit_batch(value, rows, index, repeat) for key, value in kwargs.items()}
        out = model.blocks[layer](x, *args, **kwargs)
        x = out[0] if isinstance(out, tuple) else out
    picked = x[torch.arange(x.shape[0], device=x.device), query_pos][:, None, :]  # [row, 1, d_model]
    logits = model.unembed(model.ln_final(picked))
    return logits[:, 0, :]


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


@torch.no_grad()
def run_conditions(
    model: Any,
    batch: Any,
    conditions: Sequence[Ablation],
    chunk_size: int | None = None,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    example_batch_size: int | None = None,
    strategy: str = "auto",
    notes: list[str] | None = None,
) -> tuple[ConditionMetrics, list[ConditionMetrics]]:
    """The clean run and every condition's per-example metrics at the query position.

    batch: has tokens [example, pos], query_pos [example], target [example] (a ProbeBatch).
    Returns (clean, [one ConditionMetrics per condition, in order]).
    chunk_size: conditions stacked into one forward (default: 1 on the CPU, memory-sized on CUDA).
    example_batch_size: examples per forward (default: as many as fit in the free memory).
    strategy: "auto" (prefix reuse, self-checked; falls back to full forwards), "prefix", or "full".
    progress(done, total) is called as condition evaluations finish; cancel() -> True stops the run
    (AblationCancelled). Explanations of what was done go to `notes` when a list is given.
    """
    if strategy not in ("auto", "prefix", "full"):
        raise HeadLabError(f"engine strategy {strategy!r} is unknown; use 'auto', 'prefix' or 'full'.")
    notes = [] if notes is None else notes
    n_layers, n_heads, _ = model_shape(model)
    conditions = list(conditions)
    for ablation in conditions:
        if not isinstance(ablation, Ablation):
            raise HeadLabError("conditions must be Ablation objects; build them with Ablation(heads=HeadSet(...)).")
        ablation.validate(n_layers, n_heads)
    device = torch.device(device) if device is not None else model_device(model)
    tokens_all = batch.tokens
    query_all = batch.query_pos.to(device)
    target_all = batch.target.to(device)
    n, seq_len = int(tokens_all.shape[0]), int(tokens_all.shape[1])

    # condition order: grouped by (start layer, mode) so one stacked forward shares both
    order = sorted(range(len(conditions)), key=lambda i: (conditions[i].start_layer(n_layers), conditions[i].mode, i))
    groups: dict[tuple[int, str], list[int]] = {}
    for i in order:
        groups.setdefault((conditions[i].start_layer(n_layers), conditions[i].mode), []).append(i)
    first_start = min([key[0] for key in groups] or [n_layers])
    n_kept = 1 + (len({start for start, _ in groups if start < n_layers}) if strategy != "full" else 0)
    ex_size = int(example_batch_size or _auto_example_batch(model, n, seq_len, n_kept, device))
    if ex_size < 1:
        raise HeadLabError("example_batch_size must be at least 1.")
    example_chunks = [(s, min(s + ex_size, n)) for s in range(0, n, ex_size)]

    total = len(example_chunks) * (1 + len(conditions))
    done = 0
    clean_parts: list[dict[str, torch.Tensor]] = []
    cond_parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in conditions]
    use_prefix = strategy != "full"

    def check_cancel() -> None:
        if cancel is not None and cancel():
            raise AblationCancelled("the ablation run was cancelled; start it again to get results.")

    with lean_forward(model):  # one layer's activations alive at a time: what the example batch assumes
        means = None
        if any(a.mode == "mean" for a in conditions):
            means = compute_means(model, tokens_all, [a for a in conditions if a.mode == "mean"], batch_size=ex_size)

        for c_index, (lo, hi) in enumerate(example_chunks):
            check_cancel()
            tokens = tokens_all[lo:hi].to(device)
            query, target = query_all[lo:hi], target_all[lo:hi]
            rows = hi - lo
            with _Recorder(model, first_start if use_prefix else n_layers, [key[0] for key in groups]) as rec:
                logits = model(tokens)  # [row, pos, vocab]
            clean_q = logits[torch.arange(rows, device=device), query]  # [row, vocab]
            del logits
            clean_parts.append(query_metrics(clean_q, target))
            done += 1
            if progress is not None:
                progress(done, total)

            if use_prefix and c_index == 0 and strategy == "auto" and conditions:
                # Self-check: replaying the recorded blocks must give the clean logits back.
                probe = min(rows, 8)
                index = torch.arange(probe, device=device)
                start = first_start
                resid = rec.inputs[start][:probe] if start < n_layers else rec.final[:probe]
                replay = _run_tail(model, rec, start, resid.clone(), rows, index, 1, query[:probe])
                scale = 1.0 + float(clean_q[:probe].abs().max())
                if float((replay.float() - clean_q[:probe].float()).abs().max()) > _replay_tolerance(model) * scale:
                    use_prefix = False
                    notes.append("prefix reuse did not reproduce the clean logits for this model; every condition ran a full forward instead.")

            for (start, mode), members in groups.items():
                size = int(chunk_size or _auto_chunk(model, rows, seq_len, len(members), not use_prefix, device))
                for k in range(0, len(members), size):
                    check_cancel()
                    chunk = [conditions[i] for i in members[k : k + size]]
                    reps = len(chunk)
                    hooks = _ablation_hooks(model, chunk, rows, means, device) if not all(a.is_empty for a in chunk) else []
                    query_rep = query.repeat(reps)
                    if use_prefix:
                        resid = rec.inputs[start] if start < n_layers else rec.final
                        resid = resid.repeat(reps, 1, 1)  # [cond*row, pos, d_model]
                        with model.hooks(fwd_hooks=hooks):
                            out_q = _run_tail(model, rec, start, resid, rows, None, reps, query_rep)
                    else:
                        out = model.run_with_hooks(tokens.repeat(reps, 1), fwd_hooks=hooks)
                        out_q = out[torch.arange(rows * reps, device=device), query_rep]
                        del out
                    metrics = query_metrics(out_q, target.repeat(reps))
                    for j, i in enumerate(members[k : k + size]):
                        cond_parts[i].append({name: value[j * rows : (j + 1) * rows] for name, value in metrics.items()})
                    done += reps
                    if progress is not None:
                        progress(done, total)
            del rec

    if use_prefix and conditions:
        notes.append(
            "prefix reuse: the clean residual stream entering each condition's lowest ablated layer was reused; "
            "only the blocks from there on were recomputed."
        )

    def gather(parts: list[dict[str, torch.Tensor]], label: str, ablation: Ablation | None) -> ConditionMetrics:
        arrays = {name: torch.cat([p[name] for p in parts]).double().cpu().numpy() for name in METRICS}
        return ConditionMetrics(label, ablation, **arrays)

    clean = gather(clean_parts, "clean", None)
    results = [gather(cond_parts[i], a.label or a.describe(), a) for i, a in enumerate(conditions)]
    return clean, results
