"""Circuits over training as pure functions of per-checkpoint arrays: when PR rises, when
selectivity crosses its threshold, when the circuit at a checkpoint already equals the final one,
how a cross-seed matrix splits into own-model and other-model cells, form against function.

No model runs here (core/pipelines/dynamics.py feeds these from the recipe's cached HeadStats and
the ablation engine), so every function is tested on hand-made arrays. Choices fixed here:
- "Reaches the threshold" is >= (as the recipe's membership screen); NaN never reaches it.
- The PR rise is the first checkpoint where PR - (running minimum of PR up to and including that
  checkpoint) >= margin (PR units). The running minimum lets a PR that first falls from its
  random-init value and then climbs count from the bottom of its dip.
- Jaccard of two empty sets is 1 (they are the same set).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional, Sequence

import numpy as np

from core.choices import PR_RISE_MARGIN as DEFAULT_MARGIN
from core.errors import HeadLabError
from core.heads import Head, HeadSet, head_name, parse_heads

IDENTIFIABLE_BAND = (0.003, 0.02)  # [SPC]: identifiable from 0.3-2% of the training tokens
Z_THRESHOLD = 1.8  # closure / significance threshold on |z| (METHODS.md, closure test)
FORM_FUNCTION_LABELS = ("form and function", "function without form", "form without function", "neither")


class Mark(NamedTuple):
    """A checkpoint picked on a trajectory: its index and token count (both None when never)."""

    index: Optional[int]
    tokens: Optional[float]

    def to_json(self) -> dict:
        return {"index": self.index, "tokens": self.tokens}

    @classmethod
    def from_json(cls, data: dict) -> "Mark":
        return cls(data.get("index"), data.get("tokens"))


def _series(tokens: Any, values: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    tok = np.asarray(tokens, dtype=np.float64).reshape(-1)
    val = np.asarray(values, dtype=np.float64).reshape(-1)
    if tok.size != val.size or tok.size == 0:
        raise HeadLabError(f"{name} has {val.size} values for {tok.size} token counts; pass one value per checkpoint.")
    if np.any(np.diff(tok) < 0):
        raise HeadLabError("checkpoint token counts must be sorted by training tokens; sort the checkpoints first.")
    return tok, val


def _mark(tok: np.ndarray, hits: np.ndarray) -> Mark:
    found = np.flatnonzero(hits)
    if found.size == 0:
        return Mark(None, None)
    i = int(found[0])
    return Mark(i, float(tok[i]))


def threshold_crossing(tokens: Any, selectivity: Any, threshold: float) -> Mark:
    """The first checkpoint whose selectivity reaches `threshold` (>=). tokens, selectivity: [checkpoint].

    NaN never reaches it. Mark(None, None) when no checkpoint does.
    """
    tok, sel = _series(tokens, selectivity, "selectivity")
    return _mark(tok, np.nan_to_num(sel, nan=-np.inf) >= float(threshold))


def running_minimum(values: Any) -> np.ndarray:
    """min(values[0..t]) for every t; NaN values are skipped (a leading NaN stays NaN). values: [checkpoint]."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    filled = np.where(np.isnan(v), np.inf, v)
    out = np.minimum.accumulate(filled)
    return np.where(np.isinf(out), np.nan, out)


def pr_rise(tokens: Any, pr: Any, margin: float = DEFAULT_MARGIN) -> Mark:
    """The first checkpoint where PR exceeds its running minimum by at least `margin` (PR units).

    tokens, pr: [checkpoint]. The running minimum includes the checkpoint itself, so the first
    checkpoint never rises. Mark(None, None) when PR never climbs that far above its lowest point.
    """
    if not float(margin) > 0:
        raise HeadLabError(f"the PR-rise margin must be positive, got {margin}; use e.g. 0.5 PR units.")
    tok, values = _series(tokens, pr, "PR")
    floor = running_minimum(values)
    with np.errstate(invalid="ignore"):
        hits = np.nan_to_num(values - floor, nan=-np.inf) >= float(margin)
    return _mark(tok, hits)


def jaccard(a: Iterable[Head], b: Iterable[Head]) -> float:
    """|A ∩ B| / |A ∪ B| of two head sets; 1.0 when both are empty (the same set)."""
    sa, sb = set(HeadSet(tuple(a))), set(HeadSet(tuple(b)))
    union = sa | sb
    return 1.0 if not union else len(sa & sb) / len(union)


