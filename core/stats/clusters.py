"""Co-activation proposal [CVC], steps 3-4: communities of heads in |J| and the candidate community.

Spectral clustering of |J| (scikit-learn, exactly as the reference) for each k, scored against the
supervised head classes by ARI / NMI / purity; then per-cluster composition, purity and isolation,
and the candidate community: argmax of purity x isolation x size factor among the clusters within
the size bounds (METHODS.md, "Co-activation"; MANIFEST Addendum).

Heads are flat indices f = layer * n_head + head in J and in cluster labels; supervised labels are
keyed by (layer, head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from sklearn.cluster import SpectralClustering
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from core.errors import HeadLabError
from core.heads import Head
from core.results import JsonResult
from core.stats.spins import as_array

DEFAULT_KS = (4, 6, 8, 10, 12)
AFFINITY_EPS = 1e-12      # added to |J| before spectral clustering (reference)
ISOLATION_FLOOR = 1e-12   # outside_mean_J floor in the isolation ratio (reference)


# ---------------------------------------------------------------- 3. spectral clusters and scores


def _check_J(J: Any) -> np.ndarray:
    a = as_array(J)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 3:
        raise HeadLabError(f"J must be a square [head, head] matrix of at least 3 heads, got shape {tuple(a.shape)}.")
    if not np.all(np.isfinite(a)):
        raise HeadLabError("J has NaN or infinite entries; refit the Ising model.")
    if not np.allclose(a, a.T, rtol=1e-8, atol=1e-12):
        raise HeadLabError("J must be symmetric; symmetrize it as (J + J.T) / 2 (couplings_from_coef does).")
    return a


def spectral_clusters(J: Any, k: int, n_init: int | None = None, random_state: int = 0) -> np.ndarray:
    """Cluster ids [head] from scikit-learn SpectralClustering on the affinity |J| + 1e-12 (diagonal 0).

    Exactly the reference call: affinity="precomputed", assign_labels="kmeans", random_state 0;
    n_init None = scikit-learn's default (10; the reference's per-k labels), 1 for the reference's
    candidate selection. Labels depend on the scikit-learn / scipy versions (pinned in requirements).
    """
    a = _check_J(J)
    n = a.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= int(k) < n:
        raise HeadLabError(f"k = {k} clusters is not possible with {n} heads; choose k between 2 and {n - 1}.")
    affinity = np.abs(a) + AFFINITY_EPS
    np.fill_diagonal(affinity, 0.0)
    kwargs = {} if n_init is None else {"n_init": int(n_init)}
    model = SpectralClustering(n_clusters=int(k), affinity="precomputed", assign_labels="kmeans",
                               random_state=random_state, **kwargs)
    return model.fit_predict(affinity).astype(np.int64)


def labels_from_classifications(classifications: Iterable[Mapping[str, Any]]) -> dict[Head, str]:
    """{(layer, head): class} from a supervised mechinterp JSON's `classifications` list (top-K heads)."""
    out: dict[Head, str] = {}
    for row in classifications:
        out[(int(row["layer"]), int(row["head"]))] = str(row["classification"])
    return out


def _flat_labels(labels_by_head: Mapping[Head, str], n_heads_total: int, n_head: int) -> dict[int, str]:
    if not isinstance(n_head, (int, np.integer)) or n_head < 1 or n_heads_total % n_head:
        raise HeadLabError(f"n_head = {n_head} does not divide the {n_heads_total} heads; pass the heads per layer.")
    out: dict[int, str] = {}
    for (layer, head), cls in labels_by_head.items():
        f = int(layer) * int(n_head) + int(head)
        if not (0 <= int(head) < n_head and 0 <= f < n_heads_total):
            raise HeadLabError(f"labelled head L{layer}H{head} is outside the model's {n_heads_total // n_head} x {n_head} heads; "
                               "check the labels file belongs to this model.")
        out[f] = str(cls)
    if not out:
        raise HeadLabError("no supervised head labels given; run the pattern screen (Step 2) first or pass its classes.")
    return out


