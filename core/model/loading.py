"""Loading a checkpoint through TransformerLens with raw weights, after checking it can load.

`load_model` boots a TransformerLens `TransformerBridge` over the Hugging Face model with *raw*
weights (no LayerNorm folding, no value-bias folding), so the hooks and W_O views of
core/model/hooks.py read the model's own computation (METHODS.md, Step 1 pitfall). Before any
weight is read, the config alone gives a memory estimate (core/model/memory.py; refused when the
model cannot fit) and local safetensors files are checked for truncation, so a user gets a
sentence naming the problem; local weights that do not match their config.json (a missing layer, an
extra one, another shape) are refused after loading, naming the tensors. Error messages offer to
delete only a zoo model's own folder (refs.repair_hint), never a folder the user handed in.
Which model and checkpoint is core/model/refs.py.

Nothing is cached here: the app caches loaded models with st.cache_resource.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Iterator

import huggingface_hub.constants as hub_constants
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from core.choices import DEFAULT_DTYPE, DTYPE_NAMES, check_device
from core.errors import HeadLabError
from core.model.memory import check_fits_in_memory
from core.model.refs import ModelRef, checkpoint_path, repair_hint, require_cached
from core.tasks.tokens import check_tokenizer_files

# The precisions a model can be loaded in (--dtype). Statistics are accumulated in float32 whatever
# the model's dtype (core/probe.py, core/ablation/), so only the forward pass runs in half precision.
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# ----------------------------------------------------------------------------- precision


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a precision name ("float32", "bfloat16", "float16") or of a torch dtype.

    Raises HeadLabError naming the choices for anything else (e.g. "fp16" or torch.float64).
    """
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise HeadLabError(f"unknown dtype {str(dtype)!r}; use one of {', '.join(DTYPES)}.")


def dtype_name(dtype: str | torch.dtype) -> str:
    """The precision's name as cache keys and provenance record it: "float32", "bfloat16" or "float16"."""
    torch_dtype = parse_dtype(dtype)
    return next(name for name, value in DTYPES.items() if value == torch_dtype)


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of a CPU that multiplies bfloat16 in hardware
BF16_HINT_MIN_HEADS = 100  # the real models (SmolLM2 270 heads, Gemma-3 72 x head_dim 256) and up; zoo models stay quiet


def cpu_has_native_bfloat16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AMX or AVX512-BF16): where `--dtype bfloat16` pays.

    cpuinfo: the text of /proc/cpuinfo (read when None; no such file, e.g. macOS, reads as no)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def bfloat16_hint(dtype: str, device: str, n_heads_total: int, d_model: int, cpuinfo: str | None = None) -> str | None:
    """One line suggesting `--dtype bfloat16` for a screen in float32 on a CPU with native bfloat16 and a model of at
    least BF16_HINT_MIN_HEADS heads or d_model 512 (None otherwise). Not a default: bfloat16 is safe for ranking heads
    (docs/performance.md), not for ablation deltas or patching scores, and it changes the cache key."""
    large = n_heads_total >= BF16_HINT_MIN_HEADS or d_model >= 512
    if dtype_name(dtype) != "float32" or not str(device).startswith("cpu") or not large:
        return None
    if not cpu_has_native_bfloat16(cpuinfo):
        return None
    return ("this CPU computes bfloat16 in hardware: --dtype bfloat16 ran the real models' forward 2.5-3x faster with "
            "the same top heads by every probe statistic (docs/performance.md, 'bfloat16 on the real models'); keep "
            "float32 for ablate and patch.")


