"""Real model shapes (issue 15): Pythia's published architectures, the GQA zoo model, initial-weight
zoo entries, the token-range induction task with its restricted softmax, and `bench scale`."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from core.bench.scale import bench_scale, bench_selection
from core.errors import HeadLabError
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.tasks import token_repeats
from core.zoo.config import ModelConfig, TrainConfig
from core.zoo.presets import PYTHIA_SHAPES, ZOO_PRESETS, estimate_zoo
from core.zoo.train import build_hf_config, build_model, train_model, training_loss

# Total parameters of the Pythia suite (Biderman et al. 2023, Table 1; untied embeddings).
PUBLISHED_PARAMETERS = {"pythia-70m": 70_426_624, "pythia-160m": 162_322_944, "pythia-1b": 1_011_781_632}


@pytest.mark.parametrize("name", sorted(PYTHIA_SHAPES))
def test_pythia_shapes_are_the_published_architectures(name):
    config = build_hf_config(PYTHIA_SHAPES[name])
    assert config.model_type == "gpt_neox" and config.vocab_size == 50_304
    assert config.use_parallel_residual and not config.tie_word_embeddings
    assert config.rope_parameters["partial_rotary_factor"] == 0.25 and config.max_position_embeddings == 2048
    assert config.intermediate_size == 4 * config.hidden_size
    with torch.device("meta"):  # counts without allocating a billion weights
        model = AutoModelForCausalLM.from_config(config)
    n_parameters = sum(p.numel() for p in model.parameters())
    if name in PUBLISHED_PARAMETERS:
        assert n_parameters == PUBLISHED_PARAMETERS[name]
    else:  # pythia-14m: 6 x 4 heads, d_model 128
        assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size) == (6, 4, 128)


def test_gqa_config_is_validated_and_reaches_the_hf_config():
    cfg = ModelConfig(family="llama", n_layers=2, n_heads=8, n_kv_heads=2, d_model=128, d_ff=256)
    assert build_hf_config(cfg).num_key_value_heads == 2
    assert ZOO_PRESETS["scale"][-1][1].n_kv_heads == 2
    with pytest.raises(HeadLabError, match="multiple of n_kv_heads 3"):
        ModelConfig(family="llama", n_heads=8, n_kv_heads=3, d_model=64)
    with pytest.raises(HeadLabError, match="GPT-NeoX has no grouped-query attention"):
        ModelConfig(family="gpt_neox", n_heads=8, n_kv_heads=2, d_model=64)


def test_restricted_softmax_is_cross_entropy_over_the_first_ids():
    """softmax_vocab=N gives the cross-entropy of the full logits' first N columns, computed by hand."""
    cfg = replace(PYTHIA_SHAPES["pythia-14m"], n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=600)
    model = build_model(cfg, seed=0)
    tokens = torch.randint(100, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = model(tokens).logits[:, :-1, :500]  # [batch, seq-1, 500]
    by_hand = torch.nn.functional.cross_entropy(logits.reshape(-1, 500), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(training_loss(model, cfg, tokens, None, softmax_vocab=500), by_hand)
    full = torch.nn.functional.cross_entropy(model(tokens).logits[:, :-1].reshape(-1, 600), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(training_loss(model, cfg, tokens, None), full)
    assert float(full.detach()) > float(by_hand.detach())  # the 100 unused ids take probability mass


def test_init_only_entry_saves_its_seeded_weights_as_one_checkpoint(tmp_path):
    cfg = replace(PYTHIA_SHAPES["pythia-14m"], d_model=32, d_ff=128, vocab_size=1000)
    init = TrainConfig(task="none", steps=0, repeat_warmup_steps=0, stop_accuracy=None)
    manifest = train_model("shape", cfg, init, tmp_path / "shape", progress=False)
    assert manifest["complete"] and [c["step"] for c in manifest["checkpoints"]] == [0]
    bridge = load_model(ModelRef.parse(str(tmp_path / "shape" / "checkpoints" / "step0000000")))
    expected = build_model(cfg, seed=0).state_dict()["gpt_neox.layers.0.attention.dense.weight"]
    torch.testing.assert_close(bridge.blocks[0].attn.o.original_component.weight, expected)
    with pytest.raises(HeadLabError, match="steps"):
        TrainConfig(task="tokens", steps=0)


def test_token_task_trains_and_reports_probe_figures(tmp_path):
    cfg = replace(PYTHIA_SHAPES["pythia-14m"], n_layers=2, d_model=32, d_ff=64, vocab_size=token_repeats.TOKEN_HIGH)
    train = TrainConfig(task="tokens", steps=5, batch_size=2, seq_len=32, repeat_warmup_steps=2, softmax_vocab=token_repeats.TOKEN_HIGH,
                        stop_accuracy=None, eval_every=2, eval_examples=4, final_examples=4, checkpoint_schedule="pythia")
    manifest = train_model("tok", cfg, train, tmp_path / "tok", progress=False)
    assert [c["step"] for c in manifest["checkpoints"]] == [0, 1, 2, 4, 5]  # Pythia's steps, nothing else
    final = manifest["final"]
    assert final["steps"] == 5 and 0.0 <= final["probe_accuracy"] <= 1.0
    assert len(final["prefix_matching"]) == 2 and len(final["previous_token"][0]) == 4
    assert final["induction_loss"] == pytest.approx(torch.log(torch.tensor(10_000.0)).item(), abs=1.5)  # untrained: near uniform


def test_bench_selection_fits_every_shape():
    for cfg in PYTHIA_SHAPES.values():
        heads = list(bench_selection(cfg.n_layers, cfg.n_heads))
        assert len(set(heads)) == 4 and all(0 <= l < cfg.n_layers and 0 <= h < cfg.n_heads for l, h in heads)


def test_bench_scale_engine_agrees_with_the_naive_loop_at_a_real_shape():
    result = bench_scale(n_examples=2, shape="pythia-14m", n_controls=1, edge_pairs=2, ig_steps=2)
    assert result["vocab"] == 50_304 and result["seq_len"] == 256 and result["n_examples"] == 2
    assert result["ablation_conditions"] == 4  # clean, candidate, one control, upper bound
    assert result["ablation_max_metric_diff"] < 1e-4
    for key in ("instrumented_over_bare", "ablation_speedup", "peak_memory_bytes", "eap_over_forward_backward",
                "eap_ig_over_forward_backward", "eap_over_forward_input_backward"):
        assert result[key] > 0
    assert result["edges"] == 1084 and result["edge_pairs"] == 2 and result["ig_steps"] == 2
    for key in ("eap_peak_over_estimate", "patched_peak_over_estimate"):  # the edge-run estimate bounds its peak
        assert result.get(key, 0.0) <= 1.0


def test_unembedding_can_start_as_a_copy_of_the_embedding(tmp_path):
    cfg = replace(PYTHIA_SHAPES["pythia-14m"], n_layers=1, d_model=32, d_ff=64, vocab_size=token_repeats.TOKEN_HIGH)
    train = TrainConfig(task="tokens", steps=1, batch_size=2, seq_len=32, repeat_warmup_steps=0, stop_accuracy=None,
                        eval_every=1, eval_examples=2, final_examples=2, n_log_checkpoints=2, unembed_init_from_embed=True)
    train_model("aligned", cfg, train, tmp_path / "aligned", progress=False)
    start = AutoModelForCausalLM.from_pretrained(str(tmp_path / "aligned" / "checkpoints" / "step0000000"))
    assert torch.equal(start.get_output_embeddings().weight, start.get_input_embeddings().weight)
    assert start.get_output_embeddings().weight.data_ptr() != start.get_input_embeddings().weight.data_ptr()  # untied
    plain = build_model(cfg, seed=0)
    assert not torch.equal(plain.get_output_embeddings().weight, plain.get_input_embeddings().weight)


def test_the_scale_presets_estimate_counts_nothing_for_initial_weights(tmp_path, monkeypatch):
    """`zoo --preset scale --estimate` used to stop at the init-only models ("none" has no batches)."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    result = estimate_zoo("scale", only="pythia-14m-init", print_fn=lambda line: None)
    assert result["models_to_train"] == 1 and result["expected_seconds"] == 0 and result["max_seconds"] == 0
