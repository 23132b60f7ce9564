"""The zoo's induction-rich training stream, and the two training-time induction measurements.

Recipe (TRAINING-NOTES.md): "repeat" sequences (BOS, random bytes, then a random chunk of 8-32
bytes, or 8 to `chunk_max`, repeated until the sequence ends) teach induction fast; "text" windows
of pydoc_data.topics teach ordinary next-byte statistics (and so other head roles); "mixture" is
50/50 per sequence.
The models start on pure "repeat" data for the first W steps (`schedule`), which is what makes
induction form within the quick budget.

"shifted" is the different distribution for the data-shift claim ([SPC]: continued training on
another corpus). It keeps the repeat half unchanged and swaps the natural-text corpus: English
prose (pydoc topics) becomes Python source code (a fixed list of standard-library modules of the
running Python, read from disk), so the shift is in the corpus, as in the paper. "code" is that
corpus alone (BOS + windows), like "text" for pydoc topics.

Every batch is a pure function of (seed, step), so a resumed run sees exactly the batches an
uninterrupted one would.
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path
from typing import Callable

import torch

from core.errors import HeadLabError
from core.tasks.text import load_text_bytes
from core.tasks.vocab import BOS, N_BYTES

KINDS = ("repeat", "text", "mixture", "shifted", "code")
CHUNK_MIN, CHUNK_MAX = 8, 32  # default repeated chunk length range of "repeat" sequences (inclusive)
MAX_INDUCTION_HALF_LEN = 31  # induction trained on 8-32 chunks reaches ~32 tokens back
CODE_FILES = (
    "argparse.py", "dataclasses.py", "enum.py", "functools.py",
    "inspect.py", "pathlib.py", "textwrap.py", "typing.py",
)
CODE_HELDOUT_FRACTION = 0.05


def batch_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """A generator seeded from (seed, step, salt) only: same inputs, same draws, on any run."""
    mixed = (int(seed) * 1_000_003 + int(step) * 7_919 + int(salt) * 104_729 + 12_345) % (2**62)
    return torch.Generator().manual_seed(mixed)


def schedule(step: int, repeat_warmup_steps: int, kind: str = "mixture") -> str:
    """The data kind at `step`: pure "repeat" for the first `repeat_warmup_steps` steps, then `kind`."""
    return "repeat" if step < repeat_warmup_steps else kind


def training_batch(
    kind: str, step: int, batch_size: int, seq_len: int, seed: int, repeat_fraction: float = 0.5,
    chunk_max: int = CHUNK_MAX,
) -> torch.Tensor:
    """One training batch of byte tokens, every row starting with BOS; deterministic in (seed, step).

    `repeat_fraction`: for "mixture" and "shifted", the chance that a row is a repeat sequence.
    `chunk_max`: the longest repeated chunk (induction learns to reach about this far back).
    Returns tokens: LongTensor [batch, seq_len].
    """
    if kind not in KINDS:
        raise HeadLabError(f"Unknown training data kind {kind!r}; choose one of {', '.join(KINDS)}.")
    if seq_len < 2 * CHUNK_MIN + 1:
        raise HeadLabError(f"Training seq_len must be at least {2 * CHUNK_MIN + 1} to hold a repeated chunk.")
    if chunk_max < CHUNK_MIN:
        raise HeadLabError(f"The longest repeated chunk must be at least {CHUNK_MIN} bytes; got {chunk_max}.")
    gen = batch_generator(seed, step)
    rows = []
    for _ in range(batch_size):
        if kind == "repeat":
            rows.append(_repeat_row(gen, seq_len, chunk_max))
        elif kind == "text":
            rows.append(_text_row(gen, seq_len, _text_corpus("train")))
        elif kind == "code":
            rows.append(_text_row(gen, seq_len, _code_corpus("train")))
        else:
            # One coin per row, drawn before the row, so the row kinds are part of the pure function.
            use_text = bool(torch.rand((), generator=gen) >= repeat_fraction)
            if not use_text:
                rows.append(_repeat_row(gen, seq_len, chunk_max))
            elif kind == "mixture":
                rows.append(_text_row(gen, seq_len, _text_corpus("train")))
            else:  # shifted: Python source instead of English prose
                rows.append(_text_row(gen, seq_len, _code_corpus("train")))
    return torch.stack(rows)  # [batch, seq_len]


def _repeat_row(gen: torch.Generator, seq_len: int, chunk_max: int = CHUNK_MAX) -> torch.Tensor:
    """BOS, a random-byte prefix, then a random chunk of 8..chunk_max bytes repeated until the end."""
    chunk_len = int(torch.randint(CHUNK_MIN, chunk_max + 1, (), generator=gen))
    body = seq_len - 1
    max_prefix = max(0, body - 2 * chunk_len)  # leave room for two copies when possible
    prefix_len = int(torch.randint(0, max_prefix + 1, (), generator=gen))
    prefix = torch.randint(0, N_BYTES, (prefix_len,), generator=gen)
    chunk = torch.randint(0, N_BYTES, (chunk_len,), generator=gen)
    n_copies = -(-(body - prefix_len) // chunk_len)
    repeated = chunk.repeat(n_copies)[: body - prefix_len]
    return torch.cat([torch.tensor([BOS]), prefix, repeated])  # [seq_len]


def _text_row(gen: torch.Generator, seq_len: int, corpus: torch.Tensor) -> torch.Tensor:
    """BOS + a random window of seq_len-1 bytes of `corpus`."""
    start = int(torch.randint(0, corpus.numel() - seq_len + 1, (), generator=gen))
    return torch.cat([torch.tensor([BOS]), corpus[start : start + seq_len - 1]])


@functools.lru_cache(maxsize=4)
def _text_corpus(split: str) -> torch.Tensor:
    return load_text_bytes(split).long()


@functools.lru_cache(maxsize=4)
def _code_corpus(split: str) -> torch.Tensor:
    """Bytes of Python standard-library source (the "shifted" corpus), 95% train / 5% held out."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = b""
    for name in CODE_FILES:
        path = stdlib / name
        if path.is_file():
            data += path.read_bytes() + b"\n"
    if len(data) < 100_000:
        raise HeadLabError(
            f"The Python standard-library source under {stdlib} is missing; use a Python install that ships .py files."
        )
    cut = int(len(data) * (1 - CODE_HELDOUT_FRACTION))
    chosen = data[:cut] if split == "train" else data[cut:]
    return torch.frombuffer(bytearray(chosen), dtype=torch.uint8).long()


