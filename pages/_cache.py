"""Every cache of the app over core: st.cache_* wrappers and the stores of long runs.

Data loads go through `st.cache_data` over core's disk cache, models through `st.cache_resource`.
Cache keys are plain strings and numbers: the model name, revision, the probe spec as canonical
JSON (`Workspace.spec_json`), the model's stamp (which changes when its files do) and the dtype the
models run in (`Workspace.dtype`).

Long runs (an ablation study, a closure test, an analysis) draw their progress and can be
cancelled, and a page must know whether a run exists before it offers the run's button; st.cache_*
can do neither, so they are kept in one process-wide store here (`stored_*` looks a run up,
`run_*` computes and stores it). Pages keep no results of their own. An ablation study runs on the
workspace's backend: here (serial) or on Ray workers kept warm between runs (`st.cache_resource`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import streamlit as st

from core.ablation.clean_run import CleanRuns, clean_run_key, fits_clean_run, forward_seconds
from core.ablation.engine import run_conditions
from core.ablation.study import (PROBE_SIZES, AblationResult, AblationSettings, ablate_alone, ablation_study,
                                 preview_result)
from core.ablation.workers import ablation_study_on, ablation_workers, warm_workers
from core.errors import HeadLabError
from core.executor import Executor, SerialExecutor, WorkerPool, make_executor, run_task
from core.heads import Head, HeadSet
from core.model.loading import DEFAULT_DTYPE, load_config, load_model
from core.model.refs import Checkpoint, ModelRef, cached_revisions, checkpoint_path, list_checkpoints, resolve_checkpoint
from core.pipelines.attribution import analyze_ref, stored_result
from core.pipelines.attribution_results import AttributionSettings
from core.pipelines.closure import closure_test
from core.pipelines.coactivation import CoactivationSettings, coactivation
from core.pipelines.dynamics import cross_seed_matrix, final_circuit, form_vs_function, training_trajectories
from core.pipelines.patching import PatchingReport, PatchPlan, patch_loaded
from core.pipelines.proposers import DISPOSER, proposers_vs_disposer
from core.pipelines.recipe import ScreenSettings, screen, screen_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import check_probe_fits, full_attention_pattern, head_stats, head_stats_key, probe_batch_for
from core.store import canonical_json, has_entry
from core.tasks.probe_file import ProbeFile
from core.tasks.specs import probe_spec, spec_from_json
from core.tasks.tokens import tokenizer_of_folder
from core.threads import ThreadChoice, apply_thread_policy, idle_thread_choice
from core.workspace import zoo_dir
from pages._state import Workspace

NULL_DRAWS = 200  # draws of the induction null (the noise floor), both probes
# a running study's preview is redrawn at most this often: a draw took 0.15-0.18 s (its strip figure
# 0.17 s of that, 0.07 s since it is built in one layout update), which the serial backend takes from the study,
# and the browser drawing it takes a core from the study's two threads for a moment (SmolLM2's float32 study at
# N = 8 reached its verdict on screen 0.7 s later with a preview every second than every 2.5 s: bench screen)
PREVIEW_SECONDS = 2.5
_WARM_REPORTS = "_warm_reports"  # session key: (model, probe, stamp) whose checkpoints are all measured


def model_stamp(model_name: str) -> str:
    """Changes when a model is retrained or a checkpoint folder appears or vanishes (cache key part).

    A hub model's stamp is what the local Hugging Face cache holds (revision=commit), so a
    download or a moved branch refreshes its checkpoint list and statistics.
    """
    try:
        ref = ModelRef.parse(model_name)
    except HeadLabError:
        return ""
    if ref.kind == "hub":
        return ",".join(f"{rev}={commit}" for rev, commit in sorted(cached_hub_revisions(ref.name).items()))
    root = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name)
    parts = []
    manifest = root / "manifest.json"
    if manifest.is_file():
        parts.append(str(manifest.stat().st_mtime_ns))
    checkpoints = root / "checkpoints"
    if checkpoints.is_dir():
        parts.append(",".join(sorted(os.listdir(checkpoints))))
    return "|".join(parts)


@st.cache_data(show_spinner=False, ttl=30)
def cached_hub_revisions(model_name: str) -> dict[str, str]:
    """Revision -> commit of a hub model in the local Hugging Face cache (a cache scan, redone every 30 s)."""
    return cached_revisions(model_name)


# ---------------------------------------------------------------------------------------------
# models, probes, head statistics, screens


@st.cache_resource(show_spinner="Loading model...", max_entries=4)
def cached_model(model_name: str, revision: str, stamp: str = "", dtype: str = DEFAULT_DTYPE):
    return load_model(ModelRef.parse(model_name), revision, dtype=dtype)


@st.cache_data(show_spinner=False)
def cached_checkpoints(model_name: str, stamp: str = "") -> tuple[Checkpoint, ...]:
    return tuple(list_checkpoints(ModelRef.parse(model_name)))


@st.cache_data(show_spinner="Reading the model's tokenizer...", max_entries=16)
def cached_tokenizer_spec(model_name: str, revision: str, stamp: str, task: str, n: int, seq_len: int, seed: int) -> str:
    """The JSON of a probe built from the model's own tokenizer (ioi; induction's ordinary tokens): a byte-level zoo
    model (no tokenizer files) gets the byte probe. Cached: reading a real tokenizer takes seconds."""
    ref = ModelRef.parse(model_name)
    tokenizer = tokenizer_of_folder(checkpoint_path(ref, revision), local=ref.kind != "hub", revision=revision)
    return canonical_json(probe_spec(task, n, seq_len, seed, None, None, tokenizer).to_json())


@st.cache_data(show_spinner=False, max_entries=16)
def cached_batch(spec_json: str):
    return spec_from_json(spec_json).build()


def check_fits(ws: Workspace) -> None:
    """Refuse a probe the model cannot read before any model is loaded."""
    check_probe_fits(ws.spec, load_config(ws.ref, ws.revision))


@st.cache_data(show_spinner="Measuring every head on the probe...", max_entries=32)
def cached_stats(model_name: str, revision: str, spec_json: str, stamp: str, dtype: str = DEFAULT_DTYPE):
    """HeadStats of one checkpoint (core's disk cache, else one instrumented pass in `dtype`)."""
    ref = ModelRef.parse(model_name)
    return head_stats(ref, resolve_checkpoint(ref, revision), cached_batch(spec_json), dtype=dtype)


@st.cache_data(show_spinner=False, max_entries=32)
def cached_checkpoint_screen(model_name: str, revision: str, spec_json: str, stamp: str, dtype: str = DEFAULT_DTYPE):
    """Step 2 at one checkpoint, with the induction null (so every checkpoint has its null floor)."""
    return screen_checkpoint(cached_stats(model_name, revision, spec_json, stamp, dtype), n_null_draws=NULL_DRAWS)


@st.cache_data(show_spinner="Screening every checkpoint...", max_entries=16)
def cached_report(model_name: str, spec_json: str, definition: str, k: float, stamp: str, dtype: str = DEFAULT_DTYPE):
    k_arg = int(k) if k >= 1 else float(k)
    return screen(ModelRef.parse(model_name), spec_from_json(spec_json),
                  ScreenSettings(k=k_arg, definition=definition, n_null_draws=NULL_DRAWS), dtype=dtype)


def forget_data() -> None:
    """Drop every cached data load: the zoo on disk changed (models trained)."""
    st.cache_data.clear()


def _measure_with_progress(ws: Workspace) -> None:
    """A checkpoint not in core's disk cache yet is measured here with a progress bar (a real model's pass takes
    minutes; Streamlit's Stop, or leaving the page, interrupts it at the next update), so the cached read after it
    is a disk hit."""
    batch = cached_batch(ws.spec_json)
    if has_entry(head_stats_key(ws.ref, ws.revision, dict(batch.spec), ws.dtype)):
        return
    n = int(batch.tokens.shape[0])
    bar = st.progress(0.0, text=f"Loading {ws.model_name} to measure every head on {n} examples...")
    model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)

    done = 0

    def show(finished: int) -> None:  # head_stats reports each chunk's examples (tqdm's update)
        nonlocal done
        done += finished
        bar.progress(min(done / max(n, 1), 1.0), text=f"Measuring every head of {ws.model_name}: {done}/{n} examples "
                     "(once, then cached on disk; Stop at the top right cancels)")

    head_stats(ws.ref, resolve_checkpoint(ws.ref, ws.revision), batch, model=model, dtype=ws.dtype, progress=show)
    bar.empty()


