"""A study over conditions: a selection, its random controls and the upper bound, with statistics and verdicts.

`ablation_study(model, batch, selection, settings)` draws the controls (core/stats/controls.py), runs
every condition through the engine, and turns the per-example metrics into deltas, z, rank, p,
bootstrap intervals and the recipe and closure verdicts (core/stats/inference.py). `AblationSettings`
holds every method parameter in one frozen, hashable value (the pages use it as a cache key).
The same study fanned out over workers that hold the model is in workers.py; both are made of
`study_conditions` and `assemble_study`, and both hand out each condition as it finishes
(`on_condition`, the candidate first), which `preview_result` turns into a partial result to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from core.ablation.clean_run import CleanRuns
from core.ablation.engine import run_conditions, stream_conditions
from core.ablation.spec import MODE_HELP, PROBE_MODES, Ablation, ConditionMetrics
from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.model.hooks import model_dtype, model_shape
from core.model.loading import dtype_name
from core.results import JsonResult
from core.stats.controls import (CONTROL_KINDS, ControlSets, check_selection, any_layer_random_controls,
                                 matched_random_controls, upper_bound)
from core.stats.inference import (DAMAGE_SIGN, METRICS, MIN_RELIABLE_Z_CONTROLS, Verdict, below_minimum, bootstrap_ci,
                                  canonical_metric, closure_verdict, empirical_rank_p, is_damaging, recipe_verdict,
                                  z_score)

CANDIDATE, UPPER_BOUND = "candidate", "upper bound"  # condition labels (a control's: "control {i}")
# on_condition(index, metrics, clean): index into study_conditions' list (0 the candidate, then the
# controls, then the upper bound); clean: the clean run the deltas are taken from.
ConditionFn = Callable[[int, ConditionMetrics, ConditionMetrics], None]


@dataclass(frozen=True)
class AblationSettings(JsonResult):
    """Everything that determines an AblationResult besides the model, the batch and the selection.

    n_controls: random control draws; controls: "matched" (same count in each selected layer) or
    "any-layer" (same size anywhere); mode: one of spec.PROBE_MODES; seed: the control draws' seed and
    resample ablation's derangement;
    metrics: measured metrics (reference names accepted, stored canonical); n_boot, boot_seed: the
    paired bootstrap; chunk_size: conditions stacked per forward (None: 1 on CPU, memory-sized on
    CUDA); z_threshold: the closure rule's |z|; min_*: the recipe verdict's thresholds [SPC].
    """

    n_controls: int = 20
    controls: str = "matched"
    mode: str = "zero"
    seed: int = 123
    metrics: tuple[str, ...] = METRICS
    include_upper_bound: bool = True
    n_boot: int = 2000
    boot_seed: int = 0
    chunk_size: int | None = None
    z_threshold: float = 1.8
    min_controls: int = 19
    min_clean_top1: float = 0.2
    min_upper_bound_fraction: float = 0.9

    def __post_init__(self) -> None:
        for name in ("n_controls", "seed", "n_boot", "boot_seed", "min_controls"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("z_threshold", "min_clean_top1", "min_upper_bound_fraction"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "include_upper_bound", bool(self.include_upper_bound))
        if self.controls not in CONTROL_KINDS:
            raise HeadLabError(f"control kind {self.controls!r} is unknown; use 'matched' or 'any-layer'.")
        if self.mode not in PROBE_MODES:
            raise HeadLabError(f"ablation mode {self.mode!r} is not one of a probe's: use one of {', '.join(PROBE_MODES)}.")
        metrics = (self.metrics,) if isinstance(self.metrics, str) else tuple(self.metrics)
        if not metrics:
            raise HeadLabError(f"metrics is empty; name at least one of {', '.join(METRICS)}.")
        object.__setattr__(self, "metrics", tuple(canonical_metric(m) for m in metrics))
        if self.n_controls < 1:
            raise HeadLabError(f"n_controls is {self.n_controls}; ask for at least one control draw.")
        if self.n_boot < 1:
            raise HeadLabError(f"n_boot is {self.n_boot}; the bootstrap needs at least one resample.")
        if self.chunk_size is not None:
            object.__setattr__(self, "chunk_size", int(self.chunk_size))
            if self.chunk_size < 1:
                raise HeadLabError(f"chunk_size is {self.chunk_size}; stack at least one condition, or pass None.")
        if not self.z_threshold > 0:
            raise HeadLabError(f"z_threshold is {self.z_threshold:g}; it must be positive (the paper uses 1.8).")
        if self.min_controls < 1:
            raise HeadLabError(f"min_controls is {self.min_controls}; the recipe verdict needs at least one control.")
        for name in ("min_clean_top1", "min_upper_bound_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise HeadLabError(f"{name} is {getattr(self, name):g}; it is a fraction, between 0 and 1.")


@dataclass(frozen=True, eq=False)
class AblationResult(JsonResult):
    """Clean run, candidate, controls and upper bound, per-metric statistics and verdicts."""

    selection: HeadSet
    mode: str
    clean: ConditionMetrics
    candidate: ConditionMetrics
    controls: tuple[ConditionMetrics, ...]
    control_sets: ControlSets
    upper_bound: ConditionMetrics | None
    stats: dict
    verdicts: dict[str, Verdict]
    notes: tuple[str, ...]
    provenance: dict


def condition_stats(
    clean: ConditionMetrics, candidate: ConditionMetrics, controls: Sequence[ConditionMetrics],
    upper: ConditionMetrics | None = None, metrics: Sequence[str] = METRICS, n_boot: int = 2000, boot_seed: int = 0,
) -> dict[str, dict]:
    """Per metric: candidate delta and its bootstrap CI, control deltas, z, rank and p, damage flags."""
    out = {}
    for metric in (canonical_metric(m) for m in metrics):
        cand_delta = candidate.delta(clean, metric)  # [example]
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
                         z=z_score(cand_mean, ctrl), rank=rp.rank, p=rp.p, n_controls=len(ctrl),
                         z_reliable=len(ctrl) >= MIN_RELIABLE_Z_CONTROLS)
        out[metric] = entry
    return out


def study_conditions(selection: HeadSet, n_layers: int, n_heads: int,
                     settings: AblationSettings) -> tuple[list[Ablation], ControlSets]:
    """The conditions of a study, in order: the candidate, its random controls, the upper bound (unless
    settings say no); and the control sets as drawn (seeded: the same on every worker)."""
    s = settings
    selection = check_selection(selection, n_layers, n_heads)
    if s.controls == "matched":
        sets = matched_random_controls(selection, n_layers, n_heads, s.n_controls, s.seed)
    else:
        sets = any_layer_random_controls(selection, n_layers, n_heads, s.n_controls, s.seed)
    conditions = [Ablation(selection, (), s.mode, CANDIDATE, s.seed)]
    conditions += [Ablation(c, (), s.mode, f"control {i}", s.seed) for i, c in enumerate(sets)]
    if s.include_upper_bound:
        conditions.append(Ablation(upper_bound(selection, n_heads), (), s.mode, UPPER_BOUND, s.seed))
    return conditions, sets


def run_info(model: Any, batch: Any) -> dict:
    """What a study's provenance says about the model and the batch (a worker reports the same)."""
    n_layers, n_heads, _ = model_shape(model)
    return {"model": str(getattr(model.cfg, "model_name", "")), "n_layers": n_layers, "n_heads": n_heads,
            "batch": dict(getattr(batch, "spec", {}) or {}), "n_examples": int(batch.tokens.shape[0]),
            "seq_len": int(batch.tokens.shape[1]), "dtype": dtype_name(model_dtype(model))}


