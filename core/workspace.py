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
import re
import shutil
import signal
import threading
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


def _nearest_existing(path: Path) -> Path:
    """`path` itself or its nearest ancestor that exists (the folder a write would start creating from)."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError:  # a name too long for the file system: look further up
            continue
    return Path(".")


def _check_creatable(path: Path, flag: str, folder: Path) -> None:
    """Refuse `path` when `folder`, which will hold it, is under a file or in a place this user cannot
    write (its nearest existing folder decides)."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise HeadLabError(f"{flag} {path} cannot be written: {base} is a file, not a folder; choose another path.")
    if not os.access(base, os.W_OK | os.X_OK):
        raise HeadLabError(f"{flag} {path} cannot be written: {base} is not writable by you; choose another path.")


def check_output_file(path: Path, flag: str = "--json") -> Path:
    """Refuse, before any work runs, an output file that cannot be written: empty, a folder, under a file, unwritable."""
    path = Path(path)
    if str(path) in ("", "."):
        raise HeadLabError(f"{flag} is empty (or '.'); give a file path such as result.json.")
    try:
        if path.is_dir():
            raise HeadLabError(f"{flag} {path} is a folder; give a file path such as {path / 'result.json'}.")
        _check_creatable(path, flag, path.parent)
        if path.parent.is_dir():  # the write goes through a temporary file beside it: try one now (e.g. /proc refuses)
            try:
                fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".check")
            except OSError as exc:
                raise HeadLabError(f"{flag} {path} cannot be written: the folder {path.parent} takes no new file "
                                   f"({exc.strerror}); choose another path.") from None
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise HeadLabError(f"{flag} {path} cannot be written ({exc.strerror}); choose another path.") from None
    return path


def check_output_folder(path: Path, flag: str = "--out") -> Path:
    """Refuse, before any work runs, an output folder that cannot be made: a file, under a file, unwritable."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise HeadLabError(f"{flag} {path} is a file; give a folder to write into (it is created when missing).")
        _check_creatable(path, flag, path)
    except OSError as exc:
        raise HeadLabError(f"{flag} {path} cannot be written ({exc.strerror}); choose another path.") from None
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


def atomic_write_json(path: Path, obj: Any, flat_lists: bool = False) -> None:
    """Write `obj` as indented JSON, atomically. flat_lists: a list of numbers, strings, booleans or nulls on one
    line (a benchmark report's per-edge scores and edge names: indented one per line they doubled its size)."""
    text = json_text(obj) if flat_lists else json.dumps(obj, indent=2, sort_keys=False)
    atomic_write_bytes(Path(path), (text + "\n").encode())


def json_text(obj: Any, level: int = 0) -> str:
    """JSON of `obj` indented by 2 per level, with each list that holds no list or object on a single line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(str(key))}: {json_text(value, level + 1)}" for key, value in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)) and any(isinstance(x, (dict, list, tuple)) for x in obj):
        return "[\n" + ",\n".join(f"{inner}{json_text(x, level + 1)}" for x in obj) + f"\n{pad}]"
    return json.dumps(obj)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on them as before: two renames that must both happen.
    (Python's handlers, not the thread's signal mask: the kernel may hand a signal to any other thread.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can be set from the main thread only; a worker thread is not interrupted by SIGINT anyway
        return
    arrived: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, frame: arrived.append(number)) for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in arrived:
            signal.raise_signal(number)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def recover_directory(final: Path) -> None:
    """Undo what a killed writer of `final` left: its temporary folders (named with their writer's process id, which
    is gone) are removed, and a previous `final` moved aside for a swap the kill cut short is put back."""
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.(\d+)-.*\.(tmp|old)$")
    for sibling in sorted(final.parent.iterdir()) if final.parent.is_dir() else ():
        match = pattern.match(sibling.name)
        if not match or int(match.group(1)) == os.getpid() or _pid_alive(int(match.group(1))):
            continue
        if match.group(2) == "old" and not final.exists():
            os.replace(sibling, final)  # the swap was cut between its two renames: the previous folder returns
        else:
            shutil.rmtree(sibling, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it is renamed to `final`.

    On any exception the temporary folder is removed, so `final` either does not exist or is
    complete. If `final` already exists (another process won the race, or an older version), it is
    swapped out: moved aside and the new folder renamed in with SIGINT and SIGTERM held, so an
    interrupt leaves the old folder or the new one, never neither; a kill between the two renames is
    undone by the next writer (the old folder returns), which also removes a killed writer's
    temporary folders (their names carry the writer's process id).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_directory(final)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.{os.getpid()}-", suffix=".tmp"))
    try:
        yield tmp
        old = None
        try:
            with _signals_deferred():
                if final.exists():
                    old = final.with_name(f"{tmp.name[:-len('.tmp')]}.old")
                    os.replace(final, old)
                os.replace(tmp, final)
        finally:  # also when a held interrupt is raised as the block ends
            if old is not None and not final.exists():
                os.replace(old, final)  # the new folder did not go in: the old one returns
            elif old is not None:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
