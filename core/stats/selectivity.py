"""Step 2 of the spectral probe-circuit recipe [SPC]: which attention pattern each head implements.

Inputs, from the probe pass (core/probe.py), at each example's query position q:
- either the full attention row `attn_row [example, layer, head, key]` (key = 0 .. at least q;
  small models), plus `query_pos`, `induction_pos` (p+1) and `duplicate_pos` (p), each [example];
- or its summaries, as `gather_pattern_attention` returns them: attention to each pattern target
  `[example, layer, head]` and to the random baseline positions (mean over them) `[example, layer, head]`.
  The null floor needs the full row (or the probe gathers `null_target_positions` itself and
  passes the per-draw mean attention to `null_selectivity_from_means`).

Selectivity is a ratio of means over examples: mean attention q -> target divided by
- "random" (default, reference code): the mean attention q -> 50 random key positions drawn by
  numpy RandomState(0) avoiding 0, q, q-1 and q-5..q-2 (all eligible positions when fewer remain);
- "uniform" (paper wording): the mean over examples of 1/(q+1).
The denominator is floored at 1e-8, as in the reference.

Baseline draw and varying q: the reference has one q (= T-1) per batch and draws once. HeadLab draws
once per distinct q, each draw from a fresh RandomState(seed), so an example's baseline positions
depend only on its own q (the synthetic batch reproduces the reference draw exactly; a natural-text
batch with many q values gets one draw per q, independent of batch order or chunking).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from core.choices import CLASS_THRESHOLD
from core.errors import HeadLabError
from core.heads import HeadSet
from core.results import JsonResult, jsonable
from core.tasks.probe_batch import LOCAL_OFFSETS, PATTERNS  # ties in classify() go to the earlier pattern

BASELINE_KINDS = ("random", "uniform")
DEFAULT_BASELINE_N = 50
DEFAULT_BASELINE_SEED = 0
DEFAULT_NULL_DRAWS = 500  # calibration_summary.json: null_draws = 500 (the stored OLMo file has 20)
DEFAULT_NULL_SEED = 2026  # reference null_seed
INDUCTION_THRESHOLD = 50.0
NOISE_FLOOR_MINIMUM = 2.0
DENOMINATOR_FLOOR = 1e-8


# ---------------------------------------------------------------- positions


def forbidden_positions(q: int) -> set[int]:
    """Key positions never used as a baseline or null target: 0, q, q-1 and q-5 .. q-2."""
    q = int(q)
    return {0, q, q - 1} | {q - off for off in LOCAL_OFFSETS}


def baseline_positions(q: int, n: int = DEFAULT_BASELINE_N, seed: int = DEFAULT_BASELINE_SEED) -> np.ndarray:
    """The random baseline key positions for query position q, in draw order: [<= n] int.

    Reference procedure: RandomState(seed).randint(1, q) repeatedly, keeping a value unless it is
    forbidden or already drawn, until n are kept. With fewer than n eligible positions (1 .. q-6),
    all of them are used.
    """
    q = int(q)
    avoid = forbidden_positions(q)
    eligible = [k for k in range(1, q) if k not in avoid]
    if not eligible:
        raise HeadLabError(
            f"query position {q} leaves no key for the random baseline (needs q >= 7); "
            'use a longer probe or baseline="uniform".'
        )
    if len(eligible) < n:
        return np.asarray(eligible, dtype=np.int64)
    rng = np.random.RandomState(seed)
    sample: list[int] = []
    chosen: set[int] = set()
    while len(sample) < n:
        k = int(rng.randint(1, q))
        if k not in avoid and k not in chosen:
            sample.append(k)
            chosen.add(k)
    return np.asarray(sample, dtype=np.int64)


def _positions(x: Any, name: str, n: int | None = None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.ndim == 0 and n is not None:
        arr = np.full(n, int(arr))
    arr = arr.astype(np.int64)
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        raise HeadLabError(f"{name} must be one position per example ([{n}]), got shape {arr.shape}.")
    return arr


def _as_torch(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


class PatternAttention(NamedTuple):
    """Per-example attention summaries at the query position (all float64 numpy).

    targets:  pattern -> [example, layer, head]
    baseline: [example, layer, head], mean attention to the random baseline positions
    query_pos: [example]
    """

    targets: dict[str, np.ndarray]
    baseline: np.ndarray
    query_pos: np.ndarray


def gather_pattern_attention(
    attn_row: Any,
    query_pos: Any,
    induction_pos: Any,
    duplicate_pos: Any,
    baseline_n: int = DEFAULT_BASELINE_N,
    baseline_seed: int = DEFAULT_BASELINE_SEED,
) -> PatternAttention:
    """Reduce attention rows at the query position to the pattern and baseline summaries.

    attn_row: [example, layer, head, key] (torch or numpy; row of attention weights from q).
    Works chunk by chunk: the baseline positions depend only on each example's q and the seed.
    """
    a = _as_torch(attn_row)
    if a.ndim != 4:
        raise HeadLabError(f"attn_row must be [example, layer, head, key], got shape {tuple(a.shape)}.")
    n, _, _, n_keys = a.shape
    q = _positions(query_pos, "query_pos", n)
    p1 = _positions(induction_pos, "induction_pos", n)
    p = _positions(duplicate_pos, "duplicate_pos", n)
    if np.any(q >= n_keys) or np.any(q < max(LOCAL_OFFSETS)) or np.any(p < 0) or np.any(p1 >= q):
        raise HeadLabError(
            "attention rows and positions disagree (need 5 <= q < number of keys and 0 <= p < p+1 < q); "
            "pass the probe batch the rows came from."
        )
    rows = torch.arange(n, device=a.device)

    def at(pos: np.ndarray) -> np.ndarray:  # [example] positions -> [example, layer, head]
        return a[rows, :, :, torch.as_tensor(pos, device=a.device)].detach().double().cpu().numpy()

    targets = {
        "induction": at(p1),
        "duplicate-token": at(p),
        "previous-token": at(q - 1),
        "self": at(q),
        "first-token": at(np.zeros_like(q)),
        "local": np.mean([at(q - off) for off in LOCAL_OFFSETS], axis=0),
    }
    baseline = np.empty(targets["self"].shape, dtype=np.float64)  # [example, layer, head]
    for q_value in np.unique(q):
        idx = np.flatnonzero(q == q_value)
        keys = torch.as_tensor(baseline_positions(int(q_value), baseline_n, baseline_seed), device=a.device)
        sub = a[torch.as_tensor(idx, device=a.device)][..., keys]  # [m, layer, head, n_baseline]
        baseline[idx] = sub.double().mean(dim=-1).cpu().numpy()
    return PatternAttention(targets=targets, baseline=baseline, query_pos=q)


# ---------------------------------------------------------------- selectivity


def selectivity_denominator(
    attn_baseline: Any = None,
    baseline: str = "random",
    query_pos: Any = None,
    shape: tuple[int, int] | None = None,
    floor: float = DENOMINATOR_FLOOR,
) -> np.ndarray:
    """The selectivity denominator [layer, head], floored.

    "random": mean over examples of attn_baseline [example, layer, head].
    "uniform": mean over examples of 1/(q+1), the same for every head (needs query_pos and shape).
    """
    if baseline not in BASELINE_KINDS:
        raise HeadLabError(f'unknown baseline "{baseline}"; use "random" or "uniform".')
    if baseline == "random":
        if attn_baseline is None:
            raise HeadLabError('the "random" baseline needs the attention to the baseline positions; run the probe again.')
        denom = np.asarray(attn_baseline, dtype=np.float64).mean(axis=0)
    else:
        if query_pos is None or shape is None:
            raise HeadLabError('the "uniform" baseline needs the query positions; pass query_pos.')
        q = _positions(query_pos, "query_pos")
        denom = np.full(shape, float(np.mean(1.0 / (q + 1.0))))
    return np.maximum(denom, floor)


def selectivity(
    attn_to_targets: Mapping[str, Any],
    attn_baseline: Any = None,
    baseline: str = "random",
    query_pos: Any = None,
    patterns: Sequence[str] | None = None,
    floor: float = DENOMINATOR_FLOOR,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Selectivity [pattern, layer, head] as a ratio of means over examples, and the pattern names.

    attn_to_targets: pattern -> [example, layer, head] attention from q to the pattern's target
    (for "local" the per-example mean over q-5..q-2); attn_baseline: [example, layer, head].
    """
    names = tuple(patterns) if patterns is not None else tuple(k for k in PATTERNS if k in attn_to_targets)
    missing = [k for k in names if k not in attn_to_targets]
    if not names or missing:
        raise HeadLabError(f"attention summaries are missing patterns {missing or list(PATTERNS)}; run the probe again.")
    means = np.stack([np.asarray(attn_to_targets[k], dtype=np.float64).mean(axis=0) for k in names])  # [pattern, L, H]
    denom = selectivity_denominator(attn_baseline, baseline, query_pos, means.shape[1:], floor)
    return means / denom, names