def ablation_study(
    model: Any,
    batch: Any,
    selection: HeadSet,
    settings: AblationSettings = AblationSettings(),
    *,
    device: str | torch.device | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_condition: ConditionFn | None = None,
    clean_runs: CleanRuns | None = None,
) -> AblationResult:
    """Ablate `selection`, its controls and (unless settings say no) the upper bound; compute stats and verdicts.

    batch: tokens [example, pos], query_pos [example], target [example] (a ProbeBatch).
    progress(done, total) and cancel() are passed to the engine (run_conditions); on_condition is
    called as each condition finishes, the candidate first (see ConditionFn). clean_runs: where the
    clean run is kept for the next study on this model and batch (the engine's CleanRuns).
    """
    n_layers, n_heads, _ = model_shape(model)
    conditions, sets = study_conditions(selection, n_layers, n_heads, settings)
    notes: list[str] = []
    clean, results = None, [None] * len(conditions)
    for index, metrics in stream_conditions(model, batch, conditions, chunk_size=settings.chunk_size, device=device,
                                            progress=progress, cancel=cancel, notes=notes, clean_runs=clean_runs):
        if index is None:
            clean = metrics
            continue
        results[index] = metrics
        if on_condition is not None:
            on_condition(index, metrics, clean)
    return assemble_study(settings, sets, clean, results, notes, run_info(model, batch))


