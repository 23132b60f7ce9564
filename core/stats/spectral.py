"""Step 1 of the spectral probe-circuit recipe [SPC]: how many directions a head's output uses.

Per head, X = the head output at the query position over the probe examples, [N, d_head].
Two "participation ratio" (PR) definitions exist (METHODS.md, Step 1), and they disagree a lot
when X has a large mean, so every result names the one it used:

- "entropy" (default, the reference code): effective rank exp(H(p)), p_i = s_i^2 / sum_j s_j^2,
  s = singular values of the UNCENTERED X, H the Shannon entropy in nats.
- "classic" (the paper's wording): tr(C)^2 / ||C||_F^2 with C the covariance of the CENTERED X,
  i.e. (sum lambda)^2 / sum lambda^2 over the eigenvalues of C, computed without eigendecomposition.

A matrix that is exactly zero has no spread; both definitions return 0.0 for it (not NaN), so a
dead head simply contributes nothing to the PR-integral.

The PR-integral over training checkpoints, I = integral of max(PR - 1, 0) d ln(tokens), ranks the
heads; the top K are the circuit candidates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from core.choices import PR_DEFINITION as DEFAULT_DEFINITION, PR_RULE as DEFAULT_RULE
from core.errors import HeadLabError
from core.heads import Head
from core.results import JsonResult

PR_INTEGRAL_RULES = ("trapezoid", "paper_sum")
_RULE_ALIASES = {"trapezoid": "trapezoid", "paper_sum": "paper_sum", "right": "paper_sum"}
_CHUNK = 256  # examples per Gram-matrix chunk, so [chunk, layer, head, d_head] float64 stays small


# ---------------------------------------------------------------- single matrix


def _as_matrix(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise HeadLabError(f"expected a non-empty [example, feature] matrix, got shape {tuple(x.shape)}; pass one head's outputs.")
    return x


def _entropy_rank_from_power(power: np.ndarray) -> np.ndarray:
    """exp(Shannon entropy) of the normalised spectrum; power: [..., k] nonnegative (s^2 or eigenvalues)."""
    power = np.clip(power, 0.0, None)
    total = power.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, power / np.where(total > 0, total, 1.0), 0.0)
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    rank = np.exp(-plogp.sum(axis=-1))
    return np.where(total[..., 0] > 0, rank, 0.0)


def _classic_from_covariance(cov: np.ndarray) -> np.ndarray:
    """tr(C)^2 / ||C||_F^2 for C: [..., d, d] symmetric PSD; no eigendecomposition needed."""
    trace = np.trace(cov, axis1=-2, axis2=-1)
    frob2 = (cov * cov).sum(axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(frob2 > 0, trace * trace / np.where(frob2 > 0, frob2, 1.0), 0.0)


def effective_rank(x: Any) -> float:
    """Entropy effective rank of the UNCENTERED matrix x: [N, d] (the reference code's "PR")."""
    s = np.linalg.svd(_as_matrix(x), compute_uv=False)  # s: [min(N, d)]
    return float(_entropy_rank_from_power(s * s))


def participation_ratio(x: Any) -> float:
    """Classic participation ratio of the centered covariance of x: [N, d] (the paper's "PR")."""
    x = _as_matrix(x)
    centered = x - x.mean(axis=0, keepdims=True)
    cov = centered.T @ centered  # [d, d]; the 1/(N-1) factor cancels in the ratio
    return float(_classic_from_covariance(cov))


PR_DEFINITIONS: dict[str, Callable[[Any], float]] = {
    "entropy": effective_rank,
    "classic": participation_ratio,
}


def _check_definition(definition: str) -> str:
    if definition not in PR_DEFINITIONS:
        raise HeadLabError(f'unknown PR definition "{definition}"; use one of {", ".join(PR_DEFINITIONS)}.')
    return definition


# ---------------------------------------------------------------- all heads at once


def _gram_and_sum(z: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Per head: Gram X^T X [layer, head, d, d] and column sums [layer, head, d], in float64.

    z: [example, layer, head, d_head]. Accumulated over example chunks, so memory stays bounded.
    """
    zt = z if isinstance(z, torch.Tensor) else torch.as_tensor(np.asarray(z))
    if zt.ndim != 4 or min(zt.shape) < 1:
        raise HeadLabError(
            f"head outputs must be a non-empty [example, layer, head, d_head] array, got shape {tuple(zt.shape)}; "
            "pass the probe's head outputs at the query position."
        )
    n, n_layers, n_heads, d_head = zt.shape
    gram = torch.zeros(n_layers, n_heads, d_head, d_head, dtype=torch.float64)
    total = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
    for start in range(0, n, _CHUNK):
        chunk = zt[start : start + _CHUNK].detach().to(device="cpu", dtype=torch.float64)  # [c, L, H, d]
        gram += torch.einsum("nlhd,nlhe->lhde", chunk, chunk)
        total += chunk.sum(dim=0)
    return gram.numpy(), total.numpy(), int(n)


def pr_per_head(z: Any, definition: str = DEFAULT_DEFINITION) -> np.ndarray:
    """PR of every head at one checkpoint. z: [example, layer, head, d_head] -> [layer, head].

    Uses the d_head x d_head Gram matrix per head: its eigenvalues are the squared singular
    values of X (entropy rank), and centering it gives the covariance (classic PR).
    """
    _check_definition(definition)
    gram, total, n = _gram_and_sum(z)
    if definition == "entropy":
        gram = 0.5 * (gram + np.swapaxes(gram, -1, -2))
        power = np.linalg.eigvalsh(gram)  # [layer, head, d]: s_i^2
        return _entropy_rank_from_power(power)
    mean = total / n  # [layer, head, d]
    cov = gram - n * mean[..., :, None] * mean[..., None, :]  # [layer, head, d, d], unnormalised
    return _classic_from_covariance(cov)


# ---------------------------------------------------------------- PR-integral


class PRIntegral(NamedTuple):
    """integral: [...] per head; dropped: indices of checkpoints left out (tokens <= 0)."""

    integral: np.ndarray
    dropped: tuple[int, ...]
    rule: str


def _check_rule(rule: str) -> str:
    if rule not in _RULE_ALIASES:
        raise HeadLabError(f'unknown PR-integral rule "{rule}"; use "trapezoid" or "paper_sum".')
    return _RULE_ALIASES[rule]


def pr_integral(pr_traj: Any, tokens: Sequence[float], rule: str = DEFAULT_RULE) -> PRIntegral:
    """I = integral of max(PR - 1, 0) d ln(tokens) over checkpoints; pr_traj: [checkpoint, ...].

    rule="trapezoid" (default): trapezoid rule on ln(tokens); reproduces the reference 1B files.
    rule="paper_sum" (alias "right"): the paper's sum over t >= 1 of
    max(PR_t - 1, 0) * (ln tokens_t - ln tokens_{t-1}). METHODS.md calls it a right-endpoint rule
    (each interval takes the value at its right end); issue 3 calls the same sum the "left-sum
    variant". The first kept checkpoint only serves as the left end of the first interval.

    Checkpoints with tokens <= 0 have no logarithm: they are dropped and their indices returned,
    so the caller can say so. Token units cancel (billions or raw counts give the same I).
    """
    rule = _check_rule(rule)
    pr = np.asarray(pr_traj, dtype=np.float64)
    tok = np.asarray(tokens, dtype=np.float64)
    if pr.ndim < 1 or tok.ndim != 1 or pr.shape[0] != tok.shape[0]:
        raise HeadLabError(
            f"PR trajectory has {pr.shape[0] if pr.ndim else 0} checkpoints but {tok.size} token counts; "
            "pass one token count per checkpoint."
        )
    keep = tok > 0
    dropped = tuple(int(i) for i in np.flatnonzero(~keep))
    pr, tok = pr[keep], tok[keep]
    if tok.size < 2:
        raise HeadLabError(
            "the PR-integral needs at least two checkpoints with a positive token count; probe more checkpoints."
        )
    log_tok = np.log(tok)  # [checkpoint]
    steps = np.diff(log_tok)
    if np.any(steps <= 0):
        raise HeadLabError("checkpoint token counts must increase strictly; sort the checkpoints by training tokens.")
    excess = np.maximum(pr - 1.0, 0.0)  # [checkpoint, ...]
    shape = (-1,) + (1,) * (pr.ndim - 1)
    if rule == "trapezoid":
        integral = (0.5 * (excess[1:] + excess[:-1]) * steps.reshape(shape)).sum(axis=0)
    else:
        integral = (excess[1:] * steps.reshape(shape)).sum(axis=0)
    return PRIntegral(integral=integral, dropped=dropped, rule=rule)


# ---------------------------------------------------------------- ranking


def resolve_k(k: int | float, n_total: int) -> int:
    """K as a count (int >= 1) or a fraction in (0, 1) of all heads: round(frac * n_total).

    Python's round is used, as the reference's "K = round(0.18 x n_heads)": 0.18 x 256 = 46.08 -> 46
    (the reference's K_18pct_band / conserved_fraction_18pct). The published OLMo-1B top-K list
    uses the count 45 (the script's --top-k 45), so reproducing it needs k=45, not 0.18.
    """
    if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)):
        raise HeadLabError(f"K must be a head count or a fraction in (0, 1), got {k!r}.")
    if isinstance(k, (float, np.floating)) and not float(k).is_integer():
        if not 0.0 < float(k) < 1.0:
            raise HeadLabError(f"K as a fraction must lie in (0, 1), got {k}; or give a head count.")
        count = max(1, int(round(float(k) * n_total)))
    else:
        count = int(k)
    if not 1 <= count <= n_total:
        raise HeadLabError(f"K must be between 1 and {n_total} heads, got {count}.")
    return count


def rank_heads(scores: Any) -> list[Head]:
    """Every head, by score descending; ties by (layer, head) ascending; NaN scores last."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise HeadLabError(f"scores must be a [layer, head] array, got shape {s.shape}.")
    n_layers, n_heads = s.shape
    flat = s.ravel()
    key = np.where(np.isnan(flat), np.inf, -flat)
    order = np.lexsort((np.arange(flat.size), key))  # last key is primary; flat index = (layer, head) order
    return [(int(f // n_heads), int(f % n_heads)) for f in order]


def top_k(scores: Any, k: int | float) -> list[Head]:
    """The K best heads by score (descending, ties by (layer, head)). k: a count or a fraction."""
    ranking = rank_heads(scores)
    return ranking[: resolve_k(k, len(ranking))]


# ---------------------------------------------------------------- result


@dataclass(frozen=True, eq=False)
class SpectralResult(JsonResult):
    """Step 1 over all checkpoints, with the variant names every caption and export must carry.

    pr:        [checkpoint, layer, head] (all checkpoints, the dropped ones included)
    tokens:    [checkpoint] training tokens per checkpoint
    integral:  [layer, head] PR-integral over the kept checkpoints
    ranking:   every head by integral, best first
    k:         the top-K count used for the candidates
    definition: "entropy" | "classic"; rule: "trapezoid" | "paper_sum"
    dropped:   indices of checkpoints left out of the integral (tokens <= 0)
    revisions: checkpoint names, same order as tokens
    """

    pr: np.ndarray
    tokens: tuple[float, ...]
    integral: np.ndarray
    ranking: tuple[Head, ...]
    k: int
    definition: str = DEFAULT_DEFINITION
    rule: str = DEFAULT_RULE
    dropped: tuple[int, ...] = ()
    revisions: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def build(
        cls,
        pr: Any,
        tokens: Sequence[float],
        k: int | float = 0.18,
        definition: str = DEFAULT_DEFINITION,
        rule: str = DEFAULT_RULE,
        revisions: Sequence[str] = (),
    ) -> "SpectralResult":
        """From a PR trajectory pr: [checkpoint, layer, head] and its token counts."""
        _check_definition(definition)
        pr = np.asarray(pr, dtype=np.float64)
        if pr.ndim != 3:
            raise HeadLabError(f"PR trajectory must be [checkpoint, layer, head], got shape {pr.shape}.")
        res = pr_integral(pr, tokens, rule)
        ranking = tuple(rank_heads(res.integral))
        return cls(
            pr=pr,
            tokens=tuple(float(t) for t in tokens),
            integral=res.integral,
            ranking=ranking,
            k=resolve_k(k, len(ranking)),
            definition=definition,
            rule=res.rule,
            dropped=res.dropped,
            revisions=tuple(str(r) for r in revisions),
        )

    @property
    def top_heads(self) -> tuple[Head, ...]:
        """The top-K heads in rank order."""
        return self.ranking[: self.k]

    @classmethod
    def from_json(cls, data: dict | str) -> "SpectralResult":
        """From to_json's dict or its JSON text."""
        return super().from_json(json.loads(data) if isinstance(data, str) else data)


__all__ = [
    "DEFAULT_DEFINITION",
    "DEFAULT_RULE",
    "PRIntegral",
    "PR_DEFINITIONS",
    "PR_INTEGRAL_RULES",
    "SpectralResult",
    "effective_rank",
    "participation_ratio",
    "pr_integral",
    "pr_per_head",
    "rank_heads",
    "resolve_k",
    "top_k",
]
