"""The token-range induction stream (core/tasks/token_repeats.py): ids, repeats and determinism."""

from __future__ import annotations

import pytest
import torch

from core.errors import HeadLabError
from core.tasks import token_repeats
from core.tasks.token_repeats import CHUNK_MIN, TOKEN_HIGH, TOKEN_LOW, curriculum_softmax_vocab, curriculum_stage
from core.zoo.config import TrainConfig
from core.zoo.train import batch_at, softmax_vocab_at


def _period(row: torch.Tensor, shortest: int = CHUNK_MIN) -> tuple[int, int]:
    """(d, s) for a row ending in a repeated chunk: d the smallest shift >= `shortest` with row[t] ==
    row[t - d] over the last CHUNK_MIN positions (random tokens almost never match by chance), s the
    first position from which row[t] == row[t - d] holds to the end."""
    n = row.numel()
    for d in range(shortest, n - CHUNK_MIN + 1):
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


def test_the_curriculum_grows_the_ids_then_the_rows():
    """1,200 warm-up steps: 500 on 256 ids in rows of 32, then 100 per stage; nothing after the warm-up."""
    assert curriculum_stage(0, 1200) == curriculum_stage(499, 1200) == (256, 32, 2, 12)
    assert curriculum_stage(500, 1200) == (512, 32, 2, 12) and curriculum_stage(999, 1200) == (9900, 32, 2, 12)
    assert curriculum_stage(1000, 1200) == (9900, 64, 2, 56) and curriculum_stage(1199, 1200) == (9900, 128, 2, 120)
    assert curriculum_stage(1200, 1200) is None and curriculum_stage(0, 0) is None
    assert curriculum_softmax_vocab(0, 1200) == TOKEN_LOW + 256 and curriculum_softmax_vocab(1200, 1200) is None


def test_warmup_rows_are_short_with_short_periods_over_few_tokens():
    """The first stage: the batch's tokens in rows of 32, ids below TOKEN_LOW + 256, periods 2-12."""
    batch = token_repeats.training_batch(step=0, batch_size=8, seq_len=256, seed=0, warmup_steps=1200)
    assert batch.shape == (8 * 256 // 32, 32)
    assert int(batch.min()) >= TOKEN_LOW and int(batch.max()) < TOKEN_LOW + 256
    periods = [_period(row, shortest=1)[0] for row in batch]
    assert min(periods) >= 2 and max(periods) <= 12
    assert 2 in periods  # a b a b ...: the previous-token reward is in the mix
    longer = token_repeats.training_batch(step=1100, batch_size=8, seq_len=256, seed=0, warmup_steps=1200)
    assert longer.shape == (16, 128) and int(longer.max()) >= TOKEN_LOW + 4096  # the last stage: every id, rows of 128


def test_the_training_loop_takes_the_warmup_batch_and_its_narrow_softmax_only_during_the_warmup():
    cfg = TrainConfig(task="tokens", steps=20, batch_size=2, seq_len=64, repeat_warmup_steps=12, softmax_vocab=TOKEN_HIGH,
                      stop_accuracy=None)
    assert batch_at(cfg, 4)[0].shape == (4, 32) and batch_at(cfg, 12)[0].shape == (2, 64)
    assert softmax_vocab_at(cfg, 4) == TOKEN_LOW + 256 and softmax_vocab_at(cfg, 5) == TOKEN_LOW + 512
    assert softmax_vocab_at(cfg, 12) == TOKEN_HIGH


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
