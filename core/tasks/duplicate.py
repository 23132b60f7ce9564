"""The duplicate-marking task: a byte stream where every token that already occurred in its
sequence is followed by SEP.

Whether SEP comes next depends only on whether the current token occurred earlier, which is what a
duplicate-token head reads (it attends from the current token to its earlier copy). The zoo's
`duplicate-neox` model is trained on this so that the screen has a model with known
duplicate-token heads: the induction models grow none, and METHODS.md's cross-check against the
TransformerLens head detector needs some.

Every batch is a pure function of (seed, step), like the induction stream.
"""

from __future__ import annotations

from typing import Callable

import torch

from core.tasks.mixture import batch_generator
from core.tasks.vocab import BOS, N_BYTES, SEP

ALPHABET_MIN, ALPHABET_MAX = 12, 40  # bytes drawn per row: a small alphabet makes repeats common


def duplicate_row(gen: torch.Generator, seq_len: int) -> torch.Tensor:
    """BOS, then bytes of a random per-row alphabet; a byte seen before in the row is followed by SEP.

    Returns LongTensor [seq_len] (the stream is cut at seq_len, so a last repeat may lack its SEP).
    """
    size = int(torch.randint(ALPHABET_MIN, ALPHABET_MAX + 1, (), generator=gen))
    alphabet = torch.randperm(N_BYTES, generator=gen)[:size]
    draws = alphabet[torch.randint(0, size, (seq_len,), generator=gen)].tolist()  # enough: each draw adds >= 1 token
    row, seen = [BOS], set()
    for byte in draws:
        row.append(byte)
        if byte in seen:
            row.append(SEP)
        seen.add(byte)
        if len(row) >= seq_len:
            break
    return torch.tensor(row[:seq_len])


def training_batch(step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """One batch of duplicate-marking rows: LongTensor [batch, seq_len], deterministic in (seed, step)."""
    gen = batch_generator(seed, step, salt=2)
    return torch.stack([duplicate_row(gen, seq_len) for _ in range(batch_size)])


@torch.no_grad()
def marker_accuracy(logits_fn: Callable[[torch.Tensor], torch.Tensor], n_examples: int, seq_len: int, seed: int) -> float:
    """Share of byte positions where the greedy "is SEP next?" decision is right, on fresh rows.

    Counted at every byte token that has a next token: SEP must be predicted exactly after repeats.
    A model that never predicts SEP scores the share of first occurrences (about 0.5 at these sizes).
    """
    tokens = training_batch(step=0, batch_size=n_examples, seq_len=seq_len, seed=10_000 + seed)  # [example, seq]
    predicted_sep = logits_fn(tokens)[:, :-1].argmax(dim=-1) == SEP  # [example, seq-1]
    next_is_sep = tokens[:, 1:] == SEP
    is_byte = tokens[:, :-1] < N_BYTES
    return float((predicted_sep == next_is_sep)[is_byte].double().mean())
