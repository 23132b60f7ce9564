"""Benchmark: the ablation lab's click, recording its own clean run vs from the clean run kept between clicks.

`python -m core bench live` loads a zoo model (default the quick zoo's induction-neox, its final
checkpoint), builds the lab's default probe (induction, N = 256, T = 64) and runs the lab's study
(default L1H1, L1H3, L1H6 against 20 matched controls + the upper bound), alternating: a study that
records its own clean run (a first click on a checkpoint) and one from a kept clean run (CleanRuns,
recorded once before: every later click). Each repeat uses a new control seed, as a user's fresh
click would. It reports when the candidate arrives and when the study ends, their medians and ratios,
and whether both give the same numbers. These are the study's times, not the browser's.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from core.ablation.clean_run import CleanRuns
from core.ablation.engine import run_conditions
from core.ablation.study import AblationSettings, ablation_study
from core.heads import parse_heads
from core.model.hooks import model_shape
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.refs import ModelRef, resolve_checkpoint
from core.stats.inference import METRICS
from core.tasks.specs import probe_spec
from core.threads import apply_thread_policy

WAYS = ("own_clean_run", "kept_clean_run")


def _same_numbers(a, b) -> bool:
    """Whether two AblationResults hold the same per-example metrics, condition for condition."""
    pairs = [(a.clean, b.clean), (a.candidate, b.candidate), *zip(a.controls, b.controls)]
    if a.upper_bound is not None:
        pairs.append((a.upper_bound, b.upper_bound))
    return all(np.array_equal(x.values(m), y.values(m)) for x, y in pairs for m in METRICS)


def bench_live(model: str = "induction-neox", revision: str | None = None, heads: str = "L1H1,L1H3,L1H6",
               n_controls: int = 20, n_examples: int = 256, seq_len: int = 64, repeats: int = 4,
               threads: int | None = None, device: str = "cpu", dtype: str = DEFAULT_DTYPE) -> dict:
    """Candidate and verdict times [s] of both ways over `repeats` alternating runs; medians and ratios."""
    if threads is None:
        apply_thread_policy()  # the lab chooses at the click, from the load since its page last ran; here, now
    else:
        torch.set_num_threads(int(threads))
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)
    loaded = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    n_layers, n_heads, _ = model_shape(loaded)
    selection = parse_heads(heads, n_layers, n_heads)
    batch = probe_spec("induction", n_examples, seq_len).build()
    kept = CleanRuns()
    t0 = time.perf_counter()
    run_conditions(loaded, batch, [], clean_runs=kept)
    record_s = time.perf_counter() - t0
    times: dict[str, dict[str, list[float]]] = {way: {"candidate": [], "verdict": []} for way in WAYS}
    identical = True
    for seed in range(int(repeats)):
        results = {}
        for way in WAYS:
            arrived: list[float] = []
            t0 = time.perf_counter()
            results[way] = ablation_study(
                loaded, batch, selection, AblationSettings(n_controls=n_controls, seed=seed),
                on_condition=lambda i, metrics, clean: arrived.append(time.perf_counter() - t0) if i == 0 else None,
                clean_runs=kept if way == "kept_clean_run" else None)
            times[way]["verdict"].append(time.perf_counter() - t0)
            times[way]["candidate"].append(arrived[0])
        identical &= _same_numbers(*results.values())
    median = {way: {what: statistics.median(v) for what, v in by.items()} for way, by in times.items()}
    return {
        "speedup_verdict_kept_vs_own": median["own_clean_run"]["verdict"] / median["kept_clean_run"]["verdict"],
        "speedup_candidate_kept_vs_own": median["own_clean_run"]["candidate"] / median["kept_clean_run"]["candidate"],
        "identical": identical, "median_s": median, "times_s": times, "record_clean_run_s": record_s,
        "model": ref.name, "revision": checkpoint.revision, "selection": str(selection), "n_controls": n_controls,
        "n_examples": n_examples, "seq_len": seq_len, "repeats": int(repeats), "threads": torch.get_num_threads(),
        "device": str(device), "dtype": dtype_name(dtype),
    }
