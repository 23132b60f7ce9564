"""Edge scores: edge attribution patching (EAP), EAP with integrated gradients, and brute-force edge patching.

Every method scores an edge by its *importance*: the fraction of the clean-corrupted gap that the
clean run loses when that edge alone carries the corrupted run's sender output,
    importance(e) = (M_clean - M_{e patched}) / (M_clean - M_corrupted)
(1: the edge alone undoes the whole answer; 0: no effect; the denominator is the run with every edge
patched, which is the corrupted run). Brute force measures it with one forward per edge.
EAP [Syed et al. 2023] estimates it to first order from one clean forward and backward per chunk:
M_{e patched} - M_clean ~= (source_s - clean_s) . dM/d(input of r), summed over pairs' positions
and d_model, for every edge s -> r at once. EAP-IG [Hanna et al. 2024, "EAP-IG-inputs" in MIB]
averages that gradient over `ig_steps` runs whose embeddings lie on the straight line from the
corrupted run's to the clean run's (alpha = k / ig_steps, k = 1..ig_steps), so ig_steps = 1 is EAP.
MIB's code (hannamw/EAP-IG, get_scores_eap_ig) takes k = 0..ig_steps-1 instead, the corrupted end in and
the clean end out: `ig_rule="left"` (IG_RULES); both are Riemann sums of the same path integral.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from core.ablation.edges.graph import EdgeGraph
from core.ablation.edges.runs import (EdgeChunk, EdgeHooks, EdgeSettings, check_edge_model, edge_chunks,
                                      edge_values, removed_matrix, removed_run_values, run_values)
from core.ablation.patching.attribution import float32_weights
from core.ablation.patching.paths import split_qkv_inputs
from core.ablation.patching.runs import GRADIENT_METRICS, query_logits
from core.choices import EDGE_ALGORITHMS as METHODS
from core.errors import HeadLabError
from core.model.hooks import model_dtype
from core.model.loading import dtype_name
from core.results import JsonResult, provenance
from core.tasks.counterfactual import PatchPair

IG_RULES = {"right": "alpha = k / steps, k = 1..steps (the clean end in: 1 step is EAP)",
            "left": "alpha = k / steps, k = 0..steps-1 (MIB's EAP-IG-inputs code: the corrupted end in)"}
Progress = Callable[[int, int], None]


@dataclass(frozen=True, eq=False)
class EdgeScores(JsonResult):
    """One importance per edge of the model's graph (core.ablation.edges.graph order).

    method: "eap", "eap-ig", "brute force" or "acdc"; scores: [edge], the fraction of the
    clean-corrupted gap lost when the edge alone is patched (measured, or its first-order estimate);
    clean_value, corrupted_value: the mean metric of the clean run and of the run with every edge
    patched; graph: the graph's counts (EdgeGraph.summary); edges: every edge's text, in order;
    passes: forwards and backwards run, per chunk of pairs summed; kept: [edge] bool, ACDC's circuit.
    """

    method: str
    metric: str
    clean_value: float
    corrupted_value: float
    edges: tuple[str, ...]
    scores: np.ndarray
    graph: dict
    passes: dict
    settings: dict
    provenance: dict
    kept: np.ndarray | None = field(default=None, metadata={"dtype": "bool"})
    threshold: float | None = None
    gap: dict = field(default_factory=dict)

    def top(self, k: int) -> list[tuple[str, float]]:
        """The k edges of largest |importance| (ties in edge order)."""
        order = np.argsort(-np.abs(self.scores), kind="stable")[: int(k)]
        return [(self.edges[i], float(self.scores[i])) for i in order]


def edge_provenance(model: Any, pair: PatchPair, graph: EdgeGraph, settings: EdgeSettings, method: str, **extra) -> dict:
    """Where an edge result comes from: model, shape, dtype, the pairs, the settings, the hooks."""
    return provenance(model=str(getattr(model.cfg, "model_name", "")), n_layers=graph.n_layers, n_heads=graph.n_heads,
                      dtype=dtype_name(model_dtype(model)), pairs=dict(pair.spec), n_examples=pair.n_examples,
                      seq_len=pair.seq_len, method=method, settings=settings.to_json(),
                      senders="embed = blocks.0.hook_resid_pre; head = hook_z @ W_O (times the post-attention "
                              "RMSNorm's gain / rms at the forward's own scale, where the block has one); "
                              "MLP = its output hook",
                      receivers="hook_{q,k,v}_input per head (per query head under GQA: K/V projections ungrouped); "
                                "blocks.{l}.ln2.hook_in; ln_final.hook_in",
                      n_key_value_heads=graph.n_key_value_heads or graph.n_heads, **extra)


def check_ig_steps(ig_steps: int) -> int:
    if int(ig_steps) != ig_steps or int(ig_steps) < 1:
        raise HeadLabError(f"--ig-steps is {ig_steps}; use a whole number of interpolation steps, at least 1 (default 5).")
    return int(ig_steps)


def _gradient_pass(model: Any, graph: EdgeGraph, chunk: EdgeChunk, metric: str, alpha: float | None) -> tuple[np.ndarray, float]:
    """One forward + backward of the clean prompts: (sum over pairs of (source - clean) . grad, [sender, receiver];
    sum of the metric). alpha: EAP-IG's point on the corrupted -> clean line of the embeddings (None: the clean run).

    The products are taken inside the backward, one matrix product per layer as its receivers' gradients
    arrive (EdgeHooks), in float32 (float64 would double the memory of both factors at Pythia's shape);
    the sums across chunks and interpolation steps are float64."""
    source_embed = chunk.source_acts[0]

    def interpolate(x: torch.Tensor) -> torch.Tensor:
        return source_embed.to(x.dtype) + alpha * (x - source_embed.to(x.dtype))

    diff = (chunk.source_acts - chunk.clean_acts).float()  # [sender, row, pos, d_model]
    hooks = EdgeHooks(model, graph, embed_override=None if alpha is None else interpolate, score_diff=diff)
    with torch.enable_grad(), split_qkv_inputs(model):
        logits_q = query_logits(model, chunk.tokens, chunk.query, hooks.hooks(), chunk.attention_mask)
        values = edge_values(logits_q, chunk, metric)
        torch.autograd.grad(values.sum(), [hooks.embed_input])  # the receivers' gradients go to the scores on the way
    return hooks.finish_scores().double().cpu().numpy(), float(values.detach().double().sum())


def ig_alphas(ig_steps: int, rule: str = "right") -> list[float]:
    """EAP-IG's points on the corrupted (0) -> clean (1) line of the embeddings, by IG_RULES[rule]."""
    steps = check_ig_steps(ig_steps)
    if rule not in IG_RULES:
        raise HeadLabError(f"EAP-IG rule {rule!r} is unknown; use one of {', '.join(IG_RULES)}.")
    first = 1 if rule == "right" else 0
    return [k / steps for k in range(first, first + steps)]


def edge_attribution(model: Any, pair: PatchPair, settings: EdgeSettings = EdgeSettings(), ig_steps: int | None = None,
                     progress: Progress | None = None, ig_rule: str = "right") -> EdgeScores:
    """Every edge's importance to first order: EAP (ig_steps None) or EAP-IG over ig_steps interpolations
    placed by ig_rule (IG_RULES).

    Runs in float32 whatever the model's dtype. progress(done, total) counts gradient passes.
    """
    graph = check_edge_model(model)
    if settings.metric not in GRADIENT_METRICS + ("kl",):
        raise HeadLabError(f"edge attribution needs a metric with a gradient ({', '.join(GRADIENT_METRICS)}, kl); "
                           f"{settings.metric} is a step function.")
    if settings.metric == "kl" and ig_steps is None:
        raise HeadLabError("the KL to the clean output has zero gradient at the clean run, so EAP would score every edge 0; "
                           "use --metric logit_diff, or --method eap-ig (its gradients are taken between the runs).")
    alphas: Sequence[float | None] = [None] if ig_steps is None else ig_alphas(ig_steps, ig_rule)
    with float32_weights(model):
        chunks, gap_record = edge_chunks(model, pair, settings, graph, grad=True)
        values = run_values(model, graph, chunks, settings.metric)
        total = np.zeros(graph.mask.shape)
        done, n_passes = 0, len(chunks) * len(alphas)
        for chunk in chunks:
            for alpha in alphas:
                change, _ = _gradient_pass(model, graph, chunk, settings.metric, alpha)
                total += change / len(alphas)
                done += 1
                if progress is not None:
                    progress(done, n_passes)
    senders, receivers = graph.edge_index
    mean_change = total[senders, receivers] / pair.n_examples  # [edge]: estimated M_patched - M_clean
    gap = values.clean - values.corrupted
    method = "eap" if ig_steps is None else "eap-ig"
    extra = {} if ig_steps is None else {"ig_steps": int(ig_steps), "interpolation": "embeddings, corrupted -> clean",
                                          **({} if ig_rule == "right" else {"ig_rule": ig_rule})}
    return EdgeScores(method, settings.metric, values.clean, values.corrupted, graph.edge_texts,
                      -mean_change / gap, graph.summary(),
                      {"forward": len(chunks) * (3 + len(alphas)), "backward": n_passes},
                      {**settings.to_json(), **extra}, edge_provenance(model, pair, graph, settings, method, **extra),
                      gap=gap_record)


def edge_patching_each(model: Any, pair: PatchPair, settings: EdgeSettings = EdgeSettings(),
                       progress: Progress | None = None, scale: float = 1.0) -> EdgeScores:
    """Brute force: every edge patched alone, one forward per edge and chunk; its measured importance.

    scale < 1 patches only that fraction of each edge's change (a finite-difference probe of EAP's
    first-order estimate: importance(scale) / scale -> EAP's as scale -> 0).
    """
    graph = check_edge_model(model)
    chunks, gap_record = edge_chunks(model, pair, settings, graph)
    values = run_values(model, graph, chunks, settings.metric)
    device = chunks[0].tokens.device
    sums = np.zeros(graph.n_edges)
    done, total = 0, graph.n_edges * len(chunks)
    for chunk in chunks:
        for i in range(graph.n_edges):
            alone = np.zeros(graph.n_edges, dtype=bool)
            alone[i] = True
            patched = removed_run_values(model, graph, chunk, removed_matrix(graph, alone, device), settings.metric, scale)
            sums[i] += float(patched.double().sum())
            done += 1
            if progress is not None and (done % 64 == 0 or done == total):
                progress(done, total)
    importance = 1.0 - np.asarray(values.score(sums / pair.n_examples))
    return EdgeScores("brute force", settings.metric, values.clean, values.corrupted, graph.edge_texts,
                      importance, graph.summary(), {"forward": len(chunks) * (3 + graph.n_edges), "backward": 0},
                      {**settings.to_json(), "scale": float(scale)},
                      edge_provenance(model, pair, graph, settings, "brute force", scale=float(scale)), gap=gap_record)
