"""An ablation study fanned out over workers that hold the model (core/executor.py's WorkerPool).

Why: a study's conditions (the candidate, N matched-random controls, the upper bound) are
independent given the model and the probe batch, and on a CPU the study's time is their forwards.
An `AblationWorker` loads a checkpoint once and keeps it, so a pool of them (Ray actors, one per
core) answers study after study warm: only keys (model reference, revision, dtype, probe spec) and
the conditions travel to a worker; per-example metrics come back. Each call runs `run_conditions`
on a chunk of conditions (prefix reuse inside the worker, from the clean run it keeps), so every number
is the one the serial study computes, bit for bit on the CPU at the same torch thread count.

Chunks: the candidate alone first, so it arrives after one condition (and the clean run, on a worker
not yet warm: the app warms them before the click) and the app draws it at once; the rest dealt into
one contiguous chunk per worker, the last of them (taken next by the candidate's worker, the first to
be idle) one condition shorter. Each worker records its clean run once and keeps it (CleanRuns), so
the candidate's call is all the head start that worker has.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from core.ablation.clean_run import CleanRuns
from core.ablation.engine import AblationCancelled, run_conditions
from core.ablation.spec import Ablation, ConditionMetrics
from core.ablation.study import AblationResult, AblationSettings, ConditionFn, assemble_study, run_info, study_conditions
from core.executor import Executor, SweepFailed, WorkerPool
from core.heads import HeadSet
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.refs import ModelRef
from core.probe import probe_batch_for
from core.tasks.probe_file import ProbeFile
from core.tasks.specs import ProbeSpec, spec_from_json

NOTHING_STORED = "Nothing was stored: fix the cause and run the study again."  # a study's SweepFailed advice


@dataclass(frozen=True)
class AblationJob:
    """One call to a worker: `conditions` on checkpoint ref@revision in dtype, on the probe spec_json
    (canonical JSON of a ProbeSpec or a ProbeFile). Small: it travels through Ray's object store; a probe
    file's parsed records travel with it (probe_file), since a worker cannot rebuild them from a hash."""

    ref: ModelRef
    revision: str
    dtype: str
    spec_json: str
    conditions: tuple[Ablation, ...] = ()
    chunk_size: int | None = None
    probe_file: ProbeFile | None = None


class AblationWorker:
    """A worker's state: the checkpoint it loaded last (kept for the next study) and the last probe batch."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.loaded: tuple | None = None  # (ref, revision, dtype) of self.model
        self.model: Any = None
        self.batches: dict[str, Any] = {}
        self.clean_runs = CleanRuns()  # the last batch's clean run, for the next call on it

    def _prepare(self, job: AblationJob) -> tuple[Any, Any]:
        if self.loaded != (job.ref, job.revision, job.dtype):
            self.model, self.clean_runs = None, CleanRuns()  # free the last checkpoint before loading the next
            self.model = load_model(job.ref, job.revision, self.device, job.dtype)
            self.loaded = (job.ref, job.revision, job.dtype)
        if job.spec_json not in self.batches:
            probe = job.probe_file if job.probe_file is not None else spec_from_json(job.spec_json)
            self.batches = {job.spec_json: probe_batch_for(probe, self.model)}
        return self.model, self.batches[job.spec_json]

    def describe(self, job: AblationJob) -> dict:
        """run_info of the job's model and batch (loading them if needed)."""
        return run_info(*self._prepare(job))

    def warm(self, job: AblationJob) -> None:
        """Load the job's model and batch, and record their clean run (kept for the studies that follow)."""
        model, batch = self._prepare(job)
        run_conditions(model, batch, [], clean_runs=self.clean_runs)

    def run(self, job: AblationJob) -> tuple[ConditionMetrics, list[ConditionMetrics], list[str]]:
        """(clean, [metrics of each of job.conditions], the engine's notes)."""
        model, batch = self._prepare(job)
        notes: list[str] = []
        clean, results = run_conditions(model, batch, job.conditions, chunk_size=job.chunk_size, notes=notes,
                                        clean_runs=self.clean_runs)
        return clean, results, notes


