"""The probe spec: one protocol, its tasks, and the one way to read a spec back from JSON.

A spec (task, N, T, seed, ...) fully determines its ProbeBatch: `build()` makes the batch,
`to_json()` is part of every cache key, `check_vocab()` refuses a model that cannot read it.
`spec_from_json` reads a spec's own to_json(), a batch's `spec` (the same keys plus
provenance such as p_low or the text fingerprint), or either as a JSON string.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Protocol

from core.choices import PROBE_TASKS as TASKS
from core.errors import HeadLabError
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.induction import InductionProbeSpec, token_source
from core.tasks.ioi import IoiCounterfactualSpec, IoiSpec, ioi_spec
from core.tasks.probe_batch import ProbeBatch
from core.tasks.repeat import RepeatInductionSpec
from core.tasks.text import TextProbeSpec
from core.tasks.tokens import special_prefix


class ProbeSpec(Protocol):
    """What every probe spec offers (InductionProbeSpec, RepeatInductionSpec, TextProbeSpec, IoiSpec)."""

    task: str
    n_examples: int
    seq_len: int
    seed: int

    def to_json(self) -> dict: ...

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ProbeSpec": ...

    def build(self) -> ProbeBatch: ...

    def check_vocab(self, vocab_size: int) -> None: ...


SPEC_CLASSES: dict[str, type] = dict(zip(TASKS, (InductionProbeSpec, RepeatInductionSpec, TextProbeSpec, IoiSpec), strict=True))
TOKENIZER_TASKS = ("ioi",)  # tasks built from the model's own tokenizer (none without one)
PAIR_TASKS = ("induction", "ioi")  # tasks with a built-in counterfactual (patch, edges, the Patching and graph pages)


def probe_spec(task: str, n_examples: int = 256, seq_len: int = 64, seed: int = 42,
               token_low: int | None = 0, token_high: int | None = 256, tokenizer: Any = None) -> ProbeSpec:
    """The probe spec of a task; the zoo default is 256 sequences of 64 byte tokens.

    token_low, token_high: the random-token tasks' range (induction, induction-repeat); None for both means
    the model's ordinary tokens: bytes [0, 256) on a byte tokenizer or none, else core/tasks/tokens.py's rule
    over `tokenizer` (recorded with its fingerprint). tokenizer: the model's (a transformers tokenizer), or None.
    ioi needs it and has no length of its own (seq_len is not read).
    """
    if task == "induction":
        return InductionProbeSpec(n_examples=n_examples, seq_len=seq_len, seed=seed,
                                  **token_source(tokenizer, token_low, token_high))
    if task == "induction-repeat":
        source = token_source(tokenizer, token_low, token_high)
        prefix = special_prefix(tokenizer) if "vocab" in source else ()
        return RepeatInductionSpec(n_examples=n_examples, seq_len=seq_len, seed=seed, prefix=prefix, **source)
    if task == "text":
        return TextProbeSpec(n_examples=n_examples, seq_len=seq_len, seed=seed)
    if task == "ioi":
        if tokenizer is None:
            raise HeadLabError("the ioi task is built from the model's own tokenizer; give the tokenizer "
                               "(probe_spec('ioi', ..., tokenizer=...)).")
        return ioi_spec(tokenizer, n_examples, seed)
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


def built_in_counterfactual(spec: ProbeSpec, seed: int = 0,
                            corruption: str = "abc") -> InductionCounterfactualSpec | IoiCounterfactualSpec:
    """The clean/corrupted pairs a built-in task offers: the induction probe with its earlier A replaced (seed draws
    the replacement), or the IOI prompts with their ABC (seed draws the names) or swapped-subject twins.

    The one rule the command line (patch, edges) and the Patching and Circuit graph pages share; any other task
    has no counterfactual and is refused with what to pick instead.
    """
    if isinstance(spec, IoiSpec):
        return IoiCounterfactualSpec(spec, corruption, seed)
    if isinstance(spec, InductionProbeSpec):
        if corruption != "abc":
            raise HeadLabError("the corruption (abc, swap) chooses the ioi task's counterfactual; the induction "
                               "counterfactual has one kind (leave it at abc), or pick the ioi task.")
        return InductionCounterfactualSpec(spec, seed=seed)
    raise HeadLabError(f"the {spec.task} task has no built-in counterfactual; pick the {' or '.join(PAIR_TASKS)} task, "
                       "or give your own clean/corrupted pairs as a probe file.")
