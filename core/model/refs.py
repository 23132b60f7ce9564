"""Which model and which checkpoint: references, the zoo's manifests, hub revisions, weight fingerprints.

A model is named by a `ModelRef`: a zoo model trained by HeadLab (`$HEADLAB_HOME/zoo/<name>/`), a
local Hugging Face folder, or a Hugging Face hub name. Each has training checkpoints
(`Checkpoint`: revision, step, tokens seen), listed by the zoo's manifest.json, or by the hub's
branch names (Pythia `step{N}`, OLMo `step{N}-tokens{X}B`). Offline (HF_HUB_OFFLINE, the usual
set-up on a cluster's compute nodes) or without network, a hub model's checkpoints are the
revisions its local Hugging Face cache holds, read with huggingface_hub's cache scan. Nothing here
reads weights; loading is core/model/loading.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable

import huggingface_hub
import huggingface_hub.constants as hub_constants
from huggingface_hub.errors import CacheNotFound

from core.errors import HeadLabError
from core.results import JsonResult
from core.workspace import headlab_home, zoo_dir

KINDS = ("zoo", "local", "hub")
PYTHIA_TOKENS_PER_STEP = 2_097_152  # 1024 sequences x 2048 tokens per Pythia optimizer step
UNKNOWN_TOKENS = -1  # a checkpoint whose token count is not known (a bare local folder)
RETRAIN_HINT = "python -m core zoo --preset quick"
# a known model's folder (core/zoo/known) holds one of these: it is rebuilt with `known --build`, never retrained by hand
KNOWN_MODEL_FILES = ("circuit.json", "confirmation.json")
MANIFEST = "manifest.json"
# Weights up to this size are hashed in full for the fingerprint; larger ones by name, size, mtime.
FULL_HASH_LIMIT = 64 * 2**20
# org/name; the hub allows at most 96 characters on each side of the slash
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")
# a zoo model's folder name: one plain name (no path separators, no "." or "..", not hidden)
_ZOO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
GGUF_SUFFIX = ".gguf"
_PYTHIA_REVISION = re.compile(r"^step(\d+)$")
_OLMO_REVISION = re.compile(r"^step(\d+)-tokens(\d+(?:\.\d+)?)B$")


# ----------------------------------------------------------------------------- references

# A `.gguf` path names the zoo model imported from that file. The importer, core/model/gguf.py, loads
# models and so sits above this module; it registers itself here when imported (core/model/__init__.py
# imports it), and ModelRef.parse calls it without importing it.
_gguf_resolver: Callable[[Path], str] | None = None


def register_gguf_resolver(resolver: Callable[[Path], str]) -> None:
    """Set the function that turns a .gguf path into a zoo name (importing the file once)."""
    global _gguf_resolver
    _gguf_resolver = resolver



@dataclass(frozen=True)
class ModelRef(JsonResult):
    """A model: `kind` "zoo" (name under zoo_dir()), "local" (absolute folder) or "hub" (org/name)."""

    name: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ModelRef.kind must be one of {KINDS}, got {self.kind!r}")

    @staticmethod
    def parse(text: str) -> "ModelRef":
        """Read a model the way a user types it: a folder path, a zoo name, org/model, or a .gguf file.

        A .gguf file is imported into the zoo once (core/model/gguf.py) and named by its zoo model.
        """
        text = str(text).strip()
        if text.lower().endswith(GGUF_SUFFIX) and _gguf_resolver is not None and not Path(text).expanduser().is_dir():
            return ModelRef(_gguf_resolver(Path(text)), "zoo")
        folder = _existing_folder(text)
        if folder is not None:
            if not ((folder / "config.json").is_file() or (folder / MANIFEST).is_file()):
                raise HeadLabError(
                    f"folder {folder} is not a model checkpoint: it holds no config.json (a Hugging Face model saved "
                    "with save_pretrained, beside its *.safetensors weights) and no HeadLab manifest.json; give such "
                    "a folder, a zoo name or a hub name like EleutherAI/pythia-160m."
                )
            return ModelRef(str(folder), "local")
        zoo = list_zoo()
        if text in zoo:
            return ModelRef(text, "zoo")
        if _HUB_NAME.match(text):
            return ModelRef(text, "hub")
        names = ", ".join(zoo) if zoo else f"none yet (run {RETRAIN_HINT})"
        shown = text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"
        raise HeadLabError(
            f"unknown model {shown!r}; zoo models: {names}; or give a local Hugging Face folder "
            "or a hub name like EleutherAI/pythia-160m."
        )

    def __str__(self) -> str:
        return self.name


def _existing_folder(text: str) -> Path | None:
    """The folder `text` names (absolute, ~ expanded), or None: not a folder, or not a path at all (too long)."""
    if not text:
        return None
    try:
        path = Path(text).expanduser()
        return path.resolve() if path.is_dir() else None
    except (OSError, RuntimeError):  # a name longer than the file system allows; ~user of no such user
        return None


def zoo_model_dir(name: str) -> Path:
    """Where zoo model `name` lives: zoo_dir() / name. A zoo name is one plain folder name, never a path."""
    name = str(name)
    if not _ZOO_NAME.match(name):
        raise HeadLabError(
            f"zoo model name {name!r} is not a plain folder name; use letters, digits, '.', '-' or '_' "
            "(at most 128 characters, starting with a letter or digit), e.g. my-induction-model."
        )
    return zoo_dir() / name


def repair_hint(folder: Path | str) -> str:
    """What to do about a broken model folder. Only a zoo model's own folder, which HeadLab made, is
    ever offered for deletion; any other folder belongs to the user and is named, never condemned."""
    zoo = (headlab_home(create=False) / "zoo").resolve()  # an error path: create nothing
    try:
        inside = Path(folder).resolve().relative_to(zoo).parts
    except (OSError, ValueError):
        inside = ()
    if inside and any((zoo / inside[0] / marker).exists() for marker in KNOWN_MODEL_FILES):
        return f"rebuild it with python -m core known --build {inside[0]} (the build replaces the whole folder)"
    if inside:
        return f"delete the zoo model folder {zoo / inside[0]} and retrain it (e.g. {RETRAIN_HINT})"
    return ("re-save the model there with save_pretrained (config.json and *.safetensors weights) or give "
            "another folder")


@dataclass(frozen=True)
class Checkpoint(JsonResult):
    """One training checkpoint: its revision name, optimizer step and tokens seen (-1: unknown)."""

    revision: str
    step: int
    tokens: int


def list_zoo() -> list[str]:
    """Names of the zoo models present (folders under zoo_dir() holding a manifest.json)."""
    return sorted(p.name for p in zoo_dir().iterdir() if (p / MANIFEST).is_file())


def read_manifest(model: str | Path, missing_ok: bool = False) -> dict | None:
    """The manifest of a zoo model (`model` a name) or of a model folder (`model` a Path), as a dict.

    Its checkpoints are checked to name a revision, step and tokens (other keys, like a training
    loss, are kept). A missing manifest is None when `missing_ok` (training asks before it starts),
    else HeadLabError; an unreadable one is always HeadLabError.
    """
    folder = model if isinstance(model, Path) else zoo_dir() / model
    path = folder / MANIFEST
    if not path.is_file():
        if missing_ok:
            return None
        if not isinstance(model, Path):
            names = ", ".join(list_zoo()) or f"none yet (run {RETRAIN_HINT})"
            raise HeadLabError(f"unknown zoo model {model!r}; zoo models: {names}.")
    try:
        manifest = json.loads(path.read_text())
        manifest["checkpoints"] = [{**c, **Checkpoint.from_json(c).to_json()} for c in manifest["checkpoints"]]
        return manifest
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeadLabError(
            f"manifest {path} is unreadable ({type(exc).__name__}: {exc}); {repair_hint(path.parent)}."
        ) from None


def model_is_complete(folder: Path) -> bool:
    """Whether the model folder's manifest says its training (or import) ran to its end."""
    manifest = read_manifest(Path(folder), missing_ok=True)
    return bool(manifest and manifest.get("complete"))


