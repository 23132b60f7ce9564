"""Benchmark: attribution patching against activation patching over every head of a zoo model, same run.

`python -m core bench patch` loads a zoo model (default the quick zoo's induction-neox), builds the
induction probe's counterfactual (default N = 256, T = 64) and times, alternating, activation
patching of every head (one forward per head and chunk) and attribution patching (one forward and
one backward per chunk). It reports the speed-up and the Spearman rank agreement of the two.
"""

from __future__ import annotations

import argparse
import statistics
import time

from core.ablation.patching import PatchSettings, activation_patching, attribution_patching
from core.cli.probe import add_device_arguments
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
    settings = PatchSettings()
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


def add_bench_patch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--n-examples", type=int, default=256, help="pairs N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats; medians are reported (default 1)")
    add_device_arguments(parser)


def cli_bench_patch(args: argparse.Namespace) -> dict:
    result = bench_patch(args.model, args.revision, args.n_examples, args.seq_len, args.repeats, args.device, args.dtype)
    rho = "undefined" if result["spearman"] is None else f"{result['spearman']:.3f}"
    print(f"patch bench ({result['model']} {result['revision']}, N={result['n_examples']}, T={result['seq_len']}, "
          f"{result['n_heads_total']} heads): activation {result['activation_s']:.2f}s, attribution "
          f"{result['attribution_s']:.2f}s, speedup {result['speedup_attribution_vs_activation']:.1f}x "
          f"(CPU time {result['speedup_cpu']:.1f}x), Spearman {rho}")
    return result
