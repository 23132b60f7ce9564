"""Benchmark: attribution patching against activation patching over every head of a zoo model, same run.

`python -m core bench patch` loads a zoo model (default the quick zoo's induction-neox), builds the
induction probe's counterfactual (default N = 256, T = 64) and times, alternating, activation
patching of every head (one forward per head and chunk, from the head's own layer on: the base run's
blocks below it are replayed, core/ablation/patching/runs.py), the same with every patched run a full
forward (the baseline of that prefix reuse), and attribution patching (one forward and one backward per
chunk). It reports both speed-ups, the largest score difference between the two activation runs, and
the Spearman rank agreement of attribution with activation patching.
"""

from __future__ import annotations

import statistics
import time

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.model.hooks import model_shape
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.refs import ModelRef, resolve_checkpoint
from core.stats.inference import spearman
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.specs import probe_spec


def bench_patch(model: str = "induction-neox", revision: str | None = None, n_examples: int = 256, seq_len: int = 64,
                repeats: int = 1, device: str = "cpu", dtype: str = DEFAULT_DTYPE) -> dict:
    """Median wall and CPU times of the three runs over `repeats` rounds (each round in the other order than the last);
    speed-ups, the replay's largest score difference and Spearman rho."""
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)
    loaded = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples, seq_len)).build()
    settings = PatchSettings(allow_small_gap=True)  # a timing and rank-agreement bench, not a verdict: any gap will do
    methods = {"activation": activation_patching, "attribution": attribution_patching,
               "activation_full": lambda *args: activation_patching(*args, replay=False)}
    # untimed, one patched run first: the process's first forwards (allocating and touching its buffers) would
    # otherwise fall on whichever method is timed first
    n_layers, n_heads, _ = model_shape(loaded)
    activation_patching(loaded, pair, settings, heads=[(n_layers - 1, 0)])
    times: dict[str, list[float]] = {key: [] for name in methods for key in (name, f"{name}_cpu")}
    results = {}
    for repeat in range(int(repeats)):
        order = list(methods.items())
        for name, method in order if repeat % 2 == 0 else order[::-1]:  # alternating: a drift in load falls on all
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = method(loaded, pair, settings)
            times[name].append(time.perf_counter() - t0)
            times[f"{name}_cpu"].append(time.process_time() - c0)
    activation, attribution = results["activation"], results["attribution"]
    median = {name: statistics.median(values) for name, values in times.items()}
    rho, rho_p = spearman(attribution.scores.ravel(), activation.scores.ravel())
    return {
        "speedup_attribution_vs_activation": median["activation"] / median["attribution"],
        "speedup_cpu": median["activation_cpu"] / median["attribution_cpu"],
        "speedup_replay_vs_full_forwards": median["activation_full"] / median["activation"],
        "replay_max_score_diff": float(abs(activation.scores - results["activation_full"].scores).max()),
        "spearman": rho, "spearman_p": rho_p,
        "activation_s": median["activation"], "attribution_s": median["attribution"],
        "activation_full_s": median["activation_full"],
        "activation_times_s": times["activation"], "attribution_times_s": times["attribution"],
        "activation_full_times_s": times["activation_full"],
        "identity_max_diff": activation.identity_max_diff,
        "clean_value": activation.clean_value, "corrupted_value": activation.corrupted_value,
        "model": ref.name, "revision": checkpoint.revision, "n_heads_total": n_layers * n_heads,
        "n_examples": n_examples, "seq_len": seq_len, "repeats": int(repeats), "metric": settings.metric,
        "direction": settings.direction, "device": str(device), "dtype": dtype_name(dtype),
    }
