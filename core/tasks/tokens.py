"""Which token ids of a model's own tokenizer a random-token probe may draw: its ordinary tokens.

HeadLab's zoo models read the 260-token byte vocabulary (core/tasks/vocab.py), whose probes draw
bytes 0-255. A pretrained model's tokenizer also holds tokens no text ever puts in a random place:
special and added tokens (SmolLM2's <|endoftext|> and <|im_start|>, Gemma's <bos>, <mask> and 6,242
<unusedN>), and SentencePiece byte-fallback tokens <0x00>..<0xFF> that stand for raw bytes. The
rule here keeps the rest: every id below len(tokenizer) that is neither an added/special token nor
a byte-fallback token. The kept ids are written as sorted runs [low, high) so a spec can record
them compactly (SmolLM2: one run, [17, 49152)), with a fingerprint of the tokenizer beside them;
both enter the cache key.

The tokenizer is duck-typed (a transformers tokenizer): len(), get_vocab(), added_tokens_decoder or
all_special_ids, encode. `tokenizer_of_folder` reads one from a checkpoint folder (transformers is
imported there, when a probe needs a model's tokenizer before the model loads).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import HeadLabError
from core.tasks.vocab import BYTE_VOCAB_SIZE

BYTE_TOKENIZER_NAME = "headlab-byte-vocab"  # name_or_path of core.model.loading.byte_tokenizer
BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")
VOCAB_RULE = "ordinary tokens: ids below len(tokenizer), no added or special token, no <0xNN> byte-fallback token"

TokenRuns = tuple[tuple[int, int], ...]  # sorted, disjoint half-open runs [low, high)


def is_byte_tokenizer(tokenizer: Any) -> bool:
    """True for HeadLab's 260-token byte tokenizer (and for no tokenizer at all): the zoo's byte probes apply."""
    if tokenizer is None:
        return True
    return getattr(tokenizer, "name_or_path", None) == BYTE_TOKENIZER_NAME or _length(tokenizer) == BYTE_VOCAB_SIZE


def _length(tokenizer: Any) -> int:
    try:
        return int(len(tokenizer))
    except TypeError:
        raise HeadLabError("the model's tokenizer cannot say how many tokens it has; use a Hugging Face tokenizer "
                           "(a folder with tokenizer.json).") from None


def excluded_token_ids(tokenizer: Any) -> set[int]:
    """Added or special tokens and <0xNN> byte-fallback tokens: ids a random-token probe must not draw."""
    excluded = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    excluded |= {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
    for token, index in tokenizer.get_vocab().items():
        if BYTE_FALLBACK.fullmatch(token):
            excluded.add(int(index))
    return excluded


def ordinary_token_ids(tokenizer: Any) -> np.ndarray:
    """The tokenizer's ordinary token ids (VOCAB_RULE), sorted: [n_ordinary] int64."""
    n = _length(tokenizer)
    keep = np.ones(n, dtype=bool)
    excluded = [i for i in excluded_token_ids(tokenizer) if 0 <= i < n]
    keep[excluded] = False
    return np.flatnonzero(keep).astype(np.int64)


def id_runs(ids: np.ndarray) -> TokenRuns:
    """Sorted unique ids as runs of consecutive ids [low, high): e.g. [3, 4, 5, 9] -> ((3, 6), (9, 10))."""
    ids = np.unique(np.asarray(ids, dtype=np.int64))
    if ids.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(ids) != 1)
    starts = np.concatenate([[0], breaks + 1])
    stops = np.concatenate([breaks, [ids.size - 1]])
    return tuple((int(ids[a]), int(ids[b]) + 1) for a, b in zip(starts, stops))


def runs_ids(runs: TokenRuns) -> np.ndarray:
    """The ids of sorted runs, in order: [n] int64 (the inverse of id_runs)."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(low, high, dtype=np.int64) for low, high in runs])


def check_runs(runs: Any, what: str) -> TokenRuns:
    """Runs read from a spec (lists from JSON) as a tuple of (low, high) ints, sorted and disjoint, or HeadLabError."""
    try:
        out = tuple((int(low), int(high)) for low, high in runs)
    except (TypeError, ValueError):
        raise HeadLabError(f"{what}: the token runs must be pairs [low, high) of whole numbers.") from None
    previous = -1
    for low, high in out:
        if low < 0 or high <= low or low <= previous:
            raise HeadLabError(f"{what}: the token runs must be sorted, disjoint, non-empty ranges of ids >= 0.")
        previous = high
    return out


def describe_runs(runs: TokenRuns, shown: int = 4) -> str:
    """Runs as short text: '[17, 49152)' or '[5, 6) [106, 168) ... (47 runs, 255,517 ids)'."""
    n_ids = sum(high - low for low, high in runs)
    text = " ".join(f"[{low}, {high})" for low, high in runs[:shown])
    more = f" ... ({len(runs)} runs)" if len(runs) > shown else ""
    return f"{text}{more}, {n_ids:,} ids"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex digits of the SHA-256 of the tokenizer's vocabulary (token -> id, sorted by id) and its excluded ids."""
    vocab = sorted(((int(i), str(t)) for t, i in tokenizer.get_vocab().items()))
    record = {"vocab": vocab, "excluded": sorted(excluded_token_ids(tokenizer))}
    return hashlib.sha256(json.dumps(record, separators=(",", ":")).encode("utf-8")).hexdigest()[:16]


def ordinary_vocab(tokenizer: Any) -> tuple[TokenRuns, str]:
    """(the ordinary ids as runs, the tokenizer's fingerprint): what a random-token spec records for a real model."""
    runs = id_runs(ordinary_token_ids(tokenizer))
    if not runs:
        raise HeadLabError("the model's tokenizer has no ordinary tokens (every id is special, added or a byte "
                           "fallback); give a token range with --token-low and --token-high.")
    return runs, tokenizer_fingerprint(tokenizer)


def special_prefix(tokenizer: Any) -> tuple[int, ...]:
    """The special ids the tokenizer puts before any text (Gemma's <bos>; none for SmolLM2 or no tokenizer)."""
    if tokenizer is None:
        return ()
    plain = list(tokenizer.encode("a", add_special_tokens=False))
    full = list(tokenizer.encode("a", add_special_tokens=True))
    cut = len(full) - len(plain)
    return tuple(int(i) for i in full[:cut]) if cut > 0 and full[cut:] == plain else ()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_tokenizer_files(folder: Path) -> None:
    """Refuse a folder whose tokenizer_config.json names a tokenizer whose files are missing (tokenizer.json deleted)."""
    folder = Path(folder)
    if (folder / "tokenizer_config.json").is_file() and not any(
            (folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise HeadLabError(f"{folder} has tokenizer_config.json but no tokenizer.json (nor tokenizer.model or vocab.json): "
                           "the model's tokenizer is missing; copy tokenizer.json from the model's source (or import it "
                           "again), or remove tokenizer_config.json to read token ids as bytes.")


def tokenizer_of_folder(folder: str | Path, local: bool = True, revision: str | None = None) -> Any:
    """The checkpoint's own tokenizer without its weights, or None for a local folder without tokenizer files (the
    byte-level zoo; load_model gives it the byte tokenizer). local False: a hub name, read from the local cache."""
    if local:
        check_tokenizer_files(Path(folder))
        if not any((Path(folder) / f).is_file() for f in TOKENIZER_FILES):
            return None
    from transformers import AutoTokenizer  # heavy: imported only when a probe needs a real model's tokenizer

    try:
        if not local:  # the local Hugging Face cache only, as the model itself is read
            return AutoTokenizer.from_pretrained(str(folder), revision=revision, local_files_only=True)
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # transformers raises many kinds for a broken or absent tokenizer
        if not local:  # a cached hub model without tokenizer files reads its ids as bytes, as load_model does
            return None
        raise HeadLabError(f"the tokenizer of {folder} cannot be read ({type(exc).__name__}); check its tokenizer.json, "
                           "or give a token range with --token-low and --token-high.") from None


def pad_id(tokenizer: Any) -> int:
    """The id that pads a tokenizer's prompts to one length: its pad token, else its end-of-sequence token, else 0."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0
