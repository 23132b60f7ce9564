"""The induction training stream for a model with a real-size vocabulary (the Pythia-shaped zoo model).

The reference probe (METHODS.md) draws tokens uniformly from [100, 10000) and asks a model to copy
the token after an earlier A from 128 to 235 positions back at T = 256. A model trained on bytes
never sees such tokens or distances, so the Pythia-14m-shaped zoo model trains on rows of the same
tokens: a random prefix, then a random chunk repeated until the row ends. The chunk length (the
distance induction must reach) is uniform in [CHUNK_MIN, seq_len - CHUNK_MIN], so every distance the
probe asks about is trained. Ids outside [TOKEN_LOW, TOKEN_HIGH) never occur, which is why training
may take its softmax over the first TOKEN_HIGH ids only (TrainConfig.softmax_vocab).

The warm-up (TrainConfig.repeat_warmup_steps) is a curriculum, and it is what makes induction form in
this shape at all. On the full rows from the start (T = 256, 9,900 ids, chunks of 8 or more) the
loss sat at ln(9,900) for 1,135 steps, and at T = 64 with 256-500 ids at ln(V) for 300-1,000 steps.
Random tokens give a previous-token head no reward of its own (natural text does, through bigrams),
so both halves of the circuit had to appear together. The curriculum (CURRICULUM) starts with short
rows (T = 32) of 256 ids with chunks of 2-12: a chunk of 2 (a b a b ...) rewards attending to the
previous token and copying it, one layer's work, and the longer chunks then reward induction on top
of it (it formed by step 300). Going straight from there to the full rows erased it; growing the ids
(x2 per stage) and then the row length keeps it (measured: accuracy on x + x drops at each stage's
start and climbs back to 0.6-0.9 within 100 steps). Every stage's batch holds the same number of
tokens as the full batches (more, shorter rows), and its loss takes the softmax over the ids it uses
(curriculum_softmax_vocab).

Every batch is a pure function of (seed, step), like the byte stream (core/tasks/mixture.py).
"""

from __future__ import annotations

import torch

from core.errors import HeadLabError
from core.tasks.mixture import batch_generator

TOKEN_LOW, TOKEN_HIGH = 100, 10_000  # the reference probe's token range
CHUNK_MIN = 8  # shortest repeated chunk after the warm-up; also the fewest repeated tokens after one chunk

# The warm-up curriculum: (share of the warm-up's steps, ids [TOKEN_LOW, TOKEN_LOW + n_ids), row length,
# chunk lengths min..max). The shares are of TrainConfig.repeat_warmup_steps (1,200 for the zoo model:
# 500, then 100 per stage).
CURRICULUM = (
    (5, 256, 32, 2, 12),
    (1, 512, 32, 2, 12),
    (1, 1024, 32, 2, 12),
    (1, 2048, 32, 2, 12),
    (1, 4096, 32, 2, 12),
    (1, TOKEN_HIGH - TOKEN_LOW, 32, 2, 12),
    (1, TOKEN_HIGH - TOKEN_LOW, 64, 2, 56),
    (1, TOKEN_HIGH - TOKEN_LOW, 128, 2, 120),
)


def curriculum_stage(step: int, warmup_steps: int) -> tuple[int, int, int, int] | None:
    """(n_ids, row length, chunk min, chunk max) of `step` in a warm-up of `warmup_steps`; None after it."""
    if step >= warmup_steps:
        return None
    total = sum(stage[0] for stage in CURRICULUM)
    ends = 0
    for share, *stage in CURRICULUM[:-1]:
        ends += share
        if step < warmup_steps * ends // total:
            return tuple(stage)
    return tuple(CURRICULUM[-1][1:])  # the last stage runs to the end of the warm-up


def curriculum_softmax_vocab(step: int, warmup_steps: int) -> int | None:
    """The softmax width a warm-up step's loss needs (the first ids up to its own); None after the warm-up."""
    stage = curriculum_stage(step, warmup_steps)
    return None if stage is None else TOKEN_LOW + stage[0]


def _repeat_row(gen: torch.Generator, seq_len: int, chunk_min: int, chunk_max: int, token_high: int) -> torch.Tensor:
    """A random prefix, then a chunk of chunk_min..chunk_max tokens of [TOKEN_LOW, token_high) repeated
    to the end: [seq_len]."""
    chunk_len = int(torch.randint(chunk_min, chunk_max + 1, (), generator=gen))
    max_prefix = max(0, seq_len - chunk_len - CHUNK_MIN)  # at least CHUNK_MIN repeated tokens
    prefix_len = int(torch.randint(0, max_prefix + 1, (), generator=gen))
    prefix = torch.randint(TOKEN_LOW, token_high, (prefix_len,), generator=gen)
    chunk = torch.randint(TOKEN_LOW, token_high, (chunk_len,), generator=gen)
    n_copies = -(-(seq_len - prefix_len) // chunk_len)
    return torch.cat([prefix, chunk.repeat(n_copies)[: seq_len - prefix_len]])


def training_batch(step: int, batch_size: int, seq_len: int, seed: int, warmup_steps: int = 0) -> torch.Tensor:
    """One batch of repeat rows; deterministic in (seed, step).

    After the warm-up: [batch_size, seq_len] of [TOKEN_LOW, TOKEN_HIGH), chunks CHUNK_MIN..seq_len - CHUNK_MIN.
    During it (step < warmup_steps): the curriculum stage's rows, as many as hold batch_size * seq_len tokens.
    """
    if seq_len < 3 * CHUNK_MIN:
        raise HeadLabError(f"Token-repeat training needs seq_len >= {3 * CHUNK_MIN}; got {seq_len}.")
    gen = batch_generator(seed, step, salt=7)
    stage = curriculum_stage(step, warmup_steps)
    if stage is not None:
        n_ids, row_len, chunk_min, chunk_max = stage
        n_rows = max(1, batch_size * seq_len // row_len)
        return torch.stack([_repeat_row(gen, row_len, chunk_min, chunk_max, TOKEN_LOW + n_ids) for _ in range(n_rows)])
    return torch.stack([_repeat_row(gen, seq_len, CHUNK_MIN, seq_len - CHUNK_MIN, TOKEN_HIGH) for _ in range(batch_size)])


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
