"""Structure tests for core.tasks: probe batches, byte text, [HHG] sequences (all hand-checkable)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from core.errors import HeadLabError
from core.stats.selectivity import null_target_positions
from core.tasks import (
    BOS,
    BYTE_VOCAB_SIZE,
    PATTERNS,
    InductionProbeSpec,
    ProbeBatch,
    TextProbeSpec,
    default_zoo_probe_spec,
    load_text_bytes,
    reference_probe_spec,
)
from core.tasks import sequences as seq
from core.tasks.specs import TASKS, TOKENIZER_TASKS, probe_spec, spec_from_json
from core.tasks import text as text_mod
from core.tasks import vocab
from core.tasks.vocab import token_label


# ---------------------------------------------------------------- vocabulary


def test_byte_vocab_layout():
    assert (vocab.BOS, vocab.PAD, vocab.EOS, vocab.SEP, vocab.BYTE_VOCAB_SIZE) == (256, 257, 258, 259, 260)
    assert BYTE_VOCAB_SIZE == 260 and BOS == 256


# ---------------------------------------------------------------- ProbeBatch


def _hand_batch(**overrides) -> ProbeBatch:
    fields = dict(
        tokens=torch.arange(20, dtype=torch.long).reshape(2, 10),
        query_pos=torch.tensor([9, 7]),
        target=torch.tensor([3, 4]),
        induction_pos=torch.tensor([3, 2]),
        duplicate_pos=torch.tensor([2, 1]),
        spec={"task": "hand"},
    )
    fields.update(overrides)
    return ProbeBatch(**fields)


def test_probe_batch_pattern_positions_on_hand_made_batch():
    batch = _hand_batch()
    assert batch.n_examples == 2 and batch.seq_len == 10
    assert batch.pattern_positions("induction").tolist() == [3, 2]
    assert batch.pattern_positions("duplicate-token").tolist() == [2, 1]
    assert batch.pattern_positions("previous-token").tolist() == [8, 6]
    assert batch.pattern_positions("self").tolist() == [9, 7]
    assert batch.pattern_positions("first-token").tolist() == [0, 0]
    assert batch.local_positions().tolist() == [[4, 5, 6, 7], [2, 3, 4, 5]]
    assert PATTERNS == ("induction", "duplicate-token", "previous-token", "self", "first-token", "local")


def test_probe_batch_pattern_errors():
    batch = _hand_batch()
    with pytest.raises(HeadLabError, match="local_positions"):
        batch.pattern_positions("local")
    with pytest.raises(HeadLabError, match="Unknown pattern"):
        batch.pattern_positions("bogus")


@pytest.mark.parametrize(
    "overrides",
    [
        {"query_pos": torch.tensor([9])},  # wrong length
        {"query_pos": torch.tensor([10, 7])},  # past the end
        {"query_pos": torch.tensor([4, 7])},  # too early for the local window
        {"induction_pos": torch.tensor([4, 2])},  # not duplicate_pos + 1
        {"induction_pos": torch.tensor([9, 2]), "duplicate_pos": torch.tensor([8, 1])},  # induction key == query
        {"duplicate_pos": torch.tensor([-1, 1]), "induction_pos": torch.tensor([0, 2])},
        {"target": torch.tensor([3.0, 4.0])},  # not long
        {"tokens": torch.arange(10, dtype=torch.long)},  # not 2-D
    ],
)
def test_probe_batch_validation(overrides):
    with pytest.raises(HeadLabError):
        _hand_batch(**overrides)


def test_probe_batch_chunks_and_to():
    batch = InductionProbeSpec(n_examples=7, seq_len=16, token_low=0, token_high=50, seed=1).build()
    parts = list(batch.chunks(3))
    assert [p.n_examples for p in parts] == [3, 3, 1]
    assert torch.equal(torch.cat([p.tokens for p in parts]), batch.tokens)
    assert torch.equal(torch.cat([p.duplicate_pos for p in parts]), batch.duplicate_pos)
    assert parts[1].spec == batch.spec
    moved = batch.to("cpu")
    assert torch.equal(moved.target, batch.target) and moved.device.type == "cpu"
    with pytest.raises(HeadLabError):
        list(batch.chunks(0))


# ---------------------------------------------------------------- induction probe


def _check_induction_structure(batch: ProbeBatch, spec: InductionProbeSpec) -> None:
    n, t = spec.n_examples, spec.seq_len
    assert batch.tokens.shape == (n, t) and batch.tokens.dtype == torch.long
    q = t - 1
    assert (batch.query_pos == q).all()
    p_low, p_high = spec.p_range
    for i in range(n):
        row = batch.tokens[i]
        p = int(batch.duplicate_pos[i])
        a, b = int(row[q]), int(row[p + 1])
        assert p_low <= p < p_high
        assert int(batch.induction_pos[i]) == p + 1
        assert int(row[p]) == a and int(batch.target[i]) == b
        assert a != b
        assert torch.nonzero(row == a).flatten().tolist() == [p, q]  # A exactly twice
        assert torch.nonzero(row == b).flatten().tolist() == [p + 1]  # B exactly once
    assert int(batch.tokens.min()) >= spec.token_low and int(batch.tokens.max()) < spec.token_high


def test_induction_probe_structure_zoo_default():
    spec = default_zoo_probe_spec()
    assert (spec.n_examples, spec.seq_len, spec.token_low, spec.token_high, spec.seed) == (256, 64, 0, 256, 42)
    assert spec.p_range == (20, 32)
    batch = spec.build()
    _check_induction_structure(batch, spec)
    # p is spread over its whole range, not stuck at one value
    assert set(batch.duplicate_pos.tolist()) == set(range(20, 32))


def test_induction_probe_tiny_token_range_has_no_stray_a_or_b():
    # With 3 tokens, A and B are replaced everywhere else, so all fillers equal the third token.
    spec = InductionProbeSpec(n_examples=20, seq_len=30, token_low=5, token_high=8, seed=3)
    batch = spec.build()
    _check_induction_structure(batch, spec)
    for i in range(spec.n_examples):
        row = batch.tokens[i]
        a, b = int(batch.target[i]), int(row[-1])
        third = ({5, 6, 7} - {a, b}).pop()
        mask = torch.ones(30, dtype=torch.bool)
        mask[[int(batch.duplicate_pos[i]), int(batch.induction_pos[i]), 29]] = False
        assert (row[mask] == third).all()


@pytest.mark.parametrize(
    "seq_len,expected", [(8, (2, 4)), (40, (10, 20)), (43, (10, 21)), (44, (20, 22)), (256, (20, 128))]
)
def test_induction_small_t_rule(seq_len, expected):
    spec = InductionProbeSpec(n_examples=30, seq_len=seq_len, token_low=0, token_high=100, seed=0)
    assert spec.p_range == expected
    _check_induction_structure(spec.build(), spec)


def test_induction_probe_seeded():
    spec = InductionProbeSpec(n_examples=16, seq_len=32, token_low=0, token_high=256, seed=7)
    one, two = spec.build(), spec.build()
    assert torch.equal(one.tokens, two.tokens) and torch.equal(one.duplicate_pos, two.duplicate_pos)
    other = InductionProbeSpec(16, 32, 0, 256, seed=8).build()
    assert not torch.equal(one.tokens, other.tokens)


def test_reference_spec_and_json_round_trip():
    spec = reference_probe_spec()
    assert (spec.n_examples, spec.seq_len, spec.token_low, spec.token_high) == (2000, 256, 100, 10000)
    assert InductionProbeSpec.from_json(spec.to_json()) == spec
    assert default_zoo_probe_spec().build().spec["task"] == "induction"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_examples=0, seq_len=64, token_low=0, token_high=256, seed=0),
        dict(n_examples=4, seq_len=7, token_low=0, token_high=256, seed=0),
        dict(n_examples=4, seq_len=64, token_low=10, token_high=12, seed=0),
        dict(n_examples=4, seq_len=64, token_low=-1, token_high=256, seed=0),
        dict(n_examples=4, seq_len=64, token_low=0, token_high=256, seed=-1),
        dict(n_examples=4.5, seq_len=64, token_low=0, token_high=256, seed=0),
    ],
)
def test_induction_spec_errors(kwargs):
    with pytest.raises(HeadLabError):
        InductionProbeSpec(**kwargs)


def test_induction_check_vocab():
    spec = default_zoo_probe_spec()
    spec.check_vocab(260)
    spec.check_vocab(256)
    with pytest.raises(HeadLabError, match="vocabulary"):
        spec.check_vocab(104)


# ---------------------------------------------------------------- natural text


def test_text_split_sizes_and_disjointness():
    corpus = text_mod._corpus_bytes()
    train, held = load_text_bytes("train"), load_text_bytes("heldout")
    assert len(train) + len(held) == len(corpus)
    assert len(held) == len(corpus) // 20
    assert 0.049 < len(held) / len(corpus) <= 0.05
    cut = len(train)
    assert bytes(train.tolist()) == corpus[:cut] and bytes(held.tolist()) == corpus[cut:]
    assert text_mod.text_split_bounds() == {"train": (0, cut), "heldout": (cut, len(corpus))}
    assert int(train.min()) >= 0 and int(train.max()) <= 255


def test_load_text_bytes_returns_a_copy_and_rejects_bad_split():
    held = load_text_bytes("heldout")
    first = int(held[0])
    held[0] = 999
    assert int(load_text_bytes("heldout")[0]) == first
    with pytest.raises(HeadLabError, match="split"):
        load_text_bytes("test")


def test_valid_text_queries_on_hand_made_window():
    assert text_mod.MIN_TEXT_QUERY_POS == 16
    # pos:  0    1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17  18  19  20
    window = np.array([BOS, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 11, 21, 22, 23, 24, 10, 30, 10, 24])
    q, j = text_mod.valid_text_queries(window)
    # q=12: 11 seen once (at 2) but q < 16. q=17: 10 seen once (at 1), gap ok. q=19: 10 seen twice.
    # q=20: 24 seen once at 16 but 16+1 > 20-6.
    assert q.tolist() == [17] and j.tolist() == [1]


def test_every_text_query_leaves_keys_for_the_null():
    batch = TextProbeSpec(n_examples=64, seq_len=24, seed=3).build()  # short windows: q near the minimum
    draws = null_target_positions(batch.query_pos, batch.induction_pos, batch.duplicate_pos, n_draws=5)
    assert draws.shape == (5, 64)
    assert TextProbeSpec(4, 24, 3).to_json()["min_query_pos"] == 16  # part of the cache key


def test_text_probe_structure():
    spec = TextProbeSpec(n_examples=40, seq_len=48, seed=5)
    batch = spec.build()
    held = bytes(load_text_bytes("heldout").tolist())
    assert batch.tokens.shape == (40, 48)
    assert (batch.tokens[:, 0] == BOS).all()
    assert int(batch.tokens[:, 1:].max()) <= 255
    for i in range(spec.n_examples):
        row = batch.tokens[i]
        q, j = int(batch.query_pos[i]), int(batch.duplicate_pos[i])
        assert text_mod.MIN_TEXT_QUERY_POS <= q <= 47
        assert torch.nonzero(row[:q] == row[q]).flatten().tolist() == [j]  # occurred exactly once before, at j
        assert int(batch.induction_pos[i]) == j + 1 <= q - 6
        assert int(batch.target[i]) == int(row[j + 1])
        assert bytes(row[1:].tolist()) in held  # windows come from the held-out split
    assert batch.spec["split"] == "heldout" and batch.spec["task"] == "text"


def test_text_probe_seeded():
    spec = TextProbeSpec(n_examples=10, seq_len=32, seed=1)
    one, two = spec.build(), spec.build()
    assert torch.equal(one.tokens, two.tokens) and torch.equal(one.query_pos, two.query_pos)
    other = TextProbeSpec(n_examples=10, seq_len=32, seed=2).build()
    assert not torch.equal(one.tokens, other.tokens)
    assert TextProbeSpec.from_json(spec.to_json()) == spec


def test_text_spec_errors():
    bad = (
        dict(n_examples=0, seq_len=64, seed=0),
        dict(n_examples=4, seq_len=8, seed=0),
        dict(n_examples=4, seq_len=64, seed=-3),
    )
    for kwargs in bad:
        with pytest.raises(HeadLabError):
            TextProbeSpec(**kwargs)
    TextProbeSpec(4, 64, 0).check_vocab(260)
    with pytest.raises(HeadLabError, match="vocabulary"):
        TextProbeSpec(4, 64, 0).check_vocab(104)


# ---------------------------------------------------------------- the probe spec protocol


@pytest.mark.parametrize("task", [t for t in TASKS if t not in TOKENIZER_TASKS])
def test_probe_spec_round_trips_through_every_json_shape(task):
    """spec_from_json reads a spec's to_json, its batch's spec (with provenance keys) and a JSON string (ioi, built
    from a tokenizer: tests/unit/test_real_tokenizer_tasks.py)."""
    spec = probe_spec(task, n_examples=6, seq_len=32, seed=3)
    assert spec.task == task and spec.to_json()["task"] == task
    batch = spec.build()
    assert batch.n_examples == 6 and batch.seq_len == 32 and batch.spec["task"] == task
    assert spec_from_json(spec.to_json()) == spec
    assert spec_from_json(batch.spec) == spec
    assert spec_from_json(json.dumps(spec.to_json(), sort_keys=True)) == spec
    assert torch.equal(spec_from_json(batch.spec).build().tokens, batch.tokens)


def test_probe_spec_defaults_and_errors():
    assert probe_spec("induction") == default_zoo_probe_spec()
    assert probe_spec("text") == TextProbeSpec(256, 64, 42)
    assert probe_spec("induction", 8, 32, 1, 100, 200).token_high == 200
    with pytest.raises(HeadLabError, match="unknown probe task"):
        probe_spec("copy")
    with pytest.raises(HeadLabError, match="unknown probe task"):
        spec_from_json({"task": "copy", "n_examples": 4})
    with pytest.raises(HeadLabError, match="malformed"):
        spec_from_json({"task": "induction", "n_examples": 4})
    with pytest.raises(HeadLabError):
        spec_from_json({"task": "text", "n_examples": 4, "seq_len": 8, "seed": 0})  # too short: validated


def test_probe_batch_check_vocab():
    batch = _hand_batch()  # tokens 0..19, targets 3 and 4
    batch.check_vocab(20)
    with pytest.raises(HeadLabError, match="vocabulary"):
        batch.check_vocab(19)
    with pytest.raises(HeadLabError, match="vocabulary"):
        _hand_batch(target=torch.tensor([3, 25])).check_vocab(20)


def test_token_label():
    assert [token_label(t) for t in (65, 32, 10, 256, 259, 300)] == ["A", "␣", "\\x0a", "<bos>", "<sep>", "300"]


# ---------------------------------------------------------------- [HHG] sequences


def _parse(row: torch.Tensor) -> tuple[list[int], list[int]]:
    row = row.tolist()
    sep, end = row.index(seq.SEP), row.index(seq.END)
    return row[1:sep], row[sep + 1 : end]


def test_sequence_constants():
    assert seq.SEQ_VOCAB_SIZE == 104
    assert (seq.PAD, seq.START, seq.SEP, seq.END) == (0, 100, 101, 102)
    assert list(seq.TRAIN_LENGTHS) == [3, 4, 5, 6, 7] and list(seq.OOD_LENGTHS) == [8, 9, 10, 11]


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_sequence_format_answers_padding_and_mask(task):
    tokens, mask = seq.make_sequence_batch(task, seq.TRAIN_LENGTHS, 200, 0)
    assert tokens.shape == (200, 2 * 7 + 3) and mask.shape == tokens.shape and mask.dtype == torch.bool
    seen_lengths = set()
    for i in range(200):
        row = tokens[i]
        x, y = _parse(row)
        n = len(x)
        seen_lengths.add(n)
        assert int(row[0]) == seq.START and len(y) == n
        assert all(1 <= v <= 99 for v in x)
        assert y == (x[::-1] if task == "reverse" else sorted(x))
        assert (row[2 * n + 3 :] == seq.PAD).all() and not (row[: 2 * n + 3] == seq.PAD).any()
        expected = torch.zeros(tokens.shape[1], dtype=torch.bool)
        expected[n + 1 : 2 * n + 2] = True  # SEP .. yn: the next token is y1 .. yn or END
        assert torch.equal(mask[i], expected)
        assert row[1:][mask[i][:-1]].tolist() == y + [seq.END]
    assert seen_lengths == set(seq.TRAIN_LENGTHS)


def test_sequence_reference_layout_on_hand_checked_rows():
    """The [HHG] reference code's layout: input START x SEP and answer y END padded separately (m = 7)."""
    tokens, mask = seq.make_sequence_batch("reverse", [3, 7], 64, 0, layout="reference")
    headlab, _ = seq.make_sequence_batch("reverse", [3, 7], 64, 0)
    assert tokens.shape == headlab.shape == (64, 17)
    short = int(torch.nonzero(headlab[:, 4] == seq.SEP)[0])  # a 3-number sample, the same draw in both layouts
    a, b, c = headlab[short, 1:4].tolist()
    P, S, E = seq.PAD, seq.SEP, seq.END
    assert tokens[short].tolist() == [seq.START, a, b, c, S, P, P, P, P, c, b, a, E, P, P, P, P]
    assert torch.nonzero(mask[short]).flatten().tolist() == [8, 9, 10, 11]  # column 8 (a PAD) predicts y1
    full = int(torch.nonzero(headlab[:, 8] == seq.SEP)[0])  # a 7-number sample: no padding, both layouts agree
    assert torch.equal(tokens[full], headlab[full])
    assert row_targets(tokens[full], mask[full]) == headlab[full, 9:16].tolist() + [E]
    assert row_targets(tokens[short], mask[short]) == [c, b, a, E]
    with pytest.raises(HeadLabError, match="headlab, reference"):
        seq.make_sequence_batch("reverse", 3, 4, 0, layout="padded")