def checkpoint_stats(ws: Workspace):
    check_fits(ws)
    _measure_with_progress(ws)
    return cached_stats(ws.model_name, ws.revision, ws.spec_json, ws.stamp, ws.dtype)


def checkpoint_screen(ws: Workspace):
    check_fits(ws)
    _measure_with_progress(ws)
    return cached_checkpoint_screen(ws.model_name, ws.revision, ws.spec_json, ws.stamp, ws.dtype)


def screen_report(ws: Workspace, definition: str = "entropy", k: float = 0.18):
    """Steps 1-2 over every checkpoint; the first time, measures missing checkpoints with a progress bar."""
    check_fits(ws)
    marker = ("warm", ws.model_name, ws.spec_json, ws.stamp, ws.dtype)
    warmed = st.session_state.setdefault(_WARM_REPORTS, set())
    if marker not in warmed:
        executor = SerialExecutor() if ws.backend == "serial" else _executor_for_the_server(ws.backend)
        bar = st.progress(0.0, text="Measuring the checkpoints not cached yet (once; then cached on disk)...")

        def show(done: int, total: int, failed: int) -> None:
            bar.progress(done / max(total, 1), text=f"Measured {done}/{total} checkpoints on {ws.backend}"
                         + (f", {failed} failed" if failed else ""))

        probe_sweep([SweepItem(ws.ref, c) for c in ws.checkpoints], spec_from_json(ws.spec_json), executor,
                    dtype=ws.dtype, progress=show)
        bar.empty()
        warmed.add(marker)
    return cached_report(ws.model_name, ws.spec_json, definition, float(k), ws.stamp, ws.dtype)


