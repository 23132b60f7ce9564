"""Benchmark at a real model shape: HeadLab's passes on a Pythia-160m-shaped model with the reference batch.

`python -m core bench scale --json PATH` builds the published Pythia-160m architecture (12 layers x
12 heads, d_model 768, vocabulary 50,304; random weights, seeded: the timing does not depend on
what the weights learned) and probes it with the reference batch (N = 2000, T = 256, tokens in
[100, 10000)). It reports:
- `instrumented_over_bare`: the one instrumented pass (every head statistic) over a bare forward;
- `peak_memory_bytes`: the process's peak resident memory on the CPU (weights included), the peak
  allocated CUDA memory on a GPU;
- `ablation_speedup`: the recipe's conditions (candidate, 20 matched-random draws, upper bound)
  through the ablation engine against a naive loop of one full forward per condition.
On these CPUs one bare pass over the full reference batch takes tens of minutes, so `--n` scales N
down (the JSON says which N was used); on a GPU run it at the full N with `--device cuda --dtype float16`.
`--model smollm2-135m` runs the same measurements on a zoo model's real weights instead (e.g. SmolLM2-135M,
30 x 9 heads; the reference batch's tokens [100, 10000) are ordinary tokens of its vocabulary).
"""

from __future__ import annotations

import resource
import sys

import torch

from core.bench.ablation import matched_conditions, random_bridge, time_conditions
from core.bench.probe import bench_probe
from core.heads import HeadSet
from core.model.hooks import model_dtype, model_shape
from core.model.loading import dtype_name, load_model
from core.model.refs import ModelRef, resolve_checkpoint
from core.tasks.induction import reference_probe_spec
from core.zoo.presets import PYTHIA_SHAPES
from core.zoo.train import build_hf_config



def bench_selection(n_layers: int, n_heads: int) -> HeadSet:
    """Four heads at a third and half of the depth, where an induction circuit sits (Pythia-160m:
    L4H3, L4H9, L6H1, L6H10), so prefix reuse replays the blocks from a third of the way up."""
    low, mid = n_layers // 3, n_layers // 2
    return HeadSet(((low, n_heads // 4), (low, 3 * n_heads // 4), (mid, 1), (mid, n_heads - 2)))


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory on a GPU; the process's peak resident set on the CPU (Linux: KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def bench_scale(n_examples: int, shape: str = "pythia-160m", repeats: int = 1, chunk_size: int = 16,
                n_controls: int = 20, device: str = "cpu", dtype: str = "float32", model_name: str | None = None) -> dict:
    """Instrumented vs bare pass and engine vs naive ablation at `shape` (or on zoo model `model_name`'s
    real weights) on the reference batch (first N)."""
    if model_name is None:
        model = random_bridge(build_hf_config(PYTHIA_SHAPES[shape]), seed=0, device=device, dtype=dtype)
        vocab = PYTHIA_SHAPES[shape].vocab_size
    else:
        ref = ModelRef.parse(model_name)
        model = load_model(ref, resolve_checkpoint(ref, None).revision, device=device, dtype=dtype)
        shape, vocab = f"{ref.name} (real weights)", int(model.cfg.d_vocab)
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    full = reference_probe_spec(seed=42)
    batch = full.build().select(slice(0, int(n_examples))).to(device)
    probe = bench_probe(model, batch, repeats=repeats, chunk_size=chunk_size, device=device, with_three_pass=False)
    n_layers, n_heads, _ = model_shape(model)
    selection = bench_selection(n_layers, n_heads)
    conditions = matched_conditions(selection, n_layers, n_heads, n_controls)
    ablation = time_conditions(model, batch, conditions, repeats=repeats)
    peak = peak_memory_bytes(device)
    return {
        "shape": shape, "n_layers": n_layers, "n_heads": n_heads, "d_model": int(model.cfg.d_model),
        "vocab": vocab, "n_examples": batch.n_examples, "reference_n_examples": full.n_examples,
        "seq_len": batch.seq_len, "device": str(device), "dtype": dtype_name(model_dtype(model)), "chunk_size": chunk_size,
        "threads": torch.get_num_threads(), "repeats": repeats,
        "bare_s": probe["bare_s"], "instrumented_s": probe["instrumented_s"],
        "instrumented_over_bare": probe["overhead_ratio"],
        "peak_memory_bytes": peak, "peak_memory_gib": round(peak / 2**30, 3),
        "ablation_naive_s": ablation["naive_s"], "ablation_engine_s": ablation["engine_s"],
        "ablation_speedup": ablation["speedup"], "ablation_max_metric_diff": ablation["max_metric_diff"],
        "ablation_conditions": ablation["n_conditions"], "selection": str(selection), "ablation_notes": ablation["notes"],
    }
