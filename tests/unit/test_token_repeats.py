"""The token-range induction stream (core/tasks/token_repeats.py): ids, repeats and determinism."""

from __future__ import annotations

import pytest
import torch

from core.errors import HeadLabError
from core.tasks import token_repeats
from core.tasks.token_repeats import CHUNK_MIN, TOKEN_HIGH, TOKEN_LOW


def _period(row: torch.Tensor) -> tuple[int, int]:
    """(d, s) for a row ending in a repeated chunk: d the smallest shift with row[t] == row[t - d]
    over the last CHUNK_MIN positions (random tokens almost never match by chance), s the first
    position from which row[t] == row[t - d] holds to the end."""
    n = row.numel()
    for d in range(CHUNK_MIN, n - CHUNK_MIN + 1):
        if torch.equal(row[n - CHUNK_MIN:], row[n - CHUNK_MIN - d:n - d]):
            s = n - CHUNK_MIN
            while s - 1 >= d and row[s - 1] == row[s - 1 - d]:
                s -= 1
            return d, s
    raise AssertionError("no repeated chunk")


def test_rows_hold_reference_range_tokens_and_end_in_a_repeat():
    batch = token_repeats.training_batch(step=3, batch_size=16, seq_len=64, seed=0)
    assert batch.shape == (16, 64) and batch.dtype == torch.long
    assert int(batch.min()) >= TOKEN_LOW and int(batch.max()) < TOKEN_HIGH
    for row in batch:
        d, start = _period(row)
        assert CHUNK_MIN <= d <= 64 - CHUNK_MIN and 64 - start >= CHUNK_MIN


def test_chunk_lengths_cover_long_distances():
    """At T = 256 the reference probe needs induction 128-235 tokens back: the stream trains them."""
    batch = token_repeats.training_batch(step=0, batch_size=64, seq_len=256, seed=1)
    periods = [_period(row)[0] for row in batch]
    assert max(periods) > 200 and min(periods) < 60


def test_batches_are_pure_functions_of_seed_and_step():
    a = token_repeats.training_batch(step=7, batch_size=4, seq_len=32, seed=2)
    assert torch.equal(a, token_repeats.training_batch(step=7, batch_size=4, seq_len=32, seed=2))
    assert not torch.equal(a, token_repeats.training_batch(step=8, batch_size=4, seq_len=32, seed=2))


def test_repeated_random_tokens_are_two_copies_of_distinct_tokens():
    tokens = token_repeats.repeated_random_tokens(3, half_len=50, seed=0)
    assert tokens.shape == (3, 100)
    assert torch.equal(tokens[:, :50], tokens[:, 50:])
    for row in tokens[:, :50]:
        assert row.unique().numel() == 50


def test_too_short_rows_are_refused():
    with pytest.raises(HeadLabError, match="seq_len >= 24"):
        token_repeats.training_batch(step=0, batch_size=1, seq_len=20, seed=0)