@st.cache_data(show_spinner="Running the model once on the chosen examples...", max_entries=64)
def cached_full_pattern(model_name: str, revision: str, spec_json: str, layer: int, head: int,
                        examples: tuple[int, ...], stamp: str, dtype: str = DEFAULT_DTYPE) -> np.ndarray:
    """One head's full attention pattern on a few probe examples: [example, query, key]."""
    model = cached_model(model_name, revision, stamp, dtype)
    tokens = cached_batch(spec_json).tokens[list(examples)]  # [example, pos]
    return full_attention_pattern(model, tokens, layer)[:, head].numpy()  # [example, query, key]


# ---------------------------------------------------------------------------------------------
# co-activation and training dynamics


@st.cache_data(show_spinner="Fitting the Ising model and clustering |J|...", max_entries=16)
def cached_proposal(model_name: str, revision: str, spec_json: str, stamp: str, settings: CoactivationSettings,
                    dtype: str = DEFAULT_DTYPE):
    """The co-activation proposal (no ablation): core's pipeline with settings.run_closure False."""
    return coactivation(ModelRef.parse(model_name), revision, spec_from_json(spec_json), settings, dtype=dtype)


@st.cache_data(show_spinner="Reading every checkpoint's head statistics...", max_entries=16)
def cached_trajectories(model_name: str, spec_json: str, definition: str, stamp: str, dtype: str = DEFAULT_DTYPE,
                        backend: str = "serial"):
    """Every checkpoint's PR and membership; on the Ray backend the passes the cache lacks fan out first."""
    executor = None if backend == "serial" else _executor_for_the_server(backend)
    return training_trajectories(ModelRef.parse(model_name), spec_from_json(spec_json), definition, dtype=dtype,
                                 executor=executor)


# ---------------------------------------------------------------------------------------------
# long runs: one store for the server process


@st.cache_resource(show_spinner=False)
def _runs() -> dict:
    """Long runs of this server process, keyed by everything that determines them."""
    return {}


def _stored(key: tuple) -> Any:
    return _runs().get(key)


def _store(key: tuple, value: Any) -> Any:
    _runs()[key] = value
    return value


def _probe_json(ws: Workspace, probe_file: ProbeFile | None) -> str:
    """The lab's probe as canonical JSON: the workspace spec's, or the probe file's (its SHA-256 included)."""
    return ws.spec_json if probe_file is None else canonical_json(probe_file.to_json())


def _ablation_key(ws: Workspace, selection: HeadSet, settings: AblationSettings, probe_file: ProbeFile | None) -> tuple:
    return ("ablation", ws.model_name, ws.revision, _probe_json(ws, probe_file), ws.stamp, ws.dtype, str(selection),
            settings)


