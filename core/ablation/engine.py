"""Group ablation of heads and MLPs with matched-random controls, the upper bound and closure statistics.

Step 3 of the recipe [SPC] and the closure test [CVC] (METHODS.md, "Step 3 and closure") both knock
out a set of heads and measure what breaks at the query position, against controls that make a
causal claim honest. This module holds:

- `Ablation` (what to knock out, zero or mean) and the engine `run_conditions`, which computes the
  clean run once and then every condition from the clean residual stream entering the condition's
  lowest ablated layer (prefix reuse), several conditions stacked in one batch when memory allows;
- `ablated_logits_fn` for sequence tasks (greedy exact match under an ablation);
- control sets: matched-random, any-layer random, the upper bound, and how many matched sets exist;
- pure statistics (numpy): z-scores, empirical rank and p-value, paired bootstrap, direction
  checks, the recipe verdict and the closure verdict (paper and reference rules);
- `ablation_study`, which ties these together into a frozen `AblationResult`;
- `bench_ablation`, the engine against the naive one-forward-per-condition loop.

Why prefix reuse is hand-made: TransformerBridge's `forward(..., start_at_layer=k)` gives the right
logits but still executes blocks 0..k-1 internally (their output is discarded), so it saves no time.
The engine instead records, during the clean forward, the arguments each block receives (attention
mask, rotary position embeddings, ...) and replays blocks k..L-1 itself, then the final norm and
unembedding at the query positions only. A self-check against the clean logits guards this; when it
fails the engine falls back to full forwards and says so in its notes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from core.errors import HeadLabError
from core.heads import HeadSet, head_name

# ----------------------------------------------------------------------------------------------
# Metrics and their direction
# ----------------------------------------------------------------------------------------------

METRICS = ("loss", "top1", "top5", "target_logit")
# +1: a larger value is damage (loss); -1: a smaller value is damage (accuracies, target logit).
DAMAGE_SIGN = {"loss": 1.0, "top1": -1.0, "top5": -1.0, "target_logit": -1.0}
# Names used by the reference result files, mapped to HeadLab's.
METRIC_ALIASES = {
    "acc_top1": "top1",
    "acc_top5": "top5",
    "mean_logit_target": "target_logit",
    "mean_logit_B": "target_logit",
    "logit": "target_logit",
}
MODES = ("zero", "mean")
CONTROL_KINDS = ("matched", "any-layer")
STD_FLOOR = 1e-9  # reference: a zero control spread is floored at 1e-9


def canonical_metric(metric: str) -> str:
    """HeadLab's name for a metric (accepts the reference files' names); HeadLabError if unknown."""
    name = METRIC_ALIASES.get(metric, metric)
    if name not in DAMAGE_SIGN:
        raise HeadLabError(
            f"metric {metric!r} is not defined for this task; use one of {', '.join(METRICS)}."
        )
    return name


def is_damaging(metric: str, delta: float) -> bool:
    """Whether a delta from the clean run is damage: loss up; top-1, top-5, target logit down."""
    return bool(DAMAGE_SIGN[canonical_metric(metric)] * float(delta) > 0)


# ----------------------------------------------------------------------------------------------
# What to ablate
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ablation:
    """Heads (zeroed or mean-replaced at hook_z, before W_O, at every position) and MLP outputs.

    mode "zero": replace by 0; "mean": replace by its per-position mean over the probe examples
    (computed once from the clean run).
    """

    heads: HeadSet = field(default_factory=HeadSet)
    mlp_layers: tuple[int, ...] = ()
    mode: str = "zero"
    label: str = ""

    def __post_init__(self) -> None:
        heads = self.heads if isinstance(self.heads, HeadSet) else HeadSet(tuple(self.heads))
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "mlp_layers", tuple(sorted({int(layer) for layer in self.mlp_layers})))
        if self.mode not in MODES:
            raise HeadLabError(f"ablation mode {self.mode!r} is unknown; use 'zero' or 'mean'.")

    @property
    def is_empty(self) -> bool:
        return len(self.heads) == 0 and len(self.mlp_layers) == 0

    @property
    def layers(self) -> tuple[int, ...]:
        """Every layer this ablation touches (heads or MLP)."""
        return tuple(sorted(set(self.heads.layers) | set(self.mlp_layers)))

    def start_layer(self, n_layers: int) -> int:
        """The first block whose computation changes; n_layers when nothing is ablated."""
        return self.layers[0] if self.layers else n_layers

    def validate(self, n_layers: int, n_heads: int) -> "Ablation":
        self.heads.validate(n_layers, n_heads)
        for layer in self.mlp_layers:
            if not 0 <= layer < n_layers:
                raise HeadLabError(
                    f"MLP layer {layer} is outside this model (layers 0 .. {n_layers - 1}); pick an existing layer."
                )
        return self

    def describe(self) -> str:
        parts = [str(self.heads)] if len(self.heads) else []
        parts += [f"MLP{layer}" for layer in self.mlp_layers]
        return (",".join(parts) or "nothing") + f" ({self.mode})"

    def to_json(self) -> dict:
        return {"heads": self.heads.to_json(), "mlp_layers": list(self.mlp_layers), "mode": self.mode, "label": self.label}

    @classmethod
    def from_json(cls, data: dict | str) -> "Ablation":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(HeadSet.from_json(data["heads"]), tuple(data.get("mlp_layers", ())), data.get("mode", "zero"), data.get("label", ""))


# ----------------------------------------------------------------------------------------------
# Per-condition metrics
# ----------------------------------------------------------------------------------------------


def _array(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class ConditionMetrics:
    """Per-example metrics at the query position for one condition (clean or ablated).

    loss, top1, top5, target_logit: [example] float64 (top1/top5 are 0/1).
    """

    label: str
    ablation: Ablation | None
    loss: np.ndarray
    top1: np.ndarray
    top5: np.ndarray
    target_logit: np.ndarray

    def __post_init__(self) -> None:
        for name in METRICS:
            object.__setattr__(self, name, _array(getattr(self, name)))
        if len({getattr(self, name).shape for name in METRICS}) != 1:
            raise HeadLabError("ConditionMetrics arrays must all have one value per example.")

    @property
    def n_examples(self) -> int:
        return int(self.loss.shape[0])

    def values(self, metric: str) -> np.ndarray:
        return getattr(self, canonical_metric(metric))

    def mean(self, metric: str) -> float:
        return float(self.values(metric).mean())

    def delta(self, clean: "ConditionMetrics", metric: str) -> np.ndarray:
        """Per-example delta from the clean run (paired): [example]."""
        return self.values(metric) - clean.values(metric)

    def summary(self) -> dict[str, float]:
        return {name: self.mean(name) for name in METRICS}

    def to_json(self) -> dict:
        out = {"label": self.label, "ablation": None if self.ablation is None else self.ablation.to_json()}
        out.update({name: getattr(self, name).tolist() for name in METRICS})
        return out

    @classmethod
    def from_json(cls, data: dict | str) -> "ConditionMetrics":
        data = json.loads(data) if isinstance(data, str) else data
        ablation = None if data.get("ablation") is None else Ablation.from_json(data["ablation"])
        return cls(data["label"], ablation, *(data[name] for name in METRICS))


def query_metrics(logits_q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics from logits at the query position. logits_q: [row, vocab], target: [row] -> each [row].

    top-k: the target is in the top k when fewer than k tokens score strictly higher (tie-stable).
    """
    logits_q = logits_q.float()
    target_logit = logits_q.gather(1, target[:, None]).squeeze(1)
    loss = torch.logsumexp(logits_q, dim=-1) - target_logit
    higher = (logits_q > target_logit[:, None]).sum(dim=-1)
    return {"loss": loss, "top1": (higher < 1).float(), "top5": (higher < 5).float(), "target_logit": target_logit}