@dataclass(frozen=True)
class ClusterMetrics(JsonResult):
    """Agreement of one clustering with the supervised classes, over the labelled heads only."""

    k: int
    n_evaluated: int
    ari: float
    nmi: float
    purity: float
    composition: dict[int, dict[str, int]] = field(compare=False)  # cluster -> class -> count

def cluster_metrics(cluster_labels: Any, labels_by_head: Mapping[Head, str], *, n_head: int, k: int | None = None) -> ClusterMetrics:
    """ARI, NMI (scikit-learn, arithmetic normalisation) and purity of a clustering vs the supervised classes.

    Only heads present in labels_by_head count; class names are mapped to sorted integers;
    purity = sum over clusters of the majority-class count / n_evaluated.
    """
    pred_all = np.asarray(cluster_labels).astype(np.int64)
    flat = _flat_labels(labels_by_head, len(pred_all), n_head)
    heads = sorted(flat)
    classes = sorted(set(flat.values()))
    gt = np.array([classes.index(flat[f]) for f in heads])
    pred = pred_all[heads]
    composition: dict[int, dict[str, int]] = {}
    for c in sorted(set(pred.tolist())):
        members = gt[pred == c]
        composition[int(c)] = {classes[g]: int((members == g).sum()) for g in sorted(set(members.tolist()))}
    purity = sum(max(v.values()) for v in composition.values()) / len(heads)
    return ClusterMetrics(k=int(k if k is not None else len(set(pred_all.tolist()))), n_evaluated=len(heads),
                          ari=float(adjusted_rand_score(gt, pred)), nmi=float(normalized_mutual_info_score(gt, pred)),
                          purity=float(purity), composition=composition)


@dataclass(frozen=True)
class AriByK(JsonResult):
    """Spectral clusterings for several k, each scored against the supervised classes; best_k = best ARI."""

    ks: tuple[int, ...]
    metrics: tuple[ClusterMetrics, ...]
    best_k: int
    cluster_labels: dict[int, tuple[int, ...]] = field(compare=False)  # k -> cluster id per head
    n_init: int | None = None

    def metric(self, k: int) -> ClusterMetrics:
        return self.metrics[self.ks.index(k)]

def ari_by_k(J: Any, labels_by_head: Mapping[Head, str], ks: Sequence[int] = DEFAULT_KS, *, n_head: int,
             n_init: int | None = None, random_state: int = 0) -> AriByK:
    """Spectral clustering of |J| for each k, scored by ARI / NMI / purity; best_k = highest ARI (smallest k on ties)."""
    ks = tuple(int(k) for k in ks)
    if not ks:
        raise HeadLabError("no k given; pass at least one number of clusters (reference: 4 6 8 10 12).")
    labels = {k: spectral_clusters(J, k, n_init=n_init, random_state=random_state) for k in ks}
    metrics = tuple(cluster_metrics(labels[k], labels_by_head, n_head=n_head, k=k) for k in ks)
    best = max(range(len(ks)), key=lambda i: (metrics[i].ari, -i))
    return AriByK(ks=ks, metrics=metrics, best_k=ks[best], cluster_labels={k: tuple(int(x) for x in v) for k, v in labels.items()},
                  n_init=n_init)


# ---------------------------------------------------------------- 4. candidate community


@dataclass(frozen=True)
class ClusterInfo(JsonResult):
    """One community: members, supervised composition, and how isolated it is in |J|."""

    cluster: int
    size: int
    heads: tuple[Head, ...]
    layers: tuple[int, ...]
    composition: dict[str, int] = field(compare=False)  # class -> count among the labelled members
    n_classified: int = 0
    purity: float = 0.0
    within_mean_J: float = 0.0
    outside_mean_J: float = 0.0
    isolation_ratio: float = 0.0
    combined_score: float | None = None  # purity * isolation * min(size, max)/max; None when not scored
    eligible: bool = False                # min_size <= size <= max_size