def assemble_study(settings: AblationSettings, sets: ControlSets, clean: ConditionMetrics,
                   results: Sequence[ConditionMetrics], engine_notes: Sequence[str], info: dict) -> AblationResult:
    """The AblationResult of a study's measured conditions (in study_conditions' order): stats and verdicts.

    engine_notes: what the engine said it did; info: run_info(model, batch).
    """
    s = settings
    metrics = list(s.metrics)
    candidate = results[0]
    control_results = tuple(results[1 : 1 + len(sets)])
    upper = results[-1] if s.include_upper_bound else None
    notes: list[str] = ([sets.note] if sets.note else []) + list(engine_notes)
    stats = condition_stats(clean, candidate, control_results, upper, metrics, s.n_boot, s.boot_seed)
    cand_d = {m: stats[m]["candidate_delta"] for m in metrics}
    ctrl_d = {m: stats[m]["control_deltas"] for m in metrics}
    verdicts: dict[str, Verdict] = {}
    if s.controls == "matched" and "loss" in metrics and "top1" in metrics:
        ub = None if upper is None else {"top1": stats["top1"]["upper_bound_delta"]}
        verdicts["recipe"] = recipe_verdict(cand_d, ctrl_d, clean.mean("top1"), ub, s.min_controls, s.min_clean_top1,
                                            s.min_upper_bound_fraction)
    headline = "logit" if "target_logit" in metrics else "loss"
    if headline == "loss" and "loss" not in metrics:
        notes.append("no closure verdict: it needs the loss or the target logit.")
    else:
        verdicts["closure_paper"] = closure_verdict(cand_d, ctrl_d, "paper", headline, s.z_threshold)
        verdicts["closure_reference"] = closure_verdict(cand_d, ctrl_d, "reference", headline, s.z_threshold)
    verdicts = {name: below_minimum(v, clean.n_examples) for name, v in verdicts.items()}
    if s.mode != "zero":
        notes.append(f"{s.mode} ablation: each head output {MODE_HELP[s.mode]} (clean run).")
    provenance = {
        "model": info["model"], "n_layers": info["n_layers"], "n_heads": info["n_heads"], "batch": info["batch"],
        "n_examples": info["n_examples"], "seq_len": info["seq_len"], "controls": s.controls, "control_seed": s.seed,
        "mode": s.mode, "bootstrap": {"n_boot": s.n_boot, "seed": s.boot_seed, "level": 0.95},
        "ablation_site": "blocks.{l}.attn.hook_z (head output before W_O), every position",
        "torch": torch.__version__, "dtype": info["dtype"],
    }
    return AblationResult(candidate.ablation.heads, s.mode, clean, candidate, control_results, sets, upper, stats,
                          verdicts, tuple(notes), provenance)


def preview_result(settings: AblationSettings, clean: ConditionMetrics,
                   arrived: Mapping[int, ConditionMetrics]) -> AblationResult:
    """What a running study has measured so far, to draw while it runs (arrived: on_condition's index ->
    metrics; the candidate, index 0, must be there). No z, rank, p or verdict: those need every control."""
    s = settings
    candidate = arrived[0]
    upper = next((m for m in arrived.values() if m.label == UPPER_BOUND), None)
    controls = tuple(m for i, m in sorted(arrived.items()) if i > 0 and m.label != UPPER_BOUND)
    stats = condition_stats(clean, candidate, controls, upper, s.metrics, s.n_boot, s.boot_seed)
    for entry in stats.values():
        entry.update(z=None, rank=None, p=None)
    sets = ControlSets(s.controls, tuple(c.ablation.heads for c in controls), s.seed, s.n_controls, len(controls),
                       note=f"preview: {len(controls)} controls so far")
    return AblationResult(candidate.ablation.heads, s.mode, clean, candidate, controls, sets, upper, stats, {},
                          (sets.note,), {})


