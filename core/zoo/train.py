"""Training one zoo model: a plain torch loop over a Hugging Face model, with checkpoints and resume.

No weights can be downloaded here, so HeadLab trains its own: GPT-NeoX, Llama-style and
OLMoE-style models, built from a config (core/zoo/config.py) and trained with a plain torch loop.
Each model folder under `zoo_dir()/<name>/` holds `manifest.json` and `checkpoints/step{N:07d}/`
(each a `save_pretrained` folder with safetensors weights and a tokenizer), saved at log-spaced
steps plus extra ones where the loss falls fast, so circuits can be followed across training.
The zoo's recipes are in core/zoo/presets.py; what is measured along the way in core/zoo/evaluate.py.

Determinism: `torch.manual_seed(seed)` right before model init (same seed, same weights on the
same number of torch threads, recorded as `threads` in the state and manifest and reused by a
resume (older records lack it: null); float sums differ between 1 and 2 threads, and the paper preset's
induction recipe with seed 0 ends at 0.454 nats of repeated-half loss on 2 threads but 0.400 on 1),
and every batch is a pure function of (seed, step). The resumable state in `<model>/state/` (weights,
optimizer moments, step, curves; safetensors + JSON, no pickle) therefore lets an interrupted run
finish with bit-identical weights.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig, OlmoeConfig, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.utils import logging as hf_logging

from core.executor import ProgressBar
from core.errors import HeadLabError
from core.model.refs import MANIFEST, read_manifest
from core.tasks import duplicate, mixture, sequences, token_repeats, vocab
from core.workspace import atomic_directory, atomic_write_json, recover_directory, zoo_dir
from core.zoo.config import SEQUENCE_TASKS, ModelConfig, TrainConfig
from core.zoo.evaluate import evaluate_during_training, final_figures


# ----------------------------------------------------------------------------------- the model


def _special_ids(vocab_size: int) -> dict[str, int | None]:
    """BOS/PAD/EOS ids of the vocabulary the model is trained on (bytes or [HHG] sequences)."""
    if vocab_size == vocab.BYTE_VOCAB_SIZE:
        return {"bos": vocab.BOS, "pad": vocab.PAD, "eos": vocab.EOS, "sep": vocab.SEP}
    if vocab_size == sequences.SEQ_VOCAB_SIZE:
        return {"bos": sequences.START, "pad": sequences.PAD, "eos": sequences.END, "sep": sequences.SEP}
    return {"bos": None, "pad": None, "eos": None, "sep": None}


def build_hf_config(cfg: ModelConfig):
    """The transformers config for `cfg`: eager attention, untied embeddings, no dropout."""
    ids = _special_ids(cfg.vocab_size)
    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=False,
        bos_token_id=ids["bos"],
        pad_token_id=ids["pad"],
        eos_token_id=ids["eos"],
        use_cache=False,
        attention_dropout=0.0,
    )
    if cfg.family == "gpt_neox":
        config = GPTNeoXConfig(
            **common,
            hidden_act=cfg.hidden_act or "gelu",
            hidden_dropout=0.0,
            classifier_dropout=0.0,
            use_parallel_residual=cfg.use_parallel_residual,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": float(cfg.rotary_pct)},
        )
    elif cfg.family == "llama":
        config = LlamaConfig(**common, hidden_act=cfg.hidden_act or "silu", num_key_value_heads=cfg.n_kv_heads or cfg.n_heads)
    else:
        config = OlmoeConfig(
            **common,
            hidden_act=cfg.hidden_act or "silu",
            num_key_value_heads=cfg.n_kv_heads or cfg.n_heads,
            num_experts=cfg.n_experts,
            num_experts_per_tok=cfg.top_k,
            router_aux_loss_coef=cfg.router_aux_loss_coef,
        )
    config._attn_implementation = "eager"
    return config


def build_model(cfg: ModelConfig, seed: int):
    """A freshly initialised model; same (cfg, seed), same weights."""
    torch.manual_seed(int(seed))
    model = AutoModelForCausalLM.from_config(build_hf_config(cfg), attn_implementation="eager")
    return model


def load_checkpoint_model(path: Path):
    """A saved checkpoint folder as a Hugging Face model (eager attention)."""
    return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager")


# ----------------------------------------------------------------------------------- tokenizer


def save_tokenizer(path: Path, vocab_size: int) -> None:
    """Save a tiny tokenizer matching the zoo vocabulary into `path` (TransformerBridge boots need one).

    Byte vocabulary (260): byte-level, so `"text"` encodes to its UTF-8 bytes as ids 0..255, with
    BOS prepended like in training. [HHG] vocabulary (104): one word per id ("17" -> 17, specials
    named), whitespace separated, START prepended. Any other size: ids spelled "<i>".
    """
    ids = _special_ids(vocab_size)
    names = {"bos": "<bos>", "pad": "<pad>", "eos": "<eos>", "sep": "<sep>"}
    if vocab_size == 260:
        table = {char: byte for byte, char in bytes_to_unicode().items()}
        table.update({names[k]: v for k, v in ids.items()})
        tok = Tokenizer(models.BPE(vocab=table, merges=[], unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:
        special = {v: names[k] for k, v in ids.items() if v is not None}
        if vocab_size == 104:
            special[103] = "<unused>"
        table = {special.get(i, str(i) if vocab_size == 104 else f"<{i}>"): i for i in range(vocab_size)}
        if ids["pad"] is None:  # a WordLevel model needs an unknown token
            table["<pad>"] = vocab_size
            ids = {**ids, "pad": vocab_size}
        tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<pad>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special_names = {k: names[k] for k, v in ids.items() if v is not None}
    tok.add_special_tokens(list(special_names.values()))
    if ids["bos"] is not None:
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", ids["bos"])]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special_names.get("bos"),
        eos_token=special_names.get("eos"),
        pad_token=special_names.get("pad"),
        sep_token=special_names.get("sep"),
        unk_token=special_names.get("pad"),
        add_bos_token=ids["bos"] is not None,
    )
    fast.save_pretrained(str(path))


# ----------------------------------------------------------------------------------- training


def _lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup_steps`, constant, then (decay_fraction > 0) linear decay to 10% at the end."""
    scale = 1.0 if cfg.warmup_steps <= 0 else min(1.0, (step + 1) / cfg.warmup_steps)
    decay_start = cfg.steps * (1.0 - cfg.decay_fraction)
    if cfg.decay_fraction > 0 and step >= decay_start:
        scale *= 1.0 - 0.9 * (step - decay_start) / (cfg.steps - decay_start)
    return cfg.lr * scale


