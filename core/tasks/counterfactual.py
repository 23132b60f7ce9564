"""Clean/corrupted pairs for patching, and the built-in counterfactual of the induction probe.

Activation, attribution and path patching (core/ablation/patching/) compare a clean run with a
corrupted one example by example, so both runs must have the same length and the same query
position. `PatchPair` holds the two; `InductionCounterfactualSpec` makes one from the induction
probe by corrupting the earlier A (the token at p): the query's A then has no earlier match, so
an induction circuit has nothing to copy, while the target B and every position stay the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Iterator

import numpy as np
import torch

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.induction import InductionProbeSpec
from core.tasks.probe_batch import ProbeBatch, check_seed
from core.tasks.tokens import runs_ids


@dataclass(frozen=True, eq=False)
class PatchPair:
    """A clean batch and its corrupted twin, example by example.

    clean:            ProbeBatch (tokens [example, pos], query_pos [example], target [example], ...)
    corrupted_tokens: [example, pos] long, the same shape as clean.tokens
    corrupted_target: [example] long, the answer the corrupted prompt points to; None when the pair
                      keeps the clean target (then the logit difference is the target logit alone)
    spec:             provenance (task, probe spec, corruption seed, ...), JSON-serialisable

    The clean batch's attention_mask serves both sides (a pair has equal token lengths, so equal padding).
    """

    clean: ProbeBatch
    corrupted_tokens: torch.Tensor
    corrupted_target: torch.Tensor | None = None
    spec: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.clean, ProbeBatch):
            raise HeadLabError("PatchPair.clean must be a ProbeBatch; build pairs with core.tasks.")
        tokens = self.corrupted_tokens
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
            raise HeadLabError("PatchPair.corrupted_tokens must be a torch.long tensor; build pairs with core.tasks.")
        if tuple(tokens.shape) != tuple(self.clean.tokens.shape):
            raise HeadLabError(
                f"the corrupted prompts have shape {tuple(tokens.shape)} but the clean ones "
                f"{tuple(self.clean.tokens.shape)}; patching needs pairs of equal token length."
            )
        target = self.corrupted_target
        if target is not None and (not isinstance(target, torch.Tensor) or target.dtype != torch.long
                                   or tuple(target.shape) != (self.clean.n_examples,)):
            raise HeadLabError(
                f"PatchPair.corrupted_target must be a torch.long tensor of shape [{self.clean.n_examples}], or None."
            )
        if not isinstance(self.spec, dict):
            raise HeadLabError("PatchPair.spec must be a dict describing how the pair was made.")

    @property
    def attention_mask(self) -> torch.Tensor | None:
        """[example, pos] long (1 real, 0 padding) for both sides, or None when nothing is padded."""
        return self.clean.attention_mask

    @property
    def n_examples(self) -> int:
        return self.clean.n_examples

    @property
    def seq_len(self) -> int:
        return self.clean.seq_len

    def corrupted(self) -> ProbeBatch:
        """The corrupted prompts as a batch: same query positions, the corrupted target when there is one."""
        target = self.clean.target if self.corrupted_target is None else self.corrupted_target
        return replace(self.clean, tokens=self.corrupted_tokens, target=target, spec=dict(self.spec))

    def check_contrast(self, metric: str = "logit_diff") -> None:
        """Refuse, before any forward runs, pairs with nothing to contrast: every corrupted prompt equal to its
        clean prompt (both runs are one run), or, for the logit difference, every target the same token as its
        corrupted target (targets sharing their first token, the one scored): the gap is 0 by construction."""
        same_prompt = (self.clean.tokens == self.corrupted_tokens).all(dim=1)  # [example]
        if bool(same_prompt.all()):
            raise HeadLabError(f"every corrupted prompt is the same tokens as its clean prompt ({self.n_examples} "
                               "pairs), so the two runs are one run and patching has nothing to recover; make the "
                               "corrupted prompts differ where the answer is decided.")
        if metric in ("logit_diff", "kl") and self.corrupted_target is not None:
            same_target = self.clean.target == self.corrupted_target  # [example]
            if bool(same_target.all()):
                token = int(self.clean.target[0])
                raise HeadLabError(f"every target is the same token as its corrupted target (e.g. token id {token}; a "
                                   "target of several tokens is scored by its first), so the logit difference is 0 "
                                   "on every pair; give corrupted targets whose first token differs from the target's.")

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a pair whose token ids (either side, targets included) the model cannot read."""
        self.clean.check_vocab(vocab_size)
        self.corrupted().check_vocab(vocab_size)

    def select(self, index: slice | torch.Tensor) -> "PatchPair":
        """The pairs picked by `index` (a slice or a long/bool tensor); spec is kept."""
        target = None if self.corrupted_target is None else self.corrupted_target[index]
        return PatchPair(self.clean.select(index), self.corrupted_tokens[index], target, dict(self.spec))

    def chunks(self, size: int) -> Iterator["PatchPair"]:
        """Consecutive sub-pairs of at most `size` examples, in order (for memory-bounded passes)."""
        if int(size) < 1:
            raise HeadLabError("Chunk size must be at least 1; pass a positive batch size.")
        for start in range(0, self.n_examples, int(size)):
            yield self.select(slice(start, start + int(size)))

    def to(self, device: str | torch.device) -> "PatchPair":
        target = None if self.corrupted_target is None else self.corrupted_target.to(device)
        return PatchPair(self.clean.to(device), self.corrupted_tokens.to(device), target, dict(self.spec))