def circuits_by_checkpoint(membership: Any, threshold: float) -> tuple[HeadSet, ...]:
    """The induction circuit at each checkpoint: heads with membership selectivity >= threshold.

    membership: [checkpoint, layer, head] -> one HeadSet per checkpoint.
    """
    m = np.asarray(membership, dtype=np.float64)
    if m.ndim != 3:
        raise HeadLabError(f"membership selectivity must be [checkpoint, layer, head], got shape {m.shape}.")
    return tuple(HeadSet.from_mask(np.nan_to_num(m[c], nan=-np.inf) >= float(threshold)) for c in range(m.shape[0]))


@dataclass(frozen=True)
class Identification:
    """When the recipe, run on checkpoints up to t, already returns the final circuit.

    jaccards: [checkpoint] Jaccard(circuit at t, final circuit). first: the earliest t with
    Jaccard 1; stable: the earliest t from which every later checkpoint also has Jaccard 1.
    Fractions are tokens[t] / tokens[-1]. None when the final circuit is never matched earlier
    (the final checkpoint always matches itself), and when the final circuit is empty: no circuit
    formed, so there is nothing to identify (an empty set "matching" from 0 tokens is no finding).
    """

    tokens: tuple[float, ...]
    jaccards: tuple[float, ...]
    sizes: tuple[int, ...]
    final_circuit: HeadSet
    first: Mark
    stable: Mark
    first_fraction: Optional[float]
    stable_fraction: Optional[float]

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "jaccards": list(self.jaccards), "sizes": list(self.sizes),
                "final_circuit": str(self.final_circuit), "first": self.first.to_json(),
                "stable": self.stable.to_json(), "first_fraction": self.first_fraction,
                "stable_fraction": self.stable_fraction}

    @classmethod
    def from_json(cls, data: dict) -> "Identification":
        text = data["final_circuit"]
        return cls(tuple(float(t) for t in data["tokens"]), tuple(float(j) for j in data["jaccards"]),
                   tuple(int(s) for s in data["sizes"]), parse_heads(text) if text else HeadSet(),
                   Mark.from_json(data["first"]), Mark.from_json(data["stable"]), data["first_fraction"],
                   data["stable_fraction"])


def earliest_identifying_checkpoint(tokens: Any, circuits: Sequence[Iterable[Head]],
                                    final: Optional[Iterable[Head]] = None) -> Identification:
    """The earliest checkpoint whose circuit equals the final one (Jaccard 1), as a fraction of tokens.

    tokens: [checkpoint], sorted; circuits: the circuit each truncated recipe run returns (e.g.
    circuits_by_checkpoint); final: the reference circuit (default: the last checkpoint's).
    """
    tok = np.asarray(tokens, dtype=np.float64).reshape(-1)
    sets = [HeadSet(tuple(c)) for c in circuits]
    if tok.size != len(sets) or not sets:
        raise HeadLabError(f"{len(sets)} circuits for {tok.size} token counts; pass one circuit per checkpoint.")
    if np.any(np.diff(tok) < 0):
        raise HeadLabError("checkpoint token counts must be sorted by training tokens; sort the checkpoints first.")
    reference = sets[-1] if final is None else HeadSet(tuple(final))
    jac = np.array([jaccard(s, reference) for s in sets])  # [checkpoint]
    equal = (jac >= 1.0) & (len(reference) > 0)  # [checkpoint]; no final circuit: nothing is identified
    first = _mark(tok, equal)
    # stable: the first index after the last mismatch, if that index exists
    mismatches = np.flatnonzero(~equal)
    start = 0 if mismatches.size == 0 else int(mismatches[-1]) + 1  # no circuit: every checkpoint mismatches
    stable = Mark(start, float(tok[start])) if start < tok.size else Mark(None, None)
    total = float(tok[-1])

    def fraction(mark: Mark) -> Optional[float]:
        return None if mark.index is None or total <= 0 else float(tok[mark.index]) / total

    return Identification(tuple(tok.tolist()), tuple(jac.tolist()), tuple(len(s) for s in sets), reference,
                          first, stable, fraction(first), fraction(stable))


@dataclass(frozen=True)
class HeadTiming:
    """One head's PR rise and threshold crossing; lead = log10(crossing tokens / rise tokens), decades."""

    head: Head
    rise: Mark
    crossing: Mark

    @property
    def lead_decades(self) -> Optional[float]:
        if self.rise.tokens is None or self.crossing.tokens is None or self.rise.tokens <= 0 or self.crossing.tokens <= 0:
            return None
        return math.log10(self.crossing.tokens / self.rise.tokens)

    @property
    def rise_first(self) -> bool:
        """The PR rise happens at a strictly earlier checkpoint than the threshold crossing."""
        return self.rise.index is not None and self.crossing.index is not None and self.rise.index < self.crossing.index

    def to_json(self) -> dict:
        return {"head": head_name(self.head), "rise": self.rise.to_json(), "crossing": self.crossing.to_json(),
                "lead_decades": self.lead_decades, "rise_first": self.rise_first}

    @classmethod
    def from_json(cls, data: dict) -> "HeadTiming":
        return cls(parse_heads(data["head"]).heads[0], Mark.from_json(data["rise"]), Mark.from_json(data["crossing"]))


