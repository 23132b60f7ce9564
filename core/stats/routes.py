"""Co-activation proposal [CVC], step 5 (MoE models): route-conditional communities and their null.

Routing strata by k-means on the router weights at the query position, one Ising fit per stratum,
the best within-stratum ARI against the supervised classes (the route statistic: max and mean
over strata), and its random-partition null: the same per-stratum pipeline on random partitions
of the examples, with the observed statistic's z-score (METHODS.md, "Co-activation").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np
from sklearn.cluster import KMeans

from core.errors import HeadLabError
from core.heads import Head
from core.results import JsonResult, jsonable
from core.stats.clusters import DEFAULT_KS, ari_by_k
from core.stats.inference import z_score
from core.stats.ising import DEFAULT_C, fit_ising_pseudolikelihood
from core.stats.spins import as_array, check_spins


def route_strata(router_weights: Any, K: int = 4, seed: int = 0, n_init: int = 10) -> np.ndarray:
    """Routing stratum [example] by k-means (scikit-learn) on the concatenated per-layer router softmax weights.

    router_weights: [example, layer * n_expert] at the query position.
    """
    if router_weights is None:
        raise HeadLabError("this model has no routers; route conditioning needs a mixture-of-experts model.")
    w = as_array(router_weights)
    if w.ndim != 2 or w.size == 0:
        raise HeadLabError(f"router weights must be [example, layer * n_expert], got shape {tuple(w.shape)}; "
                           "route conditioning needs a mixture-of-experts model.")
    if not np.all(np.isfinite(w)):
        raise HeadLabError("router weights have NaN or infinite values; recompute them.")
    if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 2 <= K <= w.shape[0]:
        raise HeadLabError(f"K = {K} strata is not possible with {w.shape[0]} examples; choose K between 2 and the number of examples.")
    km = KMeans(n_clusters=int(K), random_state=seed, n_init=n_init)
    return km.fit_predict(w).astype(np.int64)


@dataclass(frozen=True)
class StratumResult(JsonResult):
    """Best agreement with the supervised classes among the spectral clusterings of one stratum's J."""

    stratum: int
    n_examples: int
    best_k: int
    ari: float
    nmi: float
    purity: float
    n_constant_heads: int = 0
    converged: bool = True  # the stratum's Ising fit converged (core.stats.ising.IsingFit.converged)