# ----------------------------------------------------------------------------- checkpoints


def parse_revision(model_name: str, revision: str) -> tuple[int, int] | None:
    """(step, tokens) from a hub revision name, or None when the name carries no token count.

    OLMo names carry the count: `step{N}-tokens{X}B` -> X * 1e9. Pythia names carry only the
    step: `step{N}` -> N * 2,097,152 tokens, applied only to models named like Pythia, since
    tokens per step is a property of Pythia's batch size.
    """
    match = _OLMO_REVISION.match(revision)
    if match:
        try:
            tokens = int(Decimal(match.group(2)) * 10**9)
        except InvalidOperation:
            return None
        return int(match.group(1)), tokens
    match = _PYTHIA_REVISION.match(revision)
    if match and "pythia" in model_name.lower():
        step = int(match.group(1))
        return step, step * PYTHIA_TOKENS_PER_STEP
    return None


def tokens_from_revision(model_name: str, revision: str) -> int | None:
    """Tokens seen at a hub revision (Pythia `step{N}`, OLMo `step{N}-tokens{X}B`), else None."""
    parsed = parse_revision(model_name, revision)
    return None if parsed is None else parsed[1]


def unfinished_training(ref: ModelRef) -> str | None:
    """A sentence when the model's manifest says its training did not finish (killed or stopped early), else None.

    Its last checkpoint is then not the trained model: listings and analyses say so instead of treating it as final.
    """
    if ref.kind == "hub":
        return None
    folder = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name)
    manifest = read_manifest(folder, missing_ok=True)
    if manifest is None or manifest.get("complete", True):
        return None
    last = manifest["checkpoints"][-1]["step"] if manifest["checkpoints"] else 0
    return (f"{ref.name} is unfinished: its training stopped at step {last:,} before the planned end, so its last "
            "checkpoint is not the trained model; rerun the same `python -m core zoo` or `train` command to resume it")


