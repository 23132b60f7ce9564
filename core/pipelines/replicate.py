"""Measuring the papers' claims (core/pipelines/replicate_claims.py) on the zoo, resumably.

A run measures each claim on the preset's zoo models and judges it by its criterion; the report
(Markdown and HTML with the figures, every number in report.json, each figure's data as CSV/JSON,
the figures as PNG/SVG) is written by core/cli/replicate_report.py.

Resuming: each claim's measurement is stored under <out>/measurements/<claim>.json with the
settings and model fingerprints it was made with, and reused on a rerun with the same settings;
the cross-seed matrix stores every cell, the attribution analysis every model, and HeadStats live
in the content-addressed cache. An interrupted run therefore resumes where it stopped.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

import core.pipelines.coactivation as coactivation_pipeline
from core.errors import HeadLabError
from core.executor import Executor
from core.model.loading import DEFAULT_DTYPE, dtype_name
from core.model.refs import ModelRef, list_checkpoints, read_manifest, weights_fingerprint
from core.pipelines.attribution import run_preset
from core.pipelines.attribution_results import AttributionResult, AttributionSettings
from core.pipelines.dynamics import FormFunction, cross_seed_matrix, data_shift_jaccard, form_vs_function, training_trajectories
from core.pipelines.recipe import run_recipe
from core.pipelines.replicate_claims import (
    IDENTIFIABLE_FORMATION_MAX,
    NEEDS_PAPER,
    NOT_RUN,
    PRESETS,
    Claim,
    _shift_pairs,
    unformed_induction_seeds,
)
from core.stats.dynamics import DEFAULT_MARGIN, FORM_FUNCTION_LABELS
from core.tasks.specs import probe_spec
from core.workspace import atomic_write_json
from core.zoo.presets import preset_models

MEASUREMENT_VERSION = "replicate-3"  # bump when what a measurement holds changes: stored ones then miss
# replicate-2: "mean" ablation became one mean over examples and positions (issue 18)


class NotRun(Exception):
    """A claim that cannot be measured here; the message is the reason shown in the report."""


# ---------------------------------------------------------------------------------------------
# the run: its settings and the analyses claims share (memoised per run)


@dataclass(frozen=True)
class ReplicateSettings:
    """What a replicate run measures with: the preset, the probe (N, T, seed), the control draws, the
    PR-rise margin, the device and the dtype. Stored with every measurement, so other settings measure again."""

    preset: str = "quick"
    n_examples: int = 256
    seq_len: int = 64
    probe_seed: int = 42
    n_controls: int = 20
    closure_controls: int = 5
    control_seed: int = 123
    margin: float = DEFAULT_MARGIN
    device: str = "cpu"
    dtype: str = DEFAULT_DTYPE

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.preset not in PRESETS:
            raise HeadLabError(f"unknown preset {self.preset!r}; choose quick or paper.")
        if not float(self.margin) > 0:
            raise HeadLabError(f"the PR-rise margin must be positive, got {self.margin}.")

    def context(self, target: str, out: Path, force: bool = False, say: Callable[[str], None] = print,
                executor: Optional[Executor] = None, ablation_mode: str = "mean") -> "Context":
        """The run context of `target` with these settings, its measurements stored under `out`; executor:
        where the probe passes over checkpoints run (results do not depend on it, so it is not a setting);
        ablation_mode: the attribution target's mean-ablation variant."""
        spec = probe_spec("induction", self.n_examples, self.seq_len, self.probe_seed)
        return Context(target, self.preset, out, spec, self.n_controls, self.closure_controls, self.control_seed,
                       self.margin, device=self.device, dtype=self.dtype, say=say, force=force, executor=executor,
                       ablation_mode=ablation_mode)


@dataclass
class Measurement:
    measured: dict
    artifacts: dict
    models: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass
class Context:
    """Settings of one replicate run and the analyses claims share (memoised per run)."""

    target: str
    preset: str
    out: Path
    spec: Any
    n_controls: int = 20
    closure_controls: int = 5
    control_seed: int = 123
    margin: float = DEFAULT_MARGIN
    definition: str = "entropy"
    device: str = "cpu"
    dtype: str = DEFAULT_DTYPE
    say: Callable[[str], None] = print
    force: bool = False  # measure again instead of reusing stored cells, models and claims
    memo: dict = field(default_factory=dict)
    executor: Optional[Executor] = None  # where probe passes over checkpoints run (None: here, one by one)
    ablation_mode: str = "mean"  # attribution target: the mean-ablation variant of this pass (ATTRIBUTION_VARIANTS)

    def settings(self) -> dict:
        out = {"preset": self.preset, "probe_spec": dict(self.spec.to_json()), "n_controls": self.n_controls,
               "control_seed": self.control_seed, "ablation_mode": "zero", "pr_definition": self.definition,
               "pr_rise_margin": self.margin, "membership_threshold": "50x at T = 256, scaled to the probe length "
               "(uniform baseline)", "device": self.device}
        if dtype_name(self.dtype) != DEFAULT_DTYPE:  # float32 measurements keep the settings they were stored with
            out["dtype"] = dtype_name(self.dtype)
        if self.target in ("spectral", "closure"):
            out["excluded_induction_seeds"] = unformed_induction_seeds(self.preset)
        if self.target == "closure":
            out["closure_controls"] = self.closure_controls
        if self.target == "attribution":
            out["attribution"] = {k: v for k, v in self.attribution_settings("reverse").to_json().items() if k != "task"}
        return out

    def ref(self, name: str):
        return ModelRef(name, "zoo")

    def memoised(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def trajectories(self, name: str):
        return self.memoised(("trajectories", name), lambda: training_trajectories(
            self.ref(name), self.spec, self.definition, device=self.device, dtype=self.dtype, executor=self.executor))

    def recipe(self, name: str) -> dict:
        def compute() -> dict:
            self.say(f"recipe on {name} ({self.n_controls} matched-random controls)")
            return run_recipe(self.ref(name), self.spec, self.n_controls, "zero", self.control_seed, self.device,
                              dtype=self.dtype, executor=self.executor)

        return self.memoised(("recipe", name), compute)

    @property
    def variant(self) -> str:
        """The attribution target's mean-ablation variant; "" for the targets measured one way."""
        return self.ablation_mode if self.target == "attribution" else ""

    def attribution_settings(self, task: str) -> AttributionSettings:
        return AttributionSettings(task=task, ablation_mode=self.ablation_mode)

    def attribution(self, task: str):
        """(AttributionSummary, [AttributionResult]) of the preset's models for `task` (resumable per model)."""
        def compute():
            self.say(f"attribution on the {self.preset} {task} models ({self.ablation_mode} ablation)")
            summary, paths = run_preset(self.preset, self.attribution_settings(task), self.device, progress=False,
                                        force=self.force, dtype=self.dtype, executor=self.executor)
            results = [AttributionResult.from_json(json.loads(Path(p).read_text()))
                       for name, p in paths.items() if name != "summary"]
            return summary, results

        return self.memoised(("attribution", task), compute)


def _trained(name: str) -> tuple[bool, str]:
    try:
        manifest = read_manifest(name)
    except HeadLabError:
        return False, "not trained"
    if not manifest.get("complete", True):
        return False, "still training"
    return True, ""


def model_key(name: str) -> list:
    """What identifies a trained zoo model for resuming: name, final revision, checkpoint count, weights hash."""
    ref = ModelRef(name, "zoo")
    checkpoints = list_checkpoints(ref)
    return [name, checkpoints[-1].revision, len(checkpoints), weights_fingerprint(ref, checkpoints[-1].revision)]


def _seed_of(name: str) -> Optional[int]:
    try:
        return int(read_manifest(name)["config"]["train"]["seed"])
    except (HeadLabError, KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# runners: measure one claim


def _require_trained(names: Sequence[str], preset: str) -> None:
    missing = [f"{n} ({why})" for n in names for ok, why in [_trained(n)] if not ok]
    if missing:
        raise NotRun(f"waiting for {', '.join(missing)}; run python -m core zoo --preset {preset}")


def _run_causal(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        out = ctx.recipe(name)
        shape = out["screen"]["shape"]
        n_heads = int(shape[0]) * int(shape[1])
        entry = {"model": name, "n_heads": n_heads, "circuit": ",".join(out["screen"]["candidate_circuit"]),
                 "circuit_size": len(out["screen"]["candidate_circuit"])}
        entry["circuit_fraction"] = entry["circuit_size"] / n_heads
        if "candidate" not in out:
            entry.update(recipe_verdict="no candidate", clean_top1=0.0, candidate_top1_delta=0.0, control_top1_delta_mean=0.0)
        else:
            s = out["candidate"]["summary"]
            loss, top1 = s["metrics"]["loss"], s["metrics"]["top1"]
            entry.update(recipe_verdict=s["verdicts"]["recipe"]["label"], n_controls=s["n_controls"],
                         clean_top1=top1["clean"], candidate_top1_delta=top1["candidate_delta"],
                         control_top1_delta_mean=top1["control_mean"], candidate_loss_delta=loss["candidate_delta"],
                         control_loss_delta_mean=loss["control_mean"], control_loss_delta_std=loss["control_std"],
                         z_loss=loss["z"], z_top1=top1["z"], upper_bound_top1_delta=top1["upper_bound_delta"])
            artifacts[name] = out["candidate"]["result"]
        per.append(entry)
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _run_composition(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts, notes = [], {}, []
    for name in names:
        out = ctx.recipe(name)
        prev = out["screen"]["previous_token_circuit"]
        if "composition" not in out:
            per.append({"model": name, "heads": ""})
            continue
        s = out["composition"]["summary"]
        loss, top1 = s["metrics"]["loss"], s["metrics"]["top1"]
        kind = out["composition"]["result"]["control_sets"]["kind"]
        per.append({"model": name, "heads": ",".join(prev), "control_kind": kind, "n_controls": s["n_controls"],
                    "loss_delta": loss["candidate_delta"], "z_loss": loss["z"], "loss_rank": loss["rank"],
                    "loss_p": loss["p"], "clean_top1": top1["clean"], "top1_after": top1["clean"] + top1["candidate_delta"],
                    "z_top1": top1["z"]})
        artifacts[name] = out["composition"]["result"]
        if out.get("composition_note"):
            notes.append(f"{name}: {out['composition_note']}")
    measured: dict = {"per_model": per}
    if not any(x["heads"] for x in per):
        measured["undefined"] = "the screen found no previous-token circuit (membership threshold) in any seed"
    return Measurement(measured, artifacts, tuple(names), tuple(notes))


def _run_timing(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        traj = ctx.trajectories(name)
        timings = traj.timing(margin=ctx.margin)
        # how specific the signal is: other heads whose PR also rises before the circuit's first crossing
        crossings = [t.crossing.index for t in timings if t.crossing.index is not None]
        n_layers, n_heads = traj.shape
        others = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in traj.final_circuit]
        early = [t for t in traj.timing(others, ctx.margin)
                 if crossings and t.rise.index is not None and t.rise.index < min(crossings)]
        per.append({"model": name, "circuit": str(traj.final_circuit), "margin": ctx.margin,
                    "threshold": traj.induction_threshold, "heads": [t.to_json() for t in timings],
                    "other_heads": len(others), "other_heads_rising_before_first_crossing": len(early)})
        artifacts[name] = traj.to_json()
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _run_identifiable(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        traj = ctx.trajectories(name)
        ident = traj.identification()
        tokens = np.asarray(traj.tokens, dtype=np.float64)
        positive = tokens[tokens > 0]
        # context, not part of the criterion: from when the recipe's circuit already contains the final one
        final = set(ident.final_circuit)
        superset = next((i for i, c in enumerate(traj.circuits) if final and final <= set(c)), None)
        per.append({"model": name, "final_circuit": str(ident.final_circuit), "first_fraction": ident.first_fraction,
                    "stable_fraction": ident.stable_fraction, "first_tokens": ident.first.tokens,
                    "final_tokens": float(tokens[-1]),
                    "resolution": float(positive[0] / tokens[-1]) if positive.size and tokens[-1] > 0 else None,
                    "superset_fraction": None if superset is None or tokens[-1] <= 0 else float(tokens[superset] / tokens[-1]),
                    "superset_size": None if superset is None else len(traj.circuits[superset]),
                    **_formation(name)})
        artifacts[name] = ident.to_json()
    if not any(x["can_test"] for x in per):
        return Measurement({"per_model": per, "undefined": (
            f"no induction seed forms induction within the first {IDENTIFIABLE_FORMATION_MAX:.0%} of its training, "
            "so none can show a circuit identified from 0.3-2% of it (train induction-neox-long)")}, artifacts, tuple(names))
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _formation(name: str) -> dict:
    """When the model's induction formed (the zoo's own record: the first evaluation with the
    repeated-half loss below 1 nat), as a fraction of its training steps, and whether that is early
    enough for the identifiability claim (IDENTIFIABLE_FORMATION_MAX)."""
    final = read_manifest(name)["final"]
    step, steps = final.get("induction_step"), final.get("steps")
    fraction = None if step is None or not steps else step / steps
    return {"formation_step": step, "formation_fraction": fraction,
            "can_test": fraction is not None and fraction <= IDENTIFIABLE_FORMATION_MAX}


def _run_seed(ctx: Context, names: list[str]) -> Measurement:
    circuits = {n: ctx.trajectories(n).final_circuit for n in names}
    ctx.say(f"cross-seed ablation: {len(names)} x {len(names)} cells, {ctx.n_controls} matched-random controls each")
    cells_dir = ctx.out / "measurements" / "cross-seed"
    if ctx.force:  # measure every cell again
        shutil.rmtree(cells_dir, ignore_errors=True)
    matrix = cross_seed_matrix([ctx.ref(n) for n in names], ctx.spec, circuits, ctx.n_controls, ctx.control_seed,
                               device=ctx.device, dtype=ctx.dtype, store_dir=cells_dir, executor=ctx.executor,
                               progress=lambda done, total, what: ctx.say(f"  cell {done}/{total}: {what}"))
    spec = matrix.specificity("loss")
    measured = {"n_models": len(names), **{k: v for k, v in spec.items() if k != "metric"},
                "circuits": dict(zip(matrix.models, matrix.circuits))}
    notes = tuple(f"{matrix.models[a]} in {matrix.models[b]}: {matrix.reasons[a][b]}"
                  for a in range(len(names)) for b in range(len(names)) if matrix.reasons[a][b])
    return Measurement(measured, {"matrix": matrix.to_json()}, tuple(names), notes)


def _run_shift(ctx: Context, names: list[str]) -> Measurement:
    pairs, artifacts = [], {}
    for base, shifted in _shift_pairs(ctx.preset):
        shift = data_shift_jaccard(ctx.trajectories(base), ctx.trajectories(shifted))
        pairs.append({"base": base, "shifted": shifted, "jaccard": shift.jaccard, "base_circuit": str(shift.base_circuit),
                      "shifted_circuit": str(shift.shifted_circuit)})
        artifacts[f"{base}>{shifted}"] = shift.to_json()
    return Measurement({"pairs": pairs}, artifacts, tuple(names))


def _run_form_function(ctx: Context, names: list[str]) -> Measurement:
    counts = {label: 0 for label in FORM_FUNCTION_LABELS}
    artifacts, per, n_checkpoints, notes = {}, [], 0, []
    for name in names:
        traj = ctx.trajectories(name)
        circuit = traj.final_circuit
        if len(circuit) == 0:
            notes.append(f"{name}: no final circuit to follow")
            continue
        # one stored result per model, so a long paper-preset run resumes between models
        path = ctx.out / "measurements" / "form-function" / f"{name}.json"
        key = {**ctx.settings(), "version": MEASUREMENT_VERSION, "model": model_key(name), "circuit": str(circuit)}
        stored = None if ctx.force else _load_stored(path, key)
        if stored is not None:
            ff = FormFunction.from_json(stored["result"])
        else:
            ctx.say(f"form vs function on {name}: closure of {circuit} at {len(traj.revisions)} checkpoints")
            ff = form_vs_function(ctx.ref(name), circuit, ctx.spec, traj, ctx.closure_controls, ctx.control_seed,
                                  device=ctx.device, dtype=ctx.dtype)
            atomic_write_json(path, {"settings": key, "result": ff.to_json()})
        for label, n in ff.counts().items():
            counts[label] += n
        n_checkpoints += len(ff.revisions)
        per.append({"model": name, "circuit": str(circuit), "counts": ff.counts(),
                    "function_without_form": [r for r, l in zip(ff.revisions, ff.labels) if l == "function without form"],
                    "form_without_function": [r for r, l in zip(ff.revisions, ff.labels) if l == "form without function"]})
        artifacts[name] = ff.to_json()
    measured: dict = {"counts": counts, "n_checkpoints": n_checkpoints, "models": [p["model"] for p in per], "per_model": per}
    if not per:
        measured["undefined"] = "no induction seed has a final circuit to follow"
    return Measurement(measured, artifacts, tuple(names), tuple(notes))


def _coactivation():
    """The co-activation pipeline module (a function, so a test can stand in for it)."""
    return coactivation_pipeline


def _synthetic_split(closure: Any, split: str = "all") -> Any:
    """The closure split the reference judges a synthetic probe by: same-layer ("matched") controls,
    any-layer ones when no same-layer control set exists."""
    return closure.split("matched", split) or closure.split("any-layer", split)


def _closure_entry(name: str, report: Any, split: str) -> dict:
    chosen = _synthetic_split(report.closure, split)
    entry = {"model": name, "candidate": str(report.candidate), "k": report.proposal.k, "kind": chosen.kind,
             "split": split, "n_examples": chosen.n_examples, "verdict": chosen.verdicts["paper"].label,
             "verdict_reference": chosen.verdicts["reference"].label,
             "skipped_kinds": dict(report.closure.skipped)}
    for metric in ("loss", "top1", "top5", "target_logit"):
        entry[f"delta_{metric}"] = chosen.stats[metric]["candidate_delta"]
        entry[f"z_{metric}"] = chosen.z(metric)
    return entry


def _run_dense_closure(ctx: Context, names: list[str]) -> Measurement:
    module = _coactivation()
    per, artifacts, notes = [], {}, []
    for name in names:
        ctx.say(f"co-activation communities of {name} and the candidate's closure test")
        settings = module.CoactivationSettings(run_closure=True, n_controls=ctx.closure_controls,
                                               control_seed=ctx.control_seed)
        report = module.coactivation(ctx.ref(name), None, ctx.spec, settings, device=ctx.device, dtype=ctx.dtype)
        per.append(_closure_entry(name, report, "all"))
        artifacts[name] = report.summary()
        notes += [f"{name}: {note}" for note in report.notes]
    return Measurement({"per_model": per}, artifacts, tuple(names), tuple(notes))


def _run_moe_closure(ctx: Context, names: list[str]) -> Measurement:
    module = _coactivation()
    per, artifacts, notes = [], {}, []
    for name in names:
        ctx.say(f"route-conditional co-activation of {name}, its null, and closure on the discovery stratum")
        settings = module.CoactivationSettings(route_conditional=True, run_closure=True,
                                               n_controls=ctx.closure_controls, control_seed=ctx.control_seed)
        report = module.coactivation(ctx.ref(name), None, ctx.spec, settings, device=ctx.device, dtype=ctx.dtype)
        entry = _closure_entry(name, report, "on")
        entry.update(null_z=report.route.null.z_max, max_ari=report.route.statistic.max_ari,
                     null_mean=report.route.null.null_max_mean, null_std=report.route.null.null_max_std,
                     discovery_stratum=report.route.discovery_stratum, strata_sizes=list(report.route.sizes))
        per.append(entry)
        artifacts[name] = report.summary()
        notes += [f"{name}: {note}" for note in report.notes]
    return Measurement({"per_model": per}, artifacts, tuple(names), tuple(notes))


def _attribution_tasks(ctx: Context, tasks: Sequence[str]) -> dict:
    """{task: (summary, results)} for the tasks the preset has models for."""
    return {task: ctx.attribution(task) for task in tasks if preset_models(ctx.preset, task)}


def _run_rho_reverse(ctx: Context, names: list[str]) -> Measurement:
    summary, results = ctx.attribution("reverse")
    measured = {"task": "reverse", "rhos": list(summary.rhos), "rho_mean": summary.rho_mean, "rho_std": summary.rho_std,
                "n": summary.n_models, "skipped": [list(s) for s in summary.skipped]}
    return Measurement(measured, {"summaries": {"reverse": summary.to_json()},
                                  "results": [r.to_json() for r in results[:1]]}, summary.models, _skip_notes(summary))


def _skip_notes(summary) -> tuple[str, ...]:
    return tuple(f"{name} skipped: {why}" for name, why in summary.skipped)


def _run_rho_sort(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    rev, srt = by_task["reverse"][0], by_task["sort"][0]
    measured = {"reverse_rho_mean": rev.rho_mean, "sort_rho_mean": srt.rho_mean, "n_reverse": rev.n_models,
                "n_sort": srt.n_models, "sort_rhos": list(srt.rhos), "reverse_rhos": list(rev.rhos)}
    return Measurement(measured, {"summaries": {t: s.to_json() for t, (s, _) in by_task.items()}},
                       rev.models + srt.models, _skip_notes(rev) + _skip_notes(srt))


def _run_spread(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    rhos = [r for summary, _ in by_task.values() for r in summary.rhos if r is not None]
    measured = {"rho_min": min(rhos) if rhos else None, "rho_max": max(rhos) if rhos else None, "n": len(rhos),
                "rhos": {t: list(s.rhos) for t, (s, _) in by_task.items()}}
    if not rhos:
        measured["undefined"] = "rho is undefined for every analysed model"
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    return Measurement(measured, {"summaries": {t: s.to_json() for t, (s, _) in by_task.items()}}, models)


def _run_layers(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    heroes: dict[str, int] = {}
    bloats: dict[str, int] = {}
    n = 0
    for summary, _ in by_task.values():
        n += summary.n_models
        for row in summary.per_layer:
            heroes[str(row["layer"])] = heroes.get(str(row["layer"]), 0) + int(row["heroes"])
            bloats[str(row["layer"])] = bloats.get(str(row["layer"]), 0) + int(row["bloats"])
    measured = {"heroes_per_layer": heroes, "bloats_per_layer": bloats, "n": n, "tasks": sorted(by_task)}
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    first = next(iter(by_task.values()))[1][:1]
    return Measurement(measured, {"per_layer": [{"layer": int(k), "heroes": heroes[k], "bloats": bloats.get(k, 0)}
                                                for k in sorted(heroes, key=int)],
                                  "results": [r.to_json() for r in first]}, models)


def _run_l3h3(ctx: Context, names: list[str]) -> Measurement:
    summary, _ = ctx.attribution("sort")
    counts = summary.counts("hero")
    return Measurement({"hero_count": counts.get("L3H3", 0), "n": summary.n_models, "hero_counts": counts},
                       {"summaries": {"sort": summary.to_json()}}, summary.models, _skip_notes(summary))


def _run_l1_bloats(ctx: Context, names: list[str]) -> Measurement:
    summary, _ = ctx.attribution("sort")
    counts = summary.counts("bloat")
    return Measurement({"bloat_counts": {c: counts.get(c, 0) for c in ("L1H1", "L1H3")}, "n": summary.n_models,
                        "all_bloat_counts": counts}, {"summaries": {"sort": summary.to_json()}}, summary.models,
                       _skip_notes(summary))


def _run_superadditive(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    parts = [r.joint_bloats for _, results in by_task.values() for r in results]
    defined = [p for p in parts if p.ratio_to_sum is not None]
    singles = [d for p in parts for d in p.single_damages]
    measured = {"n_models": len(parts), "n_with_ratio": len(defined),
                "ratio_to_sum_mean": float(np.mean([p.ratio_to_sum for p in defined])) if defined else None,
                "ratio_to_mean_mean": float(np.mean([p.ratio_to_mean for p in defined])) if defined else None,
                "joint_damage_mean": float(np.mean([p.joint_damage for p in defined])) if defined else None,
                "mean_single_damage": float(np.mean(singles)) if singles else None,
                "reasons": sorted({p.reason for p in parts if p.reason})}
    if not defined:
        measured["undefined"] = ("the joint/sum ratio is undefined for every model (" + "; ".join(measured["reasons"])
                                 + ")" if measured["reasons"] else "no model was analysed")
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    return Measurement(measured, {"joints": [p.to_json() for p in parts]}, models)


def _run_hero_cost(ctx: Context, names: list[str]) -> Measurement:
    summary, results = ctx.attribution("reverse")
    damages = [d for r in results for d in r.joint_heroes.single_damages]
    measured = {"n_models": len(results), "n_heroes": len(damages), "damages": damages,
                "mean": float(np.mean(damages)) if damages else None,
                "std": float(np.std(damages, ddof=0)) if damages else None}
    if not damages:
        measured["undefined"] = "no reversal model has a hidden hero"
    return Measurement(measured, {"results": [r.to_json() for r in results[:1]]}, summary.models, _skip_notes(summary))


RUNNERS: dict[str, Callable[[Context, list[str]], Measurement]] = {
    "spc-causal": _run_causal, "spc-seed-specific": _run_seed, "spc-timing": _run_timing,
    "spc-identifiable": _run_identifiable, "spc-data-shift": _run_shift, "spc-composition": _run_composition,
    "cvc-dense-closure": _run_dense_closure, "cvc-moe-wrong-direction": _run_moe_closure,
    "cvc-form-function": _run_form_function,
    "hhg-rho-reverse": _run_rho_reverse, "hhg-rho-sort": _run_rho_sort, "hhg-rho-spread": _run_spread,
    "hhg-layers": _run_layers, "hhg-l3h3-hero": _run_l3h3, "hhg-l1-bloats": _run_l1_bloats,
    "hhg-superadditive": _run_superadditive, "hhg-hero-cost": _run_hero_cost,
}


# ---------------------------------------------------------------------------------------------
# running claims, resumably


def _store_path(ctx: Context, claim_id: str) -> Path:
    return ctx.out / "measurements" / ctx.variant / f"{claim_id}.json"  # one per variant ("" adds no folder)


def _load_stored(path: Path, settings: dict) -> Optional[dict]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # unreadable: measure again
    return data if data.get("settings") == settings else None


def run_claim(claim: Claim, ctx: Context, force: bool = False) -> tuple[Claim, dict]:
    """Measure (or reuse) one claim and judge it; returns the claim with its result and the measurement's
    artifacts (what its figures are drawn from; {} when nothing was measured)."""
    claim = replace(claim, variant=ctx.variant)
    if not claim.testable_on(ctx.preset):
        verdict = NEEDS_PAPER if ctx.preset != "paper" else f"{NOT_RUN}: the paper preset has no models for it"
        return replace(claim, verdict=verdict, measured=None, measured_text=verdict), {}
    names = claim.uses(ctx.preset)
    started = time.perf_counter()
    try:
        _require_trained(names, ctx.preset)
        settings = {**ctx.settings(), "version": MEASUREMENT_VERSION, "models": [model_key(n) for n in names]}
        path = _store_path(ctx, claim.id)
        stored = None if (force or ctx.force) else _load_stored(path, settings)
        if stored is not None:
            measurement = Measurement(stored["measured"], stored["artifacts"], tuple(stored["models"]),
                                      tuple(stored.get("notes", ())))
            seconds, reused = stored.get("seconds"), True
        else:
            ctx.say(f"measuring {claim.id}")
            measurement = RUNNERS[claim.id](ctx, list(names))
            seconds, reused = round(time.perf_counter() - started, 2), False
            atomic_write_json(path, {"settings": settings, "measured": measurement.measured,
                                     "artifacts": measurement.artifacts, "models": list(measurement.models),
                                     "notes": list(measurement.notes), "seconds": seconds})
    except (NotRun, HeadLabError) as exc:  # a model not trained, or a problem on these models: said in the report
        verdict = f"{NOT_RUN}: {exc}"
        return replace(claim, verdict=verdict, measured=None, measured_text=verdict, settings=ctx.settings(),
                       seconds=round(time.perf_counter() - started, 2)), {}
    measured = measurement.measured
    verdict = claim.judge(measured)
    text = verdict if measured.get("undefined") else claim.describe(measured)
    result = replace(claim, verdict=verdict, measured=measured, measured_text=text, models=measurement.models,
                     seeds={n: _seed_of(n) for n in measurement.models}, settings=settings, notes=measurement.notes,
                     seconds=seconds, reused=reused)
    return result, measurement.artifacts
