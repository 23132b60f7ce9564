"""Recovery of a known circuit: how well a method's per-head (or per-edge) scores rank the true components.

Pure numpy / scipy / scikit-learn, no model. A method scores every component (a larger score means
"more likely in the circuit"); the truth marks the components of the circuit known by construction.
Three measures, each with the random baseline of the same scores permuted against the truth:

- ROC AUC (sklearn.metrics.roc_auc_score): the chance that a random true component outscores a
  random false one, ties counted one half (the Mann-Whitney U / trapezoid convention), so a
  constant score gives exactly 0.5;
- precision-recall AUC as average precision (sklearn.metrics.average_precision_score: the step sum
  of precision at each distinct score times the recall gained there, no interpolation; tied scores
  form one threshold), so a constant score gives the share of true components;
- precision@k, k = the true circuit's size: the share of true components among the k top-scored;
  a tie across the k-th place is broken at random and the expected precision is reported (the
  tied block contributes its share of true components for each place it fills).

The baseline permutes the truth against the scores (the same thing as permuting the scores),
`n_draws` times from numpy's default_rng(seed); the permutation p is (1 + draws at or above the
observed value) / (1 + draws), one-sided. Seeds of one task (models trained alike from different
seeds) are pooled by a percentile bootstrap of the mean over seeds (core.stats.inference.bootstrap_ci).
A truth without a true or without a false component cannot rank anything: HeadLabError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import average_precision_score, roc_auc_score

from core.errors import HeadLabError
from core.results import JsonResult
from core.stats.inference import bootstrap_ci

MEASURES = ("roc_auc", "average_precision", "precision_at_k")
MEASURE_LABELS = {"roc_auc": "ROC AUC", "average_precision": "PR AUC (average precision)",
                  "precision_at_k": "precision@k (k = true circuit size)"}
DEFAULT_DRAWS = 1000
DEFAULT_SEED = 0
TIES = ("ROC AUC counts a tie between a true and a false component as one half; average precision treats "
        "tied scores as one threshold; precision@k breaks a tie across the k-th place at random and reports "
        "the expected precision.")


def check_scores_truth(scores: Sequence[float], truth: Sequence[bool], what: str = "component") -> tuple[np.ndarray, np.ndarray]:
    """(scores, truth) as flat float64 and bool arrays of one length; HeadLabError when they cannot be scored.

    scores: [component] (any shape, flattened in C order, e.g. [layer, head]); truth: the same shape.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    t = np.asarray(truth).reshape(-1)
    if s.shape != t.shape:
        raise HeadLabError(f"{s.size} scores for {t.size} {what}s of the truth; score every {what} once "
                           "(the same [layer, head] shape as the truth).")
    if t.dtype != bool:
        if not np.isin(t, (0, 1)).all():
            raise HeadLabError(f"the truth marks each {what} in the circuit or not: use True/False (or 1/0).")
        t = t.astype(bool)
    if not np.isfinite(s).all():
        bad = int((~np.isfinite(s)).sum())
        raise HeadLabError(f"{bad} of the {what} scores are NaN or infinite; a method must give every {what} a "
                           "finite score (use its lowest value for a component it does not rank).")
    n_pos = int(t.sum())
    if n_pos == 0 or n_pos == t.size:
        side = "no" if n_pos == 0 else "only"
        raise HeadLabError(f"the truth has {side} true {what}s ({n_pos} of {t.size}); recovery needs at least one "
                           f"{what} in the circuit and one outside it.")
    return s, t


# ---------------------------------------------------------------------------------------------
# the measures, one truth at a time and vectorised over permuted truths [draw, component]


def roc_auc(scores: Sequence[float], truth: Sequence[bool]) -> float:
    """ROC AUC by scikit-learn (ties one half; a constant score 0.5)."""
    s, t = check_scores_truth(scores, truth)
    return float(roc_auc_score(t, s))


def average_precision(scores: Sequence[float], truth: Sequence[bool]) -> float:
    """Average precision by scikit-learn (the PR AUC used here; tied scores are one threshold)."""
    s, t = check_scores_truth(scores, truth)
    return float(average_precision_score(t, s))


def precision_at_k(scores: Sequence[float], truth: Sequence[bool], k: int | None = None) -> float:
    """Share of true components among the k top-scored (k: the truth's size by default); ties: expected value."""
    s, t = check_scores_truth(scores, truth)
    return float(_precision_at_k_many(s, t[None, :], _k(t, k))[0])


def _k(truth: np.ndarray, k: int | None) -> int:
    k = int(truth.sum()) if k is None else int(k)
    if not 1 <= k <= truth.size:
        raise HeadLabError(f"precision@k needs 1 <= k <= {truth.size} components, got k = {k}.")
    return k


