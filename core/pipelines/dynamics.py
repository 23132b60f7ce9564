"""Circuits over training, run on models: PR and membership trajectories over checkpoints, the
cross-seed ablation matrix, a data shift, and form (selectivity) against function (closure).

METHODS.md, "Claims worth reproducing on small models": [SPC] predictive timing, identifiability
from a small fraction of the training tokens, seed specificity, stability under a data shift;
[CVC] form and function decouple over training. The pure functions these drivers feed are in
core/stats/dynamics.py; the drivers run models only through the recipe's cached HeadStats and the
ablation engine.

Choices fixed here (named in every result):
- Membership selectivity is the recipe's: induction selectivity against the uniform baseline
  1/(q+1), at the threshold `core.pipelines.recipe.scaled_induction_threshold` (50x at T = 256, scaled to the
  probe length) unless a threshold is given. "Reaches the threshold" is >=, as the recipe's.
- "The recipe run on checkpoints up to t" returns the heads at or above the membership threshold
  at checkpoint t (`ScreenReport.candidate_circuit` of a screen truncated at t: Step 1's PR-integral
  ranks heads but does not change the candidate). Its fraction of training is tokens[t] / tokens[-1].
- Cross-seed cells ablate seed A's circuit in model B against matched-random controls drawn in B
  (same layers and counts, disjoint from A's circuit); when A's circuit holds more than half of a
  layer no matched control exists, and the cell uses any-layer controls and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from core.ablation.study import AblationSettings, ablation_study
from core.errors import HeadLabError
from core.executor import Executor, Task
from core.heads import Head, HeadSet, parse_heads
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_config, load_model
from core.model.refs import list_checkpoints, list_zoo, read_manifest
from core.pipelines.recipe import scaled_induction_threshold, screen_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import check_probe_fits, head_stats
from core.stats.dynamics import (
    DEFAULT_MARGIN,
    FORM_FUNCTION_LABELS,
    HeadTiming,
    Identification,
    cell_summary,
    circuits_by_checkpoint,
    earliest_identifying_checkpoint,
    form_function_labels,
    jaccard,
    seed_specificity,
    timing_events,
)
from core.stats.spectral import pr_per_head
from core.tasks import InductionProbeSpec
from core.workspace import atomic_write_json

ProgressFn = Callable[[int, int, str], None]  # (done, total, what)


# ---------------------------------------------------------------------------------------------
# trajectories over training (through the recipe's HeadStats cache)


@dataclass(frozen=True, eq=False)
class Trajectories:
    """PR and induction-membership selectivity of every head at every checkpoint of one model.

    pr: [checkpoint, layer, head] (definition named); membership: [checkpoint, layer, head], induction
    selectivity against the uniform baseline; tokens, revisions: [checkpoint], sorted by tokens.
    """

    model: str
    probe_spec: dict
    revisions: tuple[str, ...]
    tokens: tuple[float, ...]
    pr: np.ndarray
    membership: np.ndarray
    induction_threshold: float
    definition: str = "entropy"

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.pr.shape[1]), int(self.pr.shape[2])

    @property
    def circuits(self) -> tuple[HeadSet, ...]:
        return circuits_by_checkpoint(self.membership, self.induction_threshold)

    @property
    def final_circuit(self) -> HeadSet:
        return self.circuits[-1]

    def identification(self) -> Identification:
        return earliest_identifying_checkpoint(self.tokens, self.circuits)

    def timing(self, heads: Iterable[Head] | None = None, margin: float = DEFAULT_MARGIN) -> tuple[HeadTiming, ...]:
        heads = self.final_circuit if heads is None else heads
        return timing_events(self.tokens, self.pr, self.membership, heads, self.induction_threshold, margin)

    def to_json(self) -> dict:
        return {"model": self.model, "probe_spec": self.probe_spec, "revisions": list(self.revisions),
                "tokens": list(self.tokens), "pr": self.pr.tolist(), "membership": self.membership.tolist(),
                "induction_threshold": self.induction_threshold, "definition": self.definition,
                "membership_baseline": "uniform"}

    @classmethod
    def from_json(cls, data: dict | str) -> "Trajectories":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(data["model"], dict(data["probe_spec"]), tuple(data["revisions"]),
                   tuple(float(t) for t in data["tokens"]), np.asarray(data["pr"], dtype=np.float64),
                   np.asarray(data["membership"], dtype=np.float64), float(data["induction_threshold"]),
                   data.get("definition", "entropy"))


def _induction_spec(spec: Any) -> None:
    if not isinstance(spec, InductionProbeSpec):
        raise HeadLabError("training dynamics need the synthetic induction probe (its p+1 target); pick task 'induction'.")


def training_trajectories(ref: Any, spec: Any, definition: str = "entropy", induction_threshold: Optional[float] = None,
                          device: str = "cpu", progress: Optional[ProgressFn] = None,
                          dtype: str = DEFAULT_DTYPE, executor: Optional[Executor] = None) -> Trajectories:
    """PR and membership selectivity of every head at every checkpoint (one cached pass per checkpoint, in `dtype`).

    executor: when given, the passes the cache lacks run first as one sweep on it."""
    _induction_spec(spec)
    checkpoints = list_checkpoints(ref)
    check_probe_fits(spec, load_config(ref, checkpoints[-1].revision))
    if executor is not None:
        probe_sweep([SweepItem(ref, c) for c in checkpoints], spec, executor, device=device, dtype=dtype)
    batch = spec.build()
    threshold = scaled_induction_threshold(batch.query_pos) if induction_threshold is None else float(induction_threshold)
    pr, member = [], []
    for i, ckpt in enumerate(checkpoints):
        stats = head_stats(ref, ckpt, batch, device=device, dtype=dtype)
        pr.append(pr_per_head(stats.z_query, definition))  # [layer, head]
        member.append(screen_checkpoint(stats, induction_threshold=threshold, n_null_draws=0).membership)  # [layer, head]
        if progress:
            progress(i + 1, len(checkpoints), ckpt.revision)
    return Trajectories(ref.name, dict(batch.spec), tuple(c.revision for c in checkpoints),
                        tuple(float(c.tokens) for c in checkpoints), np.stack(pr), np.stack(member), threshold,
                        definition)


# ---------------------------------------------------------------------------------------------
# cross-seed ablation


@dataclass(frozen=True)
class CrossSeedMatrix:
    """cells[a][b]: circuit of models[a] ablated in models[b] (cell_summary), or None with reasons[a][b]."""

    models: tuple[str, ...]
    circuits: tuple[str, ...]  # "L1H1,L1H2" per model (its final circuit)
    cells: tuple[tuple[Optional[dict], ...], ...]
    reasons: tuple[tuple[str, ...], ...]
    settings: dict = field(default_factory=dict)

    def specificity(self, metric: str = "loss") -> dict:
        return seed_specificity(self.cells, metric)

    def to_json(self) -> dict:
        return {"models": list(self.models), "circuits": list(self.circuits),
                "cells": [list(row) for row in self.cells], "reasons": [list(r) for r in self.reasons],
                "settings": self.settings, "specificity": self.specificity()}

    @classmethod
    def from_json(cls, data: dict | str) -> "CrossSeedMatrix":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(tuple(data["models"]), tuple(data["circuits"]), tuple(tuple(r) for r in data["cells"]),
                   tuple(tuple(r) for r in data["reasons"]), dict(data.get("settings", {})))


def final_circuit(ref: Any, spec: Any, induction_threshold: Optional[float] = None, device: str = "cpu",
                  dtype: str = DEFAULT_DTYPE) -> HeadSet:
    """The recipe's candidate circuit at the final checkpoint (membership >= threshold)."""
    _induction_spec(spec)
    checkpoint = list_checkpoints(ref)[-1]
    check_probe_fits(spec, load_config(ref, checkpoint.revision))
    stats = head_stats(ref, checkpoint, spec, device=device, dtype=dtype)
    return screen_checkpoint(stats, induction_threshold=induction_threshold, n_null_draws=0).induction_heads


