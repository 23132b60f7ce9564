"""The field's repeated-sequence induction probe: a random token sequence followed by its exact repeat.

Olsson et al. (2022) and TransformerLens score induction on [prefix] R R, R a sequence of L random
tokens: on the second copy every token has occurred once before, so an induction head at position
i attends to i - L + 1 (the token after the earlier occurrence) and the model predicts the next
token of the copy, whose loss falls far below the first copy's.

Layout of one sequence of T tokens (positions 0 .. T-1):
    prefix (the tokenizer's own special prefix, e.g. Gemma's <bos>; none on byte models)
    one filler token when T - len(prefix) is odd (drawn with R, never repeated)
    R = r_0 .. r_{L-1}   first copy, starting at s1; L = (T - len(prefix) - filler) // 2
    R again              second copy, starting at s2 = s1 + L, ending at T - 1
The L + filler tokens are distinct (drawn without replacement), so each token of the second copy
has exactly one earlier occurrence.

HeadLab's instrumented pass, ablation engine and patching score one query position per example
(the query row is all the pass keeps, and the last block's MLP runs at the query rows only). The
simplest correct choice: each sequence gets one query q, uniform over the second copy's positions
that have a next token in the copy, [s2, T-2]; target = tokens[q + 1], induction key q - L + 1,
duplicate key q - L. A mean over examples is then an unbiased estimate of the TransformerLens
score averaged over the repeat half (attention from each position to i - L + 1; loss and top-1 of
the next token), and the per-position curve is the examples grouped by q - s2 (HeadStats keeps
query_pos). docs/methods.md says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import ClassVar, Optional

import numpy as np
import torch

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.induction import check_token_source, token_source_json
from core.tasks.probe_batch import MIN_QUERY_POS, ProbeBatch, check_seed
from core.tasks.tokens import TokenRuns, runs_ids

MIN_REPEAT_LEN = 4  # tokens in each copy


@dataclass(frozen=True)
class RepeatInductionSpec(JsonResult):
    """N sequences [prefix] (filler) R R of T tokens, R uniform without replacement over the token source.

    Token source as InductionProbeSpec: [token_low, token_high), or the runs `vocab` of a tokenizer's ordinary
    tokens with its fingerprint `tokenizer`. prefix: the tokenizer's special prefix ids (() on byte models).
    """

    task: ClassVar[str] = "induction-repeat"
    n_examples: int
    seq_len: int
    token_low: int
    token_high: int
    seed: int
    vocab: Optional[TokenRuns] = None
    tokenizer: Optional[str] = None
    prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n_examples", "seq_len", "token_low", "token_high", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"induction-repeat probe {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        check_token_source(self)
        object.__setattr__(self, "prefix", tuple(int(i) for i in self.prefix))
        check_seed(self.seed, "induction-repeat probe seed")
        if self.n_examples < 1:
            raise HeadLabError("induction-repeat probe n_examples must be at least 1.")
        if self.token_low < 0 or any(i < 0 for i in self.prefix):
            raise HeadLabError("induction-repeat probe token ids must be >= 0.")
        s1, length = self.layout()
        if length < MIN_REPEAT_LEN or s1 + length < MIN_QUERY_POS:
            need = len(self.prefix) + 2 * max(MIN_REPEAT_LEN, MIN_QUERY_POS)
            raise HeadLabError(f"induction-repeat probe seq_len {self.seq_len} leaves copies of {length} tokens; use a "
                               f"seq_len of at least {need}.")
        if self.n_ids() < length + (s1 - len(self.prefix)):
            raise HeadLabError(f"the induction-repeat probe draws {length} distinct tokens per copy but its token source "
                               f"holds {self.n_ids()}; widen the token range or shorten seq_len.")

    def n_ids(self) -> int:
        return self.token_high - self.token_low if self.vocab is None else sum(h - l for l, h in self.vocab)

    def layout(self) -> tuple[int, int]:
        """(s1, L): where the first copy starts and each copy's length."""
        body = self.seq_len - len(self.prefix)
        filler = body % 2
        return len(self.prefix) + filler, (body - filler) // 2

    def check_vocab(self, vocab_size: int) -> None:
        top = max([self.token_high - 1, *self.prefix])
        if top >= int(vocab_size):
            raise HeadLabError(f"This induction-repeat probe uses token ids up to {top}, which the model's vocabulary "
                               f"({vocab_size} tokens) cannot hold; set token_high <= {vocab_size}.")

    def to_json(self) -> dict:
        record = token_source_json(self, {"task": self.task, **super().to_json()})
        if not self.prefix:
            record.pop("prefix", None)
        return record

    def build(self) -> ProbeBatch:
        """The [prefix] (filler) R R batch with one query per sequence in the second copy.

        Random draws, all from numpy RandomState(seed), per example in order: the L + filler distinct token
        indices (filler first), then the query q uniform in [s2, T-2].
        """
        ids = np.arange(self.token_low, self.token_high) if self.vocab is None else runs_ids(self.vocab)
        n, seq_len = self.n_examples, self.seq_len
        s1, length = self.layout()
        n_filler = s1 - len(self.prefix)
        s2 = s1 + length
        rng = np.random.RandomState(self.seed)
        tokens = np.empty((n, seq_len), dtype=np.int64)  # [example, pos]
        query = np.empty(n, dtype=np.int64)
        tokens[:, : len(self.prefix)] = self.prefix
        for i in range(n):
            drawn = ids[rng.choice(len(ids), size=length + n_filler, replace=False)]
            tokens[i, len(self.prefix) : s1] = drawn[:n_filler]
            tokens[i, s1:s2] = drawn[n_filler:]
            tokens[i, s2:] = drawn[n_filler:]
            query[i] = rng.randint(s2, seq_len - 1)
        q = torch.from_numpy(query)
        tokens_t = torch.from_numpy(tokens)
        return ProbeBatch(
            tokens=tokens_t,
            query_pos=q,
            target=tokens_t[torch.arange(n), q + 1].clone(),
            induction_pos=q - length + 1,
            duplicate_pos=q - length,
            spec={**self.to_json(), "copy_start": s1, "repeat_start": s2, "copy_len": length,
                  "queries": "one per sequence, uniform over [repeat_start, T-2]", "rng": "numpy.RandomState"},
        )
