"""ProbeBatch: a batch of sequences with one query position each and its pattern target positions.

Every head statistic (spectral signal, pattern selectivity, ablation metric) reads the same
object, so the positions that define "induction", "previous-token", ... are fixed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

import torch

from core.choices import MAX_SEED, check_seed
from core.errors import HeadLabError

# Canonical attention targets at the query position q (METHODS.md, "The synthetic induction probe batch").
PATTERNS = ("induction", "duplicate-token", "previous-token", "self", "first-token", "local")
SINGLE_POSITION_PATTERNS = PATTERNS[:-1]
LOCAL_OFFSETS = (5, 4, 3, 2)  # local = mean over q-5 .. q-2
MIN_QUERY_POS = 5  # so that every pattern, local included, has a key position >= 0
@dataclass(frozen=True, eq=False)
class ProbeBatch:
    """Sequences plus, per example, the query position, the target token and the induction keys.

    tokens:        [example, pos] long
    query_pos:     [example] long, q (the position whose next-token prediction is probed)
    target:        [example] long, the token to predict after q
    induction_pos: [example] long, p+1 (the token after the earlier occurrence of tokens[q])
    duplicate_pos: [example] long, p (the earlier occurrence of tokens[q])
    spec:          provenance (task, n, T, seed, token range, ...), JSON-serialisable
    attention_mask: [example, pos] long, 1 at real tokens and 0 at padding (a probe file's prompts of
                   different lengths); None when nothing is padded
    """

    tokens: torch.Tensor
    query_pos: torch.Tensor
    target: torch.Tensor
    induction_pos: torch.Tensor
    duplicate_pos: torch.Tensor
    spec: dict = field(default_factory=dict)
    attention_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        names = ("tokens", "query_pos", "target", "induction_pos", "duplicate_pos")
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.dtype != torch.long:
                raise HeadLabError(
                    f"ProbeBatch.{name} must be a torch.long tensor; build batches with core.tasks."
                )
        if self.tokens.ndim != 2 or self.tokens.shape[0] < 1 or self.tokens.shape[1] < 1:
            raise HeadLabError(
                "ProbeBatch.tokens must be a non-empty [example, pos] tensor; build batches with core.tasks."
            )
        n, seq_len = self.tokens.shape
        for name in names[1:]:
            if tuple(getattr(self, name).shape) != (n,):
                raise HeadLabError(
                    f"ProbeBatch.{name} must have shape [{n}] to match tokens; build batches with core.tasks."
                )
        if not isinstance(self.spec, dict):
            raise HeadLabError("ProbeBatch.spec must be a dict describing how the batch was made.")
        q, p, p1 = self.query_pos, self.duplicate_pos, self.induction_pos
        if bool((q < MIN_QUERY_POS).any()) or bool((q >= seq_len).any()):
            raise HeadLabError(
                f"ProbeBatch.query_pos must lie in [{MIN_QUERY_POS}, {seq_len - 1}]; use a longer sequence length."
            )
        if bool((p < 0).any()) or bool((p1 != p + 1).any()) or bool((p1 >= q).any()):
            raise HeadLabError(
                "ProbeBatch positions must satisfy 0 <= duplicate_pos, induction_pos = duplicate_pos + 1 < query_pos; "
                "build batches with core.tasks."
            )
        mask = self.attention_mask
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.long or tuple(mask.shape) != (n, seq_len):
                raise HeadLabError(f"ProbeBatch.attention_mask must be a torch.long tensor of shape [{n}, {seq_len}], or None.")
            if bool(((mask != 0) & (mask != 1)).any()):
                raise HeadLabError("ProbeBatch.attention_mask holds values other than 0 and 1 (1 real token, 0 padding).")
            if not bool(mask.gather(1, q[:, None].to(mask.device)).all()):
                raise HeadLabError("a ProbeBatch query position falls on padding; the query must be a real token.")

    @property
    def n_examples(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a batch whose token ids (inputs or targets) a model with `vocab_size` tokens cannot read."""
        top = max(int(self.tokens.max()), int(self.target.max()))
        if top >= int(vocab_size) or int(self.tokens.min()) < 0:
            raise HeadLabError(
                f"The probe uses token ids up to {top}, a task the model's vocabulary ({vocab_size} tokens) "
                "cannot hold; choose a task or token range inside the vocabulary."
            )

    def pattern_positions(self, name: str) -> torch.Tensor:
        """Key position of a single-position pattern at each query: [example] long."""
        if name == "induction":
            return self.induction_pos
        if name == "duplicate-token":
            return self.duplicate_pos
        if name == "previous-token":
            return self.query_pos - 1
        if name == "self":
            return self.query_pos
        if name == "first-token":
            return torch.zeros_like(self.query_pos)
        if name == "local":
            raise HeadLabError('"local" covers four key positions; use ProbeBatch.local_positions() for it.')
        raise HeadLabError(f"Unknown pattern {name!r}; use one of {', '.join(PATTERNS)}.")

    def local_positions(self) -> torch.Tensor:
        """The four "local" key positions q-5 .. q-2 (the pattern averages over them): [example, 4] long."""
        offsets = torch.tensor(LOCAL_OFFSETS, dtype=torch.long, device=self.query_pos.device)
        return self.query_pos[:, None] - offsets[None, :]

    def to(self, device: str | torch.device) -> "ProbeBatch":
        """The same batch with every tensor on `device`."""
        return replace(
            self,
            tokens=self.tokens.to(device),
            query_pos=self.query_pos.to(device),
            target=self.target.to(device),
            induction_pos=self.induction_pos.to(device),
            duplicate_pos=self.duplicate_pos.to(device),
            attention_mask=None if self.attention_mask is None else self.attention_mask.to(device),
        )

    def select(self, index: slice | torch.Tensor) -> "ProbeBatch":
        """A sub-batch of the examples picked by `index` (a slice or a long/bool tensor); spec is kept."""
        return replace(
            self,
            tokens=self.tokens[index],
            query_pos=self.query_pos[index],
            target=self.target[index],
            induction_pos=self.induction_pos[index],
            duplicate_pos=self.duplicate_pos[index],
            spec=dict(self.spec),
            attention_mask=None if self.attention_mask is None else self.attention_mask[index],
        )

    def chunks(self, size: int) -> Iterator["ProbeBatch"]:
        """Consecutive sub-batches of at most `size` examples, in order (for memory-bounded passes)."""
        if int(size) < 1:
            raise HeadLabError("Chunk size must be at least 1; pass a positive batch size.")
        for start in range(0, self.n_examples, int(size)):
            yield self.select(slice(start, start + int(size)))
