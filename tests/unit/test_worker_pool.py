"""The serial worker pool on hand-made workers (built once, calls in order, retry once, failures by name),
and how a study's conditions are cut into chunks for a pool."""

from __future__ import annotations

import pytest
import torch

from core.ablation.workers import condition_chunks
from core.errors import HeadLabError
from core.executor import SerialExecutor, SweepFailed

BUILT: list[tuple] = []


class _Counter:
    """A stateful worker: remembers every item it was given; fails on negative items, once or always."""

    def __init__(self, offset: int):
        BUILT.append((offset,))
        self.offset = offset
        self.seen: list[int] = []
        self.failed: set[int] = set()

    def add(self, item: int) -> tuple[int, int, int]:
        self.seen.append(item)
        if item < 0 and (item == -1 or item not in self.failed):
            self.failed.add(item)
            raise ValueError(f"item {item} refused")
        return item + self.offset, len(self.seen), torch.get_num_threads()


def test_serial_pool_builds_one_worker_once_and_answers_in_order():
    BUILT.clear()
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    pool = SerialExecutor().workers(_Counter, (10,), n=4, threads=target)
    assert pool.size == 1 and BUILT == [(10,)]
    got = list(pool.map("add", [1, 2, 3]))
    assert got == [(0, (11, 1, target)), (1, (12, 2, target)), (2, (13, 3, target))]  # one worker kept its state
    assert list(pool.map("add", [5])) == [(0, (15, 4, target))]
    assert BUILT == [(10,)] and torch.get_num_threads() == before


def test_serial_pool_retries_a_call_once_then_reports_it_by_name_after_the_others():
    pool = SerialExecutor().workers(_Counter, (0,))
    assert [r[1][0] for r in pool.map("add", [-2])] == [-2]  # failed once, then answered
    got = []
    with pytest.raises(SweepFailed, match=r"1 of 3 tasks failed.*add #1: ValueError: item -1 refused"):
        for index, result in pool.map("add", [4, -1, 6]):
            got.append((index, result[0]))
    assert got == [(0, 4), (2, 6)]
    with pytest.raises(SweepFailed, match=r"chunk b: ValueError: item -1 refused"):
        list(pool.map("add", [3, -1], names=["chunk a", "chunk b"]))
    with pytest.raises(HeadLabError, match="1 names for 2 items"):
        list(pool.map("add", [1, 2], names=["one"]))


def test_condition_chunks_put_the_candidate_alone_first_and_balance_the_rest():
    # 20 controls + upper bound on 2 workers: (21 + 1) / 2 = 11 conditions each, 10 for the candidate's worker
    assert condition_chunks(22, 2) == [[0], list(range(1, 12)), list(range(12, 22))]
    assert condition_chunks(22, 1) == [[0], list(range(1, 22))]
    assert condition_chunks(3, 2) == [[0], [1, 2]]  # the candidate is the share of its worker
    assert condition_chunks(2, 3) == [[0], [1]]  # empty chunks dropped
    assert condition_chunks(1, 3) == [[0]]
    chunks = condition_chunks(40, 3)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(40))
    assert [len(c) for c in chunks] == [1, 14, 13, 12]  # (39 + 1) / 3 = 13.33: cuts at 14 and 27
