"""The clean forward an ablation study starts from: what it records, and keeping it between studies.

The engine (engine.py) reruns only the blocks from each condition's lowest ablated layer; `Recorder`
takes, during the clean forward, what those blocks receive (the residual entering them, their call's
arguments) and a parallel-residual block's clean z. `CleanRuns` keeps one such record for the next
study on the same model and probe batch: the lab's every click, and every call to a Ray ablation
worker, starts from the same clean forward. Given a disk key (`clean_run_key`, built like the probe
cache's: model, revision, probe spec, weights fingerprint, dtype), a kept run is also written to
core's disk cache (core/store.py) and read back by the next process or server that asks for it.
"""

from __future__ import annotations

import time
import weakref
from types import SimpleNamespace
from typing import Any, Iterable

import torch
from transformer_lens.model_bridge.generalized_components import ParallelBlockBridge

from core.errors import HeadLabError
from core.model.hooks import hook_name, model_device
from core.model.loading import DEFAULT_DTYPE, dtype_name
from core.model.memory import ForwardShape
from core.model.refs import ModelRef, weights_fingerprint
from core.store import cache_key, canonical_json, load_entry, save_entry

CLEAN_RUN_KIND = "clean-run"
CLEAN_RUN_VERSION = "1"  # bump when what Recorder keeps (or how it is written) changes

def block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def one_row_if_uniform(value: Any) -> Any:
    """A batch-shaped tensor whose rows are all equal (a causal mask without padding) as one broadcasting
    row [1, ...]; tuples and lists element by element; anything else as it is. Done once when a block's
    call is recorded, so the conditions replaying it do not compare the rows again."""
    if isinstance(value, (tuple, list)):
        return type(value)(one_row_if_uniform(v) for v in value)
    if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[0] > 1 and bool((value == value[:1]).all()):
        return value[:1]
    return value


def clean_block_kwargs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block's recorded call arguments without the residual and without any KV cache."""
    rest = tuple(args[1:])
    clean = {}
    for key, value in kwargs.items():
        if key == "hidden_states":
            continue
        if key in ("use_cache", "output_attentions"):
            value = False
        elif type(value).__name__.endswith("Cache") or key in ("layer_past", "past_key_value", "past_key_values"):
            value = None
        clean[key] = value
    return rest, clean


class Recorder:
    """Records, in the clean forward, what every block from `first` on receives; the final residual;
    and the clean hook_z of the `z_layers` (for the parallel-residual shortcut)."""

    def __init__(self, model: Any, first: int, keep: Iterable[int] = (), z_layers: Iterable[int] = (), lo: int = 0):
        self.model = model
        self.n_layers = len(model.blocks)
        self.lo = lo  # the probe index of the first example it records (what resample/token-wise replacements read)
        self.first = first
        self.keep = set(keep)  # layers whose input residual is kept (the conditions' start layers)
        self.z_layers = sorted(set(z_layers))
        self.inputs: dict[int, torch.Tensor] = {}
        self.calls: dict[int, tuple[tuple, dict]] = {}
        self.z: dict[int, torch.Tensor] = {}  # layer -> clean z [row, pos, head, d_head]
        self.final: torch.Tensor | None = None
        self.handles = []
        self.z_hooks = None

    def __enter__(self) -> "Recorder":
        for layer, block in enumerate(self.model.blocks):
            if layer >= self.first:
                self.handles.append(block.register_forward_pre_hook(self._pre(layer), with_kwargs=True))
        self.handles.append(self.model.ln_final.register_forward_pre_hook(self._final, with_kwargs=True))
        self.z_hooks = self.model.hooks(fwd_hooks=[(hook_name("z", layer), self._keep_z(layer)) for layer in self.z_layers])
        self.z_hooks.__enter__()
        return self

    def resid_before(self, layer: int) -> torch.Tensor:
        """The clean residual entering block `layer` (the final norm's input when layer == L)."""
        return self.final if layer >= self.n_layers else self.inputs[layer]

    def _keep_z(self, layer: int):
        def hook(z, hook=None):
            self.z[layer] = z.detach()
            return z

        return hook

    def _pre(self, layer: int):
        def hook(module, args, kwargs):
            if layer in self.keep:
                self.inputs[layer] = block_input(args, kwargs).detach()
            rest, call = clean_block_kwargs(args, kwargs)
            self.calls[layer] = one_row_if_uniform(rest), {key: one_row_if_uniform(v) for key, v in call.items()}

        return hook

    def _final(self, module, args, kwargs):
        self.final = block_input(args, kwargs).detach()

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.z_hooks.__exit__(*exc)
        self.model, self.handles, self.z_hooks = None, [], None  # the record keeps tensors, not the model (CleanRuns)