def classify(
    sel: Any,
    patterns: Sequence[str] = PATTERNS,
    threshold: float = CLASS_THRESHOLD,
    unspecialized_label: str = "unspecialized",
) -> np.ndarray:
    """Each head's class [layer, head] (str): its most selective pattern if >= threshold, else the label.

    The reference's all-head counts say "unspecialized"; its top-K lists say "unclassified".
    Ties go to the earlier pattern; NaN selectivity never qualifies.
    """
    s = np.asarray(sel, dtype=np.float64)
    if s.ndim != 3 or s.shape[0] != len(patterns):
        raise HeadLabError(f"selectivity must be [pattern, layer, head] with {len(patterns)} patterns, got {s.shape}.")
    filled = np.where(np.isnan(s), -np.inf, s)
    best = filled.argmax(axis=0)  # first maximum on ties
    best_value = np.take_along_axis(filled, best[None], axis=0)[0]
    names = np.asarray(list(patterns), dtype=object)
    return np.where(best_value >= threshold, names[best], unspecialized_label).astype(object)


def class_counts(classes: Any) -> dict[str, int]:
    """{class: number of heads}, from classify()."""
    values, counts = np.unique(np.asarray(classes, dtype=str), return_counts=True)
    return {str(v): int(c) for v, c in zip(values, counts)}