def heldout_text_batch(n_examples: int, seq_len: int, seed: int, corpus: str = "text") -> torch.Tensor:
    """BOS + windows of the held-out split of `corpus` ("text" = pydoc topics, "code" = stdlib source).

    Returns tokens: LongTensor [example, seq_len].
    """
    source = _text_corpus("heldout") if corpus == "text" else _code_corpus("heldout")
    gen = batch_generator(seed, 0, salt=2)
    return torch.stack([_text_row(gen, seq_len, source) for _ in range(n_examples)])


def repeated_random_tokens(n_examples: int, half_len: int, seed: int, distinct: bool = False) -> torch.Tensor:
    """BOS + `half_len` random bytes + the same bytes again: the induction test sequence.

    With `distinct`, the bytes of one copy are all different, so every token of the second copy has
    exactly one earlier occurrence (needed for prefix matching). Returns LongTensor [example, 2*half_len+1].
    """
    if not 2 <= half_len <= N_BYTES:
        raise HeadLabError(f"Induction test half_len must be in [2, {N_BYTES}], got {half_len}.")
    gen = batch_generator(seed, 0, salt=1)
    if distinct:
        first = torch.stack([torch.randperm(N_BYTES, generator=gen)[:half_len] for _ in range(n_examples)])
    else:
        first = torch.randint(0, N_BYTES, (n_examples, half_len), generator=gen)
    bos = torch.full((n_examples, 1), BOS, dtype=torch.long)
    return torch.cat([bos, first, first], dim=1)  # [example, 2*half_len+1]


def next_token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy of predicting tokens[:, t+1] from logits[:, t]: [example, seq-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [example, seq-1, vocab]
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0]