class ProbeCounterfactual:
    """What every counterfactual spec shares with the probe it corrupts: its size, its vocabulary check, and
    its task name in the JSON. A subclass is a frozen JsonResult dataclass with a `probe` field."""

    task: ClassVar[str]

    @property
    def n_examples(self) -> int:
        return self.probe.n_examples

    @property
    def seq_len(self) -> int:
        return self.probe.seq_len

    def to_json(self) -> dict:
        return {"task": self.task, **super().to_json()}

    def check_vocab(self, vocab_size: int) -> None:
        self.probe.check_vocab(vocab_size)


@dataclass(frozen=True)
class InductionCounterfactualSpec(ProbeCounterfactual, JsonResult):
    """The induction probe and its counterfactual: the earlier A (position p) replaced by another token.

    The replacement is uniform over the probe's token range without A and B, drawn from
    numpy RandomState(seed) in example order, so the clean batch is exactly `probe.build()`.
    """

    task: ClassVar[str] = "induction-counterfactual"
    probe: InductionProbeSpec
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.probe, InductionProbeSpec):
            raise HeadLabError("the counterfactual needs an InductionProbeSpec; build one with probe_spec('induction', ...).")
        object.__setattr__(self, "seed", check_seed(self.seed, "the counterfactual seed"))

    def build(self) -> PatchPair:
        """The clean batch and its corrupted tokens (A at p replaced; A at q and B at p+1 kept)."""
        clean = self.probe.build()
        ids = None if self.probe.vocab is None else runs_ids(self.probe.vocab)  # drawn by index, mapped to the ids
        low, high = (self.probe.token_low, self.probe.token_high) if ids is None else (0, len(ids))
        rng = np.random.RandomState(self.seed)
        corrupted = clean.tokens.clone().numpy()  # [example, pos]
        rows = np.arange(clean.n_examples)
        a = corrupted[rows, clean.duplicate_pos.numpy()]  # the earlier A of each example
        b = clean.target.numpy()
        if ids is not None:
            a, b = np.searchsorted(ids, a), np.searchsorted(ids, b)
        fresh = rng.randint(low, high - 2, size=clean.n_examples)
        lo_ab, hi_ab = np.minimum(a, b), np.maximum(a, b)
        fresh += fresh >= lo_ab  # skip the smaller of A, B ...
        fresh += fresh >= hi_ab  # ... then the larger: uniform over the range without both
        corrupted[rows, clean.duplicate_pos.numpy()] = fresh if ids is None else ids[fresh]
        spec = {"task": self.task, "probe": dict(clean.spec), "seed": self.seed, "rng": "numpy.RandomState",
                "corruption": "the earlier A (duplicate_pos p) replaced by a token other than A and B"}
        return PatchPair(clean, torch.from_numpy(corrupted), None, spec)
