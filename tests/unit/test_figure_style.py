"""Shared figure helpers on hand-made values."""

from __future__ import annotations

from core.figures._style import short_tokens


def test_token_counts_read_like_4_1M_never_4_1e06():
    assert [short_tokens(t) for t in (0, 950, 12_300, 4_096_000, 2e9)] == ["0", "950", "12.3k", "4.1M", "2B"]
