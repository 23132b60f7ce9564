"""Probe files (core/tasks/probe_file.py): parsing, tokenizing with the model's tokenizer, padding and its mask,
pattern positions by token identity, and one clear error per kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import HeadLabError
from core.model.loading import byte_tokenizer
from core.tasks.probe_file import read_probe_file

EXAMPLE = Path(__file__).resolve().parents[2] / "assets" / "probes" / "ioi_example.jsonl"
TOKENIZER = byte_tokenizer(add_bos=True)  # the zoo's: BOS 256 first, then one token per byte; PAD 257


def _file(*records) -> bytes:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records).encode()


PAIRS = _file(
    {"prompt": "abcdefab", "target": "cd", "corrupted_prompt": "xbcdefab", "corrupted_target": "x"},
    "",  # blank lines are skipped
    {"prompt_ids": [256, 5, 6, 7, 8, 9, 10, 11, 12, 13], "target": 14, "corrupted_prompt": [256, 5, 6, 7, 8, 9, 10, 11, 12, 99],
     "corrupted_target": 15, "query_pos": 8},
)


def test_right_padding_keeps_positions_and_masks_the_tail():
    pair = read_probe_file(PAIRS, "pairs").build(TOKENIZER, 64)
    clean = pair.clean
    assert clean.tokens.tolist()[0] == [256, *b"abcdefab", 257]  # BOS from the tokenizer, one PAD on the right
    assert pair.corrupted_tokens.tolist()[0] == [256, *b"xbcdefab", 257]
    assert pair.attention_mask.tolist() == [[1] * 9 + [0], [1] * 10]
    assert clean.query_pos.tolist() == [8, 8]  # default: the last prompt token; else query_pos
    assert clean.target.tolist() == [ord("c"), 14] and pair.corrupted_target.tolist() == [ord("x"), 15]
    # the query "b" (pos 8) occurred at pos 2: p = 2, p + 1 = 3; the ids row's query 12 never occurred before
    assert clean.duplicate_pos.tolist() == [2, 0] and clean.induction_pos.tolist() == [3, 1]
    assert clean.spec["pattern_found"] == [True, False]
    assert clean.spec["notes"] == ["1 of 2 targets have several tokens and only the first token of each is scored "
                                   "(line 1: 'cd' is 2 tokens, 'c' is scored); give one-token targets to score exactly "
                                   "what you wrote."]


def test_left_padding_lines_the_queries_up_and_masks_the_head():
    pair = read_probe_file(PAIRS, "pairs", padding="left").build(TOKENIZER, 64)
    assert pair.clean.tokens.tolist()[0] == [257, 256, *b"abcdefab"]
    assert pair.attention_mask.tolist() == [[0] + [1] * 9, [1] * 10]
    assert pair.clean.query_pos.tolist() == [9, 8] and pair.clean.duplicate_pos.tolist() == [3, 0]
    assert pair.select(slice(0, 1)).attention_mask.tolist() == [[0] + [1] * 9]  # the mask follows the rows


def test_hash_names_the_content_and_the_example_file_builds():
    one, two = read_probe_file(PAIRS), read_probe_file(PAIRS + b"\n")
    assert one.to_json()["sha256"] != two.to_json()["sha256"]  # the cache key changes with the file
    assert one.to_json()["padding"] == "right" and one.n_examples == 2
    example = read_probe_file(EXAMPLE).build(TOKENIZER, 64)
    assert example.n_examples == 8 and example.corrupted_target is not None
    assert bool((example.clean.tokens != example.corrupted_tokens).any())


@pytest.mark.parametrize("records, message", [
    ([{"prompt": "abcdefgh", "target": ""}], "line 1: the target is empty"),
    ([{"prompt": "abcdefgh"}], "line 1: the target is empty"),
    ([{"prompt": "abcdefgh", "target": "a", "corrupted_prompt": "b"}, {"prompt": "", "target": "a"}],
     "line 2: the prompt is empty"),
    ([{"prompt_ids": [], "target": 3}], "line 1: prompt_ids is empty"),
    (['{"prompt": "abcdefgh", "target": "a"}', '{"prompt": "abc'], "line 2 is not valid JSON"),
    (["[1, 2]"], "line 1: expected a JSON object"),
    ([{"prompt": "abcdefgh", "target": "a", "answer": "b"}], "unknown field(s) answer"),
    ([{"prompt": "abcdefgh", "prompt_ids": [1], "target": "a"}], "exactly one of prompt"),
    ([{"prompt": "abcdefgh", "target": True}], "the target must be text or a token id"),
    ([], "holds no examples"),
])
def test_malformed_files_are_refused_naming_the_line(records, message):
    with pytest.raises(HeadLabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_probe_file(_file(*records))


@pytest.mark.parametrize("record, context, message", [
    ({"prompt": "abcdefgh", "target": "a", "corrupted_prompt": "abcdefghi"}, 64,
     "line 1: the prompt is 9 tokens but the corrupted_prompt 10; patching needs each pair to have equal token lengths"),
    ({"prompt": "a" * 20, "target": "a", "corrupted_prompt": "b" * 20}, 16,
     "line 1: the prompt is 21 tokens, longer than the model's context of 16"),
    ({"prompt": "abc", "target": "a", "corrupted_prompt": "abd"}, 64, "line 1: the query is token 3"),
    ({"prompt": "abcdefgh", "target": "a", "corrupted_prompt": "abcdefgi", "query_pos": 9}, 64,
     "line 1: query_pos 9 is outside the prompt's 9 tokens"),
    ({"prompt": "abcdefgh", "target": "a"}, 64, "line 1 has no corrupted_prompt"),
])
def test_pairs_that_cannot_be_patched_are_refused_naming_the_line(record, context, message):
    with pytest.raises(HeadLabError, match=message):
        read_probe_file(_file(record)).build(TOKENIZER, context)


def test_corrupted_targets_on_some_lines_only_and_bad_padding_are_refused():
    mixed = _file({"prompt": "abcdefgh", "target": "a", "corrupted_prompt": "abcdefgi", "corrupted_target": "b"},
                  {"prompt": "abcdefgh", "target": "a", "corrupted_prompt": "abcdefgj"})
    with pytest.raises(HeadLabError, match="line 2 has no corrupted_target"):
        read_probe_file(mixed).build(TOKENIZER, 64)
    with pytest.raises(HeadLabError, match="padding side 'middle'"):
        read_probe_file(mixed, padding="middle")
    with pytest.raises(HeadLabError, match="does not exist"):
        read_probe_file(Path("/nonexistent/probe.jsonl"))
    with pytest.raises(HeadLabError, match="not UTF-8"):
        read_probe_file(b"\xff\xfe{")
