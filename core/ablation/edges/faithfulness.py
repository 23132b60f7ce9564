"""How well an edge set stands for the model: faithfulness curves (MIB) and matched-random edge controls.

A circuit C (a set of edges) is run on the clean prompts with every edge outside C patched (each
carries the corrupted run's, or the mean, sender output). Its faithfulness [MIB, Mueller et al.
2025] is
    f(C) = (M(C) - M(empty)) / (M(full) - M(empty)),
where the full graph is the clean run and the empty circuit is the run with every edge patched (the
corrupted run): HeadLab's patching scale, 1 = the whole model's answer, 0 = none of it. As MIB's
evaluation code computes them (hannamw/MIB-circuit-track: evaluation.py and print_results.py, which read
CPR from its `abs-False` run and CMD from its `abs-True` run), the curve takes C = the top-k edges for k =
each fraction of the edges in MIB_FRACTIONS, ranked two ways: by signed score (the edges that help the
answer most; its area is CPR, higher is better) and by |score| (the edges that matter most either way;
the area of |1 - f| is CMD, lower is better). Areas are trapezoids over the linear fraction axis from
its first to its last point. A kept set both rankings share is run once.

HeadLab's addition: an edge set against random edge sets with the same number of edges in every
(sender layer, receiver layer, input) stratum (EdgeGraph.strata), each run the same way; the set's
faithfulness gets the rank, p and z that the ablation lab gives a head group against its controls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from core.ablation.edges.eap import edge_provenance
from core.ablation.edges.graph import EdgeGraph
from core.ablation.edges.runs import EdgeSettings, check_edge_model, edge_chunks, mean_value, run_values
from core.errors import HeadLabError
from core.results import JsonResult
from core.stats.inference import MIN_VERDICT_EXAMPLES, RANK_P_ALPHA, SPREAD_FLOOR, Verdict, below_minimum
from core.stats.patching import against_controls
from core.tasks.counterfactual import PatchPair

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
Progress = Callable[[int, int], None]


def top_edges(scores: np.ndarray, k: int, signed: bool = False) -> np.ndarray:
    """[edge] bool: the k edges of largest |score|, or of largest score when `signed` (ties broken by edge order)."""
    scores = np.asarray(scores, dtype=np.float64)
    keep = np.zeros(scores.size, dtype=bool)
    keep[np.argsort(-(scores if signed else np.abs(scores)), kind="stable")[: int(k)]] = True
    return keep


def edges_for_fraction(n_edges: int, fraction: float) -> int:
    """How many edges a fraction of the graph keeps: rounded, at least one."""
    return max(1, int(round(float(fraction) * n_edges)))


def curve_areas(fractions: Sequence[float], faithfulness: Sequence[float]) -> tuple[float, float]:
    """(CPR, CMD): the trapezoid areas of f and of |1 - f| over the fraction axis."""
    x = np.asarray(fractions, dtype=np.float64)
    f = np.asarray(faithfulness, dtype=np.float64)
    if x.size < 2 or np.any(np.diff(x) <= 0):
        raise HeadLabError("a faithfulness curve needs at least two increasing edge fractions.")
    return float(np.trapezoid(f, x)), float(np.trapezoid(np.abs(1.0 - f), x))


@dataclass(frozen=True, eq=False)
class FaithfulnessCurve(JsonResult):
    """The top-k circuits of one edge scoring: fractions [k], edges kept [k], faithfulness [k] of the top-k by
    |score| (CMD's curve) and by signed score (CPR's curve), CPR, CMD."""

    method: str
    metric: str
    fractions: tuple[float, ...]
    n_edges_kept: tuple[int, ...]
    faithfulness: tuple[float, ...]
    cpr: float
    cmd: float
    clean_value: float
    corrupted_value: float
    n_edges: int
    provenance: dict
    faithfulness_signed: tuple[float, ...] = ()


def faithfulness_curve(model: Any, pair: PatchPair, scores: np.ndarray, settings: EdgeSettings = EdgeSettings(),
                       fractions: Sequence[float] = MIB_FRACTIONS, method: str = "",
                       progress: Progress | None = None) -> FaithfulnessCurve:
    """Faithfulness of the top-k edges by |scores| and by signed scores ([edge]) for k = each fraction of the
    graph's edges; CPR from the signed curve, CMD from the |score| curve (MIB's rule)."""
    graph = check_edge_model(model)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (graph.n_edges,):
        raise HeadLabError(f"expected one score per edge of this model ({graph.n_edges}), got {scores.shape[0]}; "
                           "score the edges of this same model.")
    fractions = tuple(float(f) for f in fractions)
    if any(not 0 < f <= 1 for f in fractions):
        raise HeadLabError(f"edge fractions must lie in (0, 1]; got {fractions}.")
    chunks, _ = edge_chunks(model, pair, settings, graph)
    values = run_values(model, graph, chunks, settings.metric)
    measured: dict[bytes, float] = {}  # a kept set's faithfulness: run once when both rankings keep it

    def faithfulness_of(keep: np.ndarray) -> float:
        key = np.packbits(keep).tobytes()
        if key not in measured:
            measured[key] = float(values.score(mean_value(model, graph, chunks, ~keep, settings.metric)))
        return measured[key]

    kept, faithful, faithful_signed = [], [], []
    for i, fraction in enumerate(fractions):
        k = edges_for_fraction(graph.n_edges, fraction)
        kept.append(k)
        faithful.append(faithfulness_of(top_edges(scores, k)))
        faithful_signed.append(faithfulness_of(top_edges(scores, k, signed=True)))
        if progress is not None:
            progress(i + 1, len(fractions))
    cpr, cmd = curve_areas(fractions, faithful_signed)[0], curve_areas(fractions, faithful)[1]
    return FaithfulnessCurve(method, settings.metric, fractions, tuple(kept), tuple(faithful), cpr, cmd, values.clean,
                             values.corrupted, graph.n_edges,
                             edge_provenance(model, pair, graph, settings, "faithfulness curve", fractions=list(fractions)),
                             tuple(faithful_signed))


def matched_random_edge_sets(graph: EdgeGraph, keep: np.ndarray, n_draws: int, seed: int = 123) -> list[np.ndarray]:
    """n_draws random [edge] bool sets, each with `keep`'s number of edges in every stratum (EdgeGraph.strata).

    Drawn with numpy's default_rng(seed), stratum by stratum in stratum order.
    """
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (graph.n_edges,):
        raise HeadLabError(f"expected a mask over this model's {graph.n_edges} edges, got shape {keep.shape}.")
    if int(n_draws) < 1:
        raise HeadLabError(f"n_controls is {n_draws}; ask for at least one random edge set.")
    rng = np.random.default_rng(int(seed))
    strata = graph.strata
    members = [np.nonzero(strata == s)[0] for s in range(int(strata.max()) + 1)]
    draws = []
    for _ in range(int(n_draws)):
        out = np.zeros(graph.n_edges, dtype=bool)
        for index in members:
            count = int(keep[index].sum())
            if count:
                out[rng.choice(index, size=count, replace=False)] = True
        draws.append(out)
    return draws


@dataclass(frozen=True, eq=False)
class EdgeControls(JsonResult):
    """An edge set's faithfulness against matched-random edge sets.

    faithfulness: the set's f; control_faithfulness: each random set's f; stats: rank, p, z (higher
    faithfulness = more effect), control mean and sd (core.stats.patching.against_controls);
    heads: the heads the set touches (what the ablation lab can test); n_possible_differ: False when
    every stratum is full, so each random set is the set itself.
    """

    metric: str
    edges: tuple[str, ...]
    faithfulness: float
    control_faithfulness: tuple[float, ...]
    stats: dict
    heads: tuple[tuple[int, int], ...]
    controls_differ: bool
    seed: int
    verdict: Verdict
    provenance: dict


def edge_set_verdict(stats: dict, controls_differ: bool, n_examples: int, lead: float | None = None) -> Verdict:
    """"beyond its controls" when the set's faithfulness ranks first with p <= RANK_P_ALPHA (19 or more random
    sets) and leads the best random set by more than rounding (`lead`, its faithfulness minus the best control's:
    more than SPREAD_FLOOR, faithfulness being ~1 in scale; e.g. ACDC at threshold 0 keeps nearly every edge and its
    random sets differ from it by a few edges of no effect), "not beyond its controls" otherwise; "inconclusive"
    when the random sets cannot differ from the set (every stratum full) or the pairs are fewer than
    MIN_VERDICT_EXAMPLES."""
    rule = f"rank 1 and empirical p <= {RANK_P_ALPHA} against 19 or more matched-random edge sets"
    if not controls_differ:
        verdict = Verdict("inconclusive", rule, ("every random edge set equals the set itself (each stratum it uses is "
                                                 "full); no control can differ, so nothing is tested.",))
    elif stats["n_controls"] + 1 < round(1 / RANK_P_ALPHA):
        verdict = Verdict("inconclusive", rule, (f"{stats['n_controls']} random edge sets cannot reach p <= {RANK_P_ALPHA}: "
                                                 f"the smallest p is 1/{stats['n_controls'] + 1}; use at least 19.",))
    elif stats["rank"] == 1 and stats["p"] <= RANK_P_ALPHA and lead is not None and not lead > SPREAD_FLOOR:
        verdict = Verdict("not beyond its controls", rule,
                          (f"rank 1 of {stats['n_controls'] + 1}, but ahead of the best random edge set by {lead:.2g} "
                           "in faithfulness, a rounding-size difference",))
    elif stats["rank"] == 1 and stats["p"] <= RANK_P_ALPHA:
        verdict = Verdict("beyond its controls", rule, (f"rank 1 of {stats['n_controls'] + 1}, p = {stats['p']:.3g}",))
    else:
        verdict = Verdict("not beyond its controls", rule,
                          (f"rank {stats['rank']} of {stats['n_controls'] + 1}, p = {stats['p']:.3g}",))
    return below_minimum(verdict, n_examples, MIN_VERDICT_EXAMPLES)


def edge_controls(model: Any, pair: PatchPair, keep: np.ndarray, settings: EdgeSettings = EdgeSettings(),
                  n_controls: int = 20, seed: int = 123, progress: Progress | None = None) -> EdgeControls:
    """Run the circuit `keep` ([edge] bool) and n_controls matched-random edge sets; rank, p and z of its faithfulness."""
    graph = check_edge_model(model)
    keep = np.asarray(keep, dtype=bool)
    if not keep.any():
        raise HeadLabError("the edge set is empty; choose at least one edge (e.g. --top 20).")
    sets = matched_random_edge_sets(graph, keep, n_controls, seed)
    chunks, _ = edge_chunks(model, pair, settings, graph)
    values = run_values(model, graph, chunks, settings.metric)
    faithful = []
    for i, edges in enumerate([keep] + sets):
        faithful.append(float(values.score(mean_value(model, graph, chunks, ~edges, settings.metric))))
        if progress is not None:
            progress(i + 1, len(sets) + 1)
    differ = any((s != keep).any() for s in sets)
    stats = against_controls(faithful[0], faithful[1:], "denoise")
    return EdgeControls(settings.metric, tuple(str(graph.edges[i]) for i in np.nonzero(keep)[0]), faithful[0],
                        tuple(faithful[1:]), stats, tuple(graph.heads_of(keep)), differ, int(seed),
                        edge_set_verdict(stats, differ, pair.n_examples, faithful[0] - max(faithful[1:], default=0.0)),
                        edge_provenance(model, pair, graph, settings, "matched-random edge controls",
                                        controls="same count per (sender layer, receiver layer, input)"))
