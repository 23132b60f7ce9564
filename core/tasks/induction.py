"""The synthetic induction probe batch of [SPC, CVC] (METHODS.md, "The synthetic induction probe batch").

Each sequence is uniform random tokens with one planted pair: A at p, B at p+1, and A again at the
last position q = T-1. A and B occur nowhere else, so the only way to predict B after the final A
is to look back at the earlier A and copy the token after it (induction).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any, ClassVar, Optional

import numpy as np
import torch

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.probe_batch import ProbeBatch, check_seed
from core.tasks.tokens import VOCAB_RULE, TokenRuns, check_runs, describe_runs, is_byte_tokenizer, ordinary_vocab, runs_ids

MIN_SEQ_LEN = 8
REFERENCE_P_LOW = 20  # reference: p uniform in [20, T/2)


@dataclass(frozen=True)
class InductionProbeSpec(JsonResult):
    """Parameters of one synthetic induction probe batch; tokens are uniform in [token_low, token_high).

    vocab: for a model with its own tokenizer, the ordinary token ids as runs [low, high)
    (core/tasks/tokens.py): tokens are then uniform over those ids (token_low, token_high are the
    runs' bounds), and `tokenizer` is the tokenizer's fingerprint. Both are None for a plain range
    and then absent from to_json(), so the byte-level zoo's specs and cache keys are unchanged.
    A ProbeSpec (core.tasks.specs): to_json() is its fields plus "task"; from_json ignores extra keys.
    """

    task: ClassVar[str] = "induction"
    n_examples: int
    seq_len: int
    token_low: int
    token_high: int
    seed: int
    vocab: Optional[TokenRuns] = None
    tokenizer: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("n_examples", "seq_len", "token_low", "token_high", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"Induction probe {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        check_token_source(self)
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
        return token_source_json(self, {"task": self.task, **super().to_json()})

    def build(self) -> ProbeBatch:
        """Build the A B ... A batch: q = T-1, target B, induction key p+1, duplicate key p.

        Random draws, all from numpy RandomState(seed), in this order: the [N, T] filler tokens;
        then per example A, B (distinct), p, and the replacements for stray copies of A or B
        (uniform over the range without A and B).
        """
        ids = None if self.vocab is None else runs_ids(self.vocab)  # drawn by index, then mapped to the ids
        n, seq_len = self.n_examples, self.seq_len
        low, high = (self.token_low, self.token_high) if ids is None else (0, len(ids))
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
        if ids is not None:
            tokens, target = ids[tokens], ids[target]
        dup = torch.from_numpy(first_pos)
        return ProbeBatch(
            tokens=torch.from_numpy(tokens),
            query_pos=torch.full((n,), q, dtype=torch.long),
            target=torch.from_numpy(target),
            induction_pos=dup + 1,
            duplicate_pos=dup,
            spec={**self.to_json(), "p_low": p_low, "p_high": p_high, "rng": "numpy.RandomState"},
        )


def check_token_source(spec: Any) -> None:
    """A spec's vocab runs (read back from JSON as lists) as a tuple, its token range their bounds, or HeadLabError."""
    if spec.vocab is None:
        return
    runs = check_runs(spec.vocab, f"the {spec.task} probe")
    if not runs:
        raise HeadLabError(f"the {spec.task} probe's token runs are empty; build it with probe_spec(...).")
    object.__setattr__(spec, "vocab", runs)
    if sum(high - low for low, high in runs) < 3:
        raise HeadLabError(f"the {spec.task} probe's token runs hold fewer than 3 ids (A, B and a filler); widen them.")
    if (spec.token_low, spec.token_high) != (runs[0][0], runs[-1][1]):
        raise HeadLabError(f"the {spec.task} probe's token range [{spec.token_low}, {spec.token_high}) is not the bounds of "
                           "its token runs; build it with probe_spec(...).")


def token_source_json(spec: Any, record: dict) -> dict:
    """to_json() of a random-token spec: vocab and tokenizer left out when there are none (byte zoo keys unchanged)."""
    if spec.vocab is None:
        record.pop("vocab", None)
        record.pop("tokenizer", None)
    else:
        record["vocab_rule"] = VOCAB_RULE
    return record


def token_source(tokenizer: Any, token_low: Optional[int], token_high: Optional[int]) -> dict:
    """The token fields of a random-token spec for a model's tokenizer: the range given, else the zoo's bytes
    [0, 256) on a byte tokenizer (or none), else the tokenizer's ordinary tokens (runs and fingerprint)."""
    if token_low is not None or token_high is not None or is_byte_tokenizer(tokenizer):
        return {"token_low": 0 if token_low is None else int(token_low),
                "token_high": 256 if token_high is None else int(token_high)}
    runs, fingerprint = ordinary_vocab(tokenizer)
    if runs == ((0, 256),):  # a byte-level vocabulary saved as tokenizer.json: the zoo's own spec and cache key
        return {"token_low": 0, "token_high": 256}
    return {"token_low": runs[0][0], "token_high": runs[-1][1], "vocab": runs, "tokenizer": fingerprint}


def describe_token_source(spec: Any) -> str:
    """One line naming what a random-token spec draws (printed by the commands)."""
    if spec.vocab is None:
        return f"{spec.task} probe tokens: ids in [{spec.token_low}, {spec.token_high})"
    return f"{spec.task} probe tokens: the tokenizer's ({spec.tokenizer}) {VOCAB_RULE}: {describe_runs(spec.vocab)}"


def default_zoo_probe_spec() -> InductionProbeSpec:
    """HeadLab's default for the byte-level zoo models: 256 sequences of 64 byte tokens, seed 42."""
    return InductionProbeSpec(n_examples=256, seq_len=64, token_low=0, token_high=256, seed=42)


def reference_probe_spec(seed: int = 42) -> InductionProbeSpec:
    """The reference batch for large pretrained models: N=2000, T=256, tokens in [100, 10000).

    The pattern-screen scripts seed 42; the closure scripts seed 0.
    """
    return InductionProbeSpec(n_examples=2000, seq_len=256, token_low=100, token_high=10000, seed=seed)