def row_targets(row: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """The tokens the masked positions predict (the next token of each)."""
    return row[1:][mask[:-1]].tolist()


def test_sequence_batch_seeded_and_generator():
    a = seq.make_sequence_batch("sort", 5, 8, 3)
    b = seq.make_sequence_batch("sort", 5, 8, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], seq.make_sequence_batch("sort", 5, 8, 4)[0])
    s1, s2 = seq.sequence_training_batch("reverse", 10, 16, 0), seq.sequence_training_batch("reverse", 10, 16, 0)
    assert torch.equal(s1[0], s2[0]) and torch.equal(s1[1], s2[1])
    assert not torch.equal(s1[0], seq.sequence_training_batch("reverse", 11, 16, 0)[0])
    assert not torch.equal(s1[0], seq.sequence_training_batch("reverse", 10, 16, 1)[0])


def test_sequence_errors():
    with pytest.raises(HeadLabError, match="reverse, sort"):
        seq.make_sequence_batch("copy", 3, 4, 0)
    for bad in (0, 41, [], [3, 0], -2):
        with pytest.raises(HeadLabError):
            seq.make_sequence_batch("reverse", bad, 4, 0)
    with pytest.raises(HeadLabError):
        seq.make_sequence_batch("reverse", 3, 0, 0)


