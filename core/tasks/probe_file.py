"""Probe files: a researcher's own prompts (JSONL, one record per example) as clean/corrupted pairs.

A record holds `prompt` (text) or `prompt_ids` (token ids), `target` (text or one id), and
optionally `corrupted_prompt` (text or ids), `corrupted_target` (text or id) and `query_pos` (the
position, in the prompt's own tokens, whose next-token prediction is scored; default its last
token). Text is tokenized with the model's own tokenizer (special tokens included, so zoo models
get their BOS); a target of several tokens scores its first token and the pair's notes say so.

Prompts of different lengths are padded to the longest, on the right (default) or the left, with
an attention mask: right padding leaves every real position where it was, left padding lines the
queries up at the last position (the model bridge offsets left-padded rows' positions from the
mask). The pattern positions ProbeBatch carries are found by token identity: p is the latest
earlier occurrence of the query token with p + 1 < q, and induction is p + 1. Where the query
token has no such occurrence, p = first real token and p + 1 = the next one stand in and
spec["pattern_found"] marks that example False; patching and ablation never read these positions.

On a word-level (BPE) tokenizer the spacing of text matters: "... gave a book to " ends with a token of
its own (a lone space), and a target "Mary" is another token than " Mary", the word after a space.
The batch's notes name both (the prompts ending in a space; each target written without its space,
the token it became and the likely intended one). assets/probes/ioi_example.jsonl is written for the
byte-level zoo (prompts end with the space, targets without it); ioi_example_bpe.jsonl is the same
pairs for BPE models (no trailing space, targets " Mary").

The file's SHA-256 is in to_json() (so in every cache key and provenance built from it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any, ClassVar, Union

import torch

from core.choices import PADDING_SIDES
from core.errors import HeadLabError
from core.tasks.counterfactual import PatchPair
from core.tasks.probe_batch import MIN_QUERY_POS, ProbeBatch
from core.tasks.tokens import is_byte_tokenizer, pad_id

FIELDS = ("prompt", "prompt_ids", "target", "corrupted_prompt", "corrupted_target", "query_pos")
Prompt = Union[str, tuple[int, ...]]  # text, or token ids given in the file
Target = Union[str, int]


@dataclass(frozen=True)
class ProbeRecord:
    """One example as written in the file (line: its 1-based line number, for messages)."""

    line: int
    prompt: Prompt
    target: Target
    corrupted_prompt: Prompt | None = None
    corrupted_target: Target | None = None
    query_pos: int | None = None


@dataclass(frozen=True)
class _Encoded:
    """One example's tokens: clean and corrupted ids, targets as ids, the query index in the prompt's own tokens."""

    clean: list[int]
    corrupted: list[int]
    target: int
    corrupted_target: int | None
    query: int
    target_tokens: int  # how many tokens the target text had (only the first is scored)


def _token_ids(value: Any, line: int, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, Integral) and not isinstance(v, bool) for v in value):
        raise HeadLabError(f"probe file line {line}: {what} must be a list of token ids (whole numbers).")
    if not value:
        raise HeadLabError(f"probe file line {line}: {what} is empty; give the prompt's tokens.")
    if min(value) < 0:
        raise HeadLabError(f"probe file line {line}: {what} holds a negative token id.")
    return tuple(int(v) for v in value)


def _prompt(value: Any, line: int, what: str) -> Prompt:
    if isinstance(value, str):
        if not value:
            raise HeadLabError(f"probe file line {line}: the {what} is empty; every example needs a prompt.")
        return value
    return _token_ids(value, line, what)


def _target(value: Any, line: int, what: str) -> Target:
    if isinstance(value, str):
        if not value:
            raise HeadLabError(f"probe file line {line}: the {what} is empty; give the text (or token id) to predict.")
        return value
    if isinstance(value, Integral) and not isinstance(value, bool) and int(value) >= 0:
        return int(value)
    raise HeadLabError(f"probe file line {line}: the {what} must be text or a token id (a whole number >= 0).")


def parse_record(record: Any, line: int) -> ProbeRecord:
    """One JSON object of a probe file as a ProbeRecord, or HeadLabError naming the line and what to fix."""
    if not isinstance(record, dict):
        raise HeadLabError(f"probe file line {line}: expected a JSON object like "
                           '{"prompt": "...", "target": "..."}.')
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise HeadLabError(f"probe file line {line}: unknown field(s) {', '.join(unknown)}; use {', '.join(FIELDS)}.")
    if ("prompt" in record) == ("prompt_ids" in record):
        raise HeadLabError(f"probe file line {line}: give exactly one of prompt (text) and prompt_ids (token ids).")
    if "prompt" in record:
        prompt = _prompt(record["prompt"], line, "prompt")
    else:
        prompt = _token_ids(record["prompt_ids"], line, "prompt_ids")
    if "target" not in record or record["target"] is None:
        raise HeadLabError(f"probe file line {line}: the target is empty; give the text (or token id) to predict.")
    corrupted = record.get("corrupted_prompt")
    corrupted_target = record.get("corrupted_target")
    query = record.get("query_pos")
    if query is not None and (isinstance(query, bool) or not isinstance(query, Integral)):
        raise HeadLabError(f"probe file line {line}: query_pos must be a whole number (a position in the prompt's tokens).")
    return ProbeRecord(line, prompt, _target(record["target"], line, "target"),
                       None if corrupted is None else _prompt(corrupted, line, "corrupted_prompt"),
                       None if corrupted_target is None else _target(corrupted_target, line, "corrupted_target"),
                       None if query is None else int(query))


@dataclass(frozen=True)
class ProbeFile:
    """The parsed examples of one probe file, its name and its content hash.

    A pair spec for patching (like InductionCounterfactualSpec), except that building needs the
    model's tokenizer: build(tokenizer, context_length) -> PatchPair. padding: "right" or "left".
    """

    task: ClassVar[str] = "probe-file"
    name: str
    sha256: str
    records: tuple[ProbeRecord, ...]
    padding: str = "right"

    def __post_init__(self) -> None:
        if self.padding not in PADDING_SIDES:
            raise HeadLabError(f"padding side {self.padding!r} is unknown; use 'right' or 'left'.")

    @property
    def n_examples(self) -> int:
        return len(self.records)

    def to_json(self) -> dict:
        return {"task": self.task, "name": self.name, "sha256": self.sha256, "n_examples": self.n_examples,
                "padding": self.padding}

    def build(self, tokenizer: Any, context_length: int | None = None) -> PatchPair:
        """Clean/corrupted pairs for patching; every record needs a corrupted_prompt of the same token length."""
        missing = [r.line for r in self.records if r.corrupted_prompt is None]
        if missing:
            raise HeadLabError(f"probe file {self.name}: line {missing[0]} has no corrupted_prompt ({len(missing)} of "
                               f"{self.n_examples} lack one); patching compares each prompt with its corrupted twin.")
        with_target = sum(r.corrupted_target is not None for r in self.records)
        if 0 < with_target < self.n_examples:
            line = next(r.line for r in self.records if r.corrupted_target is None)
            raise HeadLabError(f"probe file {self.name}: line {line} has no corrupted_target but other lines do; give "
                               "one on every line (the logit difference target - corrupted target) or on none.")
        encoded = [_encode(r, tokenizer, context_length) for r in self.records]
        batch, corrupted = _assemble(encoded, tokenizer, self.padding, self._spec(encoded, tokenizer))
        target = torch.tensor([e.corrupted_target for e in encoded]) if with_target else None
        return PatchPair(batch, corrupted, target, dict(batch.spec))

    def build_batch(self, tokenizer: Any, context_length: int | None = None) -> ProbeBatch:
        """The clean prompts alone, for ablation (a corrupted_prompt is not needed, nor read)."""
        encoded = [_encode(r, tokenizer, context_length, pair=False) for r in self.records]
        return _assemble(encoded, tokenizer, self.padding, self._spec(encoded, tokenizer))[0]

    def _spec(self, encoded: list[_Encoded], tokenizer: Any) -> dict:
        """The batch's spec: the file's identity and notes, one naming the targets of several tokens (the first 3)."""
        several = [(r, e) for r, e in zip(self.records, encoded) if e.target_tokens > 1]
        notes = []
        if several:
            named = "; ".join(f"line {r.line}: {r.target!r} is {e.target_tokens} tokens, {_decoded(tokenizer, e.target)!r} "
                              "is scored" for r, e in several[:3])
            notes.append(f"{len(several)} of {len(encoded)} targets have several tokens and only the first token of each "
                         f"is scored ({named}{'; ...' if len(several) > 3 else ''}); give one-token targets to score "
                         "exactly what you wrote.")
        return {**self.to_json(), "notes": notes + spacing_notes(self.records, tokenizer)}


def spacing_notes(records: tuple[ProbeRecord, ...], tokenizer: Any) -> list[str]:
    """On a word-level tokenizer: prompts that end with a space, and targets written without the space the
    prompt's next word starts with ("Mary" for " Mary"), each named with the token it became. None on byte tokenizers."""
    if is_byte_tokenizer(tokenizer):
        return []
    notes = []
    trailing = [r.line for r in records if isinstance(r.prompt, str) and r.prompt != r.prompt.rstrip()]
    if trailing:
        notes.append(f"{len(trailing)} of {len(records)} prompts end with a space (line {trailing[0]} first): this "
                     "tokenizer reads the space as a token of its own, so the model is asked what follows a lone space; "
                     'end prompts without it and start each target with it (" Mary"), as assets/probes/'
                     "ioi_example_bpe.jsonl does.")
    unspaced = []
    for record in records:
        if isinstance(record.prompt, str) and record.prompt != record.prompt.rstrip():
            continue  # the prompt carries the space: a target without one is then what was meant
        for target in (record.target, record.corrupted_target):
            if not isinstance(target, str) or target[:1].isspace():
                continue
            became = _ids(target, tokenizer, special=False)[:1]
            spaced = _ids(" " + target, tokenizer, special=False)[:1]
            if became and spaced and became != spaced:
                unspaced.append(f"line {record.line}: {target!r} became token {_decoded(tokenizer, became[0])!r} "
                                f"(id {became[0]}), the word after a space is {_decoded(tokenizer, spaced[0])!r} "
                                f"(id {spaced[0]})")
    if unspaced:
        notes.append(f"{len(unspaced)} targets are written without a leading space ({'; '.join(unspaced[:3])}"
                     f"{'; ...' if len(unspaced) > 3 else ''}); after a prompt that ends with a word, write the target "
                     'with its space (" Mary") to score the word the model would say.')
    return notes