def _roc_auc_many(s: np.ndarray, truths: np.ndarray) -> np.ndarray:
    """ROC AUC of scores s [n] against each row of truths [draw, n] (Mann-Whitney with mid-ranks)."""
    ranks = rankdata(s, method="average")  # [n], ties share their mean rank
    n_pos = truths.sum(axis=1)
    n_neg = truths.shape[1] - n_pos
    rank_sum = truths.astype(np.float64) @ ranks
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _tie_blocks(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order by descending score and the end index (exclusive) of each block of equal scores in it."""
    order = np.argsort(-s, kind="stable")
    sorted_s = s[order]
    ends = np.flatnonzero(np.r_[sorted_s[1:] != sorted_s[:-1], True]) + 1
    return order, ends


def _average_precision_many(s: np.ndarray, truths: np.ndarray) -> np.ndarray:
    """Average precision of s [n] against each row of truths [draw, n], scikit-learn's definition."""
    order, ends = _tie_blocks(s)
    hits = np.cumsum(truths[:, order], axis=1)[:, ends - 1].astype(np.float64)  # [draw, block] true so far
    n_pos = hits[:, -1:]
    precision = hits / ends[None, :]
    recall_gain = np.diff(np.concatenate([np.zeros_like(n_pos), hits], axis=1), axis=1) / n_pos
    return (precision * recall_gain).sum(axis=1)


def _precision_at_k_many(s: np.ndarray, truths: np.ndarray, k: int) -> np.ndarray:
    """Expected precision@k of s [n] against each row of truths [draw, n], ties across place k broken at random."""
    order, ends = _tie_blocks(s)
    block = int(np.searchsorted(ends, k))  # the block holding place k (0-based index k - 1)
    start = 0 if block == 0 else int(ends[block - 1])
    end = int(ends[block])
    sorted_truths = truths[:, order].astype(np.float64)
    above = sorted_truths[:, :start].sum(axis=1)
    tied_share = sorted_truths[:, start:end].mean(axis=1)
    return (above + (k - start) * tied_share) / k


_MANY = {"roc_auc": _roc_auc_many, "average_precision": _average_precision_many}


def _measure_many(measure: str, s: np.ndarray, truths: np.ndarray, k: int) -> np.ndarray:
    if measure == "precision_at_k":
        return _precision_at_k_many(s, truths, k)
    return _MANY[measure](s, truths)


# ---------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class Recovery(JsonResult):
    """One measure of one method's scores against one truth, with its permutation baseline.

    value: the measure; baseline_mean, baseline_std: over n_draws permutations of the truth against
    the scores; p: one-sided permutation p, (1 + draws >= value) / (1 + n_draws); k: precision@k's k.
    """

    measure: str
    value: float
    baseline_mean: float
    baseline_std: float
    p: float
    n_draws: int
    seed: int
    n_true: int
    n_components: int
    k: int | None = None


def recovery(scores: Sequence[float], truth: Sequence[bool], measure: str = "roc_auc", n_draws: int = DEFAULT_DRAWS,
             seed: int = DEFAULT_SEED, k: int | None = None) -> Recovery:
    """One measure (MEASURES) of scores against truth with the permutation baseline (same shapes, any)."""
    if measure not in MEASURES:
        raise HeadLabError(f"recovery measure {measure!r} is unknown; use one of {', '.join(MEASURES)}.")
    if int(n_draws) < 1:
        raise HeadLabError(f"n_draws is {n_draws}; the permutation baseline needs at least one draw (default 1000).")
    s, t = check_scores_truth(scores, truth)
    kk = _k(t, k)
    value = {"roc_auc": lambda: float(roc_auc_score(t, s)),
             "average_precision": lambda: float(average_precision_score(t, s)),
             "precision_at_k": lambda: float(_precision_at_k_many(s, t[None, :], kk)[0])}[measure]()
    rng = np.random.default_rng(int(seed))
    permuted = rng.permuted(np.broadcast_to(t, (int(n_draws), t.size)), axis=1)  # [draw, component]
    baseline = _measure_many(measure, s, permuted, kk)
    # a draw ties the observed value up to rounding: compare on a tolerance, not exact floats
    at_or_above = int((baseline >= value - 1e-12).sum())
    return Recovery(measure=measure, value=value, baseline_mean=float(baseline.mean()),
                    baseline_std=float(baseline.std(ddof=0)), p=(1 + at_or_above) / (1 + int(n_draws)),
                    n_draws=int(n_draws), seed=int(seed), n_true=int(t.sum()), n_components=int(t.size),
                    k=kk if measure == "precision_at_k" else None)


def recovery_all(scores: Sequence[float], truth: Sequence[bool], n_draws: int = DEFAULT_DRAWS,
                 seed: int = DEFAULT_SEED) -> dict[str, Recovery]:
    """Every measure of MEASURES (k = the truth's size), each with its own baseline from the same seed."""
    return {m: recovery(scores, truth, m, n_draws, seed) for m in MEASURES}


@dataclass(frozen=True)
class SeedInterval(JsonResult):
    """A measure pooled over the seeds of one task: the mean and its percentile bootstrap interval.

    low, high: None with a single seed (one value has no spread to resample); values: per seed, in order.
    """

    mean: float
    low: float | None
    high: float | None
    n_seeds: int
    confidence: float
    n_boot: int
    seed: int
    values: tuple[float, ...]


def seed_interval(values: Sequence[float], n_boot: int = 2000, seed: int = DEFAULT_SEED,
                  level: float = 0.95) -> SeedInterval:
    """Mean over seeds of one measure and its percentile bootstrap interval (seeds resampled, seeded)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)  # [seed]
    if v.size == 0:
        raise HeadLabError("an interval over seeds needs at least one model of the task.")
    if not np.isfinite(v).all():
        raise HeadLabError("a seed's measure is NaN or infinite; score every seed before pooling them.")
    low = high = None
    if v.size >= 2:
        low, high = bootstrap_ci(v, n_boot=n_boot, seed=seed, level=level)
    return SeedInterval(mean=float(v.mean()), low=low, high=high, n_seeds=int(v.size), confidence=float(level),
                        n_boot=int(n_boot), seed=int(seed), values=tuple(float(x) for x in v))