def _oracle(task: str, corrupt=None):
    """A perfect next-token predictor for prompts START x SEP (+ generated), as one-hot logits."""

    def logits_fn(tokens: torch.Tensor) -> torch.Tensor:
        batch, pos = tokens.shape
        logits = torch.zeros(batch, pos, seq.SEQ_VOCAB_SIZE)
        for i in range(batch):
            row = tokens[i].tolist()
            sep = row.index(seq.SEP)
            x = torch.tensor([row[1:sep]])
            answer = seq.sequence_answer(task, x)[0].tolist() + [seq.END]
            k = pos - (sep + 1)
            nxt = answer[k] if k < len(answer) else seq.PAD
            if corrupt is not None:
                nxt = corrupt(row, k, nxt)
            logits[i, -1, nxt] = 1.0
        return logits

    return logits_fn


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_exact_match_with_oracle_and_broken_models(task):
    assert seq.exact_match_accuracy(_oracle(task), task, 9, 30, seed=0, batch_size=7) == 1.0
    # The answer is right but END is missing: never an exact match.
    no_end = _oracle(task, lambda row, k, nxt: seq.PAD if nxt == seq.END else nxt)
    assert seq.exact_match_accuracy(no_end, task, 4, 30, seed=0) == 0.0
    # The other task's oracle is right exactly on the examples where reverse(x) == sort(x).
    other = "sort" if task == "reverse" else "reverse"
    tokens, _ = seq.make_sequence_batch(task, 6, 30, 1)
    x = tokens[:, 1:7]
    same = (seq.sequence_answer("reverse", x) == seq.sequence_answer("sort", x)).all(dim=1)
    per = seq.exact_match_per_example(_oracle(other), task, 6, 30, seed=1)
    assert torch.equal(per, same)


