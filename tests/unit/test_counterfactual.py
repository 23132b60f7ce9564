"""The induction probe's counterfactual and PatchPair: structure checked example by example."""

from __future__ import annotations

import json

import pytest
import torch

from core.errors import HeadLabError
from core.tasks import InductionCounterfactualSpec, InductionProbeSpec, PatchPair


def _spec(seed: int = 0, **probe) -> InductionCounterfactualSpec:
    fields = dict(n_examples=64, seq_len=32, token_low=0, token_high=256, seed=7)
    fields.update(probe)
    return InductionCounterfactualSpec(InductionProbeSpec(**fields), seed=seed)


def test_only_the_earlier_a_changes_and_the_query_loses_its_match():
    spec = _spec()
    pair = spec.build()
    clean = pair.clean
    assert torch.equal(clean.tokens, spec.probe.build().tokens)  # the clean side is the probe itself
    assert pair.corrupted_tokens.shape == clean.tokens.shape and pair.corrupted_target is None
    rows = torch.arange(clean.n_examples)
    changed = pair.corrupted_tokens != clean.tokens  # [example, pos]
    assert changed.sum(dim=1).tolist() == [1] * clean.n_examples
    assert changed[rows, clean.duplicate_pos].all()
    a = clean.tokens[rows, clean.query_pos]
    replacement = pair.corrupted_tokens[rows, clean.duplicate_pos]
    assert (replacement != a).all() and (replacement != clean.target).all()
    # A now occurs only at the query, so nothing earlier matches it
    assert ((pair.corrupted_tokens == a[:, None]).sum(dim=1) == 1).all()
    corrupted = pair.corrupted()
    assert torch.equal(corrupted.target, clean.target) and torch.equal(corrupted.query_pos, clean.query_pos)


def test_smallest_token_range_leaves_one_replacement():
    pair = _spec(token_low=10, token_high=13).build()  # A, B and one filler
    rows = torch.arange(pair.n_examples)
    a, b = pair.clean.tokens[rows, pair.clean.query_pos], pair.clean.target
    replacement = pair.corrupted_tokens[rows, pair.clean.duplicate_pos]
    assert (replacement == 10 + 11 + 12 - a - b).all()


def test_counterfactual_is_seeded_and_round_trips():
    first, again, other = _spec(3).build(), _spec(3).build(), _spec(4).build()
    assert torch.equal(first.corrupted_tokens, again.corrupted_tokens)
    assert not torch.equal(first.corrupted_tokens, other.corrupted_tokens)
    spec = _spec(3)
    record = json.loads(json.dumps(spec.to_json()))
    assert record["task"] == "induction-counterfactual" and record["probe"]["task"] == "induction"
    assert InductionCounterfactualSpec.from_json(record) == spec
    assert first.spec["seed"] == 3 and first.spec["probe"]["n_examples"] == 64
    with pytest.raises(HeadLabError, match="seed"):
        InductionCounterfactualSpec(spec.probe, seed=-1)


def test_patch_pair_refuses_unequal_lengths_and_chunks_in_order():
    pair = _spec().build()
    with pytest.raises(HeadLabError, match="equal token length"):
        PatchPair(pair.clean, pair.corrupted_tokens[:, :-1])
    with pytest.raises(HeadLabError, match="corrupted_target"):
        PatchPair(pair.clean, pair.corrupted_tokens, torch.zeros(3, dtype=torch.long))
    chunks = list(pair.chunks(24))
    assert [c.n_examples for c in chunks] == [24, 24, 16]
    assert torch.equal(torch.cat([c.corrupted_tokens for c in chunks]), pair.corrupted_tokens)
    assert torch.equal(torch.cat([c.clean.target for c in chunks]), pair.clean.target)
    with pytest.raises(HeadLabError, match="vocabulary"):
        pair.check_vocab(100)
