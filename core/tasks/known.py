"""The tasks of the known-circuit models: clean/corrupted pairs whose corruption moves every true head.

A corruption that changes only the query (or only the answer) leaves the early heads of a circuit
with nothing to patch, so activation patching could not find them. Both tasks here *swap* planted
tokens instead, so every head of the circuit carries a different value in the corrupted run and the
corrupted prompt has its own answer (the metric is the logit difference clean answer - corrupted
answer, +g clean and -g corrupted by construction).

- "known-induction" (`SwapInductionSpec`): two planted pairs A B (at p) and C D (at r), the last
  token A; answer B. Corrupted: A and C swapped at p and r, so the final A now follows ... A D:
  answer D. The previous-token head's output at p+1 and r+1, the induction head's key match and its
  copied value all change.
- "known-twohop" (`TwoHopSpec`): four planted pairs A B (p), C B (r), E F (s), G F (t), the last
  token A. Hop one (induction) finds B after the earlier A; hop two finds the other B and reads the
  token before it: answer C. Corrupted: A and E swapped at p and s: hop one finds F, hop two G.

Every token is drawn from numpy RandomState(seed) over [token_low, token_high): the planted
tokens are distinct, the fillers are never one of them, so each match is unique. The probe batch
(`build_batch`) is the pairs' clean side: query q = T-1, target the clean answer, induction key
p+1, duplicate key p.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from numbers import Integral
from typing import Any, ClassVar, Mapping

import numpy as np
import torch

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.counterfactual import PatchPair
from core.tasks.probe_batch import MIN_QUERY_POS, ProbeBatch, check_seed


def _check_ints(spec: Any, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise HeadLabError(f"{spec.task} task {name} must be an integer, got {value!r}.")
        object.__setattr__(spec, name, int(value))


def _pair_starts(rng: np.random.RandomState, n_pairs: int, last: int) -> np.ndarray:
    """`n_pairs` starts of non-overlapping two-token slots in [1, last): [n_pairs] in draw order.

    Never position 0: there a previous-token head can only attend to the token itself, so a pair
    planted there would give its first token a spurious "previous token" match.
    """
    slots = rng.permutation((last - 1) // 2)[:n_pairs]
    return 1 + 2 * slots


class PairTask:
    """What every known-circuit task spec shares (here and in core/zoo/known/planted.py): clean prompts of
    n_examples x seq_len whose query is the last position, built with their corrupted twins by build_pair()."""

    def _batch(self, tokens: np.ndarray, target: np.ndarray, key: np.ndarray) -> ProbeBatch:
        """tokens [N, T], target [N], key [N] (the earlier position the answer follows) as a ProbeBatch."""
        n, q = self.n_examples, self.seq_len - 1
        keys = torch.from_numpy(key.astype(np.int64))
        return ProbeBatch(tokens=torch.from_numpy(tokens), query_pos=torch.full((n,), q, dtype=torch.long),
                          target=torch.from_numpy(target.astype(np.int64)), induction_pos=keys + 1, duplicate_pos=keys,
                          spec={**self.to_json(), "rng": "numpy.RandomState"})

    def build_batch(self) -> ProbeBatch:
        """The clean prompts as a probe batch (the ablation study's input)."""
        return self.build_pair().clean

    def build(self) -> PatchPair:
        return self.build_pair()

    def build_pair(self) -> PatchPair:  # pragma: no cover - each task defines it
        raise NotImplementedError


@dataclass(frozen=True)
class _PlantedSpec(PairTask, JsonResult):
    """Shared fields and checks: N prompts of T tokens from [token_low, token_high), seeded."""

    task: ClassVar[str] = ""
    n_planted: ClassVar[int] = 0  # distinct planted tokens per prompt
    n_pairs: ClassVar[int] = 0  # planted two-token slots per prompt
    tail: ClassVar[int] = 1  # positions at the end that no slot may take (the query, and what comes before it)
    n_examples: int
    seq_len: int
    token_low: int
    token_high: int
    seed: int = 0

    def __post_init__(self) -> None:
        _check_ints(self, ("n_examples", "seq_len", "token_low", "token_high", "seed"))
        check_seed(self.seed, f"{self.task} task seed")
        if self.n_examples < 1:
            raise HeadLabError(f"{self.task} task n_examples must be at least 1.")
        need_len = max(MIN_QUERY_POS + 1, 2 * self.n_pairs + self.tail + 1)  # the slots after position 0, the tail
        if self.seq_len < need_len:
            raise HeadLabError(f"{self.task} task seq_len is {self.seq_len}; it plants {self.n_pairs} pairs before the "
                               f"query, so use at least {need_len}.")
        if self.token_low < 0 or self.token_high - self.token_low < self.n_planted + 1:
            raise HeadLabError(f"{self.task} task token range [{self.token_low}, {self.token_high}) must hold at least "
                               f"{self.n_planted + 1} tokens ({self.n_planted} planted and one filler); widen it.")

    def to_json(self) -> dict:
        return {"task": self.task, **super().to_json()}

    def check_vocab(self, vocab_size: int) -> None:
        if self.token_high > int(vocab_size):
            raise HeadLabError(f"the {self.task} task draws tokens up to {self.token_high - 1}, which a model with "
                               f"{vocab_size} tokens cannot read; set token_high <= {vocab_size}.")

    def _draw(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example: fillers [N, T] without the planted tokens, planted [N, n_planted], starts [N, n_pairs]."""
        n, seq_len, low, high = self.n_examples, self.seq_len, self.token_low, self.token_high
        rng = np.random.RandomState(self.seed)
        tokens = np.empty((n, seq_len), dtype=np.int64)
        planted = np.empty((n, self.n_planted), dtype=np.int64)
        starts = np.empty((n, self.n_pairs), dtype=np.int64)
        for i in range(n):
            planted[i] = low + rng.permutation(high - low)[: self.n_planted]
            fillers = np.setdiff1d(np.arange(low, high), planted[i])
            tokens[i] = fillers[rng.randint(0, len(fillers), size=seq_len)]
            starts[i] = _pair_starts(rng, self.n_pairs, seq_len - self.tail)
        return tokens, planted, starts



@dataclass(frozen=True)
class SwapInductionSpec(_PlantedSpec):
    """A B ... C D ... A -> B; corrupted: C B ... A D ... A -> D (A and C swapped)."""

    task: ClassVar[str] = "known-induction"
    n_planted: ClassVar[int] = 4
    n_pairs: ClassVar[int] = 2
    repeated_a: ClassVar[str] = "the final A"  # where the prompt repeats A (the corruption's description)

    def _end(self, tokens: np.ndarray, a: np.ndarray) -> None:
        """Write the prompt's end into tokens [N, T]: A again at the query."""
        tokens[:, self.seq_len - 1] = a

    def build_pair(self) -> PatchPair:
        tokens, planted, starts = self._draw()
        rows = np.arange(self.n_examples)
        a, b, c, d = planted.T
        p, r = starts.T
        tokens[rows, p], tokens[rows, p + 1], tokens[rows, r], tokens[rows, r + 1] = a, b, c, d
        self._end(tokens, a)
        corrupted = tokens.copy()
        corrupted[rows, p], corrupted[rows, r] = c, a
        clean = self._batch(tokens, b, p)
        spec = {**clean.spec, "corruption": f"A and C swapped at p and r: {self.repeated_a} now follows ... A D, answer D"}
        return PatchPair(clean, torch.from_numpy(corrupted), torch.from_numpy(d.copy()), spec)


@dataclass(frozen=True)
class TwoHopSpec(_PlantedSpec):
    """A B ... C B ... E F ... G F ... A -> C (hop one: B after A; hop two: the token before the other B).

    Corrupted: A and E swapped at p and s: hop one finds F, hop two G.
    """

    task: ClassVar[str] = "known-twohop"
    n_planted: ClassVar[int] = 6
    n_pairs: ClassVar[int] = 4

    def build_pair(self) -> PatchPair:
        tokens, planted, starts = self._draw()
        rows = np.arange(self.n_examples)
        a, b, c, e, f, g = planted.T
        p, r, s, t = starts.T
        q = self.seq_len - 1
        for pos, first, second in ((p, a, b), (r, c, b), (s, e, f), (t, g, f)):
            tokens[rows, pos], tokens[rows, pos + 1] = first, second
        tokens[:, q] = a
        corrupted = tokens.copy()
        corrupted[rows, p], corrupted[rows, s] = e, a
        clean = self._batch(tokens, c, p)
        spec = {**clean.spec, "corruption": "A and E swapped at p and s: hop one finds F, hop two G, answer G"}
        return PatchPair(clean, torch.from_numpy(corrupted), torch.from_numpy(g.copy()), spec)


@dataclass(frozen=True)
class SkipInductionSpec(_PlantedSpec):
    """A X B ... C Y D ... A -> B (the token two after the earlier A); corrupted: A and C swapped, answer D.

    Induction one token further on: the key at B must hold A, two tokens back, which a previous-token head in
    one layer moves to X and a second one, reading X's position, moves on to B (hard.py's hard-skip-induction).
    induction_pos is B's position (p + 2); duplicate_pos, the position before it (ProbeBatch's rule), X's.
    """

    task: ClassVar[str] = "known-skip-induction"
    n_planted: ClassVar[int] = 6
    n_pairs: ClassVar[int] = 3  # two three-token slots take as many positions as three pairs

    def build_pair(self) -> PatchPair:
        tokens, planted, _ = self._draw()
        rng = np.random.RandomState(self.seed + 1)  # the slots: a stream of their own
        q = self.seq_len - 1
        starts = np.stack([1 + 3 * rng.permutation((q - 1) // 3)[:2] for _ in range(self.n_examples)])  # [N, 2]
        rows = np.arange(self.n_examples)
        a, x, b, c, y, d = planted.T
        p, r = starts.T
        for pos, slot in ((p, (a, x, b)), (r, (c, y, d))):
            for offset, token in enumerate(slot):
                tokens[rows, pos + offset] = token
        tokens[:, q] = a
        corrupted = tokens.copy()
        corrupted[rows, p], corrupted[rows, r] = c, a
        clean = self._batch(tokens, b, p + 1)  # induction_pos p + 2 (B); duplicate_pos p + 1 (X: a batch's rule)
        spec = {**clean.spec, "corruption": "A and C swapped at p and r: the final A now follows ... A Y D, answer D"}
        return PatchPair(clean, torch.from_numpy(corrupted), torch.from_numpy(d.copy()), spec)


@dataclass(frozen=True)
class MarkedInductionSpec(SwapInductionSpec):
    """A B ... C D ... A MARK -> B (induction answered one position after the repeated A); corrupted: A and C
    swapped, answer D (SwapInductionSpec's prompts with the marker after the repeated A).

    The repeated A is not the query: an induction head at A (attending to B) writes B there, and a mover at the
    marker reads it from the position before (hard.py's MARKED_INDUCTION_RECIPE, a chain of four heads).
    induction_pos is B's position (p + 1); duplicate_pos A's (p); the marker token lies outside the task's tokens.
    """

    task: ClassVar[str] = "known-marked-induction"
    tail: ClassVar[int] = 2  # the repeated A, then the marker
    repeated_a: ClassVar[str] = "the repeated A"
    marker: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_ints(self, ("marker",))
        if self.token_low <= self.marker < self.token_high or self.marker < 0:
            raise HeadLabError(f"{self.task} task marker {self.marker} must be a token outside the task's range "
                               f"[{self.token_low}, {self.token_high}).")

    def _end(self, tokens: np.ndarray, a: np.ndarray) -> None:
        """A at the position before the query, the marker at the query."""
        q = self.seq_len - 1
        tokens[:, q - 1], tokens[:, q] = a, self.marker


MAX_KNOWN_EXAMPLES = 4096  # pairs a circuit.json task may ask for (HeadLab's known models use 64): built at once in memory
MAX_KNOWN_SEQ_LEN = 4096


def _check_record_counts(cls: type, record: Mapping[str, Any]) -> None:
    """Refuse, before anything is built, an integer field of a task record that is not a JSON whole number (from_json
    would truncate 2.5 to 2) and a pair count or length over its bound (1e9 pairs would be built at once)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = record.get(f.name)
        if hints.get(f.name) is int and f.name in record and (isinstance(value, bool) or not isinstance(value, int)):
            raise HeadLabError(f"the {record.get('task')} task record's {f.name} is {value!r}, not a whole number; "
                               "fix the circuit.json or rebuild the model (python -m core known --build NAME).")
    for name, most in (("n_examples", MAX_KNOWN_EXAMPLES), ("seq_len", MAX_KNOWN_SEQ_LEN)):
        if isinstance(record.get(name), int) and record[name] > most:
            raise HeadLabError(f"the {record.get('task')} task record's {name} is {record[name]}, over its bound of "
                               f"{most} (the pairs are built at once in memory); fix the circuit.json.")


KNOWN_TASKS: dict[str, type] = {"known-induction": SwapInductionSpec, "known-twohop": TwoHopSpec,
                                 "known-skip-induction": SkipInductionSpec, "known-marked-induction": MarkedInductionSpec}


def known_task(record: Mapping[str, Any]) -> _PlantedSpec:
    """The task spec a circuit.json `task` record describes, by its "task" key."""
    if not isinstance(record, Mapping):
        raise HeadLabError("a known circuit's task must be a JSON object with a \"task\" key.")
    cls = KNOWN_TASKS.get(record.get("task"))
    if cls is None:
        raise HeadLabError(f"known-circuit task {record.get('task')!r} is unknown; use one of {', '.join(KNOWN_TASKS)}.")
    _check_record_counts(cls, record)
    try:
        return cls.from_json(record)
    except (KeyError, TypeError, ValueError) as exc:
        raise HeadLabError(f"this {cls.task} task record is incomplete or malformed ({exc}); rebuild the model "
                           "(python -m core known --build).") from None
