"""Many checkpoints' instrumented passes at once: fill the HeadStats cache on the chosen executor.

`probe --all-checkpoints`, `screen`, the recipe, the dynamics page and the replications each need
one instrumented pass per checkpoint of one or more models. A sweep sends every pass the cache does
not hold yet as one task (core/executor.py) with keys only (model ref, checkpoint, probe spec,
dtype, device): the task loads that checkpoint once, runs the pass and writes the cache entry; the
pipelines then read the cache as before. Passes already cached are not dispatched, so a sweep
interrupted half-way recomputes nothing that finished, and a finished one is free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from core.executor import Executor, ProgressFn, SerialExecutor, Task
from core.model.loading import DEFAULT_DTYPE, load_config, parse_dtype
from core.model.memory import task_resources
from core.model.refs import Checkpoint, ModelRef, list_checkpoints
from core.probe import check_probe_fits, head_stats, head_stats_key
from core.store import has_entry
from core.tasks import ProbeBatch, ProbeSpec


@dataclass(frozen=True)
class SweepItem:
    """One checkpoint of one model: a unit of a probe sweep."""

    ref: ModelRef
    checkpoint: Checkpoint

    @property
    def name(self) -> str:
        return f"probe {self.ref.name}@{self.checkpoint.revision}"


def checkpoint_items(refs: Sequence[ModelRef]) -> list[SweepItem]:
    """Every checkpoint of every model, in order."""
    return [SweepItem(ref, checkpoint) for ref in refs for checkpoint in list_checkpoints(ref)]


def probe_checkpoint(ref: ModelRef, checkpoint: Checkpoint, spec: ProbeSpec | ProbeBatch, device: str, dtype: str,
                     chunk_size: Optional[int]) -> str:
    """A sweep's task: one checkpoint's pass into the cache; "computed", or "cached" if another run got there first."""
    status: list[str] = []
    head_stats(ref, checkpoint, spec, device=device, chunk_size=chunk_size, on_status=status.append, dtype=dtype)
    return status[0]


def probe_sweep(items: Sequence[SweepItem], spec: ProbeSpec | ProbeBatch, executor: Optional[Executor] = None,
                device: str = "cpu", dtype: str = DEFAULT_DTYPE, chunk_size: Optional[int] = None,
                threads: Optional[int] = None, progress: Optional[ProgressFn] = None) -> list[dict]:
    """Fill the HeadStats cache for every item; one row per item, in order.

    spec: a probe spec (each task builds its batch), or a built batch (a probe file's: it travels with
    the tasks, since a worker cannot rebuild it from a hash).

    Row: model, revision, step, tokens, key, status ("cached": in the cache before the sweep, not
    dispatched; "computed"). threads: torch threads per task (default 1 on Ray, where each task
    reserves one CPU; the process's own count on the serial executor). The same threads give
    bit-identical entries on both executors. SweepFailed names the checkpoints whose task failed twice.
    """
    executor = executor or SerialExecutor()
    spec_json = dict((spec if isinstance(spec, ProbeBatch) else spec.build()).spec)
    resources = {}  # ref -> (num_cpus, num_gpus): one model's checkpoints share its shape
    for ref in dict.fromkeys(item.ref for item in items):  # refuse a probe a model cannot take, before any work
        last = [item.checkpoint for item in items if item.ref == ref][-1]
        config = load_config(ref, last.revision)
        check_probe_fits(spec, config)
        resources[ref] = task_resources(config, parse_dtype(dtype), device)
    rows, tasks, where = [], [], []
    for item in items:
        key = head_stats_key(item.ref, item.checkpoint.revision, spec_json, dtype)
        row = {"model": item.ref.name, "revision": item.checkpoint.revision, "step": item.checkpoint.step,
               "tokens": item.checkpoint.tokens, "key": key, "status": "cached"}
        rows.append(row)
        if has_entry(key):
            continue
        num_cpus, num_gpus = resources[item.ref]
        task_threads = threads or (torch.get_num_threads() if executor.backend == "serial" else int(num_cpus))
        tasks.append(Task(item.name, probe_checkpoint, (item.ref, item.checkpoint, spec, device, dtype, chunk_size),
                          num_cpus=num_cpus, num_gpus=num_gpus, threads=task_threads))
        where.append(len(rows) - 1)
    for index, status in executor.results(tasks, progress):
        rows[where[index]]["status"] = "computed" if status == "computed" else "cached"
    return rows
