"""Co-activation proposes, ablation disposes [CVC]: the pipeline from a model to a closure verdict.

METHODS.md, "Co-activation proposal" and "Step 3 and closure". The array half lives in core.stats
(spins, ising: the pseudolikelihood fit, clusters: spectral clusters, ARI and the candidate, routes:
route strata and their null) and the closure test in core.pipelines.closure (over the ablation
engine). This module ties them to a model checkpoint and a probe batch, with every choice in one
`CoactivationSettings`:

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

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from core.ablation.spec import PROBE_MODES
from core.ablation.study import AblationSettings
from core.choices import COACTIVATION_NULL as DEFAULT_N_NULL, COACTIVATION_STRATA as DEFAULT_STRATA
from core.errors import HeadLabError
from core.executor import Executor
from core.heads import Head, HeadSet, head_name
from core.model.loading import DEFAULT_DTYPE, load_config, load_model
from core.model.refs import resolve_checkpoint
from core.pipelines.closure import (CLOSURE_KINDS, DEFAULT_CONTROL_SEED, DEFAULT_N_CONTROLS, ClosureTest,
                                    closure_test)
from core.pipelines.recipe import ScreenSettings, screen, screen_checkpoint
from core.probe import check_probe_fits, head_stats
from core.results import JsonResult, package_versions
from core.stats.clusters import DEFAULT_KS, AriByK, CandidateSelection, ari_by_k, propose_candidate
from core.stats.inference import METRICS
from core.stats.ising import DEFAULT_C, IsingFit, check_converged, fit_ising_pseudolikelihood
from core.stats.routes import (PARTITIONS, RouteNull, RouteStatistic, random_partition_null, route_strata, stratum_statistic,
                               unconverged_strata)
from core.stats.spectral import DEFAULT_DEFINITION, pr_per_head, rank_heads, resolve_k
from core.stats.spins import binarize_at_median, max_attention_signal

# ---------------------------------------------------------------------------------------------
# defaults and their rules

TOP_K_FRACTION = 0.18          # reference: K = round(0.18 x heads) labelled heads
MIN_LABELLED_HEADS = 16        # ... but at least this many (or all heads) on small models
REFERENCE_SIZE_BOUNDS = (4, 12)
UNCLASSIFIED = "unclassified"  # the reference's name for a top-K head below 30x (the screen says "unspecialized")


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

    classes: [layer, head] class names (core.stats.selectivity.classify / ScreenResult.classes).
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
# the settings: every choice besides the model, checkpoint and probe


def _is_whole(value: Any, least: int) -> bool:
    """value is a whole number >= least (not a bool)."""
    try:
        return not isinstance(value, bool) and int(value) == value and int(value) >= least
    except (TypeError, ValueError):
        return False


def _whole(name: str, value: Any, least: int, optional: bool = False) -> int | None:
    """value as an int >= least (None passes when optional); HeadLabError naming the argument otherwise."""
    if value is None and optional:
        return None
    if not _is_whole(value, least):
        unset = ", or leave it unset" if optional else ""
        raise HeadLabError(f"{name} = {value!r}; use a whole number of at least {least}{unset}.")
    return int(value)


@dataclass(frozen=True)
class CoactivationSettings(JsonResult):
    """Everything that determines a CoactivationReport besides the model, the checkpoint and the probe.

    Frozen and hashable, so the pages use it as their cache key. None = the default for the model's
    size (`default_settings`, filled in by `resolved`); k None = the best-ARI k. top_k: a count of
    labelled heads or a fraction of all heads; n_init / ari_n_init: k-means restarts of the
    candidate clustering (reference 1) and of the per-k clusterings (None: scikit-learn's default);
    drop_constant: heads whose spin never changes get zero couplings instead of an error;
    n_strata ... partition: the route-conditional analysis (MoE); n_controls ... z_threshold: the
    closure test of the candidate (core.pipelines.closure); allow_unconverged: cluster an Ising fit
    that did not converge (refused by default; the report's proposal.fit.converged says which).
    """

    route_conditional: bool = False
    top_k: int | float | None = None
    ks: tuple[int, ...] | None = None
    k: int | None = None
    n_init: int | None = 1
    ari_n_init: int | None = None
    min_size: int | None = None
    max_size: int | None = None
    C: float = DEFAULT_C
    drop_constant: bool = False
    n_strata: int = DEFAULT_STRATA
    strata_seed: int = 0
    n_null: int = DEFAULT_N_NULL
    null_seed: int = 0
    partition: str = "matched"
    run_closure: bool = True
    n_controls: int = DEFAULT_N_CONTROLS
    control_seed: int = DEFAULT_CONTROL_SEED
    mode: str = "zero"
    headline: str = "logit"
    z_threshold: float = 1.8
    allow_unconverged: bool = False

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name in ("route_conditional", "drop_constant", "run_closure", "allow_unconverged"):
            put(name, bool(getattr(self, name)))
        for name in ("strata_seed", "null_seed", "control_seed"):
            put(name, int(getattr(self, name)))
        for name, least in (("n_strata", 2), ("n_null", 1), ("n_controls", 1)):
            put(name, _whole(name, getattr(self, name), least))
        for name in ("n_init", "ari_n_init", "min_size", "max_size"):
            put(name, _whole(name, getattr(self, name), 1, optional=True))
        put("C", float(self.C))
        put("z_threshold", float(self.z_threshold))
        if self.top_k is not None:
            number = isinstance(self.top_k, (int, float, np.integer, np.floating)) and not isinstance(self.top_k, bool)
            if not (number and self.top_k > 0):
                raise HeadLabError(f"top_k = {self.top_k!r}; give a count of labelled heads or a fraction in (0, 1).")
            put("top_k", int(self.top_k) if isinstance(self.top_k, (int, np.integer)) else float(self.top_k))
        if self.ks is not None:
            ks = tuple(self.ks)
            if not ks:
                raise HeadLabError("no k given; pass at least one number of clusters (reference: 4 6 8 10 12).")
            bad = [k for k in ks if not _is_whole(k, 2)]
            if bad:
                raise HeadLabError(f"ks: k = {', '.join(map(str, bad))} is not a number of clusters; use 2 or more.")
            put("ks", tuple(sorted({int(k) for k in ks})))
        if self.k is not None and not _is_whole(self.k, 2):
            raise HeadLabError(f"k = {self.k} clusters is not possible; choose k of 2 or more, or leave it unset "
                               "for the best-ARI k.")
        put("k", None if self.k is None else int(self.k))
        if self.min_size is not None and self.max_size is not None and self.min_size > self.max_size:
            raise HeadLabError(f"min_size = {self.min_size} is above max_size = {self.max_size}; the candidate size "
                               "bounds must not be empty.")
        if not (self.C > 0 and math.isfinite(self.C)):
            raise HeadLabError(f"C = {self.C}; the inverse L2 strength must be a positive number (reference 1000).")
        if not (self.z_threshold > 0 and math.isfinite(self.z_threshold)):
            raise HeadLabError(f"z_threshold = {self.z_threshold}; use a positive number (reference 1.8).")
        if self.partition not in PARTITIONS:
            raise HeadLabError(f"partition {self.partition!r} is unknown; use one of {', '.join(PARTITIONS)}.")
        if self.mode not in PROBE_MODES:
            raise HeadLabError(f"ablation mode {self.mode!r} is not one of a probe's; use one of {', '.join(PROBE_MODES)}.")
        if self.headline not in ("logit", "loss"):
            raise HeadLabError(f"headline {self.headline!r} is unknown; use 'logit' or 'loss'.")

    def resolved(self, n_heads: int) -> "CoactivationSettings":
        """These settings for a model of n_heads heads: defaults filled in, each value checked against the model."""
        defaults = default_settings(n_heads, self.n_controls)
        ks = default_ks(n_heads) if self.ks is None else check_ks(self.ks, n_heads)
        k = check_fixed_k(self.k, n_heads)
        min_size = defaults["min_size"] if self.min_size is None else self.min_size
        max_size = defaults["max_size"] if self.max_size is None else self.max_size
        if not 1 <= min_size <= max_size <= n_heads:
            raise HeadLabError(f"candidate size bounds {min_size}..{max_size} are not possible with {n_heads} heads; "
                               f"use 1 <= min <= max <= {n_heads} (default here {defaults['min_size']}..{defaults['max_size']}).")
        top_k = defaults["top_k"] if self.top_k is None else resolve_k(self.top_k, n_heads)
        return replace(self, top_k=top_k, ks=ks, k=k, min_size=min_size, max_size=max_size)


# ---------------------------------------------------------------------------------------------
# the proposal: spins -> fit -> clusters -> candidate (pure; arrays in, results out)


@dataclass(frozen=True, eq=False)
class IsingProposal(JsonResult):
    """Ising fit, ARI by k, the chosen k and the candidate community of one set of examples."""

    fit: IsingFit
    scores: AriByK
    k: int
    k_rule: str                          # "best ARI" or "fixed"
    selection: CandidateSelection
    n_examples: int


def propose(spins: Any, labels: Mapping[Head, str], settings: CoactivationSettings = CoactivationSettings(), *,
            n_head: int, constant: str = "error", fit_method: str = "joint",
            allow_few_samples: bool = False) -> IsingProposal:
    """Fit the Ising model on spins [example, head], score k in ks by ARI, pick k, and choose the candidate.

    settings: ks, k (None = the best-ARI k, smallest on ties), n_init, ari_n_init, the size bounds
    and C; unset values take this many heads' defaults. constant: "error", or "zero" to leave
    constant heads out of the fit (zero couplings). An unconverged fit is refused (HeadLabError)
    unless settings.allow_unconverged.
    """
    s = np.asarray(spins)
    st = settings.resolved(s.shape[1])
    fit = fit_ising_pseudolikelihood(s, C=st.C, method=fit_method, constant=constant, n_head=n_head,
                                     allow_few_samples=allow_few_samples)
    check_converged(fit, "the Ising fit", st.allow_unconverged)
    scores = ari_by_k(fit.J, labels, st.ks, n_head=n_head, n_init=st.ari_n_init)
    chosen = scores.best_k if st.k is None else st.k
    selection = propose_candidate(fit.J, labels, n_head=n_head, k=chosen, n_init=st.n_init, min_size=st.min_size,
                                  max_size=st.max_size)
    return IsingProposal(fit=fit, scores=scores, k=chosen, k_rule="best ARI" if st.k is None else "fixed",
                         selection=selection, n_examples=int(s.shape[0]))


# ---------------------------------------------------------------------------------------------
# route-conditional analysis (pure)


@dataclass(frozen=True, eq=False)
class RouteAnalysis(JsonResult):
    """Routing strata, the per-stratum statistic, its random-partition null, and the discovery stratum."""

    n_strata: int
    strata_seed: int
    strata: tuple[int, ...]              # stratum of each example
    sizes: tuple[int, ...]               # examples per stratum, by stratum id
    statistic: RouteStatistic
    null: RouteNull
    discovery_stratum: int               # the stratum with the best ARI (smallest id on ties)


def router_matrix(router_query: Any) -> np.ndarray:
    """Router softmax at q [example, layer, expert] -> [example, layer * expert]; HeadLabError for a dense model."""
    if router_query is None:
        raise HeadLabError("this model has no routers, so route conditioning does not apply; drop "
                           "--route-conditional or pick a mixture-of-experts model (e.g. induction-olmoe).")
    r = np.asarray(router_query.numpy() if hasattr(router_query, "numpy") else router_query, dtype=np.float64)
    if r.ndim != 3:
        raise HeadLabError(f"router weights must be [example, layer, expert], got shape {r.shape}; recompute the probe cache.")
    return r.reshape(r.shape[0], -1)  # [example, layer * expert]


def route_analysis(spins: Any, router_weights: Any, labels: Mapping[Head, str],
                   settings: CoactivationSettings = CoactivationSettings(), *, n_head: int) -> RouteAnalysis:
    """Strata by k-means on router weights [example, layer * expert]; one Ising fit per stratum; the null z.

    settings: ks (unset: this many heads' default), n_strata, strata_seed, n_null, null_seed, partition, C, ari_n_init.
    """
    s = np.asarray(spins)
    w = np.asarray(router_weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != s.shape[0]:
        raise HeadLabError(f"router weights must be [example, layer * expert] for the {s.shape[0]} examples, "
                           f"got shape {w.shape}.")
    ks = default_ks(s.shape[1]) if settings.ks is None else check_ks(settings.ks, s.shape[1])
    strata = route_strata(w, K=settings.n_strata, seed=settings.strata_seed)      # [example]
    sizes = tuple(int((strata == g).sum()) for g in range(settings.n_strata))
    stat = stratum_statistic(s, strata, labels, ks, n_head=n_head, C=settings.C, n_init=settings.ari_n_init)
    null = random_partition_null(s, sizes, labels, ks, n_head=n_head,
                                 seeds=range(settings.null_seed, settings.null_seed + settings.n_null),
                                 partition=settings.partition, observed=stat, C=settings.C, n_init=settings.ari_n_init)
    unconverged = unconverged_strata(stat, null)
    if unconverged and not settings.allow_unconverged:
        raise HeadLabError(f"{unconverged} per-stratum Ising fit{'s' if unconverged != 1 else ''} (observed strata and "
                           "null draws) did not converge; their couplings are not the fit's optimum, so the route "
                           "statistic means little. Use more examples, fewer strata, a smaller C, or go on anyway "
                           "with allow_unconverged (--allow-unconverged).")
    best = max(stat.per_stratum, key=lambda r: (r.ari, -r.stratum))
    return RouteAnalysis(n_strata=settings.n_strata, strata_seed=settings.strata_seed,
                         strata=tuple(int(x) for x in strata), sizes=sizes, statistic=stat, null=null,
                         discovery_stratum=int(best.stratum))


# ---------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True, eq=False)
class CoactivationReport(JsonResult):
    """The co-activation proposal and its closure test for one checkpoint and probe, with provenance.

    classes: [layer, head] Step-2 class of every head at this checkpoint (for colouring);
    labels: the top-K PR-integral heads with their class (what ARI and purity are scored against);
    proposal: fit, ARI by k and candidate (route-conditional: of the discovery stratum);
    route: strata, statistic and null (None for the plain analysis); closure: None when not run;
    settings: the settings as used (defaults filled in) and what they mean, for readers of the file.
    """

    model: str
    revision: str
    tokens: int
    probe_spec: dict
    shape: tuple[int, int]
    settings: dict
    classes: tuple[tuple[str, ...], ...]
    labels: dict[Head, str]
    proposal: IsingProposal
    route: RouteAnalysis | None
    closure: ClosureTest | None
    notes: tuple[str, ...] = ()
    provenance: dict = field(default_factory=dict)

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
            "ising_converged": bool(self.proposal.fit.converged), "ising_n_iter": int(self.proposal.fit.n_iter),
        }
        if self.route is not None:
            r = self.route
            out["route"] = {"sizes": list(r.sizes), "discovery_stratum": r.discovery_stratum,
                            "per_stratum_ari": [s.ari for s in r.statistic.per_stratum],
                            "max_ari": r.statistic.max_ari, "null_mean": r.null.null_max_mean,
                            "null_std": r.null.null_max_std, "z": r.null.z_max,
                            "n_unconverged_strata": r.statistic.n_unconverged,
                            "n_unconverged_null_strata": sum(d.n_unconverged for d in r.null.draws)}
        if self.closure is not None:
            out["closure"] = [{"kind": s.kind, "split": s.split, "n": s.n_examples,
                               "delta": {m: s.stats[m]["candidate_delta"] for m in METRICS},
                               "z": {m: s.z(m) for m in METRICS},
                               "verdict_paper": s.verdicts["paper"].label,
                               "verdict_reference": s.verdicts["reference"].label} for s in self.closure.splits]
            out["closure_skipped"] = dict(self.closure.skipped)
        return out

    def to_json(self) -> dict:
        """The fields (labels as rows of layer, head, class) and the summary."""
        return {**super().to_json(), "labels": _labels_json(self.labels), "summary": self.summary()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> "CoactivationReport":
        data = dict(json.loads(data) if isinstance(data, str) else data)
        data["labels"] = _labels_from_json(data["labels"])
        return super().from_json(data)


# ---------------------------------------------------------------------------------------------
# the pipeline on a model


def _report_settings(given: CoactivationSettings, used: CoactivationSettings, here: Any, report: Any) -> dict:
    """The settings as the report records them: the values used, what the method fixes, and where defaults applied."""
    out = {
        "signal": "max attention over keys at the query position", "binarization": "per-head median, strictly greater -> +1",
        "route_conditional": used.route_conditional, "top_k": used.top_k, "top_k_rule": "given" if given.top_k is not None
        else f"default max(round({TOP_K_FRACTION} x heads), min(heads, {MIN_LABELLED_HEADS}))",
        "ks": list(used.ks), "k": used.k, "n_init": used.n_init, "ari_n_init": used.ari_n_init,
        "min_size": used.min_size, "max_size": used.max_size,
        "C": used.C, "fit_method": "joint", "drop_constant": used.drop_constant, "spectral_random_state": 0,
        "class_threshold": here.threshold, "class_baseline": here.baseline,
        "pr_integral": ({"definition": DEFAULT_DEFINITION, "rule": None, "checkpoints": 1,
                         "over": "none: one checkpoint, labels ranked by its own PR"} if report.spectral is None else
                        {"definition": report.spectral.definition, "rule": report.spectral.rule,
                         "checkpoints": len(report.checkpoints), "over": "every checkpoint of the model"}),
        "n_controls": used.n_controls, "control_seed": used.control_seed, "closure_kinds": list(CLOSURE_KINDS),
        "mode": used.mode, "headline": used.headline, "z_threshold": used.z_threshold, "run_closure": used.run_closure,
    }
    if used.route_conditional:
        out.update({"n_strata": used.n_strata, "strata_seed": used.strata_seed, "n_null": used.n_null,
                    "null_seed": used.null_seed, "null_partition": used.partition})
    return out


def coactivation(ref: Any, revision: str | None, spec: Any, settings: CoactivationSettings = CoactivationSettings(),
                 *, device: str = "cpu", model: Any = None, say: Optional[Callable[[str], None]] = None,
                 dtype: str = DEFAULT_DTYPE, executor: Optional[Executor] = None) -> CoactivationReport:
    """The co-activation pipeline on checkpoint `revision` (None: the final one) of `ref` with probe `spec`.

    settings: unset top_k / ks / min_size / max_size take default_settings for this model's size.
    The PR-integral ranking behind the labelled heads is over every checkpoint of the model (as the
    reference ranks over its whole trajectory); the Step-2 classes are those at `revision`.
    model: an already loaded model of this checkpoint (else loaded when needed, on `device` in `dtype`;
    a given model should be in `dtype` too, as the other checkpoints' statistics are measured in it).
    executor: where the screen's passes over the checkpoints run (core/pipelines/sweep.py; default here).
    """
    say = say or (lambda text: None)
    started = time.perf_counter()
    checkpoint = resolve_checkpoint(ref, revision)
    check_probe_fits(spec, load_config(ref, checkpoint.revision))
    batch = spec.build()

    def loaded():
        nonlocal model
        if model is None:
            model = load_model(ref, checkpoint.revision, device=device, dtype=dtype)
        return model

    say(f"measuring every head at {checkpoint.revision}")
    stats = head_stats(ref, checkpoint, batch, model=model, device=device, dtype=dtype)
    n_layers, n_head = int(stats.attn_max.shape[1]), int(stats.attn_max.shape[2])
    st = settings.resolved(n_layers * n_head)
    router = router_matrix(stats.router_query) if st.route_conditional else None  # dense model: error before any fit

    signal = max_attention_signal(stats.attn_max)       # [example, layer * n_head + head]
    spins = binarize_at_median(signal, n_head=n_head, allow_constant=st.drop_constant)  # [example, head] in {-1, +1}
    notes: list[str] = []
    constant = np.flatnonzero(np.all(spins == spins[:1], axis=0))
    if len(constant):
        notes.append(f"{len(constant)} head(s) never change sign and were left out of the fit (zero couplings): "
                     f"{', '.join(head_name(divmod(int(f), n_head)) for f in constant)}.")

    say("screening checkpoints for the PR-integral ranking and the Step-2 classes")
    report = screen(ref, spec, ScreenSettings(k=st.top_k, n_null_draws=0), device=device, dtype=dtype,
                    executor=executor)
    if report.spectral is None:  # one checkpoint (a pretrained model): no trajectory to integrate the PR over
        ranking = rank_heads(pr_per_head(stats.z_query, DEFAULT_DEFINITION))  # the screen's definition (its default)
        notes.append("one checkpoint: the labelled heads are the top-K by PR at this checkpoint, not by the "
                     "PR-integral over training (there is no training trajectory to integrate).")
    else:
        ranking = report.spectral.ranking
    if checkpoint.revision == report.checkpoints[-1].revision:
        here = report.final
    else:
        here = screen_checkpoint(stats, n_null_draws=0)
    classes = here.classes                                      # [layer, head]
    labels = supervised_labels(classes, ranking, st.top_k)

    route = None
    if st.route_conditional:
        say(f"route strata (K = {st.n_strata}), one Ising fit per stratum, {st.n_null} random partitions")
        route = route_analysis(spins, router, labels, st, n_head=n_head)
        rows = np.asarray(route.strata) == route.discovery_stratum
        proposal = propose(spins[rows], labels, st, n_head=n_head, constant="zero", allow_few_samples=True)
        if proposal.fit.constant_heads:
            notes.append(f"inside the discovery stratum {len(proposal.fit.constant_heads)} head(s) never change sign "
                         "and have zero couplings there.")
    else:
        say("fitting the Ising model and clustering |J|")
        proposal = propose(spins, labels, st, n_head=n_head, constant="zero" if st.drop_constant else "error")
    if proposal.selection.fallback:
        notes.append(f"no community has {st.min_size}..{st.max_size} heads at k = {proposal.k}; every community was scored.")

    closure = None
    if st.run_closure:
        say(f"closure test of {HeadSet(proposal.selection.candidate.heads)} against {st.n_controls} controls per kind")
        on = None if route is None else np.asarray(route.strata) == route.discovery_stratum
        ablation = AblationSettings(n_controls=st.n_controls, mode=st.mode, seed=st.control_seed,
                                    include_upper_bound=True, z_threshold=st.z_threshold)
        closure = closure_test(loaded(), batch, HeadSet(proposal.selection.candidate.heads), ablation,
                               headline=st.headline, on_stratum=on, device=device)
        for kind, reason in closure.skipped.items():
            notes.append(f"{kind} controls skipped: {reason}")
        for kind, result in closure.results.items():
            if result.control_sets.note:
                notes.append(f"{kind} controls: {result.control_sets.note}")

    provenance = {"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens,
                  "probe_spec": dict(batch.spec), "n_examples": batch.n_examples, "seconds": time.perf_counter() - started,
                  "versions": package_versions(), "headstats_code_version": stats.code_version,
                  "dtype": stats.dtype}
    return CoactivationReport(model=ref.name, revision=checkpoint.revision, tokens=int(checkpoint.tokens),
                              probe_spec=dict(batch.spec), shape=(n_layers, n_head),
                              settings=_report_settings(settings, st, here, report),
                              classes=tuple(tuple(str(c) for c in row) for row in classes), labels=labels,
                              proposal=proposal, route=route, closure=closure, notes=tuple(notes), provenance=provenance)