def stored_ablation(ws: Workspace, selection: HeadSet, settings: AblationSettings,
                    probe_file: ProbeFile | None = None) -> dict | None:
    """An ablation study already run: {"result", "seconds", "model", "revision", "probe", "batch"}, or None.
    probe_file: the study ran on its prompts (else on the workspace probe)."""
    return _stored(_ablation_key(ws, selection, settings, probe_file))


def _executor_for_the_server(backend: str) -> Executor:
    """make_executor(backend), called from a thread that lives as long as the server.

    Why: Streamlit runs each script run in a thread that ends with the run, and Ray ties the
    processes a local instance starts (its GCS and raylet) to the thread that started them (Linux's
    PR_SET_PDEATHSIG): started during a run, the instance is killed when that run ends.
    """
    made: dict[str, Any] = {}
    ready = threading.Event()

    def hold() -> None:
        try:
            made["executor"] = make_executor(backend)
        except Exception as error:  # noqa: BLE001 - handed to the caller below
            made["error"] = error
            return
        finally:
            ready.set()
        threading.Event().wait()  # never returns: Ray's processes live while this thread does

    threading.Thread(target=hold, name=f"headlab-{backend}", daemon=True).start()
    ready.wait()
    if "error" in made:
        raise made["error"]
    return made["executor"]


@st.cache_resource(show_spinner="Starting the Ray workers (once per server)...")
def cached_ablation_workers(backend: str) -> WorkerPool:
    """The ablation lab's workers on `backend`, one per CPU, kept warm between runs (each keeps the
    checkpoint it ran last). They reserve no CPU on the Ray instance: a reservation lasts a worker's
    life, and idle between studies they must not hold the cores other Ray tasks wait for."""
    return ablation_workers(_executor_for_the_server(backend), num_cpus=0)


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_clean_runs(model_name: str, revision: str, probe_json: str, stamp: str, dtype: str,
                      _disk_key: str | None = None) -> CleanRuns:
    """Where the serial lab keeps the clean run of a checkpoint's probe between clicks (the engine's CleanRuns):
    one per server process, shared by every browser session, and on disk under _disk_key (core's cache) for the
    next server."""
    return CleanRuns(disk_key=_disk_key)


def _lab_clean_runs(ws: Workspace, probe_file: ProbeFile | None, batch: Any) -> CleanRuns:
    """The lab's CleanRuns for this checkpoint and probe (keyed on disk like the probe cache)."""
    key = clean_run_key(ws.ref, ws.revision, dict(batch.spec), ws.dtype)
    return cached_clean_runs(ws.model_name, ws.revision, _probe_json(ws, probe_file), ws.stamp, ws.dtype, _disk_key=key)


@st.cache_resource(show_spinner="Timing one forward of this model...", max_entries=8)
def cached_forward_seconds(model_name: str, revision: str, stamp: str, dtype: str, seq_len: int) -> float:
    """Seconds one example of `seq_len` tokens takes through the model here: the best of two timed forwards of
    PROBE_SIZES[0] examples (the smallest probe a study batches), after a warm-up, at the threads a study gets on an
    otherwise idle machine (idle_thread_choice; torch's count is restored after). What the lab's time estimates
    multiply."""
    model = cached_model(model_name, revision, stamp, dtype)
    return run_task(forward_seconds, (model, seq_len), {"rows": PROBE_SIZES[0]}, idle_thread_choice().threads)


def lab_clean_run_kept(ws: Workspace, probe_file: ProbeFile | None = None) -> bool:
    """Whether the lab's clean run of this checkpoint and probe is kept (in this process or on disk)."""
    model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
    batch = _lab_batch(ws, probe_file)
    return _lab_clean_runs(ws, probe_file, batch).find(model, batch) is not None


@st.cache_resource(show_spinner=False, max_entries=4)
def cached_file_batch(model_name: str, revision: str, stamp: str, dtype: str, probe_json: str, _probe_file: ProbeFile):
    """probe_file's prompts tokenized by the model's tokenizer, once per file (probe_json names it by its SHA-256)."""
    return probe_batch_for(_probe_file, cached_model(model_name, revision, stamp, dtype))


def _lab_batch(ws: Workspace, probe_file: ProbeFile | None):
    """The lab's probe batch: the workspace probe's, or probe_file's prompts tokenized by the model's tokenizer."""
    if probe_file is None:
        return cached_batch(ws.spec_json)
    return cached_file_batch(ws.model_name, ws.revision, ws.stamp, ws.dtype, _probe_json(ws, probe_file), probe_file)


