"""Tiny random-init Hugging Face models saved to disk, for loading tests.

Each builder makes a model of one family small enough to boot in well under a second, saves it
with `save_pretrained` (safetensors) and saves a byte-level tokenizer beside it, so that
TransformerBridge can boot the folder offline exactly as it would a zoo checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_VOCAB = 260  # 256 bytes + BOS, PAD, EOS, SEP (core/tasks/vocab.py layout)
FAMILIES = ("gpt_neox", "gpt_neox_norotary", "llama", "llama_gqa", "olmoe", "hhg", "gemma3")


def tiny_config(family: str):
    """The Hugging Face config of a tiny model of `family` (see FAMILIES)."""
    from transformers import Gemma3TextConfig, GPTNeoXConfig, LlamaConfig, OlmoeConfig

    common = dict(vocab_size=TINY_VOCAB, bos_token_id=256, pad_token_id=257, eos_token_id=258)
    if family in ("gpt_neox", "gpt_neox_norotary"):
        return GPTNeoXConfig(
            num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=128,
            max_position_embeddings=64, rotary_pct=1.0 if family == "gpt_neox" else 0.0,
            use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False, **common,
        )
    if family == "hhg":
        # [HHG] shape: 4 x 4 heads, d_model 128, d_ff 512, GELU, sequential pre-LN, no positions.
        return GPTNeoXConfig(
            num_hidden_layers=4, num_attention_heads=4, hidden_size=128, intermediate_size=512,
            max_position_embeddings=64, rotary_pct=0.0, use_parallel_residual=False,
            hidden_act="gelu", tie_word_embeddings=False, **common,
        )
    if family == "llama":
        return LlamaConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, hidden_size=32,
            intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=False, **common,
        )
    if family == "llama_gqa":
        # grouped-query attention: 8 query heads of size 8 share 2 key/value heads (4 per group)
        return LlamaConfig(
            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, hidden_size=64,
            intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=False, **common,
        )
    if family == "olmoe":
        return OlmoeConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, hidden_size=32,
            intermediate_size=16, num_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, tie_word_embeddings=False, **common,
        )
    if family == "gemma3":
        # Gemma-3's shape in small: 4 query heads share 2 key/value heads, QK-norm, scaled embeddings, pre and
        # post norms, a sliding window of 4 tokens on layer 1 (shorter than the tests' sequences), tied unembedding
        return Gemma3TextConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32,
            intermediate_size=64, max_position_embeddings=64, sliding_window=4, query_pre_attn_scalar=8,
            layer_types=["full_attention", "sliding_attention"], tie_word_embeddings=True, **common,
        )
    raise ValueError(f"unknown tiny family {family!r}; choose from {FAMILIES}")


def tiny_model(family: str, seed: int = 0):
    """A random-init model of `family`, eval mode, eager attention, with non-zero biases."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    # HF initialises biases (and OLMoE's router) to zero; random values make the tests able to
    # catch a dropped or folded bias and a router that ignores its input.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if name.endswith("bias") or name.endswith("gate.weight"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            elif family == "gemma3" and "norm" in name:  # Gemma's norms start at gain 1 (weight 0): make them matter
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model.eval()


def save_byte_tokenizer(path: Path) -> None:
    """Save HeadLab's 260-token byte tokenizer into `path` (what a Llama folder needs to boot)."""
    from core.model.loading import byte_tokenizer

    byte_tokenizer().save_pretrained(str(path))


def save_tiny_model(family: str, path: Path, seed: int = 0, tokenizer: bool = True) -> Path:
    """Save a tiny random-init model of `family` (and a tokenizer) into `path`; return `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tiny_model(family, seed).save_pretrained(str(path), safe_serialization=True)
    if tokenizer:
        save_byte_tokenizer(path)
    return path


def make_fake_zoo(zoo: Path, name: str, family: str, steps=(0, 10, 100), seed: int = 0) -> Path:
    """A zoo model folder: manifest.json plus one saved checkpoint per step; returns the folder."""
    folder = Path(zoo) / name
    checkpoints = []
    for i, step in enumerate(steps):
        revision = f"step{step:06d}"
        save_tiny_model(family, folder / "checkpoints" / revision, seed=seed + i)
        checkpoints.append({"revision": revision, "step": step, "tokens": step * 2048})
    manifest = {
        "name": name, "family": family, "task": "induction",
        "config": tiny_config(family).to_dict(), "checkpoints": checkpoints,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder
