"""Memory: what a model's weights need, what one example adds to a forward, and what the device has.

Two questions, one place:
- Can the model be loaded at all? `check_fits_in_memory` estimates the weights from the config
  alone (before any weight is read) and refuses a model that cannot fit.
- How many examples per forward? `forward_bytes` estimates the peak bytes one example adds to a
  forward without grad, `memory_budget` is a safety fraction of the device's free memory, and
  `chunk_size_for` turns both into an example count (the probe's chunks, the ablation engine's
  example batches and stacked conditions), or a HeadLabError when not even one example fits.

The per-example estimate counts, for T tokens in the model's dtype (element size e bytes; u = 4
in half precision for the float32 working copies it makes, 0 in float32):
  attention   n_heads x T x T x (ATTENTION_COPIES x e + ATTENTION_UPCASTS x u)   (scores, mask, softmax)
  residual    T x d_model x (RESIDUAL_COPIES x e + RESIDUAL_UPCASTS x u)          (q, k, v, rotary, norms, ...)
  MLP         MLP_COPIES x T x d_mlp x e            (up, activation, gate, product; d_mlp x experts per token)
  logits      rows x d_vocab x LOGIT_COPIES x e + d_vocab x METRIC_COPIES x 4   (rows = 1 at the query, or T)
Only one layer's activations are alive at a time under `lean_forward` (below), so nothing grows
with the number of layers. The counts cover what resident memory (glibc, CPU) showed for GPT-NeoX
and Llama bridges in float32 and half precision: about 2 attention-sized tensors (plus 2 float32
ones for Llama's upcast softmax in half precision), 17 residual-sized (allocator fragmentation
included) and 2 MLP-sized; tests/integration/test_memory.py checks that it stays an upper bound
(a fresh process peaks at about 0.65 of it; one whose heap earlier runs fragmented, up to 0.9).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import psutil
import torch

from core.errors import HeadLabError
from core.model.hooks import family_of, model_dtype

# ------------------------------------------------------------------------------ weights

ACTIVATION_MARGIN_BYTES = 256 * 2**20  # room for a first chunk's activations when deciding whether to load
MEMORY_OVERHEAD = 1.3  # allocator slack, buffers, the bridge's wrappers
# Families whose MLP is up -> act -> down (two matrices); all others are assumed gated (three).
_UNGATED_FAMILIES = {"gpt_neox", "gpt2", "gptj", "gpt_neo", "opt", "bloom", "falcon", "phi"}

# ------------------------------------------------------------------------------ activations

ATTENTION_COPIES = 3
RESIDUAL_COPIES = 20
# float32 working copies a half-precision forward makes: softmax upcast, norms computed in float32
ATTENTION_UPCASTS = 2
RESIDUAL_UPCASTS = 4
MLP_COPIES = 4
LOGIT_COPIES = 2  # the unembedding's output and one copy a wrapper may make
METRIC_COPIES = 3  # query_metrics' float32 logits and its temporaries, per row at the query
SAFETY_FRACTION = 0.5  # of the free memory: other processes, estimate error, the allocator's own slack


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element: 4 for float32, 2 for bfloat16 and float16."""
    return torch.empty((), dtype=dtype).element_size()


