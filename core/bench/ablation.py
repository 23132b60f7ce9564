"""Benchmark: the ablation engine against one full run_with_hooks forward per condition.

`python -m core bench ablation` times `run_conditions` (prefix reuse, stacked conditions) and the
naive loop on the same random 8-layer model and the same conditions, and reports the speed-up and
the largest metric difference (which must stay at float rounding).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any, Sequence

import numpy as np
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoModelForCausalLM, GPTNeoXConfig
from transformers.utils import logging as hf_logging

from core.ablation.clean_run import CleanRuns
from core.ablation.engine import run_conditions
from core.ablation.spec import Ablation
from core.stats.metrics import query_metrics
from core.heads import HeadSet
from core.model.hooks import hook_name, model_shape
from core.model.loading import DEFAULT_DTYPE, check_device, dtype_name, parse_dtype
from core.stats.controls import matched_random_controls, upper_bound
from core.stats.inference import METRICS
from core.threads import apply_thread_policy


def _bench_config() -> GPTNeoXConfig:
    """An 8-layer, 8-head GPT-NeoX (d_model 256) over the byte vocabulary."""
    return GPTNeoXConfig(
        vocab_size=260, hidden_size=256, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1024,
        max_position_embeddings=512, rotary_pct=1.0, use_parallel_residual=True, tie_word_embeddings=False,
        bos_token_id=256, eos_token_id=258, pad_token_id=257,
    )


def random_bridge(config, seed: int, device: str = "cpu", dtype: str = DEFAULT_DTYPE):
    """A model of Hugging Face `config` with random weights (seeded), booted as a TransformerBridge on `device` in `dtype`."""
    config._attn_implementation = "eager"
    device = check_device(device)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    # initialised in float32 on the CPU: the same weights on every device
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in a benchmark's output
    with tempfile.TemporaryDirectory(prefix="headlab-bench-") as folder:
        hf.save_pretrained(folder)
        hf = hf.to(device=device, dtype=parse_dtype(dtype))
        model = TransformerBridge.boot_transformers(folder, hf_model=hf, device=device, dtype=parse_dtype(dtype))
    model.eval()
    return model


class _BenchBatch:
    def __init__(self, tokens, query_pos, target):
        self.tokens, self.query_pos, self.target, self.spec = tokens, query_pos, target, {"task": "bench"}


@torch.no_grad()
def _naive_conditions(model: Any, batch: Any, conditions: Sequence[Ablation]) -> list[dict[str, np.ndarray]]:
    """The naive way: one full forward per condition (clean first), zeroing hook_z slices."""
    rows = torch.arange(batch.tokens.shape[0], device=batch.tokens.device)
    out = []
    for ablation in [Ablation()] + list(conditions):
        hooks = []
        for layer in ablation.heads.layers:
            heads = [h for l, h in ablation.heads if l == layer]

            def zero(z, hook=None, heads=heads):
                z = z.clone()
                z[:, :, heads, :] = 0
                return z

            hooks.append((hook_name("z", layer), zero))
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        metrics = query_metrics(logits[rows, batch.query_pos], batch.target)
        out.append({k: v.double().cpu().numpy() for k, v in metrics.items()})
    return out


def time_conditions(model: Any, batch: Any, conditions: Sequence[Ablation], repeats: int = 3,
                    chunk_size: int | None = None) -> dict:
    """Time the engine and the naive loop on the same conditions, alternating; medians, ratio, max difference.

    Also the engine from a kept clean run (CleanRuns, recorded once before: the lab's clicks after the
    first). The engine's two ways swap order every repeat, and each way's process CPU time is kept
    beside its wall time: on a shared machine the wall time of a run moves with the other processes
    (a 2-thread run waits for the slower thread at every operation), its CPU time much less.
    """
    naive_times, engine_times, kept_times = [], [], []
    naive_cpu, engine_cpu, kept_cpu = [], [], []  # process CPU time: robust when other processes share the cores
    kept = CleanRuns()
    run_conditions(model, batch, [], clean_runs=kept)
    kept_identical = True
    max_diff = 0.0
    notes: list[str] = []
    for r in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        naive = _naive_conditions(model, batch, conditions)
        naive_times.append(time.perf_counter() - t0)
        naive_cpu.append(time.process_time() - c0)
        ways = ["engine", "kept"] if r % 2 == 0 else ["kept", "engine"]
        for way in ways:
            t0, c0 = time.perf_counter(), time.process_time()
            if way == "engine":
                clean, results = run_conditions(model, batch, conditions, chunk_size=chunk_size, notes=notes if r == 0 else None)
                engine_times.append(time.perf_counter() - t0)
                engine_cpu.append(time.process_time() - c0)
            else:
                kept_clean, kept_results = run_conditions(model, batch, conditions, chunk_size=chunk_size, clean_runs=kept)
                kept_times.append(time.perf_counter() - t0)
                kept_cpu.append(time.process_time() - c0)
        kept_identical &= all(np.array_equal(a.values(metric), b.values(metric)) for metric in METRICS
                              for a, b in zip([clean] + results, [kept_clean] + kept_results))
        for ref, got in zip(naive, [clean] + results):
            for metric in METRICS:
                max_diff = max(max_diff, float(np.abs(ref[metric] - got.values(metric)).max()))
    naive_s, engine_s, kept_s = statistics.median(naive_times), statistics.median(engine_times), statistics.median(kept_times)
    median_cpu = {way: statistics.median(v) for way, v in (("naive", naive_cpu), ("engine", engine_cpu), ("kept", kept_cpu))}
    return {
        "engine_kept_clean_s": kept_s, "speedup_kept_clean_vs_engine": engine_s / kept_s, "kept_clean_identical": kept_identical,
        "engine_kept_clean_cpu_s": median_cpu["kept"], "speedup_kept_clean_vs_engine_cpu": median_cpu["engine"] / median_cpu["kept"],
        "kept_clean_times_s": kept_times, "kept_clean_cpu_times_s": kept_cpu, "engine_cpu_times_s": engine_cpu,
        "naive_s": naive_s, "engine_s": engine_s, "speedup": naive_s / engine_s, "max_metric_diff": max_diff,
        "speedup_per_repeat": [n / e for n, e in zip(naive_times, engine_times)],
        "naive_cpu_s": median_cpu["naive"], "engine_cpu_s": median_cpu["engine"],
        "speedup_cpu": median_cpu["naive"] / median_cpu["engine"],
        "n_conditions": len(conditions) + 1, "repeats": repeats, "naive_times_s": naive_times,
        "engine_times_s": engine_times, "chunk_size": chunk_size or 1, "notes": notes,
    }


def matched_conditions(selection: HeadSet, n_layers: int, n_heads: int, n_controls: int) -> list[Ablation]:
    """The recipe's conditions: the candidate, `n_controls` matched-random draws (seed 123), the upper bound."""
    sets = matched_random_controls(selection, n_layers, n_heads, n_controls, seed=123)
    return ([Ablation(selection, label="candidate")] + [Ablation(s, label=f"control {i}") for i, s in enumerate(sets)]
            + [Ablation(upper_bound(selection, n_heads), label="upper bound")])


