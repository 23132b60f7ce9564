"""The arithmetic of patching: the normalized score, and a patched group against its controls.

Every patching result (core/ablation/patching/) reports a run's mean metric on one scale: the clean
run scores 1 and the corrupted run 0. Denoising (clean activations into the corrupted run) finds
what is sufficient: a head matters when its score rises above 0. Noising (corrupted into the
clean run) finds what is necessary: a head matters when its score falls below 1. Pure numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from core.errors import HeadLabError
from core.stats.inference import empirical_rank_p, z_score

DIRECTIONS = ("denoise", "noise")
# +1: a larger score means more effect (denoising restores); -1: a smaller one does (noising breaks).
EFFECT_SIGN = {"denoise": 1.0, "noise": -1.0}
GAP_FLOOR = 1e-12  # a clean-corrupted gap below this has nothing to normalize by


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


def base_score(direction: str) -> float:
    """The score of the unpatched run: 0 when denoising (the corrupted run), 1 when noising (the clean run)."""
    return 0.0 if check_direction(direction) == "denoise" else 1.0


def against_controls(score: float, control_scores: Sequence[float], direction: str) -> dict:
    """A patched group's score against its random controls: z, rank and empirical p, in the direction's sense.

    z = (score - mean(controls)) / std(controls), so a denoised group that restores more than its
    controls has z > 0 and a noised group that breaks more has z < 0; rank 1 = the most effect.
    """
    rank_p = empirical_rank_p(score, control_scores, EFFECT_SIGN[check_direction(direction)])
    controls = np.asarray(control_scores, dtype=np.float64)
    return {"z": z_score(score, controls), "rank": rank_p.rank, "p": rank_p.p,
            "control_mean": float(controls.mean()), "control_std": float(controls.std(ddof=0))}

