"""Inference over ablation deltas: z-scores, empirical rank and p-value, paired bootstrap, verdicts; and the
rank agreement (Spearman) of two per-head scores (gradient vs causal, attribution vs activation patching).

Pure numpy, testable on hand-made numbers and the reference result files without a model. The
metric names and their direction of damage live here too (not beside `query_metrics` in
core/ablation/spec.py) because the verdicts need them and statistics sit below the ablation engine:
imports run ablation -> stats, never back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.stats import spearmanr

from core.choices import METRICS
from core.errors import HeadLabError
from core.results import JsonResult

# ----------------------------------------------------------------------------------------------
# Metrics and their direction
# ----------------------------------------------------------------------------------------------

# +1: a larger value is damage (loss); -1: a smaller value is damage (accuracies, target logit).
DAMAGE_SIGN = {"loss": 1.0, "top1": -1.0, "top5": -1.0, "target_logit": -1.0}
# Names used by the reference result files, mapped to HeadLab's.
METRIC_ALIASES = {
    "acc_top1": "top1",
    "acc_top5": "top5",
    "mean_logit_target": "target_logit",
    "mean_logit_B": "target_logit",
    "logit": "target_logit",
}
# A control spread below this fraction of the deltas' scale is rounding, not variation: z is undefined there.
# (The reference floors a zero spread at 1e-9 and prints z ~ 1e9; such a z measures the floor, not the candidate.)
SPREAD_FLOOR = 1e-6
# Nor is a z shown where the controls' spread is negligible beside the candidate's distance from their mean:
# |delta - mean| > Z_SHOWN_MAX sd. Controls at -0.00004 +- 0.000005 against a candidate at +5.569 gave z
# +1.08e+06, a figure of how little the controls vary, not of how far the candidate stands out; the rank
# and p say what there is to say (rank 1, p = 1/(n+1)).
Z_SHOWN_MAX = 1e3
MIN_CLOSURE_CONTROLS = 3  # distinct control sets a closure verdict needs: a z from one or two says nothing
# z's denominator is the controls' sd; from fewer than this many controls that sd is itself noise,
# so z is shown greyed out / flagged "unreliable" and the rank and p lead.
MIN_RELIABLE_Z_CONTROLS = 10
Z_CONVENTION = "population sd (ddof=0), as the reference"
# A verdict from fewer examples than this is "inconclusive": the paired bootstrap CI and the mean
# deltas of a handful of prompts are too noisy to call a circuit (one prompt has no spread at all).
MIN_VERDICT_EXAMPLES = 10
RANK_P_ALPHA = 0.05  # with k controls the smallest rank p is 1/(k+1): p < 0.05 needs k >= 19


def canonical_metric(metric: str) -> str:
    """HeadLab's name for a metric (accepts the reference files' names); HeadLabError if unknown."""
    name = METRIC_ALIASES.get(metric, metric)
    if name not in DAMAGE_SIGN:
        raise HeadLabError(
            f"metric {metric!r} is not defined for this task; use one of {', '.join(METRICS)}."
        )
    return name


def is_damaging(metric: str, delta: float) -> bool:
    """Whether a delta from the clean run is damage: loss up; top-1, top-5, target logit down."""
    return bool(DAMAGE_SIGN[canonical_metric(metric)] * float(delta) > 0)


def _canonical_dict(values: dict) -> dict:
    return {canonical_metric(k): v for k, v in values.items()}


# ----------------------------------------------------------------------------------------------
# Candidate against controls
# ----------------------------------------------------------------------------------------------


def degenerate_spread(control_deltas: Sequence[float]) -> bool:
    """Whether the controls' spread is zero up to rounding (fewer than two controls, or all alike): no z exists."""
    controls = np.asarray(control_deltas, dtype=np.float64)
    if controls.size < 2:
        return True
    return float(controls.std(ddof=0)) <= SPREAD_FLOOR * max(1.0, float(np.abs(controls).max()))


def negligible_spread(candidate_delta: float, control_deltas: Sequence[float]) -> bool:
    """Whether no z is shown: the controls' spread is zero up to rounding (`degenerate_spread`), or
    negligible beside the candidate's distance from their mean (|delta - mean| > Z_SHOWN_MAX sd)."""
    controls = np.asarray(control_deltas, dtype=np.float64)
    if degenerate_spread(controls):
        return True
    return abs(float(candidate_delta) - float(controls.mean())) > Z_SHOWN_MAX * float(controls.std(ddof=0))