def ablate_with_controls(model: Any, batch: Any, selection: HeadSet, n_controls: int, seed: int, mode: str = "zero",
                         device: str = "cpu", include_upper_bound: bool = True):
    """ablation_study with matched-random controls, falling back to any-layer controls (noted) when
    the selection holds more than half of a layer."""
    matched = AblationSettings(n_controls=n_controls, controls="matched", mode=mode, seed=seed,
                               include_upper_bound=include_upper_bound)
    try:
        return ablation_study(model, batch, selection, matched, device=device)
    except HeadLabError as exc:
        if "more than half" not in str(exc):
            raise
        result = ablation_study(model, batch, selection, replace(matched, controls="any-layer"), device=device)
        return replace(result, notes=result.notes + (f"matched controls impossible ({exc}); used any-layer controls.",))


def _stored_cell(path: Optional[Path], settings: dict) -> Optional[dict]:
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("settings") == settings else None


MATRIX_MODE = "zero"  # the cross-seed matrix zero-ablates, as the reference [CVC]


def matrix_column(ref_b: Any, revision: str, spec: Any, circuits: Sequence[tuple[int, str]], own_circuit: str,
                  n_controls: int, seed: int, device: str, dtype: str,
                  model: Any = None) -> list[tuple[int, Optional[dict], str]]:
    """One column of the cross-seed matrix: each (row, circuit text) zero-ablated in target ref_b@revision.

    A unit of work on its own (loads the target once; keys in, cells out), so columns can fan out over an
    executor. Returns (row, cell or None, reason) per circuit. model: the loaded target, if the caller has it.
    """
    model = model if model is not None else load_model(ref_b, revision, device=device, dtype=dtype)
    batch = spec.build()
    own = parse_heads(own_circuit) if own_circuit else HeadSet.of(())
    out = []
    for row, text in circuits:
        circuit = parse_heads(text)
        try:
            circuit.validate(int(model.cfg.n_layers), int(model.cfg.n_heads))
            result = ablate_with_controls(model, batch, circuit, n_controls, seed, MATRIX_MODE, device)
            out.append((row, cell_summary(result, own), ""))
        except HeadLabError as exc:
            out.append((row, None, str(exc)))
    return out