def circuit_members(sel: Any, threshold: float = INDUCTION_THRESHOLD) -> HeadSet:
    """Circuit members ("precision" threshold): heads whose selectivity [layer, head] is >= threshold."""
    s = np.asarray(sel, dtype=np.float64)
    return HeadSet.from_mask(np.nan_to_num(s, nan=-np.inf) >= threshold)


# ---------------------------------------------------------------- null floor


class _Stream:
    """randint(1, high) values in the order repeated scalar calls would return them.

    For one fixed bound, numpy's legacy RandomState gives the same values from one bulk call as
    from repeated scalar calls (tested), so a buffer reproduces the reference loop fast.
    """

    def __init__(self, rng: np.random.RandomState, high: int, size: int = 8192) -> None:
        self.rng, self.high, self.size = rng, high, size
        self.buf: list[int] = []
        self.at = 0

    def next(self) -> int:
        if self.at == len(self.buf):
            self.buf, self.at = self.rng.randint(1, self.high, size=self.size).tolist(), 0
        self.at += 1
        return self.buf[self.at - 1]


def null_target_positions(
    query_pos: Any,
    induction_pos: Any,
    duplicate_pos: Any,
    n_draws: int = DEFAULT_NULL_DRAWS,
    seed: int = DEFAULT_NULL_SEED,
) -> np.ndarray:
    """Random non-special target positions for the null, [draw, example].

    Reference procedure, draw by draw and example by example from one RandomState(seed):
    randint(1, q) until the value is not 0, q, q-1, q-5..q-2, p or p+1.
    """
    q = _positions(query_pos, "query_pos")
    n = q.shape[0]
    p1 = _positions(induction_pos, "induction_pos", n)
    p = _positions(duplicate_pos, "duplicate_pos", n)
    if n_draws < 1:
        raise HeadLabError("the null needs at least one draw; pass n_draws >= 1.")
    avoid = [forbidden_positions(qi) | {pi, p1i} for qi, pi, p1i in zip(q.tolist(), p.tolist(), p1.tolist())]
    for qi, bad in zip(q.tolist(), avoid):
        if not any(k not in bad for k in range(1, qi)):
            raise HeadLabError(f"query position {qi} leaves no non-special key for the null; use a longer probe.")
    rng = np.random.RandomState(seed)
    out = np.empty((n_draws, n), dtype=np.int64)
    if np.all(q == q[0]):
        stream = _Stream(rng, int(q[0]))
        draw = stream.next
        for d in range(n_draws):
            for i in range(n):
                k = draw()
                while k in avoid[i]:
                    k = draw()
                out[d, i] = k
        return out
    q_list = q.tolist()
    for d in range(n_draws):
        for i in range(n):
            k = int(rng.randint(1, q_list[i]))
            while k in avoid[i]:
                k = int(rng.randint(1, q_list[i]))
            out[d, i] = k
    return out


