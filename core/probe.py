"""The one instrumented pass: every head measured at the query position, nothing big kept.

`collect_head_stats(model, batch)` runs the probe batch through a TransformerBridge once, in
chunks, with hooks that slice each activation at the query position inside the hook, so memory
holds one chunk's activations plus per-example results. Everything later statistics need comes
out of it as a `HeadStats`: the head outputs for the spectral signal (Step 1), the attention row
and its pattern summaries for the pattern screen (Step 2), the maximum attention for the Ising
co-activation signal, the router weights for MoE strata, and the clean metrics for ablation.

`bench_probe` times this pass against a bare forward and against the reference scripts' habit of
three separate hooked passes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from core.errors import HeadLabError
from core.tasks.probe_batch import PATTERNS

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
    "n_layers", "n_heads", "d_head", "n_experts", "patterns", "versions",
)


@dataclass(frozen=True, eq=False)
class HeadStats:
    """Per-head measurements of one checkpoint on one probe batch, plus where they came from.

    Tensors (CPU):
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
        """Provenance and shapes as JSON-ready metadata (the tensors go through `to_tensors`)."""
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
# model introspection


def model_family(model) -> str:
    """The Hugging Face model_type (e.g. "gpt_neox", "olmoe")."""
    from core.model.loading import family_of

    return family_of(getattr(model.original_model, "config", None))


def model_context_length(model) -> Optional[int]:
    """Longest sequence the model accepts (max_position_embeddings / n_ctx), None when unknown."""
    config = getattr(model.original_model, "config", None)
    for value in (getattr(config, "max_position_embeddings", None), getattr(model.cfg, "n_ctx", None)):
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_vocab_size(model) -> int:
    config = getattr(model.original_model, "config", None)
    return int(getattr(config, "vocab_size", None) or model.cfg.d_vocab)


def check_probe_fits(model, batch) -> None:
    """Refuse a probe the model cannot read: too long for its context, or tokens beyond its vocabulary."""
    context = model_context_length(model)
    if context is not None and batch.seq_len > context:
        raise HeadLabError(
            f"The probe length {batch.seq_len} is longer than the model's context ({context} tokens); "
            f"use --seq-len {context} or less."
        )
    vocab = model_vocab_size(model)
    top = int(batch.tokens.max())
    if top >= vocab or int(batch.tokens.min()) < 0 or int(batch.target.max()) >= vocab:
        raise HeadLabError(
            f"The probe uses token ids up to {max(top, int(batch.target.max()))}, a task the model's vocabulary "
            f"({vocab} tokens) cannot hold; choose a task or token range inside the vocabulary."
        )


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

    The keys are core.selectivity.baseline_positions(q): the reference RandomState(0) draw of 50.
    """
    from core.stats.selectivity import baseline_positions

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


def summary_weights(batch) -> torch.Tensor:
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


def _gather_rows(pattern: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """pattern [batch, head, q, key] -> attention row at each example's query [batch, head, key] float32."""
    ar = torch.arange(pattern.shape[0], device=pattern.device)
    return pattern[ar, :, q, :].float()