@dataclass(frozen=True)
class RouteStatistic(JsonResult):
    """The route-conditional statistic: max (and mean) over strata of the best within-stratum ARI."""

    per_stratum: tuple[StratumResult, ...]
    max_ari: float
    mean_ari: float
    n_unconverged: int = 0  # strata whose Ising fit did not converge (kept only with allow_unconverged)
    J_by_stratum: dict[int, np.ndarray] = field(compare=False, default_factory=dict, repr=False)  # not in JSON

    def to_json(self) -> dict:
        """The fields without J_by_stratum (large, and recomputed by a rerun)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self) if f.name != "J_by_stratum"}


def stratum_statistic(spins: Any, strata: Any, labels_by_head: Mapping[Head, str], ks: Sequence[int] = DEFAULT_KS, *,
                      n_head: int, C: float = DEFAULT_C, n_init: int | None = None, random_state: int = 0,
                      min_stratum_size: int | None = None, fit_method: str = "joint") -> RouteStatistic:
    """Fit one Ising model per stratum, cluster it for each k, keep the best ARI; statistic = max over strata.

    Heads whose spin is constant inside a stratum get zero couplings there (they cannot be fitted).
    A stratum with fewer examples than min_stratum_size (default: the number of heads) is an error.
    Each stratum records whether its fit converged, and n_unconverged counts those that did not
    (the pipeline refuses them unless asked: core.pipelines.coactivation.route_analysis).
    """
    s = check_spins(spins, allow_constant=True, allow_few_samples=True, n_head=n_head)
    st = np.asarray(strata).astype(np.int64)
    if st.shape != (s.shape[0],):
        raise HeadLabError(f"strata must give one stratum per example ({s.shape[0]}), got shape {tuple(st.shape)}.")
    need = s.shape[1] if min_stratum_size is None else int(min_stratum_size)
    results, Js = [], {}
    for g in sorted(set(st.tolist())):
        rows = np.flatnonzero(st == g)
        if len(rows) < need:
            raise HeadLabError(f"stratum {g} has {len(rows)} examples, fewer than {need}; use fewer strata (smaller K) "
                               "or more examples.")
        fit = fit_ising_pseudolikelihood(s[rows], C=C, method=fit_method, constant="zero", n_head=n_head,
                                         allow_few_samples=True)
        scores = ari_by_k(fit.J, labels_by_head, ks, n_head=n_head, n_init=n_init, random_state=random_state)
        best = scores.metric(scores.best_k)
        results.append(StratumResult(stratum=int(g), n_examples=len(rows), best_k=scores.best_k, ari=best.ari, nmi=best.nmi,
                                     purity=best.purity, n_constant_heads=len(fit.constant_heads),
                                     converged=bool(fit.converged)))
        Js[int(g)] = fit.J
    aris = [r.ari for r in results]
    return RouteStatistic(per_stratum=tuple(results), max_ari=float(max(aris)), mean_ari=float(np.mean(aris)),
                          n_unconverged=sum(not r.converged for r in results), J_by_stratum=Js)


def unconverged_strata(statistic: RouteStatistic, null: "RouteNull") -> int:
    """Strata fits that did not converge, in the observed statistic and every null draw together."""
    return int(statistic.n_unconverged) + sum(int(d.n_unconverged) for d in null.draws)


def null_z(observed: float, null_values: Sequence[float]) -> float | None:
    """z = (observed - mean(null)) / std(null, ddof=0), the closure z; None when the null does not vary."""
    if len(null_values) == 0:
        raise HeadLabError("the null distribution is empty; draw at least one random partition.")
    return z_score(observed, null_values)


PARTITIONS = ("matched", "reference")


def random_partition(n_examples: int, strata_sizes: Sequence[int], seed: int, partition: str = "matched") -> np.ndarray:
    """A random stratum label per example.

    "matched" (METHODS.md): a random permutation of strata with exactly the given sizes.
    "reference" (the reference code): uniform labels RandomState(seed).randint(0, K, n_examples),
    whose sizes only match on average (reproduces the published null's group sizes for seeds 0..9).
    """
    sizes = [int(x) for x in strata_sizes]
    if partition not in PARTITIONS:
        raise HeadLabError(f"unknown partition {partition!r}; use one of {', '.join(PARTITIONS)}.")
    if len(sizes) < 2 or min(sizes) < 1:
        raise HeadLabError(f"need at least 2 non-empty strata, got sizes {sizes}.")
    rs = np.random.RandomState(seed)
    if partition == "reference":
        return rs.randint(0, len(sizes), n_examples).astype(np.int64)
    if sum(sizes) != n_examples:
        raise HeadLabError(f"strata sizes {sizes} add up to {sum(sizes)}, not the {n_examples} examples.")
    return rs.permutation(np.repeat(np.arange(len(sizes)), sizes)).astype(np.int64)


@dataclass(frozen=True)
class RouteNull(JsonResult):
    """The random-partition null of the route-conditional statistic, and the observed z-scores."""

    partition: str
    seeds: tuple[int, ...]
    null_max: tuple[float, ...]
    null_mean: tuple[float, ...]
    null_max_mean: float
    null_max_std: float                      # ddof = 0
    null_mean_mean: float
    null_mean_std: float
    observed_max: float | None = None
    observed_mean: float | None = None
    z_max: float | None = None
    z_mean: float | None = None
    p_max_exceed: float | None = None        # share of null draws >= observed
    p_mean_exceed: float | None = None
    draws: tuple[RouteStatistic, ...] = field(compare=False, default=(), repr=False)


def summarize_null(null_max: Sequence[float], null_mean: Sequence[float], *, partition: str, seeds: Sequence[int],
                   observed_max: float | None = None, observed_mean: float | None = None,
                   draws: Sequence[RouteStatistic] = ()) -> RouteNull:
    """Null mean / std (ddof=0), z-scores and exceedance shares from the per-draw statistics."""
    vmax, vmean = np.asarray(null_max, dtype=np.float64), np.asarray(null_mean, dtype=np.float64)
    z_max = null_z(observed_max, vmax) if observed_max is not None else None
    z_mean = null_z(observed_mean, vmean) if observed_mean is not None else None
    return RouteNull(partition=partition, seeds=tuple(int(x) for x in seeds), null_max=tuple(vmax.tolist()),
                     null_mean=tuple(vmean.tolist()), null_max_mean=float(vmax.mean()), null_max_std=float(vmax.std(ddof=0)),
                     null_mean_mean=float(vmean.mean()), null_mean_std=float(vmean.std(ddof=0)),
                     observed_max=observed_max, observed_mean=observed_mean, z_max=z_max, z_mean=z_mean,
                     p_max_exceed=None if observed_max is None else float((vmax >= observed_max).mean()),
                     p_mean_exceed=None if observed_mean is None else float((vmean >= observed_mean).mean()),
                     draws=tuple(draws))


def random_partition_null(spins: Any, strata_sizes: Sequence[int], labels_by_head: Mapping[Head, str],
                          ks: Sequence[int] = DEFAULT_KS, *, n_head: int, seeds: Sequence[int] = range(10),
                          partition: str = "matched", observed: RouteStatistic | None = None, C: float = DEFAULT_C,
                          n_init: int | None = None) -> RouteNull:
    """The same per-stratum pipeline on one random partition per seed (reference: seeds 0..9), and z of the observed statistic."""
    seeds = [int(sd) for sd in seeds]
    if not seeds:
        raise HeadLabError("no seeds given; draw at least one random partition (reference: 10, seeds 0..9).")
    s = as_array(spins)
    draws = []
    for sd in seeds:
        labels = random_partition(s.shape[0], strata_sizes, sd, partition)
        draws.append(stratum_statistic(s, labels, labels_by_head, ks, n_head=n_head, C=C, n_init=n_init))
    return summarize_null([d.max_ari for d in draws], [d.mean_ari for d in draws], partition=partition, seeds=seeds,
                          observed_max=None if observed is None else observed.max_ari,
                          observed_mean=None if observed is None else observed.mean_ari,
                          draws=[RouteStatistic(per_stratum=d.per_stratum, max_ari=d.max_ari, mean_ari=d.mean_ari,
                                                n_unconverged=d.n_unconverged) for d in draws])