def cluster_table(J: Any, cluster_labels: Any, labels_by_head: Mapping[Head, str], *, n_head: int,
                  min_size: int = 4, max_size: int = 12) -> tuple[ClusterInfo, ...]:
    """Per-cluster figures as the reference computes them (MANIFEST Addendum), sorted by cluster id.

    within_mean_J = mean |J_ij| over member pairs i < j; outside_mean_J = mean |J_ij| over (member,
    non-member) pairs; isolation = within / max(outside, 1e-12); purity = majority-class share of the
    labelled members ('unclassified' is a class). combined_score is computed for clusters with
    min_size <= size <= max_size, or for every cluster when none qualifies.
    """
    a = np.abs(_check_J(J))
    np.fill_diagonal(a, 0.0)
    n = a.shape[0]
    pred = np.asarray(cluster_labels).astype(np.int64)
    if pred.shape != (n,):
        raise HeadLabError(f"cluster labels must give one cluster per head ({n}), got shape {tuple(pred.shape)}.")
    if not 1 <= min_size <= max_size:
        raise HeadLabError(f"size bounds {min_size}..{max_size} are empty; use 1 <= min_size <= max_size (reference: 4..12).")
    flat = _flat_labels(labels_by_head, n, n_head)
    ids = sorted(set(pred.tolist()))
    eligible = {c: min_size <= int((pred == c).sum()) <= max_size for c in ids}
    scored = eligible if any(eligible.values()) else {c: True for c in ids}
    out = []
    for c in ids:
        members = np.flatnonzero(pred == c)
        others = np.flatnonzero(pred != c)
        composition: dict[str, int] = {}
        for f in members:
            if int(f) in flat:
                composition[flat[int(f)]] = composition.get(flat[int(f)], 0) + 1
        n_classified = sum(composition.values())
        purity = max(composition.values()) / n_classified if n_classified else 0.0
        block = a[np.ix_(members, members)]
        iu = np.triu_indices(len(members), 1)
        within = float(block[iu].mean()) if len(members) > 1 else 0.0
        outside = float(a[np.ix_(members, others)].mean()) if len(others) else 0.0
        isolation = within / max(outside, ISOLATION_FLOOR)
        size = len(members)
        score = purity * isolation * min(size, max_size) / max_size if scored[c] else None
        heads = tuple(divmod(int(f), n_head) for f in members)
        out.append(ClusterInfo(cluster=int(c), size=size, heads=heads, layers=tuple(sorted({l for l, _ in heads})),
                               composition=composition, n_classified=n_classified, purity=float(purity),
                               within_mean_J=within, outside_mean_J=outside, isolation_ratio=float(isolation),
                               combined_score=None if score is None else float(score), eligible=eligible[c]))
    return tuple(out)


def select_candidate(table: Sequence[ClusterInfo]) -> ClusterInfo:
    """The scored cluster with the highest combined score (the first one on ties)."""
    scored = [c for c in table if c.combined_score is not None]
    if not scored:
        raise HeadLabError("no cluster has a combined score; build the table with cluster_table first.")
    return max(scored, key=lambda c: c.combined_score)


@dataclass(frozen=True)
class CandidateSelection(JsonResult):
    """The candidate community and the table it was chosen from."""

    k: int
    n_init: int | None
    min_size: int
    max_size: int
    fallback: bool                        # no cluster within the size bounds: all clusters were scored
    clusters: tuple[ClusterInfo, ...]
    candidate: ClusterInfo
    cluster_labels: tuple[int, ...] = field(compare=False, default=())

def propose_candidate(J: Any, labels_by_head: Mapping[Head, str], *, n_head: int, k: int = 12, n_init: int | None = 1,
                      min_size: int = 4, max_size: int = 12, random_state: int = 0,
                      cluster_labels: Any = None) -> CandidateSelection:
    """Cluster |J| into k communities (reference: n_init = 1 for this step) and pick the candidate.

    Pass cluster_labels to score an existing partition instead of clustering again.
    """
    labels = spectral_clusters(J, k, n_init=n_init, random_state=random_state) if cluster_labels is None \
        else np.asarray(cluster_labels).astype(np.int64)
    table = cluster_table(J, labels, labels_by_head, n_head=n_head, min_size=min_size, max_size=max_size)
    return CandidateSelection(k=int(k), n_init=n_init, min_size=min_size, max_size=max_size,
                              fallback=not any(c.eligible for c in table), clusters=table,
                              candidate=select_candidate(table), cluster_labels=tuple(int(x) for x in labels))
