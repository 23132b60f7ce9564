"""The synthetic induction probe batch of [SPC, CVC] (METHODS.md, "The synthetic induction probe batch").

Each sequence is uniform random tokens with one planted pair: A at p, B at p+1, and A again at the
last position q = T-1. A and B occur nowhere else, so the only way to predict B after the final A
is to look back at the earlier A and copy the token after it (induction).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import ClassVar

import numpy as np
import torch

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.probe_batch import ProbeBatch, check_seed

MIN_SEQ_LEN = 8
REFERENCE_P_LOW = 20  # reference: p uniform in [20, T/2)


@dataclass(frozen=True)
class InductionProbeSpec(JsonResult):
    """Parameters of one synthetic induction probe batch; tokens are uniform in [token_low, token_high).

    A ProbeSpec (core.tasks.specs): to_json() is its fields plus "task"; from_json ignores extra keys.
    """

    task: ClassVar[str] = "induction"
    n_examples: int
    seq_len: int
    token_low: int
    token_high: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("n_examples", "seq_len", "token_low", "token_high", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"Induction probe {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        if self.n_examples < 1:
            raise HeadLabError("Induction probe n_examples must be at least 1.")
        if self.seq_len < MIN_SEQ_LEN:
            raise HeadLabError(f"Induction probe seq_len must be at least {MIN_SEQ_LEN}; use a longer sequence.")
        if self.token_low < 0:
            raise HeadLabError("Induction probe token_low must be >= 0.")
        if self.token_high - self.token_low < 3:
            raise HeadLabError(
                "Induction probe token range [token_low, token_high) must hold at least 3 tokens "
                "(A, B and at least one filler); widen it."
            )
        check_seed(self.seed, "Induction probe seed")

    @property
    def p_range(self) -> tuple[int, int]:
        """Half-open range [low, high) that the first-occurrence position p is drawn from.

        Reference: [20, T//2). When T//2 <= 21 that range is empty or a single position, so short
        sequences scale the start down to T//4: [T//4, T//2). Either way p+1 < q-1 (p+1 <= T//2),
        and for T >= 13 the induction key p+1 also lies before the local window q-5..q-2.
        """
        half = self.seq_len // 2
        low = REFERENCE_P_LOW if half > REFERENCE_P_LOW + 1 else self.seq_len // 4
        return low, half

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a probe whose tokens a model with `vocab_size` tokens cannot embed."""
        if self.token_high > int(vocab_size):
            raise HeadLabError(
                f"This induction probe draws tokens up to {self.token_high - 1}, a task the model's vocabulary "
                f"({vocab_size} tokens) cannot hold; set token_high <= {vocab_size}."
            )

    def to_json(self) -> dict:
        return {"task": self.task, **super().to_json()}

    def build(self) -> ProbeBatch:
        """Build the A B ... A batch: q = T-1, target B, induction key p+1, duplicate key p.

        Random draws, all from numpy RandomState(seed), in this order: the [N, T] filler tokens;
        then per example A, B (distinct), p, and the replacements for stray copies of A or B
        (uniform over the range without A and B).
        """
        n, seq_len, low, high = self.n_examples, self.seq_len, self.token_low, self.token_high
        p_low, p_high = self.p_range
        rng = np.random.RandomState(self.seed)
        tokens = rng.randint(low, high, size=(n, seq_len)).astype(np.int64)  # [example, pos]
        first_pos = np.empty(n, dtype=np.int64)  # p per example
        target = np.empty(n, dtype=np.int64)  # B per example
        q = seq_len - 1
        for i in range(n):
            a = int(rng.randint(low, high))
            b = int(rng.randint(low, high - 1))
            b += b >= a  # uniform over the range without A
            p = int(rng.randint(p_low, p_high))
            row = tokens[i]
            stray = (row == a) | (row == b)
            stray[[p, p + 1, q]] = False
            n_stray = int(stray.sum())
            if n_stray:
                fresh = rng.randint(low, high - 2, size=n_stray)
                lo_ab, hi_ab = min(a, b), max(a, b)
                fresh += fresh >= lo_ab  # skip the smaller of A, B ...
                fresh += fresh >= hi_ab  # ... then the larger: uniform over the range without both
                row[stray] = fresh
            row[p], row[p + 1], row[q] = a, b, a
            first_pos[i] = p
            target[i] = b
        dup = torch.from_numpy(first_pos)
        return ProbeBatch(
            tokens=torch.from_numpy(tokens),
            query_pos=torch.full((n,), q, dtype=torch.long),
            target=torch.from_numpy(target),
            induction_pos=dup + 1,
            duplicate_pos=dup,
            spec={**self.to_json(), "p_low": p_low, "p_high": p_high, "rng": "numpy.RandomState"},
        )


def default_zoo_probe_spec() -> InductionProbeSpec:
    """HeadLab's default for the byte-level zoo models: 256 sequences of 64 byte tokens, seed 42."""
    return InductionProbeSpec(n_examples=256, seq_len=64, token_low=0, token_high=256, seed=42)


def reference_probe_spec(seed: int = 42) -> InductionProbeSpec:
    """The reference batch for large pretrained models: N=2000, T=256, tokens in [100, 10000).

    The pattern-screen scripts seed 42; the closure scripts seed 0.
    """
    return InductionProbeSpec(n_examples=2000, seq_len=256, token_low=100, token_high=10000, seed=seed)
