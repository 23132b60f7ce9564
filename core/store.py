"""The on-disk cache: content-addressed entries of safetensors + JSON under `cache_dir()`.

Generic: it stores tensors and JSON metadata under a key and knows no result type; each result's
module makes its own keys and turns entries back into results (core.probe for HeadStats).

A key is the SHA-256 of the canonical JSON of everything that determines a result (kind, model,
revision, probe spec, the result's code version, extras such as a weights fingerprint), so a
changed input simply misses. An entry is a folder `<cache>/<kind>/<digest[:2]>/<digest>/` holding
`tensors.safetensors` and `meta.json`; meta.json records the SHA-256 of the tensors file, so a
truncated or edited entry is detected, reported, removed and recomputed. Entries are written into
a temporary sibling folder, fsynced, and renamed into place in one step; when two processes race
for one key, the first rename wins and the second keeps the winner's entry. A temporary folder left
by a killed run is removed by the next write to its shard once it is STALE_SECONDS old (a live
writer touches its files far more often); a file sitting where an entry folder belongs is reported
and removed like a corrupt entry. A cache that cannot be written (read-only, full, over a file-size
limit) is a HeadLabError naming the cache folder, and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
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
# Leftovers in a shard folder: ".<digest>.<random>.tmp" (a write) and ".<digest>.corrupt.<pid>.<ns>" (a removal).
_LEFTOVER = re.compile(r"^\.[0-9a-f]{64}\.(?:.+\.tmp|corrupt\..+)$")
STALE_SECONDS = 3600  # a leftover untouched for an hour belongs to a killed run, not a live one

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


def _unwritable(final: Path, exc: OSError) -> HeadLabError:
    cache = final.parents[2]  # <cache>/<kind>/<shard>/<digest>
    blocker = next((p for p in (cache, final.parents[1], final.parent) if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # not a full disk nor a read-only folder: a file sits where a cache folder belongs
        return HeadLabError(f"cannot write a cache entry: {blocker} is a file where a cache folder belongs; move that "
                            "file away and rerun (nothing was left half-written).")
    return HeadLabError(
        f"cannot write a cache entry under {cache} ({exc.strerror or exc}); free disk space, make that folder "
        "writable or raise the file-size limit, or set HEADLAB_HOME to a folder you can write "
        "(nothing was left half-written)."
    )


def check_writable(key: str) -> None:
    """Refuse, before a long computation, a cache that could not store the entry of `key` (read-only, not a folder)."""
    final = entry_path(key)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(final.parent, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise _unwritable(final, exc) from None


def _last_touched(path: Path) -> float:
    """The latest mtime of a folder and the files directly in it (a live writer updates its file's)."""
    times = [path.lstat().st_mtime]
    if path.is_dir() and not path.is_symlink():
        times += [child.lstat().st_mtime for child in path.iterdir()]
    return max(times)


def remove_stale_leftovers(shard: Path, older_than: float = STALE_SECONDS) -> list[Path]:
    """Remove temporary and trashed entry folders in `shard` untouched for `older_than` seconds; returns them.

    Left by a run killed mid-write (SIGKILL, power loss). Age decides, so a concurrent live writer,
    whose files change as it writes, keeps its folder; a folder another process removes first is skipped.
    """
    removed = []
    now = time.time()
    for path in sorted(shard.iterdir()) if shard.is_dir() else []:
        if not _LEFTOVER.match(path.name):
            continue
        try:
            if now - _last_touched(path) < older_than:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:  # gone already (another process swept it), or not ours to remove: leave it
            continue
        removed.append(path)
    return removed


def save_entry(key: str, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    """Write an entry atomically and return its folder; an entry already in place is kept as is.

    tensors: name -> tensor (any shapes/dtypes safetensors takes); meta: JSON-serialisable.
    Raises HeadLabError, naming the cache folder, when the cache cannot be written; nothing is left behind.
    """
    final = entry_path(key)
    if final.is_dir():
        return final  # another process (or an earlier run) placed it: keep theirs
    if final.exists() or final.is_symlink():  # a file where the entry folder belongs: it would block every save
        _discard_corrupt(key, final, "a file sits where the entry folder belongs")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_leftovers(final.parent)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    except OSError as exc:
        raise _unwritable(final, exc) from None
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
    except OSError as exc:  # a full disk, a read-only folder, a file-size limit
        shutil.rmtree(tmp, ignore_errors=True)
        raise _unwritable(final, exc) from None
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
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            trash.unlink()


def has_entry(key: str) -> bool:
    """Whether a whole entry is in place, checked as load_entry checks it (its meta.json, key, SHA-256 and tensors): a
    truncated or hand-edited entry is reported, removed and counted absent, so nothing calls it "cached"."""
    return entry_path(key).exists() and load_entry(key) is not None


def load_entry(key: str) -> Optional[tuple[dict[str, torch.Tensor], dict]]:
    """(tensors, meta) of the entry, or None when absent or corrupt (a corrupt one is reported and removed)."""
    folder = entry_path(key)
    if not folder.is_dir():
        if folder.exists() or folder.is_symlink():
            _discard_corrupt(key, folder, "a file sits where the entry folder belongs")
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
    check_writable(key)  # before the work, not after it
    tensors, meta = compute_fn()
    save_entry(key, tensors, meta)
    stored = load_entry(key)  # the winner's entry if another process saved first
    return stored if stored is not None else (tensors, meta)
