"""A zoo model's checkpoints written as a Hugging Face hub cache, so the hub path runs offline.

On a cluster's compute nodes the hub is out of reach and models come from a cache filled
beforehand (`hf download EleutherAI/pythia-160m --revision step1000`). `write_hub_cache` writes a
trained zoo model the way `hf_hub_download` lays files out (huggingface_hub's file_download.py):

    <cache>/models--ORG--NAME/blobs/<etag>                 file contents; etag = sha256 for LFS
                                                           files (weights), git blob sha1 otherwise
    <cache>/models--ORG--NAME/refs/<branch>                the branch's commit hash (no newline)
    <cache>/models--ORG--NAME/snapshots/<commit>/<file>    relative symlink to ../../blobs/<etag>

Branches are named like Pythia's (`step{N}`, N the zoo checkpoint's step) or OLMo's
(`step{N}-tokens{X}B`, X the zoo's own token count in billions), with `main` on the last one, so
`scan_cache_dir` and `from_pretrained(name, revision=..., local_files_only=True)` read it as they
would a downloaded model. Pythia names carry tokens only for a model named like Pythia
(core/model/refs.py: parse_revision), and then N x 2,097,152 tokens, not the zoo's own count.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from decimal import Decimal
from pathlib import Path

import huggingface_hub.constants as hub_constants
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils.sha import git_hash

from core.choices import REVISION_STYLES
from core.errors import HeadLabError
from core.model.refs import ModelRef, checkpoint_path, parse_revision, read_manifest

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
LFS_MIN_BYTES = 10 * 2**20  # the hub stores files this large through LFS whatever their name


def hub_revision(step: int, tokens: int, style: str = "pythia") -> str:
    """The hub branch name of a checkpoint: Pythia `step{N}`, or OLMo `step{N}-tokens{X}B` (X exact)."""
    if style == "pythia":
        return f"step{int(step)}"
    if style == "olmo":
        billions = format(Decimal(int(tokens)).scaleb(-9).normalize(), "f")  # 2048 -> 0.000002048
        return f"step{int(step)}-tokens{billions}B"
    raise HeadLabError(f"revision style {style!r} is unknown; use one of {', '.join(REVISION_STYLES)}.")


def file_etag(path: Path) -> str:
    """The name hf_hub_download gives a file's blob: sha256 of an LFS file, else its git blob sha1."""
    if path.suffix in LFS_SUFFIXES or path.stat().st_size >= LFS_MIN_BYTES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(2**20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    return git_hash(path.read_bytes())


def write_hub_cache(model: str, repo_id: str, cache_dir: str | Path | None = None,
                    style: str = "pythia") -> dict:
    """Write zoo model `model`'s checkpoints into the hub cache as repo `repo_id`; returns a record.

    cache_dir: the hub cache (default huggingface_hub's HF_HUB_CACHE, i.e. $HF_HOME/hub). Blobs
    are content-addressed and commits derive from the files, so writing twice changes nothing.
    The record: repo_id, model, cache_dir, and per checkpoint its zoo revision, hub revision,
    commit, step and the tokens HeadLab will read from the hub revision name.
    """
    if style not in REVISION_STYLES:
        raise HeadLabError(f"revision style {style!r} is unknown; use one of {', '.join(REVISION_STYLES)}.")
    if style == "pythia" and "pythia" not in repo_id.lower():
        raise HeadLabError(
            f"hub name {repo_id!r} has no 'pythia' in it, so its step{{N}} revisions would carry no "
            "token counts (N x 2,097,152 tokens is Pythia's batch); name it like ORG/pythia-NAME or "
            "write OLMo-style revisions (--revision-names olmo)."
        )
    ref = ModelRef(model, "zoo")
    checkpoints = sorted(read_manifest(model)["checkpoints"], key=lambda c: (c["tokens"], c["step"]))
    cache = Path(cache_dir if cache_dir is not None else hub_constants.HF_HUB_CACHE).expanduser()
    try:
        storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    except ValueError as exc:  # huggingface_hub's HFValidationError
        raise HeadLabError(f"{repo_id!r} is not a hub name like ORG/NAME ({exc}).") from None
    written = []
    for checkpoint in checkpoints:
        revision = hub_revision(checkpoint["step"], checkpoint["tokens"], style)
        commit = _write_snapshot(storage, Path(checkpoint_path(ref, checkpoint["revision"])))
        _write_ref(storage, revision, commit)
        step, tokens = parse_revision(repo_id, revision)
        written.append({"zoo_revision": checkpoint["revision"], "revision": revision, "commit": commit,
                        "step": step, "tokens": tokens})
    if not written:
        raise HeadLabError(f"zoo model {model} has no checkpoints to write.")
    _write_ref(storage, "main", written[-1]["commit"])
    return {"repo_id": repo_id, "model": model, "cache_dir": str(cache), "repo_folder": str(storage),
            "revision_style": style, "checkpoints": written}


def _write_snapshot(storage: Path, folder: Path) -> str:
    """Blobs and a snapshot of every file in `folder`; returns the snapshot's commit hash.

    The commit is the git sha1 of a tree-like listing (file name and blob etag per line): the same
    files always give the same commit, different files a different one.
    """
    files = sorted(p for p in folder.iterdir() if p.is_file())
    etags = {p.name: file_etag(p) for p in files}
    commit = git_hash("".join(f"{name} {etag}\n" for name, etag in etags.items()).encode())
    blobs = storage / "blobs"
    snapshot = storage / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in files:
        blob = blobs / etags[path.name]
        if not blob.is_file():
            _atomic_write_bytes(blob, path.read_bytes())
        pointer = snapshot / path.name
        if pointer.is_symlink() or pointer.exists():
            pointer.unlink()
        os.symlink(os.path.relpath(blob, snapshot), pointer)  # relative, as hf_hub_download links
    return commit


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<revision> holding the commit hash, written atomically as huggingface_hub does."""
    path = storage / "refs" / revision
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, path)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.incomplete")
    tmp.write_bytes(data)
    os.replace(tmp, path)
