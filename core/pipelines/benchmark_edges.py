"""The known-circuit benchmark's edge methods (split from core/pipelines/benchmark.py): EAP, EAP-IG, ACDC at one
threshold, and ACDC's threshold sweep, whose ROC is the one ACDC's paper (Conmy et al. 2023) reports.

Each method reads a case's loaded model and pairs (benchmark._Loaded: .model, .pairs) and scores every edge of
the model's edge graph (core.ablation.edges); benchmark.run_case scores them against the case's true edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from core.ablation.edges import EdgeSettings, acdc, edge_attribution
from core.results import JsonResult

_Loaded = Any  # benchmark._Loaded: the case's model (.model) and pairs (.pairs), loaded on first use

ACDC_THRESHOLD = 0.01  # core.pipelines.edges.EdgePlan's default
IG_STEPS = 5


@dataclass(frozen=True)
class EdgeScoresOf(JsonResult):
    """One edge method's scores on one case: every edge's text ([edge], core.ablation.edges' order) and score,
    or the reason there are none."""

    method: str
    edges: tuple[str, ...]
    scores: Optional[np.ndarray]
    not_applicable: str = ""
    notes: tuple[str, ...] = ()
    sweep: Optional[dict] = None  # ACDC's threshold sweep: thresholds and each one's kept edges (indices)


def _edge_scores(method: str) -> Callable[[_Loaded], EdgeScoresOf]:
    """EAP and EAP-IG: |estimated fraction of the clean-corrupted gap lost| when the edge alone is patched; ACDC:
    the increase of its distance when the edge is removed in its pruning pass (kept edges at or above the threshold,
    edges of a pruned receiver 0). The removed edges carry the corrupted run's sender outputs (resample)."""

    def scores_of(x: _Loaded) -> EdgeScoresOf:
        settings = EdgeSettings(metric="logit_diff", replacement="resample", allow_small_gap=True)
        if method == "acdc":
            result = acdc(x.model, x.pairs, ACDC_THRESHOLD, settings)
            values = np.asarray(result.scores, dtype=np.float64)
            notes = (f"ACDC threshold {ACDC_THRESHOLD}: kept {int(np.asarray(result.kept).sum())} edges",)
        else:
            result = edge_attribution(x.model, x.pairs, settings, ig_steps=None if method == "eap" else IG_STEPS)
            values = np.abs(np.asarray(result.scores, dtype=np.float64))
            notes = () if method == "eap" else (f"{IG_STEPS} interpolation steps",)
        return EdgeScoresOf(EDGE_LABELS[method], tuple(result.edges), values, notes=notes)

    return scores_of


EDGE_LABELS = {"eap": "EAP", "eap-ig": "EAP-IG", "acdc": "ACDC"}
# ACDC's ROC as its paper draws it: one ACDC run per threshold (on the distance, the fraction of the clean-corrupted
# gap lost), each run's kept edges one (FPR, TPR) point; log-spaced over the range where circuits go from the whole
# graph to nothing on the known models.
ACDC_SWEEP = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


def _acdc_sweep(x: _Loaded) -> EdgeScoresOf:
    """ACDC run at every threshold of ACDC_SWEEP; an edge's score is the largest threshold at which it is kept
    (0: never kept), so a ranking measure over these scores walks the sweep's points (ties: its trapezoids)."""
    settings = EdgeSettings(metric="logit_diff", replacement="resample", allow_small_gap=True)
    edges, kept_at = None, []
    for threshold in ACDC_SWEEP:
        result = acdc(x.model, x.pairs, threshold, settings)
        edges = tuple(result.edges)
        kept_at.append([int(i) for i in np.flatnonzero(np.asarray(result.kept))])
    scores = np.zeros(len(edges))
    for threshold, kept in zip(ACDC_SWEEP, kept_at):
        scores[kept] = np.maximum(scores[kept], threshold)
    return EdgeScoresOf("ACDC (threshold sweep)", edges, scores,
                        notes=(f"ACDC at {len(ACDC_SWEEP)} thresholds {', '.join(map(str, ACDC_SWEEP))}",),
                        sweep={"thresholds": list(ACDC_SWEEP), "kept": kept_at})


@dataclass(frozen=True)
class EdgeMethod:
    """A way to score every edge of a case's graph, scored by the same measures against the case's true edges."""

    name: str
    score: str
    run: Callable[[_Loaded], EdgeScoresOf]


EDGE_METHODS: tuple[EdgeMethod, ...] = (
    EdgeMethod("EAP", "|gradient x (corrupted - clean) sender output|, as a fraction of the gap", _edge_scores("eap")),
    EdgeMethod("EAP-IG", f"the same, the gradient averaged over {IG_STEPS} embedding interpolations", _edge_scores("eap-ig")),
    EdgeMethod("ACDC", f"distance increase when pruned (threshold {ACDC_THRESHOLD}, reverse topological order)",
               _edge_scores("acdc")),
    EdgeMethod("ACDC (threshold sweep)", f"the largest of the thresholds {', '.join(map(str, ACDC_SWEEP))} at which "
               "ACDC keeps the edge (0: never kept); its ROC is ACDC's paper's", _acdc_sweep),
)
EDGE_METHOD_NAMES = tuple(m.name for m in EDGE_METHODS)

