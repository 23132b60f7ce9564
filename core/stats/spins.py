"""Co-activation spins [CVC], step 1: the per-head signal and its +-1 spins (METHODS.md, "Co-activation").

signal per (example, head) = max attention over keys at the query position; each head is binarized
at its own median (strictly greater -> +1, else -1). A head whose spin never changes has no
coupling to fit; it is named in the error, or dropped when the caller allows it.

Heads are flat indices f = layer * n_head + head in every array here and in core.stats.ising,
core.stats.clusters and core.stats.routes.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch

from core.errors import HeadLabError
from core.heads import head_name


def as_array(x: Any, dtype=np.float64) -> np.ndarray:
    """A numpy copy of an array or tensor (detached, on the CPU) in `dtype`."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _head_label(f: int, n_head: int | None) -> str:
    if n_head:
        return head_name(divmod(int(f), int(n_head)))
    return f"head {int(f)}"


def _heads_text(flat: Iterable[int], n_head: int | None, limit: int = 12) -> str:
    flat = [int(f) for f in flat]
    names = [_head_label(f, n_head) for f in flat[:limit]]
    more = f" and {len(flat) - limit} more" if len(flat) > limit else ""
    return ", ".join(names) + more


def check_spins(spins: Any, *, allow_constant: bool = False, allow_few_samples: bool = False,
                n_head: int | None = None) -> np.ndarray:
    """Validate a [example, head] matrix of +-1 spins; returns it as float64."""
    s = as_array(spins)
    if s.ndim != 2 or s.shape[0] < 2 or s.shape[1] < 2:
        raise HeadLabError(f"spins must be an [example, head] matrix with at least 2 of each, got shape {tuple(s.shape)}; "
                           "pass the binarized signal of all heads.")
    if not np.all((s == 1.0) | (s == -1.0)):
        raise HeadLabError("spins must be +1 or -1 only; binarize the signal with binarize_at_median first.")
    m, n = s.shape
    if m < n and not allow_few_samples:
        raise HeadLabError(f"{m} examples for {n} heads: the pseudolikelihood fit needs at least as many examples as heads; "
                           "use a larger probe batch (more examples).")
    if not allow_constant:
        const = constant_heads(s)
        if len(const):
            raise HeadLabError(f"{len(const)} head(s) never change sign ({_heads_text(const, n_head)}), so their coupling is "
                               "undefined; drop them (drop_constant_heads / --drop-constant) or use more varied examples.")
    return s


def constant_heads(spins: Any) -> np.ndarray:
    """Flat indices of heads whose spin is the same in every example (their regression has one class)."""
    s = as_array(spins)
    return np.flatnonzero(np.all(s == s[:1], axis=0))


def max_attention_signal(attn_max: Any) -> np.ndarray:
    """Flatten per-(example, layer, head) max attention at the query position to [example, layer * n_head + head]."""
    a = as_array(attn_max)
    if a.ndim != 3 or min(a.shape) < 1:
        raise HeadLabError(f"expected max attention as [example, layer, head], got shape {tuple(a.shape)}; "
                           "pass the cached per-head maximum attention at the query position.")
    if not np.all(np.isfinite(a)):
        raise HeadLabError("the max-attention signal has NaN or infinite values; recompute the probe cache.")
    e, n_layer, n_head = a.shape
    return a.reshape(e, n_layer * n_head)  # signal: [example, layer * n_head + head]


def binarize_at_median(signal: Any, *, n_head: int | None = None, allow_constant: bool = False,
                       allow_few_samples: bool = False) -> np.ndarray:
    """Spins [example, head] in {-1, +1}: +1 where the head's signal is strictly above its own median.

    A head whose spin never changes (constant signal, or more than half the examples tied at the
    maximum) raises HeadLabError naming it, unless allow_constant; then drop it with drop_constant_heads.
    """
    x = as_array(signal)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise HeadLabError(f"expected a signal [example, head] with at least 2 of each, got shape {tuple(x.shape)}.")
    if not np.all(np.isfinite(x)):
        raise HeadLabError("the signal has NaN or infinite values; recompute the probe cache.")
    median = np.median(x, axis=0)                              # [head]
    spins = np.where(x > median[None, :], 1, -1).astype(np.int8)  # [example, head]
    check_spins(spins, allow_constant=allow_constant, allow_few_samples=allow_few_samples, n_head=n_head)
    return spins


def drop_constant_heads(spins: Any) -> tuple[np.ndarray, np.ndarray]:
    """(spins of the varying heads [example, kept], their flat indices [kept])."""
    s = np.asarray(spins)
    keep = np.setdiff1d(np.arange(s.shape[1]), constant_heads(s))
    return s[:, keep], keep
