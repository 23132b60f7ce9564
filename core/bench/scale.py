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
- `eap_over_forward_backward`, `eap_ig_over_forward_backward`: EAP and EAP-IG (`ig_steps`) over every
  edge of the graph, end to end (the clean and corrupted runs, the gradient passes, the scores), against
  one bare forward and backward of the same pairs' clean prompts (`edge_pairs` pairs: IOI's ABC pairs on a
  model with a real tokenizer, the induction counterfactual on the random shape). The bare backward takes
  the metric's gradient to the activations and every weight, as a training step does
  (`forward_backward_s`); `forward_input_backward_s` and the `..._over_forward_input_backward` ratios
  use the stricter floor of a backward to the activations alone (no weight gradients: EAP needs none).
  Both bare passes unembed only the query row, as the edge runs do. On the CPU the edge part also records
  the peak resident growth of one EAP run and of one patched forward against the estimates that chunk them
  (`eap_peak_over_estimate`, `patched_peak_over_estimate`: at most 1 when the estimate is an upper bound).
The bare forward of `instrumented_over_bare` unembeds only the query row as the instrumented pass does
(core.bench.probe.bare_pass): full-vocabulary logits at every position were extra work the pass never does.
On these CPUs one bare pass over the full reference batch takes tens of minutes, so `--n` scales N
down (the JSON says which N was used); on a GPU run it at the full N with `--device cuda --dtype float16`.
`--model smollm2-135m` runs the same measurements on a zoo model's real weights instead (e.g. SmolLM2-135M,
30 x 9 heads; the reference batch's tokens [100, 10000) are ordinary tokens of its vocabulary).
"""

from __future__ import annotations

import ctypes
import resource
import sys
from typing import Any

import numpy as np
import torch

from core.ablation.edges import EdgeSettings, edge_attribution, edge_graph_of
from core.ablation.edges.memory import edge_forward_bytes, edge_pair_bytes
from core.ablation.edges.runs import edge_chunks, mean_value
from core.ablation.patching.runs import metric_values, query_logits
from core.bench.ablation import matched_conditions, random_bridge, time_conditions
from core.bench.probe import bench_probe, median_times
from core.heads import HeadSet
from core.model.hooks import hook_name, model_dtype, model_shape
from core.model.loading import dtype_name, load_model
from core.model.memory import ForwardShape
from core.model.refs import ModelRef, checkpoint_path, resolve_checkpoint
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.induction import reference_probe_spec
from core.tasks.ioi import IoiCounterfactualSpec, ioi_spec
from core.tasks.specs import probe_spec
from core.tasks.tokens import tokenizer_of_folder
from core.zoo.presets import PYTHIA_SHAPES
from core.zoo.train import build_hf_config

EDGE_SEQ_LEN = 32  # the induction counterfactual's length on the random shape (IOI prompts have their own)


def bench_selection(n_layers: int, n_heads: int) -> HeadSet:
    """Four heads at a third and half of the depth, where an induction circuit sits (Pythia-160m:
    L4H3, L4H9, L6H1, L6H10), so prefix reuse replays the blocks from a third of the way up."""
    low, mid = n_layers // 3, n_layers // 2
    return HeadSet(((low, n_heads // 4), (low, 3 * n_heads // 4), (mid, 1), (mid, n_heads - 2)))


def _reset_peak_rss() -> bool:
    """Hand freed heap back (glibc) and reset the process's peak resident memory (Linux clear_refs "5"); False
    where refused, so the next peak is the next run's own."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """The peak resident bytes since the last reset (VmHWM)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def edge_memory(model: Any, pair: PatchPair, settings: EdgeSettings) -> dict:
    """Peak resident growth of one EAP run and of one patched forward (half the edges removed) over all the pairs in
    one chunk, against the estimates that chunk edge runs (core.ablation.edges.memory); {} where the peak cannot be
    reset (not Linux) or on a GPU."""
    if next(model.parameters()).device.type != "cpu" or not sys.platform.startswith("linux") or not _reset_peak_rss():
        return {}
    graph, shape, n = edge_graph_of(model), ForwardShape.of_model(model), pair.n_examples
    one_chunk = EdgeSettings(allow_small_gap=True, batch_size=n)
    _reset_peak_rss()
    before = _peak_rss()
    edge_attribution(model, pair, one_chunk)
    eap = _peak_rss() - before
    chunks, _ = edge_chunks(model, pair, one_chunk, graph)
    removed = np.random.default_rng(0).random(graph.n_edges) < 0.5
    _reset_peak_rss()
    before = _peak_rss()
    mean_value(model, graph, chunks, removed, settings.metric)
    patched = _peak_rss() - before
    eap_estimate = n * edge_pair_bytes(shape, graph, pair.seq_len, grad=True)
    patched_estimate = n * edge_forward_bytes(shape, graph, pair.seq_len, grad=False)
    return {"eap_peak_growth_bytes": eap, "eap_estimate_bytes": eap_estimate, "eap_peak_over_estimate": eap / eap_estimate,
            "patched_peak_growth_bytes": patched, "patched_estimate_bytes": patched_estimate,
            "patched_peak_over_estimate": patched / patched_estimate,
            "memory_note": "growth of the peak resident memory during the run (weights and the interpreter excluded) "
                           "against the estimate that chunks it; the patched forward's excludes the kept runs"}


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory on a GPU; the process's peak resident set on the CPU (Linux: KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def edge_pairs_for(model: Any, ref: ModelRef | None, revision: str | None, n_pairs: int) -> PatchPair:
    """The edge bench's pairs: IOI's ABC pairs on a model with its own tokenizer, else the induction counterfactual."""
    tokenizer = None if ref is None else tokenizer_of_folder(checkpoint_path(ref, revision), local=ref.kind != "hub",
                                                              revision=revision)
    if tokenizer is not None:
        return IoiCounterfactualSpec(ioi_spec(tokenizer, int(n_pairs)), "abc", 0).build()
    vocab = int(model.cfg.d_vocab)
    spec = probe_spec("induction", int(n_pairs), EDGE_SEQ_LEN, token_low=min(100, vocab // 2), token_high=min(10000, vocab))
    return InductionCounterfactualSpec(spec, seed=0).build()


def bare_forward_backward(model: Any, pair: PatchPair, weights: bool) -> None:
    """One forward of the pairs' clean prompts (logits at the query only) and the backward of the summed metric:
    to the activations and every weight (weights True, a training step's gradient) or to the activations alone."""
    device = next(model.parameters()).device
    tokens, query = pair.clean.tokens.to(device), pair.clean.query_pos.to(device)
    target = pair.clean.target.to(device)
    other = None if pair.corrupted_target is None else pair.corrupted_target.to(device)
    saved = [p.requires_grad for p in model.parameters()]
    embed: dict[str, torch.Tensor] = {}

    def keep_embed(x, hook=None):  # the gradient's end when no weight takes one
        embed["x"] = x.detach().requires_grad_(True)
        return embed["x"]

    try:
        for p in model.parameters():
            p.requires_grad_(weights)
        with torch.enable_grad():
            logits_q = query_logits(model, tokens, query, [] if weights else [(hook_name("resid_pre", 0), keep_embed)])
            total = metric_values(logits_q, target, other, "logit_diff").sum()
            if weights:
                total.backward()
            else:
                torch.autograd.grad(total, [embed["x"]])
    finally:
        model.zero_grad(set_to_none=True)
        for p, flag in zip(model.parameters(), saved):
            p.requires_grad_(flag)


def bench_edge_scale(model: Any, pair: PatchPair, repeats: int = 1, ig_steps: int = 5) -> dict:
    """EAP and EAP-IG over every edge against one bare forward + backward of the same pairs (module docstring)."""
    device = next(model.parameters()).device
    settings = EdgeSettings(allow_small_gap=True)  # a timing: a random shape's pairs have no gap to keep
    med = median_times({
        "forward_backward_s": lambda: bare_forward_backward(model, pair, weights=True),
        "forward_input_backward_s": lambda: bare_forward_backward(model, pair, weights=False),
        "eap_s": lambda: edge_attribution(model, pair, settings),
        "eap_ig_s": lambda: edge_attribution(model, pair, settings, ig_steps=ig_steps),
    }, repeats, device)
    graph = edge_graph_of(model)
    memory = edge_memory(model, pair, settings)
    return {
        "edge_pairs": pair.n_examples, "edge_seq_len": pair.seq_len, "edge_task": str(pair.spec.get("task", "")),
        "edges": graph.n_edges, "ig_steps": int(ig_steps), **med,
        "eap_over_forward_backward": med["eap_s"] / med["forward_backward_s"],
        "eap_ig_over_forward_backward": med["eap_ig_s"] / med["forward_backward_s"],
        "eap_over_forward_input_backward": med["eap_s"] / med["forward_input_backward_s"],
        "eap_ig_over_forward_input_backward": med["eap_ig_s"] / med["forward_input_backward_s"],
        **memory,
    }


def bench_scale(n_examples: int, shape: str = "pythia-160m", repeats: int = 1, chunk_size: int = 16,
                n_controls: int = 20, device: str = "cpu", dtype: str = "float32", model_name: str | None = None,
                edge_pairs: int = 8, ig_steps: int = 5) -> dict:
    """Instrumented vs bare pass and engine vs naive ablation at `shape` (or on zoo model `model_name`'s
    real weights) on the reference batch (first N); EAP and EAP-IG vs a forward + backward on `edge_pairs`
    pairs (0: left out)."""
    ref = revision = None
    if model_name is None:
        model = random_bridge(build_hf_config(PYTHIA_SHAPES[shape]), seed=0, device=device, dtype=dtype)
        vocab = PYTHIA_SHAPES[shape].vocab_size
    else:
        ref = ModelRef.parse(model_name)
        revision = resolve_checkpoint(ref, None).revision
        model = load_model(ref, revision, device=device, dtype=dtype)
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
    edges = {} if int(edge_pairs) < 1 else bench_edge_scale(model, edge_pairs_for(model, ref, revision, edge_pairs),
                                                             repeats, ig_steps)
    peak = peak_memory_bytes(device)
    return {
        "shape": shape, "n_layers": n_layers, "n_heads": n_heads, "d_model": int(model.cfg.d_model),
        "vocab": vocab, "n_examples": batch.n_examples, "reference_n_examples": full.n_examples,
        "seq_len": batch.seq_len, "device": str(device), "dtype": dtype_name(model_dtype(model)), "chunk_size": chunk_size,
        "threads": torch.get_num_threads(), "repeats": repeats,
        "bare_s": probe["bare_s"], "instrumented_s": probe["instrumented_s"],
        "instrumented_over_bare": probe["overhead_ratio"],
        "bare_pass": "forward, no KV cache, no kept patterns, logits at each row's query position only",
        "peak_memory_bytes": peak, "peak_memory_gib": round(peak / 2**30, 3),
        "ablation_naive_s": ablation["naive_s"], "ablation_engine_s": ablation["engine_s"],
        "ablation_speedup": ablation["speedup"], "ablation_max_metric_diff": ablation["max_metric_diff"],
        "ablation_conditions": ablation["n_conditions"], "selection": str(selection), "ablation_notes": ablation["notes"],
        **edges,
    }