def fit_batch(value: Any, rows: int, index: torch.Tensor | None, repeat: int) -> Any:
    """Adapt a recorded tensor argument with batch dim `rows` to `index` rows repeated `repeat` times.

    One-row tensors broadcast as they are (the recorder made those with equal rows one row: one_row_if_uniform).
    """
    if isinstance(value, tuple):
        return tuple(fit_batch(v, rows, index, repeat) for v in value)
    if isinstance(value, list):
        return [fit_batch(v, rows, index, repeat) for v in value]
    # batch-shaped arguments (masks, position ids) are at least 2-D; 1-D ones (cache_position) are per position
    if not isinstance(value, torch.Tensor) or value.ndim < 2 or value.shape[0] != rows or rows == 1:
        return value
    picked = value if index is None else value[index]
    return picked if repeat == 1 else picked.repeat(repeat, *([1] * (picked.ndim - 1)))


def replay_block(model: Any, recorder: Recorder, layer: int, resid: torch.Tensor, rows: int | None = None,
                 index: torch.Tensor | None = None, repeat: int = 1) -> torch.Tensor:
    """Block `layer` run on resid [row, pos, d_model] with the call arguments the recorded forward gave it (attention
    mask, rotary embeddings, ...): its output residual. With `rows` (the recorded batch's), the batch-shaped
    arguments are first fitted to `index` rows repeated `repeat` times (fit_batch); without, resid has the recorded
    rows or rows they broadcast to."""
    args, kwargs = recorder.calls[layer]
    if rows is not None:
        args = fit_batch(args, rows, index, repeat)
        kwargs = {key: fit_batch(value, rows, index, repeat) for key, value in kwargs.items()}
    out = model.blocks[layer](resid, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


CLEAN_RUN_BYTES = 512 * 2**20  # the most a kept clean run may hold (residuals and z of every layer)


class CleanRuns:
    """The clean run of one probe batch, kept for the next study on the same model and batch.

    Why: the lab's every click on a checkpoint, and every call to a Ray ablation worker, starts from
    the same clean forward; on the quick zoo it is a third of a live study. A kept run records every
    layer (its input residual, its block call, a parallel-residual block's clean z), so it serves any
    conditions. It is kept only when the whole probe fits one example batch and the record fits
    CLEAN_RUN_BYTES; otherwise each study records its own, as without it. The held record is never
    changed after it is made (a new one replaces it), so studies on several threads may share one.
    """

    def __init__(self, disk_key: str | None = None):
        # (weak reference to the model, tokens, query_pos, attention_mask, recorder, clean query logits);
        # weak, so a cache that drops the model frees it
        self._held: tuple | None = None
        self.disk_key = disk_key  # clean_run_key(...) of the one model and probe this keeper serves, or None
        self.source = ""  # where the held run came from: "" (none), "recorded" or "disk"

    def find(self, model: Any, batch: Any) -> tuple[Recorder, torch.Tensor] | None:
        """(recorder, clean logits at the query [row, vocab]) kept for this model and batch, else None
        (looked up on disk when this keeper has a disk key and holds nothing for them)."""
        held = self._held
        if held is None or held[0]() is not model or not _same_batch(batch, held[1:4]):
            loaded = None if self.disk_key is None else load_clean_run(self.disk_key, batch, model)
            if loaded is None:
                return None
            self._hold(model, batch, *loaded)
            self.source = "disk"
            held = self._held
        return held[4], held[5]

    def hold(self, model: Any, batch: Any, recorder: Recorder, clean_q: torch.Tensor) -> None:
        """Keep this run (and write it to disk when this keeper has a disk key; a cache that cannot be
        written keeps it in memory only)."""
        self._hold(model, batch, recorder, clean_q)
        self.source = "recorded"
        if self.disk_key is not None:
            try:
                save_clean_run(self.disk_key, batch, recorder, clean_q)
            except (HeadLabError, _NotSavable):
                pass  # the run is still kept here; only the next process records its own

    def _hold(self, model: Any, batch: Any, recorder: Recorder, clean_q: torch.Tensor) -> None:
        self._held = (weakref.ref(model), batch.tokens, batch.query_pos, getattr(batch, "attention_mask", None),
                      recorder, clean_q)


# ---------------------------------------------------------------------------------------------
# on disk: the record's tensors in one safetensors file, the structure of the blocks' call arguments in JSON


class _NotSavable(Exception):
    """A recorded call argument of a type the disk format does not take (the run stays in memory only)."""


def clean_run_key(ref: ModelRef | str, revision: str | None, probe_spec: dict,
                  dtype: str | torch.dtype = DEFAULT_DTYPE) -> str:
    """The disk key of a checkpoint's clean run on a probe: built as core.probe.head_stats_key builds the
    probe cache's (the model, its revision, the batch's spec with provenance, the weights' fingerprint, the dtype)."""
    model_id = ref.to_json() if isinstance(ref, ModelRef) else str(ref)
    extra = {"weights": weights_fingerprint(ref, revision), "dtype": dtype_name(dtype)}
    return cache_key(CLEAN_RUN_KIND, canonical_json(model_id), revision, probe_spec, CLEAN_RUN_VERSION, extra)


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """A call argument as JSON; its tensors go into `tensors` (copied: safetensors refuses shared storage)."""
    if isinstance(value, torch.Tensor):
        name = f"arg{len(tensors)}"
        tensors[name] = value.detach().clone()
        return {"tensor": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v, tensors) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode(v, tensors) for k, v in value.items()}}
    raise _NotSavable(type(value).__name__)