def prepare_ablation(ws: Workspace, probe_file: ProbeFile | None = None, max_seconds: float | None = None) -> None:
    """Before the click: load the workspace checkpoint and record the clean run of the lab's probe (the
    workspace's, or probe_file's prompts), here or in every Ray worker; milliseconds once they hold it.

    Serial: a clean run kept in this process or on disk is used; one that would not be kept (too large
    for CleanRuns) is not run here; with max_seconds, one estimated to take longer is left to the first
    ablation, which shows its progress and can be cancelled."""
    if ws.backend == "serial":
        model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
        batch = _lab_batch(ws, probe_file)
        clean_runs = _lab_clean_runs(ws, probe_file, batch)
        n, seq_len = int(batch.tokens.shape[0]), int(batch.tokens.shape[1])
        if clean_runs.find(model, batch) is None and fits_clean_run(model, n, seq_len):
            seconds = n * cached_forward_seconds(ws.model_name, ws.revision, ws.stamp, ws.dtype, seq_len)
            if max_seconds is None or seconds <= max_seconds:
                with st.spinner(f"Running the clean forward the ablations start from ({n} examples, about "
                                f"{seconds:.0f} s; then kept for every session and on disk)..."):
                    run_conditions(model, batch, [], clean_runs=clean_runs)
        return
    workers = cached_ablation_workers(ws.backend)
    with st.spinner("Loading the checkpoint into the Ray workers..."):
        warm_workers(workers, ws.ref, ws.revision, ws.spec if probe_file is None else probe_file, ws.dtype)


class _Previews:
    """A running study's previews for the page: the candidate's as soon as it is measured, then what
    has arrived, at most every PREVIEW_SECONDS, when a step of work ends (progress), never after the last."""

    def __init__(self, settings: AblationSettings, draw: Callable[[AblationResult], None] | None,
                 progress: Callable[[int, int], None] | None):
        self.settings, self.draw, self.user_progress = settings, draw, progress
        self.arrived: dict[int, Any] = {}  # on_condition index -> ConditionMetrics
        self.clean: Any = None
        self.drawn, self.last = 0, 0.0

    def condition(self, index: int, metrics: Any, clean: Any) -> None:
        self.arrived[index], self.clean = metrics, clean
        if index == 0:
            self._draw()

    def progress(self, done: int, total: int) -> None:
        if self.user_progress is not None:
            self.user_progress(done, total)
        due = time.perf_counter() - self.last >= PREVIEW_SECONDS
        if done < total and 0 in self.arrived and len(self.arrived) > self.drawn and due:
            self._draw()

    def _draw(self) -> None:
        if self.draw is not None:
            self.draw(preview_result(self.settings, self.clean, self.arrived))
        self.drawn, self.last = len(self.arrived), time.perf_counter()


def run_ablation(ws: Workspace, selection: HeadSet, settings: AblationSettings,
                 progress: Callable[[int, int], None] | None = None, cancel: Callable[[], bool] | None = None,
                 on_preview: Callable[[AblationResult], None] | None = None, probe_file: ProbeFile | None = None,
                 threads: ThreadChoice | None = None) -> dict:
    """Run (and store) the ablation study of `selection` on the workspace's backend; AblationCancelled
    when cancel() says so. on_preview(partial result): see _Previews (core's preview_result: no z yet).
    probe_file: ablate on its prompts (tokenized by the model's tokenizer) instead of the workspace probe.
    threads: the thread policy's choice made when Run was pressed (None: sample the load now)."""
    live = _Previews(settings, on_preview, progress)
    batch = _lab_batch(ws, probe_file)  # a probe file's: tokenized here (for the per-example table) and, on Ray, in each worker
    if ws.backend == "serial":
        model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
        clean_runs = _lab_clean_runs(ws, probe_file, batch)
        # threads for the load at the click, not the session's start (the browser drawing the page then is idle by the
        # click) nor now (this rerun has the browser drawing the page above the run)
        apply_thread_policy(choice=threads)
        start = time.perf_counter()
        result = ablation_study(model, batch, selection, settings, progress=live.progress,
                                cancel=cancel, on_condition=live.condition, clean_runs=clean_runs)
    else:
        workers = cached_ablation_workers(ws.backend)
        start = time.perf_counter()
        result = ablation_study_on(workers, ws.ref, ws.revision, ws.spec if probe_file is None else probe_file,
                                   selection, settings, dtype=ws.dtype, progress=live.progress, cancel=cancel,
                                   on_condition=live.condition)
    entry = {"result": result, "seconds": time.perf_counter() - start, "model": ws.model_name,
             "revision": ws.revision, "probe": _probe_json(ws, probe_file), "batch": batch}
    return _store(_ablation_key(ws, selection, settings, probe_file), entry)