def _decoded(tokenizer: Any, token: int) -> str:
    """One token id as text, for a note (the id itself when the tokenizer cannot decode)."""
    try:
        return str(tokenizer.decode([token]))
    except (AttributeError, TypeError, ValueError):
        return f"token {token}"


def read_probe_file(source: str | Path | bytes, name: str | None = None, padding: str = "right") -> ProbeFile:
    """Parse a JSONL probe file (a path, or its bytes as from an upload); blank lines are skipped.

    padding: the side shorter prompts are padded on ("right" or "left").
    """
    if isinstance(source, (bytes, bytearray)):
        data, name = bytes(source), name or "uploaded probe file"
    else:
        path = Path(source)
        if path.is_dir():
            raise HeadLabError(f"probe file {path} is a folder; give the path of a .jsonl file (one JSON record per line).")
        if path.exists() and not path.is_file():
            raise HeadLabError(f"probe file {path} is not a regular file (a device, pipe or socket); save the records "
                               "to a .jsonl file and give its path.")
        if not path.exists():
            raise HeadLabError(f"probe file {path} does not exist; give the path of a .jsonl file.")
        data, name = path.read_bytes(), name or path.name
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HeadLabError(f"probe file {name} is not UTF-8 text; save it as UTF-8 JSON lines.") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HeadLabError(f"probe file {name} line {number} is not valid JSON ({exc.msg}); write one JSON "
                               "object per line.") from None
        records.append(parse_record(record, number))
    if not records:
        raise HeadLabError(f"probe file {name} holds no examples; write one JSON object per line.")
    return ProbeFile(name, hashlib.sha256(data).hexdigest(), tuple(records), padding)


