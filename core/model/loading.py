"""Which model, which checkpoint, and loading it through TransformerLens with raw weights.

A model is named by a `ModelRef`: a zoo model trained by HeadLab (`$HEADLAB_HOME/zoo/<name>/`), a
local Hugging Face folder, or a Hugging Face hub name. Each has training checkpoints
(`Checkpoint`: revision, step, tokens seen). `load_model` boots a TransformerLens
`TransformerBridge` over the Hugging Face model with *raw* weights (no LayerNorm folding, no
value-bias folding), so `blocks.{l}.attn.hook_z` is exactly the input of the model's own output
projection and `hook_z[..., h, :] @ head_output_weights(model)[l, h]`, summed over heads plus
`output_bias(model, l)`, is the attention output (METHODS.md, Step 1 pitfall).

Nothing is cached here: the app caches loaded models with st.cache_resource.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterator

import torch

from core.errors import HeadLabError
from core.workspace import zoo_dir

KINDS = ("zoo", "local", "hub")
PYTHIA_TOKENS_PER_STEP = 2_097_152  # 1024 sequences x 2048 tokens per Pythia optimizer step
UNKNOWN_TOKENS = -1  # a checkpoint whose token count is not known (a bare local folder)
ACTIVATION_MARGIN_BYTES = 256 * 2**20  # room for one probe chunk's activations
MEMORY_OVERHEAD = 1.3  # allocator slack, buffers, the bridge's wrappers
RETRAIN_HINT = "python -m core zoo --preset quick"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")
_PYTHIA_REVISION = re.compile(r"^step(\d+)$")
_OLMO_REVISION = re.compile(r"^step(\d+)-tokens(\d+(?:\.\d+)?)B$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Families whose MLP is up -> act -> down (two matrices); all others are assumed gated (three).
_UNGATED_FAMILIES = {"gpt_neox", "gpt2", "gptj", "gpt_neo", "opt", "bloom", "falcon", "phi"}


# ----------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ModelRef:
    """A model: `kind` "zoo" (name under zoo_dir()), "local" (absolute folder) or "hub" (org/name)."""

    name: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ModelRef.kind must be one of {KINDS}, got {self.kind!r}")

    @staticmethod
    def parse(text: str) -> "ModelRef":
        """Read a model the way a user types it: a folder path, a zoo name, or org/model."""
        text = str(text).strip()
        if text and Path(text).expanduser().is_dir():
            return ModelRef(str(Path(text).expanduser().resolve()), "local")
        zoo = list_zoo()
        if text in zoo:
            return ModelRef(text, "zoo")
        if _HUB_NAME.match(text):
            return ModelRef(text, "hub")
        names = ", ".join(zoo) if zoo else f"none yet (run {RETRAIN_HINT})"
        raise HeadLabError(
            f"unknown model {text!r}; zoo models: {names}; or give a local Hugging Face folder "
            "or a hub name like EleutherAI/pythia-160m."
        )

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind}

    @staticmethod
    def from_json(obj: dict) -> "ModelRef":
        return ModelRef(str(obj["name"]), str(obj["kind"]))

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Checkpoint:
    """One training checkpoint: its revision name, optimizer step and tokens seen (-1: unknown)."""

    revision: str
    step: int
    tokens: int

    def to_json(self) -> dict:
        return {"revision": self.revision, "step": self.step, "tokens": self.tokens}

    @staticmethod
    def from_json(obj: dict) -> "Checkpoint":
        return Checkpoint(str(obj["revision"]), int(obj["step"]), int(obj["tokens"]))


def list_zoo() -> list[str]:
    """Names of the zoo models present (folders under zoo_dir() holding a manifest.json)."""
    return sorted(p.name for p in zoo_dir().iterdir() if (p / "manifest.json").is_file())


def read_manifest(name: str) -> dict:
    """The manifest of zoo model `name` as a dict; HeadLabError when missing or unreadable."""
    path = zoo_dir() / name / "manifest.json"
    if not path.is_file():
        names = ", ".join(list_zoo()) or f"none yet (run {RETRAIN_HINT})"
        raise HeadLabError(f"unknown zoo model {name!r}; zoo models: {names}.")
    return _manifest_at(path)


def _manifest_at(path: Path) -> dict:
    """A manifest.json, checked to list checkpoints; HeadLabError when it cannot be read."""
    try:
        manifest = json.loads(path.read_text())
        manifest["checkpoints"] = [Checkpoint.from_json(c).to_json() for c in manifest["checkpoints"]]
        return manifest
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeadLabError(
            f"manifest {path} is unreadable ({type(exc).__name__}: {exc}); delete the model "
            f"folder {path.parent} and retrain it (e.g. {RETRAIN_HINT})."
        ) from None


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


def list_checkpoints(ref: ModelRef) -> list[Checkpoint]:
    """The model's checkpoints sorted by tokens seen; HeadLabError when there are none."""
    if ref.kind == "zoo":
        checkpoints = _read_manifest(zoo_dir() / ref.name / "manifest.json")
    elif ref.kind == "local":
        folder = Path(ref.name)
        if (folder / "manifest.json").is_file():
            checkpoints = _read_manifest(folder / "manifest.json")
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