def list_checkpoints(ref: ModelRef) -> list[Checkpoint]:
    """The model's checkpoints sorted by tokens seen; HeadLabError when there are none."""
    if ref.kind == "zoo":
        checkpoints = _manifest_checkpoints(zoo_dir() / ref.name)
    elif ref.kind == "local":
        folder = Path(ref.name)
        if (folder / MANIFEST).is_file():
            checkpoints = _manifest_checkpoints(folder)
        else:
            # A bare save_pretrained folder is one checkpoint whose training position is unknown.
            checkpoints = [Checkpoint("main", 0, UNKNOWN_TOKENS)]
    else:
        checkpoints = _hub_checkpoints(ref.name)
    if not checkpoints:
        raise HeadLabError(
            f"model {ref.name} has no training checkpoints with known token counts; "
            "pick a model with step revisions (e.g. EleutherAI/pythia-160m) or retrain it."
        )
    return sorted(checkpoints, key=lambda c: (c.tokens, c.step, c.revision))


def _manifest_checkpoints(folder: Path) -> list[Checkpoint]:
    """Checkpoints listed in a model folder's manifest.json."""
    return [Checkpoint.from_json(c) for c in read_manifest(folder)["checkpoints"]]


def _hub_checkpoints(name: str) -> list[Checkpoint]:
    """Checkpoints from the hub's branch names; offline or without network, from the local cache."""
    if hub_constants.is_offline_mode():
        problem = "HF_HUB_OFFLINE is set"
    else:
        try:
            return _named_checkpoints(name, [b.name for b in huggingface_hub.list_repo_refs(name).branches])
        except Exception as exc:  # no network, unknown repo, gated repo: the cache may still hold it
            problem = type(exc).__name__
    cached = cached_revisions(name)
    if not cached:
        raise HeadLabError(
            f"cannot list the revisions of hub model {name} ({problem}) and the local Hugging Face "
            f"cache ({hub_constants.HF_HUB_CACHE}) holds none; check the name and the network, "
            f"download checkpoints with `hf download {name} --revision REV`, or use a zoo model or a local folder."
        )
    return _named_checkpoints(name, list(cached))


def _named_checkpoints(name: str, revisions: list[str]) -> list[Checkpoint]:
    """The revisions whose names carry a step and a token count, as checkpoints."""
    parsed = {revision: parse_revision(name, revision) for revision in revisions}
    return [Checkpoint(r, p[0], p[1]) for r, p in parsed.items() if p is not None]


def cached_revisions(name: str) -> dict[str, str]:
    """Revision (branch) -> commit hash of hub model `name` in the local Hugging Face cache.

    Read with huggingface_hub's `scan_cache_dir` over HF_HUB_CACHE ($HF_HOME/hub). Only revisions
    whose snapshot holds a config.json and a weight file count (a cache filled with config files
    alone cannot load); detached snapshots (no branch) have no name to read tokens from.
    """
    try:
        info = huggingface_hub.scan_cache_dir(hub_constants.HF_HUB_CACHE)
    except (CacheNotFound, ValueError):  # no cache folder yet, or a file in its place
        return {}
    for repo in info.repos:
        if repo.repo_type == "model" and repo.repo_id == name:
            return {ref: revision.commit_hash for ref, revision in sorted(repo.refs.items())
                    if _loadable({f.file_name for f in revision.files})}
    return {}


