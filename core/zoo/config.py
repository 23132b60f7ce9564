"""What a zoo model is and how it is trained: `ModelConfig` and `TrainConfig`, recorded in every manifest.

Apart from the loop (train.py) so that the loop, its evaluation (evaluate.py) and the presets
(presets.py) share them without an import cycle. Both are frozen, validated and written to JSON
from their fields (a field missing from an older manifest takes its default).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.choices import FAMILIES, TRAIN_TASKS as TASKS
from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.sequences import check_hhg_format

INDUCTION_TASKS = ("induction", "shifted")  # byte-level induction (core/tasks/mixture.py)
# "tokens": induction on the reference probe's token range (core/tasks/token_repeats.py);
# "none": no training, the seeded initial weights only (real shapes for memory and speed work).
SEQUENCE_TASKS = ("reverse", "sort")
CHECKPOINT_SCHEDULES = ("log", "pythia")  # TrainConfig.checkpoint_schedule


@dataclass(frozen=True)
class ModelConfig(JsonResult):
    """Architecture of one zoo model, independent of the Hugging Face config classes."""

    family: str = "gpt_neox"
    n_layers: int = 3
    n_heads: int = 8
    n_kv_heads: int | None = None  # llama/olmoe: key/value heads (grouped-query attention); None = n_heads
    d_model: int = 64
    d_ff: int = 256
    vocab_size: int = 260
    max_seq_len: int = 64
    rotary_pct: float = 1.0  # gpt_neox only: fraction of each head's dims that gets rotary; 0 = no positions
    use_parallel_residual: bool = True  # gpt_neox only
    hidden_act: str | None = None  # None: the family's default (gelu for gpt_neox, silu otherwise)
    n_experts: int = 4  # olmoe only
    top_k: int = 2  # olmoe only
    router_aux_loss_coef: float = 0.01  # olmoe only: load-balancing loss weight

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise HeadLabError(f"Unknown model family {self.family!r}; choose one of {', '.join(FAMILIES)}.")
        for name in ("n_layers", "n_heads", "d_model", "d_ff", "vocab_size", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                raise HeadLabError(f"Model {name} is {getattr(self, name)}; give a positive integer.")
        if self.n_kv_heads is not None:
            if self.family == "gpt_neox":
                raise HeadLabError("GPT-NeoX has no grouped-query attention; leave n_kv_heads unset.")
            if int(self.n_kv_heads) < 1 or self.n_heads % int(self.n_kv_heads):
                raise HeadLabError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}.")
        if self.d_model % self.n_heads:
            raise HeadLabError(f"d_model {self.d_model} must be a multiple of n_heads {self.n_heads}.")
        if self.family == "olmoe" and not 1 <= self.top_k <= self.n_experts:
            raise HeadLabError("OLMoE top_k must be between 1 and n_experts.")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class TrainConfig(JsonResult):
    """How one zoo model is trained; every field is recorded in its manifest."""

    task: str = "induction"
    steps: int = 2000  # an upper bound when early stopping applies (reverse/sort)
    batch_size: int = 32
    seq_len: int = 64  # induction, duplicate and tokens tasks (reverse/sort widths follow their lengths)
    lr: float = 3e-3
    warmup_steps: int = 50  # linear warm-up, then constant
    decay_fraction: float = 0.0  # last fraction of the steps: linear decay to 10% of lr (steadier final model)
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    head_l1: float = 0.0  # gpt_neox: group-lasso weight on each head's (Q,K,V,O) norm, after the warm-up
    grad_clip: float = 1.0
    text_first_steps: int = 0  # induction only: pure text steps before the repeat warm-up
    repeat_warmup_steps: int = 500  # induction only: repeat-rich warm-up first, then the mixture
    # induction only: a seed whose repeated-half loss (latest evaluation) is not yet below
    # warmup_loss_below when the warm-up ends keeps the warm-up's data (pure repeats) until it is, at
    # most until step warmup_extend_to; the head lasso still starts at the fixed end. 0 = never extend
    warmup_extend_to: int = 0
    warmup_loss_below: float = 4.0
    # with warmup_extend_to: from this step on, the head lasso pauses while the extended warm-up still runs
    # (a seed still on the loss plateau); it resumes when the warm-up ends. 0 = never pause
    lasso_pause_from: int = 0
    # once an evaluation counts more than this many strong induction heads, the head lasso weight is
    # multiplied by lasso_boost for the rest of training (keeps the circuit small enough for matched-random
    # controls). 0 = never
    lasso_boost_above: int = 0
    lasso_boost: float = 2.0
    warmup_repeat_fraction: float = 1.0  # share of repeat sequences during the warm-up (1 = pure repeat)
    repeat_fraction: float = 0.5  # share of repeat sequences in the mixture after the warm-up
    mixture_chunk_max: int = 32  # longest repeated chunk after the warm-up (the warm-up keeps 8-32)
    softmax_vocab: int | None = None  # loss over the first N ids only (a task that never uses a higher id); None = all
    seed: int = 0
    stop_accuracy: float | None = 0.9  # reverse/sort: stop once train exact match reaches this
    hhg_format: str = "headlab"  # reverse/sort: training layout, "headlab" or the reference code's (core/tasks/sequences.py)
    eval_every: int = 100  # steps between evaluations (and early-stop checks)
    eval_examples: int = 64  # per evaluation (per length for reverse/sort)
    final_examples: int = 256  # for the final figures
    init_from: str | None = None  # start from this zoo model's final checkpoint (continued training)
    unembed_init_from_embed: bool = False  # start the (untied) unembedding as a copy of the embedding
    state_every: int = 250  # steps between resumable-state saves (also saved at every checkpoint)
    log_every: int = 10  # steps per point of the loss curve (window mean)
    n_log_checkpoints: int = 20  # log-spaced checkpoints over the run (plus step 0 and the end)
    # "log": n_log_checkpoints log-spaced steps plus one wherever the loss drops; "pythia": the steps
    # Pythia published (0, 1, 2, 4, ..., 512, then every 1,000) and the last, nothing else
    checkpoint_schedule: str = "log"
    loss_drop_checkpoint: float = 0.25  # extra checkpoint when the smoothed loss fell this much (nats)
    min_checkpoint_gap: int = 10  # steps between loss-drop checkpoints
    loss_smoothing: float = 0.05  # EMA weight of the newest loss in the smoothed loss

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise HeadLabError(f"Unknown training task {self.task!r}; choose one of {', '.join(TASKS)}.")
        if int(self.steps) < (0 if self.task == "none" else 1) or int(self.batch_size) < 1:
            raise HeadLabError(f"Training steps ({self.steps}) and batch_size ({self.batch_size}) must be positive "
                               "integers; give at least 1.")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        check_hhg_format(self.hhg_format)
        if self.checkpoint_schedule not in CHECKPOINT_SCHEDULES:
            raise HeadLabError(f"checkpoint_schedule {self.checkpoint_schedule!r} is unknown; use one of "
                               f"{', '.join(CHECKPOINT_SCHEDULES)}.")
        if self.warmup_extend_to and (self.task not in INDUCTION_TASKS
                                      or self.warmup_extend_to <= self.fixed_warmup_end):
            raise HeadLabError(f"warmup_extend_to ({self.warmup_extend_to}) extends an induction model's repeat warm-up: "
                               "give 0, or a step after text_first_steps + repeat_warmup_steps.")
        if self.lasso_pause_from and not self.warmup_extend_to:
            raise HeadLabError(f"lasso_pause_from ({self.lasso_pause_from}) pauses the head lasso during an extended "
                               "warm-up: set warmup_extend_to too, or give 0.")
        if (self.lasso_pause_from or self.lasso_boost_above) and not self.head_l1:
            raise HeadLabError("lasso_pause_from and lasso_boost_above change the head lasso: set head_l1 > 0, or give 0.")
        if self.hhg_format != "headlab" and self.task not in SEQUENCE_TASKS:
            raise HeadLabError(f"--hhg-format {self.hhg_format} applies to the reverse and sort tasks only, not {self.task!r}.")

    @property
    def fixed_warmup_end(self) -> int:
        """The step the induction warm-up ends without an extension (text first, then pure repeats);
        the head lasso starts there."""
        return self.text_first_steps + self.repeat_warmup_steps

    @property
    def data_kind(self) -> str:
        """The mixture kind after the repeat warm-up (induction tasks)."""
        return "shifted" if self.task == "shifted" else "mixture"
