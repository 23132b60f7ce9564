"""Gradient attribution vs causal importance [HHG]: hidden heroes, gradient bloats, superadditivity.

METHODS.md, "Gradient attribution vs causal importance". For a model trained on sequence reversal
or sorting, every component (each attention head, each MLP) gets

- a gradient magnitude G: the mean over B out-of-distribution (OOD) batches of the Frobenius norm
  of the loss gradient over the component's parameters (`gradient_magnitudes`);
- a causal importance C: the drop in OOD exact-match accuracy (greedy decoding) when the component
  is ablated through the ablation engine (`causal_importance`);

and the two are compared by rank: Spearman rho, rank differences d = rank_G - rank_C, classes
(d >= 6 "bloat": large gradient, small effect; d <= -6 "hero": small gradient, large effect),
joint ablation of all bloats / all heroes with two superadditivity ratios, and a summary over seeds.
Preset runs store one JSON per model under reports/attribution (`run_preset`); `stored_summaries`
regroups them (per task and settings) for the app's seed-level figures (core/figures_attribution.py).

Choices fixed here (named in every result's settings):
- Components are named "L1H3" (head 3 of layer 1) and "L1MLP" (the MLP of layer 1), ordered layer
  by layer: the heads of layer l (0..H-1), then the MLP of layer l; the reference code's sorted
  "L{l}_H{h}", "L{l}_MLP" keys give the same order.
- Gradient blocks are weights only, no biases. "paper": a head's W_V rows and W_O columns together,
  an MLP's output matrix, norm divided by sqrt(number of weights). "reference": the head's W_V rows,
  the MLP's output matrix, unnormalised (as the reference code). A head's bias slice is left out
  because the paper names the W_V and W_O slices; W_O's bias is shared by all heads of a layer.
- Gradients are taken on a plain Hugging Face model (`core.model.loading.load_hf_model`): the
  TransformerBridge splits GPT-NeoX's fused QKV weight into copies, so the fused weight of a
  bridge-wrapped model gets no gradient.
- Mean ablation replaces a head's hook_z slice / an MLP's output by its per-position mean over the
  evaluation sequences (teacher-forced clean runs on the same examples that are scored). The
  reference code uses one mean over batch and positions instead; HeadLab follows METHODS.md.
- Superadditivity ratios are undefined (None, with the reason) for fewer than 2 components or when
  the single damages sum to <= 0 (then the mean and the sum are both non-positive).
- Spread over seeds is the population standard deviation (ddof=0).
- Greedy exact match is computed in one teacher-forced pass per example (the argmax at every answer
  position right), which equals step-by-step greedy decoding for a causal model and is n+1 times
  cheaper; a test checks the two agree example by example.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from core.errors import HeadLabError
from core.tasks.sequences import (
    MAX_SEQUENCE_LENGTH,
    OOD_ACCURACY_BAND,
    OOD_LENGTHS,
    SEQ_VOCAB_SIZE,
    TRAIN_LENGTHS,
    check_task,
    choose_ood_length,
    make_sequence_batch,
)

GRADIENT_VARIANTS = ("paper", "reference")
CLASS_RULES = ("paper", "reference")
ABLATION_MODES = ("mean", "zero")
CLASSES = ("hero", "aligned", "bloat")
DEFAULT_THRESHOLD = 6.0
_COMPONENT = re.compile(r"^L(\d+)(?:H(\d+)|MLP)$", re.IGNORECASE)
ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)


class NoOODLengthError(HeadLabError):
    """No usable OOD length (none in the accuracy band, or the given one is never solved): the
    reference skips such a seed, and so does a preset run."""


# ----------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------


def component_name(layer: int, head: int | None = None) -> str:
    """"L1H3" for a head, "L1MLP" for the MLP of layer 1 (head None)."""
    return f"L{int(layer)}MLP" if head is None else f"L{int(layer)}H{int(head)}"


def parse_component(name: str) -> tuple[int, int | None]:
    """(layer, head) of "L1H3", (layer, None) of "L1MLP"; HeadLabError for anything else."""
    match = _COMPONENT.match(str(name).strip())
    if match is None:
        raise HeadLabError(f'cannot read component "{name}"; write heads as "L1H3" and MLPs as "L1MLP".')
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


def component_order(n_layers: int, n_heads: int, with_mlp: bool = True) -> tuple[str, ...]:
    """All components in HeadLab's order: per layer, its heads 0..H-1, then its MLP."""
    out: list[str] = []
    for layer in range(int(n_layers)):
        out += [component_name(layer, h) for h in range(int(n_heads))]
        if with_mlp:
            out.append(component_name(layer))
    return tuple(out)


@dataclass(frozen=True)
class ParamSlice:
    """One rectangular piece of a weight matrix: `param[rows, cols]`, named for provenance."""

    name: str
    param: torch.Tensor
    rows: slice
    cols: slice

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[self.rows, self.cols]

    @property
    def numel(self) -> int:
        return int(self.param[self.rows, self.cols].numel())


@dataclass(frozen=True)
class ComponentBlocks:
    """Where each component's parameters live in a Hugging Face model, for both gradient variants."""

    components: tuple[str, ...]
    paper: dict[str, tuple[ParamSlice, ...]]
    reference: dict[str, tuple[ParamSlice, ...]]
    n_layers: int
    n_heads: int
    has_mlp: bool
    notes: tuple[str, ...] = ()


def _unwrapped_check(hf_model: Any) -> None:
    if hasattr(hf_model, "run_with_hooks") or any("_original_component" in n for n, _ in hf_model.named_parameters()):
        raise HeadLabError(
            "gradient magnitudes need the plain Hugging Face model (core.model.loading.load_hf_model), not a "
            "TransformerBridge or a model wrapped by one: the bridge trains copies of the fused QKV weight."
        )