def _same_config(stored: dict | None, model_cfg: ModelConfig, train_cfg: TrainConfig) -> bool:
    """Whether a folder's recorded config is this one. Compared as configs, not as JSON, so a field
    added to HeadLab later (missing from older records) counts as its default, which keeps the old
    behaviour."""
    if stored is None:
        return True
    return ModelConfig.from_json(stored["model"]) == model_cfg and TrainConfig.from_json(stored["train"]) == train_cfg


# config field -> the `train` flag that sets it, to name what differs when a rerun meets another run's folder
TRAIN_FLAGS = {"family": "--family", "n_layers": "--layers", "n_heads": "--heads", "d_model": "--d-model",
               "d_ff": "--d-ff", "task": "--task", "steps": "--steps", "seed": "--seed", "init_from": "--init-from",
               "hhg_format": "--hhg-format"}


def config_differences(stored: dict, model_cfg: ModelConfig, train_cfg: TrainConfig) -> list[tuple[str, Any, Any]]:
    """(field, stored value, this run's value) for every config field that differs, model config first."""
    pairs = ((ModelConfig.from_json(stored["model"]), model_cfg), (TrainConfig.from_json(stored["train"]), train_cfg))
    return [(f.name, getattr(old, f.name), getattr(new, f.name)) for old, new in pairs for f in dataclasses.fields(new)
            if getattr(old, f.name) != getattr(new, f.name)]


