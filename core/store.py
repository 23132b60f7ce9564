"""The on-disk cache: content-addressed entries of safetensors + JSON under `cache_dir()`.

Generic: it stores tensors and JSON metadata under a key and knows no result type; each result's
module makes its own keys and turns entries back into results (core.probe for HeadStats).

A key is the SHA-256 of the canonical JSON of everything that determines a result (kind, model,
revision, probe spec, the result's code version, extras such as a weights fingerprint), so a
changed input simply misses. An entry is a folder `<cache>/<kind>/<digest[:2]>/<digest>/` holding
`tensors.safetensors` and `meta.json`; meta.json records the SHA-256 of the tensors file, so a
truncated or edited entry is detected, reported, removed and recomputed. Entries are written into
a temporary sibling folder, fsynced, and renamed into place in one step; when two processes race
for one key, the first rename wins and the second keeps the winner's entry.
"""

from __future__ import annotations

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
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from core.errors import HeadLabError
from core.results import json_default
from core.workspace import cache_dir

TENSORS_FILE = "tensors.safetensors"
META_FILE = "meta.json"
_KIND = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

log = logging.getLogger(__name__)


class CorruptCacheEntryWarning(UserWarning):
    """A cache entry failed its integrity check; it was removed and will be recomputed."""


# ---------------------------------------------------------------------------------------------
# keys and paths


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, ASCII: equal inputs give equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=json_default)


def cache_key(kind: str, model_id: str, revision: Optional[str], probe_spec: dict, version: str,
              extra: Optional[dict] = None) -> str:
    """The key of one result: "<kind>:<sha256 of the canonical JSON of all inputs>".

    version: the code version of the result kind (e.g. core.probe.HEADSTATS_VERSION); bump it when
    what the kind stores changes, so old entries miss.
    """
    if not _KIND.match(str(kind)):
        raise HeadLabError(f"cache kind {kind!r} must be lower-case letters, digits, '-' or '_'.")
    if not version:
        raise HeadLabError(f"cache kind {kind!r} needs a code version for its keys; pass version=.")
    payload = {  # "code_version": the name stored keys were hashed with
        "kind": kind, "model": str(model_id), "revision": revision, "probe_spec": probe_spec,
        "code_version": version, "extra": extra or {},
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
        _write_synced(tmp / META_FILE, (json.dumps(record, indent=2, default=json_default) + "\n").encode())
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


def has_entry(key: str) -> bool:
    """Whether an entry is in place: entries appear whole, by an atomic rename (a corrupt one is caught by load_entry)."""
    return entry_path(key).is_dir()


def load_entry(key: str) -> Optional[tuple[dict[str, torch.Tensor], dict]]:
    """(tensors, meta) of the entry, or None when absent or corrupt (a corrupt one is reported and removed)."""
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
