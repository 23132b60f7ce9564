"""Sequence reversal and sorting, the [HHG] tasks (METHODS.md, "Gradient attribution vs causal importance").

A sample is `START x1..xn SEP y1..yn END` with numbers 1..99 as tokens 1..99 and y the reversed or
ascending-sorted x. Models train with next-token loss on the answer part only and are scored by
exact match of greedy decoding (all of y1..yn and END right).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch

from core.choices import HHG_FORMATS
from core.errors import HeadLabError

SEQ_VOCAB_SIZE = 104
PAD = 0
NUMBER_LOW, NUMBER_HIGH = 1, 99  # inclusive; numbers are their own token ids
START = 100
SEP = 101
END = 102
# token 103 is unused (the reference vocabulary has 104 entries)

TASKS = ("reverse", "sort")
# Training layouts. "headlab": START x SEP y END, PAD only at the end. "reference": the [HHG] reference
# code's (make_batch in the authors' iclr_workshop_pipeline.py): input START x SEP and target y END are
# padded separately to the batch's longest, so a shorter sample has PADs between SEP and its answer and
# predicts y1 from a PAD. Evaluation prompts (one length per batch) are the same in both.
TRAIN_LENGTHS = range(3, 8)  # 3..7
OOD_LENGTHS = range(8, 12)  # 8..11
MAX_SEQUENCE_LENGTH = 40
OOD_ACCURACY_BAND = (0.20, 0.75)

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # tokens [batch, pos] -> logits [batch, pos, vocab]


def check_task(task: str) -> str:
    if task not in TASKS:
        raise HeadLabError(f"Unknown sequence task {task!r}; use one of {', '.join(TASKS)}.")
    return task


def _check_lengths(lengths: int | Iterable[int]) -> list[int]:
    values = [lengths] if isinstance(lengths, (int, np.integer)) else list(lengths)
    if not values:
        raise HeadLabError("Give at least one sequence length.")
    for n in values:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_SEQUENCE_LENGTH:
            raise HeadLabError(
                f"Sequence length {n!r} has no valid samples; use integers from 1 to {MAX_SEQUENCE_LENGTH}."
            )
    return [int(n) for n in values]


def _generator(generator_or_seed: int | torch.Generator) -> torch.Generator:
    if isinstance(generator_or_seed, torch.Generator):
        return generator_or_seed
    return torch.Generator().manual_seed(int(generator_or_seed))


def sequence_answer(task: str, x: torch.Tensor) -> torch.Tensor:
    """The answer y for inputs x: [batch, n] -> [batch, n] (reversed, or sorted ascending)."""
    if check_task(task) == "reverse":
        return torch.flip(x, dims=[1])
    return torch.sort(x, dim=1).values


def sequence_length(n: int) -> int:
    """Tokens in one sample of n numbers: START, n inputs, SEP, n outputs, END."""
    return 2 * n + 3


def check_hhg_format(layout: str) -> str:
    if layout not in HHG_FORMATS:
        raise HeadLabError(f"Unknown [HHG] data format {layout!r}; use one of {', '.join(HHG_FORMATS)}.")
    return layout


def make_sequence_batch(
    task: str, lengths: int | Iterable[int], batch_size: int, generator_or_seed: int | torch.Generator,
    layout: str = "headlab",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of samples with n drawn uniformly from `lengths`, numbers uniform in 1..99 with replacement.

    Returns tokens [batch, 2*max(lengths)+3] long and loss_mask [batch, same] bool, True where the
    NEXT token is an answer token y1..yn or END. The width depends on `lengths`, not on the draw, so
    shapes are stable. layout "headlab": START x SEP y END then PAD, the mask on SEP .. yn.
    layout "reference" (m = max(lengths)): START x SEP, PAD up to column m+1, then y END, then PAD;
    the mask on columns m+1 .. m+1+n (the last input column, a PAD when n < m, predicts y1). The
    reference pads to the longest sample drawn in the batch, which for 64 draws from 3..7 is 7 in all
    but a (4/5)^64 = 6e-7 share of batches; a fixed m keeps the layout a pure function of the seed.
    """
    check_task(task)
    check_hhg_format(layout)
    values = _check_lengths(lengths)
    if int(batch_size) < 1:
        raise HeadLabError("Sequence batch_size must be at least 1.")
    gen = _generator(generator_or_seed)
    width = sequence_length(max(values))
    tokens = torch.full((int(batch_size), width), PAD, dtype=torch.long)  # [batch, pos]
    loss_mask = torch.zeros((int(batch_size), width), dtype=torch.bool)
    choice = torch.randint(len(values), (int(batch_size),), generator=gen)
    numbers = torch.randint(NUMBER_LOW, NUMBER_HIGH + 1, (int(batch_size), max(values)), generator=gen)
    for n in sorted(set(values)):
        rows = torch.nonzero(choice == values.index(n)).flatten()
        if rows.numel() == 0:
            continue
        x = numbers[rows, :n]  # [rows, n]
        y = sequence_answer(task, x)
        answer_at = n + 2 if layout == "headlab" else max(values) + 2  # the column of y1
        tokens[rows, 0] = START
        tokens[rows, 1 : n + 1] = x
        tokens[rows, n + 1] = SEP
        tokens[rows, answer_at : answer_at + n] = y
        tokens[rows, answer_at + n] = END
        loss_mask[rows, answer_at - 1 : answer_at + n] = True
    return tokens, loss_mask