def cross_seed_matrix(models: Sequence[Any], spec: Any, circuits: Optional[dict[str, HeadSet]] = None,
                      n_controls: int = 20, seed: int = 123, device: str = "cpu",
                      progress: Optional[ProgressFn] = None, store_dir: Optional[Path] = None,
                      dtype: str = DEFAULT_DTYPE, executor: Optional[Executor] = None) -> CrossSeedMatrix:
    """Zero-ablate every model's circuit in every model, each against matched-random controls in the target.

    models: ModelRefs; circuits: {model name: HeadSet} (default: each model's final circuit).
    store_dir: one JSON per cell, reused when its settings match, so a long run resumes (empty it to measure again).
    device, dtype: where and in which precision the models run (a cell's settings name a dtype other than float32).
    executor: a Ray executor computes the missing cells one task per target model (matrix_column: it loads
    the target once); None or serial: here, column by column.
    """
    mode = MATRIX_MODE  # spec: the probe the cells ablate on; a circuit not given is found on it (final_circuit: induction)
    refs = list(models)
    if not refs:
        raise HeadLabError("the cross-seed matrix needs at least one model; pick induction models.")
    names = [r.name for r in refs]
    if len(set(names)) != len(names):
        raise HeadLabError("a model appears twice in the cross-seed matrix; list each model once.")
    circuits = dict(circuits or {})
    for ref in refs:
        if ref.name not in circuits:
            circuits[ref.name] = final_circuit(ref, spec, device=device, dtype=dtype)
    batch = spec.build()
    settings = {"probe_spec": dict(batch.spec), "n_controls": int(n_controls), "control_seed": int(seed), "mode": mode}
    if dtype_name(dtype) != DEFAULT_DTYPE:  # float32 cells keep the settings they were stored with
        settings["dtype"] = dtype_name(dtype)
    n = len(refs)
    cells: list[list[Optional[dict]]] = [[None] * n for _ in range(n)]
    reasons = [[""] * n for _ in range(n)]
    done, total = 0, n * n
    columns: list[tuple[int, str, list[tuple[int, str]]]] = []  # (target, its final revision, rows to compute)
    where: dict[tuple[int, int], tuple[Optional[Path], dict]] = {}  # (row, target) -> where the cell is stored
    for b, ref_b in enumerate(refs):
        final_b = list_checkpoints(ref_b)[-1].revision
        missing = []
        for a, ref_a in enumerate(refs):
            circuit = circuits[ref_a.name]
            cell_settings = {**settings, "source": ref_a.name, "target": ref_b.name, "revision": final_b,
                             "circuit": str(circuit), "own_circuit": str(circuits[ref_b.name])}
            path = None if store_dir is None else Path(store_dir) / f"{ref_a.name}__in__{ref_b.name}.json"
            stored = _stored_cell(path, cell_settings)
            if stored is not None:
                cells[a][b], reasons[a][b] = stored["cell"], stored["reason"]
            elif len(circuit) == 0:
                reasons[a][b] = f"{ref_a.name} has no circuit (no head reaches the membership threshold)."
            else:
                missing.append((a, str(circuit)))
                where[(a, b)] = (path, cell_settings)
                continue
            done += 1
            if progress:
                progress(done, total, f"{ref_a.name} in {ref_b.name}")
        if missing:
            columns.append((b, final_b, missing))

    def column_args(b: int, final_b: str, missing: list) -> tuple:
        return (refs[b], final_b, spec, missing, str(circuits[names[b]]), n_controls, seed, device, dtype)

    def here():  # one cell at a time, so each is stored as soon as it is measured (a long run resumes)
        for k, (b, final_b, missing) in enumerate(columns):
            model = load_model(refs[b], final_b, device=device, dtype=dtype)
            for row in missing:
                yield k, matrix_column(*column_args(b, final_b, [row]), model=model)

    if executor is None or executor.backend == "serial":
        results = here()
    else:
        tasks = [Task(f"cross-seed column {names[b]}", matrix_column, column_args(b, final_b, missing))
                 for b, final_b, missing in columns]
        results = executor.results(tasks)
    for k, column_cells in results:
        b = columns[k][0]
        for a, cell, reason in column_cells:
            cells[a][b], reasons[a][b] = cell, reason
            path, cell_settings = where[(a, b)]
            if path is not None:
                atomic_write_json(path, {"settings": cell_settings, "cell": cell, "reason": reason})
            done += 1
            if progress:
                progress(done, total, f"{names[a]} in {names[b]}")
    return CrossSeedMatrix(tuple(names), tuple(str(circuits[nm]) for nm in names),
                           tuple(tuple(r) for r in cells), tuple(tuple(r) for r in reasons), settings)