def _single_key(ws: Workspace, head: Head) -> tuple:
    return ("single", ws.model_name, ws.revision, ws.spec_json, ws.stamp, ws.dtype, head)


def stored_single_ablation(ws: Workspace, head: Head):
    """(clean, ablated) ConditionMetrics of `head` ablated alone, or None."""
    return _stored(_single_key(ws, head))


def run_single_ablation(ws: Workspace, head: Head):
    """Ablate `head` alone on the probe (zero ablation) and store (clean, ablated)."""
    model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
    return _store(_single_key(ws, head), ablate_alone(model, cached_batch(ws.spec_json), head))


def _closure_key(ws: Workspace, heads: HeadSet, n_controls: int, control_seed: int, route: Any) -> tuple:
    strata = None if route is None else (route.strata, route.discovery_stratum)
    return ("closure", ws.model_name, ws.revision, ws.spec_json, ws.stamp, ws.dtype, str(heads), n_controls,
            control_seed, strata)


def stored_closure(ws: Workspace, heads: HeadSet, n_controls: int, control_seed: int, route: Any = None):
    """The ClosureTest of `heads` already run (route: the co-activation report's routing, or None)."""
    return _stored(_closure_key(ws, heads, n_controls, control_seed, route))


def run_closure(ws: Workspace, heads: HeadSet, n_controls: int, control_seed: int, route: Any = None,
                progress: Callable[[int, int], None] | None = None):
    """Run (and store) the closure test of `heads`; with routing, also on and off the discovery stratum."""
    on = None if route is None else [s == route.discovery_stratum for s in route.strata]
    test = closure_test(cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype), cached_batch(ws.spec_json), heads,
                        AblationSettings(n_controls=n_controls, seed=control_seed), on_stratum=on, progress=progress)
    return _store(_closure_key(ws, heads, n_controls, control_seed, route), test)


def _attribution_key(ws: Workspace, settings: AttributionSettings) -> tuple:
    return ("attribution", ws.model_name, ws.revision, ws.stamp, ws.dtype, settings)


def stored_attribution(ws: Workspace, settings: AttributionSettings) -> dict | None:
    """{"result", "how"} of an analysis run in this process, or of a zoo model's stored preset run; else None."""
    key = _attribution_key(ws, settings)
    entry = _stored(key)
    if entry is None and ws.ref.kind == "zoo":
        result = stored_result(ws.model_name, settings, ws.revision, ws.dtype)
        if result is not None:
            entry = _store(key, {"result": result, "how": "loaded from the stored preset run (reports/attribution)"})
    return entry