def _read_manifest(path: Path) -> list[Checkpoint]:
    """Checkpoints listed in a manifest.json."""
    return [Checkpoint.from_json(c) for c in _manifest_at(path)["checkpoints"]]


def _hub_checkpoints(name: str) -> list[Checkpoint]:
    """Checkpoints from the hub's branch names (needs the network)."""
    from huggingface_hub import list_repo_refs

    try:
        refs = list_repo_refs(name)
    except Exception as exc:  # offline, unknown repo, gated repo, network error
        raise HeadLabError(
            f"cannot list the revisions of hub model {name} ({type(exc).__name__}); check the "
            "name and the network, or use a zoo model or a local folder."
        ) from None
    checkpoints = []
    for branch in refs.branches:
        parsed = parse_revision(name, branch.name)
        if parsed is not None:
            checkpoints.append(Checkpoint(branch.name, parsed[0], parsed[1]))
    return checkpoints


def resolve_checkpoint(ref: ModelRef, revision: str | None = None) -> Checkpoint:
    """The checkpoint named `revision`, or the last one (most tokens) when revision is None."""
    if ref.kind == "hub" and revision is not None:
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
    if checkpoint.revision == "main" and not (root / "manifest.json").is_file():
        return root
    folder = root / "checkpoints" / checkpoint.revision
    if not folder.is_dir():
        raise HeadLabError(
            f"checkpoint folder {folder} is missing; delete {root} and retrain the model "
            f"(e.g. {RETRAIN_HINT})."
        )
    return folder


# ----------------------------------------------------------------------------- memory


def family_of(hf_config: Any) -> str:
    """The model family from a Hugging Face config: "gpt_neox", "llama", "olmoe", ... (model_type)."""
    return str(getattr(hf_config, "model_type", "") or "unknown")


