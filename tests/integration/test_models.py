"""core/model/: references, checkpoint listing, memory refusal, raw-weight loading and hook views.

The loading tests boot tiny random-init Hugging Face models (tests/tiny_models.py) through
TransformerBridge and check them against the Hugging Face forward pass itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from core.cli.models import add_models_arguments, cli_models
from core.errors import HeadLabError
from core.model import loading, memory, refs
from core.model.hooks import (
    family_of,
    head_output_weights,
    hook_name,
    mlp_hook_name,
    model_shape,
    output_bias,
    router_logit_hooks,
)
from core.model.loading import load_config, load_hf_model, load_model
from core.model.memory import check_fits_in_memory, estimate_memory_bytes, estimate_parameter_count
from core.model.refs import (
    PYTHIA_TOKENS_PER_STEP,
    Checkpoint,
    ModelRef,
    checkpoint_path,
    list_checkpoints,
    resolve_checkpoint,
    tokens_from_revision,
)
from tests.tiny_models import FAMILIES, make_fake_zoo, save_tiny_model, tiny_config

EXPECTED_TYPE = {"gpt_neox": "gpt_neox", "gpt_neox_norotary": "gpt_neox", "hhg": "gpt_neox",
                 "llama": "llama", "llama_gqa": "llama", "olmoe": "olmoe", "gemma3": "gemma3_text"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny model folder per family (module-wide: saving is the slow part)."""
    root = tmp_path_factory.mktemp("tiny")
    return {fam: save_tiny_model(fam, root / fam, seed=3) for fam in FAMILIES}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty HEADLAB_HOME for tests that write a zoo."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _tokens(seed: int = 0, batch: int = 2, pos: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, pos), generator=gen)  # [batch, pos]


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize("family", FAMILIES)
def test_bridge_logits_equal_hf_logits(saved, family):
    ref = ModelRef.parse(str(saved[family]))
    bridge = load_model(ref)
    hf = load_hf_model(ref)
    tokens = _tokens()
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(tokens)  # [batch, pos, vocab]
        expected = hf(tokens).logits
    assert logits.shape == (2, 10, 260)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    n_layers, n_heads, d_head = model_shape(bridge)
    assert cache["blocks.0.attn.hook_z"].shape == (2, 10, n_heads, d_head)
    assert cache[f"blocks.{n_layers - 1}.attn.hook_pattern"].shape == (2, n_heads, 10, 10)
    assert not bridge.training and not hf.training
    assert family_of(hf.config) == EXPECTED_TYPE[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_head_outputs_times_wo_sum_to_attention_output(saved, family):
    """sum_h hook_z[..., h, :] @ W_O[l, h] + b_O == the HF output projection's output (raw weights)."""
    bridge = load_model(ModelRef.parse(str(saved[family])))
    n_layers, n_heads, d_head = model_shape(bridge)
    w_o = head_output_weights(bridge)  # [layer, head, d_head, d_model]
    assert w_o.shape == (n_layers, n_heads, d_head, bridge.cfg.d_model)
    captured = {}  # layer -> (projection input [batch, pos, head*d_head], output [batch, pos, d_model])
    handles = [
        bridge.blocks[layer].attn.o.original_component.register_forward_hook(
            lambda mod, inp, out, layer=layer: captured.__setitem__(layer, (inp[0], out))
        )
        for layer in range(n_layers)
    ]
    try:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(_tokens(seed=1))
    finally:
        for handle in handles:
            handle.remove()
    for layer in range(n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # [batch, pos, head, d_head]
        proj_in, proj_out = captured[layer]
        assert torch.equal(z.flatten(-2), proj_in)  # hook_z is exactly W_O's input
        per_head = torch.einsum("bphd,hdm->bphm", z, w_o[layer])  # [batch, pos, head, d_model]
        total = per_head.sum(dim=2)
        bias = output_bias(bridge, layer)
        if bias is not None:
            total = total + bias
        torch.testing.assert_close(total, proj_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_out"], proj_out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_hook_names_exist_on_every_family(saved, family):
    """hook_name's table matches the bridge: attention hooks everywhere, one MLP output hook, routers on MoE."""
    bridge = load_model(ModelRef.parse(str(saved[family])))
    n_layers = model_shape(bridge)[0]
    for layer in range(n_layers):
        for kind in ("z", "pattern", "attn_out"):
            assert hook_name(kind, layer) in bridge.hook_dict
        assert mlp_hook_name(bridge, layer) in (hook_name("mlp_out", layer), hook_name("mlp_module_out", layer))
        # A gated MLP's gate projection shares the router's hook name, so MoE is told by expert_indices.
        assert (hook_name("expert_indices", layer) in bridge.hook_dict) == (family == "olmoe")
        if family == "olmoe":
            assert hook_name("router_logits", layer) in bridge.hook_dict
    assert hook_name("unembed_in") in bridge.hook_dict


@pytest.mark.parametrize("family", ["gpt_neox", "llama", "olmoe"])
def test_head_output_weights_agree_with_transformer_lens_w_o(saved, family):
    bridge = load_model(ModelRef.parse(str(saved[family])))
    torch.testing.assert_close(head_output_weights(bridge), bridge.W_O.detach(), atol=0, rtol=0)


def test_output_bias_present_and_nonzero_for_neox_absent_for_llama(saved):
    """The neox bias is non-zero, so a dropped or folded bias would fail the sum test above."""
    neox = load_model(ModelRef.parse(str(saved["gpt_neox"])))
    llama = load_model(ModelRef.parse(str(saved["llama"])))
    assert output_bias(neox, 0).abs().max() > 0.01
    assert output_bias(llama, 0) is None


def test_hhg_shape_boots_through_transformer_bridge(saved):
    bridge = load_model(ModelRef.parse(str(saved["hhg"])))
    assert model_shape(bridge) == (4, 4, 32)
    assert bridge.cfg.d_model == 128
    config = bridge.original_model.config
    # transformers 5 keeps GPT-NeoX's rotary_pct as rope_parameters["partial_rotary_factor"].
    assert config.use_parallel_residual is False
    assert config.rope_parameters["partial_rotary_factor"] == 0.0
    assert config.intermediate_size == 512 and config.hidden_act == "gelu"
    assert "blocks.0.hook_resid_mid" in bridge.hook_dict  # sequential blocks


def test_llama_folder_without_tokenizer_boots_with_byte_tokenizer(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "llama", tokenizer=False)
    bridge = load_model(ModelRef.parse(str(folder)))
    assert bridge.tokenizer("hé")["input_ids"] == [256] + list("hé".encode())
    assert bridge.to_tokens("hé").tolist() == [[256] + list("hé".encode())]


def test_byte_tokenizer_round_trips_utf8():
    tok = loading.byte_tokenizer()
    text = "def f(x): return 'héllo'\n"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode())
    assert tok.decode(ids) == text
    assert loading.byte_tokenizer(add_bos=True)(text)["input_ids"] == [256] + ids
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.sep_token_id) == (256, 257, 258, 259)


def test_router_logit_hooks_give_router_softmax_at_each_position(saved):
    bridge = load_model(ModelRef.parse(str(saved["olmoe"])))
    hooks = router_logit_hooks(bridge)
    assert hooks == {0: "blocks.0.mlp.gate.hook_out", 1: "blocks.1.mlp.gate.hook_out"}
    captured = {}
    gate = bridge.blocks[1].mlp.gate.original_component  # HF OlmoeTopKRouter
    handle = gate.register_forward_hook(lambda mod, inp, out: captured.__setitem__("logits", out[0]))
    tokens = _tokens(seed=2, batch=3, pos=7)
    try:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(tokens)
    finally:
        handle.remove()
    logits = cache[hooks[1]]  # [batch * pos, expert]
    assert logits.shape == (3 * 7, 4)
    torch.testing.assert_close(logits, captured["logits"], atol=0, rtol=0)
    weights = torch.softmax(logits.reshape(3, 7, 4), dim=-1)  # [batch, pos, expert]
    assert torch.allclose(weights.sum(-1), torch.ones(3, 7))
    # The top-k hook agrees with the softmax on the chosen experts (norm_topk_prob is off).
    topk = cache["blocks.1.mlp.hook_expert_weights"].reshape(3, 7, 4)
    chosen = topk > 0
    torch.testing.assert_close(topk[chosen], weights[chosen], atol=1e-6, rtol=0)
    assert router_logit_hooks(load_model(ModelRef.parse(str(saved["llama"])))) == {}


# ----------------------------------------------------------------------------- broken folders


def test_truncated_safetensors_file_is_refused_naming_the_file(tmp_path):
    folder = save_tiny_model("gpt_neox", tmp_path / "broken")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    # the folder is the user's, not the zoo's: re-save it, never "delete"
    with pytest.raises(HeadLabError, match="model.safetensors is corrupt or truncated; re-save the model there"):
        load_model(ModelRef.parse(str(folder)))


def test_garbage_safetensors_header_is_refused(tmp_path):
    folder = save_tiny_model("gpt_neox", tmp_path / "broken")
    (folder / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(HeadLabError, match="corrupt or truncated"):
        load_hf_model(ModelRef.parse(str(folder)))


def test_missing_weights_and_pickled_weights_are_refused(tmp_path):
    folder = save_tiny_model("gpt_neox", tmp_path / "broken")
    (folder / "model.safetensors").unlink()
    with pytest.raises(HeadLabError, match="has no weight files"):
        load_model(ModelRef.parse(str(folder)))
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(HeadLabError, match="only pickled weights"):
        load_model(ModelRef.parse(str(folder)))


def test_sharded_index_naming_a_missing_shard_is_refused(tmp_path):
    folder = save_tiny_model("gpt_neox", tmp_path / "broken")
    index = {"metadata": {}, "weight_map": {"embed_out.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(HeadLabError, match="model-00002-of-00002.safetensors is missing"):
        load_model(ModelRef.parse(str(folder)))


def test_missing_config_is_refused(tmp_path, home):
    folder = save_tiny_model("gpt_neox", tmp_path / "broken")
    (folder / "config.json").unlink()
    with pytest.raises(HeadLabError, match="is not a model checkpoint: it holds no config.json"):
        load_model(ModelRef.parse(str(folder)))
    # a zoo checkpoint without its config: HeadLab's own folder, so deleting and retraining it is the advice
    zoo_model = make_fake_zoo(home / "zoo", "induction-neox", "gpt_neox", steps=(0,))
    (zoo_model / "checkpoints" / "step000000" / "config.json").unlink()
    with pytest.raises(HeadLabError, match=f"config.json is missing.*delete the zoo model folder {zoo_model.resolve()}"):
        load_model(ModelRef.parse("induction-neox"))


def test_unavailable_cuda_device_is_refused(saved):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(HeadLabError, match="no CUDA GPU"):
        load_model(ModelRef.parse(str(saved["gpt_neox"])), device="cuda")


# ----------------------------------------------------------------------------- memory


def test_parameter_estimate_matches_actual_count_for_tiny_models():
    from tests.tiny_models import tiny_model

    for family in FAMILIES:
        actual = sum(p.numel() for p in tiny_model(family).parameters())
        estimate = estimate_parameter_count(tiny_config(family))
        assert abs(estimate - actual) / actual < 0.05, (family, estimate, actual)


def test_parameter_estimate_matches_published_sizes():
    from transformers import GPTNeoXConfig, OlmoeConfig

    pythia_160m = GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12,
                                num_attention_heads=12, intermediate_size=3072,
                                tie_word_embeddings=False)
    assert abs(estimate_parameter_count(pythia_160m) - 162_322_944) / 162_322_944 < 0.01
    olmoe_1b_7b = OlmoeConfig(vocab_size=50304, hidden_size=2048, num_hidden_layers=16,
                              num_attention_heads=16, intermediate_size=1024, num_experts=64,
                              num_experts_per_tok=8, tie_word_embeddings=False)
    assert abs(estimate_parameter_count(olmoe_1b_7b) - 6.92e9) / 6.92e9 < 0.01


def test_memory_estimate_is_params_times_4_bytes_times_overhead_plus_margin():
    config = tiny_config("gpt_neox")
    params = estimate_parameter_count(config)
    expected = int(params * 4 * memory.MEMORY_OVERHEAD) + memory.ACTIVATION_MARGIN_BYTES
    assert estimate_memory_bytes(config) == expected
    assert estimate_memory_bytes(config, torch.float16) < expected


def test_check_fits_in_memory_refuses_and_accepts():
    config = tiny_config("gpt_neox")
    with pytest.raises(HeadLabError, match=r"model needs ~0\.\d+ GB, only 0\.00 GB available"):
        check_fits_in_memory(config, available_bytes=1000)
    assert check_fits_in_memory(config, available_bytes=10**12) == estimate_memory_bytes(config)
    assert memory.available_memory_bytes() > 0


def test_memory_refusal_comes_before_any_weight_is_read(tmp_path, monkeypatch):
    """With no usable weights at all, the refusal still names memory: the estimate is config-only."""
    import transformers

    folder = save_tiny_model("gpt_neox", tmp_path / "big")
    (folder / "model.safetensors").write_bytes(b"garbage")  # reading it would fail differently
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device="cpu": 1000)

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the memory check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(HeadLabError, match="model needs"):
        load_model(ModelRef.parse(str(folder)))
    config = load_config(ModelRef.parse(str(folder)))  # config only: works without weights
    assert config.num_attention_heads == 4


# ----------------------------------------------------------------------------- references


def test_model_ref_parse_kinds(home, tmp_path):
    make_fake_zoo(home / "zoo", "induction-neox", "gpt_neox", steps=(0,))
    assert ModelRef.parse("induction-neox") == ModelRef("induction-neox", "zoo")
    assert ModelRef.parse(" EleutherAI/pythia-160m ") == ModelRef("EleutherAI/pythia-160m", "hub")
    assert ModelRef.parse("allenai/OLMo-1B-hf").kind == "hub"
    folder = tmp_path / "some-folder"
    folder.mkdir()
    with pytest.raises(HeadLabError, match="some-folder is not a model checkpoint"):
        ModelRef.parse(str(folder))  # an empty folder (or /etc, or ~) is not a model
    (folder / "config.json").write_text("{}")
    ref = ModelRef.parse(str(folder))
    assert ref.kind == "local" and Path(ref.name) == folder.resolve()
    assert ModelRef.from_json(ref.to_json()) == ref


def test_model_ref_parse_unknown_names_list_the_zoo(home):
    make_fake_zoo(home / "zoo", "induction-neox", "gpt_neox", steps=(0,))
    (home / "zoo" / "half-written").mkdir()  # no manifest: not listed
    for text in ("nope", "", "a/b/c", "/no/such/folder"):
        with pytest.raises(HeadLabError) as info:
            ModelRef.parse(text)
        message = str(info.value)
        assert message.startswith(f"unknown model {text!r}; zoo models: induction-neox; or give")
        assert "EleutherAI/pythia-160m" in message


def test_model_ref_parse_with_an_empty_zoo_says_how_to_train(home):
    with pytest.raises(HeadLabError, match="zoo models: none yet"):
        ModelRef.parse("induction-neox")
    with pytest.raises(ValueError):
        ModelRef("x", "cloud")


def test_tokens_from_revision_pythia_and_olmo():
    assert tokens_from_revision("EleutherAI/pythia-160m", "step143000") == 143000 * 2_097_152
    assert tokens_from_revision("EleutherAI/pythia-160m-deduped", "step0") == 0
    assert tokens_from_revision("EleutherAI/pythia-1b", "step512") == 512 * PYTHIA_TOKENS_PER_STEP
    assert tokens_from_revision("allenai/OLMo-1B-hf", "step20000-tokens84B") == 84_000_000_000
    assert tokens_from_revision("allenai/OLMo-1B-0724-hf", "step5000-tokens10.5B") == 10_500_000_000
    assert refs.parse_revision("allenai/OLMo-1B-hf", "step20000-tokens84B") == (20000, 84 * 10**9)
    for name, revision in [("EleutherAI/pythia-160m", "main"), ("gpt2/x", "step100"),
                           ("EleutherAI/pythia-160m", "step12a"), ("allenai/OLMo-1B", "tokens4B")]:
        assert tokens_from_revision(name, revision) is None


def test_zoo_manifest_listing_sorted_by_tokens(home):
    zoo = home / "zoo"
    folder = make_fake_zoo(zoo, "induction-neox", "gpt_neox", steps=(100, 0, 10))
    ref = ModelRef.parse("induction-neox")
    checkpoints = list_checkpoints(ref)
    assert checkpoints == [Checkpoint("step000000", 0, 0), Checkpoint("step000010", 10, 20480),
                           Checkpoint("step000100", 100, 204800)]
    assert resolve_checkpoint(ref) == checkpoints[-1]
    assert resolve_checkpoint(ref, "step000010") == checkpoints[1]
    assert checkpoint_path(ref, "step000010") == folder / "checkpoints" / "step000010"
    assert checkpoint_path(ref) == folder / "checkpoints" / "step000100"
    assert Checkpoint.from_json(checkpoints[1].to_json()) == checkpoints[1]
    # A zoo checkpoint loads through the same path as any folder, and it is the one asked for.
    bridge = load_model(ref, "step000010")
    expected = load_hf_model(ModelRef.parse(str(folder / "checkpoints" / "step000010")))
    torch.testing.assert_close(head_output_weights(bridge)[0, 0].T,
                               expected.gpt_neox.layers[0].attention.dense.weight[:, :8])


def test_local_folder_with_manifest_and_bare_local_folder(home, tmp_path):
    folder = make_fake_zoo(tmp_path / "elsewhere", "mine", "gpt_neox", steps=(0, 5))
    ref = ModelRef.parse(str(folder))
    assert ref.kind == "local"
    assert [c.revision for c in list_checkpoints(ref)] == ["step000000", "step000005"]
    assert checkpoint_path(ref, "step000005") == folder.resolve() / "checkpoints" / "step000005"
    bare = ModelRef.parse(str(folder / "checkpoints" / "step000000"))
    assert list_checkpoints(bare) == [Checkpoint("main", 0, refs.UNKNOWN_TOKENS)]
    assert checkpoint_path(bare) == Path(bare.name)


def test_unknown_revision_lists_valid_ones(home):
    make_fake_zoo(home / "zoo", "induction-neox", "gpt_neox", steps=(0, 10))
    ref = ModelRef.parse("induction-neox")
    with pytest.raises(HeadLabError, match=r"no checkpoint 'step999'; pick one of: step000000, step000010 \(2 in all\)"):
        resolve_checkpoint(ref, "step999")
    with pytest.raises(HeadLabError, match="no checkpoint"):
        load_model(ref, "step999")


def test_unknown_revision_message_elides_long_lists(home):
    zoo = home / "zoo" / "long"
    zoo.mkdir(parents=True)
    checkpoints = [{"revision": f"s{i}", "step": i, "tokens": i} for i in range(10)]
    (zoo / "manifest.json").write_text(json.dumps({"name": "long", "checkpoints": checkpoints}))
    with pytest.raises(HeadLabError, match=r"pick one of: s0, s1, s2, \.\.\., s7, s8, s9 \(10 in all\)"):
        resolve_checkpoint(ModelRef("long", "zoo"), "s99")


def test_zoo_problems_are_one_line_errors(home):
    zoo = home / "zoo" / "bad"
    zoo.mkdir(parents=True)
    (zoo / "manifest.json").write_text("{not json")
    with pytest.raises(HeadLabError, match="manifest .* is unreadable"):
        list_checkpoints(ModelRef("bad", "zoo"))
    (zoo / "manifest.json").write_text(json.dumps({"name": "bad", "checkpoints": []}))
    with pytest.raises(HeadLabError, match="has no training checkpoints"):
        list_checkpoints(ModelRef("bad", "zoo"))
    checkpoints = [{"revision": "step000001", "step": 1, "tokens": 10}]
    (zoo / "manifest.json").write_text(json.dumps({"name": "bad", "checkpoints": checkpoints}))
    with pytest.raises(HeadLabError, match="checkpoint folder .*step000001 is missing"):
        load_model(ModelRef("bad", "zoo"))


def test_hub_listing_parses_branch_names(monkeypatch):
    import huggingface_hub

    branches = ["main", "step143000", "step0", "step1000", "some-feature"]
    refs = SimpleNamespace(branches=[SimpleNamespace(name=n) for n in branches])
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", lambda name: refs)
    ref = ModelRef.parse("EleutherAI/pythia-160m")
    assert list_checkpoints(ref) == [
        Checkpoint("step0", 0, 0),
        Checkpoint("step1000", 1000, 1000 * PYTHIA_TOKENS_PER_STEP),
        Checkpoint("step143000", 143000, 143000 * PYTHIA_TOKENS_PER_STEP),
    ]
    assert resolve_checkpoint(ref).revision == "step143000"
    assert checkpoint_path(ref, "step1000") == "EleutherAI/pythia-160m"
    with pytest.raises(HeadLabError, match="no checkpoint 'step7'"):
        resolve_checkpoint(ref, "step7")


def test_hub_listing_offline_is_a_clear_error_and_names_still_resolve(monkeypatch):
    import huggingface_hub

    def offline(name):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "list_repo_refs", offline)
    ref = ModelRef("allenai/OLMo-1B-hf", "hub")
    with pytest.raises(HeadLabError, match="cannot list the revisions of hub model allenai/OLMo-1B-hf"):
        list_checkpoints(ref)
    assert resolve_checkpoint(ref, "step20000-tokens84B") == Checkpoint("step20000-tokens84B", 20000, 84 * 10**9)
    with pytest.raises(HeadLabError):
        resolve_checkpoint(ref, "main")
    refs = SimpleNamespace(branches=[SimpleNamespace(name="main")])
    monkeypatch.setattr(huggingface_hub, "list_repo_refs", lambda name: refs)
    with pytest.raises(HeadLabError, match="has no training checkpoints"):
        list_checkpoints(ModelRef("openai-community/gpt2-x", "hub"))


def test_offline_context_restores_settings(monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    before = hub_constants.HF_HUB_OFFLINE
    with loading._offline(True):
        assert os.environ["HF_HUB_OFFLINE"] == "1" and hub_constants.HF_HUB_OFFLINE is True
    assert "HF_HUB_OFFLINE" not in os.environ and os.environ["TRANSFORMERS_OFFLINE"] == "0"
    assert hub_constants.HF_HUB_OFFLINE == before


def test_list_zoo_and_read_manifest(home):
    make_fake_zoo(home / "zoo", "b-model", "llama", steps=(0,))
    make_fake_zoo(home / "zoo", "a-model", "gpt_neox", steps=(5, 0))
    (home / "zoo" / "no-manifest").mkdir()
    assert refs.list_zoo() == ["a-model", "b-model"]
    manifest = refs.read_manifest("a-model")
    assert manifest["family"] == "gpt_neox" and len(manifest["checkpoints"]) == 2
    with pytest.raises(HeadLabError, match="unknown zoo model 'no-manifest'; zoo models: a-model, b-model"):
        refs.read_manifest("no-manifest")


def test_read_manifest_of_a_folder_keeps_checkpoint_extras(home, tmp_path):
    """One read_manifest for the zoo and for training: a folder (Path), None when missing if asked."""
    assert refs.read_manifest(tmp_path / "absent", missing_ok=True) is None
    assert refs.read_manifest("absent-model", missing_ok=True) is None
    with pytest.raises(HeadLabError, match="manifest .* is unreadable"):
        refs.read_manifest(tmp_path / "absent")
    folder = tmp_path / "trained"
    folder.mkdir()
    checkpoints = [{"revision": "step000001", "step": 1, "tokens": 10, "loss": 2.5}]
    (folder / "manifest.json").write_text(json.dumps({"name": "trained", "checkpoints": checkpoints}))
    assert refs.read_manifest(folder)["checkpoints"] == checkpoints
    assert not refs.model_is_complete(folder) and not refs.model_is_complete(tmp_path / "absent")
    (folder / "manifest.json").write_text(json.dumps({"name": "trained", "checkpoints": checkpoints, "complete": True}))
    assert refs.model_is_complete(folder)
    (folder / "manifest.json").write_text(json.dumps({"name": "trained", "checkpoints": [{"step": 1}]}))
    with pytest.raises(HeadLabError, match="manifest .* is unreadable"):
        refs.read_manifest(folder, missing_ok=True)


def test_cli_models_lists_zoo_and_checkpoints(home, capsys):
    import argparse

    make_fake_zoo(home / "zoo", "induction-neox", "gpt_neox", steps=(10, 0))
    parser = argparse.ArgumentParser()
    add_models_arguments(parser)
    result = cli_models(parser.parse_args([]))
    assert [m["name"] for m in result["models"]] == ["induction-neox"]
    assert result["models"][0]["checkpoints"] == 2
    result = cli_models(parser.parse_args(["induction-neox"]))
    assert [c["step"] for c in result["checkpoints"]] == [0, 10]
    assert "step000010" in capsys.readouterr().out


def test_family_of():
    assert family_of(tiny_config("olmoe")) == "olmoe"
    assert family_of(tiny_config("llama")) == "llama"
    assert family_of(tiny_config("hhg")) == "gpt_neox"
    assert family_of(None) == "unknown"