# ----------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _offline(active: bool) -> Iterator[None]:
    """Forbid hub access while reading a local folder, then restore the previous settings."""
    if not active:
        yield
        return
    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    saved_flag = hub_constants.HF_HUB_OFFLINE  # read once at import; the env alone is too late
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _no_hf_progress_bars() -> Iterator[None]:
    """transformers' own bars off for one load ("Loading weights: 100%" once per checkpoint, 30 lines
    for a screen, buried HeadLab's output); HeadLab's bars stay; the setting is restored after."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def load_config(ref: ModelRef, revision: str | None = None) -> Any:
    """The checkpoint's Hugging Face config only (config.json; no weights are read)."""
    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    if local and not (Path(source) / "config.json").is_file():
        raise HeadLabError(
            f"{Path(source) / 'config.json'} is missing, so {source} is not a loadable checkpoint; "
            f"{repair_hint(source)}."
        )
    if not local:
        require_cached(ref.name, revision)  # offline: a clear sentence, not transformers' OSError
    try:
        with _offline(local):
            return AutoConfig.from_pretrained(str(source), revision=None if local else revision)
    except Exception as exc:
        if local:
            raise HeadLabError(
                f"cannot read the config {Path(source) / 'config.json'} ({type(exc).__name__}); {repair_hint(source)}."
            ) from None
        raise HeadLabError(
            f"cannot read the config of hub model {source} at {revision or 'main'} ({type(exc).__name__}); "
            "check the name and the revision."
        ) from None


def verify_safetensors_folder(folder: Path) -> list[Path]:
    """Check every weight file's safetensors header and length without reading tensors.

    Returns the weight files. Raises HeadLabError naming the first missing, truncated or corrupt
    file. Pickled weights (pytorch_model.bin) are refused: HeadLab never unpickles local files.
    """
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise _corrupt(index, folder) from None
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.glob("*.bin"))
        what = f"only pickled weights ({', '.join(pickled)})" if pickled else "no weight files"
        raise HeadLabError(f"checkpoint folder {folder} has {what}; {repair_hint(folder)}.")
    for path in files:
        if not path.is_file():
            raise HeadLabError(f"weight file {path} is missing; {repair_hint(folder)}.")
        _check_safetensors_file(path, folder)
    return files


