"""Models trained with a planted circuit: the task can only run through heads chosen in advance.

SIIT-style planting (InterpBench, Gupta et al. 2024), reduced to its strict part: every head that is
*not* in the chosen circuit is resample-ablated during training. A forward pre-hook on each layer's
attention output projection (GPT-NeoX `attention.dense`, Llama `self_attn.o_proj`; its input is
[batch, pos, n_heads * d_head], head-major) replaces the non-circuit heads' slices by those of the
previous example of the batch (rows rolled by one). A non-circuit head then cannot carry any
example-specific information to the loss, so whatever moves information between positions for the
task must be a circuit head. The tasks are chosen so that the circuit needs each chosen head:

- "induction" (GPT-NeoX): repeated random chunks and twice-planted bigrams; a previous-token head L0H1 writes the previous
  token into every position, and an induction head L1H2 finds the position after the query's
  earlier copy through K-composition (a second-layer head is forced: one layer cannot do it);
- "duplicate" (GPT-NeoX): BOS, then pairs (x, label), label YES when x occurred earlier in the row;
  one duplicate-token head L1H1 attends from x to its earlier copy (to BOS when there is none);
- "two-back" (Llama): quadruples (a, b, M, a); at the marker M the answer is the token two back,
  copied by one head L0H2.

The circuit heads get an attention-pattern guide (a small loss on their attention to the pattern's
keys) so that the circuit forms within ~30 s; that they are *used* is forced by the resampling alone.
Each model also has a *decoy*: a non-circuit head trained (an attention-pattern loss) to attend like
a circuit head (a previous-token, duplicate-token or two-back pattern) while its output stays
resample-ablated, so it looks busy and is causally irrelevant: a true negative for every proposer.

Nothing is taken on trust: after training, every head is patched alone (activation patching on the
task's clean/corrupted pairs, denoising and noising), the circuit, then every other head, is
resample-ablated on the task's probe, and each circuit head is path-patched into each later one
through q, k and v. The ground truth is written to `circuit.json` only when the
confirmation rule (`confirmation_rule`) holds; `confirmation.json` beside it records the numbers
either way, so a seed that fails is reported, not hidden.

A model is one unit of work: trained, confirmed and written into a temporary folder renamed to
`zoo_dir()/<name>/` when everything is there, so the folder is complete or absent and a rerun skips
a complete one (at most ~60 s of training is redone after an interrupt).

Long because the three tasks, their pairs, the planting hooks, the training loop and the confirmation
rule are one recipe whose parts are only meaningful together (the figures live in core/cli/planted.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import partial
from numbers import Integral
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from core.ablation.engine import run_conditions
from core.ablation.patching import PatchSettings, activation_patching, path_patching
from core.ablation.spec import Ablation
from core.errors import HeadLabError
from core.executor import ProgressBar
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import load_model
from core.model.refs import MANIFEST, ModelRef, model_is_complete, read_manifest, zoo_model_dir
from core.results import JsonResult
from core.tasks.counterfactual import PatchPair
from core.tasks.known import KNOWN_TASKS, PairTask, SwapInductionSpec, known_task
from core.tasks.mixture import batch_generator
from core.tasks.probe_batch import ProbeBatch, check_seed
from core.workspace import atomic_directory, atomic_write_json
from core.zoo.config import ModelConfig
from core.zoo.known.handwired import measure_bounds
from core.zoo.known.truth import KnownCircuit, edge_text, parse_edge, write_circuit
from core.zoo.train import _save_checkpoint, build_model, load_checkpoint_model, log_checkpoint_steps

VOCAB_SIZE = 64
YES, NO, MARK, BOS = 0, 1, 2, 3  # labels, the two-back marker, the duplicate rows' first token
CONTENT_LOW = 4  # content tokens are [CONTENT_LOW, VOCAB_SIZE)
# The duplicate rows draw from [CONTENT_LOW, DUPLICATE_HIGH) only: telling an earlier copy from none needs a
# sharp token match; one head's QK learnt it over 20 tokens within the budget, not over 60 (at d_head 16).
DUPLICATE_HIGH = 24
TASKS = ("induction", "duplicate", "two-back")
PATTERNS = ("previous-token", "two-back", "duplicate-token", "duplicate-or-first", "induction")  # pattern_keys
CONFIRMATION = "confirmation.json"


# ----------------------------------------------------------------------------------- tasks


def _content(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(CONTENT_LOW, VOCAB_SIZE, shape, generator=gen)


def induction_rows(gen: torch.Generator, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Even rows: a random prefix, then a chunk of 4..seq_len//2 distinct tokens repeated to the end. Odd
    rows: fillers with three bigrams A B planted twice (first copies before second copies), as in the
    swap probe (core.tasks.known); the fillers avoid the planted tokens.

    Returns tokens [n, seq_len] and mask [n, seq_len] (mask[t]: the prediction of tokens[t+1] is
    scored; true where induction predicts it: inside the repeats, at the second A of each bigram).
    """
    tokens = torch.empty((n, seq_len), dtype=torch.long)
    mask = torch.zeros((n, seq_len), dtype=torch.bool)
    n_content = VOCAB_SIZE - CONTENT_LOW
    for i in range(n):
        if i % 2 == 0:
            chunk_len = int(torch.randint(4, seq_len // 2 + 1, (), generator=gen))
            prefix_len = int(torch.randint(0, seq_len - 2 * chunk_len + 1, (), generator=gen))
            chunk = CONTENT_LOW + torch.randperm(n_content, generator=gen)[:chunk_len]
            copies = -(-(seq_len - prefix_len) // chunk_len)
            tokens[i] = torch.cat([_content(gen, (prefix_len,)), chunk.repeat(copies)])[:seq_len]
            mask[i, prefix_len + chunk_len: seq_len - 1] = True  # the second copy on: its next token was seen
        else:
            order = CONTENT_LOW + torch.randperm(n_content, generator=gen)
            planted, fillers = order[:6].view(3, 2), order[6:]
            tokens[i] = fillers[torch.randint(0, n_content - 6, (seq_len,), generator=gen)]
            slots = 2 * torch.sort(torch.randperm(seq_len // 2, generator=gen)[:6]).values
            second = torch.randperm(3, generator=gen)
            for k in range(3):
                tokens[i, slots[k]: slots[k] + 2] = planted[k]
                tokens[i, slots[3 + k]: slots[3 + k] + 2] = planted[second[k]]
                mask[i, slots[3 + k]] = True
    return tokens, mask


def duplicate_rows(gen: torch.Generator, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BOS, then pairs (x, label): x from a per-row alphabet of 8..16 of the DUPLICATE_HIGH - CONTENT_LOW
    duplicate tokens, label YES when x occurred earlier.

    tokens [n, seq_len] (x at odd positions; BOS gives a head with no earlier copy somewhere to look),
    mask [n, seq_len] true at x positions (predicting the label).
    """
    tokens = torch.empty((n, seq_len), dtype=torch.long)
    for i in range(n):
        size = int(torch.randint(8, 17, (), generator=gen))
        alphabet = CONTENT_LOW + torch.randperm(DUPLICATE_HIGH - CONTENT_LOW, generator=gen)[:size]
        xs = alphabet[torch.randint(0, size, (seq_len // 2,), generator=gen)].tolist()
        row, seen = [BOS], set()
        for x in xs:
            row += [x, YES if x in seen else NO]
            seen.add(x)
        tokens[i] = torch.tensor(row[:seq_len])
    mask = torch.zeros((n, seq_len), dtype=torch.bool)
    mask[:, 1: seq_len - 1: 2] = True
    return tokens, mask


def two_back_rows(gen: torch.Generator, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quadruples (a, b, M, a) of content tokens a != b: at M the next token is the one two back.

    tokens [n, seq_len], mask [n, seq_len] true at the markers M (predicting a).
    """
    quads = -(-seq_len // 4)
    a = _content(gen, (n, quads))
    b = CONTENT_LOW + (a - CONTENT_LOW + torch.randint(1, VOCAB_SIZE - CONTENT_LOW, (n, quads), generator=gen)) % (
        VOCAB_SIZE - CONTENT_LOW)  # uniform over the content tokens other than a
    tokens = torch.stack([a, b, torch.full_like(a, MARK), a], dim=2).reshape(n, 4 * quads)[:, :seq_len]
    mask = tokens == MARK
    mask[:, -1] = False
    return tokens, mask


ROWS: dict[str, Callable[[torch.Generator, int, int], tuple[torch.Tensor, torch.Tensor]]] = {
    "induction": induction_rows, "duplicate": duplicate_rows, "two-back": two_back_rows,
}


def training_batch(task: str, step: int, batch_size: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One training batch of `task`: tokens [batch, seq_len], loss mask [batch, seq_len]; a pure function of (seed, step)."""
    if task not in ROWS:
        raise HeadLabError(f"unknown planted task {task!r}; use one of {', '.join(TASKS)}.")
    return ROWS[task](batch_generator(seed, step, salt=31 + TASKS.index(task)), batch_size, seq_len)


def pattern_keys(pattern: str, tokens: torch.Tensor) -> torch.Tensor:
    """The keys a head with `pattern` attends to from each query: [batch, query, key] bool (none: a query
    the pattern says nothing about).

    previous-token: t-1; two-back: t-2; duplicate-token: every earlier position holding the same
    content token; duplicate-or-first: those, else position 0 (at content tokens only); induction: the
    positions after earlier copies of the current content token.
    """
    n, seq_len = tokens.shape
    pos = torch.arange(seq_len)
    if pattern in ("previous-token", "two-back"):
        back = 1 if pattern == "previous-token" else 2
        return (pos[None, :] == pos[:, None] - back).expand(n, seq_len, seq_len)
    content = tokens >= CONTENT_LOW  # [batch, pos]
    earlier = pos[None, :] < pos[:, None]  # [query, key]: key < query
    if pattern in ("duplicate-token", "duplicate-or-first"):
        hits = (tokens[:, :, None] == tokens[:, None, :]) & content[:, :, None] & earlier  # [batch, query, key]
        if pattern == "duplicate-or-first":
            none = content & ~hits.any(dim=2)  # [batch, query]
            hits = hits | (none[:, :, None] & (pos == 0))
        return hits
    if pattern == "induction":
        before = torch.cat([torch.full((n, 1), -1), tokens[:, :-1]], dim=1)  # before[s] = tokens[s-1]
        return (tokens[:, :, None] == before[:, None, :]) & content[:, :, None] & (pos[None, :] <= pos[:, None])
    raise HeadLabError(f"unknown attention pattern {pattern!r}; use one of {', '.join(PATTERNS)}.")


# ----------------------------------------------------------------------------------- probes and pairs


def _fresh(rng: np.random.RandomState, low: int, high: int, avoid: set[int]) -> int:
    """A token of [low, high) outside `avoid`, uniform."""
    choices = [t for t in range(low, high) if t not in avoid]
    return int(choices[rng.randint(len(choices))])


@dataclass(frozen=True)
class _PairSpec(PairTask, JsonResult):
    """N prompts of T tokens of the planted vocabulary, seeded; the query is the last position."""

    task: ClassVar[str] = ""
    n_examples: int = 128
    seq_len: int = 31
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_examples", "seq_len", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"{self.task} task {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        check_seed(self.seed, f"{self.task} task seed")
        if self.n_examples < 1:
            raise HeadLabError(f"{self.task} task n_examples must be at least 1.")

    def to_json(self) -> dict:
        return {"task": self.task, **super().to_json()}

    def check_vocab(self, vocab_size: int) -> None:
        if VOCAB_SIZE > int(vocab_size):
            raise HeadLabError(f"the {self.task} task uses token ids up to {VOCAB_SIZE - 1}, which a model with "
                               f"{vocab_size} tokens cannot read; use a planted model (core.zoo.known.planted).")



@dataclass(frozen=True)
class DuplicatePairSpec(_PairSpec):
    """BOS (x, label) ... x: is the last x a duplicate? Half the prompts yes, half no; corrupted: the other answer.

    Per prompt two tokens A (the last x) and F occur nowhere else; one x position p holds A in the YES
    prompt and F in the NO prompt (every label is the same in both, the one after p is NO either way).
    Even examples: clean YES, corrupted NO; odd: clean NO, corrupted YES. duplicate_pos = p.
    """

    task: ClassVar[str] = "planted-duplicate"
    seq_len: int = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len % 2 or self.seq_len < 10:
            raise HeadLabError(f"planted-duplicate prompts are BOS, (x, label) pairs and a last x, so seq_len is even "
                               f"and at least 10; got {self.seq_len}.")

    def build_pair(self) -> PatchPair:
        rng = np.random.RandomState(self.seed)
        n, q = self.n_examples, self.seq_len - 1
        clean = np.empty((n, self.seq_len), dtype=np.int64)
        corrupted = np.empty_like(clean)
        key, target, other = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        n_x = (q - 1) // 2  # x positions before the query: 1, 3, ..., q-2
        for i in range(n):
            a = _fresh(rng, CONTENT_LOW, DUPLICATE_HIGH, set())
            f = _fresh(rng, CONTENT_LOW, DUPLICATE_HIGH, {a})
            size = int(rng.randint(8, 17))
            alphabet = [t for t in rng.permutation(np.arange(CONTENT_LOW, DUPLICATE_HIGH)) if t not in (a, f)][:size]
            xs = [int(alphabet[rng.randint(len(alphabet))]) for _ in range(n_x)]
            slot = int(rng.randint(0, n_x - 1))  # p = 2 * slot + 1, at least one pair before the query
            rows = []
            for first in (a, f):
                items = list(xs)
                items[slot] = first
                row, seen = [BOS], set()
                for x in items:
                    row += [x, YES if x in seen else NO]
                    seen.add(x)
                rows.append(row + [a])
            yes, no = rows
            clean[i], corrupted[i] = (yes, no) if i % 2 == 0 else (no, yes)
            target[i], other[i] = (YES, NO) if i % 2 == 0 else (NO, YES)
            key[i] = 2 * slot + 1
        batch = self._batch(clean, target, key)
        spec = {**batch.spec, "corruption": "the x at p swapped between the last x's token A and a token F absent "
                                            "elsewhere: the label flips (even examples YES -> NO, odd NO -> YES)"}
        return PatchPair(batch, torch.from_numpy(corrupted), torch.from_numpy(other), spec)


@dataclass(frozen=True)
class TwoBackPairSpec(_PairSpec):
    """Quadruples (a, b, M, a) ending in a b M: answer a (two back); corrupted: that a replaced by a' (answer a').

    duplicate_pos = q-2 (the key the two-back head reads), induction_pos = q-1.
    """

    task: ClassVar[str] = "planted-two-back"
    seq_len: int = 31

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len % 4 != 3 or self.seq_len < 7:
            raise HeadLabError(f"planted-two-back prompts are (a, b, M, a) quadruples ending in a b M, so seq_len is "
                               f"4k + 3 (7, 11, ..., 31); got {self.seq_len}.")

    def build_pair(self) -> PatchPair:
        rng = np.random.RandomState(self.seed)
        n, q = self.n_examples, self.seq_len - 1
        tokens, _ = two_back_rows(torch.Generator().manual_seed(int(rng.randint(2**31))), n, self.seq_len)
        clean = tokens.numpy().astype(np.int64)
        corrupted = clean.copy()
        target, other = clean[:, q - 2].copy(), np.empty(n, dtype=np.int64)
        for i in range(n):
            other[i] = _fresh(rng, CONTENT_LOW, VOCAB_SIZE, {int(clean[i, q - 2]), int(clean[i, q - 1])})
        corrupted[:, q - 2] = other
        batch = self._batch(clean, target, np.full(n, q - 2))
        spec = {**batch.spec, "corruption": "the token two back from the final marker replaced: answer a -> a'"}
        return PatchPair(batch, torch.from_numpy(corrupted), torch.from_numpy(other), spec)


PAIR_SPECS = {"planted-duplicate": DuplicatePairSpec, "planted-two-back": TwoBackPairSpec}
KNOWN_TASKS.update(PAIR_SPECS)  # circuit.json's task records are read by core.tasks.known.known_task


def task_record(task: str, n_examples: int = 128, seed: int = 0) -> dict:
    """The circuit.json task record of a planted task (known_task rebuilds its pairs and probe from it).

    induction uses the swap counterfactual of core.tasks.known (A and C swapped: every true head moves)
    over the content tokens.
    """
    if task == "induction":
        return SwapInductionSpec(n_examples=n_examples, seq_len=31, token_low=CONTENT_LOW, token_high=VOCAB_SIZE,
                                 seed=seed).to_json()
    if task == "duplicate":
        return DuplicatePairSpec(n_examples=n_examples, seed=seed).to_json()
    if task == "two-back":
        return TwoBackPairSpec(n_examples=n_examples, seed=seed).to_json()
    raise HeadLabError(f"unknown planted task {task!r}; use one of {', '.join(TASKS)}.")


# ----------------------------------------------------------------------------------- planting


def output_projection(model: Any, family: str, layer: int) -> torch.nn.Module:
    """The linear layer that reads a layer's head outputs [batch, pos, n_heads * d_head] (head-major)."""
    if family == "gpt_neox":
        return model.gpt_neox.layers[layer].attention.dense
    if family == "llama":
        return model.model.layers[layer].self_attn.o_proj
    raise HeadLabError(f"planted circuits are trained in gpt_neox or llama models, not {family!r}.")


def head_columns(heads: list[int], n_heads: int, d_head: int) -> torch.Tensor:
    """Boolean [n_heads * d_head] mask of the columns of `heads` in a head-major output."""
    mask = torch.zeros(n_heads, d_head, dtype=torch.bool)
    mask[heads] = True
    return mask.reshape(-1)


def resample_slices(x: torch.Tensor, columns: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """x [batch, pos, n_heads * d_head] with the `columns` ([n_heads * d_head] bool) taken from the row
    `shift` before (rows rolled by `shift`); the other columns untouched."""
    return torch.where(columns.to(x.device), x.roll(shift, dims=0), x)


def planting_hooks(model: Any, family: str, circuit: HeadSet, n_layers: int, n_heads: int, d_head: int) -> list:
    """Register the resample pre-hooks on every layer with non-circuit heads; returns the handles (remove() them)."""
    handles = []
    for layer in range(n_layers):
        others = [h for h in range(n_heads) if (layer, h) not in circuit]
        if not others:
            continue
        columns = head_columns(others, n_heads, d_head)

        def hook(module, args, columns=columns):
            return (resample_slices(args[0], columns),) + tuple(args[1:])

        handles.append(output_projection(model, family, layer).register_forward_pre_hook(hook))
    return handles


# ----------------------------------------------------------------------------------- the recipes


@dataclass(frozen=True)
class PlantedConfig(JsonResult):
    """One planted model: task, architecture, circuit, decoys and training; recorded in its manifest."""

    name: str
    task: str
    family: str
    seed: int
    circuit: tuple[str, ...]  # heads, "L0H1"
    roles: dict[str, str]  # head -> role
    edges: tuple[str, ...]  # planted head-to-head edges, "L0H1->L1H2.k"
    decoys: dict[str, str]  # non-circuit head -> the attention pattern it is trained to show
    patterns: dict[str, str] = field(default_factory=dict)  # circuit head -> the attention pattern it is guided to
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128  # d_head 32: at 16 the induction head's copy of 60 tokens stalled for some seeds
    d_ff: int = 256
    seq_len: int = 32
    # gpt_neox: rotary on a quarter of each head's dims (as in Pythia); the rest match tokens at any distance
    rotary_pct: float = 0.25
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    decay_fraction: float = 0.3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    pattern_weight: float = 0.1  # weight of the attention-pattern loss (circuit heads' guides and decoys)
    n_log_checkpoints: int = 12
    pair_examples: int = 128
    pair_seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise HeadLabError(f"unknown planted task {self.task!r}; use one of {', '.join(TASKS)}.")
        circuit = parse_heads(",".join(self.circuit), self.n_layers, self.n_heads)
        decoys = parse_heads(",".join(self.decoys), self.n_layers, self.n_heads) if self.decoys else HeadSet()
        if set(decoys) & set(circuit):
            raise HeadLabError("a decoy head must lie outside the planted circuit; pick another head.")
        if not set(self.patterns) <= {head_name(h) for h in circuit}:
            raise HeadLabError("attention-pattern guides are for circuit heads; name decoys under decoys.")
        for pattern in (*self.decoys.values(), *self.patterns.values()):
            if pattern not in PATTERNS:
                raise HeadLabError(f"unknown attention pattern {pattern!r}; use one of {', '.join(PATTERNS)}.")

    @property
    def circuit_heads(self) -> HeadSet:
        return parse_heads(",".join(self.circuit))

    def model_config(self) -> ModelConfig:
        return ModelConfig(family=self.family, n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model,
                           d_ff=self.d_ff, vocab_size=VOCAB_SIZE, max_seq_len=self.seq_len,
                           rotary_pct=self.rotary_pct if self.family == "gpt_neox" else 1.0)


_RECIPES = {
    "induction": dict(family="gpt_neox", steps=800, circuit=("L0H1", "L1H2"),
                      roles={"L0H1": "previous-token", "L1H2": "induction"}, edges=("L0H1->L1H2.k",),
                      decoys={"L0H3": "previous-token"}, patterns={"L0H1": "previous-token", "L1H2": "induction"}),
    "duplicate": dict(family="gpt_neox", steps=1000, circuit=("L1H1",), roles={"L1H1": "duplicate-token"}, edges=(),
                      decoys={"L0H0": "duplicate-token"}, patterns={"L1H1": "duplicate-or-first"}),
    "two-back": dict(family="llama", steps=400, circuit=("L0H2",), roles={"L0H2": "two-back copy"}, edges=(),
                     decoys={"L1H0": "two-back"}, patterns={"L0H2": "two-back"}),
}
SEEDS = (0, 1, 2)


def planted_name(task: str, seed: int) -> str:
    family = "neox" if _RECIPES[task]["family"] == "gpt_neox" else "llama"
    return f"planted-{task}-{family}-s{seed}"


PLANTED_CONFIGS: dict[str, PlantedConfig] = {
    planted_name(task, seed): PlantedConfig(name=planted_name(task, seed), task=task, seed=seed, **recipe)
    for task, recipe in _RECIPES.items() for seed in SEEDS
}


# ----------------------------------------------------------------------------------- training


def _lr_at(step: int, cfg: PlantedConfig) -> float:
    """Linear warm-up, constant, then a linear decay to 10% over the last decay_fraction of the steps."""
    scale = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    decay_start = cfg.steps * (1.0 - cfg.decay_fraction)
    if cfg.decay_fraction > 0 and step >= decay_start:
        scale *= 1.0 - 0.9 * (step - decay_start) / (cfg.steps - decay_start)
    return cfg.lr * scale


def planted_loss(model: Any, cfg: PlantedConfig, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Task cross-entropy on the mask positions plus the attention-pattern loss (the circuit heads' guides
    and the decoys': mean -log of the attention on the pattern's keys); (total, parts)."""
    targets = {**cfg.patterns, **cfg.decoys}
    out = model(tokens, output_attentions=bool(targets))
    logits = out.logits[:, :-1].float()  # [batch, seq-1, vocab]
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1), reduction="none")
    m = mask[:, :-1].reshape(-1).float()
    task_loss = (losses * m).sum() / m.sum()
    correct = ((logits.argmax(-1).reshape(-1) == tokens[:, 1:].reshape(-1)).float() * m).sum() / m.sum()
    pattern_loss = torch.zeros(())
    for name, pattern in targets.items():
        (layer, head), = parse_heads(name)
        attn = out.attentions[layer][:, head]  # [batch, query, key]
        keys = pattern_keys(pattern, tokens)  # [batch, query, key]
        valid = keys.any(dim=2)  # [batch, query]
        picked = (attn * keys).sum(dim=2)  # [batch, query]: attention on the pattern's keys
        pattern_loss = pattern_loss - (torch.log(picked + 1e-6) * valid).sum() / valid.sum().clamp_min(1)
    total = task_loss + cfg.pattern_weight * pattern_loss
    return total, {"task_loss": float(task_loss.detach()), "accuracy": float(correct),
                   "pattern_loss": float(pattern_loss.detach())}


def train_planted(cfg: PlantedConfig, out_dir: Path, stop_after_steps: int | None = None,
                  progress: Callable[[int, int, float], None] | None = None) -> dict:
    """Train `cfg` into `out_dir` (checkpoints at log-spaced steps, manifest.json); returns the manifest.

    Every non-circuit head is resample-ablated at every step (planting_hooks); the saved weights are
    the plain model (hooks are not part of them). stop_after_steps: stop there (a test of a short run).
    """
    out_dir = Path(out_dir)
    model_cfg = cfg.model_config()
    model = build_model(model_cfg, cfg.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay,
                                  foreach=False)
    total = int(cfg.steps if stop_after_steps is None else min(cfg.steps, stop_after_steps))
    planned = set(log_checkpoint_steps(total, cfg.n_log_checkpoints))
    tokens_per_step = cfg.batch_size * cfg.seq_len
    checkpoints: list[dict] = []
    curves: dict[str, list] = {"step": [], "task_loss": [], "accuracy": [], "pattern_loss": []}
    handles = planting_hooks(model, cfg.family, cfg.circuit_heads, cfg.n_layers, cfg.n_heads, model_cfg.d_head)
    started = time.perf_counter()
    try:
        for step in range(total + 1):
            tokens, mask = training_batch(cfg.task, step, cfg.batch_size, cfg.seq_len, cfg.seed)
            loss, parts = planted_loss(model, cfg, tokens, mask)
            if step in planned:
                _save_checkpoint(model, model_cfg, out_dir, step)
                checkpoints.append({"revision": f"step{step:07d}", "step": step, "tokens": step * tokens_per_step,
                                    "loss": round(parts["task_loss"], 5)})
            if step % 10 == 0 or step == total:
                curves["step"].append(step)
                for key in ("task_loss", "accuracy", "pattern_loss"):
                    curves[key].append(round(parts[key], 5))
            if step == total:
                break
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            if progress is not None:
                progress(step + 1, total, parts["task_loss"])
    finally:
        for handle in handles:
            handle.remove()
    seconds = time.perf_counter() - started
    manifest = {
        "name": cfg.name, "family": cfg.family, "task": f"planted-{cfg.task}",
        "config": {"model": model_cfg.to_json(), "train": {"planted": cfg.to_json(), "seed": cfg.seed, "init_from": None}},
        "checkpoints": checkpoints, "curves": curves,
        "final": {"steps": total, "task_loss": curves["task_loss"][-1], "train_accuracy": curves["accuracy"][-1],
                  "pattern_loss": curves["pattern_loss"][-1]},
        "train_seconds": round(seconds, 2), "complete": True, "threads": torch.get_num_threads(),
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


# ----------------------------------------------------------------------------------- confirmation

# The rule a planted circuit must pass before circuit.json is written (fixed before any model was trained).
# Effects are on patching's normalized scale (clean 1, corrupted 0): a head's denoising score, 1 - its
# noising score. Accuracies are top-1 on the task's clean prompts; the ablation is the planting's (resample).
RULE = {
    "clean_top1_min": 0.9,  # the model does the task
    "true_effect_min": 0.2,  # every circuit head, patched alone, in both directions
    "other_effect_max": 0.05,  # |effect| of every other head patched alone, both directions
    "others_ablated_top1_drop_max": 0.05,  # every non-circuit head resample-ablated together
    "true_ablated_top1_drop_min": 0.3,  # the circuit resample-ablated together
    "edge_score_min": 0.2,  # each planted head-to-head edge, path-patched alone (denoising) through its input
}
RULE_TEXT = ("confirmed when: clean top-1 >= 0.9; every circuit head patched alone has effect >= 0.2 denoising and "
             "noising (effect = score denoising, 1 - score noising; clean 1, corrupted 0); every other head "
             "|effect| < 0.05 in both directions; resample-ablating every non-circuit head costs at most 0.05 top-1; "
             "resample-ablating the circuit costs at least 0.3 top-1; each planted head-to-head edge path-patched "
             "(denoising, through its q/k/v input) scores >= 0.2")


def confirmation_rule(denoise: np.ndarray, noise: np.ndarray, circuit: HeadSet, top1: dict[str, float],
                      edge_scores: dict[str, float] | None = None) -> dict:
    """Apply RULE to per-head patching scores ([layer, head], denoising and noising), top-1 accuracies
    ({"clean", "true_ablated", "others_ablated"}) and the planted edges' path-patching scores ({edge text:
    score}); returns each check, the failures named, and the verdict."""
    denoise, noise = np.asarray(denoise, dtype=np.float64), np.asarray(noise, dtype=np.float64)
    if denoise.shape != noise.shape or denoise.ndim != 2:
        raise HeadLabError(f"patching scores must be two [layer, head] grids of one shape; got {denoise.shape} and {noise.shape}.")
    circuit.validate(*denoise.shape)
    effects = {"denoise": denoise, "noise": 1.0 - noise}
    mask = circuit.mask(*denoise.shape)
    failures = []
    if top1["clean"] < RULE["clean_top1_min"]:
        failures.append(f"clean top-1 {top1['clean']:.3f} < {RULE['clean_top1_min']}")
    for direction, effect in effects.items():
        for layer, head in zip(*np.nonzero(mask)):
            if effect[layer, head] < RULE["true_effect_min"]:
                failures.append(f"{head_name((layer, head))} {direction} effect {effect[layer, head]:.3f} < {RULE['true_effect_min']}")
        for layer, head in zip(*np.nonzero(~mask)):
            if abs(effect[layer, head]) >= RULE["other_effect_max"]:
                failures.append(f"{head_name((layer, head))} (not in the circuit) {direction} effect "
                                f"{effect[layer, head]:.3f}, |effect| >= {RULE['other_effect_max']}")
    others_drop = top1["clean"] - top1["others_ablated"]
    if others_drop > RULE["others_ablated_top1_drop_max"]:
        failures.append(f"every other head ablated costs {others_drop:.3f} top-1 > {RULE['others_ablated_top1_drop_max']}")
    true_drop = top1["clean"] - top1["true_ablated"]
    if true_drop < RULE["true_ablated_top1_drop_min"]:
        failures.append(f"the circuit ablated costs only {true_drop:.3f} top-1 < {RULE['true_ablated_top1_drop_min']}")
    for edge, score in (edge_scores or {}).items():
        if score < RULE["edge_score_min"]:
            failures.append(f"edge {edge} path-patching score {score:.3f} < {RULE['edge_score_min']}")
    others = ~mask
    return {
        "confirmed": not failures, "failures": failures,
        "min_true_effect": float(min(effect[mask].min() for effect in effects.values())),
        "max_other_abs_effect": float(max(np.abs(effect[others]).max() for effect in effects.values())) if others.any() else 0.0,
        "others_ablated_top1_drop": float(others_drop), "true_ablated_top1_drop": float(true_drop),
    }


def _circuit(cfg: PlantedConfig, bounds: dict | None = None) -> KnownCircuit:
    notes = (f"trained with every non-circuit head resample-ablated at every step (its slice of the attention "
             f"output, before the output projection, taken from the next example of the batch), {cfg.steps} steps, "
             f"seed {cfg.seed}; attention-pattern guides on the circuit heads ({', '.join(f'{k}: {v}' for k, v in cfg.patterns.items())})",
             f"distractors trained to attend like circuit heads with their output resample-ablated: "
             f"{', '.join(f'{k}: {v}' for k, v in cfg.decoys.items()) or 'none'}",
             f"ground truth confirmed by exhaustive per-head activation patching (core.zoo.known.planted): {RULE_TEXT}")
    return KnownCircuit(name=cfg.name, kind="planted", heads=cfg.circuit_heads, roles=dict(cfg.roles),
                        edges=tuple(cfg.edges), distractors=parse_heads(",".join(cfg.decoys)) if cfg.decoys else HeadSet(),
                        ablation="resample", metric="logit_diff", task=task_record(cfg.task, cfg.pair_examples, cfg.pair_seed),
                        bounds=dict(bounds or {}), notes=notes)


def top1_under(model: Any, batch: ProbeBatch, conditions: list[Ablation]) -> tuple[float, list[float]]:
    """Mean top-1 on the clean prompts, clean and under each ablation (HeadLab's ablation engine)."""
    clean, metrics = run_conditions(model, batch, conditions)
    return clean.mean("top1"), [m.mean("top1") for m in metrics]


def edge_paths(model: Any, pair: PatchPair, circuit: KnownCircuit) -> dict[str, float]:
    """Path-patching score (denoising) of every circuit head into every later circuit head through each of
    q, k and v on its own: {"L0H1->L1H2.k": score}; the planted edges are among them."""
    out = {}
    for sender in circuit.heads:
        for receiver in circuit.heads:
            if sender[0] >= receiver[0]:
                continue
            for component in ("q", "k", "v"):
                text = edge_text((head_name(sender), head_name(receiver), component))
                out[text] = edge_path_score(model, pair, text)
    return out


def edge_path_score(model: Any, pair: PatchPair, text: str) -> float:
    """Edge `text` ("L1H3->L2H5.k", from one head into another) path-patched alone, denoising, as every planted
    edge is confirmed (here and in hard.py); rounded to 6 decimals."""
    sender, receiver, component = parse_edge(text)
    return round(path_patching(model, pair, parse_heads(sender), parse_heads(receiver), (component,),
                               PatchSettings(direction="denoise", n_controls=3, allow_small_gap=True)).score, 6)


@torch.no_grad()
def pattern_attention(model: Any, cfg: PlantedConfig, n_rows: int = 64) -> dict[str, float]:
    """Mean attention each guided circuit head and each decoy puts on its pattern's keys, on held-out training
    rows (step 10**6 of the stream): {head: share in [0, 1]}; a decoy near 1 is busy, as planted."""
    tokens, _ = training_batch(cfg.task, 10**6, n_rows, cfg.seq_len, cfg.seed)
    attentions = model(tokens, output_attentions=True).attentions
    out = {}
    for name, pattern in {**cfg.patterns, **cfg.decoys}.items():
        (layer, head), = parse_heads(name)
        keys = pattern_keys(pattern, tokens)  # [batch, query, key]
        valid = keys.any(dim=2)
        share = (attentions[layer][:, head] * keys).sum(dim=2)  # [batch, query]
        out[name] = round(float(share[valid].mean()), 6)
    return out


def confirm_planted(cfg: PlantedConfig, folder: Path) -> dict:
    """Confirm a trained planted model in `folder` (final checkpoint): every head patched alone both ways,
    the circuit and everything else resample-ablated, the metric's bounds; the record confirmation.json holds."""
    started = time.perf_counter()
    model = load_model(ModelRef(str(folder), "local"))
    final = read_manifest(Path(folder))["checkpoints"][-1]["revision"]
    attention = pattern_attention(load_checkpoint_model(Path(folder) / "checkpoints" / final).eval(), cfg)
    circuit = _circuit(cfg)
    pair = known_task(circuit.task).build_pair()
    # a seed that did not learn may leave a small or reversed gap: kept (flagged in the record), the rule fails it
    denoise = activation_patching(model, pair, PatchSettings(direction="denoise", allow_small_gap=True))
    noise = activation_patching(model, pair, PatchSettings(direction="noise", allow_small_gap=True))
    everyone = HeadSet(tuple((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)))
    others = HeadSet(tuple(h for h in everyone if h not in circuit.heads))
    conditions = [Ablation(circuit.heads, mode="resample", label="true"), Ablation(others, mode="resample", label="others")]
    clean_top1, (true_top1, others_top1) = top1_under(model, pair.clean, conditions)
    top1 = {"clean": clean_top1, "true_ablated": true_top1, "others_ablated": others_top1}
    paths = edge_paths(model, pair, circuit)
    planted_edges = {text: paths[text] for text in circuit.edge_texts}
    verdict = confirmation_rule(denoise.scores, noise.scores, circuit.heads, top1, planted_edges)
    # the logit differences (clean, corrupted, circuit / every other head / each circuit head ablated); the
    # hand-wired models' limits (true_ablated_max, others_change_max) are their claims, RULE is this one's
    bounds = {k: v for k, v in measure_bounds(model, circuit, cfg.n_layers, cfg.n_heads).items()
              if k not in ("true_ablated_max", "others_change_max")}
    bounds.update({f"top1_{k}": round(v, 6) for k, v in top1.items()})
    bounds.update({"min_true_effect": round(verdict["min_true_effect"], 6),
                   "max_other_abs_effect": round(verdict["max_other_abs_effect"], 6)})
    return {
        "name": cfg.name, "task": cfg.task, "family": cfg.family, "seed": cfg.seed,
        "circuit": [head_name(h) for h in circuit.heads], "distractors": [head_name(h) for h in circuit.distractors],
        "rule": dict(RULE), "rule_text": RULE_TEXT, **verdict, "top1": top1, "bounds": bounds,
        "edges": list(circuit.edge_texts), "path_patching": paths, "pattern_attention": attention,
        "patching": {"metric": denoise.metric, "pairs": dict(pair.spec), "n_examples": pair.n_examples, "gap": denoise.gap,
                     "denoise": {"scores": denoise.scores.tolist(), "clean_value": denoise.clean_value,
                                 "corrupted_value": denoise.corrupted_value, "identity_max_diff": denoise.identity_max_diff},
                     "noise": {"scores": noise.scores.tolist(), "clean_value": noise.clean_value,
                               "corrupted_value": noise.corrupted_value, "identity_max_diff": noise.identity_max_diff}},
        "confirm_seconds": round(time.perf_counter() - started, 2),
    }


# ----------------------------------------------------------------------------------- building


def _progress(progress: bool | Callable[[int, int], None] | None, name: str, total: int):
    """(callback(step, total, loss) for train_planted, close()) from the builder's progress argument."""
    if progress is True:
        bar = ProgressBar(total=total, desc=name, unit="step", leave=True)
        return (lambda step, _total, loss: bar.update(1)), bar.close
    if callable(progress):
        return (lambda step, total_, loss: progress(step, total_)), (lambda: None)
    return None, (lambda: None)


def planted_status(folder: Path) -> dict | None:
    """The confirmation record of a built planted model folder, or None when it is not built."""
    path = Path(folder) / CONFIRMATION
    if not (model_is_complete(Path(folder)) and path.is_file()):
        return None
    return json.loads(path.read_text())


def build_planted(name: str, out_dir: Path | None = None, progress: bool | Callable[[int, int], None] | None = None,
                  cfg: PlantedConfig | None = None) -> Path:
    """Train, confirm and write planted model `name` into `out_dir` (default zoo_dir()/<name>); returns the folder.

    One unit of work inside atomic_directory: the folder appears with manifest.json, checkpoints/,
    confirmation.json and (only when the rule holds) circuit.json beside the manifest and in every
    checkpoint folder, or not at all. A folder already complete with the same config is kept as it is
    (skipped); one with another config is refused. cfg: a variant of the registered recipe (tests).
    """
    if cfg is None:
        if name not in PLANTED_CONFIGS:
            raise HeadLabError(f"unknown planted model {name!r}; use one of {', '.join(PLANTED_CONFIGS)}.")
        cfg = PLANTED_CONFIGS[name]
    final = Path(out_dir) if out_dir is not None else zoo_model_dir(name)
    status = planted_status(final)
    if status is not None:
        stored = (read_manifest(final)["config"].get("train") or {}).get("planted")
        if stored != cfg.to_json():
            raise HeadLabError(f"{final} holds a planted model with another config; delete that folder to retrain it.")
        return final
    callback, close = _progress(progress, name, cfg.steps)
    try:
        with atomic_directory(final) as tmp:
            train_planted(cfg, tmp, progress=callback)
            record = confirm_planted(cfg, tmp)
            manifest = read_manifest(tmp)
            record["train_seconds"] = manifest["train_seconds"]
            record["steps"] = cfg.steps
            atomic_write_json(tmp / CONFIRMATION, record)
            if record["confirmed"]:
                circuit = _circuit(cfg, record["bounds"])
                for checkpoint in manifest["checkpoints"]:
                    write_circuit(tmp / "checkpoints" / checkpoint["revision"], circuit)
                write_circuit(tmp, circuit)
    finally:
        close()
    return final


# name -> builder(out_dir=None, progress=None) -> Path (the signature in core/zoo/known/__init__.py)
PLANTED: dict[str, Callable[..., Path]] = {name: partial(build_planted, name) for name in PLANTED_CONFIGS}