def _ids(prompt: Prompt, tokenizer: Any, special: bool) -> list[int]:
    return list(prompt) if isinstance(prompt, tuple) else list(tokenizer.encode(prompt, add_special_tokens=special))


def _vocab_size(tokenizer: Any) -> int | None:
    """The tokenizer's token count (ids 0 .. n - 1), or None when it cannot say."""
    try:
        return int(len(tokenizer))
    except TypeError:
        return None


def _check_in_vocab(ids: list[int], tokenizer: Any, line: int, what: str) -> None:
    """Refuse ids given in the file that the model's tokenizer has no token for (the file's ids, not the tokenizer's)."""
    vocab = _vocab_size(tokenizer)
    if vocab is not None and ids and max(ids) >= vocab:
        raise HeadLabError(f"probe file line {line}: {what} holds token id {max(ids)}, outside the model's vocabulary of "
                           f"{vocab} tokens (ids 0 to {vocab - 1}); give ids the model's tokenizer makes, or text.")


def _target_id(target: Target, tokenizer: Any, line: int, what: str) -> tuple[int, int]:
    """(the first token id of the target, how many tokens it has)."""
    if isinstance(target, int):
        _check_in_vocab([target], tokenizer, line, f"the {what}")
        return target, 1
    ids = _ids(target, tokenizer, special=False)
    if not ids:
        raise HeadLabError(f"probe file line {line}: the {what} {target!r} tokenizes to nothing; give another target.")
    return int(ids[0]), len(ids)