def ablation_workers(executor: Executor, n: int | None = None, device: str = "cpu", num_cpus: float = 1.0,
                     threads: int = 1) -> WorkerPool:
    """n AblationWorkers on `executor` (default: one per CPU it has), none holding a model yet.

    num_cpus: what each holds on a Ray cluster while it lives (0: none, for workers kept idle between
    studies that should not block other Ray tasks); threads: torch threads per worker.
    """
    return executor.workers(AblationWorker, (device,), n, num_cpus=num_cpus, threads=threads)


def _job(ref: ModelRef, revision: str, spec: ProbeSpec | ProbeFile, dtype: str) -> AblationJob:
    return AblationJob(ref, revision, dtype_name(dtype), json.dumps(spec.to_json(), sort_keys=True),
                       probe_file=spec if isinstance(spec, ProbeFile) else None)


def _describe(workers: WorkerPool, key: AblationJob) -> dict:
    """run_info from one worker (which loads the checkpoint and builds the batch if it has not yet)."""
    try:
        return dict(workers.map("describe", [key]))[0]
    except SweepFailed as error:
        raise SweepFailed(error.failures, 1, NOTHING_STORED) from error


def warm_workers(workers: WorkerPool, ref: ModelRef, revision: str, spec: ProbeSpec | ProbeFile, dtype: str = DEFAULT_DTYPE) -> None:
    """Load the checkpoint, build the probe batch and record its clean run in every worker (idle workers each take one call)."""
    for _ in workers.map("warm", [_job(ref, revision, spec, dtype)] * workers.size):
        pass


def condition_chunks(n_conditions: int, n_workers: int) -> list[list[int]]:
    """Condition indexes per call: [0] (the candidate) alone, then the rest in n_workers contiguous chunks,
    the last one condition shorter (the candidate's worker takes it next); empty chunks dropped."""
    rest = list(range(1, n_conditions))
    share = (len(rest) + 1) / max(1, n_workers)
    cuts = [min(len(rest), math.ceil(share * k)) for k in range(1, n_workers)] + [len(rest)]
    chunks, low = [[0]], 0
    for high in cuts:
        if high > low:
            chunks.append(rest[low:high])
            low = high
    return chunks


def ablation_study_on(
    workers: WorkerPool,
    ref: ModelRef,
    revision: str,
    spec: ProbeSpec | ProbeFile,
    selection: HeadSet,
    settings: AblationSettings = AblationSettings(),
    *,
    dtype: str = DEFAULT_DTYPE,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_condition: ConditionFn | None = None,
) -> AblationResult:
    """`ablation_study` of checkpoint ref@revision (in dtype) on the probe `spec`, over `workers` (AblationWorkers).

    progress(done, total) counts conditions; on_condition as in ablation_study (the candidate first);
    cancel() is asked as each chunk comes back (chunks already running finish on their workers).
    SweepFailed names a chunk that failed twice.
    """
    key = _job(ref, revision, spec, dtype)
    info = _describe(workers, key)
    conditions, sets = study_conditions(selection, info["n_layers"], info["n_heads"], settings)
    chunks = condition_chunks(len(conditions), workers.size)
    jobs = [replace(key, conditions=tuple(conditions[i] for i in chunk), chunk_size=settings.chunk_size) for chunk in chunks]
    names = [f"ablation {ref.name}@{revision} conditions {chunk[0]}-{chunk[-1]}" for chunk in chunks]
    clean, results, notes, done = None, [None] * len(conditions), {}, 0
    unannounced: list[int] = []  # measured, not yet handed to on_condition: they wait for the candidate
    calls = workers.map("run", jobs, names)
    try:
        for k, (chunk_clean, chunk_results, chunk_notes) in calls:
            clean = chunk_clean if clean is None else clean  # every chunk's clean run is the same computation
            notes.update(dict.fromkeys(chunk_notes))
            for i, metrics in zip(chunks[k], chunk_results):
                results[i] = metrics
            unannounced += chunks[k]
            if on_condition is not None and results[0] is not None:
                for i in sorted(unannounced, key=lambda i: i != 0):  # the candidate first, then in arrival order
                    on_condition(i, results[i], clean)
                unannounced = []
            done += len(chunk_results)
            if progress is not None:
                progress(done, len(conditions))
            if cancel is not None and cancel():
                raise AblationCancelled("the ablation run was cancelled; start it again to get results.")
    except SweepFailed as error:
        raise SweepFailed(error.failures, len(jobs), NOTHING_STORED) from error
    finally:
        calls.close()
    return assemble_study(settings, sets, clean, results, list(notes), info)