def null_selectivity_from_means(null_mean_attn: Any, denominator: Any) -> np.ndarray:
    """[draw, layer, head] null selectivity from the per-draw mean attention to the null targets."""
    return np.asarray(null_mean_attn, dtype=np.float64) / np.asarray(denominator, dtype=np.float64)


def null_induction_selectivity(
    attn_row: Any,
    query_pos: Any,
    induction_pos: Any,
    duplicate_pos: Any,
    n_draws: int = DEFAULT_NULL_DRAWS,
    seed: int = DEFAULT_NULL_SEED,
    baseline: str = "random",
    baseline_n: int = DEFAULT_BASELINE_N,
    baseline_seed: int = DEFAULT_BASELINE_SEED,
    floor: float = DENOMINATOR_FLOOR,
) -> np.ndarray:
    """The null for induction selectivity, [draw, layer, head].

    The same head's induction selectivity, with the target p+1 replaced by a random non-special
    position per example and draw (see null_target_positions), over the same denominator as the
    real selectivity. attn_row: [example, layer, head, key].
    """
    a = _as_torch(attn_row)
    summaries = gather_pattern_attention(a, query_pos, induction_pos, duplicate_pos, baseline_n, baseline_seed)
    denom = selectivity_denominator(summaries.baseline, baseline, summaries.query_pos, a.shape[1:3], floor)
    positions = null_target_positions(query_pos, induction_pos, duplicate_pos, n_draws, seed)  # [draw, example]
    rows = torch.arange(a.shape[0], device=a.device)
    means = np.empty((n_draws,) + tuple(a.shape[1:3]), dtype=np.float64)
    for d in range(n_draws):
        keys = torch.as_tensor(positions[d], device=a.device)
        means[d] = a[rows, :, :, keys].double().mean(dim=0).cpu().numpy()
    return null_selectivity_from_means(means, denom)


def null_p99(null: Any, per_head: bool = False) -> float | np.ndarray:
    """99th percentile (numpy linear) of the null: pooled over draws and heads (float), or per head [layer, head]."""
    z = np.asarray(null, dtype=np.float64)
    if z.ndim != 3:
        raise HeadLabError(f"the null must be [draw, layer, head], got shape {z.shape}.")
    return np.percentile(z, 99, axis=0) if per_head else float(np.percentile(z, 99))