def timing_events(tokens: Any, pr: Any, membership: Any, heads: Iterable[Head], threshold: float,
                  margin: float = DEFAULT_MARGIN) -> tuple[HeadTiming, ...]:
    """PR rise and threshold crossing of each head. pr, membership: [checkpoint, layer, head]."""
    p = np.asarray(pr, dtype=np.float64)
    m = np.asarray(membership, dtype=np.float64)
    if p.ndim != 3 or p.shape != m.shape:
        raise HeadLabError(f"PR {p.shape} and membership {m.shape} must both be [checkpoint, layer, head].")
    out = []
    for layer, head in HeadSet(tuple(heads)).validate(p.shape[1], p.shape[2]):
        out.append(HeadTiming((layer, head), pr_rise(tokens, p[:, layer, head], margin),
                              threshold_crossing(tokens, m[:, layer, head], threshold)))
    return tuple(out)


def form_function_labels(form: Sequence[bool], function: Sequence[bool]) -> tuple[str, ...]:
    """Per checkpoint: "form and function", "function without form", "form without function" or "neither"."""
    if len(form) != len(function):
        raise HeadLabError(f"{len(form)} form flags for {len(function)} function flags; pass one of each per checkpoint.")
    names = {(True, True): FORM_FUNCTION_LABELS[0], (False, True): FORM_FUNCTION_LABELS[1],
             (True, False): FORM_FUNCTION_LABELS[2], (False, False): FORM_FUNCTION_LABELS[3]}
    return tuple(names[(bool(a), bool(b))] for a, b in zip(form, function))


def cell_summary(result: Any, circuit_b: Optional[Iterable[Head]] = None) -> dict:
    """The figures of one ablation (core.ablation.study.AblationResult) a cross-seed cell keeps.

    Per metric: clean value, candidate delta, control mean and std, z, empirical p; the recipe
    verdict; control kind and count; and Jaccard with the target model's own circuit when given.
    """
    out: dict[str, Any] = {"selection": str(result.selection), "n_controls": len(result.controls),
                           "control_kind": result.control_sets.kind, "notes": list(result.notes)}
    for metric, stats in result.stats.items():
        out[metric] = {k: stats.get(k) for k in ("clean", "candidate_delta", "control_mean", "control_std", "z", "p")}
    recipe = result.verdicts.get("recipe")
    out["recipe_verdict"] = None if recipe is None else recipe.label
    closure = result.verdicts.get("closure_paper")
    out["closure_verdict"] = None if closure is None else closure.label
    if circuit_b is not None:
        out["jaccard_with_own"] = jaccard(result.selection, circuit_b)
    return out


def seed_specificity(cells: Sequence[Sequence[Optional[dict]]], metric: str = "loss") -> dict:
    """Own-model (diagonal) vs other-model (off-diagonal) cells of a cross-seed matrix.

    cells[a][b]: cell_summary of circuit a ablated in model b, or None (not computable).
    Returns the z and delta lists and their medians; None medians when a side has no cells.
    """
    n = len(cells)
    diag_z, diag_d, off_z, off_d = [], [], [], []
    for a in range(n):
        if len(cells[a]) != n:
            raise HeadLabError("the cross-seed matrix must be square (one row and one column per model).")
        for b in range(n):
            cell = cells[a][b]
            if cell is None or cell.get(metric, {}).get("z") is None:
                continue
            (diag_z if a == b else off_z).append(float(cell[metric]["z"]))
            (diag_d if a == b else off_d).append(float(cell[metric]["candidate_delta"]))

    def median(values: list) -> Optional[float]:
        return float(np.median(values)) if values else None

    return {"metric": metric, "diagonal_z": diag_z, "off_diagonal_z": off_z, "diagonal_delta": diag_d,
            "off_diagonal_delta": off_d, "median_diagonal_z": median(diag_z), "median_off_diagonal_z": median(off_z),
            "median_diagonal_delta": median(diag_d), "median_off_diagonal_delta": median(off_d)}