def _loadable(file_names: set[str]) -> bool:
    return "config.json" in file_names and any(n.endswith((".safetensors", ".bin")) for n in file_names)


def cached_commit(name: str, revision: str | None) -> str | None:
    """The commit hash that `revision` of hub model `name` resolves to in the local cache, or None.

    Asks huggingface_hub where the revision's config.json is cached (`try_to_load_from_cache`:
    refs/<revision> -> snapshots/<commit>/config.json); None when it is not there.
    """
    path = huggingface_hub.try_to_load_from_cache(name, "config.json", cache_dir=hub_constants.HF_HUB_CACHE,
                                                  revision=revision or "main")
    return Path(path).parent.name if isinstance(path, str) else None


def require_cached(name: str, revision: str | None) -> None:
    """Offline, refuse a hub revision the local cache does not hold, saying how to get it."""
    if hub_constants.is_offline_mode() and cached_commit(name, revision) is None:
        raise not_cached_error(name, revision)


def not_cached_error(name: str, revision: str | None) -> HeadLabError:
    rev = revision or "main"
    return HeadLabError(
        f"{name} revision {rev} is not in the local cache; download it with `huggingface-cli download "
        f"{name} --revision {rev}` (or `hf download {name} --revision {rev}`) or drop HF_HUB_OFFLINE "
        f"(cache: {hub_constants.HF_HUB_CACHE})."
    )


def resolve_checkpoint(ref: ModelRef, revision: str | None = None) -> Checkpoint:
    """The checkpoint named `revision`, or the last one (most tokens) when revision is None."""
    if ref.kind == "hub" and revision is not None:
        require_cached(ref.name, revision)
        parsed = parse_revision(ref.name, revision)
        try:
            checkpoints = list_checkpoints(ref)
        except HeadLabError:
            if parsed is None:
                raise
            return Checkpoint(revision, parsed[0], parsed[1])  # offline: trust the name
    else:
        checkpoints = list_checkpoints(ref)
    if revision is None:
        return checkpoints[-1]
    for checkpoint in checkpoints:
        if checkpoint.revision == revision:
            return checkpoint
    names = [c.revision for c in checkpoints]
    shown = ", ".join(names if len(names) <= 6 else names[:3] + ["..."] + names[-3:])
    raise HeadLabError(
        f"model {ref.name} has no checkpoint {revision!r}; pick one of: {shown} "
        f"({len(names)} in all)."
    )


def checkpoint_path(ref: ModelRef, revision: str | None = None) -> Path | str:
    """Where from_pretrained reads the checkpoint: a folder, or the hub name (revision apart)."""
    if ref.kind == "hub":
        return ref.name
    checkpoint = resolve_checkpoint(ref, revision)
    root = zoo_dir() / ref.name if ref.kind == "zoo" else Path(ref.name)
    if checkpoint.revision == "main" and not (root / MANIFEST).is_file():
        return root
    revision = checkpoint.revision
    if not revision or revision in (".", "..") or Path(revision).name != revision or "\\" in revision:
        raise HeadLabError(
            f"the manifest of {root} names checkpoint {revision!r}, which is not a folder of {root / 'checkpoints'} "
            f"(a revision is one folder name, never a path); fix or remove that entry of {root / MANIFEST}, "
            f"or {repair_hint(root)}."
        )
    folder = root / "checkpoints" / revision
    if not folder.is_dir():
        raise HeadLabError(f"checkpoint folder {folder} is missing; {repair_hint(root)}.")
    return folder


def weights_fingerprint(model_ref: Any, revision: str | None) -> str | None:
    """A fingerprint of a local/zoo checkpoint's files, so a retrained model misses the cache.

    Files up to FULL_HASH_LIMIT in all are hashed in full; larger checkpoints by name, size and
    mtime. Hub models: the commit the revision points to in the local cache (a moved branch or a
    rewritten cache misses), None when it is not cached (the revision names the weights).
    """
    if not isinstance(model_ref, ModelRef):
        return None
    if model_ref.kind == "hub":
        return cached_commit(model_ref.name, revision)
    folder = Path(checkpoint_path(model_ref, revision))
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name == "config.json"))
    full = sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:".encode())
        digest.update(path.read_bytes() if full else str(stat.st_mtime_ns).encode())
    return digest.hexdigest()