# ----------------------------------------------------------------------------------------------
# Hooks
# ----------------------------------------------------------------------------------------------


def z_hook_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def mlp_hook_name(model: Any, layer: int) -> str:
    """The bridge's hook on one MLP's output (the MLP's contribution to the residual stream)."""
    names = model.hook_dict
    for name in (f"blocks.{layer}.hook_mlp_out", f"blocks.{layer}.mlp.hook_out"):
        if name in names:
            return name
    raise HeadLabError(f"this model exposes no MLP output hook for layer {layer}; MLP ablation needs a TransformerBridge model.")


def _shape(model: Any) -> tuple[int, int]:
    return int(model.cfg.n_layers), int(model.cfg.n_heads)


def _model_device(model: Any) -> torch.device:
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


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
    n_layers, n_heads = _shape(model)
    mode = ablations[0].mode
    hooks: list[tuple[str, Callable]] = []
    touched = sorted({layer for a in ablations for layer in a.layers})
    for layer in touched:
        head_rows = _head_mask_rows(ablations, layer, n_heads, rows_per, device)
        if head_rows is not None:
            name = z_hook_name(layer)
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
        names.update(z_hook_name(layer) for layer in ablation.heads.layers)
        names.update(mlp_hook_name(model, layer) for layer in ablation.mlp_layers)
    return sorted(names)


@torch.no_grad()
def compute_means(model: Any, tokens: torch.Tensor, ablation: Ablation | Iterable[Ablation], batch_size: int | None = None) -> dict[str, torch.Tensor]:
    """Per-position means over the examples of every activation a mean ablation replaces.

    tokens: [example, pos]. Returns {hook name: [pos, head, d_head] or [pos, d_model]} (float32).
    For sequence tasks pass the evaluation set.
    """
    ablations = [ablation] if isinstance(ablation, Ablation) else list(ablation)
    names = sorted({name for a in ablations for name in _mean_hook_names(model, [Ablation(a.heads, a.mlp_layers, "mean")])})
    device = _model_device(model)
    sums: dict[str, torch.Tensor] = {}

    def accumulate(act, hook):
        total = act.detach().float().sum(dim=0)
        sums[hook.name] = total if hook.name not in sums else sums[hook.name] + total
        return act

    size = int(batch_size or tokens.shape[0])
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
    n_layers, n_heads = _shape(model)
    ablation.validate(n_layers, n_heads)
    if ablation.mode == "mean":
        for name in _mean_hook_names(model, [ablation]):
            _need_mean(means, name)
    device = _model_device(model)

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


