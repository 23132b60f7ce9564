"""The spectral probe-circuit recipe end to end [SPC]: screen (Steps 1-2), then group ablation (Step 3).

`screen` measures every checkpoint once (through the HeadStats cache), turns the head outputs into
PR trajectories and the PR-integral ranking, and screens the final checkpoint's attention for the
six canonical patterns. The candidate induction circuit is the set of heads at or above the
membership threshold. `run_recipe` adds Step 3: the candidate against matched-random draws and the
upper bound, with the recipe's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from core.ablation.study import AblationSettings, ablation_study, summarize_ablation
from core.ablation.workers import ablation_study_on, ablation_workers
from core.errors import HeadLabError
from core.executor import Executor
from core.heads import HeadSet, head_name
from core.model.loading import DEFAULT_DTYPE, load_config, load_model
from core.model.refs import Checkpoint, ModelRef, list_checkpoints, resolve_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import HeadStats, check_probe_fits, head_stats, pattern_batch_for, probe_batch_for
from core.results import JsonResult
from core.stats.selectivity import (BASELINE_KINDS, CLASS_THRESHOLD, DEFAULT_BASELINE_N, DEFAULT_BASELINE_SEED,
                                    DEFAULT_NULL_SEED, INDUCTION_THRESHOLD, ScreenResult, gather_pattern_attention,
                                    null_induction_selectivity, selectivity, selectivity_denominator)
from core.stats.spectral import DEFAULT_DEFINITION, DEFAULT_RULE, PR_DEFINITIONS, SpectralResult, pr_per_head, resolve_k
from core.tasks import ProbeFile, ProbeSpec

REFERENCE_PROBE_LENGTH = 256


def scaled_induction_threshold(query_pos, threshold_at_reference: float = INDUCTION_THRESHOLD) -> float:
    """The membership threshold for this probe's length: the same share of attention on p+1.

    Membership is judged against the uniform baseline 1/(q+1), so a head's selectivity is its
    attention share times (q+1): 50x at the reference T = 256 means >= 19.5% of the attention on
    p+1. A zoo probe of T = 64 caps selectivity at 64x, so the same share is 12.5x there.
    """
    mean_keys = float((query_pos.double() + 1).mean())  # query_pos: [example]
    return threshold_at_reference * mean_keys / REFERENCE_PROBE_LENGTH


def screen_checkpoint(stats: HeadStats, baseline: str = "random", class_threshold: float = CLASS_THRESHOLD,
                      induction_threshold: Optional[float] = None, n_null_draws: int = 500) -> ScreenResult:
    """Step 2 on one checkpoint's HeadStats (the null needs the stored attention rows).

    induction_threshold: None scales the reference 50x to the probe length (scaled_induction_threshold).
    """
    if induction_threshold is None:
        induction_threshold = scaled_induction_threshold(stats.query_pos)
    if stats.attn_query is not None and stats.attn_query.dtype == torch.float32:
        return ScreenResult.from_attention(
            stats.attn_query.float(), stats.query_pos, stats.induction_pos, stats.duplicate_pos,
            baseline=baseline, threshold=class_threshold, induction_threshold=induction_threshold,
            n_null_draws=n_null_draws,
        )
    # float16 rows (probes above 2^24 attention entries) or none: the selectivity from the float32 summaries
    targets = {name: stats.pattern(name) for name in stats.patterns}
    sel, names = selectivity(targets, stats.attn_baseline, baseline, stats.query_pos)
    member_sel, _ = selectivity(targets, stats.attn_baseline, "uniform", stats.query_pos, names)
    null = None
    if stats.attn_query is not None and n_null_draws > 0:
        null = float32_denominator_null(stats, baseline, n_null_draws)
    return ScreenResult(patterns=names, selectivity=sel, baseline=baseline, n_examples=stats.n_examples,
                        threshold=class_threshold, induction_threshold=induction_threshold, null=null,
                        membership_selectivity=member_sel)


def float32_denominator_null(stats: HeadStats, baseline: str, n_null_draws: int) -> np.ndarray:
    """The induction null [draw, layer, head] from float16 rows, over the float32 summaries' denominator.

    The null's random targets are single keys of each row, so its numerator needs the stored rows
    (float16 above 2^24 entries, relative rounding about 5e-4); its denominator, the same as the
    real selectivity's, comes from the float32 attn_baseline, so the two are compared on one scale.
    """
    rows = stats.attn_query.float()  # [example, layer, head, key]
    null = null_induction_selectivity(rows, stats.query_pos, stats.induction_pos, stats.duplicate_pos, n_null_draws,
                                      DEFAULT_NULL_SEED, baseline)
    from_rows = gather_pattern_attention(rows, stats.query_pos, stats.induction_pos, stats.duplicate_pos,
                                         DEFAULT_BASELINE_N, DEFAULT_BASELINE_SEED)
    shape = tuple(rows.shape[1:3])
    rows_denom = selectivity_denominator(from_rows.baseline, baseline, from_rows.query_pos, shape)
    return null * rows_denom / selectivity_denominator(stats.attn_baseline, baseline, stats.query_pos, shape)


# ---------------------------------------------------------------------------------------------
# Steps 1 and 2 over training


@dataclass(frozen=True)
class ScreenReport:
    """Steps 1-2 of one model over its checkpoints, with provenance.

    spectral:  PR [checkpoint, layer, head], PR-integral and ranking (Step 1); None for a model with fewer
               than two checkpoints of known token counts (the PR-integral needs a trajectory), and
               spectral_note then says why
    final:     the pattern screen at the final checkpoint (Step 2): it needs that checkpoint alone
    selectivity_by_checkpoint: [checkpoint, pattern, layer, head], for animating the screen
    """

    model: str
    checkpoints: tuple[Checkpoint, ...]
    probe_spec: dict
    spectral: Optional[SpectralResult]
    final: ScreenResult
    selectivity_by_checkpoint: np.ndarray
    shape: tuple[int, int]
    spectral_note: str = ""

    @property
    def candidate_circuit(self) -> HeadSet:
        """Heads whose induction selectivity reaches the membership threshold at the final checkpoint."""
        return self.final.induction_heads

    def heads_of_class(self, name: str) -> HeadSet:
        return HeadSet.from_mask(self.final.classes == name)

    def to_json(self) -> dict:
        """The fields (final as "final_screen") plus the derived circuits and fractions a reader wants; hand-written for those."""
        spectral = None if self.spectral is None else self.spectral.to_json()
        return {
            "model": self.model,
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "probe_spec": self.probe_spec,
            "shape": list(self.shape),
            "spectral": spectral,
            "top_k_spectral": [] if self.spectral is None else [head_name(h) for h in self.spectral.top_heads],
            "spectral_note": self.spectral_note,
            "final_screen": self.final.to_json(),
            "selectivity_by_checkpoint": self.selectivity_by_checkpoint.tolist(),
            "candidate_circuit": [head_name(h) for h in self.candidate_circuit],
            "previous_token_circuit": [head_name(h) for h in self.final.previous_token_circuit],
            "fractions": self.final.fractions(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "ScreenReport":
        return cls(
            model=data["model"],
            checkpoints=tuple(Checkpoint.from_json(c) for c in data["checkpoints"]),
            probe_spec=data["probe_spec"],
            spectral=None if data["spectral"] is None else SpectralResult.from_json(data["spectral"]),
            final=ScreenResult.from_json(data["final_screen"]),
            selectivity_by_checkpoint=np.asarray(data["selectivity_by_checkpoint"], dtype=float),
            shape=tuple(data["shape"]),
            spectral_note=data.get("spectral_note", ""),
        )


@dataclass(frozen=True)
class ScreenSettings(JsonResult):
    """How Steps 1-2 read the head statistics (everything but the model, the probe and the device).

    k: top-K of the PR-integral ranking, a count (>= 1) or a fraction; definition: the PR
    ("entropy" or "classic"); rule: the PR-integral rule; baseline: the selectivity denominator
    ("random" or "uniform"); class_threshold: Step 2's class rule; induction_threshold: the
    membership threshold, None to scale the reference 50x (at T = 256) to the probe length (see
    scaled_induction_threshold); n_null_draws: draws of the induction null at the final checkpoint.
    """

    k: int | float = 0.18
    definition: str = DEFAULT_DEFINITION
    rule: str = DEFAULT_RULE
    baseline: str = "random"
    class_threshold: float = CLASS_THRESHOLD
    induction_threshold: Optional[float] = None
    n_null_draws: int = 500

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not (self.k > 0 and (self.k < 1 or float(self.k).is_integer())):
            raise HeadLabError(f"screen K must be a whole count of heads (1 or more) or a fraction below 1 (e.g. 0.18), "
                               f"got {self.k}.")
        if self.k >= 1:
            object.__setattr__(self, "k", int(self.k))
        if self.definition not in PR_DEFINITIONS:
            raise HeadLabError(f"screen definition {self.definition!r} is unknown; use one of {', '.join(PR_DEFINITIONS)}.")
        if self.baseline not in BASELINE_KINDS:
            raise HeadLabError(f"screen baseline {self.baseline!r} is unknown; use one of {', '.join(BASELINE_KINDS)}.")
        thresholds = [self.class_threshold] + ([] if self.induction_threshold is None else [self.induction_threshold])
        if not all(np.isfinite(t) and t > 0 for t in thresholds):
            raise HeadLabError(f"screen thresholds must be positive finite selectivities (e.g. 30 or 12.5), got "
                               f"{', '.join(str(t) for t in thresholds)}.")
        if int(self.n_null_draws) < 0:
            raise HeadLabError(f"screen n_null_draws must be >= 0, got {self.n_null_draws}.")
        object.__setattr__(self, "n_null_draws", int(self.n_null_draws))


def screen(ref: ModelRef, spec: ProbeSpec | ProbeFile, settings: ScreenSettings = ScreenSettings(), device: str = "cpu",
           progress: Optional[Callable[[int, int, str], None]] = None, dtype: str = DEFAULT_DTYPE,
           executor: Optional[Executor] = None) -> ScreenReport:
    """Steps 1-2 over every checkpoint of `ref`. progress(done, total, revision) after each one.

    spec: a probe spec, or a probe file (tokenized by the final checkpoint's tokenizer; core.probe.pattern_batch_for
    says which of its prompts the screen reads).
    device, dtype: where and in which precision a checkpoint without cached statistics runs.
    executor: when given, the passes the cache lacks run first as one sweep on it (core/pipelines/sweep.py).
    """
    s = settings
    checkpoints = tuple(list_checkpoints(ref))
    config = load_config(ref, checkpoints[-1].revision)
    resolve_k(s.k, config.num_hidden_layers * config.num_attention_heads)  # K is refused before any work
    check_probe_fits(spec, config)
    if isinstance(spec, ProbeFile):
        batch = pattern_batch_for(spec, load_model(ref, checkpoints[-1].revision, device=device, dtype=dtype))
    else:
        batch = spec.build()
    if executor is not None:
        probe = batch if isinstance(spec, ProbeFile) else spec  # a spec travels as itself: each task builds it
        probe_sweep([SweepItem(ref, c) for c in checkpoints], probe, executor, device=device, dtype=dtype)
    induction_threshold = s.induction_threshold
    if induction_threshold is None:
        induction_threshold = scaled_induction_threshold(batch.query_pos)
    pr, sel_by_ckpt = [], []
    final_screen = None
    for index, ckpt in enumerate(checkpoints):
        stats = head_stats(ref, ckpt, batch, device=device, dtype=dtype)
        pr.append(pr_per_head(stats.z_query, s.definition))
        is_final = index == len(checkpoints) - 1
        result = screen_checkpoint(stats, s.baseline, s.class_threshold, induction_threshold,
                                   s.n_null_draws if is_final else 0)
        sel_by_ckpt.append(result.selectivity)
        if is_final:
            final_screen = result
        if progress:
            progress(index + 1, len(checkpoints), ckpt.revision)
    tokens = [c.tokens for c in checkpoints]
    spectral, note = None, spectral_left_out(ref.name, tokens)
    if not note:
        spectral = SpectralResult.build(np.stack(pr), tokens, k=s.k, definition=s.definition, rule=s.rule,
                                        revisions=[c.revision for c in checkpoints])
    n_layers, n_heads = final_screen.selectivity.shape[1:]
    return ScreenReport(model=ref.name, checkpoints=checkpoints, probe_spec=dict(batch.spec),
                        spectral=spectral, final=final_screen,
                        selectivity_by_checkpoint=np.stack(sel_by_ckpt), shape=(n_layers, n_heads), spectral_note=note)


def spectral_left_out(model: str, tokens: list[int]) -> str:
    """Why Step 1 is left out ("" when it is not): the PR-integral integrates over ln(tokens), so it needs two
    checkpoints with known token counts; the pattern screen and its candidate circuit need the final one alone."""
    known = sum(t > 0 for t in tokens)
    if known >= 2:
        return ""
    return (f"PR-integral left out: {model} has {len(tokens)} checkpoint{'' if len(tokens) == 1 else 's'}, {known} "
            "with a known training token count, and the PR-integral integrates the PR over training tokens (it needs "
            "two or more); the pattern screen and the candidate circuit read the final checkpoint alone.")


# ---------------------------------------------------------------------------------------------
# Step 3: group ablation, and the recipe end to end


def ablate(ref: ModelRef, revision: Optional[str], selection: HeadSet, spec: ProbeSpec | ProbeFile,
           settings: AblationSettings = AblationSettings(), device: str = "cpu",
           progress: Optional[Callable[[int, int], None]] = None, model: Any = None, dtype: str = DEFAULT_DTYPE,
           executor: Optional[Executor] = None):
    """Group ablation of `selection` at one checkpoint against controls and the upper bound.

    spec: a probe spec, or a probe file (its prompts, tokenized by the model's tokenizer, are the examples).
    model: the loaded checkpoint, if the caller has it; else it is loaded on `device` in `dtype`.
    executor: when given (and not serial), the conditions fan out over its workers, each holding the
    checkpoint (core/ablation/workers.py); the numbers equal the in-process study's at the same threads.
    """
    checkpoint = resolve_checkpoint(ref, revision)
    check_probe_fits(spec, load_config(ref, checkpoint.revision))
    if executor is not None and executor.backend != "serial":
        workers = ablation_workers(executor, device=device)
        try:
            result = ablation_study_on(workers, ref, checkpoint.revision, spec, selection, settings, dtype=dtype,
                                       progress=progress)
        finally:
            workers.close()
        result.provenance.update({"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens})
        return result
    loaded = model if model is not None else load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    result = ablation_study(loaded, probe_batch_for(spec, loaded), selection, settings, device=device, progress=progress)
    result.provenance.update({"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens})
    return result


def run_recipe(ref: ModelRef, spec: ProbeSpec | ProbeFile, n_controls: int = 20, mode: str = "zero", seed: int = 123,
               device: str = "cpu", progress: Optional[Callable[[str], None]] = None, dtype: str = DEFAULT_DTYPE,
               executor: Optional[Executor] = None) -> dict:
    """Screen, take the candidate induction circuit, ablate it against matched-random draws and the
    upper bound; also ablate the previous-token circuit (composition: it feeds the induction heads),
    chosen by the same membership rule as the induction circuit. executor: for the screen's passes.
    spec: a probe spec, or a probe file (screened on its prompts with repeated tokens, ablated on all of them)."""
    say = progress or (lambda text: None)
    say("screening checkpoints")
    report = screen(ref, spec, device=device, dtype=dtype, executor=executor)
    circuit = report.candidate_circuit
    out: dict[str, Any] = {"model": ref.name, "screen": report.to_json()}
    if len(circuit) == 0:
        out["verdict"] = {"label": "no candidate",
                          "rule": f"no head reached {report.final.induction_threshold:g}x induction selectivity"}
        return out
    final = report.checkpoints[-1].revision
    model = load_model(ref, final, device=device, dtype=dtype)
    say(f"ablating the candidate circuit {circuit}")
    matched = AblationSettings(n_controls=n_controls, controls="matched", mode=mode, seed=seed)
    result = ablate(ref, final, circuit, spec, matched, device, model=model)
    out["candidate"] = {"summary": summarize_ablation(result), "result": result.to_json()}
    out["verdict"] = out["candidate"]["summary"]["verdicts"].get("recipe")
    prev_heads = report.final.previous_token_circuit
    if len(prev_heads):
        say(f"ablating the previous-token circuit {prev_heads}")
        try:
            composition = ablate(ref, final, prev_heads, spec, matched, device, model=model)
        except HeadLabError as exc:  # e.g. more than half of a layer: no matched control exists
            any_layer = AblationSettings(n_controls=n_controls, controls="any-layer", mode=mode, seed=seed)
            composition = ablate(ref, final, prev_heads, spec, any_layer, device, model=model)
            out["composition_note"] = f"matched controls impossible ({exc}); used any-layer controls"
        out["composition"] = {"summary": summarize_ablation(composition), "result": composition.to_json()}
    return out