def _decode(node: dict, tensors: dict[str, torch.Tensor], device: torch.device) -> Any:
    if "tensor" in node:
        return tensors[node["tensor"]].to(device)
    if "value" in node:
        return node["value"]
    if "tuple" in node:
        return tuple(_decode(v, tensors, device) for v in node["tuple"])
    if "list" in node:
        return [_decode(v, tensors, device) for v in node["list"]]
    return {k: _decode(v, tensors, device) for k, v in node["dict"].items()}


def save_clean_run(key: str, batch: Any, recorder: Recorder, clean_q: torch.Tensor) -> None:
    """Write a kept clean run under `key` (core.store: atomic, integrity-checked; an entry in place is kept)."""
    tensors: dict[str, torch.Tensor] = {"clean_q": clean_q.detach().clone(), "tokens": batch.tokens.detach().clone(),
                                        "query_pos": batch.query_pos.detach().clone()}
    mask = getattr(batch, "attention_mask", None)
    if mask is not None:
        tensors["attention_mask"] = mask.detach().clone()
    calls = {str(layer): _encode(list(call), tensors) for layer, call in recorder.calls.items()}
    for name, kept in (("input", recorder.inputs), ("z", recorder.z)):
        for layer, tensor in kept.items():
            tensors[f"{name}.{layer}"] = tensor.detach().clone()
    if recorder.final is not None:
        tensors["final"] = recorder.final.detach().clone()
    meta = {"n_layers": recorder.n_layers, "lo": recorder.lo, "first": recorder.first, "keep": sorted(recorder.keep),
            "z_layers": recorder.z_layers, "calls": calls}
    save_entry(key, tensors, meta)


