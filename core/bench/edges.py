"""Benchmark: EAP and EAP-IG against exact (brute-force) edge patching, and EAP at Pythia-160m's shape.

`python -m core bench edges` (1) loads a zoo model (default the quick zoo's induction-neox) and builds its
pairs (the induction counterfactual, or `--task ioi` on a model with a real tokenizer); (2) scores every
edge by EAP and by EAP-IG at each of `ig_steps` (HeadLab's rule, and at the first step count MIB's rule:
eap.IG_RULES); (3) patches edges alone, one forward each: every edge, or (`sample_edges`) a random sample
plus each method's top `sample_top` edges; (4) reports where the estimates agree with that exact
patching: over all the measured edges (Spearman, as before), above an effect floor (|exact importance| at
least `floor` of the gap), and the overlap of the top-k edge sets; (5) runs each method's top-k circuits
at MIB's edge fractions (faithfulness, CPR, CMD; brute force's own when every edge was patched); (6) times
EAP on Pythia-160m's shape with random weights (16 x 128 tokens) with the process's peak memory.

Why the floor: on a trained model most edges move the metric by rounding, and a rank correlation over all
of them mostly ranks that noise; a circuit is the few edges above it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from core.ablation.edges import EdgeSettings, edge_attribution, edge_graph_of, faithfulness_curve
from core.ablation.edges.eap import check_ig_steps
from core.ablation.edges.runs import edge_chunks, removed_matrix, removed_run_values, run_values
from core.bench.ablation import random_bridge
from core.bench.scale import peak_memory_bytes
from core.errors import HeadLabError
from core.executor import ProgressBar
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.refs import ModelRef, checkpoint_path, resolve_checkpoint
from core.stats.inference import spearman
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.ioi import IoiCounterfactualSpec, ioi_spec
from core.tasks.probe_batch import check_seed
from core.tasks.specs import probe_spec
from core.tasks.tokens import tokenizer_of_folder
from core.zoo.presets import PYTHIA_SHAPES
from core.zoo.train import build_hf_config

TIMING_ONLY = EdgeSettings(allow_small_gap=True)  # a timing and agreement bench, not a verdict: any gap will do
EFFECT_FLOOR = 0.01  # |importance| of 1% of the clean-corrupted gap
TOP_K = (10, 20, 50)
TASKS = ("induction", "ioi")


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def top_k_overlap(estimate: np.ndarray, exact: np.ndarray, k: int) -> float:
    """The share of exact's top-k edges (by |score|) that are also estimate's top-k: |A & B| / k (ties by order)."""
    estimate, exact = np.abs(np.asarray(estimate, dtype=np.float64)), np.abs(np.asarray(exact, dtype=np.float64))
    k = min(int(k), exact.size)
    if k < 1:
        raise HeadLabError("top-k overlap needs k of at least 1 and at least one edge.")
    top = lambda x: set(np.argsort(-x, kind="stable")[:k].tolist())  # noqa: E731
    return len(top(estimate) & top(exact)) / k


def agreement(estimate: np.ndarray, exact: np.ndarray, floor: float = EFFECT_FLOOR,
              top_k: Sequence[int] = TOP_K) -> dict:
    """How an estimate's importances ([edge]) agree with exact patching's ([edge], same edges).

    spearman / pearson: over every edge; spearman_abs: of |importance| (the order a top-k circuit takes);
    above_floor: the edges whose exact |importance| is at least `floor` (their count, Spearman, and the
    share where the estimate has the exact sign); top_k: {k: top_k_overlap} for each k below the edge count.
    None where a statistic is undefined (a constant vector, fewer than 3 edges above the floor).
    """
    estimate, exact = np.asarray(estimate, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    if estimate.shape != exact.shape or estimate.ndim != 1:
        raise HeadLabError(f"agreement needs two scores of the same edges; got shapes {estimate.shape} and {exact.shape}.")
    above = np.abs(exact) >= float(floor)
    rho_above = spearman(estimate[above], exact[above])[0] if above.sum() >= 3 else None
    pearson = None if np.std(estimate) == 0 or np.std(exact) == 0 else float(np.corrcoef(estimate, exact)[0, 1])
    return {"n_edges": int(exact.size), "spearman": spearman(estimate, exact)[0], "pearson": pearson,
            "spearman_abs": spearman(np.abs(estimate), np.abs(exact))[0], "floor": float(floor),
            "n_above_floor": int(above.sum()), "spearman_above_floor": rho_above,
            "sign_agreement_above_floor": float(np.mean(np.sign(estimate[above]) == np.sign(exact[above])))
            if above.any() else None,
            "top_k": {str(k): top_k_overlap(estimate, exact, k) for k in top_k if k < exact.size}}


def patched_alone(model: Any, pair: PatchPair, settings: EdgeSettings, edges: np.ndarray, label: str = "") -> np.ndarray:
    """Exact importance of each edge in `edges` ([n] edge indices), each patched alone: one forward per edge and
    chunk, the same measurement as eap.edge_patching_each over the whole graph."""
    graph = edge_graph_of(model)
    chunks, _ = edge_chunks(model, pair, settings, graph)
    values = run_values(model, graph, chunks, settings.metric)
    device = chunks[0].tokens.device
    sums = np.zeros(len(edges))
    with ProgressBar(total=len(edges) * len(chunks), desc=f"patching edges alone{label}", unit="forward") as bar:
        for chunk in chunks:
            for j, i in enumerate(edges):
                alone = np.zeros(graph.n_edges, dtype=bool)
                alone[int(i)] = True
                patched = removed_run_values(model, graph, chunk, removed_matrix(graph, alone, device), settings.metric)
                sums[j] += float(patched.double().sum())
                bar.update(1)
    return 1.0 - np.asarray(values.score(sums / pair.n_examples), dtype=np.float64)


def bench_pairs(ref: ModelRef, revision: str, task: str, n_examples: int, seq_len: int) -> PatchPair:
    """The bench's pairs: the induction counterfactual (n_examples x seq_len), or IOI's ABC pairs (the model's tokenizer)."""
    if task not in TASKS:
        raise HeadLabError(f"bench edges --task {task!r} is unknown; use one of {', '.join(TASKS)}.")
    if task == "induction":
        return InductionCounterfactualSpec(probe_spec("induction", n_examples, seq_len)).build()
    tokenizer = tokenizer_of_folder(checkpoint_path(ref, revision), local=ref.kind != "hub", revision=revision)
    if tokenizer is None:
        raise HeadLabError(f"{ref.name} has no tokenizer of its own, so it has no IOI pairs; use --task induction "
                           "or a real model such as smollm2-135m.")
    return IoiCounterfactualSpec(ioi_spec(tokenizer, n_examples), "abc", 0).build()


def check_sample(sample_edges: int | None, sample_top: int, n_edges: int | None = None) -> None:
    """--sample-edges from 3 to the graph's edges (n_edges None: not known yet), --sample-top 0 or more."""
    if sample_edges is not None and not 3 <= int(sample_edges) <= (n_edges or int(sample_edges)):
        raise HeadLabError(f"--sample-edges is {sample_edges}; give a number of edges from 3 to the model's "
                           f"{n_edges or 'edge count'}, or leave it out to patch every edge.")
    if int(sample_top) < 0:
        raise HeadLabError(f"--sample-top is {sample_top}; give 0 or more edges per method.")


@dataclass(frozen=True)
class EdgeBenchPlan:
    """What the agreement part measures: the pairs (task, n_examples x seq_len; IOI's length is its templates'),
    EAP-IG's step counts (the first is timed and also run by MIB's rule), the exact reference (every edge, or
    sample_edges random ones plus each method's top sample_top, drawn with seed) and the faithfulness curves."""

    task: str = "induction"
    n_examples: int = 32
    seq_len: int = 32
    ig_steps: tuple[int, ...] = (5, 20)
    sample_edges: int | None = None
    sample_top: int = 20
    seed: int = 0
    curves: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise HeadLabError(f"bench edges --task {self.task!r} is unknown; use one of {', '.join(TASKS)}.")
        object.__setattr__(self, "ig_steps", tuple(check_ig_steps(n) for n in self.ig_steps))
        check_sample(self.sample_edges, self.sample_top)
        object.__setattr__(self, "seed", check_seed(self.seed, "--sample-seed"))


def bench_edges(model: str = "induction-neox", revision: str | None = None, plan: EdgeBenchPlan = EdgeBenchPlan(),
                shape: str | None = "pythia-160m", shape_n: int = 16, shape_seq_len: int = 128, device: str = "cpu",
                dtype: str = DEFAULT_DTYPE) -> dict:
    """EAP and EAP-IG against exact edge patching on a zoo model (plan); EAP's time and peak memory at `shape`
    (None: skip)."""
    ig_steps, sample_edges, sample_top, seed = list(plan.ig_steps), plan.sample_edges, plan.sample_top, plan.seed
    ref = ModelRef.parse(model)
    checkpoint = resolve_checkpoint(ref, revision)
    pair = bench_pairs(ref, checkpoint.revision, plan.task, plan.n_examples, plan.seq_len)
    loaded = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    graph = edge_graph_of(loaded)
    check_sample(sample_edges, sample_top, graph.n_edges)
    eap, eap_s = _timed(edge_attribution, loaded, pair, TIMING_ONLY)
    scores, seconds = {"eap": eap.scores}, {"eap": eap_s}
    runs = [(f"eap-ig-{n}", n, "right") for n in ig_steps] + [(f"eap-ig-{ig_steps[0]}-mib", ig_steps[0], "left")]
    for name, n, rule in runs:
        ig, seconds[name] = _timed(edge_attribution, loaded, pair, TIMING_ONLY, ig_steps=n, ig_rule=rule)
        scores[name] = ig.scores
    if sample_edges is None:
        measured = np.arange(graph.n_edges)
        random_part = measured
    else:
        random_part = np.sort(np.random.default_rng(int(seed)).choice(graph.n_edges, int(sample_edges), replace=False))
        tops = [np.argsort(-np.abs(s), kind="stable")[: int(sample_top)] for s in scores.values()]
        measured = np.unique(np.concatenate([random_part, *tops]))
    exact, brute_s = _timed(patched_alone, loaded, pair, TIMING_ONLY, measured)
    exact_of = dict(zip(measured.tolist(), exact))
    exact_random = np.array([exact_of[i] for i in random_part.tolist()])
    result = {
        "model": ref.name, "revision": checkpoint.revision, "task": plan.task, "n_examples": pair.n_examples,
        "seq_len": pair.seq_len, "edges": graph.n_edges, "graph": graph.summary(), "device": str(device),
        "dtype": dtype_name(dtype), "threads": torch.get_num_threads(), "ig_steps": ig_steps[0],
        "ig_steps_all": ig_steps, "ig_rules": {"eap-ig-N": "HeadLab's: alpha = k / N, k = 1..N",
                                               "eap-ig-N-mib": "MIB's code: alpha = k / N, k = 0..N-1"},
        "clean_value": eap.clean_value, "corrupted_value": eap.corrupted_value,
        "seconds": seconds, "eap_s": eap_s, "eap_ig_s": seconds[f"eap-ig-{ig_steps[0]}"],
        "eap_ig_over_eap": seconds[f"eap-ig-{ig_steps[0]}"] / eap_s,
        "reference": {"edges_patched": int(measured.size), "every_edge": sample_edges is None,
                      "random_edges": int(random_part.size), "top_per_method": 0 if sample_edges is None else int(sample_top),
                      "seed": int(seed), "seconds": brute_s},
        "brute_force_s": brute_s, "speedup_eap_vs_brute_force": brute_s / eap_s,
    }
    # Spearman over the random edges (every edge without sampling), as the bench always reported it
    rho, rho_p = spearman(scores["eap"][random_part], exact_random)
    result.update({"spearman_eap_vs_brute_force": rho, "spearman_p": rho_p,
                   "spearman_eap_ig_vs_brute_force": spearman(scores[f"eap-ig-{ig_steps[0]}"][random_part], exact_random)[0]})
    # agreement: over the random edges (floor, Spearman); top-k sets over every measured edge (each method's own top
    # sample_top are among them, so with sampling exact's top-k is taken among the edges some method ranks high)
    k_max = graph.n_edges if sample_edges is None else int(sample_top)
    result["agreement"] = {
        name: {**agreement(s[random_part], exact_random, top_k=()),
               "top_k": {str(k): top_k_overlap(s[measured], exact, k) for k in TOP_K if k <= min(k_max, measured.size - 1)}}
        for name, s in scores.items()}
    result["exact_top"] = [(graph.edge_texts[i], float(exact_of[i])) for i in measured[np.argsort(-np.abs(exact))[:10]]]
    if plan.curves:
        curve_scores = dict(scores)
        if sample_edges is None:
            curve_scores["brute force"] = exact
        result["faithfulness"] = {}
        for name, s in curve_scores.items():
            curve = faithfulness_curve(loaded, pair, s, TIMING_ONLY, method=name)
            # the curve of the top edges by |score| (CMD's) and by signed score (CPR's), MIB's rule
            result["faithfulness"][name] = {"cpr": curve.cpr, "cmd": curve.cmd, "faithfulness": list(curve.faithfulness),
                                            "faithfulness_signed": list(curve.faithfulness_signed),
                                            "n_edges_kept": list(curve.n_edges_kept)}
        result["faithfulness_fractions"] = list(curve.fractions)
    if shape is not None:
        big = random_bridge(build_hf_config(PYTHIA_SHAPES[shape]), seed=0, device=device, dtype=dtype)
        big_pair = InductionCounterfactualSpec(probe_spec("induction", shape_n, shape_seq_len)).build()
        settings = EdgeSettings(allow_small_gap=True, batch_size=shape_n)  # the whole batch in one forward + backward
        big_scores, big_s = _timed(edge_attribution, big, big_pair, settings)
        peak = peak_memory_bytes(torch.device(device))
        result.update({"shape": shape, "shape_edges": int(big_scores.graph["edges"]), "shape_n_examples": shape_n,
                       "shape_seq_len": shape_seq_len, "shape_eap_s": big_s, "peak_memory_bytes": peak,
                       "peak_memory_gib": round(peak / 2**30, 3)})
    return result
