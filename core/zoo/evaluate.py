"""What a zoo model has learned: the figures measured during training and for its finished model.

Induction models: repeated-half loss, held-out text loss, prefix-matching (and previous-token) scores
per head; duplicate-marking models: marker accuracy and duplicate-token scores; [HHG] reversal and
sorting models: greedy exact match per length, with the early-stop rule (confirmed on a larger fresh
set before it stops a run). The thresholds below name what a zoo record calls an induction head.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from core.heads import head_name
from core.tasks import duplicate, mixture, token_repeats
from core.tasks.induction import InductionProbeSpec
from core.tasks.sequences import OOD_LENGTHS, TRAIN_LENGTHS, exact_match_one_pass
from core.zoo.config import INDUCTION_TASKS, ModelConfig, TrainConfig

INDUCTION_SCORE = 0.3  # prefix-matching score above which a head counts as an induction head
STRONG_INDUCTION_SCORE = 0.8  # "strong" induction head (the quick-zoo target uses this one)
STRONG_DUPLICATE_SCORE = 0.25  # duplicate-token score (attention share on the earlier copy) of a clear duplicate-token head
INDUCTION_LOSS_TARGET = 1.0  # nats on the repeated half: induction has formed below this


def logits_fn_of(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """tokens [batch, pos] -> logits [batch, pos, vocab] (no grad)."""

    @torch.no_grad()
    def run(tokens: torch.Tensor) -> torch.Tensor:
        return model(tokens).logits

    return run


@torch.no_grad()
def evaluate_induction(model, train_cfg: TrainConfig, n_examples: int, full: bool = False) -> dict:
    """Repeated-half loss, held-out text loss and the best prefix-matching score (full: every figure)."""
    was_training = model.training
    model.eval()
    fn = logits_fn_of(model)
    out: dict[str, Any] = {"induction_loss": mixture.induction_test_loss(fn, n_examples, half_len=20, seed=1)}
    text = mixture.heldout_text_batch(n_examples, train_cfg.seq_len, seed=1)
    out["text_loss"] = float(mixture.next_token_losses(fn(text), text).mean())
    if train_cfg.task == "shifted":
        code = mixture.heldout_text_batch(n_examples, train_cfg.seq_len, seed=1, corpus="code")
        out["code_loss"] = float(mixture.next_token_losses(fn(code), code).mean())
    prefix = mixture.prefix_matching_scores(model, n_examples=min(n_examples, 64), half_len=20, seed=2)
    previous = mixture.previous_token_scores(model, n_examples=min(n_examples, 64), half_len=20, seed=2) if full else None
    if full:
        out["induction_loss_by_half_len"] = {
            str(n): mixture.induction_test_loss(fn, n_examples, half_len=n, seed=1) for n in (10, 20, 31)
        }
    out.update(_head_scores(prefix, previous))
    model.train(was_training)
    return out


def _head_scores(prefix: torch.Tensor, previous: torch.Tensor | None) -> dict[str, Any]:
    """The per-head figures of an induction evaluation from prefix-matching scores [layer, head]:
    the best one and the count above STRONG_INDUCTION_SCORE; rounded to 3 places during training,
    to 4 with the previous-token scores [layer, head] and the summary at the end (previous given)."""
    out: dict[str, Any] = {"prefix_matching_max": float(prefix.max()),
                           "strong_induction_count": int((prefix > STRONG_INDUCTION_SCORE).sum())}
    if previous is None:
        out["prefix_matching_heads"] = [[round(float(v), 3) for v in row] for row in prefix]  # [layer][head]
        return out
    out["prefix_matching"] = [[round(float(v), 4) for v in row] for row in prefix]
    out["previous_token"] = [[round(float(v), 4) for v in row] for row in previous]
    out.update(induction_head_summary(prefix))
    return out


@torch.no_grad()
def evaluate_token_induction(model, train_cfg: TrainConfig, n_examples: int, full: bool = False) -> dict:
    """Token-range induction (task "tokens"): loss on the repeated half of x + x at half = seq_len/2,
    top-1 accuracy on the reference probe (B after the final A, p+1 128-235 tokens back at T = 256),
    and prefix-matching per head (full: every figure, and previous-token scores).

    Run in chunks of 8 examples: at a 50k vocabulary one example's logits at T = 256 are 51 MB.
    """
    was_training = model.training
    model.eval()
    half = train_cfg.seq_len // 2
    repeats = token_repeats.repeated_random_tokens(n_examples, half, seed=1)  # [example, 2*half]
    probe = InductionProbeSpec(n_examples=n_examples, seq_len=train_cfg.seq_len, token_low=token_repeats.TOKEN_LOW,
                               token_high=token_repeats.TOKEN_HIGH, seed=3).build()
    repeat_losses, correct = [], []
    for start in range(0, n_examples, 8):
        rows = slice(start, start + 8)
        tokens = repeats[rows]
        # column t predicts t+1; the second copy's targets after its first token are columns half .. 2*half-2
        repeat_losses.append(mixture.next_token_losses(model(tokens).logits, tokens)[:, half:])
        logits = model(probe.tokens[rows]).logits  # [chunk, T, vocab]
        at_query = logits[torch.arange(logits.shape[0]), probe.query_pos[rows]]  # [chunk, vocab]
        correct.append(at_query.argmax(dim=-1) == probe.target[rows])
    out: dict[str, Any] = {"induction_loss": float(torch.cat(repeat_losses).mean()),
                           "probe_accuracy": float(torch.cat(correct).float().mean())}
    patterns = mixture.attention_patterns(model, repeats[:16])  # [layer, example, head, q, k]
    q = torch.arange(half, 2 * half)
    prefix = patterns[:, :, :, q, q - half + 1].mean(dim=(1, 3))  # [layer, head]
    previous = None
    if full:
        q = torch.arange(1, 2 * half)
        previous = patterns[:, :, :, q, q - 1].mean(dim=(1, 3))  # [layer, head]
    out.update(_head_scores(prefix, previous))
    model.train(was_training)
    return out


@torch.no_grad()
def evaluate_duplicate(model, train_cfg: TrainConfig, n_examples: int) -> dict:
    """Marker accuracy and the duplicate-token score of every head (duplicate-marking models)."""
    was_training = model.training
    model.eval()
    accuracy = duplicate.marker_accuracy(logits_fn_of(model), n_examples, train_cfg.seq_len, seed=1)
    scores = mixture.duplicate_token_scores(model, n_examples=min(n_examples, 64), half_len=20, seed=2)  # [layer, head]
    model.train(was_training)
    strong = [head_name((l, h)) for l in range(scores.shape[0]) for h in range(scores.shape[1])
              if scores[l, h] > STRONG_DUPLICATE_SCORE]
    return {"marker_accuracy": accuracy, "duplicate_token": [[round(float(v), 4) for v in row] for row in scores],
            "strong_duplicate_heads": strong}


def induction_head_summary(prefix: torch.Tensor) -> dict:
    """Which heads are induction heads, per-layer counts and how many matched-random control sets exist.

    A matched-random control for the strong heads takes, in every layer, as many heads as the circuit
    has there, from that layer's other heads: prod over layers of C(H - k_l, k_l) distinct sets.
    """
    n_layers, n_heads = prefix.shape
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    induction = [head_name(x) for x in heads if prefix[x] > INDUCTION_SCORE]
    strong = [x for x in heads if prefix[x] > STRONG_INDUCTION_SCORE]
    per_layer = [sum(1 for l, _ in strong if l == layer) for layer in range(n_layers)]
    controls = 1
    for k in per_layer:
        controls *= math.comb(n_heads - k, k)
    return {
        "induction_heads": induction,
        "strong_induction_heads": [head_name(x) for x in strong],
        "strong_per_layer": per_layer,
        "strong_at_most_half": all(k <= n_heads // 2 for k in per_layer),
        "matched_control_sets": controls if strong else 0,
    }


@torch.no_grad()
def evaluate_sequences(model, task: str, lengths, n_examples: int, seed: int) -> dict[int, float]:
    """Greedy exact-match accuracy per length: {length: accuracy} (in one teacher-forced pass per batch)."""
    was_training = model.training
    model.eval()
    fn = logits_fn_of(model)
    out = {int(n): float(exact_match_one_pass(fn, task, int(n), n_examples, seed).double().mean()) for n in lengths}
    model.train(was_training)
    return out


def evaluate_during_training(model, model_cfg: ModelConfig, train_cfg: TrainConfig, meta: dict, seconds: float) -> None:
    """Append one evaluation point to the curves; for reverse/sort also apply the early-stop rule."""
    ev = meta["curves"]["eval"]
    ev["step"].append(meta["step"])
    if train_cfg.task in INDUCTION_TASKS or train_cfg.task == "tokens":
        evaluate = evaluate_induction if train_cfg.task in INDUCTION_TASKS else evaluate_token_induction
        figures = evaluate(model, train_cfg, train_cfg.eval_examples)
        ev.setdefault("prefix_matching", []).append(figures.pop("prefix_matching_heads"))
        if meta["induction_step"] is None and figures["induction_loss"] < INDUCTION_LOSS_TARGET:
            meta["induction_step"] = meta["step"]
            meta["induction_seconds"] = round(seconds, 2)
    elif train_cfg.task == "duplicate":
        figures = evaluate_duplicate(model, train_cfg, train_cfg.eval_examples)
        figures = {"marker_accuracy": figures["marker_accuracy"],
                   "duplicate_token_max": max(max(row) for row in figures["duplicate_token"])}
    else:
        by_length = evaluate_sequences(model, train_cfg.task, TRAIN_LENGTHS, train_cfg.eval_examples, seed=10_000 + meta["step"])
        figures = {"train_accuracy": sum(by_length.values()) / len(by_length)}
        if train_cfg.stop_accuracy is not None and figures["train_accuracy"] >= train_cfg.stop_accuracy:
            # A small check that passes by luck would stop too early: confirm on a larger fresh set.
            confirm = evaluate_sequences(model, train_cfg.task, TRAIN_LENGTHS, train_cfg.final_examples, seed=20_000 + meta["step"])
            confirmed = sum(confirm.values()) / len(confirm)
            ev.setdefault("confirm_accuracy", []).append([meta["step"], round(confirmed, 5)])  # [step, accuracy]
            if confirmed >= train_cfg.stop_accuracy:
                meta["stopped_early"] = meta["step"] < train_cfg.steps
    for key, value in figures.items():
        ev.setdefault(key, []).append(round(float(value), 5))


def final_figures(model, model_cfg: ModelConfig, train_cfg: TrainConfig, meta: dict) -> dict:
    """The figures a zoo record reports for the finished model."""
    out: dict[str, Any] = {
        "steps": meta["step"], "tokens": meta["tokens"],
        "seconds_per_step": round(meta["train_seconds"] / max(1, meta["step"]), 4),
        "n_parameters": sum(p.numel() for p in model.parameters()),
    }
    if train_cfg.task in INDUCTION_TASKS or train_cfg.task == "tokens":
        evaluate = evaluate_induction if train_cfg.task in INDUCTION_TASKS else evaluate_token_induction
        out.update(evaluate(model, train_cfg, train_cfg.final_examples, full=True))
        out["induction_step"] = meta["induction_step"]
        out["induction_seconds"] = meta["induction_seconds"]
        if train_cfg.warmup_extend_to:  # where this seed's repeat warm-up data ended (core/zoo/train.py, warmup_end_at)
            out["warmup_end"] = meta.get("warmup_end")
        if train_cfg.lasso_boost_above:  # the step the head lasso's boost began (core/zoo/train.py, head_lasso_weight)
            out["lasso_boost_from"] = meta.get("lasso_boost_from")
    elif train_cfg.task == "duplicate":
        out.update(evaluate_duplicate(model, train_cfg, train_cfg.final_examples))
    elif train_cfg.task == "none":
        pass  # initial weights: nothing learned to measure
    else:
        train = evaluate_sequences(model, train_cfg.task, TRAIN_LENGTHS, train_cfg.final_examples, seed=1)
        ood = evaluate_sequences(model, train_cfg.task, OOD_LENGTHS, train_cfg.final_examples, seed=2)
        out["train_accuracy"] = round(sum(train.values()) / len(train), 4)
        out["train_accuracy_by_length"] = {str(k): round(v, 4) for k, v in train.items()}
        out["ood_accuracy"] = {str(k): round(v, 4) for k, v in ood.items()}
        out["stopped_early"] = meta["stopped_early"]
    return out