def load_clean_run(key: str, batch: Any, model: Any) -> tuple[Recorder, torch.Tensor] | None:
    """(recorder, clean query logits) stored under `key` for this batch, else None (absent, corrupt, another batch)."""
    hit = load_entry(key)
    if hit is None:
        return None
    tensors, meta = hit
    mask = getattr(batch, "attention_mask", None)
    held = (tensors["tokens"], tensors["query_pos"], tensors.get("attention_mask"))
    on_cpu = SimpleNamespace(tokens=batch.tokens.cpu(), query_pos=batch.query_pos.cpu(),
                             attention_mask=None if mask is None else mask.cpu())
    if not _same_batch(on_cpu, held):
        return None
    device = model_device(model)
    rec = Recorder.__new__(Recorder)
    rec.model, rec.handles, rec.z_hooks = None, [], None
    rec.n_layers, rec.lo, rec.first = int(meta["n_layers"]), int(meta["lo"]), int(meta["first"])
    rec.keep, rec.z_layers = set(meta["keep"]), list(meta["z_layers"])
    rec.inputs, rec.z = {}, {}
    for name, tensor in tensors.items():
        kind, _, layer = name.partition(".")
        if kind == "input":
            rec.inputs[int(layer)] = tensor.to(device)
        elif kind == "z":
            rec.z[int(layer)] = tensor.to(device)
    rec.final = tensors["final"].to(device) if "final" in tensors else None
    rec.calls = {}
    for layer, node in meta["calls"].items():
        rest, kwargs = _decode(node, tensors, device)
        rec.calls[int(layer)] = rest, kwargs
    return rec, tensors["clean_q"].to(device)


def _same_batch(batch: Any, held: tuple) -> bool:
    """Whether batch has these tokens, query positions and attention mask (a cached batch may be a copy)."""
    mask = getattr(batch, "attention_mask", None)
    if (mask is None) != (held[2] is None):
        return False
    return (torch.equal(batch.tokens, held[0]) and torch.equal(batch.query_pos, held[1])
            and (mask is None or torch.equal(mask, held[2])))


def adds_attention_to_residual(model: Any, layer: int) -> bool:
    """Whether block `layer` is out = x + attn(x) + mlp(x) (TransformerLens's ParallelBlockBridge)."""
    return isinstance(model.blocks[layer], ParallelBlockBridge)


def fits_clean_run(model: Any, n: int, seq_len: int) -> bool:
    """Whether a clean run that records every layer (CleanRuns) fits CLEAN_RUN_BYTES: each layer's input
    residual, a parallel-residual layer's z and output too, and the final residual [example, pos, d_model] each."""
    shape = ForwardShape.of_model(model)
    n_layers = len(model.blocks)
    n_parallel = sum(adds_attention_to_residual(model, layer) for layer in range(n_layers))
    return (1 + n_layers + 2 * n_parallel) * n * seq_len * shape.d_model * shape.element_size <= CLEAN_RUN_BYTES


@torch.no_grad()
def forward_seconds(model: Any, seq_len: int, rows: int = 2) -> float:
    """Seconds per example of a plain forward of `seq_len` tokens on this machine now (the best of two timed
    forwards of `rows` examples after a warm-up): the unit the lab's time estimates are made of."""
    vocab = int(getattr(model.cfg, "d_vocab", 256))
    tokens = torch.randint(0, min(vocab, 256), (rows, seq_len), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(model_device(model))
    model(tokens[:1, : min(seq_len, 8)])  # warm-up: first-call allocations and lazy initialisation
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        model(tokens)
        best = min(best, time.perf_counter() - start)
    return best / rows
