"""Where HeadLab writes: `$HEADLAB_HOME` (zoo, cache, reports), and how it writes atomically.

Everything HeadLab writes lives outside the checkout, so it survives a fresh clone:
`$HEADLAB_HOME`, else `$XDG_CACHE_HOME/headlab`, else `~/.cache/headlab`.
Writes go to a temporary name in the same folder and are renamed into place, so a crash or a
second process never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from core.errors import HeadLabError


def headlab_home(create: bool = True) -> Path:
    """The workspace root. Raises HeadLabError when it cannot be created or written."""
    if os.environ.get("HEADLAB_HOME"):
        home = Path(os.environ["HEADLAB_HOME"]).expanduser()
    else:
        cache_root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = Path(cache_root).expanduser() / "headlab"
    if create:
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HeadLabError(
                f"HEADLAB_HOME {home} cannot be created ({exc.strerror}); "
                "set HEADLAB_HOME to a folder you can write."
            ) from None
        if not os.access(home, os.W_OK | os.X_OK):
            raise HeadLabError(
                f"HEADLAB_HOME {home} is not writable; set HEADLAB_HOME to a folder you can write."
            )
    return home


def zoo_dir() -> Path:
    """Trained zoo models: one folder per model with a manifest and checkpoints."""
    return _subdir("zoo")


def cache_dir() -> Path:
    """Content-addressed results (HeadStats and analyses)."""
    return _subdir("cache")


def reports_dir() -> Path:
    """Replication reports and exported figures."""
    return _subdir("reports")


def _subdir(name: str) -> Path:
    path = headlab_home() / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HeadLabError(
            f"cannot create {path} ({exc.strerror}); set HEADLAB_HOME to a folder you can write."
        ) from None
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it is renamed to `final`.

    On any exception the temporary folder is removed, so `final` either does not exist or is
    complete. If `final` already exists (another process won the race), it is replaced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