def sequence_training_batch(
    task: str, step: int, batch_size: int, seed: int, layout: str = "headlab"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch for `step`: a pure function of (task, step, batch_size, seed, layout), lengths 3..7.

    Each step seeds its own generator from (seed, step), so a resumed run sees the same data.
    """
    state = np.random.SeedSequence([int(seed), int(step)]).generate_state(2, dtype=np.uint32)
    step_seed = (int(state[0]) << 32 | int(state[1])) & 0x7FFF_FFFF_FFFF_FFFF
    return make_sequence_batch(task, TRAIN_LENGTHS, batch_size, step_seed, layout)


@torch.no_grad()
def greedy_decode(logits_fn: LogitsFn, prompts: torch.Tensor, n_out: int) -> torch.Tensor:
    """Append n_out + 1 argmax tokens (the answer and, if right, END) to prompts [batch, n+2] = START x SEP.

    Recomputes the full forward pass each step (no KV cache; sequences are at most 83 tokens).
    Returns the generated tokens only: [batch, n_out + 1] long.
    """
    tokens = prompts.long()
    for _ in range(int(n_out) + 1):
        logits = logits_fn(tokens)  # [batch, pos, vocab]
        next_token = logits[:, -1, :].argmax(dim=-1)  # [batch]
        tokens = torch.cat([tokens, next_token[:, None].to(tokens.device)], dim=1)
    return tokens[:, prompts.shape[1] :]


def exact_match_per_example(
    logits_fn: LogitsFn, task: str, length: int, n_examples: int, seed: int, batch_size: int = 256
) -> torch.Tensor:
    """Per example, whether greedy decoding yields exactly y1..yn END: [example] bool.

    The examples are make_sequence_batch(task, length, n_examples, seed), so the same seed gives
    the same examples for every model and every ablation.
    """
    (n,) = _check_lengths(length)
    if int(n_examples) < 1 or int(batch_size) < 1:
        raise HeadLabError("n_examples and batch_size must be at least 1.")
    tokens, _ = make_sequence_batch(task, n, n_examples, seed)
    prompts, expected = tokens[:, : n + 2], tokens[:, n + 2 :]  # expected: [example, n+1], ends with END
    correct = []
    for start in range(0, tokens.shape[0], int(batch_size)):
        out = greedy_decode(logits_fn, prompts[start : start + int(batch_size)], n)
        correct.append((out.cpu() == expected[start : start + int(batch_size)]).all(dim=1))
    return torch.cat(correct)


@torch.no_grad()
def exact_match_one_pass(
    logits_fn: LogitsFn, task: str, length: int, n_examples: int, seed: int, batch_size: int = 256
) -> torch.Tensor:
    """Per example, whether greedy decoding yields exactly y1..yn END: [example] bool, in one pass.

    The same examples and the same answer as `exact_match_per_example`, n+1 times cheaper:
    greedy decoding of a causal model feeds back its own argmax, which equals the true answer prefix
    until its first error, so the decode is exact iff the argmax at every answer position of the
    teacher-forced sequence is right (the logits at a position depend only on the tokens up to it;
    per-position mean ablation keeps that).
    """
    tokens, loss_mask = make_sequence_batch(task, int(length), int(n_examples), int(seed))  # [example, 2n+3]
    inputs, targets, scored = tokens[:, :-1], tokens[:, 1:], loss_mask[:, :-1]  # [example, 2n+2]
    out = []
    for start in range(0, inputs.shape[0], int(batch_size)):
        rows = slice(start, start + int(batch_size))
        predicted = logits_fn(inputs[rows]).argmax(dim=-1).cpu()  # [rows, 2n+2]
        out.append(((predicted == targets[rows]) | ~scored[rows]).all(dim=1))
    return torch.cat(out)


def exact_match_accuracy(
    logits_fn: LogitsFn, task: str, length: int, n_examples: int, seed: int, batch_size: int = 256
) -> float:
    """Fraction of examples whose whole greedy answer (y1..yn and END) is right."""
    return float(exact_match_per_example(logits_fn, task, length, n_examples, seed, batch_size).float().mean())



def choose_ood_length(
    accuracy_by_length: dict[int, float], low: float = OOD_ACCURACY_BAND[0], high: float = OOD_ACCURACY_BAND[1]
) -> int | None:
    """The reference rule: the first OOD length (8, 9, 10, 11) whose accuracy lies in [low, high], else None.

    Lengths missing from the dict are skipped.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise HeadLabError("The OOD accuracy band needs 0 <= low <= high <= 1.")
    for n in OOD_LENGTHS:
        if n in accuracy_by_length and low <= float(accuracy_by_length[n]) <= high:
            return n
    return None
