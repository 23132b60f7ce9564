"""The probe benchmark: the instrumented pass timed against a bare forward and three reference passes.

The reference analysis scripts run three separate hooked forwards (head outputs, pattern summaries,
max attention); `core.probe.collect_head_stats` does all three in one. The reference-style passes
here reproduce that habit so `bench_probe` can time it, and the tests check that they agree with
the one pass.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

import torch

from core.model.hooks import _bind, hook_name, model_dtype
from core.model.loading import DEFAULT_DTYPE, dtype_name, load_model
from core.model.memory import lean_forward
from core.model.refs import ModelRef
from core.probe import collect_head_stats, gather_query_rows, pattern_summaries, summary_weights
from core.tasks import PATTERNS


def _chunked(batch, chunk_size: int, device):
    for start in range(0, batch.n_examples, int(chunk_size)):
        sl = slice(start, min(batch.n_examples, start + int(chunk_size)))
        yield sl, batch.tokens[sl].to(device), batch.query_pos[sl].to(device)


def bare_pass(model, batch, chunk_size: int = 64, device="cpu") -> None:
    """A forward over the batch with no statistics (the cost floor) doing what the instrumented pass must do and no
    more: as lean (no KV cache, no kept patterns), and unembedding only each row's query position, as
    collect_head_stats does (full-vocabulary logits at every position were most of a real model's bare forward)."""
    state = {}

    def query_row(resid, hook):  # [batch, pos, d_model] -> [batch, 1, d_model]
        return resid[torch.arange(resid.shape[0], device=resid.device), state["q"]][:, None, :]

    hooks = [(hook_name("unembed_in"), query_row)] if hook_name("unembed_in") in model.hook_dict else []
    with torch.inference_mode(), lean_forward(model), model.hooks(fwd_hooks=hooks):
        for _, tokens, q in _chunked(batch, chunk_size, device):
            state["q"] = q
            model(tokens)


def reference_pr_pass(model, batch, chunk_size: int = 64, device="cpu") -> torch.Tensor:
    """Reference style, pass 1 of 3: a full forward carrying only hook_z hooks -> z at q [example, layer, head, d_head]."""
    n_layers = int(model.cfg.n_layers)
    out = torch.empty(batch.n_examples, n_layers, int(model.cfg.n_heads), int(model.cfg.d_head))
    state = {}

    def hook(z, hook, layer):
        ar = torch.arange(z.shape[0], device=z.device)
        out[state["sl"], layer] = z[ar, state["q"]].float().cpu()

    hooks = [(hook_name("z", l), _bind(hook, l)) for l in range(n_layers)]
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
        rows = gather_query_rows(pattern, state["q"])
        summ = pattern_summaries(rows, weights[sl].to(rows.device))[0].cpu()
        pats[:, sl, layer], base[sl, layer] = summ[..., : len(PATTERNS)].permute(2, 0, 1), summ[..., len(PATTERNS)]

    hooks = [(hook_name("pattern", l), _bind(hook, l)) for l in range(n_layers)]
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
        out[state["sl"], layer] = gather_query_rows(pattern, state["q"]).amax(-1).cpu()

    hooks = [(hook_name("pattern", l), _bind(hook, l)) for l in range(n_layers)]
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



def median_times(runs: dict[str, Callable[[], Any]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median wall seconds of each run, interleaved over `repeats` rounds after one warm-up round."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(max(1, int(repeats))):
        for key, fn in runs.items():
            start = time.perf_counter()
            fn()
            if device.type == "cuda":  # a bare forward returns before the GPU is done
                torch.cuda.synchronize(device)
            times[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}

def bench_probe(model, batch, repeats: int = 5, chunk_size: int = 64, device="cpu", with_three_pass: bool = True) -> dict:
    """Median wall time of bare, instrumented and three-pass runs over the same batch, and their ratios.

    The runs are interleaved (bare, instrumented, three-pass, repeat) after one warm-up of each, so
    drifts in machine load hit all three alike. `with_three_pass=False` leaves the reference-style
    passes out (at real model shapes they cost three more passes and only the overhead is asked).
    """
    runs = {
        "bare_s": lambda: bare_pass(model, batch, chunk_size, device),
        "instrumented_s": lambda: collect_head_stats(model, batch, chunk_size, device),
    }
    if with_three_pass:
        runs["three_pass_s"] = lambda: three_pass(model, batch, chunk_size, device)
    med = median_times(runs, repeats, torch.device(device))
    return {
        **med,
        "overhead_ratio": med["instrumented_s"] / med["bare_s"],
        "speedup_vs_three_pass": med["three_pass_s"] / med["instrumented_s"] if with_three_pass else None,
        "n_examples": batch.n_examples,
        "seq_len": batch.seq_len,
        "chunk_size": int(chunk_size),
        "repeats": int(repeats),
        "n_layers": int(model.cfg.n_layers),
        "n_heads": int(model.cfg.n_heads),
        "d_model": int(model.cfg.d_model),
        "device": str(device),
        "dtype": dtype_name(model_dtype(model)),
    }


def load_bench_model(text: str, revision: Optional[str] = None, device: str = "cpu", dtype: str = DEFAULT_DTYPE):
    """A zoo name / local folder / hub name, loaded as HeadLab loads every model."""
    return load_model(ModelRef.parse(text), revision, device=device, dtype=dtype)