def run_attribution(ws: Workspace, settings: AttributionSettings,
                    progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Analyse the workspace model (gradient vs causal) and store {"result", "how", "seconds"}."""
    start = time.perf_counter()
    result = analyze_ref(ws.ref, settings, ws.revision, progress=progress, dtype=ws.dtype)
    seconds = time.perf_counter() - start
    entry = {"result": result, "how": f"analysed in {seconds:.1f} s", "seconds": seconds}
    return _store(_attribution_key(ws, settings), entry)


def _proposers_key(ws: Workspace, size: int, n_controls: int, controls: str) -> tuple:
    return ("proposers", ws.model_name, ws.revision, ws.spec_json, ws.stamp, ws.dtype, size, n_controls, controls)


def stored_proposers(ws: Workspace, size: int, n_controls: int, controls: str):
    """The ProposersReport already run with these settings, or None."""
    return _stored(_proposers_key(ws, size, n_controls, controls))


def run_proposers(ws: Workspace, size: int, n_controls: int, controls: str,
                  progress: Callable[[str], None] | None = None):
    """All four proposers and their closure tests (size 0: the screen circuit's size)."""
    disposer = replace(DISPOSER, n_controls=n_controls, controls=controls)
    report = proposers_vs_disposer(ws.ref, ws.revision, ws.spec, size or None, disposer, progress=progress,
                                   dtype=ws.dtype)
    return _store(_proposers_key(ws, size, n_controls, controls), report)


def _cross_seed_key(models: tuple[str, ...], spec_json: str, n_controls: int, dtype: str,
                    member_json: str | None = None) -> tuple:
    return ("cross-seed", models, spec_json, n_controls, dtype, tuple(model_stamp(m) for m in models), member_json)


def stored_cross_seed(models: tuple[str, ...], spec_json: str, n_controls: int, dtype: str = DEFAULT_DTYPE,
                      member_json: str | None = None):
    """The cross-seed ablation matrix of `models` already run, or None."""
    return _stored(_cross_seed_key(models, spec_json, n_controls, dtype, member_json))


def run_cross_seed(models: tuple[str, ...], spec_json: str, n_controls: int, dtype: str = DEFAULT_DTYPE,
                   backend: str = "serial", member_json: str | None = None):
    """Each model's final circuit ablated in each model (matched-random controls) on spec_json's probe, stored;
    member_json: the induction probe the circuits are found on when that is another (the IOI task's). On the Ray
    backend one task per target model."""
    executor = None if backend == "serial" else _executor_for_the_server(backend)
    circuits = None if member_json in (None, spec_json) else {
        m: final_circuit(ModelRef.parse(m), spec_from_json(member_json), dtype=dtype) for m in models}
    matrix = cross_seed_matrix([ModelRef.parse(m) for m in models], spec_from_json(spec_json), circuits,
                               n_controls=n_controls, dtype=dtype, executor=executor)
    return _store(_cross_seed_key(models, spec_json, n_controls, dtype, member_json), matrix)


def _form_function_key(ws: Workspace, circuit: HeadSet, n_controls: int, revisions: tuple[str, ...],
                       member_json: str | None = None) -> tuple:
    return ("form-function", ws.model_name, ws.spec_json, ws.stamp, ws.dtype, str(circuit), n_controls, revisions,
            member_json)


def stored_form_function(ws: Workspace, circuit: HeadSet, n_controls: int, revisions: tuple[str, ...],
                         member_json: str | None = None):
    """The form-vs-function test of `circuit` at `revisions` already run, or None."""
    return _stored(_form_function_key(ws, circuit, n_controls, revisions, member_json))


def run_form_function(ws: Workspace, circuit: HeadSet, n_controls: int, revisions: tuple[str, ...],
                      member_json: str | None = None):
    """The closure test of `circuit` on the workspace probe at each of `revisions` against its selectivity there
    (on member_json's induction probe when given: the IOI task's form is measured on induction), stored."""
    traj = cached_trajectories(ws.model_name, member_json or ws.spec_json, "entropy", ws.stamp, ws.dtype)
    ff = form_vs_function(ws.ref, circuit, ws.spec, traj, n_controls=n_controls, revisions=list(revisions),
                          dtype=ws.dtype)
    return _store(_form_function_key(ws, circuit, n_controls, revisions, member_json), ff)


def _patching_key(ws: Workspace, pairs: Any, settings: Any, plan: PatchPlan) -> tuple:
    # pairs.to_json() holds a probe file's SHA-256: another file (or an edited one) is another run
    return ("patching", ws.model_name, ws.revision, ws.stamp, ws.dtype, canonical_json(pairs.to_json()), settings, plan)


def stored_patching(ws: Workspace, pairs: Any, settings: Any, plan: PatchPlan) -> PatchingReport | None:
    """A patching report already run in this process for these pairs and settings, or None."""
    return _stored(_patching_key(ws, pairs, settings, plan))


def run_patching_report(ws: Workspace, pairs: Any, settings: Any, plan: PatchPlan,
                        progress: Callable[[str, int, int], None] | None = None) -> PatchingReport:
    """Patch the workspace checkpoint (the induction counterfactual or a probe file's pairs) and store the report."""
    model = cached_model(ws.model_name, ws.revision, ws.stamp, ws.dtype)
    report = patch_loaded(model, ws.model_name, ws.checkpoint, pairs, settings, plan, progress)
    return _store(_patching_key(ws, pairs, settings, plan), report)