def _check_safetensors_file(path: Path, folder: Path) -> None:
    """Header parses and the file is at least as long as its last tensor's end offset."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len > size - 8:
                raise ValueError("header longer than file")
            header = json.loads(handle.read(header_len))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError, AttributeError):
        raise _corrupt(path, folder) from None
    if 8 + header_len + max(ends, default=0) > size:
        raise _corrupt(path, folder)


def _corrupt(path: Path, folder: Path) -> HeadLabError:
    return HeadLabError(f"weight file {path} is corrupt or truncated; {repair_hint(folder)}.")


def load_hf_model(ref: ModelRef, revision: str | None = None, device: str = "cpu",
                  dtype: str | torch.dtype = DEFAULT_DTYPE) -> Any:
    """The Hugging Face causal LM at a checkpoint: eager attention, eval mode, on `device` in `dtype`.

    dtype: "float32" (default), "bfloat16" or "float16" (what the reference probe ran in on GPUs).
    Half precision also runs on the CPU (torch >= 2.1 has CPU kernels for every op these models
    use), just without a speed-up there. The memory estimate (from the config alone, at the
    dtype's size) runs before any weight is read; local weight files are checked for truncation
    first so the user gets a message naming the file.
    """
    torch_dtype = parse_dtype(dtype)
    device = check_device(device)
    config = load_config(ref, revision)
    check_fits_in_memory(config, device=device, dtype=torch_dtype)
    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    if local:
        verify_safetensors_folder(Path(source))
    kwargs: dict[str, Any] = {"attn_implementation": "eager", "dtype": torch_dtype}
    if local:  # mismatches come back in the loading info (and are refused below) instead of a RuntimeError
        kwargs.update(use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True)
    else:
        kwargs["revision"] = revision
    try:
        with _offline(local), _no_hf_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(str(source), **kwargs)
    except Exception as exc:
        if local:
            raise HeadLabError(
                f"cannot load the weights in {source} ({type(exc).__name__}: {str(exc)[:200]}); "
                f"{repair_hint(source)}."
            ) from None
        raise HeadLabError(
            f"cannot load hub model {source} at {revision or 'main'} ({type(exc).__name__}); "
            "check the name, the revision and the network."
        ) from None
    if local:
        model, info = model
        _refuse_mismatched_weights(info, Path(source))
    return model.to(device).eval()


def _refuse_mismatched_weights(info: dict, folder: Path) -> None:
    """Refuse weights that do not fit the config, naming the tensors.

    Left alone, transformers initialises missing tensors at random and drops unexpected ones with
    only a log line: a config.json saying 4 layers over weights holding 3 would give statistics of
    a random layer. info: from_pretrained's loading info (missing, unexpected, mismatched keys).
    """
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensors the config asks for are not in the weights ({_first(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensors in the weights have no place in the config ({_first(unexpected)})")
    if mismatched:
        shapes = [f"{key} is {tuple(saved)} in the weights but {tuple(wanted)} in the config"
                  for key, saved, wanted in mismatched]
        problems.append(f"{len(mismatched)} tensors have another shape ({_first(shapes)})")
    if problems:
        raise HeadLabError(
            f"the weights in {folder} do not match its config.json: {'; '.join(problems)}; make config.json "
            f"describe these weights (e.g. num_hidden_layers) or {repair_hint(folder)}."
        )


def _first(items: list[str], shown: int = 3) -> str:
    return ", ".join(items[:shown]) + (f", ... ({len(items)} in all)" if len(items) > shown else "")


def load_model(ref: ModelRef, revision: str | None = None, device: str = "cpu",
               dtype: str | torch.dtype = DEFAULT_DTYPE) -> Any:
    """A TransformerBridge over the checkpoint's HF model with raw (unprocessed) weights, eval mode.

    Booted as `TransformerBridge.boot_transformers(path, hf_model=hf, device=device, dtype=dtype,
    tokenizer=..., revision=...)`; the bridge does no weight processing unless
    `enable_compatibility_mode()` is called, which HeadLab never does. A folder without a
    tokenizer gets the 260-token byte tokenizer (HeadLab feeds token ids; it is only for display).
    dtype: the precision of the weights and the forward pass (see load_hf_model).
    """
    hf_model = load_hf_model(ref, revision, device, dtype)
    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    tokenizer = None
    if local:
        check_tokenizer_files(Path(source))  # tokenizer_config.json without tokenizer.json: say so
    if local and not any((Path(source) / f).is_file() for f in _TOKENIZER_FILES):
        tokenizer = byte_tokenizer(add_bos=True)
    try:
        with _offline(local):
            bridge = TransformerBridge.boot_transformers(
                str(source), hf_model=hf_model, device=device, dtype=parse_dtype(dtype), tokenizer=tokenizer,
                revision=None if local else revision,
            )
    except Exception as exc:
        raise HeadLabError(
            f"TransformerLens cannot wrap {source} ({type(exc).__name__}: {str(exc)[:200]}); "
            "use a supported architecture (GPT-NeoX, Llama, OLMo, OLMoE, ...)."
        ) from None
    return bridge.eval()


def byte_tokenizer(add_bos: bool = False) -> Any:
    """A tokenizer over HeadLab's 260-token byte vocabulary (bytes 0-255, BOS 256, PAD 257, EOS
    258, SEP 259 as in core/tasks/vocab.py): each byte of the UTF-8 text is one token.

    `add_bos` prepends BOS, as zoo text windows start with it. The name_or_path is set because
    TransformerLens reads it from any tokenizer handed to boot_transformers.
    """
    byte_chars = _bytes_to_unicode()  # byte -> printable char, as ByteLevel pre-tokenization emits
    vocab = {byte_chars[b]: b for b in range(256)}
    vocab.update({"<bos>": 256, "<pad>": 257, "<eos>": 258, "<sep>": 259})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", eos_token="<eos>",
        sep_token="<sep>", unk_token="<pad>", add_bos_token=add_bos,
        name_or_path="headlab-byte-vocab",
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (what ByteLevel emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
