"""What every patching method shares: its settings, the metric, a chunk's clean and corrupted runs, z hooks.

Each method runs the pairs in chunks of examples (memory-bounded). Per chunk it runs the clean and
the corrupted prompts once, keeping every layer's hook_z [row, pos, head, d_head]; the *base* run is
the one patched into (the corrupted run when denoising, the clean run when noising) and the
*source* run the one whose activations are patched in. Metrics are taken at the query position,
always against the clean target (minus the corrupted target's logit for "logit_diff", when the
pair has one), and reported on the normalized scale of core/stats/patching.py.

Prefix reuse, as in the ablation engine (core/ablation/engine.py): the base run records what every block
receives (core/ablation/clean_run.py's Recorder), and a patched run replays only the blocks from its lowest
patched layer, then unembeds at the query. Patching one head of layer l leaves layers below l as they were,
so over every head of an L-layer model this halves the work. Checked once per call on the first chunk (a
replay from layer 0 must give the base logits back); where it does not, or the model has no final norm and
unembedding to replay into, every patched run is a full forward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import torch

from core.ablation.clean_run import Recorder
from core.ablation.engine import logits_differ, run_tail
from core.choices import PATCH_METRICS
from core.stats.metrics import query_metrics
from core.errors import HeadLabError
from core.heads import HeadSet
from core.model.hooks import (bridge_hook_names, hook_name, mask_kwargs, model_context_length, model_device, model_dtype,
                              model_shape, model_vocab_size)
from core.model.loading import dtype_name
from core.model.memory import ForwardShape, chunk_size_for, forward_bytes, lean_forward, memory_budget
from core.results import JsonResult, provenance
from core.stats.controls import CONTROL_KINDS
from core.stats.inference import METRICS, canonical_metric
from core.stats.patching import check_direction, check_gap, gap_stats
from core.tasks.counterfactual import PatchPair
from core.tasks.probe_batch import check_seed

GRADIENT_METRICS = ("logit_diff", "target_logit", "loss")  # top-1 / top-5 are steps: no useful gradient
Hook = tuple[str, Callable]
Progress = Callable[[int, int], None]


def canonical_patch_metric(metric: str) -> str:
    """HeadLab's name for a patching metric: "logit_diff" or one of METRICS (reference names accepted)."""
    if metric == "logit_diff":
        return metric
    try:
        return canonical_metric(metric)
    except HeadLabError:
        raise HeadLabError(f"patching metric {metric!r} is unknown; use one of {', '.join(PATCH_METRICS)}.") from None


@dataclass(frozen=True)
class PatchSettings(JsonResult):
    """Everything that determines a patching result besides the model and the pairs.

    direction: "denoise" (clean activations into the corrupted run) or "noise" (corrupted into the
    clean run); metric: "logit_diff" (default) or loss, top1, top5, target_logit; per_position:
    also patch every head at every position on its own; n_controls, controls, control_seed: the
    random head sets a patched group (or a path's senders) is compared with; batch_size: examples
    per forward (None: as many as fit in the free memory); allow_small_gap: keep (flagged) a result
    whose clean-corrupted gap is reversed or under 2 standard errors (core.stats.patching.check_gap).
    """

    direction: str = "denoise"
    metric: str = "logit_diff"
    per_position: bool = False
    n_controls: int = 20
    controls: str = "matched"
    control_seed: int = 123
    batch_size: int | None = None
    allow_small_gap: bool = False

    def __post_init__(self) -> None:
        check_direction(self.direction)
        object.__setattr__(self, "allow_small_gap", bool(self.allow_small_gap))
        object.__setattr__(self, "metric", canonical_patch_metric(self.metric))
        object.__setattr__(self, "per_position", bool(self.per_position))
        object.__setattr__(self, "n_controls", int(self.n_controls))
        object.__setattr__(self, "control_seed", check_seed(self.control_seed, "control_seed"))
        if self.n_controls < 1:
            raise HeadLabError(f"n_controls is {self.n_controls}; ask for at least one control draw.")
        if self.controls not in CONTROL_KINDS:
            raise HeadLabError(f"control kind {self.controls!r} is unknown; use 'matched' or 'any-layer'.")
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", int(self.batch_size))
            if self.batch_size < 1:
                raise HeadLabError(f"batch_size is {self.batch_size}; use at least one example per forward, or None.")