def bench_ablation(n_examples: int = 64, seq_len: int = 64, n_controls: int = 20, repeats: int = 3, seed: int = 0,
                   chunk_size: int | None = None, device: str = "cpu", dtype: str = DEFAULT_DTYPE,
                   threads: int | None = None) -> dict:
    """Time the engine and the naive loop on the same conditions; report medians, ratio and max difference.

    threads: torch threads (None: HeadLab's choice for the CPUs' load now, core/threads.py, as every command
    and the lab make it; a fixed 2 on a shared 2-core machine made the kept clean run's wall time 0.54x-1.05x
    the engine's, from run to run, while it always does less work)."""
    if threads is None:
        apply_thread_policy()
    else:
        torch.set_num_threads(int(threads))
    model = random_bridge(_bench_config(), seed, device, dtype)
    n_layers, n_heads, _ = model_shape(model)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (n_examples, seq_len), generator=gen)
    query_pos = torch.full((n_examples,), seq_len - 1, dtype=torch.long)
    target = torch.randint(0, 256, (n_examples,), generator=gen)
    batch = _BenchBatch(tokens.to(device), query_pos.to(device), target.to(device))
    selection = HeadSet(((4, 1), (4, 5), (6, 2)))
    conditions = matched_conditions(selection, n_layers, n_heads, n_controls)
    return {
        **time_conditions(model, batch, conditions, repeats, chunk_size),
        "n_examples": n_examples, "seq_len": seq_len, "n_controls": n_controls, "selection": str(selection),
        "lowest_ablated_layer": 4, "model": "GPT-NeoX 8 layers x 8 heads, d_model 256, vocab 260, random weights",
        "device": str(device), "dtype": dtype_name(dtype), "threads": torch.get_num_threads(),
    }
