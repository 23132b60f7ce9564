"""The probe spec: one protocol, its tasks, and the one way to read a spec back from JSON.

A spec (task, N, T, seed, ...) fully determines its ProbeBatch: `build()` makes the batch,
`to_json()` is part of every cache key, `check_vocab()` refuses a model that cannot read it.
`spec_from_json` reads a spec's own to_json(), a batch's `spec` (the same keys plus
provenance such as p_low or the text fingerprint), or either as a JSON string.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Protocol

from core.errors import HeadLabError
from core.tasks.induction import InductionProbeSpec
from core.tasks.probe_batch import ProbeBatch
from core.tasks.text import TextProbeSpec


class ProbeSpec(Protocol):
    """What every probe spec offers (InductionProbeSpec, TextProbeSpec)."""

    task: str
    n_examples: int
    seq_len: int
    seed: int

    def to_json(self) -> dict: ...

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProbeSpec": ...

    def build(self) -> ProbeBatch: ...

    def check_vocab(self, vocab_size: int) -> None: ...


SPEC_CLASSES: dict[str, type] = {"induction": InductionProbeSpec, "text": TextProbeSpec}
TASKS = tuple(SPEC_CLASSES)


def probe_spec(task: str, n_examples: int = 256, seq_len: int = 64, seed: int = 42,
               token_low: int = 0, token_high: int = 256) -> ProbeSpec:
    """The probe spec of a task; the zoo default is 256 sequences of 64 byte tokens (token range: induction only)."""
    if task == "induction":
        return InductionProbeSpec(n_examples=n_examples, seq_len=seq_len, token_low=token_low,
                                  token_high=token_high, seed=seed)
    if task == "text":
        return TextProbeSpec(n_examples=n_examples, seq_len=seq_len, seed=seed)
    raise HeadLabError(f"unknown probe task {task!r}; use one of: {', '.join(TASKS)}.")


def spec_from_json(data: Mapping[str, Any] | str) -> ProbeSpec:
    """The spec a JSON record (dict or string) describes, by its "task" key."""
    record = json.loads(data) if isinstance(data, str) else dict(data)
    cls = SPEC_CLASSES.get(record.get("task"))
    if cls is None:
        raise HeadLabError(f"unknown probe task {record.get('task')!r}; use one of: {', '.join(TASKS)}.")
    try:
        return cls.from_json(record)
    except (KeyError, TypeError, ValueError) as exc:
        raise HeadLabError(f"this {cls.task} probe spec is incomplete or malformed ({exc}); rebuild it with probe_spec().") from None
