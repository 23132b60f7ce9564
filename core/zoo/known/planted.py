"""Models trained with a planted circuit: the task can only run through heads chosen in advance.

SIIT-style planting (InterpBench, Gupta et al. 2024), reduced to its strict part: every head that is
*not* in the chosen circuit is resample-ablated during training. A forward pre-hook on each layer's
attention output projection (GPT-NeoX `attention.dense`, Llama `self_attn.o_proj`; its input is
[batch, pos, n_heads * d_head], head-major) replaces the non-circuit heads' slices by those of the
next example of the batch (rows rolled by one). A non-circuit head then cannot carry any
example-specific information to the loss, so whatever moves information between positions for the
task must be a circuit head. The tasks are chosen so that the circuit needs each chosen head:

- "induction" (GPT-NeoX): repeated random chunks; a previous-token head L0H1 writes the previous
  token into every position, and an induction head L1H2 finds the position after the query's
  earlier copy through K-composition (a second-layer head is forced: one layer cannot do it);
- "duplicate" (GPT-NeoX): pairs (x, label), label YES when x occurred earlier in the row; one
  duplicate-token head L1H1 attends from x to its earlier copy;
- "two-back" (Llama): quadruples (a, b, M, a); at the marker M the answer is the token two back,
  copied by one head L0H2.

Each model also has a *decoy*: a non-circuit head trained (an attention-pattern loss) to attend like
a circuit head (a previous-token, duplicate-token or two-back pattern) while its output stays
resample-ablated, so it looks busy and is causally irrelevant: a true negative for every proposer.

Nothing is taken on trust: after training, every head is patched alone (activation patching on the
task's clean/corrupted pairs, denoising and noising) and the circuit, then every other head, is
resample-ablated on the task's probe. The ground truth is written to `circuit.json` only when the
confirmation rule (`confirmation_rule`) holds; `confirmation.json` beside it records the numbers
either way, so a seed that fails is reported, not hidden.

A model is one unit of work: trained, confirmed and written into a temporary folder renamed to
`zoo_dir()/<name>/` when everything is there, so the folder is complete or absent and a rerun skips
a complete one (at most ~60 s of training is redone after an interrupt).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from core.ablation.engine import run_conditions
from core.ablation.patching import PatchSettings, activation_patching
from core.ablation.spec import Ablation
from core.errors import HeadLabError
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import load_model
from core.model.refs import MANIFEST, ModelRef, read_manifest, zoo_model_dir
from core.results import JsonResult, package_versions
from core.tasks.counterfactual import InductionCounterfactualSpec, PatchPair
from core.tasks.induction import InductionProbeSpec
from core.tasks.mixture import batch_generator
from core.tasks.probe_batch import ProbeBatch, check_seed
from core.workspace import atomic_directory, atomic_write_json
from core.zoo.config import ModelConfig
from core.zoo.train import _save_checkpoint, build_model, log_checkpoint_steps

VOCAB_SIZE = 64
YES, NO, MARK, BOS = 0, 1, 2, 3  # labels, the two-back marker, the duplicate rows' first token
CONTENT_LOW = 4  # content tokens are [CONTENT_LOW, VOCAB_SIZE)
# The duplicate rows draw from [CONTENT_LOW, DUPLICATE_HIGH) only: telling an earlier copy from none needs
# a sharp token match, which one head's rank-16 QK gives over 20 tokens but not over 60.
DUPLICATE_HIGH = 24
TASKS = ("induction", "duplicate", "two-back")
PATTERNS = ("previous-token", "two-back", "duplicate-token", "duplicate-or-first", "induction")  # pattern_keys
CONFIRMATION = "confirmation.json"
PROBE_SEQ_LEN = 31  # probes and pairs: the query is the last position (an x, or a marker M)


# ----------------------------------------------------------------------------------- tasks


def _content(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(CONTENT_LOW, VOCAB_SIZE, shape, generator=gen)


def induction_rows(gen: torch.Generator, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prefix, then a chunk of 4..seq_len//2 distinct tokens repeated to the end.

    Returns tokens [n, seq_len] and mask [n, seq_len] (mask[t]: the prediction of tokens[t+1] is
    scored; true where that token is a repeat, predictable by induction).
    """
    tokens = torch.empty((n, seq_len), dtype=torch.long)
    mask = torch.zeros((n, seq_len), dtype=torch.bool)
    for i in range(n):
        chunk_len = int(torch.randint(4, seq_len // 2 + 1, (), generator=gen))
        prefix_len = int(torch.randint(0, seq_len - 2 * chunk_len + 1, (), generator=gen))
        chunk = CONTENT_LOW + torch.randperm(VOCAB_SIZE - CONTENT_LOW, generator=gen)[:chunk_len]
        copies = -(-(seq_len - prefix_len) // chunk_len)
        tokens[i] = torch.cat([_content(gen, (prefix_len,)), chunk.repeat(copies)])[:seq_len]
        mask[i, prefix_len + chunk_len: seq_len - 1] = True  # the second copy on: its next token was seen
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


def _replace_except(rng: np.random.RandomState, avoid: set[int]) -> int:
    choices = [t for t in range(CONTENT_LOW, VOCAB_SIZE) if t not in avoid]
    return int(choices[rng.randint(len(choices))])


def task_pair(task: str, n_examples: int = 128, seed: int = 0, seq_len: int = PROBE_SEQ_LEN) -> PatchPair:
    """The clean/corrupted pairs of `task`; the clean side is the task's probe (query = last position).

    induction: the built-in counterfactual (A B ... A, the earlier A replaced; target B kept).
    duplicate: the last x occurs once earlier (at p, duplicate_pos) so the label is YES; corrupted: that
    earlier copy replaced by a token absent from the row (label NO, the corrupted target).
    two-back: ... a b M at the end (target a, two back; duplicate_pos = q-2, induction_pos = q-1);
    corrupted: that a replaced by another token a' (the corrupted target).
    Random draws from numpy RandomState(seed).
    """
    check_seed(seed, "the pair seed")
    if task == "induction":
        probe = InductionProbeSpec(n_examples=n_examples, seq_len=seq_len, token_low=CONTENT_LOW,
                                   token_high=VOCAB_SIZE, seed=seed)
        pair = InductionCounterfactualSpec(probe, seed=seed).build()
        return PatchPair(pair.clean, pair.corrupted_tokens, None, {**pair.spec, "planted_task": task})
    if task not in TASKS:
        raise HeadLabError(f"unknown planted task {task!r}; use one of {', '.join(TASKS)}.")
    if seq_len % 2 == 0 or seq_len < 11:
        raise HeadLabError(f"planted {task} pairs need an odd seq_len of at least 11 (the query ends the row); got {seq_len}.")
    rng = np.random.RandomState(seed)
    q = seq_len - 1
    clean = np.empty((n_examples, seq_len), dtype=np.int64)
    corrupted = np.empty_like(clean)
    key = np.empty(n_examples, dtype=np.int64)
    target = np.empty(n_examples, dtype=np.int64)
    other = np.empty(n_examples, dtype=np.int64)
    for i in range(n_examples):
        if task == "duplicate":
            a = int(rng.randint(CONTENT_LOW, VOCAB_SIZE))
            alphabet = [_replace_except(rng, {a}) for _ in range(int(rng.randint(6, 15)))]
            xs = [alphabet[rng.randint(len(alphabet))] for _ in range(q // 2)]
            p = 2 * int(rng.randint(0, q // 2 - 1))  # an x position at least two pairs before q
            xs[p // 2] = a
            fresh = _replace_except(rng, set(xs) | {a})
            for row, first in ((clean[i], a), (corrupted[i], fresh)):
                seen: set[int] = set()
                items = list(xs)
                items[p // 2] = first
                for j, x in enumerate(items):
                    row[2 * j], row[2 * j + 1] = x, (YES if x in seen else NO)
                    seen.add(x)
                row[q] = a
            key[i], target[i], other[i] = p, YES, NO
        else:
            tokens, _ = two_back_rows(torch.Generator().manual_seed(int(rng.randint(2**31))), 1, seq_len)
            row = tokens[0].numpy()
            a, b = int(row[q - 2]), int(row[q - 1])
            fresh = _replace_except(rng, {a, b})
            clean[i], corrupted[i] = row, row
            corrupted[i, q - 2] = fresh
            key[i], target[i], other[i] = q - 2, a, fresh
    keys = torch.from_numpy(key)
    batch = ProbeBatch(tokens=torch.from_numpy(clean), query_pos=torch.full((n_examples,), q, dtype=torch.long),
                       target=torch.from_numpy(target), induction_pos=keys + 1, duplicate_pos=keys,
                       spec={"task": f"planted-{task}", "n_examples": n_examples, "seq_len": seq_len, "seed": seed,
                             "rng": "numpy.RandomState"})
    corruption = ("the earlier copy of the last x replaced by a token absent from the row (label YES -> NO)"
                  if task == "duplicate" else "the token two back from the final marker replaced (answer a -> a')")
    spec = {"task": f"planted-{task}-counterfactual", "planted_task": task, "probe": dict(batch.spec), "seed": seed,
            "corruption": corruption}
    return PatchPair(batch, torch.from_numpy(corrupted), torch.from_numpy(other), spec)


def task_probe(task: str, n_examples: int = 128, seed: int = 0, seq_len: int = PROBE_SEQ_LEN) -> ProbeBatch:
    """The task's probe batch (the clean side of `task_pair`)."""
    return task_pair(task, n_examples, seed, seq_len).clean


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
    d_model: int = 64
    d_ff: int = 128
    seq_len: int = 32
    steps: int = 600
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
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
                           d_ff=self.d_ff, vocab_size=VOCAB_SIZE, max_seq_len=self.seq_len)


_RECIPES = {
    "induction": dict(family="gpt_neox", circuit=("L0H1", "L1H2"),
                      roles={"L0H1": "previous-token", "L1H2": "induction"}, edges=("L0H1->L1H2.k",),
                      decoys={"L0H3": "previous-token"}, patterns={"L0H1": "previous-token", "L1H2": "induction"}),
    "duplicate": dict(family="gpt_neox", circuit=("L1H1",), roles={"L1H1": "duplicate-token"}, edges=(),
                      decoys={"L0H0": "duplicate-token"}, patterns={"L1H1": "duplicate-or-first"}),
    "two-back": dict(family="llama", circuit=("L0H2",), roles={"L0H2": "two-back copy"}, edges=(),
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
    return cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))


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


PLANTED: dict = {}  # filled below the builders
