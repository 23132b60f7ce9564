"""ACDC-style pruning [Conmy et al. 2023]: remove edges greedily while the output stays close to the clean run.

Start from the full graph on the clean prompts. Visit the receivers in reverse forward order (the
logits first, then the last layer's MLP and heads' v, k, q inputs, ...) and each receiver's senders
in reverse order; patch the edge (it carries the corrupted run's, or the mean, sender output) and
keep it patched when the distance from the clean run grows by less than `threshold`:
    distance = KL(clean output || run) at the query for metric "kl", else the fraction of the
               clean-corrupted gap lost, (M_clean - M_run) / (M_clean - M_corrupted).
A node none of whose outgoing edges is left cannot reach the logits, so its incoming edges are
removed without a forward (ACDC does the same). One forward per tested edge and chunk of pairs.
Each edge's score is the distance increase measured when it was tested (0 for edges removed
untested), so a threshold sweep is not needed to rank edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from core.ablation.edges.eap import EdgeScores, edge_provenance
from core.ablation.edges.graph import LOGITS
from core.ablation.edges.runs import EdgeSettings, RunValues, check_edge_model, edge_chunks, mean_value, run_values
from core.errors import HeadLabError
from core.tasks.counterfactual import PatchPair

Progress = Callable[[int, int], None]


def check_threshold(threshold: float) -> float:
    """A pruning threshold: a finite number >= 0 (a distance increase; 0 keeps every edge that moves the output)."""
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise HeadLabError(f"--threshold {threshold!r} is not a number; give a distance increase such as 0.01.") from None
    if not math.isfinite(value) or value < 0:
        raise HeadLabError(f"--threshold is {threshold}; it must be a finite number >= 0 (the distance increase an edge "
                           "may cause and still be removed, e.g. 0.01).")
    return value


@dataclass(frozen=True)
class _Distance:
    """distance(mean metric of a run): 0 for the clean run."""

    metric: str
    values: RunValues

    def __call__(self, value: float) -> float:
        if self.metric == "kl":
            return float(value)
        return float(1.0 - self.values.score(value))


def _node(receiver: str) -> str:
    return receiver.partition(".")[0]


def acdc(model: Any, pair: PatchPair, threshold: float, settings: EdgeSettings = EdgeSettings(),
         progress: Progress | None = None) -> EdgeScores:
    """Prune the model's edge graph at `threshold`; `kept` is the circuit, `scores` each edge's tested increase.

    progress(done, total) counts edges decided.
    """
    threshold = check_threshold(threshold)
    graph = check_edge_model(model)
    chunks, gap_record = edge_chunks(model, pair, settings, graph)
    values = run_values(model, graph, chunks, settings.metric)
    distance = _Distance(settings.metric, values)
    removed = np.zeros(graph.n_edges, dtype=bool)
    increase = np.zeros(graph.n_edges)
    current = distance(mean_value(model, graph, chunks, removed, settings.metric))
    start = current
    senders_of: dict[str, list[int]] = {r: [] for r in graph.receivers}
    outgoing: dict[str, list[int]] = {s: [] for s in graph.senders}
    for i, edge in enumerate(graph.edges):
        senders_of[edge.receiver_input].append(i)
        outgoing[edge.sender].append(i)
    forwards, done = 1, 0
    for receiver in reversed(graph.receivers):
        incoming = senders_of[receiver][::-1]
        node = _node(receiver)
        alive = node == LOGITS or not removed[outgoing[node]].all()
        if not alive:
            removed[incoming] = True
        else:
            for i in incoming:
                trial = removed.copy()
                trial[i] = True
                distance_trial = distance(mean_value(model, graph, chunks, trial, settings.metric))
                forwards += 1
                increase[i] = distance_trial - current
                if increase[i] < threshold:
                    removed, current = trial, distance_trial
        done += len(incoming)
        if progress is not None:
            progress(done, graph.n_edges)
    kept = ~removed
    extra = {"threshold": threshold, "distance": "KL(clean || run)" if settings.metric == "kl" else
             "fraction of the clean-corrupted gap lost", "start_distance": start, "final_distance": current,
             "edges_kept": int(kept.sum())}
    return EdgeScores("acdc", settings.metric, values.clean, values.corrupted, tuple(str(e) for e in graph.edges),
                      increase, graph.summary(), {"forward": len(chunks) * (forwards + 3), "backward": 0},
                      {**settings.to_json(), **extra}, edge_provenance(model, pair, graph, settings, "acdc", **extra),
                      kept=kept, threshold=threshold, gap=gap_record)


def kept_by_each(scores: EdgeScores, threshold: float) -> np.ndarray:
    """[edge] bool: the edges whose patch alone (brute force, edge_patching_each) moves ACDC's distance by at
    least `threshold`; what ACDC keeps when the edges do not interact."""
    importance = np.asarray(scores.scores)
    increase = importance * scores.corrupted_value if scores.metric == "kl" else importance
    return increase >= check_threshold(threshold)