def estimate_parameter_count(config: Any) -> int:
    """Parameters of a decoder-only transformer, from its config alone (no weights).

    embeddings (+ untied unembedding) + per layer: Q, K, V, O (grouped K/V counted), the MLP
    (2 matrices, or 3 when gated; times the expert count for mixtures plus the router), norms.
    """
    text = getattr(config, "text_config", None) or config
    d_model = int(text.hidden_size)
    vocab = int(text.vocab_size)
    n_layers = int(text.num_hidden_layers)
    n_heads = int(text.num_attention_heads)
    n_kv = int(getattr(text, "num_key_value_heads", None) or n_heads)
    d_head = int(getattr(text, "head_dim", None) or d_model // n_heads)
    d_mlp = int(getattr(text, "intermediate_size", None) or 4 * d_model)
    n_experts = int(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", 0) or 0)
    gated = family_of(text) not in _UNGATED_FAMILIES
    embed = vocab * d_model * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    attn = 2 * d_model * n_heads * d_head + 2 * d_model * n_kv * d_head
    mlp = (3 if gated else 2) * d_model * d_mlp
    if n_experts:
        mlp = mlp * n_experts + n_experts * d_model
    norms = 4 * d_model
    return embed + n_layers * (attn + mlp + norms) + 2 * d_model


def estimate_memory_bytes(config: Any, dtype: torch.dtype = torch.float32) -> int:
    """Bytes needed to hold and run the model: parameters x dtype size x 1.3 + activation margin."""
    return int(estimate_parameter_count(config) * element_size(dtype) * MEMORY_OVERHEAD) + ACTIVATION_MARGIN_BYTES


def available_memory_bytes(device: str | torch.device = "cpu") -> int:
    """Free memory on `device`: on CUDA the driver's free memory plus what torch's cache holds unused; else psutil's available."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    return int(psutil.virtual_memory().available)


def check_fits_in_memory(
    config: Any, available_bytes: int | None = None, device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> int:
    """Refuse (HeadLabError) a model that would not fit; returns the estimate in bytes."""
    need = estimate_memory_bytes(config, dtype)
    have = available_memory_bytes(device) if available_bytes is None else int(available_bytes)
    if need > have:
        raise HeadLabError(
            f"model needs ~{need / 1e9:.2f} GB, only {have / 1e9:.2f} GB available; "
            "pick a smaller model or a machine with more memory."
        )
    return need


# ------------------------------------------------------------------------------ the probe batch itself

# A probe batch's token ids: int64, drawn then copied once (numpy's astype) while it is built.
BATCH_BYTES_PER_TOKEN = 16
BATCH_BYTES_PER_EXAMPLE = 8 * 8  # query, target, induction and duplicate positions (int64), with their copies


def probe_batch_bytes(n_examples: int, seq_len: int) -> int:
    """Peak bytes of building a probe batch of n_examples x seq_len tokens (before any model runs)."""
    return int(n_examples) * (int(seq_len) * BATCH_BYTES_PER_TOKEN + BATCH_BYTES_PER_EXAMPLE)


def check_probe_batch_fits(n_examples: int, seq_len: int, available_bytes: int | None = None) -> int:
    """Refuse (HeadLabError) a probe batch whose tokens alone would not fit; returns its bytes.

    Asked before the batch is built, so a typo such as `--n 1000000000000` is a sentence, not numpy's
    failed 466 TiB allocation. Compared with memory_budget (SAFETY_FRACTION of the free memory).
    """
    need = probe_batch_bytes(n_examples, seq_len)
    budget = memory_budget("cpu", available_bytes)
    if need > budget:
        raise HeadLabError(
            f"a probe of {int(n_examples):,} sequences of {int(seq_len)} tokens needs ~{need / 1e9:.3g} GB for its "
            f"tokens alone, more than the {budget / 1e9:.2f} GB HeadLab may use ({SAFETY_FRACTION:.0%} of the free memory); "
            "use a smaller --n (the reference probe uses 2000 sequences) or a shorter --seq-len."
        )
    return need


# ------------------------------------------------------------------------------ one example's forward


@dataclass(frozen=True)
class ForwardShape:
    """The sizes a forward's activations scale with. d_mlp is the MLP width a token passes through
    (times the experts per token in a mixture); element_size is the model dtype's bytes per element.
    The number of layers is not one of them: under lean_forward one layer's activations are alive at a time."""

    n_heads: int
    d_model: int
    d_mlp: int
    d_vocab: int
    element_size: int

    def __post_init__(self):
        for name in ("n_heads", "d_model", "d_mlp", "d_vocab", "element_size"):
            if int(getattr(self, name)) < 1:
                raise HeadLabError(f"ForwardShape.{name} is {getattr(self, name)}; every size must be at least 1.")

    @classmethod
    def of_model(cls, model: Any) -> "ForwardShape":
        """The shape of a loaded TransformerBridge (its cfg) in the dtype of its parameters."""
        cfg = model.cfg
        d_model = int(cfg.d_model)
        d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * d_model) * int(getattr(cfg, "experts_per_token", None) or 1)
        return cls(n_heads=int(cfg.n_heads), d_model=d_model, d_mlp=d_mlp, d_vocab=int(cfg.d_vocab),
                   element_size=element_size(model_dtype(model)))

    @classmethod
    def of_config(cls, config: Any, dtype: torch.dtype = torch.float32) -> "ForwardShape":
        """The shape a Hugging Face config describes, in `dtype`: for estimates before any weight is loaded."""
        text = getattr(config, "text_config", None) or config
        d_model = int(text.hidden_size)
        d_mlp = int(getattr(text, "intermediate_size", None) or 4 * d_model) * int(getattr(text, "num_experts_per_tok", None) or 1)
        return cls(n_heads=int(text.num_attention_heads), d_model=d_model, d_mlp=d_mlp, d_vocab=int(text.vocab_size),
                   element_size=element_size(dtype))


def forward_bytes(shape: ForwardShape, seq_len: int, logit_rows: int = 1) -> int:
    """Peak bytes one example of `seq_len` tokens adds to a forward without grad (under lean_forward).

    logit_rows: positions whose logits are computed (1 when only the query row is unembedded, as the
    probe does; seq_len for a plain forward). See the module docstring for the terms.
    """
    t, e = int(seq_len), shape.element_size
    upcast = 4 if e < 4 else 0  # bytes per element of the float32 copies, in half precision only
    attention = shape.n_heads * t * t * (ATTENTION_COPIES * e + ATTENTION_UPCASTS * upcast)
    residual = t * shape.d_model * (RESIDUAL_COPIES * e + RESIDUAL_UPCASTS * upcast)
    mlp = MLP_COPIES * t * shape.d_mlp * e
    logits = int(logit_rows) * shape.d_vocab * LOGIT_COPIES * e + shape.d_vocab * METRIC_COPIES * 4
    return attention + residual + mlp + logits


def memory_budget(device: str | torch.device, available_bytes: int | None = None) -> int:
    """Bytes a chunk may use: SAFETY_FRACTION of the device's free memory (or of `available_bytes`)."""
    have = available_memory_bytes(device) if available_bytes is None else int(available_bytes)
    return int(have * SAFETY_FRACTION)


def chunk_size_for(per_example: int, n: int, budget: int, what: str = "a forward", reserved: int = 0) -> int:
    """Examples per chunk: the largest power of two whose bytes fit `budget - reserved`, clamped to [1, n].

    per_example: bytes one example adds (forward_bytes plus what the caller keeps per example);
    reserved: bytes the caller holds for the whole run (outputs for all n examples).
    A power of two, so that small changes in free memory leave the chunking (and with it the
    float rounding of batched kernels) unchanged. Raises HeadLabError when not one example fits.
    """
    n, per_example = int(n), max(1, int(per_example))
    room = int(budget) - int(reserved)
    if room < per_example:
        raise HeadLabError(
            f"not even one example fits in memory for {what}: one needs ~{per_example / 1e9:.2f} GB "
            f"(plus {max(0, int(reserved)) / 1e9:.2f} GB for the results) but only {max(0, int(budget)) / 1e9:.2f} GB "
            f"may be used ({SAFETY_FRACTION:.0%} of the free memory); use shorter sequences (--seq-len), "
            "a smaller dtype (--dtype bfloat16 or float16) or another device (--device cuda)."
        )
    fit = room // per_example
    return max(1, min(n, 1 << (int(fit).bit_length() - 1)))


@contextlib.contextmanager
def lean_forward(model: Any) -> Iterator[None]:
    """Inside, a forward keeps no layer's tensors after that layer, so forward_bytes holds whatever n_layers is.

    Two things would otherwise keep every layer's activations until the forward ends (and after):
    the Hugging Face KV cache (config.use_cache; keys and values, 2 x T x d_model per example per
    layer) and the bridge's attention bridges, which store their last pattern ([batch, head, T, T])
    in `_pattern`, an attribute nothing reads, until the next forward overwrites it.
    """
    config = getattr(getattr(model, "original_model", None), "config", None)
    saved = getattr(config, "use_cache", None)
    attentions = [block.attn for block in getattr(model, "blocks", []) if hasattr(getattr(block, "attn", None), "_pattern")]
    handles = [attn.register_forward_hook(_drop_pattern) for attn in attentions]
    if config is not None:
        config.use_cache = False
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if config is not None:
            config.use_cache = saved


def _drop_pattern(module: Any, args: Any, output: Any) -> None:
    module._pattern = None


# ------------------------------------------------------------------------------ one task's share of a cluster

GPU_SHARE_STEP = 0.125  # GPU fractions come in eighths: up to 8 small models share one GPU


def task_resources(config: Any, dtype: torch.dtype, device: str | torch.device, gpu_bytes: int | None = None) -> tuple[float, float]:
    """(num_cpus, num_gpus) one model's task reserves on a Ray cluster (core/executor.py).

    CPU: one core; the task runs one torch thread, so tasks never oversubscribe the cores Ray counts.
    CUDA: the fraction of one GPU the model's estimate (weights, margin) takes, rounded up to an
    eighth, at least an eighth and at most one; with no GPU visible here (a cluster's head node),
    a whole one. gpu_bytes: one GPU's memory (default: read from the first GPU).
    """
    if torch.device(device).type != "cuda":
        return 1.0, 0.0
    if gpu_bytes is None:
        if not torch.cuda.is_available():
            return 1.0, 1.0
        gpu_bytes = int(torch.cuda.get_device_properties(0).total_memory)
    share = estimate_memory_bytes(config, dtype) / max(1, int(gpu_bytes))
    steps = max(1, -(-share // GPU_SHARE_STEP))
    return 1.0, float(min(1.0, steps * GPU_SHARE_STEP))
