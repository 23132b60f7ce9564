"""The one instrumented pass: every head measured at the query position, nothing big kept.

`collect_head_stats(model, batch)` runs the probe batch through a TransformerBridge once, in
chunks, with hooks that slice each activation at the query position inside the hook, so memory
holds one chunk's activations plus per-example results. The chunk size follows the device's free
memory (`probe_chunk_size`, from core/model/memory.py's estimate) unless the caller fixes it; each
example's results are independent of the chunking. Everything later statistics need comes
out of it as a `HeadStats`: the head outputs for the spectral signal (Step 1), the attention row
and its pattern summaries for the pattern screen (Step 2), the maximum attention for the Ising
co-activation signal, the router weights for MoE strata, and the clean metrics for ablation.

`head_stats(ref, checkpoint, probe)` is the one cached entry point: the CLI, the pipelines and the
pages all ask it, and it runs the pass only when the on-disk cache (core.store) has no entry for
(model, revision, weights, probe, HEADSTATS_VERSION, and the dtype when it is not float32).
core.bench.probe times the pass.

Precision: a model loaded in bfloat16 or float16 runs its forward pass in that dtype, but every
hook casts what it keeps to float32 before any sum or product (the pattern summaries, the clean
metrics' logsumexp), so HeadStats tensors are float32 whatever the model's dtype. The one
exception is attn_query above FLOAT32_ROW_LIMIT entries, stored in float16 to bound memory: the
pattern screen then reads its selectivity from the float32 summaries and uses the rows only for
the noise floor's null (core.pipelines.recipe.screen_checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from core.stats.metrics import query_metrics
from core.errors import HeadLabError
from core.model.hooks import (_bind, hook_name, mask_kwargs, model_context_length, model_device, model_dtype,
                              model_family, model_vocab_size, router_logit_hooks)
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.memory import ForwardShape, chunk_size_for, forward_bytes, lean_forward, memory_budget
from core.model.refs import Checkpoint, ModelRef, weights_fingerprint
from core.results import package_versions
from core.stats.selectivity import baseline_positions
from core.store import cache_key, canonical_json, check_writable, load_entry, save_entry
from core.tasks import PATTERNS, ProbeBatch, ProbeFile, ProbeSpec

# Bump when what the instrumented pass stores (or how) changes: old cache entries then miss.
# headstats-2: clean top-k counts tied logits as expected hits under random tie-breaking, and the
# clean loss is logsumexp - target logit (the ablation engine's one metric definition).
HEADSTATS_VERSION = "headstats-2"
HEADSTATS_KIND = "headstats"

# The baseline of the pattern screen (METHODS.md Step 2): mean attention to 50 random keys.
N_BASELINE = 50
BASELINE_SEED = 0

# The full attention row at the query position is kept when it is small: float32 up to
# FLOAT32_ROW_LIMIT elements (N * L * H * T), float16 up to FLOAT16_ROW_LIMIT, else summaries only.
FLOAT32_ROW_LIMIT = 2**24  # 64 MiB
FLOAT16_ROW_LIMIT = 2**27  # 256 MiB

_TENSOR_FIELDS = (
    "z_query", "attn_query", "attn_patterns", "attn_baseline", "attn_max", "router_query",
    "loss", "top1", "top5", "target_logit", "query_pos", "target", "induction_pos", "duplicate_pos",
)
_META_FIELDS = (
    "model", "revision", "tokens", "family", "probe_spec", "code_version",
    "n_layers", "n_heads", "d_head", "n_experts", "patterns", "versions", "dtype",
)


@dataclass(frozen=True, eq=False)
class HeadStats:
    """Per-head measurements of one checkpoint on one probe batch, plus where they came from.

    Tensors (CPU, float32 whatever the model's dtype, which `dtype` records):
      z_query        [example, layer, head, d_head] float32, head output (hook_z) at q
      attn_query     [example, layer, head, key] float32/float16 attention row at q, or None when too big
      attn_patterns  [pattern, example, layer, head] float32, attention to each PATTERNS target
      attn_baseline  [example, layer, head] float32, mean attention to the 50 baseline keys
      attn_max       [example, layer, head] float32, max attention over keys
      router_query   [example, layer, expert] float32 router softmax at q (MoE), else None
      loss, top1, top5, target_logit   [example] float32 clean metrics at q
      query_pos, target, induction_pos, duplicate_pos   [example] int64, copied from the batch
    """

    z_query: torch.Tensor
    attn_query: Optional[torch.Tensor]
    attn_patterns: torch.Tensor
    attn_baseline: torch.Tensor
    attn_max: torch.Tensor
    router_query: Optional[torch.Tensor]
    loss: torch.Tensor
    top1: torch.Tensor
    top5: torch.Tensor
    target_logit: torch.Tensor
    query_pos: torch.Tensor
    target: torch.Tensor
    induction_pos: torch.Tensor
    duplicate_pos: torch.Tensor
    # provenance
    model: str = ""
    revision: Optional[str] = None
    tokens: Optional[int] = None
    family: str = ""
    probe_spec: dict = field(default_factory=dict)
    code_version: str = ""
    n_layers: int = 0
    n_heads: int = 0
    d_head: int = 0
    n_experts: int = 0
    patterns: tuple = PATTERNS
    versions: dict = field(default_factory=dict)
    dtype: str = DEFAULT_DTYPE  # the model's precision in the pass (entries older than this field: float32)

    @property
    def n_examples(self) -> int:
        return int(self.z_query.shape[0])

    def pattern(self, name: str) -> torch.Tensor:
        """Attention to one pattern's target: [example, layer, head]."""
        if name not in self.patterns:
            raise HeadLabError(f"Unknown pattern {name!r}; use one of {', '.join(self.patterns)}.")
        return self.attn_patterns[self.patterns.index(name)]

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors for safetensors (absent ones left out), contiguous."""
        out = {}
        for name in _TENSOR_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.detach().cpu().contiguous()
        return out

    def to_json(self) -> dict:
        """Provenance and shapes as JSON-ready metadata (the tensors go through `to_tensors`).

        Written by hand, not JsonResult: this is the meta.json half of a cache entry, so it leaves
        the tensors out and adds their shapes; its keys are what stored entries hold.
        """
        meta = {name: getattr(self, name) for name in _META_FIELDS}
        meta["patterns"] = list(self.patterns)
        meta["shapes"] = {k: list(v.shape) for k, v in self.to_tensors().items()}
        meta["n_examples"] = self.n_examples
        return meta

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict) -> "HeadStats":
        """Rebuild from `to_tensors()` and `to_json()` output (e.g. a cache entry)."""
        missing = [n for n in _TENSOR_FIELDS if n not in tensors and n not in ("attn_query", "router_query")]
        if missing:
            raise HeadLabError(f"Stored head statistics lack {', '.join(missing)}; delete the cache entry and rerun.")
        kwargs: dict[str, Any] = {n: tensors.get(n) for n in _TENSOR_FIELDS}
        for name in _META_FIELDS:
            if name in meta:
                kwargs[name] = meta[name]
        kwargs["patterns"] = tuple(meta.get("patterns", PATTERNS))
        return cls(**kwargs)


# ---------------------------------------------------------------------------------------------
# does the probe fit the model


def check_probe_fits(probe: ProbeSpec | ProbeBatch, model_or_config: Any) -> None:
    """Refuse a probe the model cannot read: longer than its context, or tokens outside its vocabulary.

    probe: a spec (checked before any model is loaded) or a built batch (its actual token ids); a probe
    file passes here (its lengths are known once tokenized: probe_batch_for checks the batch).
    model_or_config: a loaded TransformerBridge, or the model's Hugging Face config (load_config).
    """
    if isinstance(probe, ProbeFile):
        return
    if hasattr(model_or_config, "original_model"):  # a loaded bridge
        context, vocab = model_context_length(model_or_config), model_vocab_size(model_or_config)
    else:
        config = model_or_config
        context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        vocab = int(config.vocab_size)
    if context and probe.seq_len > int(context):
        raise HeadLabError(
            f"The probe length {probe.seq_len} is longer than the model's context ({context} tokens); "
            f"use a probe length T of {context} or less."
        )
    probe.check_vocab(vocab)


def probe_batch_for(probe: ProbeSpec | ProbeFile, model: Any) -> ProbeBatch:
    """The batch `probe` gives on a loaded model, checked to fit it: a spec builds its own; a probe file's
    clean prompts are tokenized with the model's tokenizer (padded, with the attention mask)."""
    if isinstance(probe, ProbeFile):
        batch = probe.build_batch(model.tokenizer, model_context_length(model))
    else:
        batch = probe.build()
    check_probe_fits(batch, model)
    return batch


def pattern_batch_for(probe: ProbeSpec | ProbeFile, model: Any) -> ProbeBatch:
    """The batch of the instrumented pass (spectral signal, pattern screen) on a loaded model.

    A spec builds its own. A probe file gives its prompts whose query token occurs earlier in the prompt
    (so the induction and duplicate-token keys exist; the spec lists the lines left out), right-padded:
    the screen's key positions (first token, random baseline keys) count from each prompt's start.
    """
    if not isinstance(probe, ProbeFile):
        return probe_batch_for(probe, model)
    if probe.padding != "right":
        raise HeadLabError("the pattern screen reads key positions from each prompt's start; pad probe files on the "
                           "right (--padding right, the default) for probe, screen and recipe.")
    batch = probe_batch_for(probe, model)
    found = torch.tensor(batch.spec["pattern_found"], dtype=torch.bool)
    if not bool(found.any()):
        raise HeadLabError(f"no prompt of {probe.name} has its query token earlier in the prompt, so no example has "
                           "induction or duplicate-token keys; the pattern screen needs prompts with repeated tokens "
                           "(patching and ablation do not).")
    left_out = [record.line for record, ok in zip(probe.records, found.tolist()) if not ok]
    kept = batch.select(found)
    return replace(kept, spec={**batch.spec, "pattern_found": [True] * kept.n_examples, "left_out_lines": left_out})


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    for item in output:
        if isinstance(item, torch.Tensor):
            return item
    raise HeadLabError("The MoE router returned no tensor; this model family's router is not supported.")


# ---------------------------------------------------------------------------------------------
# the instrumented pass


def baseline_weights(query_pos: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Weights [example, key] averaging a row over each example's baseline keys (NaN row when q has none).

    The keys are core.stats.selectivity.baseline_positions(q): the reference RandomState(0) draw of 50.
    """
    weights = torch.zeros(query_pos.shape[0], seq_len, dtype=torch.float32)
    cache: dict[int, torch.Tensor] = {}
    for i, q in enumerate(query_pos.tolist()):
        if q not in cache:
            row = torch.zeros(seq_len, dtype=torch.float32)
            try:
                keys = torch.as_tensor(baseline_positions(int(q), n=N_BASELINE, seed=BASELINE_SEED), dtype=torch.long)
                row[keys] = 1.0 / keys.numel()
            except HeadLabError:  # q too small to leave any baseline key: no baseline for this example
                row[:] = float("nan")
            cache[q] = row
        weights[i] = cache[q]
    return weights


def summary_weights(batch: ProbeBatch) -> torch.Tensor:
    """Key weights [example, key, summary] so that row @ weights gives every summary in one product.

    Summaries: the PATTERNS in order (one-hot columns for single keys, 1/4 on q-5..q-2 for
    "local"), then the baseline (1/50 on each baseline key).
    """
    n, seq_len = batch.n_examples, batch.seq_len
    weights = torch.zeros(n, seq_len, len(PATTERNS) + 1, dtype=torch.float32)
    ar = torch.arange(n)
    for j, name in enumerate(PATTERNS):
        if name == "local":
            local = batch.local_positions()  # [example, 4]
            weights[ar[:, None], local, j] = 1.0 / local.shape[1]
        else:
            weights[ar, batch.pattern_positions(name), j] = 1.0
    weights[:, :, len(PATTERNS)] = baseline_weights(batch.query_pos, seq_len)
    return weights


def attn_row_dtype(n_examples: int, n_layers: int, n_heads: int, seq_len: int,
                   keep_rows: Optional[bool] = None) -> Optional[torch.dtype]:
    """float32 / float16 / None (summaries only) for the stored attention rows, by their size."""
    size = n_examples * n_layers * n_heads * seq_len
    if keep_rows is False:
        return None
    if size <= FLOAT32_ROW_LIMIT:
        return torch.float32
    if size <= FLOAT16_ROW_LIMIT or keep_rows:
        return torch.float16
    return None


def gather_query_rows(pattern: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """pattern [batch, head, q, key] -> attention row at each example's query [batch, head, key] float32."""
    ar = torch.arange(pattern.shape[0], device=pattern.device)
    return pattern[ar, :, q, :].float()


def pattern_summaries(rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [batch, head, key], weights [batch, key, summary] -> (summaries [batch, head, summary], max [batch, head])."""
    return torch.bmm(rows, weights), rows.amax(dim=-1)


def probe_example_bytes(model: Any, seq_len: int, row_dtype: Optional[torch.dtype] = torch.float32) -> tuple[int, int]:
    """(bytes one example adds to a chunk's forward, bytes its results keep for the whole run).

    The first: the forward (core.model.memory.forward_bytes; only the query row is unembedded when
    the model has the unembed hook) plus the hooks' float32 copies of one layer's query rows and the
    example's summary weights. The second: its HeadStats tensors (z_query, attention rows in
    `row_dtype` or none, pattern summaries, router weights, metrics) and its summary weights, on the CPU.
    """
    shape = ForwardShape.of_model(model)
    n_layers, n_heads, d_head = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    n_summaries = len(PATTERNS) + 1
    logit_rows = 1 if hook_name("unembed_in") in model.hook_dict else seq_len
    hooks = 4 * (2 * n_heads * seq_len + seq_len * n_summaries)  # rows [head, key] (+ a copy), weights [key, summary]
    row_bytes = 0 if row_dtype is None else torch.empty((), dtype=row_dtype).element_size()
    n_experts = int(getattr(model.cfg, "num_experts", None) or 0)
    stored = (4 * (n_layers * n_heads * (d_head + len(PATTERNS) + 2) + n_layers * n_experts + 4 + seq_len * n_summaries)
              + n_layers * n_heads * seq_len * row_bytes)
    return forward_bytes(shape, seq_len, logit_rows) + hooks, stored


def probe_chunk_size(model: Any, n: int, seq_len: int, row_dtype: Optional[torch.dtype] = torch.float32,
                     device: str | torch.device | None = None, available_bytes: Optional[int] = None) -> int:
    """Examples per chunk of the instrumented pass that fit in the device's memory (a power of two in [1, n]).

    Reserved for the whole run when the pass runs on the CPU (where the outputs live): the results
    of all n examples (probe_example_bytes). row_dtype: the stored attention rows' dtype
    (attn_row_dtype), None when they are not kept. Raises HeadLabError, saying what to change,
    when not even one example fits.
    """
    device = torch.device(model_device(model) if device is None else device)
    per_example, stored = probe_example_bytes(model, seq_len, row_dtype)
    reserved = n * stored if device.type == "cpu" else 0
    return chunk_size_for(per_example, n, memory_budget(device, available_bytes), "the instrumented pass", reserved)


def collect_head_stats(
    model,
    batch: ProbeBatch,
    chunk_size: Optional[int] = None,
    device: str | torch.device | None = None,
    progress: Optional[Callable[[int], Any]] = None,
    provenance: Optional[dict] = None,
    keep_attn_rows: Optional[bool] = None,
) -> HeadStats:
    """Run `batch` through `model` once (in chunks of `chunk_size` examples) and measure every head.

    chunk_size: examples per forward; None follows the free memory (probe_chunk_size).
    device: where the inputs go (default: the model's device).
    progress: called with the number of examples finished after each chunk (e.g. tqdm's update).
    provenance: model, revision, tokens (and optionally family) to record in the result.
    keep_attn_rows: None decides by size (see attn_row_dtype); True/False forces it.
    """
    if chunk_size is not None and int(chunk_size) < 1:
        raise HeadLabError("chunk_size must be at least 1; pass a positive number of examples per chunk, or None to follow memory.")
    check_probe_fits(batch, model)
    device = model_device(model) if device is None else device
    n, seq_len = batch.n_examples, batch.seq_len
    n_layers, n_heads, d_head = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    routers = router_logit_hooks(model)  # {layer: hook name of router logits [batch*pos, expert]}
    row_dtype = attn_row_dtype(n, n_layers, n_heads, seq_len, keep_attn_rows)
    chunk_size = int(chunk_size) if chunk_size is not None else probe_chunk_size(model, n, seq_len, row_dtype, device)

    # Per-example constants, built once on CPU then sliced per chunk.
    weights = summary_weights(batch)  # [example, key, pattern + baseline]

    # Outputs, filled chunk by chunk (CPU).
    z_query = torch.empty(n, n_layers, n_heads, d_head, dtype=torch.float32)
    attn_query = torch.empty(n, n_layers, n_heads, seq_len, dtype=row_dtype) if row_dtype else None
    attn_patterns = torch.empty(len(PATTERNS), n, n_layers, n_heads, dtype=torch.float32)
    attn_baseline = torch.empty(n, n_layers, n_heads, dtype=torch.float32)
    attn_max = torch.empty(n, n_layers, n_heads, dtype=torch.float32)
    metrics = {k: torch.empty(n, dtype=torch.float32) for k in ("loss", "top1", "top5", "target_logit")}
    router_query = None  # [example, layer, expert], allocated on first router call

    state: dict[str, Any] = {}  # the current chunk: slice, size, query positions, summary weights

    def z_hook(z, hook, layer):  # z: [batch, pos, head, d_head]
        ar = torch.arange(z.shape[0], device=z.device)
        z_query[state["sl"], layer] = z[ar, state["q"]].float().cpu()

    def pattern_hook(pattern, hook, layer):  # pattern: [batch, head, q, key]
        rows = gather_query_rows(pattern, state["q"])  # [batch, head, key]
        summ, mx = pattern_summaries(rows, state["weights"])  # [batch, head, summary], [batch, head]
        summ = summ.cpu()
        sl = state["sl"]
        attn_patterns[:, sl, layer] = summ[..., : len(PATTERNS)].permute(2, 0, 1)
        attn_baseline[sl, layer] = summ[..., len(PATTERNS)]
        attn_max[sl, layer] = mx.cpu()
        if attn_query is not None:
            attn_query[sl, layer] = rows.to(row_dtype).cpu()

    def unembed_hook(resid, hook):  # resid: [batch, pos, d_model] -> only the query rows [batch, 1, d_model]
        ar = torch.arange(resid.shape[0], device=resid.device)
        return resid[ar, state["q"]][:, None, :]

    def router_hook(output, hook, layer):
        nonlocal router_query
        logits = _first_tensor(output).float()  # [batch*pos, expert] (row-major) or [batch, pos, expert]
        logits = logits.reshape(state["b"], seq_len, -1)
        ar = torch.arange(state["b"], device=logits.device)
        probs = torch.softmax(logits[ar, state["q"]], dim=-1)  # [batch, expert]
        if router_query is None:
            router_query = torch.empty(n, n_layers, probs.shape[-1], dtype=torch.float32)
        router_query[state["sl"], layer] = probs.cpu()

    fwd_hooks = []
    for layer in range(n_layers):
        fwd_hooks.append((hook_name("z", layer), _bind(z_hook, layer)))
        fwd_hooks.append((hook_name("pattern", layer), _bind(pattern_hook, layer)))
    for layer, name in routers.items():
        fwd_hooks.append((name, _bind(router_hook, layer)))
    if hook_name("unembed_in") in model.hook_dict:  # unembed only the query rows; else slice the logits below
        fwd_hooks.append((hook_name("unembed_in"), unembed_hook))
    with torch.inference_mode(), lean_forward(model), model.hooks(fwd_hooks=fwd_hooks):
        for start in range(0, n, chunk_size):
            sl = slice(start, min(n, start + chunk_size))
            q = batch.query_pos[sl].to(device)
            state.update(sl=sl, q=q, b=sl.stop - sl.start, weights=weights[sl].to(device))
            mask = mask_kwargs(None if batch.attention_mask is None else batch.attention_mask[sl].to(device))
            logits = model(batch.tokens[sl].to(device), **mask)  # [batch, 1, vocab] thanks to unembed_hook
            if logits.shape[1] != 1:  # an architecture whose unembedding ignored the slice
                ar = torch.arange(logits.shape[0], device=logits.device)
                logits = logits[ar, q][:, None]
            for key, value in query_metrics(logits[:, 0], batch.target[sl].to(device)).items():
                metrics[key][sl] = value.cpu()
            if progress is not None:
                progress(sl.stop - sl.start)

    prov = dict(provenance or {})
    return HeadStats(
        z_query=z_query, attn_query=attn_query, attn_patterns=attn_patterns, attn_baseline=attn_baseline,
        attn_max=attn_max, router_query=router_query, **metrics,
        query_pos=batch.query_pos.clone(), target=batch.target.clone(),
        induction_pos=batch.induction_pos.clone(), duplicate_pos=batch.duplicate_pos.clone(),
        model=str(prov.get("model", "")), revision=prov.get("revision"), tokens=prov.get("tokens"),
        family=str(prov.get("family") or model_family(model)), probe_spec=dict(batch.spec),
        code_version=HEADSTATS_VERSION, n_layers=n_layers, n_heads=n_heads, d_head=d_head,
        n_experts=0 if router_query is None else int(router_query.shape[-1]), patterns=tuple(PATTERNS),
        versions=package_versions(), dtype=dtype_name(model_dtype(model)),
    )


# ---------------------------------------------------------------------------------------------
# the cached entry point


def head_stats_key(ref: ModelRef | str, revision: Optional[str], probe_spec: dict,
                   dtype: str | torch.dtype = DEFAULT_DTYPE) -> str:
    """The cache key of one checkpoint's HeadStats; probe_spec is the batch's `spec` (with its provenance).

    dtype: the model's precision in the pass. A half-precision pass is another entry; float32 keys
    carry no dtype at all, so they stay those of entries written before the dtype existed.
    """
    model_id = ref.to_json() if isinstance(ref, ModelRef) else str(ref)
    extra = {"weights": weights_fingerprint(ref, revision)}
    if dtype_name(dtype) != DEFAULT_DTYPE:
        extra["dtype"] = dtype_name(dtype)
    return cache_key(HEADSTATS_KIND, canonical_json(model_id), revision, probe_spec, HEADSTATS_VERSION, extra)


def head_stats(ref: ModelRef, checkpoint: Checkpoint, probe: ProbeSpec | ProbeBatch, model: Any = None,
               device: str | torch.device = "cpu", chunk_size: Optional[int] = None,
               progress: Optional[Callable[[int], Any]] = None,
               on_status: Optional[Callable[[str], None]] = None,
               dtype: str | torch.dtype = DEFAULT_DTYPE) -> HeadStats:
    """One checkpoint's HeadStats: from the cache, else one instrumented pass (then cached).

    probe: a spec, or the batch already built from one (a loop over checkpoints builds it once).
    model: the loaded checkpoint, if the caller has it; else it is loaded (on `device`, in `dtype`)
    only on a cache miss. A given model's own dtype is the one the key records.
    chunk_size: examples per forward, None to follow memory; not part of the key (results do not depend on it).
    progress: called with examples done, during a pass; on_status: called with "cached" or "computed".
    """
    batch = probe if isinstance(probe, ProbeBatch) else probe.build()
    dtype = dtype_name(model_dtype(model) if model is not None else dtype)
    key = head_stats_key(ref, checkpoint.revision, dict(batch.spec), dtype)
    hit = load_entry(key)
    if hit is not None:
        if on_status:
            on_status("cached")
        return HeadStats.from_tensors(*hit)
    check_writable(key)  # a read-only cache is refused before the pass, not after it
    loaded = model if model is not None else load_model(ref, checkpoint.revision, device=device, dtype=dtype)
    provenance = {"model": ref.name, "revision": checkpoint.revision, "tokens": checkpoint.tokens}
    stats = collect_head_stats(loaded, batch, chunk_size=chunk_size, progress=progress, provenance=provenance)
    save_entry(key, stats.to_tensors(), stats.to_json())
    if on_status:
        on_status("computed")
    return stats


def full_attention_pattern(model: Any, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """Every head's full attention pattern at `layer` on a few examples: [example, head, query, key] float32 (CPU).

    The instrumented pass keeps only the query row; the head inspector draws whole patterns for the
    handful of examples a user picks, so this runs one forward with one hook. tokens: [example, pos].
    """
    name = hook_name("pattern", layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens.to(model_device(model)), names_filter=lambda n: n == name)
    return cache[name].float().cpu()
