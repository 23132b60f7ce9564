"""Shared figure helpers on hand-made values."""

from __future__ import annotations

from core.figures._style import Z_GREY, rank_z_title, short_tokens, z_reliable


def test_token_counts_read_like_4_1M_never_4_1e06():
    assert [short_tokens(t) for t in (0, 950, 12_300, 4_096_000, 2e9)] == ["0", "950", "12.3k", "4.1M", "2B"]


def test_titles_lead_with_rank_and_grey_z_below_ten_controls():
    assert z_reliable(10) and not z_reliable(9) and not z_reliable(None)
    full = rank_z_title(1, 1 / 21, 20, 2.31)
    assert full == "rank 1/21, p = 0.048 · z = +2.31 (20 ctrl)"
    few = rank_z_title(1, 1 / 3, 2, 20.4)
    assert few.startswith("rank 1/3, p = 0.33 · ") and f"color:{Z_GREY}" in few and "z = +20.4 (2 ctrl)" in few
    assert rank_z_title(None, None, 12, None) == "z = n/a (degenerate) (12 ctrl)"