def _auto_example_batch(model: Any, n: int, seq_len: int, device: torch.device) -> int:
    """Examples per forward so that logits, attention patterns and activations fit in memory."""
    _, n_heads = _shape(model)
    vocab = int(getattr(model.cfg, "d_vocab", 50_000) or 50_000)
    d_model = int(model.cfg.d_model)
    per_example = seq_len * (vocab + 3 * n_heads * seq_len + 16 * d_model) * 4
    budget = _memory_budget(device)
    return int(max(1, min(n, budget // max(per_example, 1))))


def _memory_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.4)
    return 1 << 30


def _auto_chunk(model: Any, rows: int, seq_len: int, n_conditions: int, device: torch.device) -> int:
    """Conditions stacked per forward: 1 on the CPU (a loop), as many as memory allows on a GPU."""
    if device.type != "cuda":
        return 1
    n_layers, n_heads = _shape(model)
    d_model = int(model.cfg.d_model)
    vocab = int(getattr(model.cfg, "d_vocab", 50_000) or 50_000)
    per_condition = rows * seq_len * (3 * n_heads * seq_len + 16 * d_model) * 4 + rows * vocab * 4
    return int(max(1, min(n_conditions, _memory_budget(device) // max(per_condition, 1))))


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
    strategy: "auto" (prefix reuse, self-checked; falls back to full forwards), "prefix", or "full".
    progress(done, total) is called as condition evaluations finish; cancel() -> True stops the run
    (AblationCancelled). Explanations of what was done go to `notes` when a list is given.
    """
    if strategy not in ("auto", "prefix", "full"):
        raise HeadLabError(f"engine strategy {strategy!r} is unknown; use 'auto', 'prefix' or 'full'.")
    notes = [] if notes is None else notes
    n_layers, n_heads = _shape(model)
    conditions = list(conditions)
    for ablation in conditions:
        if not isinstance(ablation, Ablation):
            raise HeadLabError("conditions must be Ablation objects; build them with Ablation(heads=HeadSet(...)).")
        ablation.validate(n_layers, n_heads)
    device = torch.device(device) if device is not None else _model_device(model)
    tokens_all = batch.tokens
    query_all = batch.query_pos.to(device)
    target_all = batch.target.to(device)
    n, seq_len = int(tokens_all.shape[0]), int(tokens_all.shape[1])
    ex_size = int(example_batch_size or _auto_example_batch(model, n, seq_len, device))
    if ex_size < 1:
        raise HeadLabError("example_batch_size must be at least 1.")
    example_chunks = [(s, min(s + ex_size, n)) for s in range(0, n, ex_size)]

    means = None
    if any(a.mode == "mean" for a in conditions):
        means = compute_means(model, tokens_all, [a for a in conditions if a.mode == "mean"], batch_size=ex_size)

    # condition order: grouped by (start layer, mode) so one stacked forward shares both
    order = sorted(range(len(conditions)), key=lambda i: (conditions[i].start_layer(n_layers), conditions[i].mode, i))
    groups: dict[tuple[int, str], list[int]] = {}
    for i in order:
        groups.setdefault((conditions[i].start_layer(n_layers), conditions[i].mode), []).append(i)
    first_start = min([key[0] for key in groups] or [n_layers])

    total = len(example_chunks) * (1 + len(conditions))
    done = 0
    clean_parts: list[dict[str, torch.Tensor]] = []
    cond_parts: list[list[dict[str, torch.Tensor]]] = [[] for _ in conditions]
    use_prefix = strategy != "full"

    def check_cancel() -> None:
        if cancel is not None and cancel():
            raise AblationCancelled("the ablation run was cancelled; start it again to get results.")

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
            if float((replay.float() - clean_q[:probe].float()).abs().max()) > 1e-4 * scale:
                use_prefix = False
                notes.append("prefix reuse did not reproduce the clean logits for this model; every condition ran a full forward instead.")

        for (start, mode), members in groups.items():
            size = int(chunk_size or _auto_chunk(model, rows, seq_len, len(members), device))
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


# ----------------------------------------------------------------------------------------------
# Control sets
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlSets:
    """Control head sets of one kind, with how they were drawn; iterates like a list of HeadSets."""

    kind: str
    sets: tuple[HeadSet, ...]
    seed: int
    n_requested: int
    n_possible: int
    note: str = ""

    def __iter__(self):
        return iter(self.sets)

    def __len__(self) -> int:
        return len(self.sets)

    def __getitem__(self, index):
        return self.sets[index]

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "sets": [s.to_json() for s in self.sets], "seed": self.seed,
            "n_requested": self.n_requested, "n_possible": self.n_possible, "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict | str) -> "ControlSets":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(data["kind"], tuple(HeadSet.from_json(s) for s in data["sets"]), int(data["seed"]),
                   int(data["n_requested"]), int(data["n_possible"]), data.get("note", ""))


def _check_selection(selection: HeadSet, n_layers: int, n_heads: int) -> HeadSet:
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    if len(selection) == 0:
        raise HeadLabError("the selection is empty; pick at least one head to ablate.")
    return selection.validate(n_layers, n_heads)


def count_matched_sets(selection: HeadSet, n_heads: int) -> int:
    """How many distinct matched control sets exist: product over layers of C(n_heads - k_l, k_l)."""
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    total = 1
    for _, k in sorted(selection.count_per_layer().items()):
        total *= math.comb(n_heads - k, k)
    return total


def count_any_layer_sets(selection: HeadSet, n_layers: int, n_heads: int) -> int:
    """How many distinct same-size control sets exist anywhere in the model, disjoint from the selection."""
    k = len(selection)
    return math.comb(n_layers * n_heads - k, k)


def _draws_note(kind: str, n_possible: int, n_draws: int) -> str:
    return (
        f"only {n_possible} distinct {kind} control sets exist for this selection; "
        f"all {n_possible} are used instead of the {n_draws} requested."
    )


def _distinct_draws(draw: Callable[[], tuple], n_draws: int) -> list[tuple]:
    seen: set[tuple] = set()
    out: list[tuple] = []
    while len(out) < n_draws:
        heads = draw()
        key = tuple(sorted(heads))
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def matched_random_controls(selection: HeadSet, n_layers: int, n_heads: int, n_draws: int, seed: int = 123) -> ControlSets:
    """Matched-random controls: the same count in each of the same layers, disjoint, distinct, seeded.

    Each draw takes, layer by layer in order, `RandomState(seed).choice(free heads, k, replace=False)`;
    a repeated set is drawn again. When n_draws >= the number of distinct sets, all are returned.
    """
    selection = _check_selection(selection, n_layers, n_heads)
    counts = selection.count_per_layer()
    for layer, k in sorted(counts.items()):
        if k > n_heads - k:
            raise HeadLabError(
                f"the selection holds {k} of the {n_heads} heads of layer {layer}, more than half, so no disjoint "
                "matched control exists; ask for any-layer controls instead."
            )
    if n_draws < 1:
        raise HeadLabError("ask for at least one control draw.")
    free = {layer: [h for h in range(n_heads) if (layer, h) not in selection] for layer in counts}
    n_possible = count_matched_sets(selection, n_heads)
    if n_draws >= n_possible:
        per_layer = [[tuple((layer, h) for h in combo) for combo in itertools.combinations(free[layer], k)] for layer, k in sorted(counts.items())]
        sets = tuple(HeadSet(tuple(itertools.chain.from_iterable(parts))) for parts in itertools.product(*per_layer))
        note = _draws_note("matched", n_possible, n_draws) if n_draws > n_possible else ""
        return ControlSets("matched", sets, int(seed), int(n_draws), n_possible, note)
    rng = np.random.RandomState(seed)

    def draw() -> tuple:
        heads = []
        for layer, k in sorted(counts.items()):
            heads += [(layer, int(h)) for h in rng.choice(free[layer], size=k, replace=False)]
        return tuple(heads)

    sets = tuple(HeadSet(d) for d in _distinct_draws(draw, n_draws))
    return ControlSets("matched", sets, int(seed), int(n_draws), n_possible)


def any_layer_random_controls(selection: HeadSet, n_layers: int, n_heads: int, n_draws: int, seed: int = 0) -> ControlSets:
    """Same-size random controls from any layer, disjoint from the selection, distinct, seeded.

    Each draw is `RandomState(seed).choice(len(free), k, replace=False)` over the free heads in
    (layer, head) order, as the reference natural-text closure script does.
    """
    selection = _check_selection(selection, n_layers, n_heads)
    if n_draws < 1:
        raise HeadLabError("ask for at least one control draw.")
    free = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in selection]
    k = len(selection)
    if k > len(free):
        raise HeadLabError("the selection holds more than half of the model's heads, so no disjoint control exists; select fewer heads.")
    n_possible = count_any_layer_sets(selection, n_layers, n_heads)
    if n_draws >= n_possible:
        sets = tuple(HeadSet(combo) for combo in itertools.combinations(free, k))
        note = _draws_note("any-layer", n_possible, n_draws) if n_draws > n_possible else ""
        return ControlSets("any-layer", sets, int(seed), int(n_draws), n_possible, note)
    rng = np.random.RandomState(seed)

    def draw() -> tuple:
        return tuple(free[int(i)] for i in rng.choice(len(free), size=k, replace=False))

    sets = tuple(HeadSet(d) for d in _distinct_draws(draw, n_draws))
    return ControlSets("any-layer", sets, int(seed), int(n_draws), n_possible)


def upper_bound(selection: HeadSet, n_heads: int) -> HeadSet:
    """Every head in the selected layers."""
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    if len(selection) == 0:
        raise HeadLabError("the selection is empty; pick at least one head to ablate.")
    return HeadSet(tuple((layer, h) for layer in selection.layers for h in range(n_heads)))


# ----------------------------------------------------------------------------------------------
# Statistics (pure numpy)
# ----------------------------------------------------------------------------------------------


def z_score(candidate_delta: float, control_deltas: Sequence[float]) -> float:
    """(candidate - mean(controls)) / population std(controls), the std floored at 1e-9."""
    controls = np.asarray(control_deltas, dtype=np.float64)
    if controls.size == 0:
        raise HeadLabError("a z-score needs at least one control; run some controls.")
    return float((float(candidate_delta) - controls.mean()) / max(float(controls.std(ddof=0)), STD_FLOOR))


@dataclass(frozen=True)
class RankP:
    """The candidate's rank among candidate + controls, 1 = most damaging (ties count against it)."""

    rank: int
    p: float
    n_controls: int


def empirical_rank_p(candidate: float, controls: Sequence[float], damage_sign: float) -> RankP:
    """p = (1 + #controls at least as damaging as the candidate) / (n + 1).

    damage_sign: +1 when larger is damage (loss), -1 when smaller is damage (top-1, logit).
    """
    values = np.asarray(controls, dtype=np.float64)
    at_least = int(np.sum(damage_sign * values >= damage_sign * float(candidate)))
    return RankP(rank=1 + at_least, p=(1 + at_least) / (values.size + 1), n_controls=int(values.size))


def bootstrap_ci(per_example_deltas: Sequence[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean delta, resampling examples (deltas are paired per example)."""
    deltas = np.asarray(per_example_deltas, dtype=np.float64).reshape(-1)
    if deltas.size == 0:
        raise HeadLabError("a bootstrap interval needs at least one example.")
    if not 0 < level < 1:
        raise HeadLabError("the confidence level must lie strictly between 0 and 1, e.g. 0.95.")
    rng = np.random.default_rng(seed)
    means = np.empty(int(n_boot))
    step = max(1, 2_000_000 // deltas.size)  # bound memory: [step, n] indices at a time
    for start in range(0, int(n_boot), step):
        size = min(step, int(n_boot) - start)
        idx = rng.integers(0, deltas.size, size=(size, deltas.size))
        means[start : start + size] = deltas[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


@dataclass(frozen=True)
class Verdict:
    """A verdict with the rule that produced it and why."""

    label: str
    rule: str
    reasons: tuple[str, ...] = ()
    z: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"label": self.label, "rule": self.rule, "reasons": list(self.reasons), "z": dict(self.z)}

    @classmethod
    def from_json(cls, data: dict | str) -> "Verdict":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(data["label"], data["rule"], tuple(data.get("reasons", ())), dict(data.get("z", {})))


def _canonical_dict(values: dict) -> dict:
    return {canonical_metric(k): v for k, v in values.items()}


def recipe_verdict(
    candidate_deltas: dict[str, float],
    control_deltas: dict[str, Sequence[float]],
    clean_top1: float,
    upper_bound_deltas: dict[str, float] | None,
    min_controls: int = 19,
    min_clean_top1: float = 0.2,
    min_upper_bound_fraction: float = 0.9,
) -> Verdict:
    """The recipe's operational criterion [SPC]: "causal", "not causal" or "inconclusive".

    Causal: the candidate's delta is more damaging than every one of n >= min_controls matched draws
    on both loss and top-1 (p <= 1/(n+1)), the clean top-1 >= min_clean_top1, and the upper bound
    removes >= min_upper_bound_fraction of the clean top-1. Inconclusive when the clean model cannot
    do the task (clean top-1 below the threshold) or too few controls ran to reach that p.
    """
    rule = (
        f"recipe: worse than all >= {min_controls} matched draws on loss and top-1, "
        f"clean top-1 >= {min_clean_top1:g}, upper bound removes >= {min_upper_bound_fraction:.0%} of clean top-1"
    )
    cand = _canonical_dict(candidate_deltas)
    ctrl = _canonical_dict(control_deltas)
    for metric in ("loss", "top1"):
        if metric not in cand or metric not in ctrl:
            raise HeadLabError(f"the recipe verdict needs {metric} deltas for the candidate and the controls; run them.")
    n = min(len(ctrl["loss"]), len(ctrl["top1"]))
    if clean_top1 < min_clean_top1:
        return Verdict("inconclusive", rule, (f"clean top-1 is {clean_top1:.3f} < {min_clean_top1:g}: the clean model cannot do this task.",))
    if n < min_controls:
        return Verdict("inconclusive", rule, (f"only {n} control draws ran; the criterion needs at least {min_controls}.",))
    reasons = []
    ok = True
    for metric in ("loss", "top1"):
        rp = empirical_rank_p(cand[metric], ctrl[metric], DAMAGE_SIGN[metric])
        beats_all = rp.rank == 1
        ok &= beats_all
        reasons.append(
            f"{metric}: candidate delta {cand[metric]:+.4g} is "
            + ("more damaging than every control" if beats_all else f"not more damaging than {rp.rank - 1} of {n} controls")
            + f" (p = {rp.p:.3g})."
        )
    if upper_bound_deltas is None or "top1" not in _canonical_dict(upper_bound_deltas):
        ok = False
        reasons.append("the upper bound (every head in the selected layers) was not run.")
    else:
        removed = -float(_canonical_dict(upper_bound_deltas)["top1"]) / clean_top1
        ub_ok = removed >= min_upper_bound_fraction
        ok &= ub_ok
        reasons.append(f"upper bound removes {removed:.0%} of clean top-1 ({'>=' if ub_ok else '<'} {min_upper_bound_fraction:.0%}).")
    return Verdict("causal" if ok else "not causal", rule, tuple(reasons))


def closure_verdict(
    candidate_deltas: dict[str, float],
    control_deltas: dict[str, Sequence[float]],
    rule: str = "paper",
    headline: str = "logit",
    z_threshold: float = 1.8,
) -> Verdict:
    """The closure test [CVC]: "pass", "fail" or "fails in the wrong direction", with the rule named.

    paper (default): every metric's delta is damaging and the signed z of the headline metric is
    beyond the threshold in the damaging direction (z_logit < -1.8, or z_loss > +1.8 for headline loss).
    reference: every delta damaging and, on at least one metric, the candidate lies outside the
    control range on the damaging side. Either rule: delta loss < 0 with z_loss < -threshold is
    "fails in the wrong direction" (the ablation improves the model far beyond the controls).
    """
    if rule not in ("paper", "reference"):
        raise HeadLabError(f"closure rule {rule!r} is unknown; use 'paper' or 'reference'.")
    if headline not in ("logit", "loss"):
        raise HeadLabError(f"closure headline {headline!r} is unknown; use 'logit' or 'loss'.")
    cand = _canonical_dict(candidate_deltas)
    ctrl = _canonical_dict(control_deltas)
    metrics = [m for m in METRICS if m in cand]
    if not metrics:
        raise HeadLabError("the closure verdict needs at least one metric delta; run the candidate.")
    for metric in metrics:
        if metric not in ctrl:
            raise HeadLabError(f"the closure verdict needs control deltas for {metric}; run the controls.")
    head_metric = "target_logit" if headline == "logit" else "loss"
    if head_metric not in cand:
        raise HeadLabError(f"the {headline} headline needs the {head_metric} delta, which this task does not define; pick another headline.")
    z = {metric: z_score(cand[metric], ctrl[metric]) for metric in metrics}
    if rule == "paper":
        rule_text = f"paper: every delta damaging and z_{head_metric} {'<' if headline == 'logit' else '>'} {'-' if headline == 'logit' else '+'}{z_threshold:g}"
    else:
        rule_text = "reference: every delta damaging and outside the control range (damaging side) on at least one metric"
    reasons = []
    if "loss" in cand and cand["loss"] < 0 and z["loss"] < -z_threshold:
        reasons.append(
            f"ablating the candidate lowers the loss by {-cand['loss']:.4g} (z_loss {z['loss']:+.2f} < -{z_threshold:g}): "
            "it improves the model beyond every control, the opposite of closure."
        )
        return Verdict("fails in the wrong direction", rule_text, tuple(reasons), z)
    damaging = {metric: is_damaging(metric, cand[metric]) for metric in metrics}
    for metric in metrics:
        if not damaging[metric]:
            reasons.append(f"{metric} delta {cand[metric]:+.4g} is not damage.")
    if rule == "paper":
        sign = DAMAGE_SIGN[head_metric]
        strong = sign * z[head_metric] > z_threshold
        if not strong:
            reasons.append(f"z_{head_metric} = {z[head_metric]:+.2f} is not beyond {sign * z_threshold:+g}.")
    else:
        outside = []
        for metric in metrics:
            sign = DAMAGE_SIGN[metric]
            if sign * cand[metric] > max(sign * np.asarray(ctrl[metric], dtype=np.float64)):
                outside.append(metric)
        strong = bool(outside)
        if not strong:
            reasons.append("no metric's delta lies outside the control range on the damaging side.")
    passed = all(damaging.values()) and strong
    if passed:
        reasons.append("every delta is damage and the candidate stands out from its controls.")
    return Verdict("pass" if passed else "fail", rule_text, tuple(reasons), z)


# ----------------------------------------------------------------------------------------------
# The study: candidate + controls + upper bound -> AblationResult
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class AblationResult:
    """Clean run, candidate, controls and upper bound, per-metric statistics and verdicts."""

    selection: HeadSet
    mode: str
    clean: ConditionMetrics
    candidate: ConditionMetrics
    controls: tuple[ConditionMetrics, ...]
    control_sets: ControlSets
    upper_bound: ConditionMetrics | None
    stats: dict
    verdicts: dict
    notes: tuple[str, ...]
    provenance: dict

    def to_json(self) -> dict:
        return {
            "selection": self.selection.to_json(), "mode": self.mode,
            "clean": self.clean.to_json(), "candidate": self.candidate.to_json(),
            "controls": [c.to_json() for c in self.controls], "control_sets": self.control_sets.to_json(),
            "upper_bound": None if self.upper_bound is None else self.upper_bound.to_json(),
            "stats": self.stats, "verdicts": {k: v.to_json() for k, v in self.verdicts.items()},
            "notes": list(self.notes), "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict | str) -> "AblationResult":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(
            HeadSet.from_json(data["selection"]), data["mode"],
            ConditionMetrics.from_json(data["clean"]), ConditionMetrics.from_json(data["candidate"]),
            tuple(ConditionMetrics.from_json(c) for c in data["controls"]), ControlSets.from_json(data["control_sets"]),
            None if data["upper_bound"] is None else ConditionMetrics.from_json(data["upper_bound"]),
            data["stats"], {k: Verdict.from_json(v) for k, v in data["verdicts"].items()},
            tuple(data["notes"]), data["provenance"],
        )


def condition_stats(
    clean: ConditionMetrics, candidate: ConditionMetrics, controls: Sequence[ConditionMetrics],
    upper: ConditionMetrics | None = None, metrics: Sequence[str] = METRICS, n_boot: int = 2000, boot_seed: int = 0,
) -> dict[str, dict]:
    """Per metric: candidate delta and its bootstrap CI, control deltas, z, rank and p, damage flags."""
    out = {}
    for metric in (canonical_metric(m) for m in metrics):
        cand_delta = candidate.delta(clean, metric)
        cand_mean = float(cand_delta.mean())
        ctrl = [float(c.delta(clean, metric).mean()) for c in controls]
        entry = {
            "clean": clean.mean(metric), "candidate_delta": cand_mean,
            "candidate_ci": list(bootstrap_ci(cand_delta, n_boot=n_boot, seed=boot_seed)),
            "control_deltas": ctrl, "damaging": is_damaging(metric, cand_mean),
            "upper_bound_delta": None if upper is None else float(upper.delta(clean, metric).mean()),
        }
        if ctrl:
            arr = np.asarray(ctrl)
            rp = empirical_rank_p(cand_mean, ctrl, DAMAGE_SIGN[metric])
            entry.update(control_mean=float(arr.mean()), control_std=float(arr.std(ddof=0)),
                         z=z_score(cand_mean, ctrl), rank=rp.rank, p=rp.p)
        out[metric] = entry
    return out


def ablation_study(
    model: Any,
    batch: Any,
    selection: HeadSet,
    n_controls: int = 20,
    controls: str = "matched",
    mode: str = "zero",
    seed: int = 123,
    metrics: Sequence[str] = METRICS,
    include_upper_bound: bool = True,
    n_boot: int = 2000,
    boot_seed: int = 0,
    chunk_size: int | None = None,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    recipe_thresholds: dict | None = None,
    z_threshold: float = 1.8,
) -> AblationResult:
    """Ablate `selection`, its controls ("matched" or "any-layer") and the upper bound; compute stats and verdicts."""
    if controls not in CONTROL_KINDS:
        raise HeadLabError(f"control kind {controls!r} is unknown; use 'matched' or 'any-layer'.")
    if mode not in MODES:
        raise HeadLabError(f"ablation mode {mode!r} is unknown; use 'zero' or 'mean'.")
    metrics = [canonical_metric(m) for m in metrics]
    n_layers, n_heads = _shape(model)
    selection = _check_selection(selection, n_layers, n_heads)
    if controls == "matched":
        sets = matched_random_controls(selection, n_layers, n_heads, n_controls, seed)
    else:
        sets = any_layer_random_controls(selection, n_layers, n_heads, n_controls, seed)
    conditions = [Ablation(selection, (), mode, "candidate")]
    conditions += [Ablation(s, (), mode, f"control {i}") for i, s in enumerate(sets)]
    if include_upper_bound:
        conditions.append(Ablation(upper_bound(selection, n_heads), (), mode, "upper bound"))
    notes: list[str] = [sets.note] if sets.note else []
    clean, results = run_conditions(model, batch, conditions, chunk_size=chunk_size, device=device,
                                    progress=progress, cancel=cancel, notes=notes)
    candidate = results[0]
    control_results = tuple(results[1 : 1 + len(sets)])
    upper = results[-1] if include_upper_bound else None
    stats = condition_stats(clean, candidate, control_results, upper, metrics, n_boot, boot_seed)
    cand_d = {m: stats[m]["candidate_delta"] for m in metrics}
    ctrl_d = {m: stats[m]["control_deltas"] for m in metrics}
    verdicts: dict[str, Verdict] = {}
    if controls == "matched" and "loss" in metrics and "top1" in metrics:
        ub = None if upper is None else {"top1": stats["top1"]["upper_bound_delta"]}
        verdicts["recipe"] = recipe_verdict(cand_d, ctrl_d, clean.mean("top1"), ub, **(recipe_thresholds or {}))
    headline = "logit" if "target_logit" in metrics else "loss"
    if headline == "loss" and "loss" not in metrics:
        notes.append("no closure verdict: it needs the loss or the target logit.")
    else:
        verdicts["closure_paper"] = closure_verdict(cand_d, ctrl_d, "paper", headline, z_threshold)
        verdicts["closure_reference"] = closure_verdict(cand_d, ctrl_d, "reference", headline, z_threshold)
    if mode == "mean":
        notes.append("mean ablation: each head output replaced by its per-position mean over the probe examples (clean run).")
    provenance = {
        "model": str(getattr(model.cfg, "model_name", "")), "n_layers": n_layers, "n_heads": n_heads,
        "batch": dict(getattr(batch, "spec", {}) or {}), "n_examples": int(batch.tokens.shape[0]),
        "seq_len": int(batch.tokens.shape[1]), "controls": controls, "control_seed": int(seed),
        "mode": mode, "bootstrap": {"n_boot": int(n_boot), "seed": int(boot_seed), "level": 0.95},
        "ablation_site": "blocks.{l}.attn.hook_z (head output before W_O), every position",
        "torch": torch.__version__,
    }
    return AblationResult(selection, mode, clean, candidate, control_results, sets, upper, stats, verdicts, tuple(notes), provenance)


# ----------------------------------------------------------------------------------------------
# Benchmark: the engine against one full run_with_hooks forward per condition
# ----------------------------------------------------------------------------------------------


def _bench_model(seed: int):
    """An 8-layer, 8-head GPT-NeoX (d_model 256) with random weights, booted as a TransformerBridge."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    from transformer_lens.model_bridge import TransformerBridge

    config = GPTNeoXConfig(
        vocab_size=260, hidden_size=256, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1024,
        max_position_embeddings=512, rotary_pct=1.0, use_parallel_residual=True, tie_word_embeddings=False,
        bos_token_id=256, eos_token_id=258, pad_token_id=257,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = GPTNeoXForCausalLM(config).eval()
    with tempfile.TemporaryDirectory(prefix="headlab-bench-") as folder:
        hf.save_pretrained(folder)
        model = TransformerBridge.boot_transformers(folder, hf_model=hf, device="cpu")
    model.eval()
    return model


class _BenchBatch:
    def __init__(self, tokens, query_pos, target):
        self.tokens, self.query_pos, self.target, self.spec = tokens, query_pos, target, {"task": "bench"}


@torch.no_grad()
def _naive_conditions(model: Any, batch: Any, conditions: Sequence[Ablation]) -> list[dict[str, np.ndarray]]:
    """The naive way: one full forward per condition (clean first), zeroing hook_z slices."""
    rows = torch.arange(batch.tokens.shape[0])
    out = []
    for ablation in [Ablation()] + list(conditions):
        hooks = []
        for layer in ablation.heads.layers:
            heads = [h for l, h in ablation.heads if l == layer]

            def zero(z, hook=None, heads=heads):
                z = z.clone()
                z[:, :, heads, :] = 0
                return z

            hooks.append((z_hook_name(layer), zero))
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        metrics = query_metrics(logits[rows, batch.query_pos], batch.target)
        out.append({k: v.double().numpy() for k, v in metrics.items()})
    return out


def bench_ablation(n_examples: int = 64, seq_len: int = 64, n_controls: int = 20, repeats: int = 3, seed: int = 0,
                   chunk_size: int | None = None) -> dict:
    """Time the engine and the naive loop on the same conditions; report medians, ratio and max difference."""
    torch.set_num_threads(2)
    model = _bench_model(seed)
    n_layers, n_heads = _shape(model)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (n_examples, seq_len), generator=gen)
    query_pos = torch.full((n_examples,), seq_len - 1, dtype=torch.long)
    target = torch.randint(0, 256, (n_examples,), generator=gen)
    batch = _BenchBatch(tokens, query_pos, target)
    selection = HeadSet(((4, 1), (4, 5), (6, 2)))
    sets = matched_random_controls(selection, n_layers, n_heads, n_controls, seed=123)
    conditions = [Ablation(selection, label="candidate")] + [Ablation(s, label=f"control {i}") for i, s in enumerate(sets)]
    conditions.append(Ablation(upper_bound(selection, n_heads), label="upper bound"))
    naive_times, engine_times = [], []
    naive_cpu, engine_cpu = [], []  # process CPU time: robust when other processes share the cores
    max_diff = 0.0
    notes: list[str] = []
    for r in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        naive = _naive_conditions(model, batch, conditions)
        naive_times.append(time.perf_counter() - t0)
        naive_cpu.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        clean, results = run_conditions(model, batch, conditions, chunk_size=chunk_size, notes=notes if r == 0 else None)
        engine_times.append(time.perf_counter() - t0)
        engine_cpu.append(time.process_time() - c0)
        for ref, got in zip(naive, [clean] + results):
            for metric in METRICS:
                max_diff = max(max_diff, float(np.abs(ref[metric] - got.values(metric)).max()))
    naive_s, engine_s = statistics.median(naive_times), statistics.median(engine_times)
    return {
        "naive_s": naive_s, "engine_s": engine_s, "speedup": naive_s / engine_s, "max_metric_diff": max_diff,
        "speedup_per_repeat": [n / e for n, e in zip(naive_times, engine_times)],
        "naive_cpu_s": statistics.median(naive_cpu), "engine_cpu_s": statistics.median(engine_cpu),
        "speedup_cpu": statistics.median(naive_cpu) / statistics.median(engine_cpu),
        "n_examples": n_examples, "seq_len": seq_len, "n_conditions": len(conditions) + 1,
        "n_controls": len(sets), "selection": str(selection), "lowest_ablated_layer": 4,
        "model": "GPT-NeoX 8 layers x 8 heads, d_model 256, vocab 260, random weights",
        "repeats": repeats, "naive_times_s": naive_times, "engine_times_s": engine_times,
        "chunk_size": chunk_size or 1, "device": "cpu", "threads": torch.get_num_threads(), "notes": notes,
    }


def add_bench_ablation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-examples", type=int, default=64, help="probe examples N (default 64)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random controls (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and batch")
    parser.add_argument("--chunk-size", type=int, default=None, help="conditions stacked per forward (default 1 on CPU)")


def cli_bench_ablation(args: argparse.Namespace) -> dict:
    result = bench_ablation(args.n_examples, args.seq_len, args.controls, args.repeats, args.seed, args.chunk_size)
    print(
        f"ablation bench (N={result['n_examples']}, T={result['seq_len']}, {result['n_conditions']} conditions incl. clean, "
        f"selection {result['selection']}): naive {result['naive_s']:.3f}s, engine {result['engine_s']:.3f}s, "
        f"speedup {result['speedup']:.2f}x (CPU time: {result['speedup_cpu']:.2f}x), "
        f"max metric diff {result['max_metric_diff']:.2e}"
    )
    return result
