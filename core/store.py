"""The on-disk cache: content-addressed entries of safetensors + JSON under `cache_dir()`.

A key is the SHA-256 of the canonical JSON of everything that determines a result (kind, model,
revision, probe spec, code version, extras such as a weights fingerprint), so a changed input
simply misses. An entry is a folder `<cache>/<kind>/<digest[:2]>/<digest>/` holding
`tensors.safetensors` and `meta.json`; meta.json records the SHA-256 of the tensors file, so a
truncated or edited entry is detected, reported, removed and recomputed. Entries are written into
a temporary sibling folder, fsynced, and renamed into place in one step; when two processes race
for one key, the first rename wins and the second keeps the winner's entry.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from core.errors import HeadLabError
from core.workspace import cache_dir

# Bump when what the instrumented pass stores (or how) changes: old entries then miss.
CODE_VERSION = "headstats-1"

TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"
HEADSTATS_KIND = "headstats"
_KIND = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# Weights up to this size are hashed in full for the fingerprint; larger ones by name, size, mtime.
FULL_HASH_LIMIT = 64 * 2**20

log = logging.getLogger(__name__)


class CorruptCacheEntryWarning(UserWarning):
    """A cache entry failed its integrity check; it was removed and will be recomputed."""


# ---------------------------------------------------------------------------------------------
# keys and paths


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return obj.item()
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "to_json"):
        return obj.to_json()
    raise TypeError(f"cannot put {type(obj).__name__} into a cache key")


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, ASCII: equal inputs give equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_json_default)


def cache_key(kind: str, model_id: str, revision: Optional[str], probe_spec: dict,
              code_version: str = CODE_VERSION, extra: Optional[dict] = None) -> str:
    """The key of one result: "<kind>:<sha256 of the canonical JSON of all inputs>"."""
    if not _KIND.match(str(kind)):
        raise HeadLabError(f"cache kind {kind!r} must be lower-case letters, digits, '-' or '_'.")
    payload = {
        "kind": kind, "model": str(model_id), "revision": revision, "probe_spec": probe_spec,
        "code_version": code_version, "extra": extra or {},
    }
    return f"{kind}:{hashlib.sha256(canonical_json(payload).encode()).hexdigest()}"


def _split_key(key: str) -> tuple[str, str]:
    kind, _, digest = str(key).partition(":")
    if not _KIND.match(kind) or not _DIGEST.match(digest):
        raise HeadLabError(f"{key!r} is not a cache key; make keys with core.store.cache_key.")
    return kind, digest


def entry_path(key: str) -> Path:
    """Where the entry of `key` lives: <cache>/<kind>/<digest[:2]>/<digest>/."""
    kind, digest = _split_key(key)
    return cache_dir() / kind / digest[:2] / digest


# ---------------------------------------------------------------------------------------------
# entries


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def save_entry(key: str, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write an entry atomically and return its folder; an entry already in place is kept as is.

    tensors: name -> tensor (any shapes/dtypes safetensors takes); meta: JSON-serialisable.
    """
    from safetensors.torch import save as save_tensors

    final = entry_path(key)
    if final.exists():
        return final  # another process (or an earlier run) placed it: keep theirs
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        data = save_tensors({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
        _write_synced(tmp / TENSORS_FILE, data)
        record = {
            "key": key, "tensors_sha256": hashlib.sha256(data).hexdigest(), "tensors_bytes": len(data),
            "created_unix": time.time(), "meta": meta,
        }
        _write_synced(tmp / META_FILE, (json.dumps(record, indent=2, default=_json_default) + "\n").encode())
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)  # atomic; fails when `final` exists (a non-empty folder)
        except OSError:
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # lost the race: keep the winner's entry
            return final
        _fsync_dir(final.parent)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _discard_corrupt(key: str, folder: Path, reason: str) -> None:
    """Report a corrupt entry and move it out of the way (renamed first, so readers never see half of it)."""
    message = f"cache entry {folder} is corrupt ({reason}); it was removed and will be recomputed."
    log.warning(message)
    warnings.warn(message, CorruptCacheEntryWarning, stacklevel=3)
    trash = folder.parent / f".{folder.name}.corrupt.{os.getpid()}.{time.time_ns()}"
    try:
        os.rename(folder, trash)
    except OSError:
        return  # someone else removed or replaced it already
    shutil.rmtree(trash, ignore_errors=True)


def load_entry(key: str) -> Optional[tuple[dict[str, torch.Tensor], dict]]:
    """(tensors, meta) of the entry, or None when absent or corrupt (a corrupt one is reported and removed)."""
    from safetensors.torch import load as load_tensors

    folder = entry_path(key)
    if not folder.is_dir():
        return None
    try:
        record = json.loads((folder / META_FILE).read_text())
        expected = record["tensors_sha256"]
        meta = record["meta"]
        if record.get("key") != key:
            raise ValueError("meta.json belongs to another key")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _discard_corrupt(key, folder, f"meta.json unreadable: {type(exc).__name__}")
        return None
    try:
        data = (folder / TENSORS_FILE).read_bytes()
    except OSError as exc:
        _discard_corrupt(key, folder, f"tensors file unreadable: {exc.strerror}")
        return None
    if hashlib.sha256(data).hexdigest() != expected:
        _discard_corrupt(key, folder, "tensors file does not match its recorded SHA-256")
        return None
    try:
        tensors = load_tensors(data)
    except Exception as exc:  # a matching hash of a file safetensors cannot parse: still corrupt
        _discard_corrupt(key, folder, f"tensors file unparsable: {type(exc).__name__}")
        return None
    return tensors, meta


def get_or_compute(key: str, compute_fn: Callable[[], tuple[dict[str, torch.Tensor], dict]]
                   ) -> tuple[dict[str, torch.Tensor], dict]:
    """The cached entry of `key`, else compute_fn() saved then returned. An exception in compute_fn saves nothing."""
    hit = load_entry(key)
    if hit is not None:
        return hit
    tensors, meta = compute_fn()
    save_entry(key, tensors, meta)
    stored = load_entry(key)  # the winner's entry if another process saved first
    return stored if stored is not None else (tensors, meta)


# ---------------------------------------------------------------------------------------------
# HeadStats


def weights_fingerprint(model_ref: Any, revision: Optional[str]) -> Optional[str]:
    """A fingerprint of a local/zoo checkpoint's files, so a retrained model misses the cache.

    Files up to FULL_HASH_LIMIT in all are hashed in full; larger checkpoints by name, size and
    mtime. Hub models return None (their revision names the weights).
    """
    from core.model.loading import ModelRef, checkpoint_path

    if not isinstance(model_ref, ModelRef) or model_ref.kind == "hub":
        return None
    folder = Path(checkpoint_path(model_ref, revision))
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name == "config.json"))
    full = sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:".encode())
        digest.update(path.read_bytes() if full else str(stat.st_mtime_ns).encode())
    return digest.hexdigest()