def component_blocks(hf_model: Any) -> ComponentBlocks:
    """Each component's weight slices, read from a GPT-NeoX or Llama-style Hugging Face model.

    GPT-NeoX fuses Q, K, V in `attention.query_key_value` (weight [3*H*d_head, d_model]) laid out
    head-major: output rows h*3*d_head .. (h+1)*3*d_head are head h's q, k, v in that order (the
    forward views the output as [..., H, 3*d_head] and chunks the last axis in three), so head h's
    W_V rows are h*3*d_head + 2*d_head .. (h+1)*3*d_head. `attention.dense` (weight [d_model, H*d_head])
    takes the head outputs concatenated head-major: head h owns columns h*d_head .. (h+1)*d_head.
    A layer whose MLP has no single output matrix (none at all, or a mixture of experts) makes the
    analysis heads-only, said in `notes`.
    """
    _unwrapped_check(hf_model)
    config = hf_model.config
    n_heads = int(config.num_attention_heads)
    d_model = int(config.hidden_size)
    d_head = int(getattr(config, "head_dim", None) or d_model // n_heads)
    layers = list(hf_model.base_model.layers)
    paper: dict[str, tuple[ParamSlice, ...]] = {}
    reference: dict[str, tuple[ParamSlice, ...]] = {}
    mlp_out: list[tuple[str, torch.Tensor] | None] = []
    all_cols = slice(None)
    for layer, block in enumerate(layers):
        if hasattr(block, "attention") and hasattr(block.attention, "query_key_value"):
            prefix = f"layers.{layer}.attention"
            qkv, out = block.attention.query_key_value.weight, block.attention.dense.weight
            if qkv.shape[0] != 3 * n_heads * d_head or out.shape[1] != n_heads * d_head:
                raise HeadLabError(f"layer {layer}'s attention weights do not split into {n_heads} heads of {d_head}; this model is not supported.")
            v_rows = [slice(h * 3 * d_head + 2 * d_head, (h + 1) * 3 * d_head) for h in range(n_heads)]
            v_name, o_name, v_param = f"{prefix}.query_key_value.weight", f"{prefix}.dense.weight", qkv
        elif hasattr(block, "self_attn") and hasattr(block.self_attn, "v_proj") and hasattr(block.self_attn, "o_proj"):
            prefix = f"layers.{layer}.self_attn"
            v_param, out = block.self_attn.v_proj.weight, block.self_attn.o_proj.weight
            n_kv = int(v_param.shape[0]) // d_head
            group = n_heads // max(n_kv, 1)  # grouped-query attention: heads share a K/V head
            v_rows = [slice((h // group) * d_head, (h // group + 1) * d_head) for h in range(n_heads)]
            v_name, o_name = f"{prefix}.v_proj.weight", f"{prefix}.o_proj.weight"
        else:
            raise HeadLabError(
                f"layer {layer} of this {getattr(config, 'model_type', 'unknown')} model has no attention layout HeadLab "
                "knows (GPT-NeoX query_key_value/dense or Llama-style v_proj/o_proj); use such a model."
            )
        for h in range(n_heads):
            v = ParamSlice(v_name, v_param, v_rows[h], all_cols)
            o = ParamSlice(o_name, out, all_cols, slice(h * d_head, (h + 1) * d_head))
            paper[component_name(layer, h)] = (v, o)
            reference[component_name(layer, h)] = (v,)
        mlp = getattr(block, "mlp", None)
        second = None
        for attr in ("dense_4h_to_h", "down_proj"):
            candidate = getattr(mlp, attr, None) if mlp is not None else None
            if isinstance(candidate, torch.nn.Linear):
                second = (f"layers.{layer}.mlp.{attr}.weight", candidate.weight)
        mlp_out.append(second)
    has_mlp = all(entry is not None for entry in mlp_out)
    notes: list[str] = []
    if has_mlp:
        for layer, (name, weight) in enumerate(mlp_out):
            piece = (ParamSlice(name, weight, all_cols, all_cols),)
            paper[component_name(layer)] = reference[component_name(layer)] = piece
    else:
        notes.append(
            "reduced analysis: this model's MLPs have no single output matrix (no MLP, or a mixture of "
            f"experts), so only its {len(layers) * n_heads} heads are compared; the rank-difference "
            "threshold was set for 20 components."
        )
    components = component_order(len(layers), n_heads, has_mlp)
    return ComponentBlocks(components, paper, reference, len(layers), n_heads, has_mlp, tuple(notes))


# ----------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------


def check_model_for_task(model: Any, task: str, manifest_task: str | None = None, name: str = "this model") -> None:
    """HeadLabError when the model was not trained for `task`: the zoo manifest's task when there is
    one, else at least the vocabulary size of the sequence tasks (104)."""
    check_task(task)
    if manifest_task is not None and manifest_task != task:
        raise HeadLabError(
            f"{name} was trained for {manifest_task!r}, not {task!r}; pass --task {manifest_task} or pick a {task} model."
        )
    config = getattr(model, "config", None) or getattr(getattr(model, "original_model", None), "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        vocab = getattr(getattr(model, "cfg", None), "d_vocab", None)
    if vocab is not None and int(vocab) != SEQ_VOCAB_SIZE:
        raise HeadLabError(
            f"{name} has a {int(vocab)}-token vocabulary, not the {SEQ_VOCAB_SIZE} of the {task} task; "
            f"pick a model trained on {task} (e.g. the zoo's {task}-hhg models)."
        )


def check_ood_length(length: int) -> int:
    """An OOD length must be an integer beyond the training lengths (3..7) with samples that fit."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise HeadLabError(f"OOD length {length!r} is not an integer; pass a length such as 8.")
    length = int(length)
    if length in TRAIN_LENGTHS or length < 1 or length > MAX_SEQUENCE_LENGTH:
        raise HeadLabError(
            f"OOD length {length} has no valid out-of-distribution samples; use a length outside the training "
            f"lengths {TRAIN_LENGTHS.start}..{TRAIN_LENGTHS.stop - 1}, at most {MAX_SEQUENCE_LENGTH} "
            f"(the paper uses {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1})."
        )
    return length


def _bridge_logits_fn(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """tokens -> logits for a bridge (returns a tensor) or a Hugging Face model (returns .logits)."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def run(tokens: torch.Tensor) -> torch.Tensor:
        out = model(tokens.to(device))
        return out if isinstance(out, torch.Tensor) else out.logits

    return run


@torch.no_grad()
def greedy_exact_match_per_example(
    logits_fn: Callable[[torch.Tensor], torch.Tensor], task: str, length: int, n_examples: int, seed: int, batch_size: int = 256,
) -> torch.Tensor:
    """Per example, whether greedy decoding yields exactly y1..yn END: [example] bool, in one pass.

    The same examples and the same answer as `sequences.exact_match_per_example`, n+1 times cheaper:
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


def pick_ood_length(
    logits_fn: Callable[[torch.Tensor], torch.Tensor], task: str, n_examples: int, seed: int,
    ood_length: int | None = None, band: tuple[float, float] = OOD_ACCURACY_BAND,
) -> tuple[int, dict[int, float]]:
    """The OOD length to analyse and the clean accuracies it was chosen from: {length: accuracy}.

    Given a length: it is checked and used (its clean accuracy must be above 0, else no ablation can
    lower it). Otherwise the reference rule: the first of 8..11 whose accuracy lies in [0.20, 0.75].
    """
    lengths = list(OOD_LENGTHS)
    if ood_length is not None:
        ood_length = check_ood_length(ood_length)
        lengths = sorted(set(lengths) | {ood_length})
    accuracy = {n: float(greedy_exact_match_per_example(logits_fn, task, n, n_examples, seed).double().mean()) for n in lengths}
    if ood_length is None:
        chosen = choose_ood_length(accuracy, *band)
        if chosen is None:
            shown = ", ".join(f"{n}: {a:.2f}" for n, a in accuracy.items())
            if all(a <= 0.0 for a in accuracy.values()):
                hint = f"the model solves none of them; check that it was trained for {task} and that this checkpoint is a trained one"
            else:
                hint = "give an OOD length (--ood-length) to analyse one anyway"
            raise NoOODLengthError(
                f"no OOD length {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1} has a clean accuracy in "
                f"[{band[0]:.2f}, {band[1]:.2f}] ({shown}); {hint}."
            )
        return chosen, accuracy
    if accuracy[ood_length] <= 0.0:
        raise NoOODLengthError(
            f"the model solves none of the {n_examples} samples of length {ood_length}, so no ablation can "
            "lower its accuracy; pick a shorter OOD length."
        )
    return ood_length, accuracy


# ----------------------------------------------------------------------------------------------
# Gradient magnitude G
# ----------------------------------------------------------------------------------------------


def _derived_seed(seed: int, stream: int) -> int:
    """A seed for one named random stream of a run, so gradient batches and evaluation examples differ."""
    state = np.random.SeedSequence([int(seed), int(stream)]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 32 | int(state[1])) & 0x7FFF_FFFF_FFFF_FFFF


def answer_loss(logits: torch.Tensor, tokens: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the answer positions (loss_mask[t]: predicting tokens[t+1])."""
    logits = logits[:, :-1].float()  # [batch, pos-1, vocab]
    targets = tokens[:, 1:]  # [batch, pos-1]
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    mask = loss_mask[:, :-1].reshape(-1).float()
    return (losses * mask).sum() / mask.sum()


def block_norms(blocks: dict[str, tuple[ParamSlice, ...]], grads: dict[int, torch.Tensor], components: Sequence[str], normalise: bool) -> np.ndarray:
    """Frobenius norm of each component's gradient block (all pieces together): [component].

    grads maps id(param) -> its gradient. normalise: divide by sqrt(number of weights in the block).
    """
    out = np.zeros(len(components), dtype=np.float64)
    for i, name in enumerate(components):
        squares, count = 0.0, 0
        for piece in blocks[name]:
            g = piece.of(grads[id(piece.param)])
            squares += float(g.double().pow(2).sum())
            count += int(g.numel())
        out[i] = math.sqrt(squares) / (math.sqrt(count) if normalise else 1.0)
    return out


def gradient_magnitudes(
    hf_model: Any, task: str, ood_length: int, n_batches: int = 50, batch_size: int = 64, seed: int = 0,
    variant: str = "paper", progress: ProgressFn | None = None,
) -> np.ndarray:
    """G per component (order of `component_blocks(hf_model).components`): [component] float64.

    The mean over `n_batches` OOD batches (all of length `ood_length`) of the Frobenius norm of the
    answer-position loss gradient over the component's block (see the module docstring for the
    blocks of each variant). The model's weights and .grad fields are left untouched.
    """
    if variant not in GRADIENT_VARIANTS:
        raise HeadLabError(f"gradient variant {variant!r} is unknown; use 'paper' or 'reference'.")
    check_task(task)
    if int(n_batches) < 1 or int(batch_size) < 1:
        raise HeadLabError("n_batches and batch_size must be at least 1.")
    blocks = component_blocks(hf_model)
    chosen = blocks.paper if variant == "paper" else blocks.reference
    params = list({id(p.param): p.param for pieces in chosen.values() for p in pieces}.values())
    device = next(hf_model.parameters()).device
    generator = torch.Generator().manual_seed(_derived_seed(seed, 1))
    was_training = hf_model.training
    hf_model.eval()  # no dropout; gradients flow in eval mode too
    saved_flags = [p.requires_grad for p in params]
    total = np.zeros(len(blocks.components), dtype=np.float64)
    try:
        for p in params:
            p.requires_grad_(True)
        for b in range(int(n_batches)):
            tokens, mask = make_sequence_batch(task, int(ood_length), int(batch_size), generator)
            tokens, mask = tokens.to(device), mask.to(device)
            with torch.enable_grad():
                loss = answer_loss(hf_model(tokens).logits, tokens, mask)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
            by_id = {id(p): (torch.zeros_like(p) if g is None else g.detach()) for p, g in zip(params, grads)}
            total += block_norms(chosen, by_id, blocks.components, normalise=variant == "paper")
            if progress is not None:
                progress("gradients", b + 1, int(n_batches))
    finally:
        for p, flag in zip(params, saved_flags):
            p.requires_grad_(flag)
        hf_model.train(was_training)
    return total / int(n_batches)


# ----------------------------------------------------------------------------------------------
# Causal importance C
# ----------------------------------------------------------------------------------------------


def _ablation_of(components: Sequence[str], mode: str):
    """The ablation engine's Ablation for a set of components (the one place that builds it)."""
    from core.ablation.engine import Ablation
    from core.heads import HeadSet

    heads, mlps = [], []
    for name in components:
        layer, head = parse_component(name)
        if head is None:
            mlps.append(layer)
        else:
            heads.append((layer, head))
    return Ablation(HeadSet(tuple(heads)), tuple(mlps), mode, ",".join(components))


class AccuracyUnderAblation:
    """Greedy exact-match accuracy of a bridge at one length, clean and with components ablated.

    The scored examples are make_sequence_batch(task, length, n_examples, seed) for every condition;
    mean-ablation means are per-position means over those same examples' full clean sequences.
    """

    def __init__(self, model: Any, task: str, length: int, n_examples: int, seed: int, mode: str = "mean", components: Sequence[str] = ()):
        from core.ablation.engine import compute_means

        if mode not in ABLATION_MODES:
            raise HeadLabError(f"ablation mode {mode!r} is unknown; use 'mean' or 'zero'.")
        if not hasattr(model, "run_with_hooks"):
            raise HeadLabError("causal importance runs through the ablation engine; load the model with core.model.loading.load_model.")
        self.model, self.task, self.length = model, check_task(task), int(length)
        self.n_examples, self.seed, self.mode = int(n_examples), int(seed), mode
        self.means = None
        if mode == "mean" and components:
            tokens, _ = make_sequence_batch(task, self.length, self.n_examples, self.seed)  # [example, 2n+3]
            self.means = compute_means(model, tokens, _ablation_of(components, "mean"), batch_size=256)
        self.clean = self.accuracy(())

    def accuracy(self, components: Sequence[str]) -> float:
        from core.ablation.engine import ablated_logits_fn

        fn = ablated_logits_fn(self.model, _ablation_of(components, self.mode), self.means)
        return float(greedy_exact_match_per_example(fn, self.task, self.length, self.n_examples, self.seed).double().mean())

    def damage(self, components: Sequence[str]) -> float:
        """Clean accuracy minus the accuracy with `components` ablated together."""
        return self.clean - self.accuracy(components)


def causal_importance(
    model: Any, task: str, ood_length: int, n_examples: int = 500, seed: int = 0, mode: str = "mean",
    components: Sequence[str] | None = None, progress: ProgressFn | None = None,
) -> np.ndarray:
    """C per component: clean OOD exact-match accuracy minus the accuracy with that component ablated.

    model: a TransformerBridge (core.model.loading.load_model). components: default every head, then the
    MLP, layer by layer. Returns [component] float64 (negative: the ablation helps).
    """
    if components is None:
        components = component_order(model.cfg.n_layers, model.cfg.n_heads)
    evaluator = AccuracyUnderAblation(model, task, ood_length, n_examples, seed, mode, components)
    return single_damages(evaluator, components, progress)


def single_damages(evaluator: AccuracyUnderAblation, components: Sequence[str], progress: ProgressFn | None = None) -> np.ndarray:
    """Each component ablated alone: [component] accuracy drops."""
    out = np.zeros(len(components), dtype=np.float64)
    for i, name in enumerate(components):
        out[i] = evaluator.damage([name])
        if progress is not None:
            progress("ablations", i + 1, len(components))
    return out


# ----------------------------------------------------------------------------------------------
# Pure statistics
# ----------------------------------------------------------------------------------------------


def rank_differences(G: Sequence[float], C: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank_G, rank_C, d): ascending ranks (1 = smallest, ties averaged, scipy.stats.rankdata) and
    d = rank_G - rank_C, each [component]. d > 0: the gradient ranks the component higher than its effect."""
    from scipy.stats import rankdata

    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    if G.shape != C.shape or G.ndim != 1 or G.size == 0:
        raise HeadLabError("G and C need one value per component, the same components in the same order.")
    rank_g, rank_c = rankdata(G), rankdata(C)
    return rank_g, rank_c, rank_g - rank_c


def classify_components(d: Sequence[float], threshold: float = DEFAULT_THRESHOLD, rule: str = "paper") -> tuple[str, ...]:
    """"bloat" (large gradient, small effect) when d >= threshold, "hero" when d <= -threshold
    (rule "paper"); strict > and < for rule "reference"; else "aligned"."""
    if rule not in CLASS_RULES:
        raise HeadLabError(f"classification rule {rule!r} is unknown; use 'paper' (>=) or 'reference' (>).")
    out = []
    for value in np.asarray(d, dtype=np.float64):
        if rule == "paper":
            out.append("bloat" if value >= threshold else "hero" if value <= -threshold else "aligned")
        else:
            out.append("bloat" if value > threshold else "hero" if value < -threshold else "aligned")
    return tuple(out)


def spearman(G: Sequence[float], C: Sequence[float]) -> tuple[float | None, float | None]:
    """(rho, p) by scipy.stats.spearmanr; (None, None) when either vector is constant (rho undefined)."""
    from scipy.stats import spearmanr

    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    if G.size < 2 or np.all(G == G[0]) or np.all(C == C[0]):
        return None, None
    result = spearmanr(G, C)
    return float(result.statistic), float(result.pvalue)


def per_layer_summary(components: Sequence[str], classes: Sequence[str]) -> tuple[dict, ...]:
    """Per layer: how many heroes, bloats and aligned components ({"layer", "heroes", "bloats", "aligned"})."""
    layers = sorted({parse_component(c)[0] for c in components})
    rows = {layer: {"layer": layer, "heroes": 0, "bloats": 0, "aligned": 0} for layer in layers}
    for name, kind in zip(components, classes):
        rows[parse_component(name)[0]][{"hero": "heroes", "bloat": "bloats", "aligned": "aligned"}[kind]] += 1
    return tuple(rows[layer] for layer in layers)


def superadditivity(joint_damage: float, single_damages: Sequence[float]) -> tuple[float | None, float | None, str]:
    """(joint / mean single, joint / sum of singles, reason): the ratios, or None with the reason why
    they are undefined (fewer than 2 components; single damages summing to <= 0).

    joint / sum > 1 means superadditive. Paper: 43.8% joint / 3.1% mean single = 14.1x.
    """
    singles = np.asarray(single_damages, dtype=np.float64)
    if singles.size < 2:
        return None, None, f"undefined: superadditivity needs at least 2 components, got {singles.size}."
    total = float(singles.sum())
    if total <= 0.0:
        return None, None, (
            f"undefined: the single damages sum to {total:.4g} (not positive), so no ratio to them has a meaning."
        )
    return float(joint_damage) / (total / singles.size), float(joint_damage) / total, ""


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


def _versions() -> dict:
    import transformers

    from core import __version__

    return {"headlab": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


@dataclass(frozen=True)
class AttributionSettings:
    """Everything that determines an AttributionResult besides the model (compared on resume)."""

    task: str
    gradient_variant: str = "paper"
    n_batches: int = 50
    batch_size: int = 64
    ablation_mode: str = "mean"
    n_examples: int = 500
    seed: int = 0
    threshold: float = DEFAULT_THRESHOLD
    rule: str = "paper"
    ood_length: int | None = None  # None: chosen by the reference rule

    def __post_init__(self) -> None:
        check_task(self.task)
        for name in ("n_batches", "batch_size", "n_examples", "seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "threshold", float(self.threshold))
        if self.gradient_variant not in GRADIENT_VARIANTS:
            raise HeadLabError(f"gradient variant {self.gradient_variant!r} is unknown; use 'paper' or 'reference'.")
        if self.ablation_mode not in ABLATION_MODES:
            raise HeadLabError(f"ablation mode {self.ablation_mode!r} is unknown; use 'mean' or 'zero'.")
        if self.rule not in CLASS_RULES:
            raise HeadLabError(f"classification rule {self.rule!r} is unknown; use 'paper' or 'reference'.")
        if min(int(self.n_batches), int(self.batch_size), int(self.n_examples)) < 1:
            raise HeadLabError("n_batches, batch_size and n_examples must be at least 1.")
        if self.ood_length is not None:
            check_ood_length(self.ood_length)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | str) -> "AttributionSettings":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class JointAblation:
    """All bloats (or all heroes) ablated together, their single damages and the superadditivity ratios."""

    kind: str  # "bloats" | "heroes"
    components: tuple[str, ...]
    joint_accuracy: float | None  # None: nothing to ablate
    joint_damage: float | None  # clean accuracy - joint_accuracy
    single_damages: tuple[float, ...]
    ratio_to_mean: float | None  # joint damage / mean single damage
    ratio_to_sum: float | None  # joint damage / sum of single damages (> 1: superadditive)
    reason: str = ""  # why the ratios are undefined; "" when defined

    def to_json(self) -> dict:
        out = asdict(self)
        out["components"], out["single_damages"] = list(self.components), list(self.single_damages)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "JointAblation":
        return cls(
            data["kind"], tuple(data["components"]), data["joint_accuracy"], data["joint_damage"],
            tuple(float(v) for v in data["single_damages"]), data["ratio_to_mean"], data["ratio_to_sum"], data.get("reason", ""),
        )


def joint_ablation(kind: str, components: Sequence[str], damages: Sequence[float], joint_damage: float | None, clean: float) -> JointAblation:
    """Assemble a JointAblation from measured damages (each component alone, and all together)."""
    components, singles = tuple(components), tuple(float(v) for v in damages)
    if not components:
        return JointAblation(kind, (), None, None, (), None, None, f"undefined: there are no {kind}.")
    ratio_mean, ratio_sum, reason = superadditivity(float(joint_damage), singles)
    return JointAblation(kind, components, clean - float(joint_damage), float(joint_damage), singles, ratio_mean, ratio_sum, reason)


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1))


@dataclass(frozen=True)
class AttributionResult:
    """One model's gradient-vs-causal analysis. Arrays are per component, in `components` order."""

    model: str
    revision: str | None
    components: tuple[str, ...]
    G: tuple[float, ...]
    C: tuple[float, ...]
    rank_G: tuple[float, ...]
    rank_C: tuple[float, ...]
    d: tuple[float, ...]
    classes: tuple[str, ...]
    rho: float | None
    rho_p: float | None
    ood_length: int
    clean_accuracy: float
    accuracy_by_length: dict[int, float]
    ablated_accuracy: tuple[float, ...]
    joint_bloats: JointAblation
    joint_heroes: JointAblation
    per_layer: tuple[dict, ...]
    settings: AttributionSettings
    notes: tuple[str, ...] = ()
    provenance: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.settings.task

    def members(self, kind: str) -> tuple[str, ...]:
        """Components of one class ("hero", "bloat", "aligned")."""
        return tuple(c for c, k in zip(self.components, self.classes) if k == kind)

    def to_json(self) -> dict:
        return {
            "model": self.model, "revision": self.revision, "task": self.task, "components": list(self.components),
            "G": list(self.G), "C": list(self.C), "rank_G": list(self.rank_G), "rank_C": list(self.rank_C),
            "d": list(self.d), "classes": list(self.classes), "rho": self.rho, "rho_p": self.rho_p,
            "ood_length": self.ood_length, "clean_accuracy": self.clean_accuracy,
            "accuracy_by_length": {str(k): v for k, v in self.accuracy_by_length.items()},
            "ablated_accuracy": list(self.ablated_accuracy),
            "joint_bloats": self.joint_bloats.to_json(), "joint_heroes": self.joint_heroes.to_json(),
            "per_layer": [dict(row) for row in self.per_layer], "settings": self.settings.to_json(),
            "notes": list(self.notes), "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict | str) -> "AttributionResult":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(
            data["model"], data["revision"], tuple(data["components"]), _floats(data["G"]), _floats(data["C"]),
            _floats(data["rank_G"]), _floats(data["rank_C"]), _floats(data["d"]), tuple(data["classes"]),
            data["rho"], data["rho_p"], int(data["ood_length"]), float(data["clean_accuracy"]),
            {int(k): float(v) for k, v in data["accuracy_by_length"].items()}, _floats(data["ablated_accuracy"]),
            JointAblation.from_json(data["joint_bloats"]), JointAblation.from_json(data["joint_heroes"]),
            tuple(dict(row) for row in data["per_layer"]), AttributionSettings.from_json(data["settings"]),
            tuple(data.get("notes", ())), dict(data.get("provenance", {})),
        )


def assemble_result(
    model: str, revision: str | None, components: Sequence[str], G: Sequence[float], C: Sequence[float],
    clean_accuracy: float, accuracy_by_length: dict[int, float], ood_length: int, settings: AttributionSettings,
    joint_damage: Callable[[Sequence[str]], float], notes: Sequence[str] = (), provenance: dict | None = None,
) -> AttributionResult:
    """Ranks, classes, rho, per-layer counts and joint ablations from measured G and C.

    joint_damage(components) measures the damage of ablating them together (called once for the
    bloats and once for the heroes when there are at least 2; a single one reuses its C).
    """
    components = tuple(components)
    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    rank_g, rank_c, d = rank_differences(G, C)
    classes = classify_components(d, settings.threshold, settings.rule)
    rho, rho_p = spearman(G, C)
    notes = list(notes)
    if rho is None:
        notes.append("Spearman rho is undefined: G or C is the same for every component.")
    joints = []
    for kind, label in (("bloat", "bloats"), ("hero", "heroes")):
        idx = [i for i, k in enumerate(classes) if k == kind]
        members = [components[i] for i in idx]
        singles = [float(C[i]) for i in idx]
        joint = None if not idx else singles[0] if len(idx) == 1 else float(joint_damage(members))
        joints.append(joint_ablation(label, members, singles, joint, float(clean_accuracy)))
    return AttributionResult(
        model=str(model), revision=revision, components=components, G=_floats(G), C=_floats(C),
        rank_G=_floats(rank_g), rank_C=_floats(rank_c), d=_floats(d), classes=classes, rho=rho, rho_p=rho_p,
        ood_length=int(ood_length), clean_accuracy=float(clean_accuracy),
        accuracy_by_length={int(k): float(v) for k, v in accuracy_by_length.items()},
        ablated_accuracy=_floats(float(clean_accuracy) - C), joint_bloats=joints[0], joint_heroes=joints[1],
        per_layer=per_layer_summary(components, classes), settings=settings, notes=tuple(notes),
        provenance=dict(provenance or {}),
    )


def analyze_model(
    hf_model: Any, bridge: Any, settings: AttributionSettings, model_name: str = "", revision: str | None = None,
    manifest_task: str | None = None, progress: ProgressFn | None = None,
) -> AttributionResult:
    """The whole analysis of one model: OOD length, G, C, ranks, classes, joint ablations.

    hf_model: the plain Hugging Face model (gradients); bridge: a TransformerBridge over the same
    weights (ablations). manifest_task: the task the zoo manifest names, when known.
    """
    name = model_name or "model"
    check_model_for_task(hf_model, settings.task, manifest_task, name)
    blocks = component_blocks(hf_model)
    if (blocks.n_layers, blocks.n_heads) != (int(bridge.cfg.n_layers), int(bridge.cfg.n_heads)):
        raise HeadLabError("the Hugging Face model and the bridge differ in shape; load both from the same checkpoint.")
    if progress is not None:
        progress("clean accuracy per OOD length", 0, 1)
    length, accuracy = pick_ood_length(_bridge_logits_fn(bridge), settings.task, settings.n_examples, settings.seed, settings.ood_length)
    if progress is not None:
        progress("clean accuracy per OOD length", 1, 1)
    G = gradient_magnitudes(hf_model, settings.task, length, settings.n_batches, settings.batch_size, settings.seed,
                            settings.gradient_variant, progress)
    evaluator = AccuracyUnderAblation(bridge, settings.task, length, settings.n_examples, settings.seed,
                                      settings.ablation_mode, blocks.components)
    C = single_damages(evaluator, blocks.components, progress)
    provenance = {
        "versions": _versions(), "ood_length_rule": "given" if settings.ood_length is not None else
        f"first of {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1} with clean accuracy in [{OOD_ACCURACY_BAND[0]}, {OOD_ACCURACY_BAND[1]}]",
        "gradient_blocks": {c: [p.name + f"[{_fmt(p.rows)}, {_fmt(p.cols)}]" for p in
                                (blocks.paper if settings.gradient_variant == "paper" else blocks.reference)[c]]
                            for c in blocks.components},
        "gradient_batches": f"{settings.n_batches} batches of {settings.batch_size} at length {length}, generator seeded from (seed, 1)",
        "evaluation": f"{settings.n_examples} examples make_sequence_batch(task, {length}, n, seed={settings.seed}), greedy "
                      "exact match (computed in one teacher-forced pass, identical for a causal model)",
        "ablation_site": "heads: blocks.{l}.attn.hook_z slice; MLPs: the MLP output hook; every position",
        "mean_ablation": "per-position mean over the evaluation sequences (teacher-forced clean run)",
    }

    def joint_damage(members: Sequence[str]) -> float:
        stage = f"joint ablation of {len(members)} components"
        if progress is not None:
            progress(stage, 0, 1)
        value = evaluator.damage(members)
        if progress is not None:
            progress(stage, 1, 1)
        return value

    return assemble_result(name, revision, blocks.components, G, C, evaluator.clean, accuracy, length, settings,
                           joint_damage, blocks.notes, provenance)


def _fmt(s: slice) -> str:
    return ":" if s.start is None and s.stop is None else f"{s.start}:{s.stop}"


# ----------------------------------------------------------------------------------------------
# Over seeds
# ----------------------------------------------------------------------------------------------


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, population std, count) over the defined values; (None, None, 0) when none are."""
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not clean:
        return None, None, 0
    return float(np.mean(clean)), float(np.std(clean, ddof=0)), len(clean)


@dataclass(frozen=True)
class AttributionSummary:
    """One task's results over seeds: rho's mean and spread, hero/bloat counts per component."""

    task: str
    models: tuple[str, ...]
    rhos: tuple[float | None, ...]
    rho_mean: float | None
    rho_std: float | None  # population std (ddof=0) over the defined rhos
    rho_min: float | None
    rho_max: float | None
    components: tuple[str, ...]
    hero_counts: tuple[int, ...]  # [component]: in how many models it is a hero
    bloat_counts: tuple[int, ...]
    per_layer: tuple[dict, ...]  # heroes and bloats per layer, summed over models
    joint: dict  # per kind: mean/std of joint damage, mean single damage, ratios (over defined ones)
    skipped: tuple[tuple[str, str], ...]  # (model, reason) not analysed
    settings: AttributionSettings

    @property
    def n_models(self) -> int:
        return len(self.models)

    def counts(self, kind: str) -> dict[str, int]:
        """{component: in how many models it is a `kind` ("hero" or "bloat")}."""
        values = {"hero": self.hero_counts, "bloat": self.bloat_counts}[kind]
        return dict(zip(self.components, values))

    def to_json(self) -> dict:
        return {
            "task": self.task, "models": list(self.models), "n_models": self.n_models, "rhos": list(self.rhos),
            "rho_mean": self.rho_mean, "rho_std": self.rho_std, "rho_min": self.rho_min, "rho_max": self.rho_max,
            "components": list(self.components), "hero_counts": list(self.hero_counts),
            "bloat_counts": list(self.bloat_counts), "per_layer": [dict(r) for r in self.per_layer],
            "joint": self.joint, "skipped": [list(s) for s in self.skipped], "settings": self.settings.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict | str) -> "AttributionSummary":
        data = json.loads(data) if isinstance(data, str) else data
        return cls(
            data["task"], tuple(data["models"]), tuple(data["rhos"]), data["rho_mean"], data["rho_std"],
            data["rho_min"], data["rho_max"], tuple(data["components"]), tuple(int(v) for v in data["hero_counts"]),
            tuple(int(v) for v in data["bloat_counts"]), tuple(dict(r) for r in data["per_layer"]), dict(data["joint"]),
            tuple((str(a), str(b)) for a, b in data["skipped"]), AttributionSettings.from_json(data["settings"]),
        )


def summarize(results: Sequence[AttributionResult], skipped: Sequence[tuple[str, str]] = ()) -> AttributionSummary:
    """Aggregate per-seed results of one task (same components and settings) into an AttributionSummary."""
    if not results:
        raise HeadLabError("no analysed models to summarise; run the analysis on at least one model first.")
    first = results[0]
    for r in results[1:]:
        if r.components != first.components or r.settings != first.settings:
            raise HeadLabError(
                f"{r.model} was analysed with other components or settings than {first.model}; rerun them with the same settings."
            )
    rhos = tuple(r.rho for r in results)
    defined = [v for v in rhos if v is not None]
    rho_mean, rho_std, _ = _mean_std(rhos)
    hero = tuple(sum(r.classes[i] == "hero" for r in results) for i in range(len(first.components)))
    bloat = tuple(sum(r.classes[i] == "bloat" for r in results) for i in range(len(first.components)))
    layers = {row["layer"]: {"layer": row["layer"], "heroes": 0, "bloats": 0} for row in first.per_layer}
    for r in results:
        for row in r.per_layer:
            layers[row["layer"]]["heroes"] += row["heroes"]
            layers[row["layer"]]["bloats"] += row["bloats"]
    joint = {}
    for kind in ("bloats", "heroes"):
        parts = [getattr(r, f"joint_{kind}") for r in results]
        damage_mean, damage_std, n_damage = _mean_std([p.joint_damage for p in parts])
        single_mean, _, _ = _mean_std([float(np.mean(p.single_damages)) if p.single_damages else None for p in parts])
        ratio_mean, ratio_mean_std, n_ratio = _mean_std([p.ratio_to_mean for p in parts])
        ratio_sum, ratio_sum_std, _ = _mean_std([p.ratio_to_sum for p in parts])
        joint[kind] = {
            "joint_damage_mean": damage_mean, "joint_damage_std": damage_std, "models_with_any": n_damage,
            "mean_single_damage": single_mean, "ratio_to_mean_mean": ratio_mean, "ratio_to_mean_std": ratio_mean_std,
            "ratio_to_sum_mean": ratio_sum, "ratio_to_sum_std": ratio_sum_std, "models_with_ratio": n_ratio,
        }
    return AttributionSummary(
        task=first.task, models=tuple(r.model for r in results), rhos=rhos, rho_mean=rho_mean, rho_std=rho_std,
        rho_min=min(defined) if defined else None, rho_max=max(defined) if defined else None,
        components=first.components, hero_counts=hero, bloat_counts=bloat,
        per_layer=tuple(layers[k] for k in sorted(layers)), joint=joint,
        skipped=tuple((str(a), str(b)) for a, b in skipped), settings=first.settings,
    )


# ----------------------------------------------------------------------------------------------
# Loading a model and the command line
# ----------------------------------------------------------------------------------------------


def manifest_task(ref: Any) -> str | None:
    """The task a zoo (or local HeadLab) model's manifest names; None when there is no manifest."""
    from core.workspace import zoo_dir

    root = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name) if ref.kind == "local" else None
    if root is None or not (root / "manifest.json").is_file():
        return None
    try:
        return json.loads((root / "manifest.json").read_text()).get("task")
    except (OSError, ValueError):
        raise HeadLabError(f"{root / 'manifest.json'} is unreadable; delete {root} and retrain the model.") from None


def analyze_ref(ref: Any, settings: AttributionSettings, revision: str | None = None, device: str = "cpu",
                progress: ProgressFn | None = None) -> AttributionResult:
    """Load a model (plain HF for gradients, a bridge for ablations) and analyse it."""
    from core.model.loading import load_hf_model, load_model, resolve_checkpoint

    trained_for = manifest_task(ref)
    check_model_for_task(None, settings.task, trained_for, ref.name)  # before any weight is read
    resolved = revision if ref.kind == "hub" else resolve_checkpoint(ref, revision).revision
    hf_model = load_hf_model(ref, resolved, device)
    check_model_for_task(hf_model, settings.task, trained_for, ref.name)
    bridge = load_model(ref, resolved, device)
    result = analyze_model(hf_model, bridge, settings, ref.name, resolved, trained_for, progress)
    return replace(result, provenance={**result.provenance, "model_ref": ref.to_json(), "device": device})


def attribution_dir() -> Path:
    """Where per-model results of preset runs are kept: reports_dir()/attribution/."""
    from core.workspace import reports_dir

    path = reports_dir() / "attribution"
    path.mkdir(parents=True, exist_ok=True)
    return path


def preset_models(preset: str, task: str) -> list[str]:
    """The zoo preset's model names trained on `task` (e.g. reverse-hhg-s0 .. s9 for paper/reverse)."""
    from core.zoo.train import ZOO_PRESETS

    if preset not in ZOO_PRESETS:
        raise HeadLabError(f"unknown zoo preset {preset!r}; choose one of {', '.join(sorted(ZOO_PRESETS))}.")
    names = [name for name, _, train_cfg in ZOO_PRESETS[preset] if train_cfg.task == check_task(task)]
    if not names:
        raise HeadLabError(f"the {preset} preset has no {task} models; pick another preset.")
    return names


def _stored(path: Path, settings: AttributionSettings, revision: str) -> dict | None:
    """A stored per-model record (result or skip) made with the same settings on the same
    checkpoint, else None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        same = AttributionSettings.from_json(data["settings"]) == settings and data.get("revision") == revision
        return data if same else None
    except (OSError, ValueError, KeyError, TypeError, HeadLabError):
        return None  # unreadable or from another version: recompute


def stored_result(name: str, settings: AttributionSettings, revision: str) -> AttributionResult | None:
    """The stored result of model `name` at `revision` made with `settings` (a preset run's
    attribution_dir()/<name>.json), else None."""
    data = _stored(attribution_dir() / f"{name}.json", settings, revision)
    return None if data is None else AttributionResult.from_json(data)


def stored_summaries(task: str | None = None, folder: Path | None = None) -> list[AttributionSummary]:
    """Summaries of the stored per-model results (attribution_dir() by default), one per group
    analysed alike (same task, settings and components), largest group first.

    Each summary names the models skipped under its settings, and stored results of zoo models
    retrained since (another final revision) as skipped, not counted. Unreadable files are left out.
    """
    folder = attribution_dir() if folder is None else Path(folder)
    groups: dict[tuple, list[AttributionResult]] = {}
    skipped: dict[AttributionSettings, list[tuple[str, str]]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("summary-"):
            continue
        try:
            data = json.loads(path.read_text())
            if path.name.endswith(".skipped.json"):
                skipped.setdefault(AttributionSettings.from_json(data["settings"]), []).append((str(data["model"]), str(data["reason"])))
                continue
            result = AttributionResult.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, HeadLabError):
            continue  # unreadable or from another version
        if task is not None and result.task != task:
            continue
        current, _ = _zoo_status(result.model)
        if current is not None and result.revision != current:
            skipped.setdefault(result.settings, []).append(
                (result.model, f"stored result is for {result.revision}, the model was retrained to {current}; rerun the preset"))
            continue
        groups.setdefault((result.settings, result.components), []).append(result)
    summaries = [summarize(results, skipped.get(settings, ())) for (settings, _), results in groups.items()]
    return sorted(summaries, key=lambda s: -s.n_models)


def sequence_zoo_models() -> dict[str, str]:
    """{zoo model: task} for every zoo model whose manifest names reverse or sort."""
    from core.model.loading import ModelRef, list_zoo
    from core.tasks.sequences import TASKS

    out = {}
    for name in list_zoo():
        try:
            task = manifest_task(ModelRef(name, "zoo"))
        except HeadLabError:
            continue
        if task in TASKS:
            out[name] = task
    return out


def _zoo_status(name: str) -> tuple[str | None, str]:
    """(final revision, "") for a fully trained zoo model, else (None, why it cannot be analysed)."""
    from core.workspace import zoo_dir

    path = zoo_dir() / name / "manifest.json"
    if not path.is_file():
        return None, "not trained"
    try:
        manifest = json.loads(path.read_text())
        checkpoints = sorted(manifest["checkpoints"], key=lambda c: (int(c["tokens"]), int(c["step"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"manifest {path} is unreadable"
    if not manifest.get("complete", True):
        return None, "still training (its manifest is not complete)"
    if not checkpoints:
        return None, "no checkpoints"
    return str(checkpoints[-1]["revision"]), ""


def run_preset(preset: str, settings: AttributionSettings, device: str = "cpu", progress: bool = True,
               force: bool = False) -> tuple[AttributionSummary, dict[str, Path]]:
    """Analyse every model of the preset for `settings.task`, resumably: each model's result is
    stored atomically as attribution_dir()/<model>.json (a model skipped by the OOD band as
    <model>.skipped.json) and reused when its settings match. Returns the summary and the paths."""
    from tqdm import tqdm

    from core.model.loading import ModelRef
    from core.workspace import atomic_write_json

    names = preset_models(preset, settings.task)
    status = {n: _zoo_status(n) for n in names}
    ready = [n for n in names if status[n][0] is not None]
    if not ready:
        raise HeadLabError(f"none of the {preset} preset's {settings.task} models is trained; run python -m core zoo --preset {preset} first.")
    folder = attribution_dir()
    results: list[AttributionResult] = []
    skipped: list[tuple[str, str]] = [(n, status[n][1]) for n in names if status[n][0] is None]
    paths: dict[str, Path] = {}
    bar = tqdm(ready, desc=f"attribution {settings.task}", unit="model", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        stage = _postfix_progress(bar, name) if progress else None
        revision = status[name][0]
        path, skip_path = folder / f"{name}.json", folder / f"{name}.skipped.json"
        stored = None if force else _stored(path, settings, revision)
        if stored is not None:
            results.append(AttributionResult.from_json(stored))
            paths[name] = path
            continue
        stored_skip = None if force else _stored(skip_path, settings, revision)
        if stored_skip is not None:
            skipped.append((name, stored_skip["reason"]))
            continue
        try:
            result = analyze_ref(ModelRef(name, "zoo"), settings, revision, device=device, progress=stage)
        except NoOODLengthError as exc:
            atomic_write_json(skip_path, {"model": name, "revision": revision, "reason": str(exc), "settings": settings.to_json()})
            skipped.append((name, str(exc)))
            continue
        atomic_write_json(path, result.to_json())
        skip_path.unlink(missing_ok=True)
        results.append(result)
        paths[name] = path
    if not results:
        reasons = "; ".join(f"{n}: {why}" for n, why in skipped)
        raise HeadLabError(f"no {settings.task} model of the {preset} preset could be analysed ({reasons}); see the reasons and retrain or pass --ood-length.")
    summary = summarize(results, skipped)
    summary_path = folder / f"summary-{preset}-{settings.task}.json"
    atomic_write_json(summary_path, summary.to_json())
    paths["summary"] = summary_path
    return summary, paths


def _postfix_progress(bar: Any, name: str) -> ProgressFn:
    """A ProgressFn that shows the current stage of one model in a tqdm bar's postfix."""

    def show(stage: str, done: int, total: int) -> None:
        bar.set_postfix_str(f"{name + ': ' if name else ''}{stage} {done}/{total}")

    return show


def add_attribution_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, help="zoo name, local Hugging Face folder or hub name (omit with --zoo-preset)")
    parser.add_argument("--task", required=True, choices=("reverse", "sort"), help="the task the model was trained on")
    parser.add_argument("--zoo-preset", default=None, help="analyse every model of this zoo preset trained on --task (e.g. paper)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the last one)")
    parser.add_argument("--ood-length", type=int, default=None, help="OOD length (default: first of 8..11 with accuracy in [0.20, 0.75])")
    parser.add_argument("--gradient-variant", choices=GRADIENT_VARIANTS, default="paper", help="paper (W_V+W_O / sqrt(n), default) or reference (W_V rows, raw)")
    parser.add_argument("--ablation", choices=ABLATION_MODES, default="mean", help="mean (default) or zero ablation")
    parser.add_argument("--n-batches", type=int, default=50, help="OOD batches for the gradient (default 50)")
    parser.add_argument("--batch-size", type=int, default=64, help="gradient batch size (default 64)")
    parser.add_argument("--n-examples", type=int, default=500, help="evaluation examples per accuracy (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation examples and gradient batches")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="rank-difference threshold (default 6)")
    parser.add_argument("--rule", choices=CLASS_RULES, default="paper", help="paper: d >= threshold; reference: d > threshold")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--force", action="store_true", help="recompute stored per-model results (--zoo-preset)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def cli_attribution(args: argparse.Namespace) -> dict:
    """One model (MODEL) -> its AttributionResult JSON; --zoo-preset -> the AttributionSummary JSON."""
    from core.model.loading import ModelRef

    settings = AttributionSettings(
        task=args.task, gradient_variant=args.gradient_variant, n_batches=args.n_batches, batch_size=args.batch_size,
        ablation_mode=args.ablation, n_examples=args.n_examples, seed=args.seed, threshold=args.threshold,
        rule=args.rule, ood_length=args.ood_length,
    )
    if args.zoo_preset is not None:
        if args.model is not None:
            raise HeadLabError("give either MODEL or --zoo-preset, not both.")
        summary, paths = run_preset(args.zoo_preset, settings, args.device, not args.no_progress, args.force)
        print(_summary_line(summary))
        print(f"per-model results in {attribution_dir()}")
        out = summary.to_json()
        out["paths"] = {k: str(v) for k, v in paths.items()}
        return out
    if args.model is None:
        raise HeadLabError("give a MODEL (zoo name or folder) or --zoo-preset paper.")
    from tqdm import tqdm

    ref = ModelRef.parse(args.model)
    with tqdm(total=None, desc=f"attribution {ref.name[-40:]}", bar_format="{desc}{postfix}", disable=args.no_progress) as bar:
        result = analyze_ref(ref, settings, args.revision, args.device, None if args.no_progress else _postfix_progress(bar, ""))
    print(_result_line(result))
    return result.to_json()


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "undefined" if value is None else format(value, fmt)


def _result_line(r: AttributionResult) -> str:
    ratio = r.joint_bloats.ratio_to_mean
    return (
        f"{r.model}: OOD length {r.ood_length} (clean {r.clean_accuracy:.2f}), rho {_num(r.rho)}, "
        f"heroes {', '.join(r.members('hero')) or 'none'}, bloats {', '.join(r.members('bloat')) or 'none'}, "
        f"bloat joint/mean-single {_num(ratio, '.1f')}" + ("" if ratio is not None else f" ({r.joint_bloats.reason})")
    )


def _summary_line(s: AttributionSummary) -> str:
    return (
        f"{s.task}: {s.n_models} models, rho {_num(s.rho_mean)} +- {_num(s.rho_std)} "
        f"(min {_num(s.rho_min)}, max {_num(s.rho_max)}), skipped {len(s.skipped)}"
    )