def _pattern_summaries(rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [batch, head, key], weights [batch, key, summary] -> (summaries [batch, head, summary], max [batch, head])."""
    return torch.bmm(rows, weights), rows.amax(dim=-1)


def _clean_metrics(logits_q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """logits_q [batch, vocab] -> loss, top1, top5, target_logit, each [batch] float32."""
    logits_q = logits_q.float()
    logp = torch.log_softmax(logits_q, dim=-1)
    tgt = target[:, None]
    k = min(5, logits_q.shape[-1])
    return {
        "loss": -logp.gather(1, tgt)[:, 0],
        "top1": (logits_q.argmax(dim=-1) == target).float(),
        "top5": (logits_q.topk(k, dim=-1).indices == tgt).any(dim=-1).float(),
        "target_logit": logits_q.gather(1, tgt)[:, 0],
    }


def collect_head_stats(
    model,
    batch,
    chunk_size: int = 64,
    device: str | torch.device = "cpu",
    progress: Optional[Callable[[int], Any]] = None,
    provenance: Optional[dict] = None,
    keep_attn_rows: Optional[bool] = None,
) -> HeadStats:
    """Run `batch` through `model` once (in chunks of `chunk_size` examples) and measure every head.

    progress: called with the number of examples finished after each chunk (e.g. tqdm's update).
    provenance: model, revision, tokens (and optionally family) to record in the result.
    keep_attn_rows: None decides by size (see attn_row_dtype); True/False forces it.
    """
    from core.model.loading import router_logit_hooks
    from core.store import CODE_VERSION

    if int(chunk_size) < 1:
        raise HeadLabError("chunk_size must be at least 1; pass a positive number of examples per chunk.")
    check_probe_fits(model, batch)
    n, seq_len = batch.n_examples, batch.seq_len
    n_layers, n_heads, d_head = int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)
    routers = router_logit_hooks(model)  # {layer: hook name of router logits [batch*pos, expert]}
    row_dtype = attn_row_dtype(n, n_layers, n_heads, seq_len, keep_attn_rows)

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
        rows = _gather_rows(pattern, state["q"])  # [batch, head, key]
        summ, mx = _pattern_summaries(rows, state["weights"])  # [batch, head, summary], [batch, head]
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
        fwd_hooks.append((f"blocks.{layer}.attn.hook_z", _bind(z_hook, layer)))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_pattern", _bind(pattern_hook, layer)))
    for layer, name in routers.items():
        fwd_hooks.append((name, _bind(router_hook, layer)))
    if "unembed.hook_in" in model.hook_dict:  # unembed only the query rows; else slice the logits below
        fwd_hooks.append(("unembed.hook_in", unembed_hook))
    with torch.inference_mode(), model.hooks(fwd_hooks=fwd_hooks):
        for start in range(0, n, int(chunk_size)):
            sl = slice(start, min(n, start + int(chunk_size)))
            q = batch.query_pos[sl].to(device)
            state.update(sl=sl, q=q, b=sl.stop - sl.start, weights=weights[sl].to(device))
            logits = model(batch.tokens[sl].to(device))  # [batch, 1, vocab] thanks to unembed_hook
            if logits.shape[1] != 1:  # an architecture whose unembedding ignored the slice
                ar = torch.arange(logits.shape[0], device=logits.device)
                logits = logits[ar, q][:, None]
            for key, value in _clean_metrics(logits[:, 0], batch.target[sl].to(device)).items():
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
        code_version=CODE_VERSION, n_layers=n_layers, n_heads=n_heads, d_head=d_head,
        n_experts=0 if router_query is None else int(router_query.shape[-1]), patterns=tuple(PATTERNS),
        versions=package_versions(),
    )


def _bind(fn, layer):
    """A TransformerLens hook fn(tensor, hook) that calls fn(tensor, hook, layer)."""
    def hook(tensor, hook):
        return fn(tensor, hook, layer)
    return hook


def package_versions() -> dict:
    """Versions that can change the numbers, for provenance."""
    import transformer_lens
    import transformers

    import core

    return {
        "headlab": core.__version__, "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformer_lens": getattr(transformer_lens, "__version__", "unknown"),
    }


# ---------------------------------------------------------------------------------------------
# reference-style passes and the benchmark


def _chunked(batch, chunk_size: int, device):
    for start in range(0, batch.n_examples, int(chunk_size)):
        sl = slice(start, min(batch.n_examples, start + int(chunk_size)))
        yield sl, batch.tokens[sl].to(device), batch.query_pos[sl].to(device)


def bare_pass(model, batch, chunk_size: int = 64, device="cpu") -> None:
    """A forward over the batch with no hooks (the cost floor)."""
    with torch.inference_mode():
        for _, tokens, _ in _chunked(batch, chunk_size, device):
            model(tokens)


def reference_pr_pass(model, batch, chunk_size: int = 64, device="cpu") -> torch.Tensor:
    """Reference style, pass 1 of 3: a full forward carrying only hook_z hooks -> z at q [example, layer, head, d_head]."""
    n_layers = int(model.cfg.n_layers)
    out = torch.empty(batch.n_examples, n_layers, int(model.cfg.n_heads), int(model.cfg.d_head))
    state = {}

    def hook(z, hook, layer):
        ar = torch.arange(z.shape[0], device=z.device)
        out[state["sl"], layer] = z[ar, state["q"]].float().cpu()

    hooks = [(f"blocks.{l}.attn.hook_z", _bind(hook, l)) for l in range(n_layers)]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        for sl, tokens, q in _chunked(batch, chunk_size, device):
            state.update(sl=sl, q=q)
            model(tokens)
    return out


def reference_pattern_pass(model, batch, chunk_size: int = 64, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference style, pass 2 of 3: pattern summaries -> ([pattern, example, layer, head], baseline [example, layer, head])."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    pats = torch.empty(len(PATTERNS), batch.n_examples, n_layers, n_heads)
    base = torch.empty(batch.n_examples, n_layers, n_heads)
    weights = summary_weights(batch)
    state = {}

    def hook(pattern, hook, layer):
        sl = state["sl"]
        rows = _gather_rows(pattern, state["q"])
        summ = _pattern_summaries(rows, weights[sl].to(rows.device))[0].cpu()
        pats[:, sl, layer], base[sl, layer] = summ[..., : len(PATTERNS)].permute(2, 0, 1), summ[..., len(PATTERNS)]

    hooks = [(f"blocks.{l}.attn.hook_pattern", _bind(hook, l)) for l in range(n_layers)]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        for sl, tokens, q in _chunked(batch, chunk_size, device):
            state.update(sl=sl, q=q)
            model(tokens)
    return pats, base


def reference_max_pass(model, batch, chunk_size: int = 64, device="cpu") -> torch.Tensor:
    """Reference style, pass 3 of 3: the co-activation signal, max attention at q -> [example, layer, head]."""
    n_layers = int(model.cfg.n_layers)
    out = torch.empty(batch.n_examples, n_layers, int(model.cfg.n_heads))
    state = {}

    def hook(pattern, hook, layer):
        out[state["sl"], layer] = _gather_rows(pattern, state["q"]).amax(-1).cpu()

    hooks = [(f"blocks.{l}.attn.hook_pattern", _bind(hook, l)) for l in range(n_layers)]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        for sl, tokens, q in _chunked(batch, chunk_size, device):
            state.update(sl=sl, q=q)
            model(tokens)
    return out


def three_pass(model, batch, chunk_size: int = 64, device="cpu") -> None:
    """The reference scripts' way: three full forwards, each with only its own hooks."""
    reference_pr_pass(model, batch, chunk_size, device)
    reference_pattern_pass(model, batch, chunk_size, device)
    reference_max_pass(model, batch, chunk_size, device)


def bench_probe(model, batch, repeats: int = 5, chunk_size: int = 64, device="cpu") -> dict:
    """Median wall time of bare, instrumented and three-pass runs over the same batch, and their ratios.

    The runs are interleaved (bare, instrumented, three-pass, repeat) after one warm-up of each, so
    drifts in machine load hit all three alike.
    """
    runs = {
        "bare_s": lambda: bare_pass(model, batch, chunk_size, device),
        "instrumented_s": lambda: collect_head_stats(model, batch, chunk_size, device),
        "three_pass_s": lambda: three_pass(model, batch, chunk_size, device),
    }
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(max(1, int(repeats))):
        for key, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        **med,
        "overhead_ratio": med["instrumented_s"] / med["bare_s"],
        "speedup_vs_three_pass": med["three_pass_s"] / med["instrumented_s"],
        "n_examples": batch.n_examples,
        "seq_len": batch.seq_len,
        "chunk_size": int(chunk_size),
        "repeats": int(repeats),
        "n_layers": int(model.cfg.n_layers),
        "n_heads": int(model.cfg.n_heads),
        "d_model": int(model.cfg.d_model),
    }


def add_bench_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox",
                        help="zoo name, local Hugging Face folder or hub name (default: the quick zoo induction model)")
    parser.add_argument("--revision", default=None, help="checkpoint revision (default: the final one)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; medians are reported (default 5)")
    parser.add_argument("--chunk-size", type=int, default=64, help="examples per forward (default 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on shared CPUs more threads make the ratios noisy)")
    parser.add_argument("--device", default="cpu")