@torch.no_grad()
def induction_test_loss(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    n_examples: int = 64,
    half_len: int = 20,
    seed: int = 0,
) -> float:
    """Mean loss (nats) over the repeated half of BOS + x + x, leaving out its first token.

    The first token of the second copy cannot be predicted (nothing says the copy starts there), so
    the loss covers targets at positions half_len+2 .. 2*half_len. `logits_fn` maps tokens
    [example, seq] to logits [example, seq, vocab]. Keep half_len <= 31 for models trained on
    8-32 byte chunks (they only reach that far back).
    """
    tokens = repeated_random_tokens(n_examples, half_len, seed)  # [example, 2n+1]
    losses = next_token_losses(logits_fn(tokens), tokens)  # [example, 2n]; column t predicts t+1
    # targets at positions half_len+2 .. 2*half_len are columns half_len+1 .. 2*half_len-1
    return float(losses[:, half_len + 1 :].mean())


def attention_patterns(model_or_pattern_fn, tokens: torch.Tensor) -> torch.Tensor:
    """Attention patterns for `tokens` as one tensor [layer, example, head, q, k].

    Accepts a Hugging Face causal LM (run with output_attentions=True; needs eager attention), a
    TransformerBridge / HookedTransformer (hook `blocks.{l}.attn.hook_pattern`), or a function
    tokens -> patterns [layer, example, head, q, k].
    """
    model = model_or_pattern_fn
    if hasattr(model, "run_with_cache"):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("attn.hook_pattern"))
        n_layers = model.cfg.n_layers
        # cache["pattern", l]: TransformerLens names the hook (tasks sit below core.model.hooks)
        return torch.stack([cache["pattern", l] for l in range(n_layers)]).float()
    if hasattr(model, "config") and hasattr(model, "forward"):
        out = model(tokens, output_attentions=True)
        if out.attentions is None or any(a is None for a in out.attentions):
            raise HeadLabError("The model returned no attention patterns; load it with attn_implementation='eager'.")
        return torch.stack(list(out.attentions)).float()
    return torch.as_tensor(model(tokens)).float()


@torch.no_grad()
def prefix_matching_scores(model_or_pattern_fn, n_examples: int = 32, half_len: int = 20, seed: int = 0) -> torch.Tensor:
    """Olsson et al.'s prefix-matching score per head: [layer, head].

    On BOS + x + x (x = distinct random bytes), the mean attention from each token of the second
    copy to the token right after its earlier occurrence (query half_len+1+i -> key 2+i).
    """
    tokens = repeated_random_tokens(n_examples, half_len, seed, distinct=True)
    patterns = attention_patterns(model_or_pattern_fn, tokens)  # [layer, example, head, q, k]
    q = torch.arange(half_len + 1, 2 * half_len + 1)
    k = q - half_len + 1
    return patterns[:, :, :, q, k].mean(dim=(1, 3))  # [layer, head]


@torch.no_grad()
def previous_token_scores(model_or_pattern_fn, n_examples: int = 32, half_len: int = 20, seed: int = 0) -> torch.Tensor:
    """Mean attention from each position to the one before it (positions 1..end), per head: [layer, head]."""
    tokens = repeated_random_tokens(n_examples, half_len, seed, distinct=True)
    patterns = attention_patterns(model_or_pattern_fn, tokens)  # [layer, example, head, q, k]
    q = torch.arange(1, tokens.shape[1])
    return patterns[:, :, :, q, q - 1].mean(dim=(1, 3))  # [layer, head]


@torch.no_grad()
def duplicate_token_scores(model_or_pattern_fn, n_examples: int = 32, half_len: int = 20, seed: int = 0) -> torch.Tensor:
    """Mean attention from each token of the second copy to its own earlier occurrence, per head: [layer, head].

    On BOS + x + x (x = distinct random bytes): query half_len+1+i -> key 1+i.
    """
    tokens = repeated_random_tokens(n_examples, half_len, seed, distinct=True)
    patterns = attention_patterns(model_or_pattern_fn, tokens)  # [layer, example, head, q, k]
    q = torch.arange(half_len + 1, 2 * half_len + 1)
    return patterns[:, :, :, q, q - half_len].mean(dim=(1, 3))  # [layer, head]