def summarize_ablation(result: AblationResult) -> dict:
    """The figures a reader wants first: mean deltas, z, p, and every verdict with its rule."""
    out = {"selection": [head_name(h) for h in result.selection], "n_controls": len(result.controls),
           "notes": list(result.notes), "metrics": {}, "verdicts": {}}
    for metric, stats in result.stats.items():
        out["metrics"][metric] = {key: stats.get(key) for key in
                                  ("clean", "candidate_delta", "rank", "p", "z", "n_controls", "control_mean",
                                   "control_std", "upper_bound_delta", "candidate_ci") if key in stats}
    for name, verdict in result.verdicts.items():
        out["verdicts"][name] = {"label": verdict.label, "rule": verdict.rule, "reasons": list(verdict.reasons)}
    return out


def example_damage(clean: ConditionMetrics, ablated: ConditionMetrics, metric: str = "loss") -> np.ndarray:
    """Each example's damage from the ablation, signed so that positive is worse: [example].

    Loss up is damage; top-1, top-5 and the target logit down are damage.
    """
    return DAMAGE_SIGN[canonical_metric(metric)] * ablated.delta(clean, metric)


def worst_examples(damage: np.ndarray, n: int | None = 5) -> list[int]:
    """The examples with the largest damage [example], worst first (stable on ties); all when n is None."""
    order = np.argsort(-np.asarray(damage), kind="stable")
    return [int(i) for i in (order if n is None else order[:n])]


def ablate_alone(model: Any, batch: Any, head: tuple[int, int], mode: str = "zero") -> tuple[ConditionMetrics, ConditionMetrics]:
    """One head ablated on its own, no controls: (clean, ablated) per-example metrics.

    The head inspector's "which examples does this head matter for": one engine pass, for
    `example_damage` / `worst_examples`. batch: a ProbeBatch (tokens [example, pos]).
    """
    clean, (alone,) = run_conditions(model, batch, [Ablation(HeadSet((head,)), mode=mode, label=head_name(head))])
    return clean, alone


# ----------------------------------------------------------------------------------- the lab's probe size

STUDY_TARGET_SECONDS = 10.0  # the ablation lab proposes a probe that answers a study in about this long here
PROBE_SIZES = (8, 16, 32, 64, 128, 256)  # the example counts it weighs (8: the sidebar's minimum)
PROBE_LENGTHS = (56, 48, 40, 32, 24, 16)  # the shorter lengths it weighs where even 8 examples are too slow


def study_seconds(per_example: float, n: int, n_conditions: int, replay_fraction: float, clean_kept: bool) -> float:
    """Estimated seconds of a study: the clean forward (unless kept) and each condition replaying its layers
    (replay_fraction of the model's blocks, from the lowest ablated layer on)."""
    return per_example * n * ((0.0 if clean_kept else 1.0) + n_conditions * replay_fraction)


@dataclass(frozen=True)
class ProbeSizeProposal:
    """The probe the lab proposes: n_examples of seq_len tokens, its estimated study seconds (with its clean run
    unless it is the probe now and that run is kept), and whether that is within the target."""

    n_examples: int
    seq_len: int
    seconds: float
    fits: bool


def propose_probe_size(per_example_at: Callable[[int], float], n_now: int, seq_len_now: int, n_conditions: int,
                       replay_fraction: float, clean_kept: bool, free_length: bool,
                       target: float = STUDY_TARGET_SECONDS) -> ProbeSizeProposal:
    """The most examples (of PROBE_SIZES and n_now) whose study fits `target` at today's length; when even the
    fewest do not fit and the task's length is free (random-token induction), the longest shorter length that fits
    at the fewest examples; else the fewest examples, not fitting.

    per_example_at(length): seconds of one example of that many tokens here (timed: a forward's cost is not
    proportional to its length, SmolLM2's at 48 tokens took 0.84 of its 64-token time in the lab); called for a
    shorter length only when even the fewest examples miss the target.
    """
    def cost(n: int, length: int) -> float:
        kept = clean_kept and n == n_now and length == seq_len_now
        return study_seconds(per_example_at(length), n, n_conditions, replay_fraction, kept)

    sizes = sorted({*PROBE_SIZES, int(n_now)})
    fitting = [n for n in sizes if cost(n, seq_len_now) <= target]
    if fitting:
        return ProbeSizeProposal(max(fitting), seq_len_now, cost(max(fitting), seq_len_now), True)
    fewest = sizes[0]
    for length in (t for t in PROBE_LENGTHS if free_length and t < seq_len_now):  # longest first
        if cost(fewest, length) <= target:
            return ProbeSizeProposal(fewest, length, cost(fewest, length), True)
    return ProbeSizeProposal(fewest, seq_len_now, cost(fewest, seq_len_now), False)