def metric_values(logits_q: torch.Tensor, target: torch.Tensor, other_target: torch.Tensor | None,
                  metric: str) -> torch.Tensor:
    """Per-example metric at the query position: logits_q [row, vocab], target [row] -> [row] float32.

    "logit_diff": the target's logit minus other_target's (the corrupted answer); the target logit
    alone when the pair has no other answer. Any other metric: core.stats.metrics.query_metrics.
    """
    if metric != "logit_diff":
        return query_metrics(logits_q, target)[metric]
    logits_q = logits_q.float()
    value = logits_q.gather(1, target[:, None]).squeeze(1)  # [row]
    if other_target is not None:
        value = value - logits_q.gather(1, other_target[:, None]).squeeze(1)
    return value


@dataclass(frozen=True, eq=False)
class ChunkRuns:
    """One chunk of pairs, run clean and corrupted, seen from one direction.

    base_tokens: [row, pos], the prompts a patched run reads; query, target: [row];
    other_target: [row] or None; clean_values, corrupted_values, base_values: [row] (the metric);
    base_logits: [row, vocab] at the query; base_z, source_z: per layer [row, pos, head, d_head];
    attention_mask: [row, pos] (1 real, 0 padding) or None, the same for both runs; replay: what the base
    run's blocks received, for patched runs that start at their lowest patched layer (None: full forwards).
    """

    base_tokens: torch.Tensor
    query: torch.Tensor
    target: torch.Tensor
    other_target: torch.Tensor | None
    clean_values: torch.Tensor
    corrupted_values: torch.Tensor
    base_values: torch.Tensor
    base_logits: torch.Tensor
    base_z: list[torch.Tensor]
    source_z: list[torch.Tensor]
    attention_mask: torch.Tensor | None = None
    replay: Recorder | None = None  # the base run's block inputs and call arguments (every layer), or None

    @property
    def rows(self) -> int:
        return int(self.query.shape[0])


def checked_gap(clean_values: Sequence[torch.Tensor], corrupted_values: Sequence[torch.Tensor],
                settings: PatchSettings) -> dict:
    """The per-example clean-corrupted gap over every chunk ([row] tensors each), refused or flagged by the gap rule."""
    clean = torch.cat([v.double().cpu() for v in clean_values]).numpy()
    corrupted = torch.cat([v.double().cpu() for v in corrupted_values]).numpy()
    return check_gap(gap_stats(clean, corrupted, settings.metric), settings.metric, settings.allow_small_gap)


def z_recorders(n_layers: int, store: dict[int, torch.Tensor]) -> list[Hook]:
    """Hooks that keep every layer's hook_z [row, pos, head, d_head] (detached) in `store`."""
    def keep(layer: int) -> Callable:
        def hook(z, hook=None):
            store[layer] = z.detach()
            return z
        return hook
    return [(hook_name("z", layer), keep(layer)) for layer in range(n_layers)]