def noise_floor(null: Any, per_head: bool = False, minimum: float = NOISE_FLOOR_MINIMUM) -> float | np.ndarray:
    """The "recall" threshold T = max(2, null p99), global (float) or per head [layer, head]."""
    p99 = null_p99(null, per_head)
    return np.maximum(p99, minimum) if per_head else max(float(p99), minimum)


def specialized_fraction(sel_induction: Any, null_p99_value: float | Any) -> float:
    """Share of heads whose induction selectivity exceeds (strictly) the null p99 (float or [layer, head]).

    This is the [SPC] "specialized fraction" (Pythia-160M 26/144 against the pooled null p99).
    """
    s = np.asarray(sel_induction, dtype=np.float64)
    return float(np.mean(np.nan_to_num(s, nan=-np.inf) > np.asarray(null_p99_value, dtype=np.float64)))


def fraction_at_threshold(sel: Any, threshold: float = CLASS_THRESHOLD) -> float:
    """Share of heads whose best selectivity (over patterns) is >= threshold. sel: [pattern, layer, head] or [layer, head]."""
    s = np.nan_to_num(np.asarray(sel, dtype=np.float64), nan=-np.inf)
    best = s.max(axis=0) if s.ndim == 3 else s
    return float(np.mean(best >= threshold))


# ---------------------------------------------------------------- result