def z_score(candidate_delta: float, control_deltas: Sequence[float]) -> float | None:
    """(candidate - mean(controls)) / population std(controls); None where the spread is degenerate or
    negligible beside the candidate's delta (`negligible_spread`): the rank and p stand in for it."""
    controls = np.asarray(control_deltas, dtype=np.float64)
    if controls.size == 0:
        raise HeadLabError("a z-score needs at least one control; run some controls.")
    if negligible_spread(candidate_delta, controls):
        return None
    return float((float(candidate_delta) - controls.mean()) / float(controls.std(ddof=0)))


def format_z(z: float | None) -> str:
    """A z for tables and printouts: "n/a (degenerate)" where the controls' spread is zero or negligible."""
    return "n/a (degenerate)" if z is None else f"{z:+.3g}"


def controls_for_p(alpha: float = RANK_P_ALPHA) -> int:
    """The fewest controls whose smallest rank p, 1/(k+1), is at most alpha: 19 for 0.05."""
    if not 0 < alpha < 1:
        raise HeadLabError("the significance level must lie strictly between 0 and 1, e.g. 0.05.")
    return int(np.ceil(1.0 / alpha - 1.0 - 1e-9))


def evidence_flags(n_controls: int, z: float | None = 0.0) -> tuple[str, ...]:
    """What the controls cannot back, as the CLI prints it beside rank and p and the lab shows it beside
    a verdict (one rule for both): no z (spread negligible), a z from fewer than 10 controls, and fewer
    controls than a p < 0.05 needs. `z`: the z shown (None: none; leave out where no z is in question)."""
    n = int(n_controls)
    flags = []
    if z is None:
        flags.append(f"no z: the controls' spread is zero or under 1/{Z_SHOWN_MAX:g} of the candidate's distance "
                     "from their mean; the rank and p stand")
    elif n < MIN_RELIABLE_Z_CONTROLS:
        flags.append(f"z unreliable: fewer than {MIN_RELIABLE_Z_CONTROLS} controls")
    if n < controls_for_p():
        flags.append(f"inconclusive: {n} controls cannot reach p < {RANK_P_ALPHA:g}; "
                     f"the smallest p is 1/{n + 1}, use at least {controls_for_p()}")
    return tuple(flags)


def verdict_tone(label: str, n_controls: int) -> str:
    """How a verdict is shown (the lab's colour): "good" for "causal" or "pass" from enough controls to
    reach p < 0.05, "caution" for "inconclusive" or a pass from fewer (3 controls: p >= 0.25, which the
    CLI flags "inconclusive"), "bad" for the rest."""
    if label == "inconclusive" or (label in ("causal", "pass") and int(n_controls) < controls_for_p()):
        return "caution"
    return "good" if label in ("causal", "pass") else "bad"


def format_rank_z(rank: int, p: float, n_controls: int, z: float | None) -> str:
    """Rank and p first, then z with its number of controls and sd convention, and `evidence_flags`.

    e.g. "rank 1 of 21, p = 0.0476; z +2.31 (20 controls, population sd (ddof=0), as the reference)".
    """
    text = (f"rank {rank} of {n_controls + 1}, p = {p:.3g}; z {format_z(z)} "
            f"({n_controls} control{'s' if n_controls != 1 else ''}, {Z_CONVENTION})")
    return text + "".join(f" [{flag}]" for flag in evidence_flags(n_controls, z))


@dataclass(frozen=True)
class RankP:
    """The candidate's rank among candidate + controls, 1 = most damaging (ties count against it)."""

    rank: int
    p: float
    n_controls: int


def empirical_rank_p(candidate: float, controls: Sequence[float], damage_sign: float) -> RankP:
    """p = (1 + #controls at least as damaging as the candidate) / (n + 1).

    damage_sign: +1 when larger is damage (loss), -1 when smaller is damage (top-1, logit).
    """
    values = np.asarray(controls, dtype=np.float64)
    at_least = int(np.sum(damage_sign * values >= damage_sign * float(candidate)))
    return RankP(rank=1 + at_least, p=(1 + at_least) / (values.size + 1), n_controls=int(values.size))


