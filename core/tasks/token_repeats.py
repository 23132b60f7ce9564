"""The induction training stream for a model with a real-size vocabulary (the Pythia-shaped zoo model).

The reference probe (METHODS.md) draws tokens uniformly from [100, 10000) and asks a model to copy
the token after an earlier A from 128 to 235 positions back at T = 256. A model trained on bytes
never sees such tokens or distances, so the Pythia-14m-shaped zoo model trains on rows of the same
tokens: a random prefix, then a random chunk repeated until the row ends. The chunk length (the
distance induction must reach) is uniform in [CHUNK_MIN, seq_len - CHUNK_MIN], so every distance the
probe asks about is trained; for the first steps (the repeat warm-up) chunks are 8-32 tokens long
and repeat many times, the same start that makes induction form fast in the byte models. Ids outside [TOKEN_LOW, TOKEN_HIGH) never occur, which is why training
may take its softmax over the first TOKEN_HIGH ids only (TrainConfig.softmax_vocab).

Every batch is a pure function of (seed, step), like the byte stream (core/tasks/mixture.py).
"""

from __future__ import annotations

import torch

from core.errors import HeadLabError
from core.tasks.mixture import batch_generator

TOKEN_LOW, TOKEN_HIGH = 100, 10_000  # the reference probe's token range
CHUNK_MIN = 8  # shortest repeated chunk
WARMUP_CHUNK_MAX = 32  # longest chunk during the repeat warm-up (TrainConfig.repeat_warmup_steps)


def _repeat_row(gen: torch.Generator, seq_len: int, chunk_max: int) -> torch.Tensor:
    """A random prefix, then a chunk of CHUNK_MIN..chunk_max tokens repeated to the end: [seq_len]."""
    chunk_len = int(torch.randint(CHUNK_MIN, chunk_max + 1, (), generator=gen))
    max_prefix = max(0, seq_len - chunk_len - CHUNK_MIN)  # at least CHUNK_MIN repeated tokens
    prefix_len = int(torch.randint(0, max_prefix + 1, (), generator=gen))
    prefix = torch.randint(TOKEN_LOW, TOKEN_HIGH, (prefix_len,), generator=gen)
    chunk = torch.randint(TOKEN_LOW, TOKEN_HIGH, (chunk_len,), generator=gen)
    n_copies = -(-(seq_len - prefix_len) // chunk_len)
    return torch.cat([prefix, chunk.repeat(n_copies)[: seq_len - prefix_len]])


def training_batch(step: int, batch_size: int, seq_len: int, seed: int, chunk_max: int | None = None) -> torch.Tensor:
    """One batch of repeat rows in [TOKEN_LOW, TOKEN_HIGH); deterministic in (seed, step): [batch, seq_len].

    chunk_max: the longest repeated chunk (default seq_len - CHUNK_MIN). Short chunks repeat many
    times, so most of a row is predictable by induction: the warm-up uses them (WARMUP_CHUNK_MAX).
    """
    if seq_len < 3 * CHUNK_MIN:
        raise HeadLabError(f"Token-repeat training needs seq_len >= {3 * CHUNK_MIN}; got {seq_len}.")
    chunk_max = seq_len - CHUNK_MIN if chunk_max is None else min(int(chunk_max), seq_len - CHUNK_MIN)
    if chunk_max < CHUNK_MIN:
        raise HeadLabError(f"The longest repeated chunk must be at least {CHUNK_MIN} tokens; got {chunk_max}.")
    gen = batch_generator(seed, step, salt=7)
    return torch.stack([_repeat_row(gen, seq_len, chunk_max) for _ in range(batch_size)])


def repeated_random_tokens(n_examples: int, half_len: int, seed: int) -> torch.Tensor:
    """x + x with x = `half_len` distinct tokens of [TOKEN_LOW, TOKEN_HIGH): [example, 2*half_len].

    Distinct, so every token of the second copy has exactly one earlier occurrence (prefix matching).
    """
    if not 2 <= half_len <= TOKEN_HIGH - TOKEN_LOW:
        raise HeadLabError(f"Token induction test half_len must be in [2, {TOKEN_HIGH - TOKEN_LOW}], got {half_len}.")
    gen = batch_generator(seed, 0, salt=8)
    first = torch.stack([TOKEN_LOW + torch.randperm(TOKEN_HIGH - TOKEN_LOW, generator=gen)[:half_len]
                         for _ in range(n_examples)])
    return torch.cat([first, first], dim=1)