# ---------------------------------------------------------------------------------------------
# data shift


@dataclass(frozen=True)
class DataShift:
    """Circuit membership of a base model and of its continuation on another distribution.

    jaccards: [checkpoint of the shifted run] Jaccard(shifted circuit at t, base final circuit).
    """

    base: str
    shifted: str
    base_circuit: HeadSet
    shifted_circuit: HeadSet
    jaccard: float
    tokens: tuple[float, ...]
    revisions: tuple[str, ...]
    jaccards: tuple[float, ...]
    induction_threshold: float

    def to_json(self) -> dict:
        return {"base": self.base, "shifted": self.shifted, "base_circuit": str(self.base_circuit),
                "shifted_circuit": str(self.shifted_circuit), "jaccard": self.jaccard, "tokens": list(self.tokens),
                "revisions": list(self.revisions), "jaccards": list(self.jaccards),
                "induction_threshold": self.induction_threshold}

    @classmethod
    def from_json(cls, data: dict) -> "DataShift":
        def heads(text: str) -> HeadSet:
            return parse_heads(text) if text else HeadSet()

        return cls(data["base"], data["shifted"], heads(data["base_circuit"]), heads(data["shifted_circuit"]),
                   float(data["jaccard"]), tuple(data["tokens"]), tuple(data["revisions"]), tuple(data["jaccards"]),
                   float(data["induction_threshold"]))