def different_config_error(name: str, out_dir: Path, stored: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
                           finished: bool) -> HeadLabError:
    """The refusal of a rerun whose config differs from the folder's: the flags that differ, then a new name to train
    under, and only then deleting the folder (which throws away a trained model)."""
    differences = config_differences(stored, model_cfg, train_cfg)
    said = "; ".join(f"{TRAIN_FLAGS.get(field, field)} {old} there, {new} now" for field, old, new in differences)
    field, _, new = differences[0] if differences else ("other", None, "")
    suggestion = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{name}-{TRAIN_FLAGS.get(field, field).lstrip('-')}{new}")
    return HeadLabError(f"{out_dir} holds {'a finished model' if finished else 'a run'} with a different config "
                        f"({said or 'fields added since'}); train this one under a new name (e.g. --name {suggestion}), "
                        "or delete that folder to retrain it.")


def batch_at(train_cfg: TrainConfig, step: int, warmup_end: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Training batch for `step`: tokens [batch, seq] and a loss mask [batch, seq] (None: every position).

    warmup_end: the step the induction repeat warm-up's data ends (warmup_end_at); None: the config's fixed end."""
    if train_cfg.task in SEQUENCE_TASKS:
        return sequences.sequence_training_batch(train_cfg.task, step, train_cfg.batch_size, train_cfg.seed,
                                                    train_cfg.hhg_format)
    if train_cfg.task == "duplicate":
        return duplicate.training_batch(step, train_cfg.batch_size, train_cfg.seq_len, train_cfg.seed), None
    if train_cfg.task == "tokens":
        return token_repeats.training_batch(step, train_cfg.batch_size, train_cfg.seq_len, train_cfg.seed,
                                            train_cfg.repeat_warmup_steps), None
    if train_cfg.task == "none":
        raise HeadLabError("A 'none' task model is not trained; it has no training batches.")
    chunk_max = mixture.CHUNK_MAX  # 8-32 byte repeats until the warm-up ends: induction forms fastest on them
    if step < train_cfg.text_first_steps:
        fraction, kind = 0.0, "text"
    elif step < (train_cfg.fixed_warmup_end if warmup_end is None else warmup_end):
        fraction = train_cfg.warmup_repeat_fraction
        kind = "repeat" if fraction >= 1.0 else train_cfg.data_kind
    else:
        fraction, kind, chunk_max = train_cfg.repeat_fraction, train_cfg.data_kind, train_cfg.mixture_chunk_max
    tokens = mixture.training_batch(kind, step, train_cfg.batch_size, train_cfg.seq_len, train_cfg.seed,
                                    repeat_fraction=fraction, chunk_max=chunk_max)
    return tokens, None


def warmup_end_at(train_cfg: TrainConfig, meta: dict, step: int) -> int:
    """The step the induction warm-up's data (pure repeats) ends, as known at `step`: the config's fixed
    end, or with warmup_extend_to the step it was seen to end (meta["warmup_end"]), or step + 1 while
    it is still running. The head lasso does not follow it: it starts at the fixed end."""
    if not train_cfg.warmup_extend_to:
        return train_cfg.fixed_warmup_end
    return step + 1 if meta.get("warmup_end") is None else meta["warmup_end"]


def _end_warmup_if_due(train_cfg: TrainConfig, meta: dict) -> None:
    """With warmup_extend_to, at the top of step meta["step"]: end the warm-up's data there once the
    fixed warm-up is over and the latest evaluation's repeated-half loss is below warmup_loss_below
    (induction has formed), or at warmup_extend_to at the latest. A seed already below the bar when
    the fixed warm-up ends (evaluated at that step) trains exactly as with the fixed warm-up."""
    if not train_cfg.warmup_extend_to or meta.get("warmup_end") is not None:
        return
    step = meta["step"]
    if step < train_cfg.fixed_warmup_end:
        return
    losses = meta["curves"]["eval"].get("induction_loss") or []
    if step >= train_cfg.warmup_extend_to or (losses and losses[-1] < train_cfg.warmup_loss_below):
        meta["warmup_end"] = step


def head_lasso_weight(train_cfg: TrainConfig, meta: dict, step: int) -> float:
    """The head group-lasso weight of `step` (0 = off): head_l1 from the fixed warm-up's end, paused from
    lasso_pause_from while an extended warm-up still runs, times lasso_boost from the first evaluation
    that counted more than lasso_boost_above strong induction heads (meta["lasso_boost_from"], kept).

    Why the pause: the lasso shrinks every head while a seed sits on the loss plateau, and a seed that
    stays there long leaves it with heads too small to finish forming. Why the boost: a seed whose
    circuit takes more than 5 of its 12 layer-1 heads leaves fewer than 20 disjoint matched-random sets."""
    if not train_cfg.head_l1 or step < train_cfg.fixed_warmup_end:
        return 0.0
    if train_cfg.lasso_boost_above and meta.get("lasso_boost_from") is None:
        strong = meta["curves"]["eval"].get("strong_induction_count") or []
        if strong and strong[-1] > train_cfg.lasso_boost_above:
            meta["lasso_boost_from"] = step
    if train_cfg.lasso_pause_from and step >= train_cfg.lasso_pause_from and meta.get("warmup_end") is None:
        return 0.0
    return train_cfg.head_l1 * (train_cfg.lasso_boost if meta.get("lasso_boost_from") is not None else 1.0)


def softmax_vocab_at(train_cfg: TrainConfig, step: int) -> int | None:
    """The softmax width of `step`'s loss: the token task's warm-up stages use only their first ids."""
    if train_cfg.task == "tokens" and train_cfg.softmax_vocab is not None:
        return token_repeats.curriculum_softmax_vocab(step, train_cfg.repeat_warmup_steps) or train_cfg.softmax_vocab
    return train_cfg.softmax_vocab


def training_loss(model, model_cfg: ModelConfig, tokens: torch.Tensor, mask: torch.Tensor | None,
                  softmax_vocab: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy (on mask positions: mask[t] scores predicting tokens[t+1]), plus
    OLMoE's load-balancing loss.

    `softmax_vocab`: take the softmax over the first N ids only, for data that never holds a higher
    id. At a 50k vocabulary the unembedding is most of a small model's compute (the Pythia-14m shape
    trains 4x faster over its 10k used ids); the unused rows keep their initial weights.
    """
    is_moe = model_cfg.family == "olmoe"
    if softmax_vocab is not None:
        if is_moe:
            raise HeadLabError("softmax_vocab is not supported for OLMoE models; leave it unset.")
        hidden = model.base_model(tokens).last_hidden_state[:, :-1]  # [batch, seq-1, d_model], final norm applied
        unembed = model.get_output_embeddings()
        bias = None if unembed.bias is None else unembed.bias[:softmax_vocab]
        logits = torch.nn.functional.linear(hidden, unembed.weight[:softmax_vocab], bias).float()  # [batch, seq-1, N]
        out = None
    else:
        out = model(tokens, output_router_logits=True) if is_moe else model(tokens)
        logits = out.logits[:, :-1].float()  # [batch, seq-1, vocab]
    targets = tokens[:, 1:]
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    if mask is None:
        loss = losses.mean()
    else:
        m = mask[:, :-1].reshape(-1).float()
        loss = (losses * m).sum() / m.sum()
    if is_moe and out is not None and out.aux_loss is not None:
        loss = loss + model_cfg.router_aux_loss_coef * out.aux_loss
    return loss


def head_group_norms(model, model_cfg: ModelConfig) -> torch.Tensor:
    """Per-head L2 norm of the head's Q, K, V rows and W_O columns (GPT-NeoX layout): [layer, head]."""
    if model_cfg.family != "gpt_neox":
        raise HeadLabError("head_l1 is implemented for gpt_neox models only; set head_l1=0.")
    n, d = model_cfg.n_heads, model_cfg.d_head
    norms = []
    for layer in model.gpt_neox.layers:
        qkv = layer.attention.query_key_value.weight.view(n, 3 * d, -1)  # [head, 3*d_head, d_model]
        out = layer.attention.dense.weight.view(-1, n, d)  # [d_model, head, d_head]
        sq = qkv.pow(2).sum(dim=(1, 2)) + out.pow(2).sum(dim=(0, 2))
        norms.append(sq.clamp_min(1e-12).sqrt())
    return torch.stack(norms)  # [layer, head]


def log_checkpoint_steps(total_steps: int, n: int) -> list[int]:
    """Step 0, n log-spaced steps in [1, total_steps], and total_steps; sorted, unique."""
    steps = {0, int(total_steps)}
    if n > 0 and total_steps > 0:
        for i in range(n):
            steps.add(int(round(total_steps ** (i / max(1, n - 1)))))
    return sorted(s for s in steps if 0 <= s <= total_steps)


def pythia_checkpoint_steps(total_steps: int) -> list[int]:
    """The steps of Pythia's published revisions up to total_steps (0, 1, 2, 4, ..., 512, then every
    1,000), and total_steps itself; sorted."""
    steps = {0, int(total_steps)} | {2 ** k for k in range(10) if 2 ** k <= total_steps}
    steps |= set(range(1000, int(total_steps) + 1, 1000))
    return sorted(steps)


def _revision(step: int) -> str:
    return f"step{step:07d}"


def _tokens_per_step(train_cfg: TrainConfig) -> int:
    """Tokens in one training batch (for reverse/sort: the padded batch width)."""
    if train_cfg.task in SEQUENCE_TASKS:
        return train_cfg.batch_size * sequences.sequence_length(max(sequences.TRAIN_LENGTHS))
    return train_cfg.batch_size * train_cfg.seq_len


def _save_checkpoint(model, model_cfg: ModelConfig, out_dir: Path, step: int) -> None:
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint is noise
    try:
        with atomic_directory(out_dir / "checkpoints" / _revision(step)) as tmp:
            model.save_pretrained(str(tmp), safe_serialization=True)
            save_tokenizer(tmp, model_cfg.vocab_size)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save_state(model, optimizer, out_dir: Path, meta: dict) -> None:
    """Resumable state: model.safetensors, optimizer.safetensors (moments flattened), state.json."""
    opt = optimizer.state_dict()
    flat = {f"{index}.{key}": value.detach().clone().contiguous()
            for index, slot in opt["state"].items() for key, value in slot.items() if torch.is_tensor(value)}
    with atomic_directory(out_dir / "state") as tmp:
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
        save_file(flat, str(tmp / "optimizer.safetensors"))
        atomic_write_json(tmp / "state.json", {**meta, "param_groups": opt["param_groups"]})


def _load_state(model, optimizer, out_dir: Path) -> dict | None:
    folder = out_dir / "state"
    recover_directory(folder)  # a save killed between its two renames: the previous state comes back
    if not (folder / "state.json").is_file():
        return None
    try:
        meta = json.loads((folder / "state.json").read_text())
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        flat = load_file(str(folder / "optimizer.safetensors"))
    except (OSError, ValueError, RuntimeError) as exc:
        raise HeadLabError(
            f"The saved training state in {folder} is unreadable ({exc.__class__.__name__}); delete that folder to restart the model."
        ) from None
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta


def _initial_model(model_cfg: ModelConfig, train_cfg: TrainConfig):
    """Fresh init (seeded), or the final checkpoint of `init_from` for continued training.

    `unembed_init_from_embed`: the unembedding starts equal to the embedding (the weights stay
    untied). With 10,000 random tokens and independent random W_E and W_U, copying a token needs
    W_U[t] aligned with W_E[t] for every t, learnt one rare token at a time; starting aligned, an
    induction head can copy from the first step.
    """
    if not train_cfg.init_from:
        model = build_model(model_cfg, train_cfg.seed)
        if train_cfg.unembed_init_from_embed:
            with torch.no_grad():
                model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)
        return model
    parent_dir = Path(train_cfg.init_from)
    if not parent_dir.is_dir():
        parent_dir = zoo_dir() / train_cfg.init_from
    parent = read_manifest(parent_dir, missing_ok=True)
    if not parent:
        raise HeadLabError(f"init_from model {train_cfg.init_from!r} does not exist (no zoo model or model folder of that "
                           "name); give a trained zoo model (python -m core models lists them).")
    if not parent.get("complete"):
        raise HeadLabError(f"init_from model {train_cfg.init_from!r} is not fully trained; train it first (python -m core zoo).")
    parent_cfg = ModelConfig.from_json(parent["config"]["model"])
    if parent_cfg != model_cfg:
        raise HeadLabError(f"init_from model {train_cfg.init_from!r} has a different architecture; use its model config.")
    final = parent["checkpoints"][-1]["revision"]
    torch.manual_seed(int(train_cfg.seed))
    return load_checkpoint_model(parent_dir / "checkpoints" / final)


