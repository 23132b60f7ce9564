"""Planted circuits that are hard to find: many heads, a chain over three or more layers, a backup head, busy neighbours.

The recipe of planted.py (SIIT-style: every head outside the allowed set resample-ablated at every step,
attention-pattern guides on the planted heads), extended for issue 43:

- **Two tasks trained jointly.** Every batch alternates rows of the circuit task and of a second task.
  On a row of one task only that task's planted heads are live; every other head's slice of the attention
  output is taken from the row two before (the previous row of the same task). The second task's heads are
  the *busy neighbours*: they do real work (ablating them breaks the second task) yet carry nothing of the
  circuit task, so a proposer that finds "busy heads" is tested against heads that matter elsewhere.
- **A chain over three or more layers.** "ioi": BOS, distinct fillers, names S, IO, S at random places,
  a final marker -> IO (a duplicate-token head marks the second S, an S-inhibition head at the marker
  reads it, a name mover copies the name that is not S, and a backup mover: four heads). "induction": A B ... C D
  ... A -> B (SwapInductionSpec's prompts: a previous-token head, an induction head that reads it and its backup a
  layer later: three heads over three layers; a fourth, a backup previous-token head, failed the rule in every build:
  hard-training.json's sixth round). Two four-head induction tasks are kept unregistered: "skip-induction" (A X B
  ... A -> B, two previous-token heads in a row, SKIP_INDUCTION_RECIPE) did not learn in the seventh round;
  "marked-induction" (A B ... C D ... A MARK -> B, MarkedInductionSpec: those three heads answer at the repeated A and
  a mover at the marker copies their answer from the position before; the circuit rows also answer at the repeated A
  in training, `early_answer_weight`; MARKED_INDUCTION_RECIPE) confirmed one initialization of twelve in the eighth.
- **Backup heads** (`primary`, `backup`: pairs; the mover's and the induction head's): each primary is
  resample-ablated on a share of the circuit rows (`backup_rate`) and its backup on a share of the others
  (`backup_drop_rate`, never both), so either does the job alone; the confirmation checks that a primary alone
  ablated costs little and a primary with its backup the task.
- **Once the chain has formed** (`live_others_from`, `idle_reset_step`): the heads outside the circuit are live,
  with no gradient into them, on a share of the circuit rows (`live_others_rate`: a circuit trained only beside
  resampled heads is swamped by their real outputs when one mover is ablated), and the *idle* heads (of neither
  task) are re-initialized and never trained again (trained only as donors of resampled slices, they learn to
  copy names, which a confirmation finds as stray effects).
- **Restarts** (`formed_check_step`, `max_attempts`): the IOI chain forms in some initializations and not others,
  and which is visible early, so training restarts from a new initialization when it has not formed by that step, or
  when the trained model fails the rule; the manifest records every failed attempt, the last runs to the end unchecked.

The measured rounds behind each choice, and the variants tried and dropped (a two-hop task, output guides,
detached resampling, guides trained alone first): docs/benchmark/hard-training.json, summarized in
docs/benchmark/hard-models.md. The ground truth is written only when `HARD_RULE` holds (checked by exhaustive
patching, as in planted.py); confirmation.json keeps the numbers either way. A confirmed model's every edge from an
earlier head into a circuit head is then path-patched (`edge_sweep`), and those that score as a planted edge must join
the truth as circuit.json's `measured_edges`.

Long because one recipe is read here top to bottom: the two tasks' rows and guides, the config with every training
knob, the per-row hooks and the training loop that use them, and the rule that confirms the result; split, each
knob's effect would be in another file from its definition.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from core.ablation.patching import PatchSettings, activation_patching
from core.ablation.spec import Ablation
from core.errors import HeadLabError
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import load_model
from core.model.refs import MANIFEST, ModelRef, read_manifest, zoo_model_dir
from core.results import JsonResult
from core.tasks.counterfactual import PatchPair
from core.tasks.known import KNOWN_TASKS, MarkedInductionSpec, SkipInductionSpec, SwapInductionSpec, known_task
from core.workspace import atomic_directory, atomic_write_json
from core.zoo.config import ModelConfig
from core.zoo.known.planted import (BOS, CONFIRMATION, MARK, VOCAB_SIZE, _fresh, _lr_at, _PairSpec, _progress,
                                    edge_path_score, output_projection, planted_status, top1_under)
from core.zoo.known.truth import CIRCUIT_FILE, KnownCircuit, edge_text, write_circuit
from core.zoo.train import _save_checkpoint, build_model, log_checkpoint_steps

NAME_LOW, NAME_HIGH = 4, 24  # ioi names
FILLER_LOW = 24  # ioi fillers [24, 64), distinct in a row
INDUCTION_LOW, INDUCTION_HIGH = 24, 48  # the induction prompts' tokens
SEQ_LEN = 16  # short rows: one model trains in minutes at one thread
INDUCTION_MARK = 1  # the marked-induction prompts' final token (planted.py's NO: no hard task uses it otherwise)
HARD_TASKS = ("ioi", "induction", "skip-induction", "marked-induction")
DETACH_CHOICES = ("none", "idle", "all")


# ----------------------------------------------------------------------------------- rows and pairs


def ioi_rows(rng: np.random.RandomState, n: int, seq_len: int = SEQ_LEN) -> dict[str, np.ndarray]:
    """n IOI rows: BOS, distinct fillers, the names S (twice, at s1 < s2) and IO (once) at random places, the
    marker MARK last; the answer is IO. Returns tokens [n, T], s_name, io_name, s1, s2, io [n]."""
    q = seq_len - 1
    tokens = np.empty((n, seq_len), dtype=np.int64)
    out = {k: np.empty(n, dtype=np.int64) for k in ("s_name", "io_name", "s1", "s2", "io")}
    for i in range(n):
        fillers = FILLER_LOW + rng.permutation(VOCAB_SIZE - FILLER_LOW)[: seq_len]
        tokens[i] = fillers[:seq_len]
        tokens[i, 0], tokens[i, q] = BOS, MARK
        s_name = _fresh(rng, NAME_LOW, NAME_HIGH, set())
        io_name = _fresh(rng, NAME_LOW, NAME_HIGH, {s_name})
        s1, s2, io = (1 + rng.permutation(q - 1)[:3]).tolist()
        s1, s2 = min(s1, s2), max(s1, s2)
        tokens[i, [s1, s2, io]] = s_name, s_name, io_name
        for key, value in (("s_name", s_name), ("io_name", io_name), ("s1", s1), ("s2", s2), ("io", io)):
            out[key][i] = value
    out["tokens"] = tokens
    return out


@dataclass(frozen=True)
class IoiPairSpec(_PairSpec):
    """IOI prompts (ioi_rows) -> IO; corrupted: the first S replaced by IO, so IO is the repeated name, answer S.

    Replacing the first S (not the second) moves the duplicate: the second IO sits at max(s1, io), not at s2, so
    the duplicate-token head's pattern changes with the corruption. With the second S replaced, s2 holds a
    duplicate in both prompts, and the duplicate-token head of the trained hard-ioi-s0 moved the metric by only
    0.07 (denoising) against the rule's 0.2.
    """

    task: ClassVar[str] = "hard-ioi"
    seq_len: int = SEQ_LEN

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len < 6 or self.seq_len > VOCAB_SIZE - FILLER_LOW:
            raise HeadLabError(f"hard-ioi prompts hold three names and distinct fillers, so seq_len is 6 to "
                               f"{VOCAB_SIZE - FILLER_LOW}; got {self.seq_len}.")

    def build_pair(self) -> PatchPair:
        rows = ioi_rows(np.random.RandomState(self.seed), self.n_examples, self.seq_len)
        clean = rows["tokens"]
        corrupted = clean.copy()
        corrupted[np.arange(self.n_examples), rows["s1"]] = rows["io_name"]
        batch = self._batch(clean, rows["io_name"], rows["io"] - 1)  # induction_pos = io: the name the mover reads
        spec = {**batch.spec, "corruption": "the first S replaced by IO: IO is now the repeated name, answer S"}
        return PatchPair(batch, torch.from_numpy(corrupted), torch.from_numpy(rows["s_name"].copy()), spec)


KNOWN_TASKS["hard-ioi"] = IoiPairSpec


def _induction_rows(spec: SwapInductionSpec | SkipInductionSpec, gap: int) -> dict[str, np.ndarray]:
    """An induction spec's clean prompts as training rows: tokens [n, T], target B [n], p [n] (the earlier A, `gap`
    tokens before B)."""
    clean = spec.build_pair().clean
    return {"tokens": clean.tokens.numpy(), "target": clean.target.numpy(), "p": clean.induction_pos.numpy() - gap}


def induction_spec(n: int, seed: int) -> SwapInductionSpec:
    return SwapInductionSpec(n_examples=n, seq_len=SEQ_LEN, token_low=INDUCTION_LOW, token_high=INDUCTION_HIGH, seed=seed)


def induction_rows(seed: int, n: int) -> dict[str, np.ndarray]:
    """n induction rows (SwapInductionSpec's clean prompts, A B ... C D ... A -> B; p: A B at p)."""
    return _induction_rows(induction_spec(n, seed), 1)


def skip_induction_spec(n: int, seed: int) -> SkipInductionSpec:
    return SkipInductionSpec(n_examples=n, seq_len=SEQ_LEN, token_low=INDUCTION_LOW, token_high=INDUCTION_HIGH, seed=seed)


def skip_induction_rows(seed: int, n: int) -> dict[str, np.ndarray]:
    """n skip-one induction rows (A X B ... C Y D ... A -> B; p: A X B at p)."""
    return _induction_rows(skip_induction_spec(n, seed), 2)


def marked_induction_spec(n: int, seed: int) -> MarkedInductionSpec:
    return MarkedInductionSpec(n_examples=n, seq_len=SEQ_LEN, token_low=INDUCTION_LOW, token_high=INDUCTION_HIGH,
                               seed=seed, marker=INDUCTION_MARK)


def marked_induction_rows(seed: int, n: int) -> dict[str, np.ndarray]:
    """n marked induction rows (A B ... C D ... A MARK -> B; p: A B at p)."""
    return _induction_rows(marked_induction_spec(n, seed), 1)


# Attention-pattern guides: pattern -> the key each row's guided query attends to. Query positions: the
# final marker/query (q) unless said; "previous-token": every position t >= 1 -> t - 1. In marked-induction the
# induction heads work at the repeated A (q - 1) and rest on the marker itself at q (so that they cannot answer there
# and skip the mover); the mover, at q, reads q - 1.
PATTERNS = {"ioi": ("duplicate-token", "s-inhibition", "name-mover"),
            "induction": ("previous-token", "induction"), "skip-induction": ("previous-token", "induction"),
            "marked-induction": ("previous-token", "induction", "mover")}


def guide_keys(task: str, rows: dict[str, np.ndarray], pattern: str, seq_len: int = SEQ_LEN) -> torch.Tensor:
    """[n, query, key] bool: where a head with `pattern` should attend on these rows (no key: unguided query)."""
    n, q = len(rows["tokens"]), seq_len - 1
    keys = torch.zeros((n, seq_len, seq_len), dtype=torch.bool)
    index = torch.arange(n)
    if pattern == "previous-token":
        pos = torch.arange(1, seq_len)
        keys[:, pos, pos - 1] = True
        return keys
    if task == "marked-induction":
        if pattern == "mover":
            keys[:, q, q - 1] = True
        else:  # induction: at the repeated A to B, at the marker to itself
            keys[index, q - 1, torch.from_numpy(rows["p"]) + 1] = True
            keys[:, q, q] = True
        return keys
    query, key = {"duplicate-token": ("s2", "s1"), "s-inhibition": (None, "s2"), "name-mover": (None, "io"),
                  "induction": (None, "p")}[pattern]
    queries = torch.full((n,), q) if query is None else torch.from_numpy(rows[query])
    offset = {"induction": 1, "skip-induction": 2}.get(task, 0) if pattern == "induction" else 0  # B: after A at p
    keys[index, queries, torch.from_numpy(rows[key]) + offset] = True
    return keys


def hard_batch(task: str, step: int, n: int, seed: int, salt: int) -> dict[str, np.ndarray]:
    """n rows of `task` for training step `step`: a pure function of (seed, step, salt)."""
    stream = (int(seed) * 1_000_003 + int(step) * 7919 + salt) % (2**31 - 1)
    if task == "ioi":
        rows = ioi_rows(np.random.RandomState(stream), n)
        rows["target"] = rows["io_name"]
        return rows
    if task == "induction":
        return induction_rows(stream, n)
    if task == "skip-induction":
        return skip_induction_rows(stream, n)
    if task == "marked-induction":
        return marked_induction_rows(stream, n)
    raise HeadLabError(f"unknown hard task {task!r}; use one of {', '.join(HARD_TASKS)}.")


def task_record(task: str, n_examples: int = 128, seed: int = 0) -> dict:
    """The circuit.json task record of a hard task (known_task rebuilds its pairs from it)."""
    if task == "ioi":
        return IoiPairSpec(n_examples=n_examples, seed=seed).to_json()
    if task == "skip-induction":
        return skip_induction_spec(n_examples, seed).to_json()
    if task == "marked-induction":
        return marked_induction_spec(n_examples, seed).to_json()
    return induction_spec(n_examples, seed).to_json()


# ----------------------------------------------------------------------------------- the recipes


@dataclass(frozen=True)
class HardConfig(JsonResult):
    """One hard planted model: its circuit task (heads, roles, guides, edges, primary and backup) and the
    neighbour task trained jointly (its heads and guides); recorded in the manifest."""

    name: str
    task: str
    neighbour_task: str
    seed: int
    circuit: dict[str, str]  # head -> pattern guide of the circuit task ("L0H1": "previous-token")
    roles: dict[str, str]  # head -> role
    edges: tuple[str, ...]
    neighbours: dict[str, str]  # head -> pattern guide of the neighbour task
    # backup pairs: primary heads, comma-separated, each with its backup at the same place in `backup`
    primary: str = ""
    backup: str = ""
    backup_rate: float = 0.5  # share of circuit rows whose primary is resample-ablated in training
    backup_drop_rate: float = 0.0  # share of the other circuit rows (primary live) whose backup is resample-ablated
    # share of circuit rows on which every head outside the circuit is live, with no gradient into its weights through
    # that row: the circuit learns to work beside their real outputs, as it must when a confirmation ablates part of it
    live_others_rate: float = 0.0
    live_others_from: int = 0  # the first step that leaves them live (the chain forms first)
    # a resampled slice as a constant taken from another row, no gradient into the head that computed it there:
    # "idle" for the heads of neither task (never trained, so they carry nothing of either), "all" for every head
    # (a task's heads are then never trained by the other task's rows either), "none" as SIIT's resampling
    detach_resampled: str = "none"
    # the first steps train the attention guides alone: the S-inhibition head must find S2 by the duplicate-token head's
    # mark before the task loss rewards the shortcut that needs no mark (attend to every name, suppress the majority)
    pattern_only_steps: int = 0
    # the circuit rows also answer at the position before the last, with this weight (0: not): in marked-induction
    # the induction heads then answer at the repeated A as hard-induction's do, and the mover has a readable answer
    # to copy (without it, four heads in series stayed at chance for 4,000 steps: hard-training.json's eighth round)
    early_answer_weight: float = 0.0
    # at this step (0: never) the heads of neither task are re-initialized and never trained again (their slices of
    # the attention weights take no gradient, their donor slices are constants): trained as donors they learn to copy
    # names, which a confirmation then finds as stray effects; the circuit trains on beside them from here
    idle_reset_step: int = 0
    # the chain forms in some initializations and not others (hard-training.json): at this step (0: never) the circuit
    # task's train top-1 over the last 500 steps must reach formed_top1_min, else training restarts from a new
    # initialization (the same rows); so it does when the trained model fails HARD_RULE; at most max_attempts
    # initializations, the last one run to the end and kept unchecked (RESTART_FIELDS)
    formed_check_step: int = 0
    formed_top1_min: float = 0.25
    max_attempts: int = 1
    n_layers: int = 6
    n_heads: int = 8
    d_model: int = 96  # d_head 12: one model trains in minutes at one thread
    d_ff: int = 192
    rotary_pct: float = 0.34  # 4 of each head's 12 dims rotate; the rest match tokens at any distance
    steps: int = 6000  # the IOI chain forms late if at all: train top-1 0.25-0.94 at 4000 steps, 0.125-1.0 at 6000
    batch_size: int = 32  # half circuit rows, half neighbour rows, alternating
    lr: float = 3e-3
    warmup_steps: int = 30
    decay_fraction: float = 0.3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    pattern_weight: float = 1.0  # strong guides: at 0.1 neither chain formed in 1000 steps (0.06 top-1)
    n_log_checkpoints: int = 12
    pair_examples: int = 128
    pair_seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in HARD_TASKS or self.neighbour_task not in HARD_TASKS or self.task == self.neighbour_task:
            raise HeadLabError(f"a hard model's task and neighbour task are two different ones of {', '.join(HARD_TASKS)}.")
        heads = parse_heads(",".join([*self.circuit, *self.neighbours]), self.n_layers, self.n_heads)
        if len(heads) != len(self.circuit) + len(self.neighbours):
            raise HeadLabError("a circuit head cannot also be a neighbour; pick another head.")
        for name, pattern in self.circuit.items():
            if pattern not in PATTERNS[self.task]:
                raise HeadLabError(f"{name}: pattern {pattern!r} is not one of the {self.task} task's {PATTERNS[self.task]}.")
        for name, pattern in self.neighbours.items():
            if pattern not in PATTERNS[self.neighbour_task]:
                raise HeadLabError(f"{name}: pattern {pattern!r} is not one of the {self.neighbour_task} task's patterns.")
        primaries, backups = _names(self.primary), _names(self.backup)
        paired = [*primaries, *backups]
        if len(primaries) != len(backups) or not set(paired) <= set(self.circuit) or len(set(paired)) != len(paired):
            raise HeadLabError("each backup needs its primary (primary and backup list them in the same order), all of "
                               "them circuit heads, none twice.")
        if self.detach_resampled not in DETACH_CHOICES:
            raise HeadLabError(f"detach_resampled is one of {', '.join(DETACH_CHOICES)}.")
        if self.max_attempts < 1 or not 0 <= self.formed_check_step < self.steps:
            raise HeadLabError("max_attempts is at least 1 and formed_check_step a step before the last (0: no check).")

    @property
    def backup_pairs(self) -> list[tuple[str, str]]:
        """[(primary, backup)] head names, in the recipe's order."""
        return list(zip(_names(self.primary), _names(self.backup)))

    @property
    def circuit_heads(self) -> HeadSet:
        return parse_heads(",".join(self.circuit))

    @property
    def neighbour_heads(self) -> HeadSet:
        return parse_heads(",".join(self.neighbours))

    def model_config(self) -> ModelConfig:
        return ModelConfig(family="gpt_neox", n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model,
                           d_ff=self.d_ff, vocab_size=VOCAB_SIZE, max_seq_len=SEQ_LEN, rotary_pct=self.rotary_pct)


def _names(heads: str) -> list[str]:
    """"L1H5, L0H2" -> ["L1H5", "L0H2"] (order kept; "" -> [])."""
    return [name.strip() for name in heads.split(",") if name.strip()]


_IOI_HEADS = dict(circuit={"L1H3": "duplicate-token", "L2H5": "s-inhibition", "L4H2": "name-mover",
                           "L4H6": "name-mover"},
                  roles={"L1H3": "duplicate-token (at S2, to S1)", "L2H5": "S-inhibition (at the marker, to S2)",
                         "L4H2": "name mover (primary: copies IO)",
                         "L4H6": "backup name mover (takes over when L4H2 is ablated)"},
                  edges=("L1H3->L2H5.k", "L2H5->L4H2.q", "L2H5->L4H6.q"), primary="L4H2", backup="L4H6")
_INDUCTION_HEADS = dict(circuit={"L0H2": "previous-token", "L1H5": "induction", "L2H1": "induction"},
                        roles={"L0H2": "previous-token (at B, to A)", "L1H5": "induction (primary: at the final A, to B)",
                               "L2H1": "backup induction (takes over when L1H5 is ablated)"},
                        edges=("L0H2->L1H5.k", "L0H2->L2H1.k"), primary="L1H5", backup="L2H1")
# The sixth round's four-head variant (hard-training.json): a backup previous-token head in layer 0, resampled as the
# induction pair is; it failed the rule in every build (the primary previous-token head alone ablated cost 0.53 top-1)
INDUCTION_WITH_PREVIOUS_TOKEN_BACKUP = dict(
    circuit={"L0H2": "previous-token", "L0H4": "previous-token", "L1H5": "induction", "L2H1": "induction"},
    roles={"L0H2": "previous-token (primary: at B, to A)", "L0H4": "backup previous-token (takes over when L0H2 is "
           "ablated)", "L1H5": "induction (primary: at the final A, to B)",
           "L2H1": "backup induction (takes over when L1H5 is ablated)"},
    edges=("L0H2->L1H5.k", "L0H2->L2H1.k", "L0H4->L1H5.k", "L0H4->L2H1.k"), primary="L1H5,L0H2", backup="L2H1,L0H4")
# The seventh round's four-head task (hard-training.json): induction one token further on (A X B ... A -> B) over
# layers 0-3, a previous-token head moving A to X, a second moving it on to B, an induction head and its backup;
# trained as hard-induction (HardConfig(name=..., seed=..., **SKIP_INDUCTION_RECIPE)), the chain had not formed by step
# 4,000 in either initialization tried (train top-1 0.043 and 0.046, chance 1/24), so it is not registered
SKIP_INDUCTION_HEADS = dict(
    circuit={"L0H2": "previous-token", "L1H6": "previous-token", "L2H1": "induction", "L3H4": "induction"},
    roles={"L0H2": "previous-token (at X, to A)", "L1H6": "previous-token (at B, to X: moves A on)",
           "L2H1": "induction (primary: at the final A, to B)", "L3H4": "backup induction (takes over when L2H1 is ablated)"},
    edges=("L0H2->L1H6.v", "L1H6->L2H1.k", "L1H6->L3H4.k"), primary="L2H1", backup="L3H4")
# Four heads over four layers in an induction task (A B ... C D ... A MARK -> B): the previous-token head, an
# induction head and its backup a layer later, both answering at the repeated A, and a mover at the marker that copies
# their answer from the position before
_MARKED_INDUCTION_HEADS = dict(
    circuit={"L0H2": "previous-token", "L1H5": "induction", "L2H1": "induction", "L3H4": "mover"},
    roles={"L0H2": "previous-token (at B, to A)", "L1H5": "induction (primary: at the repeated A, to B)",
           "L2H1": "backup induction (takes over when L1H5 is ablated)",
           "L3H4": "mover (at the marker, to the repeated A: copies B)"},
    edges=("L0H2->L1H5.k", "L0H2->L2H1.k", "L1H5->L3H4.v", "L2H1->L3H4.v"), primary="L1H5", backup="L2H1")
# The training that confirmed hard-ioi (docs/benchmark/hard-training.json, fifth round): the primary resampled on half
# the circuit rows, the backup on a fifth of the others; once the chain has formed (step 5,000) the heads outside the
# circuit live on half the circuit rows and the idle heads re-initialized and frozen; a restart when the chain has not
# formed by step 4,000 (train top-1 over the last 500 steps: 0.26 to 0.63 where it formed, at most 0.07 where not) or
# the model fails the rule, at most eight initializations (hard-ioi-s1 kept its sixth: registered_builds)
_BACKUP_TRAINING = dict(backup_rate=0.5, backup_drop_rate=0.2, live_others_rate=0.5, live_others_from=5000,
                        idle_reset_step=5000, steps=10000, formed_check_step=4000, formed_top1_min=0.15, max_attempts=8)
HARD_RECIPES = {
    # 6 x 8 = 48 heads: the IOI chain over layers 1, 2, 4; neighbours do induction in layers 0, 2, 3
    "hard-ioi": dict(task="ioi", neighbour_task="induction", n_layers=6, **_IOI_HEADS, **_BACKUP_TRAINING,
                     neighbours={"L0H6": "previous-token", "L2H1": "induction", "L3H0": "induction"}),
    # 6 x 8 = 48 heads: induction over layers 0-2 with a backup a layer after its primary; neighbours do IOI where
    # hard-ioi's circuit is (at 4 layers, with them in layers 0-2, they never learned it); the backup resampled more
    # often than hard-ioi's (at 0.5 / 0.2 the primary's planted edge scored 0.082, at 0.4 / 0.3 0.309: fifth round)
    "hard-induction": dict(task="induction", neighbour_task="ioi", n_layers=6, **_INDUCTION_HEADS,
                           **{**_BACKUP_TRAINING, "backup_rate": 0.4, "backup_drop_rate": 0.3},
                           neighbours={"L1H3": "duplicate-token", "L2H5": "s-inhibition", "L4H2": "name-mover"}),
}
SKIP_INDUCTION_RECIPE = dict(task="skip-induction", neighbour_task="ioi", n_layers=6, **SKIP_INDUCTION_HEADS,
                             **{**_BACKUP_TRAINING, "backup_rate": 0.4, "backup_drop_rate": 0.3},
                             neighbours=dict(HARD_RECIPES["hard-induction"]["neighbours"]))
# The eighth round's four-head task (hard-training.json): trained as hard-induction with the early answer, one
# initialization of twelve confirmed (this one's rates); the failures split by the backup rates (at 0.4 / 0.3 the
# primary's planted edges under 0.1, the model leaning on the backup; at 0.3 / 0.5 and 0.35 / 0.4 the backup not taking
# over), so it is not registered
MARKED_INDUCTION_RECIPE = dict(task="marked-induction", neighbour_task="ioi", n_layers=6, **_MARKED_INDUCTION_HEADS,
                               **{**_BACKUP_TRAINING, "backup_rate": 0.4, "backup_drop_rate": 0.3},
                               early_answer_weight=1.0, neighbours=dict(HARD_RECIPES["hard-induction"]["neighbours"]))
SEEDS = (0, 1, 2)
HARD_CONFIGS: dict[str, HardConfig] = {f"{base}-s{seed}": HardConfig(name=f"{base}-s{seed}", seed=seed, **recipe)
                                       for base, recipe in HARD_RECIPES.items() for seed in SEEDS}


# ----------------------------------------------------------------------------------- training


def training_rows(cfg: HardConfig, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """One step's batch: tokens [batch, T] (even rows the circuit task, odd the neighbour task), targets [batch]
    (the next token at the last position), dead [batch, n_layers, n_heads] (heads resample-ablated per row) and
    the guides {head: [batch, query, key] bool}."""
    half = cfg.batch_size // 2
    rows = {cfg.task: hard_batch(cfg.task, step, half, cfg.seed, 1),
            cfg.neighbour_task: hard_batch(cfg.neighbour_task, step, half, cfg.seed, 2)}
    tokens = torch.empty((2 * half, SEQ_LEN), dtype=torch.long)
    targets = torch.empty(2 * half, dtype=torch.long)
    dead = torch.ones((2 * half, cfg.n_layers, cfg.n_heads), dtype=torch.bool)
    guides = {}
    for parity, task, heads in ((0, cfg.task, cfg.circuit), (1, cfg.neighbour_task, cfg.neighbours)):
        tokens[parity::2] = torch.from_numpy(rows[task]["tokens"])
        targets[parity::2] = torch.from_numpy(np.asarray(rows[task]["target"]))
        for name, pattern in heads.items():
            (layer, head), = parse_heads(name)
            dead[parity::2, layer, head] = False
            keys = torch.zeros((2 * half, SEQ_LEN, SEQ_LEN), dtype=torch.bool)
            keys[parity::2] = guide_keys(task, rows[task], pattern)
            guides[name] = keys
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + step)
    for primary, backup in cfg.backup_pairs:  # each pair drawn on its own, in order (one pair: the first recipe's draws)
        (layer, head), = parse_heads(primary)
        primary_dead = torch.rand(half, generator=gen) < cfg.backup_rate
        dead[0::2, layer, head] = primary_dead
        if cfg.backup_drop_rate:  # never both: a row keeps one of them live
            (layer, head), = parse_heads(backup)
            dead[0::2, layer, head] = (torch.rand(half, generator=gen) < cfg.backup_drop_rate) & ~primary_dead
    return tokens, targets, dead, guides


def quiet_rows(cfg: HardConfig, step: int, dead: torch.Tensor) -> torch.Tensor:
    """[batch, n_layers, n_heads] bool: the heads live without gradient on a row (cfg.live_others_rate of the circuit
    rows: every head outside the circuit); `dead` is updated in place to leave them live there."""
    quiet = torch.zeros_like(dead)
    if cfg.live_others_rate and step >= cfg.live_others_from:
        gen = torch.Generator().manual_seed(cfg.seed * 100_019 + step)
        rows = torch.zeros(dead.shape[0], dtype=torch.bool)
        rows[0::2] = torch.rand(dead.shape[0] // 2, generator=gen) < cfg.live_others_rate
        outside = ~cfg.circuit_heads.mask(cfg.n_layers, cfg.n_heads)  # [n_layers, n_heads]
        quiet[rows] = torch.as_tensor(outside)
        dead[quiet] = False
    return quiet


def idle_mask(cfg: HardConfig) -> np.ndarray:
    """[n_layers, n_heads] bool: the heads of neither task (not in the circuit, not neighbours)."""
    busy = cfg.circuit_heads.mask(cfg.n_layers, cfg.n_heads) | cfg.neighbour_heads.mask(cfg.n_layers, cfg.n_heads)
    return ~busy


def idle_slices(model: Any, cfg: HardConfig) -> list[tuple[torch.nn.Parameter, tuple]]:
    """(parameter, index) of every idle head's rows of the fused q/k/v projection (weight and bias: GPT-NeoX keeps
    each head's q, k, v contiguous, 3 * d_head rows) and its columns of the output projection."""
    d_head = cfg.d_model // cfg.n_heads
    slices = []
    for layer, head in zip(*np.nonzero(idle_mask(cfg))):
        attention = model.gpt_neox.layers[layer].attention
        rows = slice(int(head) * 3 * d_head, (int(head) + 1) * 3 * d_head)
        slices += [(attention.query_key_value.weight, (rows,)), (attention.query_key_value.bias, (rows,)),
                   (attention.dense.weight, (slice(None), slice(int(head) * d_head, (int(head) + 1) * d_head)))]
    return slices


def reset_idle_heads(model: Any, cfg: HardConfig, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """Re-initialize the idle heads' weights as build_model does (normal, std initializer_range; biases 0) and
    clear their optimizer moments, so nothing they learned survives."""
    gen = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for param, index in idle_slices(model, cfg):
            values = param[index]
            param[index] = 0.0 if values.dim() == 1 else torch.randn(values.shape, generator=gen) * std
            for moment in optimizer.state.get(param, {}).values():
                if torch.is_tensor(moment) and moment.shape == param.shape:
                    moment[index] = 0.0


def row_resample_hooks(model: Any, cfg: HardConfig, state: dict) -> list:
    """Hooks on each layer's output projection: the heads state["dead"][row, layer] marks take their slice from the
    row two before (the previous row of the same task); the heads state["quiet"][row, layer] marks (if any) add their
    output with no gradient into them or their output weights. Returns the handles."""
    d_head = cfg.d_model // cfg.n_heads
    idle = idle_mask(cfg)  # [n_layers, n_heads]; detached too once state["idle_frozen"] (cfg.idle_reset_step)
    detached = {"none": np.zeros_like(idle), "idle": idle, "all": np.ones_like(idle)}[cfg.detach_resampled]
    handles = []
    for layer in range(cfg.n_layers):
        def resample(module, args, layer=layer):
            x = args[0]  # [batch, pos, n_heads * d_head]
            columns = state["dead"][:, layer].repeat_interleave(d_head, dim=1)  # [batch, n_heads * d_head]
            donor = x.roll(2, dims=0)
            constant = torch.as_tensor(detached[layer] | (state.get("idle_frozen", False) & idle[layer]))
            donor = torch.where(constant.repeat_interleave(d_head), donor.detach(), donor)  # [batch, pos, columns]
            return (torch.where(columns[:, None, :], donor, x),) + tuple(args[1:])

        def detach_quiet(module, args, output, layer=layer):
            quiet = state.get("quiet")
            if quiet is None or not quiet[:, layer].any():
                return output
            q = quiet[:, layer].repeat_interleave(d_head, dim=1)[:, None, :].to(args[0].dtype)  # [batch, 1, columns]
            x = args[0]
            return (torch.nn.functional.linear(x * (1 - q), module.weight, module.bias)
                    + torch.nn.functional.linear((x * q).detach(), module.weight.detach()))

        projection = output_projection(model, "gpt_neox", layer)
        handles.append(projection.register_forward_pre_hook(resample))
        handles.append(projection.register_forward_hook(detach_quiet))
    return handles


class ChainNotFormed(Exception):
    """Raised by train_hard at cfg.formed_check_step when the circuit task's train top-1 is still below
    cfg.formed_top1_min (build_hard restarts from another initialization)."""

    def __init__(self, step: int, top1: float):
        super().__init__(f"train top-1 {top1:.3f} at step {step}")
        self.step, self.top1 = step, top1


# The knobs that decide which initialization is kept, not how one trains (each attempt's training is the same for any
# of their values that lets it run; the manifest's init_seed names the one kept): a built model is the registered
# recipe's whatever they were when it was built.
RESTART_FIELDS = ("formed_check_step", "formed_top1_min", "max_attempts")
INIT_SEED_STRIDE = 1000  # attempt a's initialization seed: cfg.seed + a * INIT_SEED_STRIDE
FORMED_WINDOW = 50  # logged steps (every 10th) averaged at the check: the last 500 steps


def init_seed_of(cfg: HardConfig, attempt: int) -> int:
    """The initialization seed of training attempt `attempt` (0 first) of `cfg`."""
    return cfg.seed + attempt * INIT_SEED_STRIDE


def training_config(cfg_json: dict) -> dict:
    """A HardConfig's JSON without RESTART_FIELDS: what decides the weights of an initialization. A knob added since
    a model was built counts at its default, which trains as the recipe did before the knob existed."""
    defaults = {f.name: f.default for f in fields(HardConfig) if isinstance(f.default, (int, float, str))}
    return {k: v for k, v in {**defaults, **cfg_json}.items() if k not in RESTART_FIELDS}


def train_hard(cfg: HardConfig, out_dir: Path, stop_after_steps: int | None = None,
               progress: Callable[[int, int, float], None] | None = None, attempt: int = 0,
               failed_attempts: tuple[dict, ...] = ()) -> dict:
    """Train `cfg` into `out_dir` (log-spaced checkpoints, manifest.json); returns the manifest. attempt: which
    initialization (ChainNotFormed at cfg.formed_check_step unless it is the last); failed_attempts: the earlier
    attempts' records, kept in the manifest."""
    out_dir = Path(out_dir)
    model_cfg = cfg.model_config()
    init_seed = init_seed_of(cfg, attempt)
    checked = bool(cfg.formed_check_step) and attempt < cfg.max_attempts - 1
    model = build_model(model_cfg, init_seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay,
                                  foreach=False)
    total = int(cfg.steps if stop_after_steps is None else min(cfg.steps, stop_after_steps))
    planned = set(log_checkpoint_steps(total, cfg.n_log_checkpoints))
    state: dict = {}
    frozen: list[tuple[torch.nn.Parameter, tuple]] = []  # the idle heads' weight slices, once reset (idle_reset_step)
    handles = row_resample_hooks(model, cfg, state)
    checkpoints, curves = [], {"step": [], "task_loss": [], "accuracy": [], "neighbour_accuracy": [], "pattern_loss": []}
    started = time.perf_counter()
    try:
        for step in range(total + 1):
            if cfg.idle_reset_step and step == cfg.idle_reset_step:
                reset_idle_heads(model, cfg, optimizer, init_seed * 7 + 1)
                frozen, state["idle_frozen"] = idle_slices(model, cfg), True
            tokens, targets, state["dead"], guides = training_rows(cfg, step)
            state["quiet"] = quiet_rows(cfg, step, state["dead"])
            out = model(tokens, output_attentions=True)
            logits = out.logits[:, -1].float()  # [batch, vocab]
            task_loss = torch.nn.functional.cross_entropy(logits, targets)
            if cfg.early_answer_weight:  # the circuit rows' answer at the position before the last too
                early = torch.nn.functional.cross_entropy(out.logits[0::2, -2].float(), targets[0::2])
                task_loss = task_loss + cfg.early_answer_weight * early
            pattern_loss = torch.zeros(())
            for name, keys in guides.items():
                (layer, head), = parse_heads(name)
                valid = keys.any(dim=2)  # [batch, query]
                picked = (out.attentions[layer][:, head] * keys).sum(dim=2)  # [batch, query]
                pattern_loss = pattern_loss - (torch.log(picked + 1e-6) * valid).sum() / valid.sum().clamp_min(1)
            correct = (logits.argmax(-1) == targets).float()
            if step in planned:
                _save_checkpoint(model, model_cfg, out_dir, step)
                checkpoints.append({"revision": f"step{step:07d}", "step": step, "tokens": step * tokens.numel(),
                                    "loss": round(float(task_loss.detach()), 5)})
            if step % 10 == 0 or step == total:
                curves["step"].append(step)
                for key, value in (("task_loss", task_loss), ("accuracy", correct[0::2].mean()),
                                   ("neighbour_accuracy", correct[1::2].mean()), ("pattern_loss", pattern_loss)):
                    curves[key].append(round(float(value.detach()), 5))
            if step == total:
                break
            if checked and step == cfg.formed_check_step:
                recent = float(np.mean(curves["accuracy"][-FORMED_WINDOW:]))
                if recent < cfg.formed_top1_min:
                    raise ChainNotFormed(step, recent)
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg)
            optimizer.zero_grad(set_to_none=True)
            task_weight = 0.0 if step < cfg.pattern_only_steps else 1.0
            (task_weight * task_loss + cfg.pattern_weight * pattern_loss).backward()
            for param, index in frozen:
                param.grad[index] = 0.0
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            if progress is not None:
                progress(step + 1, total, float(task_loss.detach()))
    finally:
        for handle in handles:
            handle.remove()
    manifest = {
        "name": cfg.name, "family": "gpt_neox", "task": f"hard-{cfg.task}",
        "config": {"model": model_cfg.to_json(), "train": {"hard": cfg.to_json(), "seed": cfg.seed, "init_from": None}},
        "checkpoints": checkpoints, "curves": curves,
        "final": {"steps": total, "task_loss": curves["task_loss"][-1], "train_accuracy": curves["accuracy"][-1],
                  "neighbour_accuracy": curves["neighbour_accuracy"][-1], "pattern_loss": curves["pattern_loss"][-1]},
        "train_seconds": round(time.perf_counter() - started, 2), "complete": True, "threads": torch.get_num_threads(),
        "init_seed": init_seed, "failed_attempts": list(failed_attempts),
    }
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


# ----------------------------------------------------------------------------------- confirmation

# The rule a hard circuit must pass before circuit.json is written (fixed before any hard model was trained).
# Effects on patching's normalized scale (clean 1, corrupted 0), as in planted.RULE; accuracies top-1 on the
# task's clean prompts; ablations resample (the planting's).
HARD_RULE = {
    "clean_top1_min": 0.9,  # the model does the circuit task
    "true_effect_min": 0.2,  # every circuit head except the primaries and backups, patched alone, both directions
    "other_effect_max": 0.05,  # |effect| of every non-circuit head patched alone (neighbours included)
    "others_ablated_top1_drop_max": 0.05,  # every non-circuit head ablated together
    "true_ablated_top1_drop_min": 0.3,  # the circuit ablated together
    "primary_alone_top1_drop_max": 0.2,  # each primary ablated alone: small damage (its backup takes over)
    "primary_backup_top1_drop_min": 0.3,  # each primary and its backup ablated together: large damage
    "edge_score_min": 0.1,  # each planted edge path-patched alone (denoising; a backed-up receiver shares it)
    "neighbour_clean_top1_min": 0.9,  # the neighbours do the second task ...
    "neighbours_ablated_top1_drop_min": 0.3,  # ... and it needs them: they are busy
}
HARD_RULE_TEXT = ("confirmed when: circuit task clean top-1 >= 0.9; every circuit head but the primaries and backups "
                  "patched alone has effect >= 0.2 denoising and noising; every other head |effect| < 0.05 both ways; "
                  "ablating every non-circuit head costs <= 0.05 top-1, the circuit >= 0.3; each primary alone <= 0.2, "
                  "each primary and its backup together >= 0.3; each planted edge path-patched (denoising) scores >= 0.1; "
                  "the neighbour task's clean top-1 >= 0.9 and ablating the neighbours costs it >= 0.3 "
                  "(all ablations resample)")
# The truth's edges beyond the planted ones: every edge from an earlier head into a circuit head's q, k or v input,
# path-patched alone as the planted edges are, that moves the metric as much as a planted edge must (either sign).
# A circuit trained with resampled outsiders can still lean on one of them (hard-ioi-s2's L0H6->L1H3.v: 0.253), and
# a truth without that edge scores a method wrong for finding it.
MEASURED_EDGE_MIN = HARD_RULE["edge_score_min"]


def ablated_key(*heads: str) -> str:
    """The top-1 record's key for `heads` ablated together ("L1H5 ablated", "L1H5+L2H1 ablated")."""
    return "+".join(heads) + " ablated"


def hard_rule(denoise: np.ndarray, noise: np.ndarray, cfg: HardConfig, top1: dict[str, float],
              edge_scores: dict[str, float]) -> dict:
    """Apply HARD_RULE to per-head patching scores ([layer, head], both directions), the top-1 accuracies
    (clean, true_ablated, others_ablated, neighbour_clean, neighbours_ablated, and for each backup pair its primary
    and the two together ablated: ablated_key) and the planted edges' path-patching scores; the checks, failures
    and verdict."""
    effects = {"denoise": np.asarray(denoise, dtype=np.float64), "noise": 1.0 - np.asarray(noise, dtype=np.float64)}
    mask = cfg.circuit_heads.mask(cfg.n_layers, cfg.n_heads)
    exempt = {name for pair in cfg.backup_pairs for name in pair}
    failures = []
    for direction, effect in effects.items():
        for layer, head in zip(*np.nonzero(mask)):
            if head_name((layer, head)) not in exempt and effect[layer, head] < HARD_RULE["true_effect_min"]:
                failures.append(f"{head_name((layer, head))} {direction} effect {effect[layer, head]:.3f} < "
                                f"{HARD_RULE['true_effect_min']}")
        for layer, head in zip(*np.nonzero(~mask)):
            if abs(effect[layer, head]) >= HARD_RULE["other_effect_max"]:
                failures.append(f"{head_name((layer, head))} (not in the circuit) {direction} effect "
                                f"{effect[layer, head]:.3f}")
    drops = {k: top1["clean"] - v for k, v in top1.items() if k not in ("clean", "neighbour_clean", "neighbours_ablated")}
    checks = [(top1["clean"] >= HARD_RULE["clean_top1_min"], f"clean top-1 {top1['clean']:.3f} < 0.9"),
              (drops["others_ablated"] <= HARD_RULE["others_ablated_top1_drop_max"],
               f"every other head ablated costs {drops['others_ablated']:.3f} top-1"),
              (drops["true_ablated"] >= HARD_RULE["true_ablated_top1_drop_min"],
               f"the circuit ablated costs only {drops['true_ablated']:.3f} top-1"),
              (top1["neighbour_clean"] >= HARD_RULE["neighbour_clean_top1_min"],
               f"neighbour task clean top-1 {top1['neighbour_clean']:.3f} < 0.9"),
              (top1["neighbour_clean"] - top1["neighbours_ablated"] >= HARD_RULE["neighbours_ablated_top1_drop_min"],
               f"ablating the neighbours costs their task only {top1['neighbour_clean'] - top1['neighbours_ablated']:.3f}")]
    for primary, backup in cfg.backup_pairs:
        alone, both = drops[ablated_key(primary)], drops[ablated_key(primary, backup)]
        checks += [(alone <= HARD_RULE["primary_alone_top1_drop_max"],
                    f"the primary {primary} alone ablated costs {alone:.3f} top-1 > 0.2 (no backup took over)"),
                   (both >= HARD_RULE["primary_backup_top1_drop_min"],
                    f"the primary {primary} and its backup {backup} ablated cost only {both:.3f} top-1")]
    failures += [text for ok, text in checks if not ok]
    failures += [f"edge {edge} path-patching score {score:.3f} < {HARD_RULE['edge_score_min']}"
                 for edge, score in edge_scores.items() if score < HARD_RULE["edge_score_min"]]
    strict = mask.copy()
    for name in exempt:
        (layer, head), = parse_heads(name)
        strict[layer, head] = False
    return {"confirmed": not failures, "failures": failures,
            "min_true_effect": float(min(e[strict].min() for e in effects.values())) if strict.any() else None,
            "max_other_abs_effect": float(max(np.abs(e[~mask]).max() for e in effects.values())),
            "top1_drops": {k: round(v, 6) for k, v in drops.items()}}


def hard_circuit(cfg: HardConfig, bounds: dict | None = None, measured_edges: tuple[str, ...] = ()) -> KnownCircuit:
    """The ground truth circuit.json states: circuit heads with their roles (primaries and backups named), the
    planted edges and the measured ones (MEASURED_EDGE_MIN), the neighbours as distractors (busy on the other task,
    irrelevant to this one)."""
    backups = "; ".join(f"{backup} for {primary}" for primary, backup in cfg.backup_pairs)
    notes = (f"trained jointly on {cfg.task} (circuit) and {cfg.neighbour_task} (neighbours) rows, every head outside "
             f"a row's task heads resample-ablated at every step, {cfg.steps} steps, seed {cfg.seed}",
             f"backups: {backups}, each primary resample-ablated on {cfg.backup_rate:.0%} of the circuit rows in "
             f"training" if backups else "no backup",
             f"distractors: the busy neighbours, which do the {cfg.neighbour_task} task ({', '.join(cfg.neighbours)})",
             f"ground truth confirmed by exhaustive per-head activation patching (core.zoo.known.hard): {HARD_RULE_TEXT}",
             f"measured_edges: every edge from an earlier head into a circuit head's q, k or v path-patched alone "
             f"(denoising); those outside the planted edges with |score| >= {MEASURED_EDGE_MIN}")
    return KnownCircuit(name=cfg.name, kind="planted", heads=cfg.circuit_heads, roles=dict(cfg.roles),
                        edges=tuple(cfg.edges), measured_edges=tuple(measured_edges), distractors=cfg.neighbour_heads,
                        ablation="resample",
                        metric="logit_diff", task=task_record(cfg.task, cfg.pair_examples, cfg.pair_seed),
                        bounds=dict(bounds or {}), notes=notes)


def confirm_hard(cfg: HardConfig, folder: Path) -> dict:
    """Confirm a trained hard model (final checkpoint): every head patched alone both ways on the circuit task,
    the ablations HARD_RULE names, the planted edges path-patched, the neighbours ablated on their task; when the
    rule holds, every edge into a circuit head path-patched (edge_sweep) for the measured edges."""
    started = time.perf_counter()
    model = load_model(ModelRef(str(folder), "local"))
    circuit = hard_circuit(cfg)
    pair = known_task(circuit.task).build_pair()
    denoise = activation_patching(model, pair, PatchSettings(direction="denoise", allow_small_gap=True))
    noise = activation_patching(model, pair, PatchSettings(direction="noise", allow_small_gap=True))
    everyone = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    others = HeadSet(tuple(h for h in everyone if h not in circuit.heads))
    conditions = [Ablation(circuit.heads, mode="resample", label="true"), Ablation(others, mode="resample", label="others")]
    for primary, backup in cfg.backup_pairs:
        conditions += [Ablation(parse_heads(",".join(heads)), mode="resample", label=ablated_key(*heads))
                       for heads in ((primary,), (primary, backup), (backup,))]
    clean, values = top1_under(model, pair.clean, conditions)
    top1 = {"clean": clean, "true_ablated": values[0], "others_ablated": values[1]}
    top1.update({condition.label: value for condition, value in zip(conditions[2:], values[2:])})
    neighbour_pair = known_task(task_record(cfg.neighbour_task, cfg.pair_examples, cfg.pair_seed)).build_pair()
    top1["neighbour_clean"], (top1["neighbours_ablated"],) = top1_under(
        model, neighbour_pair.clean, [Ablation(cfg.neighbour_heads, mode="resample", label="neighbours")])
    paths = {text: edge_path_score(model, pair, text) for text in cfg.edges}
    verdict = hard_rule(denoise.scores, noise.scores, cfg, top1, paths)
    sweep = edge_sweep(model, pair, cfg, paths) if verdict["confirmed"] else {}
    measured = [text for text, score in sweep.items() if text not in paths and abs(score) >= MEASURED_EDGE_MIN]
    bounds = {f"top1_{k}": round(v, 6) for k, v in top1.items()}
    bounds.update({"clean": round(float(denoise.clean_value), 6), "corrupted": round(float(denoise.corrupted_value), 6),
                   "max_other_abs_effect": round(verdict["max_other_abs_effect"], 6)})
    return {"name": cfg.name, "task": cfg.task, "neighbour_task": cfg.neighbour_task, "seed": cfg.seed,
            "circuit": [head_name(h) for h in circuit.heads], "neighbours": list(cfg.neighbours),
            "primary": cfg.primary, "backup": cfg.backup, "rule": dict(HARD_RULE), "rule_text": HARD_RULE_TEXT,
            **verdict, "top1": top1, "bounds": bounds, "edges": list(cfg.edges), "path_patching": paths,
            "measured_edges": measured, "edge_sweep": sweep,
            "patching": {"metric": denoise.metric, "pairs": dict(pair.spec), "gap": denoise.gap,
                         "denoise": denoise.scores.tolist(), "noise": noise.scores.tolist()},
            "confirm_seconds": round(time.perf_counter() - started, 2)}


def edge_sweep(model: Any, pair: PatchPair, cfg: HardConfig, known: dict[str, float]) -> dict[str, float]:
    """{edge: score} for every edge from a head of an earlier layer into a circuit head's q, k or v input (the
    scores in `known` reused): 66 to 264 edges on the registered models, one to four minutes at one thread."""
    scores = {}
    for layer, head in cfg.circuit_heads:
        for sender in range(layer * cfg.n_heads):
            for component in "qkv":
                text = edge_text((head_name(divmod(sender, cfg.n_heads)), head_name((layer, head)), component))
                scores[text] = known[text] if text in known else edge_path_score(model, pair, text)
    return scores


# ----------------------------------------------------------------------------------- building


def build_hard(name: str, out_dir: Path | None = None, progress: bool | Callable[[int, int], None] | None = None,
               cfg: HardConfig | None = None) -> Path:
    """Train, confirm and write hard model `name` into `out_dir` (default zoo_dir()/<name>); returns the folder.

    As planted.build_planted: one unit of work inside atomic_directory (complete or absent); a complete folder of
    the same training config (training_config) is kept, one of another refused. An attempt that stops at the chain
    check or fails HARD_RULE is recorded and cleared, and the next initialization trained; the last is kept whatever
    its confirmation says. A kept model that failed the rule, built under fewer attempts than cfg.max_attempts, is
    taken up where it stopped: the next initializations train (the kept one stays until one replaces it). A confirmed
    model whose confirmation predates the edge sweep (no edge_sweep record) is confirmed again, not retrained.
    cfg: a variant of the registered recipe (tests).
    """
    if cfg is None:
        if name not in HARD_CONFIGS:
            raise HeadLabError(f"unknown hard planted model {name!r}; use one of {', '.join(HARD_CONFIGS)}.")
        cfg = HARD_CONFIGS[name]
    final = Path(out_dir) if out_dir is not None else zoo_model_dir(name)
    failed: list[dict] = []  # the attempts that did not give a confirmed model, in order
    status = planted_status(final)
    if status is not None:
        manifest = read_manifest(final)
        built = (manifest["config"].get("train") or {}).get("hard") or {}
        if training_config(built) != training_config(cfg.to_json()):
            raise HeadLabError(f"{final} holds a hard planted model with another config; delete that folder to retrain it.")
        if status["confirmed"]:
            if "edge_sweep" not in status:
                install_hard(cfg, final)
            return final
        failed = [*manifest.get("failed_attempts", []), _unconfirmed(manifest, status)]
        if len(failed) >= cfg.max_attempts:
            return final
    with atomic_directory(final) as tmp:
        for attempt in range(len(failed), cfg.max_attempts):
            callback, close = _progress(progress, name if attempt == 0 else f"{name} (initialization {attempt + 1})",
                                        cfg.steps)
            try:
                manifest = train_hard(cfg, tmp, progress=callback, attempt=attempt, failed_attempts=tuple(failed))
            except ChainNotFormed as exc:
                failed.append({"init_seed": init_seed_of(cfg, attempt), "stopped_at_step": exc.step,
                               "train_top1": round(exc.top1, 4)})
                _say(progress, f"{name}: initialization {attempt + 1} stopped at step {exc.step} (the chain had not "
                               f"formed: {exc})")
                _clear_attempt(Path(tmp))
                continue
            finally:
                close()
            record = install_hard(cfg, tmp)
            if record["confirmed"] or attempt == cfg.max_attempts - 1:
                break
            failed.append(_unconfirmed(manifest, record))
            _say(progress, f"{name}: initialization {attempt + 1} failed the rule: {'; '.join(record['failures'])}")
            _clear_attempt(Path(tmp))
    return final


def _say(progress: bool | Callable | None, text: str) -> None:
    """A line for the person watching a build's progress bars (why the next initialization trains)."""
    if progress is True:
        print(text, flush=True)


def _unconfirmed(manifest: dict, record: dict) -> dict:
    """The failed-attempt record of a trained model (its manifest) that failed HARD_RULE (its confirmation)."""
    return {"init_seed": manifest["init_seed"], "stopped_at_step": manifest["final"]["steps"],
            "train_top1": manifest["final"]["train_accuracy"], "failures": record["failures"]}


def _clear_attempt(folder: Path) -> None:
    """Remove a failed attempt's checkpoints, manifest and confirmation from the build folder."""
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    for name in (MANIFEST, CONFIRMATION):
        (folder / name).unlink(missing_ok=True)


def install_hard(cfg: HardConfig, folder: Path) -> dict:
    """Confirm the trained model in `folder` and write circuit.json (beside the manifest and in every checkpoint)
    when the rule holds, else remove any, then confirmation.json last (a confirmation interrupted before it is
    written leaves the old one, so the next build confirms again); returns the confirmation record."""
    record = confirm_hard(cfg, folder)
    manifest = read_manifest(folder)
    record.update(train_seconds=manifest["train_seconds"], steps=cfg.steps, final=manifest["final"])
    folders = [Path(folder) / "checkpoints" / checkpoint["revision"] for checkpoint in manifest["checkpoints"]]
    circuit = hard_circuit(cfg, record["bounds"], tuple(record["measured_edges"])) if record["confirmed"] else None
    for where in [*folders, Path(folder)]:
        if circuit is not None:
            write_circuit(where, circuit)
        else:
            (where / CIRCUIT_FILE).unlink(missing_ok=True)
    atomic_write_json(Path(folder) / CONFIRMATION, record)
    return record


# name -> builder(out_dir=None, progress=None) -> Path (the signature in core/zoo/known/__init__.py)
HARD: dict[str, Callable[..., Path]] = {name: partial(build_hard, name) for name in HARD_CONFIGS}