def estimate_parameter_count(config: Any) -> int:
    """Parameters of a decoder-only transformer, from its config alone (no weights).

    embeddings (+ untied unembedding) + per layer: Q, K, V, O (grouped K/V counted), the MLP
    (2 matrices, or 3 when gated; times the expert count for mixtures plus the router), norms.
    """
    text = getattr(config, "text_config", None) or config
    d_model = int(text.hidden_size)
    vocab = int(text.vocab_size)
    n_layers = int(text.num_hidden_layers)
    n_heads = int(text.num_attention_heads)
    n_kv = int(getattr(text, "num_key_value_heads", None) or n_heads)
    d_head = int(getattr(text, "head_dim", None) or d_model // n_heads)
    d_mlp = int(getattr(text, "intermediate_size", None) or 4 * d_model)
    n_experts = int(getattr(text, "num_experts", None) or getattr(text, "num_local_experts", 0) or 0)
    gated = family_of(text) not in _UNGATED_FAMILIES
    embed = vocab * d_model * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    attn = 2 * d_model * n_heads * d_head + 2 * d_model * n_kv * d_head
    mlp = (3 if gated else 2) * d_model * d_mlp
    if n_experts:
        mlp = mlp * n_experts + n_experts * d_model
    norms = 4 * d_model
    return embed + n_layers * (attn + mlp + norms) + 2 * d_model


def estimate_memory_bytes(config: Any, dtype: torch.dtype = torch.float32) -> int:
    """Bytes needed to hold and run the model: parameters x dtype size x 1.3 + activation margin."""
    bytes_per = torch.empty((), dtype=dtype).element_size()
    return int(estimate_parameter_count(config) * bytes_per * MEMORY_OVERHEAD) + ACTIVATION_MARGIN_BYTES


def available_memory_bytes(device: str = "cpu") -> int:
    """Free memory on `device`: CUDA free memory, else psutil, else /proc/meminfo MemAvailable."""
    if str(device).startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    raise HeadLabError("cannot read the available memory; install psutil.")


def check_fits_in_memory(
    config: Any, available_bytes: int | None = None, device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> int:
    """Refuse (HeadLabError) a model that would not fit; returns the estimate in bytes."""
    need = estimate_memory_bytes(config, dtype)
    have = available_memory_bytes(device) if available_bytes is None else int(available_bytes)
    if need > have:
        raise HeadLabError(
            f"model needs ~{need / 1e9:.2f} GB, only {have / 1e9:.2f} GB available; "
            "pick a smaller model or a machine with more memory."
        )
    return need


# ----------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _offline(active: bool) -> Iterator[None]:
    """Forbid hub access while reading a local folder, then restore the previous settings."""
    if not active:
        yield
        return
    import huggingface_hub.constants as hub_constants

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


def load_config(ref: ModelRef, revision: str | None = None) -> Any:
    """The checkpoint's Hugging Face config only (config.json; no weights are read)."""
    from transformers import AutoConfig

    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    if local and not (Path(source) / "config.json").is_file():
        raise HeadLabError(
            f"{Path(source) / 'config.json'} is missing; delete the checkpoint folder {source} "
            f"and retrain or re-save it (e.g. {RETRAIN_HINT})."
        )
    try:
        with _offline(local):
            return AutoConfig.from_pretrained(str(source), revision=None if local else revision)
    except Exception as exc:
        where = Path(source) / "config.json" if local else f"hub model {source} at {revision or 'main'}"
        raise HeadLabError(
            f"cannot read the config of {where} ({type(exc).__name__}); check the name and "
            f"revision, or delete and retrain a corrupt local checkpoint (e.g. {RETRAIN_HINT})."
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
        raise HeadLabError(
            f"checkpoint folder {folder} has {what}; save it with save_pretrained "
            f"(safetensors) or delete and retrain it (e.g. {RETRAIN_HINT})."
        )
    for path in files:
        if not path.is_file():
            raise HeadLabError(
                f"weight file {path} is missing; delete the checkpoint folder {folder} and "
                f"retrain it (e.g. {RETRAIN_HINT})."
            )
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
    return HeadLabError(
        f"weight file {path} is corrupt or truncated; delete the checkpoint folder {folder} and "
        f"retrain it (e.g. {RETRAIN_HINT})."
    )


def load_hf_model(ref: ModelRef, revision: str | None = None, device: str = "cpu") -> Any:
    """The Hugging Face causal LM at a checkpoint: fp32, eager attention, eval mode, on `device`.

    The memory estimate (from the config alone) runs before any weight is read; local weight files
    are checked for truncation first so the user gets a message naming the file.
    """
    from transformers import AutoModelForCausalLM

    device = _check_device(device)
    config = load_config(ref, revision)
    check_fits_in_memory(config, device=device)
    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    if local:
        verify_safetensors_folder(Path(source))
    kwargs: dict[str, Any] = {"attn_implementation": "eager", "dtype": torch.float32}
    if local:
        kwargs["use_safetensors"] = True
    else:
        kwargs["revision"] = revision
    try:
        with _offline(local):
            model = AutoModelForCausalLM.from_pretrained(str(source), **kwargs)
    except Exception as exc:
        if local:
            raise HeadLabError(
                f"cannot load the weights in {source} ({type(exc).__name__}: {str(exc)[:200]}); "
                f"delete the checkpoint folder and retrain it (e.g. {RETRAIN_HINT})."
            ) from None
        raise HeadLabError(
            f"cannot load hub model {source} at {revision or 'main'} ({type(exc).__name__}); "
            "check the name, the revision and the network."
        ) from None
    return model.to(device).eval()


def load_model(ref: ModelRef, revision: str | None = None, device: str = "cpu") -> Any:
    """A TransformerBridge over the checkpoint's HF model with raw (unprocessed) weights, eval mode.

    Booted as `TransformerBridge.boot_transformers(path, hf_model=hf, device=device,
    tokenizer=..., revision=...)`; the bridge does no weight processing unless
    `enable_compatibility_mode()` is called, which HeadLab never does. A folder without a
    tokenizer gets the 260-token byte tokenizer (HeadLab feeds token ids; it is only for display).
    """
    from transformer_lens.model_bridge import TransformerBridge

    hf_model = load_hf_model(ref, revision, device)
    source = checkpoint_path(ref, revision)
    local = ref.kind != "hub"
    tokenizer = None
    if local and not any((Path(source) / f).is_file() for f in _TOKENIZER_FILES):
        tokenizer = byte_tokenizer(add_bos=True)
    try:
        with _offline(local):
            bridge = TransformerBridge.boot_transformers(
                str(source), hf_model=hf_model, device=device, tokenizer=tokenizer,
                revision=None if local else revision,
            )
    except Exception as exc:
        raise HeadLabError(
            f"TransformerLens cannot wrap {source} ({type(exc).__name__}: {str(exc)[:200]}); "
            "use a supported architecture (GPT-NeoX, Llama, OLMo, OLMoE, ...)."
        ) from None
    return bridge.eval()


def _check_device(device: str) -> str:
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HeadLabError(f"device {device!r} was asked for but no CUDA GPU is present; use cpu.")
    if not (device == "cpu" or device.startswith("cuda") or device == "mps"):
        raise HeadLabError(f"unknown device {device!r}; use cpu or cuda.")
    return device


def byte_tokenizer(add_bos: bool = False) -> Any:
    """A tokenizer over HeadLab's 260-token byte vocabulary (bytes 0-255, BOS 256, PAD 257, EOS
    258, SEP 259 as in core/tasks/vocab.py): each byte of the UTF-8 text is one token.

    `add_bos` prepends BOS, as zoo text windows start with it. The name_or_path is set because
    TransformerLens reads it from any tokenizer handed to boot_transformers.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

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


# ----------------------------------------------------------------------------- shapes, weights


def model_shape(model: Any) -> tuple[int, int, int]:
    """(n_layers, n_heads, d_head) of a loaded bridge."""
    return int(model.cfg.n_layers), int(model.cfg.n_heads), int(model.cfg.d_head)


def _output_projection(model: Any, layer: int) -> torch.nn.Module:
    """The HF module that maps the concatenated head outputs (hook_z) to the residual stream."""
    return model.blocks[layer].attn.o.original_component


def head_output_weights(model: Any) -> torch.Tensor:
    """W_O slices: [layer, head, d_head, d_model], laid out so that
    `einsum("...hd,hdm->...m", hook_z, W[l])` + output_bias == the attention output.

    Read from the HF output projection (an nn.Linear, weight [d_model, head * d_head]): hook_z is
    the projection's input split head-major, so head h owns input columns h*d_head:(h+1)*d_head.
    """
    n_layers, n_heads, d_head = model_shape(model)
    slices = []
    for layer in range(n_layers):
        proj = _output_projection(model, layer)
        if isinstance(proj, torch.nn.Linear):
            weight = proj.weight.detach().T  # [head * d_head, d_model]
        else:  # GPT-2 style Conv1D stores [in, out] already
            weight = proj.weight.detach()
        if weight.shape[0] != n_heads * d_head:
            raise HeadLabError(
                f"layer {layer}'s output projection has {weight.shape[0]} inputs, not "
                f"{n_heads} heads x {d_head}; this architecture is not supported."
            )
        slices.append(weight.reshape(n_heads, d_head, weight.shape[1]))
    return torch.stack(slices)  # [layer, head, d_head, d_model]


def output_bias(model: Any, layer: int) -> torch.Tensor | None:
    """The output projection's bias [d_model] at `layer`, or None (Llama, OLMoE have none)."""
    bias = getattr(_output_projection(model, layer), "bias", None)
    return None if bias is None else bias.detach()


def router_logit_hooks(model: Any) -> dict[int, str]:
    """MoE layers -> the hook holding that layer's router logits, [batch * pos, n_experts].

    The rows are the flattened (batch, pos) tokens in row-major order: reshape to
    [batch, pos, n_experts] and softmax over the last axis for the router weights. Empty for dense
    models. (`blocks.{l}.mlp.hook_expert_weights` holds only the top-k weights, zeros elsewhere.)
    """
    hooks = {}
    for layer in range(int(model.cfg.n_layers)):
        name = f"blocks.{layer}.mlp.gate.hook_out"
        if name in model.hook_dict and f"blocks.{layer}.mlp.hook_expert_indices" in model.hook_dict:
            hooks[layer] = name
    return hooks


# ----------------------------------------------------------------------------- command line


def add_models_arguments(parser: Any) -> None:
    """`python -m core models [MODEL]`: list the zoo, or one model's checkpoints."""
    parser.add_argument("model", nargs="?", default=None,
                        help="a zoo name, a local Hugging Face folder or a hub name; omit to list the zoo")


def cli_models(args: Any) -> dict:
    """Print the zoo (no model given) or the model's checkpoints with their token counts."""
    if args.model is None:
        rows = []
        for name in list_zoo():
            manifest = read_manifest(name)
            rows.append({"name": name, "family": manifest.get("family"), "task": manifest.get("task"),
                         "checkpoints": len(manifest["checkpoints"]),
                         "complete": manifest.get("complete")})
            print(f"{name:24s} {str(rows[-1]['family']):10s} {str(rows[-1]['task']):12s} "
                  f"{rows[-1]['checkpoints']:4d} checkpoints")
        if not rows:
            print(f"the zoo at {zoo_dir()} is empty; train it with {RETRAIN_HINT}")
        return {"zoo": str(zoo_dir()), "models": rows}
    ref = ModelRef.parse(args.model)
    checkpoints = list_checkpoints(ref)
    for c in checkpoints:
        tokens = "unknown" if c.tokens < 0 else f"{c.tokens:,}"
        print(f"{c.revision:28s} step {c.step:>9,}  tokens {tokens}")
    return {"model": ref.to_json(), "checkpoints": [c.to_json() for c in checkpoints]}