def train_model(
    name: str,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    out_dir: Path,
    progress: bool | Callable[[int, int, float], None] | None = None,
    stop_after_steps: int | None = None,
) -> dict:
    """Train (or resume, or skip if complete) one model into `out_dir`; returns its manifest.

    `progress`: True for a tqdm bar, or a callable(step, total_steps, loss) called after each
    update (raising from it interrupts the run; rerunning resumes). `stop_after_steps` stops
    cleanly after that many total updates (saving the state), leaving the model incomplete.
    """
    out_dir = Path(out_dir)
    config_json = {"model": model_cfg.to_json(), "train": train_cfg.to_json()}
    existing = read_manifest(out_dir, missing_ok=True)
    if existing and existing.get("complete"):
        if not _same_config(existing.get("config"), model_cfg, train_cfg):
            raise different_config_error(name, out_dir, existing["config"], model_cfg, train_cfg, finished=True)
        return existing
    model = _initial_model(model_cfg, train_cfg)  # before the folder exists: a refused init_from leaves nothing behind
    out_dir.mkdir(parents=True, exist_ok=True)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=train_cfg.lr, betas=train_cfg.betas, eps=train_cfg.adam_eps,
        weight_decay=train_cfg.weight_decay, foreach=False
    )
    meta = _load_state(model, optimizer, out_dir)
    if meta is not None and not _same_config(meta.get("config"), model_cfg, train_cfg):
        raise different_config_error(name, out_dir, meta["config"], model_cfg, train_cfg, finished=False)
    if meta is not None and meta.get("threads"):  # the run's own thread count: same float sums, same weights
        torch.set_num_threads(int(meta["threads"]))
    if meta is None:
        meta = {
            "threads": torch.get_num_threads(), "config": config_json, "step": 0, "tokens": 0, "ema": None, "ema_at_checkpoint": None,
            "last_checkpoint_step": None, "checkpoints": [], "train_seconds": 0.0,
            "curves": {"step": [], "loss": [], "eval": {"step": []}}, "window": [], "stopped_early": False,
            "induction_step": None, "induction_seconds": None, "warmup_end": None, "lasso_boost_from": None,
        }
    total = int(train_cfg.steps)
    if train_cfg.checkpoint_schedule == "pythia":
        planned = set(pythia_checkpoint_steps(total))
    else:
        planned = set(log_checkpoint_steps(total, train_cfg.n_log_checkpoints))
    tokens_per_step = _tokens_per_step(train_cfg)
    bar = None
    if progress is True:
        # a run that stops early (reverse-hhg: ~1,200 of 15,000 steps) shows a count and the rule that ends
        # it, not a bar to 15,000 with a 10-hour ETA
        early = train_cfg.task in SEQUENCE_TASKS and train_cfg.stop_accuracy is not None
        desc = f"{name} (until {train_cfg.stop_accuracy:.0%} train exact match, at most {total} steps)" if early else name
        bar = ProgressBar(total=None if early else total, initial=meta["step"], desc=desc, unit="step", leave=True)
    callback = progress if callable(progress) else None

    def manifest(complete: bool, final: dict | None = None) -> dict:
        return {
            "name": name, "family": model_cfg.family, "task": train_cfg.task, "config": config_json,
            "checkpoints": meta["checkpoints"], "curves": meta["curves"], "final": final or {},
            "train_seconds": round(meta["train_seconds"], 2), "complete": complete, "threads": meta.get("threads"),
        }

    def checkpoint(step: int, loss: float | None) -> None:
        _save_checkpoint(model, model_cfg, out_dir, step)
        entry = {"revision": _revision(step), "step": step, "tokens": step * tokens_per_step,
                 "loss": None if loss is None else round(loss, 5)}
        meta["checkpoints"] = [c for c in meta["checkpoints"] if c["step"] != step] + [entry]
        meta["last_checkpoint_step"] = step
        meta["ema_at_checkpoint"] = meta["ema"]
        _save_state(model, optimizer, out_dir, meta)
        atomic_write_json(out_dir / MANIFEST, manifest(False))

    def wants_checkpoint(step: int) -> bool:
        if step in planned:
            return True
        if train_cfg.checkpoint_schedule == "pythia":
            return False
        last, ema, ema_then = meta["last_checkpoint_step"], meta["ema"], meta["ema_at_checkpoint"]
        return (last is not None and ema is not None and ema_then is not None
                and step - last >= train_cfg.min_checkpoint_gap and ema_then - ema > train_cfg.loss_drop_checkpoint)

    started = time.perf_counter()
    seconds_before = meta["train_seconds"]
    try:
        while meta["step"] < total and not meta["stopped_early"]:
            step = meta["step"]
            if stop_after_steps is not None and step >= stop_after_steps:
                meta["train_seconds"] = seconds_before + time.perf_counter() - started
                _save_state(model, optimizer, out_dir, meta)
                return manifest(False)
            _end_warmup_if_due(train_cfg, meta)
            tokens, mask = batch_at(train_cfg, step, warmup_end_at(train_cfg, meta, step))
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, train_cfg)
            loss = training_loss(model, model_cfg, tokens, mask, softmax_vocab_at(train_cfg, step))
            value = float(loss.detach())
            # Saves happen before this step changes any bookkeeping, so a resume from them
            # replays step `step` exactly once.
            if wants_checkpoint(step):
                meta["train_seconds"] = seconds_before + time.perf_counter() - started
                checkpoint(step, value)
            elif step > 0 and step % train_cfg.state_every == 0:
                meta["train_seconds"] = seconds_before + time.perf_counter() - started
                _save_state(model, optimizer, out_dir, meta)
            a = train_cfg.loss_smoothing
            meta["ema"] = value if meta["ema"] is None else (1 - a) * meta["ema"] + a * value
            lasso = head_lasso_weight(train_cfg, meta, step)
            if lasso:
                loss = loss + lasso * head_group_norms(model, model_cfg).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if train_cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
            optimizer.step()
            meta["step"] = step + 1
            meta["tokens"] = meta["step"] * tokens_per_step
            meta["window"].append(value)
            if len(meta["window"]) >= train_cfg.log_every:
                meta["curves"]["step"].append(meta["step"])
                meta["curves"]["loss"].append(round(sum(meta["window"]) / len(meta["window"]), 5))
                meta["window"] = []
            if meta["step"] % train_cfg.eval_every == 0 or meta["step"] == total:
                evaluate_during_training(model, model_cfg, train_cfg, meta,
                                          seconds_before + time.perf_counter() - started)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{meta['ema']:.3f}")
            if callback is not None:
                callback(meta["step"], total, value)
    finally:
        if bar is not None:
            bar.close()
    meta["train_seconds"] = seconds_before + time.perf_counter() - started
    step = meta["step"]
    if not any(c["step"] == step for c in meta["checkpoints"]):
        final_loss = None
        if train_cfg.task != "none":
            tokens, mask = batch_at(train_cfg, step, warmup_end_at(train_cfg, meta, step))
            with torch.no_grad():
                final_loss = float(training_loss(model, model_cfg, tokens, mask, train_cfg.softmax_vocab))
        checkpoint(step, final_loss)
    eval_started = time.perf_counter()
    final = final_figures(model, model_cfg, train_cfg, meta)
    final["eval_seconds"] = round(time.perf_counter() - eval_started, 2)
    result = manifest(True, final)
    atomic_write_json(out_dir / MANIFEST, result)
    return result
