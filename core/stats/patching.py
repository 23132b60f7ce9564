"""The arithmetic of patching: the normalized score, and a patched group against its controls.

Every patching result (core/ablation/patching/) reports a run's mean metric on one scale: the clean
run scores 1 and the corrupted run 0. Denoising (clean activations into the corrupted run) finds
what is sufficient: a head matters when its score rises above 0. Noising (corrupted into the
clean run) finds what is necessary: a head matters when its score falls below 1. Pure numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from core.choices import PATCH_DIRECTIONS as DIRECTIONS
from core.errors import HeadLabError
from core.stats.inference import DAMAGE_SIGN, MIN_RELIABLE_Z_CONTROLS, Z_CONVENTION, empirical_rank_p, z_score

# +1: a larger score means more effect (denoising restores); -1: a smaller one does (noising breaks).
EFFECT_SIGN = {"denoise": 1.0, "noise": -1.0}
GAP_FLOOR = 1e-12  # a clean-corrupted gap below this has nothing to normalize by
# The gap rule: the mean per-example clean-corrupted gap (signed so the clean run is better) must be
# positive and at least MIN_GAP_SE standard errors of the per-example gaps; else the normalized
# scores divide by noise, and a patching result is refused unless the user forces it.
MIN_GAP_SE = 2.0


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise HeadLabError(f"patching direction {direction!r} is unknown; use 'denoise' or 'noise'.")
    return direction


def normalized_score(value: float | np.ndarray, clean: float, corrupted: float) -> float | np.ndarray:
    """(value - corrupted) / (clean - corrupted): 1 at the clean run's mean metric, 0 at the corrupted run's.

    value: a mean metric (or an array of them, any shape). HeadLabError when the two runs score the
    same: then the pair gives patching nothing to recover.
    """
    gap = float(clean) - float(corrupted)
    if not abs(gap) > GAP_FLOOR:
        raise HeadLabError(
            f"the clean and corrupted runs score the same on this metric ({float(clean):.4g}); patching has "
            "nothing to recover. Use another metric, or a corruption that changes the answer."
        )
    out = (np.asarray(value, dtype=np.float64) - float(corrupted)) / gap
    return float(out) if out.ndim == 0 else out


def better_sign(metric: str) -> float:
    """+1 when a larger metric is better (logit_diff, target logit, top-1, top-5), -1 when smaller is (loss)."""
    return 1.0 if metric == "logit_diff" else -DAMAGE_SIGN[metric]


def gap_stats(clean_values: Sequence[float], corrupted_values: Sequence[float], metric: str) -> dict:
    """The per-example clean-corrupted gap, signed so a clean run that scores better is positive.

    clean_values, corrupted_values: [example] metric values of the two runs, paired per example.
    Returns n_examples, gap_mean, gap_sd (ddof=1; None below two examples), gap_se = sd / sqrt(n)
    (None below two examples), and gap_ratio = gap_mean / gap_se (None where the se is None or 0).
    """
    clean = np.asarray(clean_values, dtype=np.float64).reshape(-1)
    corrupted = np.asarray(corrupted_values, dtype=np.float64).reshape(-1)
    if clean.size == 0 or clean.size != corrupted.size:
        raise HeadLabError("the gap needs the clean and corrupted metric of the same examples, at least one.")
    gap = better_sign(metric) * (clean - corrupted)  # [example]
    n = int(gap.size)
    sd = float(gap.std(ddof=1)) if n >= 2 else None
    se = None if sd is None else sd / np.sqrt(n)
    ratio = None if not se else float(gap.mean()) / se
    return {"n_examples": n, "gap_mean": float(gap.mean()), "gap_sd": sd, "gap_se": se, "gap_ratio": ratio}


def check_gap(gap: dict, metric: str, allow_small_gap: bool = False) -> dict:
    """Refuse a clean-corrupted gap that patching cannot normalize by; return `gap` with a "gap_note".

    Rule (MIN_GAP_SE): reversed (the corrupted run better on average) or a mean gap under 2 standard
    errors of the per-example gaps (or a single example, whose spread is unknown) -> HeadLabError,
    unless allow_small_gap, where the result is kept and flagged. A gap with zero spread (every
    example alike, e.g. top-1 1 -> 0) passes.
    """
    n, mean, se = gap["n_examples"], gap["gap_mean"], gap["gap_se"]
    spread = ("unknown (one example)" if gap["gap_sd"] is None
              else f"per-example sd {gap['gap_sd']:.4g}, se {se:.4g}")
    problem = None
    if mean < 0:
        problem = (f"the corrupted run scores better than the clean run on {metric} (mean gap {mean:+.4g} over "
                   f"{n} example{'s' if n != 1 else ''}; {spread}): the pairs are reversed")
    elif not mean > GAP_FLOOR:  # 0 with 0 spread (identical runs) passes the se rule, and no flag can force it
        raise HeadLabError(f"the clean and corrupted runs score the same on {metric} (mean gap {mean:+.4g} over {n} "
                           f"example{'s' if n != 1 else ''}; {spread}), so there is no gap to recover and every "
                           "score would be 0 / 0; use a corruption that changes the answer, or another metric.")
    elif se is None:
        problem = f"one example cannot show whether the {metric} gap {mean:+.4g} is more than noise"
    elif se > 0 and mean < MIN_GAP_SE * se:
        problem = (f"the mean clean-corrupted gap on {metric}, {mean:+.4g}, is under {MIN_GAP_SE:g} standard errors "
                   f"of the per-example gaps ({spread}, {n} examples)")
    if problem is None:
        return {**gap, "gap_ok": True, "gap_note": ""}
    if not allow_small_gap:
        raise HeadLabError(f"{problem}; scores normalized by it would divide by noise. Use more pairs, another "
                           "metric, or a corruption that changes the answer (or swap clean and corrupted); force it "
                           "with allow_small_gap (--allow-small-gap).")
    return {**gap, "gap_ok": False, "gap_note": f"forced: {problem}; the normalized scores are unreliable."}


def base_score(direction: str) -> float:
    """The score of the unpatched run: 0 when denoising (the corrupted run), 1 when noising (the clean run)."""
    return 0.0 if check_direction(direction) == "denoise" else 1.0


def against_controls(score: float, control_scores: Sequence[float], direction: str) -> dict:
    """A patched group's score against its random controls: z, rank and empirical p, in the direction's sense.

    z = (score - mean(controls)) / std(controls) (population sd, ddof=0, as the reference), so a
    denoised group that restores more than its controls has z > 0 and a noised group that breaks
    more has z < 0; rank 1 = the most effect. The rank and p lead; z_reliable is False below
    MIN_RELIABLE_Z_CONTROLS controls (an sd from so few draws is itself noise).
    """
    rank_p = empirical_rank_p(score, control_scores, EFFECT_SIGN[check_direction(direction)])
    controls = np.asarray(control_scores, dtype=np.float64)
    return {"z": z_score(score, controls), "rank": rank_p.rank, "p": rank_p.p,
            "control_mean": float(controls.mean()), "control_std": float(controls.std(ddof=0)),
            "n_controls": int(controls.size), "z_convention": Z_CONVENTION,
            "z_reliable": bool(controls.size >= MIN_RELIABLE_Z_CONTROLS)}

