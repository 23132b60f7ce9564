"""Tiny GGUF files written with the `gguf` package's GGUFWriter, for the import's bad-input and unit tests.

`write_fake_gguf` writes a 1-layer Llama (or another architecture) of float32 tensors, with a 6-token
GPT-2 style tokenizer or none, in milliseconds; `truncated_copy` cuts one short.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

D_MODEL, N_HEADS, N_KV_HEADS, D_FF, N_LAYERS = 8, 2, 1, 16, 1
TOKENS = ["a", "b", "ab", "c", "<s>", "</s>"]  # ids 0..5; "ab" is the one merge; 4 and 5 are BOS and EOS


def write_fake_gguf(path: Path, architecture: str = "llama", tokenizer: bool = True, seed: int = 0) -> Path:
    """A 1-layer model of `architecture` (Llama's tensor names and keys) with float32 weights, seeded."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("fake")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(32)
    writer.add_embedding_length(D_MODEL)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(D_FF)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(TOKENS)
        writer.add_token_types([gguf.TokenType.NORMAL] * 4 + [gguf.TokenType.CONTROL] * 2)
        writer.add_token_merges(["a b"])
        writer.add_bos_token_id(4)
        writer.add_eos_token_id(5)
    vocab, d_head = len(TOKENS), D_MODEL // N_HEADS

    def weight(*shape: int) -> np.ndarray:  # [out, in] as numpy holds it; GGUF stores the dims reversed
        return rng.normal(0.0, 0.3, size=shape).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, D_MODEL))
    for layer in range(N_LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(D_MODEL, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(N_HEADS * d_head, D_MODEL))
        writer.add_tensor(f"{block}.attn_k.weight", weight(N_KV_HEADS * d_head, D_MODEL))
        writer.add_tensor(f"{block}.attn_v.weight", weight(N_KV_HEADS * d_head, D_MODEL))
        writer.add_tensor(f"{block}.attn_output.weight", weight(D_MODEL, N_HEADS * d_head))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(D_MODEL, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(D_FF, D_MODEL))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(D_FF, D_MODEL))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(D_MODEL, D_FF))
    writer.add_tensor("output_norm.weight", np.ones(D_MODEL, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab, D_MODEL))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def truncated_copy(source: Path, path: Path, keep: float = 0.5) -> Path:
    """The first `keep` of `source`'s bytes, as a GGUF cut off mid-download would be."""
    data = Path(source).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])
    return Path(path)
