"""Benchmark: EAP against brute-force edge patching, EAP-IG against EAP, and EAP at Pythia-160m's shape.

`python -m core bench edges` (1) loads a zoo model (default the quick zoo's induction-neox), builds
the induction counterfactual and times brute-force patching of every edge alone (one forward per
edge and chunk) against EAP (one forward and one backward per chunk), with the Spearman rank
agreement of their scores; (2) times EAP-IG at `ig_steps` against EAP on the same pairs; (3) runs
EAP on Pythia-160m's shape with random weights on a batch of 16 x 128 tokens and reports its time
and the process's peak memory.
"""

from __future__ import annotations

import time

import torch

from core.ablation.edges import EdgeSettings, edge_attribution, edge_graph_of, edge_patching_each
from core.bench.ablation import random_bridge
from core.bench.scale import peak_memory_bytes
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.refs import ModelRef, resolve_checkpoint
from core.stats.inference import spearman
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.specs import probe_spec
from core.zoo.presets import PYTHIA_SHAPES
from core.zoo.train import build_hf_config

TIMING_ONLY = EdgeSettings(allow_small_gap=True)  # a timing and agreement bench, not a verdict: any gap will do


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def bench_edges(model: str = "induction-neox", revision: str | None = None, n_examples: int = 32, seq_len: int = 32,
                ig_steps: int = 5, shape: str | None = "pythia-160m", shape_n: int = 16, shape_seq_len: int = 128,
                device: str = "cpu", dtype: str = DEFAULT_DTYPE) -> dict:
    """Brute force vs EAP and EAP-IG vs EAP on a zoo model; EAP's time and peak memory at `shape` (None: skip)."""
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)
    loaded = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    pair = InductionCounterfactualSpec(probe_spec("induction", n_examples, seq_len)).build()
    graph = edge_graph_of(loaded)
    eap, eap_s = _timed(edge_attribution, loaded, pair, TIMING_ONLY)
    ig, ig_s = _timed(edge_attribution, loaded, pair, TIMING_ONLY, ig_steps=ig_steps)
    brute, brute_s = _timed(edge_patching_each, loaded, pair, TIMING_ONLY)
    rho, rho_p = spearman(eap.scores, brute.scores)
    rho_ig, _ = spearman(ig.scores, brute.scores)
    result = {
        "model": ref.name, "revision": checkpoint.revision, "n_examples": n_examples, "seq_len": seq_len,
        "edges": graph.n_edges, "graph": graph.summary(), "device": str(device), "dtype": dtype_name(dtype),
        "threads": torch.get_num_threads(), "brute_force_s": brute_s, "eap_s": eap_s, "eap_ig_s": ig_s,
        "ig_steps": ig_steps, "speedup_eap_vs_brute_force": brute_s / eap_s, "eap_ig_over_eap": ig_s / eap_s,
        "spearman_eap_vs_brute_force": rho, "spearman_p": rho_p, "spearman_eap_ig_vs_brute_force": rho_ig,
        "clean_value": eap.clean_value, "corrupted_value": eap.corrupted_value,
    }
    if shape is not None:
        big = random_bridge(build_hf_config(PYTHIA_SHAPES[shape]), seed=0, device=device, dtype=dtype)
        big_pair = InductionCounterfactualSpec(probe_spec("induction", shape_n, shape_seq_len)).build()
        settings = EdgeSettings(allow_small_gap=True, batch_size=shape_n)  # the whole batch in one forward + backward
        scores, big_s = _timed(edge_attribution, big, big_pair, settings)
        peak = peak_memory_bytes(torch.device(device))
        result.update({"shape": shape, "shape_edges": int(scores.graph["edges"]), "shape_n_examples": shape_n,
                       "shape_seq_len": shape_seq_len, "shape_eap_s": big_s, "peak_memory_bytes": peak,
                       "peak_memory_gib": round(peak / 2**30, 3)})
    return result