def data_shift_jaccard(base: Trajectories, shifted: Trajectories) -> DataShift:
    """Jaccard of the base model's final circuit with the shifted model's (final, and at each checkpoint).

    Both trajectories must use one membership threshold and one model shape.
    """
    if base.shape != shifted.shape:
        raise HeadLabError(f"{base.model} {base.shape} and {shifted.model} {shifted.shape} differ in shape; "
                           "pick a shifted model continued from the base model.")
    if not math.isclose(base.induction_threshold, shifted.induction_threshold):
        raise HeadLabError("the two models were screened at different membership thresholds; screen both with one probe.")
    reference = base.final_circuit
    circuits = shifted.circuits
    return DataShift(base.model, shifted.model, reference, circuits[-1], jaccard(reference, circuits[-1]),
                     shifted.tokens, shifted.revisions, tuple(jaccard(reference, c) for c in circuits),
                     base.induction_threshold)


def continued_from(name: str) -> Optional[str]:
    """The zoo model `name` was continued from (its manifest's train.init_from), else None."""
    try:
        return _init_from(read_manifest(name))
    except HeadLabError:
        return None


def _init_from(manifest: dict) -> Optional[str]:
    return ((manifest.get("config") or {}).get("train") or {}).get("init_from")


def _architecture(manifest: dict) -> tuple:
    """What makes two zoo models the same network: the family and every set value of the model config."""
    model = (manifest.get("config") or {}).get("model") or {}
    return manifest.get("family"), tuple(sorted((k, json.dumps(v)) for k, v in model.items() if v is not None))


def zoo_manifests() -> dict[str, dict]:
    """Every readable zoo manifest, by model name (an unreadable one is left out)."""
    out = {}
    for name in list_zoo():
        try:
            out[name] = read_manifest(name)
        except HeadLabError:
            continue
    return out


def seed_peers(name: str, manifests: Mapping[str, dict]) -> list[str]:
    """Other seeds of zoo model `name`: the same task and architecture, trained from scratch (no init_from)."""
    own = manifests.get(name)
    if own is None:
        return []
    key = (own.get("task"), _architecture(own))
    return sorted(m for m, manifest in manifests.items()
                  if m != name and _init_from(manifest) is None and (manifest.get("task"), _architecture(manifest)) == key)


def continuations(name: str, manifests: Mapping[str, dict]) -> list[str]:
    """The zoo models trained on from `name`'s weights (their train.init_from), e.g. on other data."""
    return sorted(m for m, manifest in manifests.items() if _init_from(manifest) == name)


# ---------------------------------------------------------------------------------------------
# form vs function over training [CVC]