def head_stats_key(model_ref: Any, revision: Optional[str], probe_spec: dict) -> str:
    """The cache key of one checkpoint's HeadStats."""
    model_id = model_ref.to_json() if hasattr(model_ref, "to_json") else str(model_ref)
    extra = {"weights": weights_fingerprint(model_ref, revision)}
    return cache_key(HEADSTATS_KIND, canonical_json(model_id), revision, probe_spec, CODE_VERSION, extra)


def cached_head_stats(model_ref: Any, revision: Optional[str], probe_spec: dict, compute_fn: Callable[[], Any],
                      on_status: Optional[Callable[[str], None]] = None):
    """HeadStats of (model, revision, probe) from the cache, else compute_fn() -> HeadStats, saved.

    on_status: called with "cached" or "computed".
    """
    from core.probe import HeadStats

    key = head_stats_key(model_ref, revision, probe_spec)
    hit = load_entry(key)
    if hit is not None:
        if on_status:
            on_status("cached")
        return HeadStats.from_tensors(*hit)
    stats = compute_fn()
    save_entry(key, stats.to_tensors(), stats.to_json())
    if on_status:
        on_status("computed")
    return stats


# ---------------------------------------------------------------------------------------------
# python -m core probe


def add_probe_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe batch flags every command that runs a probe shares (and --device)."""
    parser.add_argument("--task", choices=("induction", "text"), default="induction", help="probe task (default induction)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=int, default=42, help="probe seed (default 42)")
    parser.add_argument("--token-low", type=int, default=0, help="induction tokens from (default 0)")
    parser.add_argument("--token-high", type=int, default=256, help="induction tokens below (default 256: bytes)")
    parser.add_argument("--device", default="cpu")


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--revision", default=None, help="one checkpoint (default: the final one)")
    which.add_argument("--all-checkpoints", action="store_true", help="every checkpoint of the model")
    add_probe_spec_arguments(parser)
    parser.add_argument("--chunk-size", type=int, default=64, help="examples per forward (default 64)")


def probe_spec_from_args(args: argparse.Namespace):
    """The InductionProbeSpec / TextProbeSpec the flags describe."""
    from core.tasks import InductionProbeSpec, TextProbeSpec

    if args.task == "induction":
        return InductionProbeSpec(n_examples=args.n, seq_len=args.seq_len, token_low=args.token_low,
                                  token_high=args.token_high, seed=args.seed)
    return TextProbeSpec(n_examples=args.n, seq_len=args.seq_len, seed=args.seed)


def check_spec_fits_config(spec: Any, config: Any) -> None:
    """Refuse, before any model is loaded, a probe longer than the context or outside the vocabulary."""
    context = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if context and spec.seq_len > int(context):
        raise HeadLabError(
            f"The probe length {spec.seq_len} is longer than the model's context ({context} tokens); "
            f"use --seq-len {context} or less."
        )
    spec.check_vocab(int(config.vocab_size))


def cli_probe(args: argparse.Namespace) -> dict:
    """`python -m core probe`: fill the HeadStats cache for one or all checkpoints, with a progress bar."""
    from tqdm import tqdm

    from core.model.loading import ModelRef, list_checkpoints, load_config, load_model, resolve_checkpoint
    from core.probe import collect_head_stats, model_family
    from core.tasks import make_induction_probe, make_text_probe

    ref = ModelRef.parse(args.model)
    if args.all_checkpoints:
        checkpoints = list_checkpoints(ref)
    else:
        checkpoints = [resolve_checkpoint(ref, args.revision)]
    if not checkpoints:
        raise HeadLabError(f"model {ref} lists no checkpoints; train it or pick another model.")
    spec = probe_spec_from_args(args)
    check_spec_fits_config(spec, load_config(ref, checkpoints[-1].revision))
    batch = make_induction_probe(spec) if args.task == "induction" else make_text_probe(spec)
    probe_spec = dict(batch.spec)

    rows = []
    bar = tqdm(total=len(checkpoints) * batch.n_examples, unit="seq", desc=str(ref.name)[-30:])
    try:
        for ckpt in checkpoints:
            bar.set_postfix_str(ckpt.revision)
            status: list[str] = []

            def compute(ckpt=ckpt):
                model = load_model(ref, ckpt.revision, device=args.device)
                prov = {"model": str(ref), "revision": ckpt.revision, "tokens": ckpt.tokens,
                        "family": model_family(model)}
                return collect_head_stats(model, batch, chunk_size=args.chunk_size, device=args.device,
                                          progress=bar.update, provenance=prov)

            cached_head_stats(ref, ckpt.revision, probe_spec, compute, on_status=status.append)
            if status[0] == "cached":
                bar.update(batch.n_examples)
                tqdm.write(f"{ckpt.revision}: cached")
            rows.append({
                "revision": ckpt.revision, "step": ckpt.step, "tokens": ckpt.tokens, "status": status[0],
                "key": head_stats_key(ref, ckpt.revision, probe_spec),
            })
    finally:
        bar.close()
    return {"model": str(ref), "task": args.task, "probe_spec": probe_spec, "code_version": CODE_VERSION,
            "checkpoints": rows}