def _encode(record: ProbeRecord, tokenizer: Any, context_length: int | None, pair: bool = True) -> _Encoded:
    """One record as token ids, checked: query inside the prompt, prompt inside the context, and (pair: with
    its corrupted prompt, which must have the prompt's token length) pair lengths equal. Without pair the
    corrupted ids are the clean ones (unread)."""
    line = record.line
    clean = _ids(record.prompt, tokenizer, special=True)
    if isinstance(record.prompt, tuple):
        _check_in_vocab(clean, tokenizer, line, "prompt_ids")
    if context_length is not None and len(clean) > int(context_length):
        raise HeadLabError(f"probe file line {line}: the prompt is {len(clean)} tokens, longer than the model's context "
                           f"of {int(context_length)}; shorten it.")
    query = len(clean) - 1 if record.query_pos is None else record.query_pos
    if not 0 <= query < len(clean):
        raise HeadLabError(f"probe file line {line}: query_pos {query} is outside the prompt's {len(clean)} tokens.")
    if query < MIN_QUERY_POS:
        raise HeadLabError(f"probe file line {line}: the query is token {query}; HeadLab needs at least "
                           f"{MIN_QUERY_POS} tokens before it (a longer prompt or a later query_pos).")
    target, n_target = _target_id(record.target, tokenizer, line, "target")
    if not pair:
        return _Encoded(clean, clean, target, None, query, n_target)
    tokens = _ids(record.corrupted_prompt, tokenizer, special=True)
    if isinstance(record.corrupted_prompt, tuple):
        _check_in_vocab(tokens, tokenizer, line, "the corrupted_prompt")
    if len(tokens) != len(clean):
        raise HeadLabError(f"probe file line {line}: the prompt is {len(clean)} tokens but the corrupted_prompt "
                           f"{len(tokens)}; patching needs each pair to have equal token lengths.")
    other, other_n = None, 1
    if record.corrupted_target is not None:
        other, other_n = _target_id(record.corrupted_target, tokenizer, line, "corrupted_target")
    return _Encoded(clean, tokens, target, other, query, max(n_target, other_n))


def _pattern(tokens: list[int], query: int, first: int) -> tuple[int, bool]:
    """p: the latest j < query - 1 with tokens[j] == tokens[query] (True), else the first real token (False)."""
    for j in range(query - 2, -1, -1):
        if tokens[j] == tokens[query]:
            return j, True
    return first, False


def _assemble(encoded: list[_Encoded], tokenizer: Any, padding: str,
              spec: dict) -> tuple[ProbeBatch, torch.Tensor]:
    """Pad every example to the longest: (clean batch, corrupted tokens [example, pos]); the batch carries the
    attention mask when anything is padded."""
    n, seq_len = len(encoded), max(len(e.clean) for e in encoded)
    pad = pad_id(tokenizer)
    clean = torch.full((n, seq_len), pad, dtype=torch.long)
    corrupted = torch.full((n, seq_len), pad, dtype=torch.long)
    mask = torch.zeros((n, seq_len), dtype=torch.long)
    query, dup, found = [], [], []
    for i, e in enumerate(encoded):
        start = 0 if padding == "right" else seq_len - len(e.clean)
        stop = start + len(e.clean)
        clean[i, start:stop] = torch.tensor(e.clean)
        corrupted[i, start:stop] = torch.tensor(e.corrupted)
        mask[i, start:stop] = 1
        p, ok = _pattern(e.clean, e.query, 0)
        query.append(start + e.query)
        dup.append(start + p)
        found.append(ok)
    dup_t = torch.tensor(dup)
    spec = {**spec, "pattern_found": found,
            "pattern_positions": "p = latest earlier occurrence of the query token (p + 1 < q); where there is "
                                 "none (pattern_found False) p is the first real token, a stand-in"}
    batch = ProbeBatch(tokens=clean, query_pos=torch.tensor(query), target=torch.tensor([e.target for e in encoded]),
                       induction_pos=dup_t + 1, duplicate_pos=dup_t, spec=spec,
                       attention_mask=None if bool(mask.all()) else mask)
    return batch, corrupted
