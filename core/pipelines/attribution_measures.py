"""The two measures of the gradient-vs-causal analysis [HHG] on one model: gradient magnitude G and
causal importance C per component, and the OOD length both are taken at.

G is taken on the plain Hugging Face model (its weight slices per component: `component_blocks`);
C runs through the ablation engine on a TransformerBridge. The choices behind both (which weights
form a block, mean ablation per position, greedy exact match in one teacher-forced pass) are
stated in core/pipelines/attribution.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from core.ablation.engine import ablated_logits_fn
from core.ablation.replacements import compute_replacements
from core.ablation.spec import SEQUENCE_MODES, Ablation
from core.errors import HeadLabError
from core.heads import HeadSet
from core.pipelines.attribution_results import (
    GRADIENT_VARIANTS,
    check_ood_length,
    component_name,
    component_order,
    parse_component,
)
from core.tasks.sequences import (
    OOD_ACCURACY_BAND,
    OOD_LENGTHS,
    SEQ_VOCAB_SIZE,
    check_task,
    choose_ood_length,
    exact_match_one_pass,
    make_sequence_batch,
)

ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)


class NoOODLengthError(HeadLabError):
    """No usable OOD length (none in the accuracy band, or the given one is never solved): the
    reference skips such a seed, and so does a preset run."""


# ----------------------------------------------------------------------------------------------
# Components and their weights
# ----------------------------------------------------------------------------------------------


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
# Input checks and the OOD length
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


def bridge_logits_fn(model: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """tokens -> logits for a bridge (returns a tensor) or a Hugging Face model (returns .logits)."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def run(tokens: torch.Tensor) -> torch.Tensor:
        out = model(tokens.to(device))
        return out if isinstance(out, torch.Tensor) else out.logits

    return run


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
    accuracy = {n: float(exact_match_one_pass(logits_fn, task, n, n_examples, seed).double().mean()) for n in lengths}
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
    the replacement statistics (means: over examples and positions for "mean" and "reference-slice",
    per position for "mean-per-position") come from those same examples' full clean sequences.
    """

    def __init__(self, model: Any, task: str, length: int, n_examples: int, seed: int, mode: str = "mean", components: Sequence[str] = ()):
        if mode not in SEQUENCE_MODES:
            raise HeadLabError(f"ablation mode {mode!r} is unknown; use one of {', '.join(SEQUENCE_MODES)}.")
        if not hasattr(model, "run_with_hooks"):
            raise HeadLabError("causal importance runs through the ablation engine; load the model with core.model.loading.load_model.")
        self.model, self.task, self.length = model, check_task(task), int(length)
        self.n_examples, self.seed, self.mode = int(n_examples), int(seed), mode
        self.replacements = None
        if mode != "zero" and components:
            tokens, _ = make_sequence_batch(task, self.length, self.n_examples, self.seed)  # [example, 2n+3]
            self.replacements = compute_replacements(model, tokens, _ablation_of(components, mode), batch_size=256)
        self.clean = self.accuracy(())

    def accuracy(self, components: Sequence[str]) -> float:
        fn = ablated_logits_fn(self.model, _ablation_of(components, self.mode), self.replacements)
        return float(exact_match_one_pass(fn, self.task, self.length, self.n_examples, self.seed).double().mean())

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