@dataclass(frozen=True)
class FormFunction:
    """The circuit's selectivity (form) and its closure damage (function) at every checkpoint.

    form_score: [checkpoint] mean membership selectivity of the circuit's heads; form: >= threshold.
    cells: [checkpoint] cell_summary of ablating the circuit against controls at that checkpoint;
    function: the closure verdict (rule named) is "pass".
    """

    model: str
    circuit: HeadSet
    revisions: tuple[str, ...]
    tokens: tuple[float, ...]
    form_score: tuple[float, ...]
    cells: tuple[dict, ...]
    induction_threshold: float
    settings: dict

    @property
    def form(self) -> tuple[bool, ...]:
        return tuple(bool(s >= self.induction_threshold) for s in self.form_score)

    @property
    def function(self) -> tuple[bool, ...]:
        return tuple(c.get("closure_verdict") == "pass" for c in self.cells)

    @property
    def labels(self) -> tuple[str, ...]:
        return form_function_labels(self.form, self.function)

    def counts(self) -> dict[str, int]:
        labels = self.labels
        return {name: int(sum(label == name for label in labels)) for name in FORM_FUNCTION_LABELS}

    def to_json(self) -> dict:
        return {"model": self.model, "circuit": str(self.circuit), "revisions": list(self.revisions),
                "tokens": list(self.tokens), "form_score": list(self.form_score), "cells": list(self.cells),
                "induction_threshold": self.induction_threshold, "settings": self.settings,
                "form": list(self.form), "function": list(self.function), "labels": list(self.labels),
                "counts": self.counts()}

    @classmethod
    def from_json(cls, data: dict) -> "FormFunction":
        return cls(data["model"], parse_heads(data["circuit"]), tuple(data["revisions"]),
                   tuple(float(t) for t in data["tokens"]), tuple(float(s) for s in data["form_score"]),
                   tuple(data["cells"]), float(data["induction_threshold"]), dict(data["settings"]))


def form_vs_function(ref: Any, circuit: HeadSet, spec: Any, trajectories: Optional[Trajectories] = None,
                     n_controls: int = 5, seed: int = 123, device: str = "cpu",
                     progress: Optional[ProgressFn] = None, revisions: Optional[Sequence[str]] = None,
                     dtype: str = DEFAULT_DTYPE) -> FormFunction:
    """Closure damage of `circuit` against selectivity at every checkpoint [CVC developmental test].

    At each checkpoint the circuit is zero-ablated against n_controls matched-random sets (reference:
    5) and judged by the paper closure rule (every delta damaging, z_logit < -1.8); its form score is
    the mean membership selectivity of its heads there. revisions: only these checkpoints (default all).
    device, dtype: where and in which precision the checkpoints run.
    """
    mode = "zero"  # as the reference [CVC]; a mode parameter would take this signature past ten
    circuit = circuit if isinstance(circuit, HeadSet) else HeadSet(tuple(circuit))
    if len(circuit) == 0:
        raise HeadLabError("the circuit is empty; pick heads (e.g. the final induction circuit) to follow over training.")
    traj = trajectories or training_trajectories(ref, spec, device=device, dtype=dtype)
    circuit.validate(*traj.shape)
    batch = spec.build()
    if revisions is None:
        picked = list(range(len(traj.revisions)))
    else:
        unknown = [r for r in revisions if r not in traj.revisions]
        if unknown or not revisions:
            raise HeadLabError(f"no checkpoint(s) {', '.join(unknown) or '(none given)'} in {traj.model}; "
                               "pick revisions the model has.")
        picked = [traj.revisions.index(r) for r in traj.revisions if r in set(revisions)]
    layers = [l for l, _ in circuit]
    heads = [h for _, h in circuit]
    form_score = traj.membership[picked][:, layers, heads].mean(axis=1)  # [picked checkpoint]
    cells = []
    for i, index in enumerate(picked):
        revision = traj.revisions[index]
        model = load_model(ref, revision, device=device, dtype=dtype)
        result = ablate_with_controls(model, batch, circuit, n_controls, seed, mode, device, include_upper_bound=False)
        cells.append(cell_summary(result))
        if progress:
            progress(i + 1, len(picked), revision)
    settings = {"probe_spec": dict(batch.spec), "n_controls": int(n_controls), "control_seed": int(seed), "mode": mode,
                "closure_rule": "paper: every delta damaging and z_target_logit < -1.8",
                "form": f"mean membership selectivity of the circuit >= {traj.induction_threshold:.3g}x (uniform baseline)"}
    if dtype_name(dtype) != DEFAULT_DTYPE:
        settings["dtype"] = dtype_name(dtype)
    return FormFunction(ref.name, circuit, tuple(traj.revisions[i] for i in picked), tuple(traj.tokens[i] for i in picked),
                        tuple(float(s) for s in form_score), tuple(cells), traj.induction_threshold, settings)
