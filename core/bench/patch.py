"""Benchmark: attribution patching against activation patching over every head of a zoo model, same run.

`python -m core bench patch` loads a zoo model (default the quick zoo's induction-neox), builds the
induction probe's counterfactual (default N = 256, T = 64) and times, alternating, activation
patching of every head (one forward per head and chunk) and attribution patching (one forward and
one backward per chunk). It reports the speed-up and the Spearman rank agreement of the two.
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
    """Median wall and CPU times of both methods over `repeats` alternating runs; speed-up and Spearman rho."""
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)
    loaded = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples, seq_len)).build()
    settings = PatchSettings(allow_small_gap=True)  # a timing and rank-agreement bench, not a verdict: any gap will do
    times: dict[str, list[float]] = {"activation": [], "attribution": [], "activation_cpu": [], "attribution_cpu": []}
    for _ in range(int(repeats)):
        for name, method in (("activation", activation_patching), ("attribution", attribution_patching)):
            t0, c0 = time.perf_counter(), time.process_time()
            result = method(loaded, pair, settings)
            times[name].append(time.perf_counter() - t0)
            times[f"{name}_cpu"].append(time.process_time() - c0)
            if name == "activation":
                activation = result
            else:
                attribution = result
    median = {name: statistics.median(values) for name, values in times.items()}
    rho, rho_p = spearman(attribution.scores.ravel(), activation.scores.ravel())
    n_layers, n_heads, _ = model_shape(loaded)
    return {
        "speedup_attribution_vs_activation": median["activation"] / median["attribution"],
        "speedup_cpu": median["activation_cpu"] / median["attribution_cpu"],
        "spearman": rho, "spearman_p": rho_p,
        "activation_s": median["activation"], "attribution_s": median["attribution"],
        "activation_times_s": times["activation"], "attribution_times_s": times["attribution"],
        "identity_max_diff": activation.identity_max_diff,
        "clean_value": activation.clean_value, "corrupted_value": activation.corrupted_value,
        "model": ref.name, "revision": checkpoint.revision, "n_heads_total": n_layers * n_heads,
        "n_examples": n_examples, "seq_len": seq_len, "repeats": int(repeats), "metric": settings.metric,
        "direction": settings.direction, "device": str(device), "dtype": dtype_name(dtype),
    }