def query_logits(model: Any, tokens: torch.Tensor, query: torch.Tensor, hooks: Sequence[Hook] = (),
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One forward of tokens [row, pos] with `hooks`, unembedding only each row's query position: [row, vocab].

    Every patching and edge metric is read at the query, so the other positions' logits are never made: with
    SmolLM2's 49k-token vocabulary they are a fifth of a forward's arithmetic, with Gemma-3's 262k most of it
    (and the largest tensor of the forward and its backward). Where the model has no unembed input hook the
    full logits are sliced instead. attention_mask [row, pos] (1 real, 0 padding) or None: padded batches from
    probe files (the bridge then also offsets the positions of left-padded rows).
    """
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    kwargs = mask_kwargs(attention_mask)
    if hook_name("unembed_in") not in bridge_hook_names(model):
        logits = model.run_with_hooks(tokens, fwd_hooks=list(hooks), **kwargs)  # [row, pos, vocab]
        return logits[rows, query]

    def query_rows(resid, hook=None):  # [row, pos, d_model] -> [row, 1, d_model]
        return resid[rows, query][:, None, :]

    with lean_forward(model):
        logits = model.run_with_hooks(tokens, fwd_hooks=list(hooks) + [(hook_name("unembed_in"), query_rows)],
                                      **kwargs)  # [row, 1, vocab]
    return logits[:, 0]


@torch.no_grad()
def chunk_runs(model: Any, chunk: PatchPair, direction: str, metric: str, device: torch.device,
               replay: bool = False) -> ChunkRuns:
    """Run a chunk's clean and corrupted prompts, keeping the metric, the base logits and every layer's z
    (replay: also what every block of the base run received, see ChunkRuns)."""
    n_layers = model_shape(model)[0]
    query, target = chunk.clean.query_pos.to(device), chunk.clean.target.to(device)
    other = None if chunk.corrupted_target is None else chunk.corrupted_target.to(device)
    mask = None if chunk.attention_mask is None else chunk.attention_mask.to(device)
    base, source = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    runs, recorder = {}, None
    for side, tokens in (("clean", chunk.clean.tokens), ("corrupted", chunk.corrupted_tokens)):
        store: dict[int, torch.Tensor] = {}
        tokens = tokens.to(device)
        if replay and side == base:
            with Recorder(model, 0, keep=range(n_layers)) as recorder:
                logits_q = query_logits(model, tokens, query, z_recorders(n_layers, store), mask)
        else:
            logits_q = query_logits(model, tokens, query, z_recorders(n_layers, store), mask)
        runs[side] = (tokens, logits_q, metric_values(logits_q, target, other, metric), [store[l] for l in range(n_layers)])
    return ChunkRuns(base_tokens=runs[base][0], query=query, target=target, other_target=other,
                     clean_values=runs["clean"][2], corrupted_values=runs["corrupted"][2], base_values=runs[base][2],
                     base_logits=runs[base][1], base_z=runs[base][3], source_z=runs[source][3], attention_mask=mask,
                     replay=recorder)


def can_replay(model: Any) -> bool:
    """Whether the model has what a replayed run needs: blocks, and the final norm and unembedding after them."""
    return all(hasattr(model, name) for name in ("blocks", "ln_final", "unembed"))


REPLAY_CHECK_ROWS = 8  # rows of the first chunk replayed from layer 0 to check the replay


@torch.no_grad()
def replay_reproduces_base(model: Any, runs: ChunkRuns) -> bool:
    """A replay of every block (layer 0 on, no hook) gives the base run's query logits back, to the engine's
    tolerance; a block that cannot be replayed counts as a failure."""
    probe = min(runs.rows, REPLAY_CHECK_ROWS)
    index = torch.arange(probe, device=runs.query.device)
    try:
        replayed = run_tail(model, runs.replay, 0, runs.replay.resid_before(0)[:probe], runs.rows, index, 1,
                            runs.query[:probe])
    except RuntimeError:
        return False
    return not logits_differ(replayed, runs.base_logits[:probe], model)


def z_patch_hooks(source_z: Sequence[torch.Tensor], heads: HeadSet, position: int | None = None) -> list[Hook]:
    """Hooks that replace the z of `heads` (at every position, or only at `position`) by source_z's.

    source_z: per layer [row, pos, head, d_head], the rows of the run being patched.
    """
    hooks = []
    for layer in heads.layers:
        index = [h for l, h in heads if l == layer]
        source = source_z[layer]

        def hook(z, hook=None, index=index, source=source):
            z = z.clone()  # z: [row, pos, head, d_head]
            if position is None:
                z[:, :, index] = source[:, :, index].to(z.dtype)
            else:
                z[:, position, index] = source[:, position, index].to(z.dtype)
            return z

        hooks.append((hook_name("z", layer), hook))
    return hooks


@torch.no_grad()
def patched_run(model: Any, runs: ChunkRuns, hooks: Sequence[Hook], metric: str,
                start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The base run with `hooks`: (metric values [row], query logits [row, vocab]). start: the lowest layer any
    hook changes; with a recorded base run only the blocks from there on run."""
    if runs.replay is None:
        logits_q = query_logits(model, runs.base_tokens, runs.query, hooks, runs.attention_mask)
    else:
        with model.hooks(fwd_hooks=list(hooks)):
            logits_q = run_tail(model, runs.replay, start, runs.replay.resid_before(start), runs.rows, None, 1,
                                runs.query)
    return metric_values(logits_q, runs.target, runs.other_target, metric), logits_q


def identity_max_diff(model: Any, runs: ChunkRuns) -> float:
    """Largest |logit change| at the query when every head of the base run is patched with its own z (0 expected)."""
    n_layers, n_heads, _ = model_shape(model)
    every = HeadSet(tuple((l, h) for l in range(n_layers) for h in range(n_heads)))
    _, logits_q = patched_run(model, runs, z_patch_hooks(runs.base_z, every), "target_logit")
    return float((logits_q.float() - runs.base_logits.float()).abs().max())


def check_pair_fits(model: Any, pair: PatchPair) -> None:
    """Refuse pairs the model cannot read: token ids outside its vocabulary, prompts past its context."""
    if not isinstance(pair, PatchPair):
        raise HeadLabError("patching needs a PatchPair of clean and corrupted prompts; build one with core.tasks.")
    pair.check_vocab(model_vocab_size(model))
    context = model_context_length(model)
    if context is not None and pair.seq_len > context:
        raise HeadLabError(f"the prompts are {pair.seq_len} tokens long but the model reads at most {context}; "
                           "use shorter prompts (--seq-len).")


def examples_per_chunk(model: Any, pair: PatchPair, settings: PatchSettings, grad: bool = False,
                       replay: bool = False) -> int:
    """Examples per forward: settings.batch_size, else as many as the free memory holds (a power of two).

    Per example: both runs' z at every layer (replay: and the base run's residual entering every layer), plus
    one forward (every layer's activations with grad).
    """
    if settings.batch_size is not None:
        return min(settings.batch_size, pair.n_examples)
    n_layers, n_heads, d_head = model_shape(model)
    shape = ForwardShape.of_model(model)
    kept = 2 * n_layers * pair.seq_len * n_heads * d_head * shape.element_size
    if replay:
        kept += n_layers * pair.seq_len * shape.d_model * shape.element_size
    forward = forward_bytes(shape, pair.seq_len, logit_rows=pair.seq_len)
    per_example = kept + (n_layers + 1) * forward if grad else kept + forward
    return chunk_size_for(per_example, pair.n_examples, memory_budget(model_device(model)), "patching")


def patch_provenance(model: Any, pair: PatchPair, settings: PatchSettings, method: str, **extra: Any) -> dict:
    """Where a patching result comes from: model shape and dtype, the pairs, the settings, package versions."""
    n_layers, n_heads, d_head = model_shape(model)
    return provenance(model=str(getattr(model.cfg, "model_name", "")), n_layers=n_layers, n_heads=n_heads,
                      d_head=d_head, dtype=dtype_name(model_dtype(model)), pairs=dict(pair.spec),
                      n_examples=pair.n_examples, seq_len=pair.seq_len, method=method, settings=settings.to_json(),
                      site="blocks.{l}.attn.hook_z (head output before W_O)", **extra)


def run_chunks(model: Any, pair: PatchPair, settings: PatchSettings, replay: bool = True) -> Iterator[ChunkRuns]:
    """Each chunk of pairs run clean and corrupted (ChunkRuns); the caller's patched runs of that chunk
    happen before the next, all under lean_forward. replay: record the base run for prefix reuse (kept
    only when the model has what it needs and the first chunk's check passes)."""
    device = model_device(model)
    replay = replay and can_replay(model)
    with lean_forward(model):
        for i, chunk in enumerate(pair.chunks(examples_per_chunk(model, pair, settings, replay=replay))):
            runs = chunk_runs(model, chunk, settings.direction, settings.metric, device, replay)
            if replay and i == 0 and not replay_reproduces_base(model, runs):
                replay = False
            yield runs if replay else replace(runs, replay=None)