def test_exact_match_per_example_known_answer():
    # Wrong exactly on examples whose first input number is odd (it emits 1 instead of y1 there).
    def corrupt(row, k, nxt):
        return 1 if (k == 0 and row[1] % 2 == 1 and nxt != 1) else nxt

    per = seq.exact_match_per_example(_oracle("reverse", corrupt), "reverse", 5, 40, seed=2)
    tokens, _ = seq.make_sequence_batch("reverse", 5, 40, 2)
    x1, y1 = tokens[:, 1], tokens[:, 7]
    expected = (x1 % 2 == 0) | (y1 == 1)
    assert per.dtype == torch.bool and torch.equal(per, expected)
    assert seq.exact_match_accuracy(_oracle("reverse", corrupt), "reverse", 5, 40, seed=2) == pytest.approx(
        expected.float().mean().item()
    )


def test_greedy_decode_appends_argmax():
    # A model that always predicts (last token + 1): from prompt [100, 5, 101] it emits 102, 103, 104.
    def plus_one(tokens):
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 200)
        logits[torch.arange(tokens.shape[0]), -1, tokens[:, -1] + 1] = 1.0
        return logits

    out = seq.greedy_decode(plus_one, torch.tensor([[100, 5, 101], [100, 7, 50]]), n_out=2)
    assert out.tolist() == [[102, 103, 104], [51, 52, 53]]


def test_choose_ood_length():
    assert seq.choose_ood_length({8: 0.9, 9: 0.6, 10: 0.3, 11: 0.1}) == 9
    assert seq.choose_ood_length({8: 0.75, 9: 0.5}) == 8  # band is inclusive
    assert seq.choose_ood_length({8: 0.2}) == 8
    assert seq.choose_ood_length({8: 0.9, 9: 0.8, 10: 0.19, 11: 0.0}) is None
    assert seq.choose_ood_length({7: 0.5, 12: 0.5}) is None  # only 8..11 count
    assert seq.choose_ood_length({9: 0.9, 10: 0.5}, low=0.6, high=0.95) == 9
    with pytest.raises(HeadLabError):
        seq.choose_ood_length({8: 0.5}, low=0.8, high=0.2)