def load_bench_model(text: str, revision: Optional[str] = None, device: str = "cpu"):
    """A zoo name / folder / hub name through core.model.loading; a bare HF folder directly when models is missing."""
    try:
        from core.model.loading import ModelRef, load_model
    except ModuleNotFoundError:
        from pathlib import Path

        from transformer_lens.model_bridge import TransformerBridge
        from transformers import AutoModelForCausalLM

        if not Path(text).is_dir():
            raise HeadLabError(f"Model {text!r} is not a folder and core.model.loading is not available; pass a Hugging Face folder.")
        hf = AutoModelForCausalLM.from_pretrained(text, attn_implementation="eager")
        return TransformerBridge.boot_transformers(text, hf_model=hf).to(device)
    return load_model(ModelRef.parse(text), revision, device=device)


def cli_bench_probe(args: argparse.Namespace) -> dict:
    """`python -m core bench probe`: print the timing table and return it (the CLI writes --json)."""
    from core.tasks import InductionProbeSpec, make_induction_probe

    torch.set_num_threads(int(args.threads))
    model = load_bench_model(args.model, args.revision, args.device)
    vocab = model_vocab_size(model)
    spec = InductionProbeSpec(n_examples=args.n, seq_len=args.seq_len, token_low=0,
                              token_high=min(256, vocab), seed=42)
    batch = make_induction_probe(spec)
    result = bench_probe(model, batch, repeats=args.repeats, chunk_size=args.chunk_size, device=args.device)
    result["model"] = str(args.model)
    print(f"probe N={result['n_examples']} T={result['seq_len']} chunk={result['chunk_size']} "
          f"model {args.model} ({result['n_layers']} layers x {result['n_heads']} heads, d_model {result['d_model']}); "
          f"medians of {result['repeats']}")
    print(f"  {'bare forward':<28}{result['bare_s']:9.4f} s")
    print(f"  {'instrumented (one pass)':<28}{result['instrumented_s']:9.4f} s   "
          f"{result['overhead_ratio']:.2f}x bare (target <= 1.5x)")
    print(f"  {'three reference passes':<28}{result['three_pass_s']:9.4f} s   "
          f"instrumented is {result['speedup_vs_three_pass']:.2f}x faster (target >= 2x)")
    return result