def bootstrap_ci(per_example_deltas: Sequence[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean delta, resampling examples (deltas are paired per example)."""
    deltas = np.asarray(per_example_deltas, dtype=np.float64).reshape(-1)  # [example]
    if deltas.size == 0:
        raise HeadLabError("a bootstrap interval needs at least one example.")
    if not 0 < level < 1:
        raise HeadLabError("the confidence level must lie strictly between 0 and 1, e.g. 0.95.")
    rng = np.random.default_rng(seed)
    means = np.empty(int(n_boot))
    step = max(1, 2_000_000 // deltas.size)  # bound memory: [step, n] indices at a time
    for start in range(0, int(n_boot), step):
        size = min(step, int(n_boot) - start)
        idx = rng.integers(0, deltas.size, size=(size, deltas.size))
        means[start : start + size] = deltas[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


# ----------------------------------------------------------------------------------------------
# Verdicts
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict(JsonResult):
    """A verdict with the rule that produced it and why."""

    label: str
    rule: str
    reasons: tuple[str, ...] = ()
    z: dict = field(default_factory=dict)


def recipe_verdict(
    candidate_deltas: dict[str, float],
    control_deltas: dict[str, Sequence[float]],
    clean_top1: float,
    upper_bound_deltas: dict[str, float] | None,
    min_controls: int = 19,
    min_clean_top1: float = 0.2,
    min_upper_bound_fraction: float = 0.9,
) -> Verdict:
    """The recipe's operational criterion [SPC]: "causal", "not causal" or "inconclusive".

    Causal: the candidate's delta is more damaging than every one of n >= min_controls matched draws
    on both loss and top-1 (p <= 1/(n+1)), the clean top-1 >= min_clean_top1, and the upper bound
    removes >= min_upper_bound_fraction of the clean top-1. Inconclusive when the clean model cannot
    do the task (clean top-1 below the threshold) or too few controls ran to reach that p.
    """
    rule = (
        f"recipe: worse than all >= {min_controls} matched draws on loss and top-1, "
        f"clean top-1 >= {min_clean_top1:g}, upper bound removes >= {min_upper_bound_fraction:.0%} of clean top-1"
    )
    cand = _canonical_dict(candidate_deltas)
    ctrl = _canonical_dict(control_deltas)
    for metric in ("loss", "top1"):
        if metric not in cand or metric not in ctrl:
            raise HeadLabError(f"the recipe verdict needs {metric} deltas for the candidate and the controls; run them.")
    n = min(len(ctrl["loss"]), len(ctrl["top1"]))
    if clean_top1 < min_clean_top1:
        return Verdict("inconclusive", rule, (f"clean top-1 is {clean_top1:.3f} < {min_clean_top1:g}: the clean model cannot do this task.",))
    if n < min_controls:
        return Verdict("inconclusive", rule, (f"only {n} control draws ran; the criterion needs at least {min_controls}.",))
    reasons = []
    ok = True
    for metric in ("loss", "top1"):
        rp = empirical_rank_p(cand[metric], ctrl[metric], DAMAGE_SIGN[metric])
        beats_all = rp.rank == 1
        ok &= beats_all
        reasons.append(
            f"{metric}: candidate delta {cand[metric]:+.4g} is "
            + ("more damaging than every control" if beats_all else f"not more damaging than {rp.rank - 1} of {n} controls")
            + f" (p = {rp.p:.3g})."
        )
    if upper_bound_deltas is None or "top1" not in _canonical_dict(upper_bound_deltas):
        ok = False
        reasons.append("the upper bound (every head in the selected layers) was not run.")
    else:
        removed = -float(_canonical_dict(upper_bound_deltas)["top1"]) / clean_top1
        ub_ok = removed >= min_upper_bound_fraction
        ok &= ub_ok
        shown = round(removed, 2) + 0.0  # + 0.0: a rounded -0.0 prints "0%", not "-0%"
        reasons.append(f"upper bound removes {shown:.0%} of clean top-1 ({'>=' if ub_ok else '<'} {min_upper_bound_fraction:.0%}).")
    return Verdict("causal" if ok else "not causal", rule, tuple(reasons))


def below_minimum(verdict: Verdict, n_examples: int, min_examples: int = MIN_VERDICT_EXAMPLES) -> Verdict:
    """The verdict as "inconclusive" when it rests on fewer than min_examples examples; unchanged otherwise."""
    if int(n_examples) >= int(min_examples):
        return verdict
    would = "" if verdict.label == "inconclusive" else f" (it would have read {verdict.label!r})"
    why = (f"only {int(n_examples)} example{'s' if int(n_examples) != 1 else ''}: a verdict needs at least {min_examples}"
           f"{would}; use more examples (--n, or more probe-file records).")
    return Verdict("inconclusive", verdict.rule, (why,) + tuple(verdict.reasons), verdict.z)


def _control_values(candidate: float, controls: Sequence[float], metric: str) -> str:
    """"metric: the candidate's delta is ..., the controls' ..." (the first five controls, sorted)."""
    values = ", ".join(f"{v:+.4g}" for v in sorted(controls)[:5]) + (", ..." if len(controls) > 5 else "")
    return f"{metric}: the candidate's delta is {candidate:+.4g}, the controls' {values}."


def _too_few_controls(candidate: float, controls: Sequence[float], metric: str, min_controls: int) -> tuple[str, ...]:
    """Why too few distinct control sets cannot back a verdict; () when there are enough."""
    n = len(controls)
    if n >= min_controls:
        return ()
    return (f"only {n} distinct control set{' was' if n == 1 else 's were'} measured; a verdict needs at least "
            f"{min_controls}, and a z from fewer means nothing.", _control_values(candidate, controls, metric),
            "Choose fewer heads, the other control kind, or a model with more heads.")


def _closure_without_spread(cand: dict, ctrl: dict, metrics: list[str], head_metric: str, rule_text: str, z: dict,
                  alpha: float = RANK_P_ALPHA) -> Verdict:
    """Closure where the controls' spread on the headline metric is zero or negligible, so no z is shown.

    The rules' z is then -inf or +inf (or 0/0), and flooring the spread (the reference's 1e-9) would print
    z ~ 1e9, a figure of the floor. The verdict takes the rules' limit instead: a pass when every delta is
    damage and the candidate's headline delta lies beyond every control's by more than rounding, from as
    many distinct control sets as a z needs (closure_verdict's min_controls); the reasons give the rank and
    p in place of the z, and say when the controls are too few for p <= alpha.
    """
    sign = DAMAGE_SIGN[head_metric]
    candidate = float(cand[head_metric])
    controls = np.asarray(ctrl[head_metric], dtype=np.float64)
    rp = empirical_rank_p(candidate, controls, sign)
    scale = max(1.0, abs(candidate), float(np.abs(controls).max()))
    beyond = sign * candidate - float(np.max(sign * controls)) > SPREAD_FLOOR * scale
    reasons = [f"the controls' spread on {head_metric} is 0 or negligible beside the candidate's delta (every control "
               "set changes it alike), so no z is shown; "
               f"the verdict reads the rank instead: {rp.rank} of {rp.n_controls + 1}, p = {rp.p:.3g}"
               + ("." if rp.n_controls >= controls_for_p(alpha) else
                  f" ({rp.n_controls} controls cannot reach p <= {alpha:g}; {controls_for_p(alpha)} can)."),
               _control_values(candidate, controls, head_metric)]
    not_damage = [metric for metric in metrics if not is_damaging(metric, cand[metric])]
    reasons += [f"{metric} delta {cand[metric]:+.4g} is not damage." for metric in not_damage]
    if not beyond:
        reasons.append(f"the candidate's {head_metric} delta does not lie beyond every control's by more than rounding.")
    passed = not not_damage and beyond
    if passed:
        reasons.append(f"every delta is damage and the candidate is more damaging than all {rp.n_controls} controls.")
    return Verdict("pass" if passed else "fail", rule_text, tuple(reasons), z)


def closure_verdict(
    candidate_deltas: dict[str, float],
    control_deltas: dict[str, Sequence[float]],
    rule: str = "paper",
    headline: str = "logit",
    z_threshold: float = 1.8,
    min_controls: int = MIN_CLOSURE_CONTROLS,
) -> Verdict:
    """The closure test [CVC]: "pass", "fail", "fails in the wrong direction" or "inconclusive", with the rule named.

    paper (default): every metric's delta is damaging and the signed z of the headline metric is
    beyond the threshold in the damaging direction (z_logit < -1.8, or z_loss > +1.8 for headline loss).
    reference: every delta damaging and, on at least one metric, the candidate lies outside the
    control range on the damaging side. Either rule: delta loss < 0 with z_loss < -threshold is
    "fails in the wrong direction" (the ablation improves the model far beyond the controls).
    Either rule is "inconclusive" with fewer than min_controls distinct control sets. Where the controls'
    spread on the headline metric is zero (no z), either rule takes its limit (`_closure_without_spread`): a pass
    needs every delta damaging and the candidate beyond every control by more than rounding, and the
    verdict gives the rank and p in place of the z.
    """
    if rule not in ("paper", "reference"):
        raise HeadLabError(f"closure rule {rule!r} is unknown; use 'paper' or 'reference'.")
    if headline not in ("logit", "loss"):
        raise HeadLabError(f"closure headline {headline!r} is unknown; use 'logit' or 'loss'.")
    cand = _canonical_dict(candidate_deltas)
    ctrl = _canonical_dict(control_deltas)
    metrics = [m for m in METRICS if m in cand]
    if not metrics:
        raise HeadLabError("the closure verdict needs at least one metric delta; run the candidate.")
    for metric in metrics:
        if metric not in ctrl:
            raise HeadLabError(f"the closure verdict needs control deltas for {metric}; run the controls.")
    head_metric = "target_logit" if headline == "logit" else "loss"
    if head_metric not in cand:
        raise HeadLabError(f"the {headline} headline needs the {head_metric} delta, which this task does not define; pick another headline.")
    z = {metric: z_score(cand[metric], ctrl[metric]) for metric in metrics}
    if rule == "paper":
        rule_text = f"paper: every delta damaging and z_{head_metric} {'<' if headline == 'logit' else '>'} {'-' if headline == 'logit' else '+'}{z_threshold:g}"
    else:
        rule_text = "reference: every delta damaging and outside the control range (damaging side) on at least one metric"
    too_few = _too_few_controls(cand[head_metric], ctrl[head_metric], head_metric, min_controls)
    if too_few:
        return Verdict("inconclusive", rule_text, too_few, z)
    if z[head_metric] is None:  # controls that all change the headline metric alike: the rules' limit, rank and p
        return _closure_without_spread(cand, ctrl, metrics, head_metric, rule_text, z)
    reasons = []
    if "loss" in cand and cand["loss"] < 0 and z["loss"] is not None and z["loss"] < -z_threshold:
        reasons.append(
            f"ablating the candidate lowers the loss by {-cand['loss']:.4g} (z_loss {z['loss']:+.2f} < -{z_threshold:g}): "
            "it improves the model beyond every control, the opposite of closure."
        )
        return Verdict("fails in the wrong direction", rule_text, tuple(reasons), z)
    damaging = {metric: is_damaging(metric, cand[metric]) for metric in metrics}
    for metric in metrics:
        if not damaging[metric]:
            reasons.append(f"{metric} delta {cand[metric]:+.4g} is not damage.")
    if rule == "paper":
        sign = DAMAGE_SIGN[head_metric]
        strong = sign * z[head_metric] > z_threshold
        if not strong:
            reasons.append(f"z_{head_metric} = {z[head_metric]:+.2f} is not beyond {sign * z_threshold:+g}.")
    else:
        outside = []
        for metric in metrics:
            sign = DAMAGE_SIGN[metric]
            if sign * cand[metric] > max(sign * np.asarray(ctrl[metric], dtype=np.float64)):
                outside.append(metric)
        strong = bool(outside)
        if not strong:
            reasons.append("no metric's delta lies outside the control range on the damaging side.")
    passed = all(damaging.values()) and strong
    if passed:
        reasons.append("every delta is damage and the candidate stands out from its controls.")
    return Verdict("pass" if passed else "fail", rule_text, tuple(reasons), z)


def spearman(G: Sequence[float], C: Sequence[float]) -> tuple[float | None, float | None]:
    """(rho, p) by scipy.stats.spearmanr; (None, None) when either vector is constant (rho undefined)."""
    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    if G.size < 2 or np.all(G == G[0]) or np.all(C == C[0]):
        return None, None
    result = spearmanr(G, C)
    return float(result.statistic), float(result.pvalue)