@dataclass(frozen=True, eq=False)
class ScreenResult(JsonResult):
    """Step 2 at one checkpoint: selectivity, classes, circuit members, null floor and fractions.

    selectivity: [pattern, layer, head] against `baseline` ("random" | "uniform")
    null:        [draw, layer, head] null induction selectivity, or None when not computed
    null_per_head: False (default) uses the p99 pooled over all draws and heads, as the reference
                 calibration's `null_p99` and its K_above_null_p99 counts; True uses each head's own p99.
    membership_selectivity: [pattern, layer, head] against `membership_baseline`, for circuit membership
    """

    patterns: tuple[str, ...]
    selectivity: np.ndarray
    baseline: str = "random"
    n_examples: int = 0
    threshold: float = CLASS_THRESHOLD
    induction_threshold: float = INDUCTION_THRESHOLD
    null: np.ndarray | None = None
    null_per_head: bool = False
    null_seed: int = DEFAULT_NULL_SEED
    baseline_n: int = DEFAULT_BASELINE_N
    baseline_seed: int = DEFAULT_BASELINE_SEED
    unspecialized_label: str = "unspecialized"
    # circuit membership is judged against its own baseline: the reference calibration states the
    # 50x induction threshold against the uniform baseline 1/(q+1) (METHODS.md Step 2). The
    # previous-token circuit (composition) is chosen by the same rule on previous-token selectivity.
    membership_baseline: str = "uniform"
    membership_selectivity: np.ndarray | None = None

    @classmethod
    def from_attention(
        cls,
        attn_row: Any,
        query_pos: Any,
        induction_pos: Any,
        duplicate_pos: Any,
        baseline: str = "random",
        threshold: float = CLASS_THRESHOLD,
        induction_threshold: float = INDUCTION_THRESHOLD,
        n_null_draws: int = DEFAULT_NULL_DRAWS,
        null_seed: int = DEFAULT_NULL_SEED,
        membership_baseline: str = "uniform",
    ) -> "ScreenResult":
        """Everything from full attention rows attn_row [example, layer, head, key]; n_null_draws=0 skips the null.

        The random baseline is the reference draw (DEFAULT_BASELINE_N positions from
        DEFAULT_BASELINE_SEED); for the per-head null p99, dataclasses.replace(result, null_per_head=True).
        """
        baseline_n, baseline_seed = DEFAULT_BASELINE_N, DEFAULT_BASELINE_SEED
        summ = gather_pattern_attention(attn_row, query_pos, induction_pos, duplicate_pos, baseline_n, baseline_seed)
        sel, names = selectivity(summ.targets, summ.baseline, baseline, summ.query_pos)
        member_sel, _ = selectivity(summ.targets, summ.baseline, membership_baseline, summ.query_pos, names)
        null = None
        if n_null_draws > 0:
            null = null_induction_selectivity(
                attn_row, query_pos, induction_pos, duplicate_pos, n_null_draws, null_seed,
                baseline, baseline_n, baseline_seed,
            )
        return cls(
            patterns=names, selectivity=sel, baseline=baseline, n_examples=int(summ.query_pos.shape[0]),
            threshold=threshold, induction_threshold=induction_threshold, null=null, null_seed=null_seed,
            baseline_n=baseline_n, baseline_seed=baseline_seed, membership_baseline=membership_baseline,
            membership_selectivity=member_sel,
        )

    @property
    def induction_selectivity(self) -> np.ndarray:
        """[layer, head]"""
        return self.selectivity[self.patterns.index("induction")]

    @property
    def classes(self) -> np.ndarray:
        """[layer, head] class names (>= threshold, else unspecialized_label)."""
        return classify(self.selectivity, self.patterns, self.threshold, self.unspecialized_label)

    def membership_of(self, pattern: str) -> np.ndarray:
        """[layer, head] selectivity for `pattern` against the membership baseline (the screen's own if unset)."""
        index = self.patterns.index(pattern)
        return self.selectivity[index] if self.membership_selectivity is None else self.membership_selectivity[index]

    @property
    def membership(self) -> np.ndarray:
        """[layer, head] induction selectivity against the membership baseline."""
        return self.membership_of("induction")

    @property
    def induction_heads(self) -> HeadSet:
        """Induction-circuit members: membership selectivity >= induction_threshold."""
        return circuit_members(self.membership, self.induction_threshold)

    @property
    def previous_token_circuit(self) -> HeadSet:
        """The previous-token heads the induction heads compose with, chosen by the induction circuit's own
        rule: previous-token selectivity against the membership baseline >= induction_threshold. The class
        rule (>= 30x on the screen's baseline) can miss heads that carry the previous token together."""
        return circuit_members(self.membership_of("previous-token"), self.induction_threshold)

    @property
    def null_p99(self) -> float | np.ndarray | None:
        return None if self.null is None else null_p99(self.null, self.null_per_head)

    @property
    def noise_floor(self) -> float | np.ndarray | None:
        return None if self.null is None else noise_floor(self.null, self.null_per_head)

    @property
    def specialized_fraction(self) -> float | None:
        """Share of heads with induction selectivity above the null p99 (None without a null)."""
        p99 = self.null_p99
        return None if p99 is None else specialized_fraction(self.induction_selectivity, p99)

    @property
    def fraction_at_threshold(self) -> float:
        """Share of heads whose best selectivity is >= threshold (any pattern)."""
        return fraction_at_threshold(self.selectivity, self.threshold)

    def fractions(self) -> dict[str, float | None]:
        """Both "specialized" figures METHODS.md names, with names that say which is which."""
        return {
            "specialized_fraction_above_null_p99": self.specialized_fraction,
            f"fraction_best_selectivity_at_least_{self.threshold:g}x": self.fraction_at_threshold,
        }

    def to_json(self) -> dict:
        """The fields, then derived figures for readers of the file (from_json recomputes them)."""
        return {
            **super().to_json(),
            "classes": self.classes.tolist(),
            "class_counts": class_counts(self.classes),
            "induction_heads": self.induction_heads.to_json(),
            "null_p99": jsonable(self.null_p99),
            "noise_floor": jsonable(self.noise_floor),
            "fractions": self.fractions(),
        }

    @classmethod
    def from_json(cls, data: dict | str) -> "ScreenResult":
        """From to_json's dict or its JSON text; older files without membership_baseline used the screen's own."""
        data = dict(json.loads(data) if isinstance(data, str) else data)
        data.setdefault("membership_baseline", data["baseline"])
        return super().from_json(data)
