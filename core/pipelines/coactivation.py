"""Co-activation proposes, ablation disposes [CVC]: the pipeline from a model to a closure verdict.

METHODS.md, "Co-activation proposal" and "Step 3 and closure". The array half lives in core.stats.ising
(spins, pseudolikelihood fit, spectral clusters, ARI, candidate, route strata and their null) and
the ablation half in core.ablation.engine (ablation_study, closure_verdict). This module ties them to a
model checkpoint and a probe batch:

    HeadStats (cached instrumented pass) -> max attention at q -> per-head median spins
    -> Ising fit -> spectral clusters of |J|, k by best ARI against the Step-2 classes of the
    top-K PR-integral heads (or fixed) -> cluster table and candidate community
    -> closure: the candidate against 5 same-layer and 5 any-layer random controls on the same
       probe batch, every metric, both pass rules (a kind with a single possible control set is
       "inconclusive": its control spread is zero by construction).

Route-conditional (MoE): the router softmax at q, k-means strata, one Ising model per stratum,
the random-partition null and its z, the candidate from the discovery stratum (the stratum with the
best ARI), and the closure test split on / off that stratum (one ablation run, statistics per split,
as the reference computes them).

Defaults for small models (the reference settings are for 256 heads; `default_settings` says what
each model gets, and every report records what was used):
- labelled heads K = max(round(0.18 x heads), min(heads, 16)): the reference fraction, but at least
  16 labelled heads (or all heads), because an ARI over a handful of heads means little
  (36 heads -> 16, 8 heads -> 8, 256 heads -> 46; the published OLMo runs used the count 45);
- ks = the reference 4, 6, 8, 10, 12 up to half the heads (clusters of two heads on average);
  if fewer than two remain, 2 .. heads / 2 (36 heads -> 4..12, 8 heads -> 2, 3, 4);
- candidate size bounds: the reference 4 .. 12, clamped to min = min(4, max(2, heads / 8)) and
  max = the largest size <= min(12, heads / 2) that leaves at least 5 distinct any-layer control
  sets, so the closure test can draw its controls (36 heads -> 4..12, 8 heads -> 2..3: a 4-head
  candidate in 8 heads has a single disjoint control set).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from core.ablation.engine import (METRICS, AblationResult, ConditionMetrics, Verdict, ablation_study, closure_verdict,
                           condition_stats)
from core.errors import HeadLabError
from core.heads import Head, HeadSet, head_name
from core.stats.ising import (DEFAULT_C, DEFAULT_KS, AriByK, CandidateSelection, IsingFit, RouteNull, RouteStatistic,
                        ari_by_k, binarize_at_median, fit_ising_pseudolikelihood, max_attention_signal,
                        propose_candidate, random_partition_null, route_strata, stratum_statistic)

# ---------------------------------------------------------------------------------------------
# defaults and their rules

TOP_K_FRACTION = 0.18          # reference: K = round(0.18 x heads) labelled heads
MIN_LABELLED_HEADS = 16        # ... but at least this many (or all heads) on small models
REFERENCE_SIZE_BOUNDS = (4, 12)
DEFAULT_N_CONTROLS = 5         # reference closure test: 5 random controls per kind
DEFAULT_CONTROL_SEED = 123     # reference matched-random RandomState(123)
CLOSURE_KINDS = ("matched", "any-layer")
MIN_CONTROLS = 2               # with one control the spread is 0 by construction: the verdict is "inconclusive"
DEFAULT_STRATA = 4             # reference K = 4 routing strata
DEFAULT_N_NULL = 10            # reference: 10 random partitions
UNCLASSIFIED = "unclassified"  # the reference's name for a top-K head below 30x (the screen says "unspecialized")
SPLITS = ("all", "on", "off")  # all examples; on / off the discovery stratum (route-conditional only)


def default_top_k(n_heads: int) -> int:
    """Labelled heads: max(round(0.18 n), min(n, 16)) (see the module docstring)."""
    return int(max(round(TOP_K_FRACTION * n_heads), min(n_heads, MIN_LABELLED_HEADS)))


def default_ks(n_heads: int) -> tuple[int, ...]:
    """The reference ks up to n / 2; 2 .. n / 2 when fewer than two of them fit."""
    ks = tuple(k for k in DEFAULT_KS if k <= n_heads // 2)
    if len(ks) >= 2:
        return ks
    return tuple(range(2, max(2, n_heads // 2) + 1))


def default_size_bounds(n_heads: int, n_controls: int = DEFAULT_N_CONTROLS) -> tuple[int, int]:
    """(min, max) candidate size: the reference 4..12, with min = min(4, max(2, n / 8)) and max the largest
    size <= min(12, n / 2) that leaves n_controls distinct any-layer control sets (C(n - size, size))."""
    lo, hi = REFERENCE_SIZE_BOUNDS
    low = min(lo, max(2, n_heads // 8))
    high = min(hi, n_heads // 2)
    while high > low and math.comb(n_heads - high, high) < n_controls:
        high -= 1
    return int(low), int(max(low, high))


def default_settings(n_heads: int, n_controls: int = DEFAULT_N_CONTROLS) -> dict:
    """What a model of n_heads heads gets when nothing is fixed by the user."""
    low, high = default_size_bounds(n_heads, n_controls)
    return {"top_k": default_top_k(n_heads), "ks": list(default_ks(n_heads)), "min_size": low, "max_size": high}


def check_ks(ks: Sequence[int], n_heads: int) -> tuple[int, ...]:
    """Explicit ks, each a possible number of clusters (2 .. heads - 1); HeadLabError naming the bad ones."""
    out = tuple(int(k) for k in ks)
    if not out:
        raise HeadLabError("no k given; pass at least one number of clusters (reference: 4 6 8 10 12).")
    bad = [k for k in out if not 2 <= k < n_heads]
    if bad:
        raise HeadLabError(f"k = {', '.join(map(str, bad))} is not possible with {n_heads} heads; "
                           f"choose numbers of clusters between 2 and {n_heads - 1}.")
    return tuple(sorted(set(out)))


def check_fixed_k(k: int | None, n_heads: int) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not 2 <= int(k) < n_heads:
        raise HeadLabError(f"k = {k} clusters is not possible with {n_heads} heads; choose k between 2 and "
                           f"{n_heads - 1}, or leave it unset for the best-ARI k.")
    return int(k)


def supervised_labels(classes: Any, ranking: Sequence[Head], top_k: int) -> dict[Head, str]:
    """{head: Step-2 class} for the top_k heads of the PR-integral ranking; below-threshold heads are "unclassified".

    classes: [layer, head] class names (core.selectivity.classify / ScreenResult.classes).
    """
    cls = np.asarray(classes, dtype=object)
    if cls.ndim != 2:
        raise HeadLabError(f"classes must be a [layer, head] grid, got shape {cls.shape}.")
    n = cls.size
    if isinstance(top_k, bool) or not 2 <= int(top_k) <= n:
        raise HeadLabError(f"top-K = {top_k} labelled heads is not possible with {n} heads; choose 2 .. {n}.")
    out = {}
    for layer, head in list(ranking)[: int(top_k)]:
        name = str(cls[layer, head])
        out[(int(layer), int(head))] = UNCLASSIFIED if name in ("unspecialized", UNCLASSIFIED) else name
    return out


def _labels_json(labels: Mapping[Head, str]) -> list[dict]:
    return [{"layer": l, "head": h, "class": c} for (l, h), c in labels.items()]


def _labels_from_json(rows: Sequence[Mapping[str, Any]]) -> dict[Head, str]:
    return {(int(r["layer"]), int(r["head"])): str(r["class"]) for r in rows}


# ---------------------------------------------------------------------------------------------
# the proposal: spins -> fit -> clusters -> candidate (pure; arrays in, results out)


@dataclass(frozen=True, eq=False)
class Proposal:
    """Ising fit, ARI by k, the chosen k and the candidate community of one set of examples."""

    fit: IsingFit
    scores: AriByK
    k: int
    k_rule: str                          # "best ARI" or "fixed"
    selection: CandidateSelection
    n_examples: int

    def to_json(self) -> dict:
        return {"fit": self.fit.to_json(), "scores": self.scores.to_json(), "k": self.k, "k_rule": self.k_rule,
                "selection": self.selection.to_json(), "n_examples": self.n_examples}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Proposal":
        return cls(fit=IsingFit.from_json(data["fit"]), scores=AriByK.from_json(data["scores"]), k=int(data["k"]),
                   k_rule=str(data["k_rule"]), selection=CandidateSelection.from_json(data["selection"]),
                   n_examples=int(data["n_examples"]))


def propose(spins: Any, labels: Mapping[Head, str], *, n_head: int, ks: Sequence[int], k: int | None = None,
            n_init: int | None = 1, ari_n_init: int | None = None, min_size: int = 4, max_size: int = 12,
            C: float = DEFAULT_C, constant: str = "error", fit_method: str = "joint",
            allow_few_samples: bool = False) -> Proposal:
    """Fit the Ising model on spins [example, head], score k in ks by ARI, pick k, and choose the candidate.

    k: None = the best-ARI k (smallest on ties); a number fixes it. n_init: k-means restarts of the
    candidate clustering (reference 1); ari_n_init: of the per-k clusterings (reference: sklearn's default).
    constant: "error", or "zero" to leave constant heads out of the fit (zero couplings).
    """
    s = np.asarray(spins)
    n = s.shape[1]
    ks = check_ks(ks, n)
    k = check_fixed_k(k, n)
    fit = fit_ising_pseudolikelihood(s, C=C, method=fit_method, constant=constant, n_head=n_head,
                                     allow_few_samples=allow_few_samples)
    scores = ari_by_k(fit.J, labels, ks, n_head=n_head, n_init=ari_n_init)
    chosen = scores.best_k if k is None else k
    selection = propose_candidate(fit.J, labels, n_head=n_head, k=chosen, n_init=n_init, min_size=min_size,
                                  max_size=max_size)
    return Proposal(fit=fit, scores=scores, k=chosen, k_rule="best ARI" if k is None else "fixed",
                    selection=selection, n_examples=int(s.shape[0]))


# ---------------------------------------------------------------------------------------------
# route-conditional analysis (pure)


@dataclass(frozen=True, eq=False)
class RouteAnalysis:
    """Routing strata, the per-stratum statistic, its random-partition null, and the discovery stratum."""

    n_strata: int
    strata_seed: int
    strata: tuple[int, ...]              # stratum of each example
    sizes: tuple[int, ...]               # examples per stratum, by stratum id
    statistic: RouteStatistic
    null: RouteNull
    discovery_stratum: int               # the stratum with the best ARI (smallest id on ties)

    def to_json(self) -> dict:
        return {"n_strata": self.n_strata, "strata_seed": self.strata_seed, "strata": list(self.strata),
                "sizes": list(self.sizes), "statistic": self.statistic.to_json(), "null": self.null.to_json(),
                "discovery_stratum": self.discovery_stratum}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RouteAnalysis":
        return cls(n_strata=int(data["n_strata"]), strata_seed=int(data["strata_seed"]),
                   strata=tuple(int(x) for x in data["strata"]), sizes=tuple(int(x) for x in data["sizes"]),
                   statistic=RouteStatistic.from_json(data["statistic"]), null=RouteNull.from_json(data["null"]),
                   discovery_stratum=int(data["discovery_stratum"]))


def router_matrix(router_query: Any) -> np.ndarray:
    """Router softmax at q [example, layer, expert] -> [example, layer * expert]; HeadLabError for a dense model."""
    if router_query is None:
        raise HeadLabError("this model has no routers, so route conditioning does not apply; drop "
                           "--route-conditional or pick a mixture-of-experts model (e.g. induction-olmoe).")
    r = np.asarray(router_query.numpy() if hasattr(router_query, "numpy") else router_query, dtype=np.float64)
    if r.ndim != 3:
        raise HeadLabError(f"router weights must be [example, layer, expert], got shape {r.shape}; recompute the probe cache.")
    return r.reshape(r.shape[0], -1)  # [example, layer * expert]


def route_analysis(spins: Any, router_weights: Any, labels: Mapping[Head, str], *, n_head: int, ks: Sequence[int],
                   n_strata: int = DEFAULT_STRATA, strata_seed: int = 0, n_null: int = DEFAULT_N_NULL,
                   null_seed: int = 0, partition: str = "matched", C: float = DEFAULT_C,
                   ari_n_init: int | None = None) -> RouteAnalysis:
    """Strata by k-means on router weights [example, layer * expert]; one Ising fit per stratum; the null z."""
    s = np.asarray(spins)
    w = np.asarray(router_weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != s.shape[0]:
        raise HeadLabError(f"router weights must be [example, layer * expert] for the {s.shape[0]} examples, "
                           f"got shape {w.shape}.")
    ks = check_ks(ks, s.shape[1])
    strata = route_strata(w, K=n_strata, seed=strata_seed)      # [example]
    sizes = tuple(int((strata == g).sum()) for g in range(n_strata))
    stat = stratum_statistic(s, strata, labels, ks, n_head=n_head, C=C, n_init=ari_n_init)
    null = random_partition_null(s, sizes, labels, ks, n_head=n_head, n_null=n_null, seed=null_seed,
                                 partition=partition, observed=stat, C=C, n_init=ari_n_init)
    best = max(stat.per_stratum, key=lambda r: (r.ari, -r.stratum))
    return RouteAnalysis(n_strata=int(n_strata), strata_seed=int(strata_seed), strata=tuple(int(x) for x in strata),
                         sizes=sizes, statistic=stat, null=null, discovery_stratum=int(best.stratum))


# ---------------------------------------------------------------------------------------------
# closure: the candidate through the ablation engine, split by examples


@dataclass(frozen=True)
class ClosureSplit:
    """One control kind on one set of examples: per-metric statistics and both closure verdicts."""

    kind: str                    # "matched" (same layers) or "any-layer"
    split: str                   # "all", or "on" / "off" the discovery stratum
    n_examples: int
    stats: dict                  # metric -> candidate_delta, control_deltas, control_mean/std, z, rank, p, ...
    verdicts: dict               # "paper" / "reference" -> Verdict

    def z(self, metric: str) -> float | None:
        return self.stats[metric].get("z")

    def to_json(self) -> dict:
        return {"kind": self.kind, "split": self.split, "n_examples": self.n_examples, "stats": self.stats,
                "verdicts": {k: v.to_json() for k, v in self.verdicts.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ClosureSplit":
        return cls(kind=str(data["kind"]), split=str(data["split"]), n_examples=int(data["n_examples"]),
                   stats=dict(data["stats"]), verdicts={k: Verdict.from_json(v) for k, v in data["verdicts"].items()})


def _subset(c: ConditionMetrics, index: np.ndarray) -> ConditionMetrics:
    return ConditionMetrics(c.label, c.ablation, *(c.values(m)[index] for m in METRICS))


def split_closure(result: AblationResult, index: Any = None, split: str = "all", *, headline: str = "logit",
                  z_threshold: float = 1.8, n_boot: int = 2000, boot_seed: int = 0) -> ClosureSplit:
    """Statistics and verdicts of one ablation run restricted to the examples `index` (None: all).

    Deltas are taken within the split (candidate, controls and clean on the same examples), as the
    reference's route-conditioned closure test does.
    """
    n = result.clean.n_examples
    idx = np.arange(n) if index is None else np.asarray(index)
    if idx.dtype == bool:
        idx = np.flatnonzero(idx)
    if idx.size == 0:
        raise HeadLabError(f"the '{split}' split holds no examples; use fewer strata or more examples.")
    clean, cand = _subset(result.clean, idx), _subset(result.candidate, idx)
    controls = [_subset(c, idx) for c in result.controls]
    upper = None if result.upper_bound is None else _subset(result.upper_bound, idx)
    stats = condition_stats(clean, cand, controls, upper, METRICS, n_boot, boot_seed)
    cand_d = {m: stats[m]["candidate_delta"] for m in METRICS}
    ctrl_d = {m: stats[m]["control_deltas"] for m in METRICS}
    verdicts = {rule: closure_verdict(cand_d, ctrl_d, rule, headline, z_threshold) for rule in ("paper", "reference")}
    if len(controls) < MIN_CONTROLS:
        why = (f"only {len(controls)} control could be drawn, so the control spread is zero by construction and z "
               "means nothing; pick a smaller community or a model with more heads.")
        verdicts = {rule: Verdict("inconclusive", v.rule, (why,) + v.reasons, v.z) for rule, v in verdicts.items()}
    return ClosureSplit(kind=result.control_sets.kind, split=split, n_examples=int(idx.size), stats=stats,
                        verdicts=verdicts)


@dataclass(frozen=True, eq=False)
class ClosureTest:
    """The candidate against random controls of each kind; one ablation run per kind, split by examples."""

    selection: HeadSet
    n_controls: int
    control_seed: int
    mode: str
    headline: str
    z_threshold: float
    results: dict                # kind -> AblationResult
    splits: tuple[ClosureSplit, ...]
    skipped: dict                # kind -> why it could not run (e.g. no disjoint matched control exists)

    def split(self, kind: str, split: str = "all") -> ClosureSplit | None:
        return next((s for s in self.splits if s.kind == kind and s.split == split), None)

    def to_json(self) -> dict:
        return {"selection": self.selection.to_json(), "n_controls": self.n_controls,
                "control_seed": self.control_seed, "mode": self.mode, "headline": self.headline,
                "z_threshold": self.z_threshold, "results": {k: r.to_json() for k, r in self.results.items()},
                "splits": [s.to_json() for s in self.splits], "skipped": dict(self.skipped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ClosureTest":
        return cls(selection=HeadSet.from_json(data["selection"]), n_controls=int(data["n_controls"]),
                   control_seed=int(data["control_seed"]), mode=str(data["mode"]), headline=str(data["headline"]),
                   z_threshold=float(data["z_threshold"]),
                   results={k: AblationResult.from_json(r) for k, r in data["results"].items()},
                   splits=tuple(ClosureSplit.from_json(s) for s in data["splits"]), skipped=dict(data["skipped"]))


def closure_test(model: Any, batch: Any, selection: HeadSet, *, n_controls: int = DEFAULT_N_CONTROLS,
                 control_seed: int = DEFAULT_CONTROL_SEED, kinds: Sequence[str] = CLOSURE_KINDS, mode: str = "zero",
                 on_stratum: Any = None, headline: str = "logit", z_threshold: float = 1.8, device: str | None = None,
                 progress: Optional[Callable[[int, int], None]] = None) -> ClosureTest:
    """Ablate `selection` against n_controls controls of each kind (plus the upper bound) on `batch`.

    on_stratum: bool [example] marking the discovery stratum; then every kind is also reported on
    and off it. A kind that cannot be drawn (the candidate holds more than half of a layer, or of
    the model) is recorded in `skipped` with the reason; if no kind runs, HeadLabError.
    """
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    results, splits, skipped = {}, [], {}
    mask = None if on_stratum is None else np.asarray(on_stratum, dtype=bool)
    if mask is not None and mask.shape != (batch.tokens.shape[0],):
        raise HeadLabError(f"the stratum mask must mark each of the {batch.tokens.shape[0]} probe examples.")
    for kind in kinds:
        try:
            result = ablation_study(model, batch, selection, n_controls=n_controls, controls=kind, mode=mode,
                                    seed=control_seed, include_upper_bound=True, device=device, progress=progress,
                                    z_threshold=z_threshold)
        except HeadLabError as exc:
            skipped[kind] = str(exc)
            continue
        results[kind] = result
        splits.append(split_closure(result, None, "all", headline=headline, z_threshold=z_threshold))
        if mask is not None:
            splits.append(split_closure(result, mask, "on", headline=headline, z_threshold=z_threshold))
            splits.append(split_closure(result, ~mask, "off", headline=headline, z_threshold=z_threshold))
    if not results:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise HeadLabError(f"no control could be drawn for {selection} ({reasons}); pick a smaller community.")
    return ClosureTest(selection=selection, n_controls=int(n_controls), control_seed=int(control_seed), mode=mode,
                       headline=headline, z_threshold=float(z_threshold), results=results, splits=tuple(splits),
                       skipped=skipped)


# ---------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True, eq=False)
class CoactivationReport:
    """The co-activation proposal and its closure test for one checkpoint and probe, with provenance.

    classes: [layer, head] Step-2 class of every head at this checkpoint (for colouring);
    labels: the top-K PR-integral heads with their class (what ARI and purity are scored against);
    proposal: fit, ARI by k and candidate (route-conditional: of the discovery stratum);
    route: strata, statistic and null (None for the plain analysis); closure: None when not run.
    """

    model: str
    revision: str
    tokens: int
    probe_spec: dict
    shape: tuple[int, int]
    settings: dict
    classes: tuple[tuple[str, ...], ...]
    labels: dict
    proposal: Proposal
    route: RouteAnalysis | None
    closure: ClosureTest | None
    notes: tuple[str, ...]
    provenance: dict

    @property
    def candidate(self) -> HeadSet:
        return HeadSet(self.proposal.selection.candidate.heads)

    @property
    def J(self) -> np.ndarray:
        return self.proposal.fit.J

    @property
    def cluster_labels(self) -> tuple[int, ...]:
        """Cluster id per flat head (layer * n_head + head) of the candidate clustering."""
        return self.proposal.selection.cluster_labels

    def community(self, cluster: int) -> HeadSet:
        for info in self.proposal.selection.clusters:
            if info.cluster == int(cluster):
                return HeadSet(info.heads)
        raise HeadLabError(f"there is no community {cluster}; pick one of the table's clusters.")

    def summary(self) -> dict:
        """The figures a reader wants first (what the CLI prints)."""
        sel = self.proposal.selection
        cand = sel.candidate
        out = {
            "model": self.model, "revision": self.revision, "probe": self.probe_spec.get("task"),
            "k": self.proposal.k, "k_rule": self.proposal.k_rule,
            "ari_at_k": {str(m.k): m.ari for m in self.proposal.scores.metrics},
            "candidate": [head_name(h) for h in cand.heads], "candidate_cluster": cand.cluster,
            "purity": cand.purity, "isolation": cand.isolation_ratio, "combined_score": cand.combined_score,
            "size_fallback": sel.fallback,
        }
        if self.route is not None:
            r = self.route
            out["route"] = {"sizes": list(r.sizes), "discovery_stratum": r.discovery_stratum,
                            "per_stratum_ari": [s.ari for s in r.statistic.per_stratum],
                            "max_ari": r.statistic.max_ari, "null_mean": r.null.null_max_mean,
                            "null_std": r.null.null_max_std, "z": r.null.z_max}
        if self.closure is not None:
            out["closure"] = [{"kind": s.kind, "split": s.split, "n": s.n_examples,
                               "delta": {m: s.stats[m]["candidate_delta"] for m in METRICS},
                               "z": {m: s.z(m) for m in METRICS},
                               "verdict_paper": s.verdicts["paper"].label,
                               "verdict_reference": s.verdicts["reference"].label} for s in self.closure.splits]
            out["closure_skipped"] = dict(self.closure.skipped)
        return out

    def to_json(self) -> dict:
        return {
            "model": self.model, "revision": self.revision, "tokens": self.tokens, "probe_spec": self.probe_spec,
            "shape": list(self.shape), "settings": self.settings, "classes": [list(r) for r in self.classes],
            "labels": _labels_json(self.labels), "proposal": self.proposal.to_json(),
            "route": None if self.route is None else self.route.to_json(),
            "closure": None if self.closure is None else self.closure.to_json(),
            "notes": list(self.notes), "provenance": self.provenance, "summary": self.summary(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> "CoactivationReport":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(model=str(data["model"]), revision=str(data["revision"]), tokens=int(data["tokens"]),
                   probe_spec=dict(data["probe_spec"]), shape=tuple(int(x) for x in data["shape"]),
                   settings=dict(data["settings"]), classes=tuple(tuple(str(c) for c in r) for r in data["classes"]),
                   labels=_labels_from_json(data["labels"]), proposal=Proposal.from_json(data["proposal"]),
                   route=None if data.get("route") is None else RouteAnalysis.from_json(data["route"]),
                   closure=None if data.get("closure") is None else ClosureTest.from_json(data["closure"]),
                   notes=tuple(data.get("notes", ())), provenance=dict(data.get("provenance", {})))


# ---------------------------------------------------------------------------------------------
# the pipeline on a model


def coactivation(ref: Any, revision: str | None, spec: Any, *, route_conditional: bool = False,
                 top_k: int | float | None = None, ks: Sequence[int] | None = None, k: int | None = None,
                 n_init: int | None = 1, ari_n_init: int | None = None, min_size: int | None = None,
                 max_size: int | None = None, C: float = DEFAULT_C, drop_constant: bool = False,
                 n_strata: int = DEFAULT_STRATA, strata_seed: int = 0, n_null: int = DEFAULT_N_NULL,
                 null_seed: int = 0, partition: str = "matched", run_closure: bool = True,
                 n_controls: int = DEFAULT_N_CONTROLS, control_seed: int = DEFAULT_CONTROL_SEED, mode: str = "zero",
                 headline: str = "logit", z_threshold: float = 1.8, device: str = "cpu", model: Any = None,
                 say: Optional[Callable[[str], None]] = None) -> CoactivationReport:
    """The co-activation pipeline on checkpoint `revision` (None: the final one) of `ref` with probe `spec`.

    top_k / ks / min_size / max_size: None = default_settings for this model's size; k: None = best ARI.
    The PR-integral ranking behind the labelled heads is over every checkpoint of the model (as the
    reference ranks over its whole trajectory); the Step-2 classes are those at `revision`.
    drop_constant: heads whose spin never changes are left out of the fit (zero couplings) instead of
    an error. model: an already loaded model of this checkpoint (else loaded when needed).
    """
    from core.model.loading import load_config, load_model, resolve_checkpoint
    from core.pipelines.recipe import build_probe, head_stats, screen, screen_checkpoint
    from core.stats.spectral import resolve_k
    from core.store import check_spec_fits_config

    say = say or (lambda text: None)
    started = time.perf_counter()
    checkpoint = resolve_checkpoint(ref, revision)
    check_spec_fits_config(spec, load_config(ref, checkpoint.revision))
    batch = build_probe(spec)

    def loaded():
        nonlocal model
        if model is None:
            model = load_model(ref, checkpoint.revision, device=device)
        return model

    say(f"measuring every head at {checkpoint.revision}")
    stats = head_stats(ref, checkpoint, batch, model=model, device=device)
    n_layers, n_head = int(stats.attn_max.shape[1]), int(stats.attn_max.shape[2])
    n = n_layers * n_head
    defaults = default_settings(n, n_controls)
    ks = default_ks(n) if ks is None else check_ks(ks, n)
    k = check_fixed_k(k, n)
    min_size = defaults["min_size"] if min_size is None else int(min_size)
    max_size = defaults["max_size"] if max_size is None else int(max_size)
    if not 1 <= min_size <= max_size <= n:
        raise HeadLabError(f"candidate size bounds {min_size}..{max_size} are not possible with {n} heads; "
                           f"use 1 <= min <= max <= {n} (default here {defaults['min_size']}..{defaults['max_size']}).")
    K = defaults["top_k"] if top_k is None else resolve_k(top_k, n)
    router = router_matrix(stats.router_query) if route_conditional else None  # dense model: error before any fit

    signal = max_attention_signal(stats.attn_max)       # [example, layer * n_head + head]
    spins = binarize_at_median(signal, n_head=n_head, allow_constant=drop_constant)  # [example, head] in {-1, +1}
    notes: list[str] = []
    constant = np.flatnonzero(np.all(spins == spins[:1], axis=0))
    if len(constant):
        notes.append(f"{len(constant)} head(s) never change sign and were left out of the fit (zero couplings): "
                     f"{', '.join(head_name(divmod(int(f), n_head)) for f in constant)}.")

    say("screening checkpoints for the PR-integral ranking and the Step-2 classes")
    report = screen(ref, spec, k=K, n_null_draws=0, device=device)
    if checkpoint.revision == report.checkpoints[-1].revision:
        here = report.final
    else:
        here = screen_checkpoint(stats, n_null_draws=0)
    classes = here.classes                                      # [layer, head]
    labels = supervised_labels(classes, report.spectral.ranking, K)

    route = None
    if route_conditional:
        say(f"route strata (K = {n_strata}), one Ising fit per stratum, {n_null} random partitions")
        route = route_analysis(spins, router, labels, n_head=n_head, ks=ks, n_strata=n_strata,
                               strata_seed=strata_seed, n_null=n_null, null_seed=null_seed, partition=partition,
                               C=C, ari_n_init=ari_n_init)
        rows = np.asarray(route.strata) == route.discovery_stratum
        proposal = propose(spins[rows], labels, n_head=n_head, ks=ks, k=k, n_init=n_init, ari_n_init=ari_n_init,
                           min_size=min_size, max_size=max_size, C=C, constant="zero", allow_few_samples=True)
        if proposal.fit.constant_heads:
            notes.append(f"inside the discovery stratum {len(proposal.fit.constant_heads)} head(s) never change sign "
                         "and have zero couplings there.")
    else:
        say("fitting the Ising model and clustering |J|")
        proposal = propose(spins, labels, n_head=n_head, ks=ks, k=k, n_init=n_init, ari_n_init=ari_n_init,
                           min_size=min_size, max_size=max_size, C=C, constant="zero" if drop_constant else "error")
    if proposal.selection.fallback:
        notes.append(f"no community has {min_size}..{max_size} heads at k = {proposal.k}; every community was scored.")

    closure = None
    if run_closure:
        say(f"closure test of {HeadSet(proposal.selection.candidate.heads)} against {n_controls} controls per kind")
        on = None if route is None else np.asarray(route.strata) == route.discovery_stratum
        closure = closure_test(loaded(), batch, HeadSet(proposal.selection.candidate.heads), n_controls=n_controls,
                               control_seed=control_seed, mode=mode, on_stratum=on, headline=headline,
                               z_threshold=z_threshold, device=device)
        for kind, reason in closure.skipped.items():
            notes.append(f"{kind} controls skipped: {reason}")
        for kind, result in closure.results.items():
            if result.control_sets.note:
                notes.append(f"{kind} controls: {result.control_sets.note}")

    from core.figures.bundle import package_versions

    settings = {
        "signal": "max attention over keys at the query position", "binarization": "per-head median, strictly greater -> +1",
        "route_conditional": route_conditional, "top_k": K, "top_k_rule": "given" if top_k is not None else
        f"default max(round({TOP_K_FRACTION} x heads), min(heads, {MIN_LABELLED_HEADS}))",
        "ks": list(ks), "k": k, "n_init": n_init, "ari_n_init": ari_n_init, "min_size": min_size, "max_size": max_size,
        "C": C, "fit_method": "joint", "drop_constant": drop_constant, "spectral_random_state": 0,
        "class_threshold": here.threshold, "class_baseline": here.baseline,
        "pr_integral": {"definition": report.spectral.definition, "rule": report.spectral.rule,
                        "checkpoints": len(report.checkpoints), "over": "every checkpoint of the model"},
        "n_controls": n_controls, "control_seed": control_seed, "closure_kinds": list(CLOSURE_KINDS), "mode": mode,
        "headline": headline, "z_threshold": z_threshold, "run_closure": run_closure,
    }
    if route_conditional:
        settings.update({"n_strata": n_strata, "strata_seed": strata_seed, "n_null": n_null, "null_seed": null_seed,
                         "null_partition": partition})
    provenance = {"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                  "probe_spec": dict(batch.spec), "n_examples": batch.n_examples, "seconds": time.perf_counter() - started,
                  "versions": package_versions(), "headstats_code_version": stats.code_version}
    return CoactivationReport(model=ref.name, revision=checkpoint.revision, tokens=int(checkpoint.tokens),
                              probe_spec=dict(batch.spec), shape=(n_layers, n_head), settings=settings,
                              classes=tuple(tuple(str(c) for c in row) for row in classes), labels=labels,
                              proposal=proposal, route=route, closure=closure, notes=tuple(notes), provenance=provenance)


# ---------------------------------------------------------------------------------------------
# command line


def add_coactivation_arguments(parser: argparse.ArgumentParser) -> None:
    from core.store import add_probe_spec_arguments

    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    add_probe_spec_arguments(parser)
    parser.add_argument("--route-conditional", action="store_true",
                        help="MoE models: strata from the router weights at q, one Ising fit per stratum, the "
                             "random-partition null, closure on and off the discovery stratum")
    parser.add_argument("--top-k", type=float, default=None,
                        help="labelled top-K PR-integral heads: a count or a fraction (default max(round(0.18 n), min(n, 16)))")
    parser.add_argument("--ks", type=int, nargs="+", default=None,
                        help="numbers of clusters to score by ARI (default 4 6 8 10 12 up to half the heads)")
    parser.add_argument("--k", type=int, default=None, help="fix k (default: the best-ARI k)")
    parser.add_argument("--n-init", type=int, default=1, help="k-means restarts of the candidate clustering (reference 1)")
    parser.add_argument("--min-size", type=int, default=None, help="smallest candidate (default min(4, max(2, n/8)))")
    parser.add_argument("--max-size", type=int, default=None,
                        help="largest candidate (default: up to min(12, n/2), leaving 5 any-layer control sets)")
    parser.add_argument("--C", type=float, default=DEFAULT_C, help="inverse L2 strength of the fit (reference 1000)")
    parser.add_argument("--drop-constant", action="store_true",
                        help="leave heads whose spin never changes out of the fit instead of stopping")
    parser.add_argument("--strata", type=int, default=DEFAULT_STRATA, help="routing strata K (reference 4)")
    parser.add_argument("--null", type=int, default=DEFAULT_N_NULL, help="random partitions of the null (reference 10)")
    parser.add_argument("--null-partition", choices=("matched", "reference"), default="matched",
                        help="matched: exact stratum sizes (default); reference: uniform labels")
    parser.add_argument("--controls", type=int, default=DEFAULT_N_CONTROLS, help="random controls per kind (default 5)")
    parser.add_argument("--control-seed", type=int, default=DEFAULT_CONTROL_SEED)
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--no-closure", action="store_true", help="stop after the proposal (no ablation)")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="also export the figures (PNG/SVG/PDF + CSV/JSON) into DIR")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.3g}" if abs(value) < 1e4 else f"{value:+.2e}"
    return str(value)


def print_summary(report: CoactivationReport) -> None:
    s = report.summary()
    print(f"co-activation: {report.model} @ {report.revision}, {report.probe_spec.get('task')} probe, "
          f"N = {report.provenance.get('n_examples')}, {report.shape[0]} x {report.shape[1]} heads; "
          f"{len(report.labels)} labelled heads (top-K PR integral)")
    if report.route is not None:
        r = s["route"]
        print(f"route strata (K = {report.route.n_strata}): sizes {r['sizes']}, best ARI per stratum "
              + ", ".join(f"{a:.3f}" for a in r["per_stratum_ari"])
              + f"; statistic {r['max_ari']:.3f} vs null {r['null_mean']:.3f} +- {r['null_std']:.3f} -> z = {_fmt(r['z'])}; "
              f"discovery stratum {r['discovery_stratum']}")
    print("ARI by k: " + ", ".join(f"k={k}: {v:.3f}" for k, v in s["ari_at_k"].items())
          + f"  -> k = {s['k']} ({s['k_rule']})")
    print(f"candidate community {s['candidate_cluster']}: {', '.join(s['candidate'])} "
          f"(purity {s['purity']:.3f}, isolation {s['isolation']:.3f}, score {s['combined_score']:.3f})")
    if report.closure is not None:
        print(f"closure test ({report.closure.n_controls} controls per kind, {report.closure.mode} ablation, "
              f"headline {report.closure.headline}):")
        print(f"  {'controls':10s}{'split':6s}{'n':>5s}" + "".join(f"{'d ' + m:>15s}{'z':>11s}" for m in METRICS)
              + "   paper / reference")
        for row in s["closure"]:
            cells = "".join(f"{row['delta'][m]:>+15.4g}{_fmt(row['z'][m]):>11s}" for m in METRICS)
            print(f"  {row['kind']:10s}{row['split']:6s}{row['n']:>5d}{cells}   {row['verdict_paper']} / "
                  f"{row['verdict_reference']}")
    for note in report.notes:
        print(f"note: {note}")


def cli_coactivation(args: argparse.Namespace) -> dict:
    from core.model.loading import ModelRef
    from core.store import probe_spec_from_args

    ref = ModelRef.parse(args.model)
    top_k = None if args.top_k is None else (int(args.top_k) if args.top_k >= 1 else float(args.top_k))
    report = coactivation(ref, args.revision, probe_spec_from_args(args), route_conditional=args.route_conditional,
                          top_k=top_k, ks=args.ks, k=args.k, n_init=args.n_init, min_size=args.min_size,
                          max_size=args.max_size, C=args.C, drop_constant=args.drop_constant, n_strata=args.strata,
                          n_null=args.null, partition=args.null_partition, run_closure=not args.no_closure,
                          n_controls=args.controls, control_seed=args.control_seed, mode=args.mode,
                          device=args.device, say=lambda text: print(f"... {text}"))
    print_summary(report)
    if args.figures:
        from core.figures.bundle import export_bundle
        from core.figures.coactivation import coactivation_bundles

        for bundle in coactivation_bundles(report):
            export_bundle(bundle, args.figures)
        print(f"figures written to {args.figures}")
    return report.to_json()
