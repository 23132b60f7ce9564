"""The ablation engine's cuts on the two real models' architectures, at tiny random sizes.

SmolLM2 is a Llama with grouped-query attention; Gemma-3 adds QK-norm, sliding-window layers
(their own mask and rotary base), scaled embeddings and norms before and after each sublayer. The
engine replays blocks from a recorded clean run (prefix reuse) and runs the last block's MLP at the
query rows only; both must give what full forwards give, and a zero ablation must equal the Hugging
Face model with that query head's o_proj columns zeroed (an independent computation).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from core.ablation.clean_run import CleanRuns
from core.ablation.engine import run_conditions
from core.ablation.spec import Ablation
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.stats.metrics import query_metrics
from tests.tiny_models import TINY_VOCAB, save_byte_tokenizer, save_tiny_model

METRICS = ("loss", "target_logit", "top1", "top5")


def tiny_gemma3_config() -> Gemma3TextConfig:
    """3 layers (sliding, sliding, full) x 4 query heads sharing 2 key/value heads, head_dim 8, window 4."""
    return Gemma3TextConfig(
        vocab_size=TINY_VOCAB, bos_token_id=256, pad_token_id=257, eos_token_id=258, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32, intermediate_size=64,
        max_position_embeddings=64, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], query_pre_attn_scalar=8,
        tie_word_embeddings=True)


def save_tiny_gemma3(path, seed: int = 3):
    """A random Gemma-3 with random norm weights (zero-initialised ones would hide a skipped norm)."""
    config = tiny_gemma3_config()
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    hf.save_pretrained(path)
    save_byte_tokenizer(path)
    return hf


class _Batch:
    def __init__(self, tokens, query_pos, target):
        self.tokens, self.query_pos, self.target, self.spec = tokens, query_pos, target, {"task": "stand-in"}


def _batch(n: int = 6, seq_len: int = 16, seed: int = 8) -> _Batch:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (n, seq_len), generator=gen)
    return _Batch(tokens, torch.randint(6, seq_len, (n,), generator=gen), torch.randint(0, 256, (n,), generator=gen))


@pytest.fixture(scope="module", params=["gemma3", "llama_gqa"])
def arch(request, tmp_path_factory):
    """(Hugging Face model, its TransformerBridge) of each architecture."""
    folder = tmp_path_factory.mktemp(request.param) / request.param
    if request.param == "gemma3":
        hf = save_tiny_gemma3(folder)
    else:
        save_tiny_model("llama_gqa", folder, seed=5)
        hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return request.param, hf, load_model(ModelRef.parse(str(folder)))


def test_every_cut_equals_full_forwards(arch):
    """Prefix reuse and the last MLP at the query rows are used (their self-checks pass) and match
    one full forward per condition, for every ablation mode, heads and MLPs, the last layer included."""
    _, _, model = arch
    batch = _batch()
    conditions = [
        Ablation(HeadSet(((2 if len(model.blocks) > 2 else 1, 0),))), Ablation(HeadSet(((0, 1), (1, 2))), mode="mean"),
        Ablation(mlp_layers=(1,)), Ablation(HeadSet(((1, 3),)), mode="mean-per-position"),
        Ablation(HeadSet(((1, 1),)), mode="resample", seed=2), Ablation(HeadSet(((0, 0),)), mode="token-wise-mean"),
        Ablation(mlp_layers=(len(model.blocks) - 1,)),
    ]
    notes: list[str] = []
    clean_fast, fast = run_conditions(model, batch, conditions, notes=notes)
    clean_full, full = run_conditions(model, batch, conditions, strategy="full")
    assert any(note.startswith("prefix reuse:") for note in notes), notes
    assert any(note.startswith("the last block's MLP ran at the query positions only") for note in notes), notes
    assert not any("full forward" in note for note in notes), notes
    kept = CleanRuns()
    run_conditions(model, batch, [], clean_runs=kept)
    _, from_kept = run_conditions(model, batch, conditions, clean_runs=kept)
    for a, b, c in zip([clean_fast, *fast], [clean_full, *full], [clean_fast, *from_kept]):
        for metric in ("loss", "target_logit"):
            np.testing.assert_allclose(a.values(metric), b.values(metric), atol=1e-5, rtol=0)
            np.testing.assert_allclose(c.values(metric), b.values(metric), atol=1e-5, rtol=0)
        for metric in ("top1", "top5"):
            np.testing.assert_array_equal(a.values(metric), b.values(metric))


@torch.no_grad()
def test_zero_ablation_equals_zeroed_o_proj_columns(arch):
    """A query head zeroed by the engine = the HF model with that head's o_proj input columns zeroed."""
    name, hf, model = arch
    config = hf.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    batch = _batch(seed=4)
    heads = HeadSet(((1, 1), (len(model.blocks) - 1, 2)))
    _, (got,) = run_conditions(model, batch, [Ablation(heads)])
    saved = {layer: hf.model.layers[layer].self_attn.o_proj.weight.clone() for layer, _ in heads}
    try:
        for layer, head in heads:
            hf.model.layers[layer].self_attn.o_proj.weight[:, head * head_dim:(head + 1) * head_dim] = 0
        logits = hf(batch.tokens).logits  # [row, pos, vocab]
    finally:
        for layer, weight in saved.items():
            hf.model.layers[layer].self_attn.o_proj.weight.copy_(weight)
    rows = torch.arange(batch.tokens.shape[0])
    want = query_metrics(logits[rows, batch.query_pos], batch.target)
    for metric in ("loss", "target_logit"):
        np.testing.assert_allclose(got.values(metric), want[metric].double().numpy(), atol=1e-5, rtol=0, err_msg=name)
    for metric in ("top1", "top5"):
        np.testing.assert_array_equal(got.values(metric), want[metric].double().numpy())
