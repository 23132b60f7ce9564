"""Natural text as byte tokens, from `pydoc_data.topics` (ships with Python, about 460k characters of English).

The last 5% of the bytes (one contiguous block) is held out: the zoo trains on "train" only, and
the natural-text probe reads "heldout" only, so the probe never scores memorised text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral
from typing import ClassVar

import numpy as np
import torch
from pydoc_data.topics import topics

from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.probe_batch import ProbeBatch, check_seed
from core.tasks.vocab import BOS

SPLITS = ("train", "heldout")
HELDOUT_FRACTION_DENOMINATOR = 20  # last 1/20 = 5% of the bytes
MIN_TEXT_QUERY_POS = 16  # q >= 16 leaves >= 8 non-special keys (not 0, q, q-1, q-5..q-2, p, p+1) for the null and baseline
MIN_INDUCTION_GAP = 6  # earlier occurrence j satisfies j+1 <= q-6: the induction key is not q-1 nor in q-5..q-2
MIN_TEXT_SEQ_LEN = 24  # room for queries at q >= MIN_TEXT_QUERY_POS
MAX_TEXT_SEQ_LEN = 2048  # the once-before search builds a [T, T] table per window


@lru_cache(maxsize=1)
def _corpus_bytes() -> bytes:
    """All topic texts, values in sorted-key order joined by blank lines, UTF-8 encoded."""
    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def text_split_bounds() -> dict[str, tuple[int, int]]:
    """Byte offsets [start, stop) of each split in the corpus; "heldout" is the last 5%."""
    total = len(_corpus_bytes())
    cut = total - total // HELDOUT_FRACTION_DENOMINATOR
    return {"train": (0, cut), "heldout": (cut, total)}


def text_fingerprint() -> str:
    """Short SHA-256 of the corpus: the text differs between Python versions, so provenance records it."""
    return hashlib.sha256(_corpus_bytes()).hexdigest()[:16]


@lru_cache(maxsize=len(SPLITS))
def _split_tensor(split: str) -> torch.Tensor:
    start, stop = text_split_bounds()[split]
    data = np.frombuffer(_corpus_bytes(), dtype=np.uint8)[start:stop]
    return torch.from_numpy(data.astype(np.int64))


def load_text_bytes(split: str) -> torch.Tensor:
    """Byte tokens (0..255) of one split: [pos] long. A copy, so callers may modify it."""
    if split not in SPLITS:
        raise HeadLabError(f"Unknown text split {split!r}; use one of {', '.join(SPLITS)}.")
    return _split_tensor(split).clone()


@dataclass(frozen=True)
class TextProbeSpec(JsonResult):
    """Parameters of one natural-text probe batch: windows of seq_len tokens (BOS first) from held-out text.

    A ProbeSpec (core.tasks.specs): to_json() is its fields plus "task" and min_query_pos.
    """

    task: ClassVar[str] = "text"
    n_examples: int
    seq_len: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("n_examples", "seq_len", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"Text probe {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        if self.n_examples < 1:
            raise HeadLabError("Text probe n_examples must be at least 1.")
        if not MIN_TEXT_SEQ_LEN <= self.seq_len <= MAX_TEXT_SEQ_LEN:
            raise HeadLabError(
                f"Text probe seq_len must be between {MIN_TEXT_SEQ_LEN} and {MAX_TEXT_SEQ_LEN}; "
                "choose one in that range."
            )
        check_seed(self.seed, "Text probe seed")

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a model whose vocabulary has no room for bytes plus BOS."""
        if BOS >= int(vocab_size):
            raise HeadLabError(
                f"The text probe uses byte tokens and BOS={BOS}, a task the model's vocabulary ({vocab_size} tokens) "
                "cannot hold; use a byte-level model."
            )

    def to_json(self) -> dict:
        # min_query_pos is part of how the batch is built, so it is part of the cache key
        return {"task": self.task, **super().to_json(), "min_query_pos": MIN_TEXT_QUERY_POS}

    def build(self) -> ProbeBatch:
        """Windows from held-out text with one query each (METHODS.md: the natural-text probe).

        Each window is BOS followed by seq_len-1 contiguous held-out bytes, its start uniform (numpy
        RandomState(seed)). The query q is uniform among valid_text_queries(window); a window
        without one is redrawn. target = window[j+1], the byte that followed the earlier occurrence j
        (which need not equal window[q+1]). Bytes after q stay in place: a causal model cannot see them.
        """
        heldout = _split_tensor("heldout").numpy()
        body = self.seq_len - 1
        if body > heldout.shape[0]:
            raise HeadLabError(f"Text probe seq_len must be at most {heldout.shape[0] + 1}, the held-out text length.")
        rng = np.random.RandomState(self.seed)
        tokens = np.empty((self.n_examples, self.seq_len), dtype=np.int64)  # [example, pos]
        query = np.empty(self.n_examples, dtype=np.int64)
        dup = np.empty(self.n_examples, dtype=np.int64)
        max_draws = 100 * self.n_examples + 1000
        filled, draws = 0, 0
        while filled < self.n_examples:
            draws += 1
            if draws > max_draws:
                raise HeadLabError(
                    "Too few held-out windows have a token that occurred exactly once before; use a shorter seq_len."
                )
            start = int(rng.randint(0, heldout.shape[0] - body + 1))
            window = np.concatenate([[BOS], heldout[start : start + body]])
            qs, js = valid_text_queries(window)
            if qs.size == 0:
                continue
            pick = int(rng.randint(qs.size))
            tokens[filled], query[filled], dup[filled] = window, qs[pick], js[pick]
            filled += 1
        dup_t = torch.from_numpy(dup)
        tokens_t = torch.from_numpy(tokens)
        return ProbeBatch(
            tokens=tokens_t,
            query_pos=torch.from_numpy(query),
            target=tokens_t[torch.arange(self.n_examples), dup_t + 1].clone(),
            induction_pos=dup_t + 1,
            duplicate_pos=dup_t,
            spec={
                **self.to_json(),
                "split": "heldout",
                "source": "pydoc_data.topics",
                "text_sha256_16": text_fingerprint(),
                "min_query_pos": MIN_TEXT_QUERY_POS,
                "min_induction_gap": MIN_INDUCTION_GAP,
                "windows_drawn": draws,
                "rng": "numpy.RandomState",
            },
        )


def default_text_probe_spec() -> TextProbeSpec:
    """Matches the zoo's default induction probe size: 256 windows of 64 tokens, seed 42."""
    return TextProbeSpec(n_examples=256, seq_len=64, seed=42)


def valid_text_queries(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query positions q of one window whose token occurred exactly once before, and that occurrence j.

    Kept: q >= MIN_TEXT_QUERY_POS and j + 1 <= q - 6, so the induction key differs from the previous-token key and
    the local window q-5..q-2 (otherwise selectivities for those patterns would be confounded).
    window: [pos] int. Returns (q, j), each [n_valid] int64, q ascending.
    """
    seq_len = window.shape[0]
    same = window[:, None] == window[None, :]  # [q, k]
    earlier = np.tril(same, k=-1)  # k < q only
    count_before = earlier.sum(axis=1)  # [q]
    first_before = earlier.argmax(axis=1)  # [q], the only earlier k where count_before == 1
    pos = np.arange(seq_len)
    ok = (count_before == 1) & (pos >= MIN_TEXT_QUERY_POS) & (first_before + 1 <= pos - MIN_INDUCTION_GAP)
    return pos[ok].astype(np.int64), first_before[ok].astype(np.int64)
