"""Gradient attribution vs causal importance [HHG]: statistics on hand-made vectors, gradients
against autograd on a tiny model, causal importance against weight surgery, bad input, the CLI."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.cli import attribution as cli
from core.executor import SerialExecutor
from core.pipelines import attribution as attr
from core.pipelines import attribution_measures as measures
from core.pipelines import attribution_results as ares
from core.errors import HeadLabError
from core.stats.inference import spearman
from core.tasks.sequences import exact_match_accuracy, make_sequence_batch

N_LAYERS, N_HEADS, D_MODEL, D_FF = 2, 2, 32, 64
D_HEAD = D_MODEL // N_HEADS


def tiny_hhg_config():
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, hidden_size=D_MODEL, intermediate_size=D_FF,
        max_position_embeddings=64, rotary_pct=0.0, use_parallel_residual=False, hidden_act="gelu",
        tie_word_embeddings=False, vocab_size=104, bos_token_id=100, eos_token_id=102, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    return config


def random_hhg_model(seed: int = 0):
    """A random-init [HHG]-shaped (smaller) GPT-NeoX with non-zero biases, eval mode."""
    from transformers import GPTNeoXForCausalLM

    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(tiny_hhg_config())
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return model.eval()


def load_hf(folder: Path):
    from transformers import GPTNeoXForCausalLM

    return GPTNeoXForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The test machine is shared; one intra-op thread avoids oversubscription (restored after)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory) -> Path:
    """A tiny model trained 100 steps on reversal of 1-2 numbers (~60% exact match at length 1), saved."""
    model = random_hhg_model(0)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        tokens, mask = make_sequence_batch("reverse", [1, 2], 64, gen)
        loss = measures.answer_loss(model(tokens).logits, tokens, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    folder = tmp_path_factory.mktemp("tiny-reverse")
    model.eval().save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def bridge(trained_folder):
    from core.model.loading import load_model
    from core.model.refs import ModelRef

    return load_model(ModelRef.parse(str(trained_folder)))


# ----------------------------------------------------------------------------- components


def test_component_names_and_order():
    assert ares.component_order(2, 2) == ("L0H0", "L0H1", "L0MLP", "L1H0", "L1H1", "L1MLP")
    assert ares.component_order(2, 2, with_mlp=False) == ("L0H0", "L0H1", "L1H0", "L1H1")
    assert len(ares.component_order(4, 4)) == 20
    from tests.tiny_models import tiny_model

    hhg = measures.component_blocks(tiny_model("hhg"))  # [HHG] shape: 4 x 4 heads, d_model 128, d_ff 512
    assert hhg.components[:5] == ("L0H0", "L0H1", "L0H2", "L0H3", "L0MLP") and len(hhg.components) == 20
    assert sum(p.numel for p in hhg.paper["L2H1"]) == 2 * 32 * 128  # W_V rows + W_O columns
    assert sum(p.numel for p in hhg.reference["L2H1"]) == 32 * 128
    assert sum(p.numel for p in hhg.paper["L3MLP"]) == 512 * 128
    llama = measures.component_blocks(tiny_model("llama"))
    assert llama.has_mlp and llama.paper["L1MLP"][0].name.endswith("down_proj.weight")
    olmoe = measures.component_blocks(tiny_model("olmoe"))  # experts: no single MLP output matrix
    assert not olmoe.has_mlp and olmoe.components == ares.component_order(2, 4, with_mlp=False)
    assert ares.parse_component("L1H3") == (1, 3)
    assert ares.parse_component("l3mlp") == (3, None)
    with pytest.raises(HeadLabError):
        ares.parse_component("L1X3")


def test_value_rows_are_the_heads_values():
    """The W_V rows HeadLab picks for head h really produce head h's values in the model's forward."""
    model = random_hhg_model(3)
    blocks = measures.component_blocks(model)
    x = torch.randn(5, D_MODEL)
    attention = model.gpt_neox.layers[1].attention
    qkv = attention.query_key_value(x).view(5, N_HEADS, 3 * D_HEAD)  # as the forward views it
    _, _, v = qkv.chunk(3, dim=-1)  # v: [5, head, d_head]
    for h in range(N_HEADS):
        v_slice = blocks.reference[f"L1H{h}"][0]
        w = v_slice.of(attention.query_key_value.weight)  # [d_head, d_model]
        b = attention.query_key_value.bias[v_slice.rows]
        torch.testing.assert_close(x @ w.T + b, v[:, h])


# ----------------------------------------------------------------------------- gradients


def _by_hand(model, n_batches: int, seed: int, length: int, batch_size: int):
    """Per batch: the full loss gradient once (loss.backward), sliced by hand; returns the means of
    (|g_V|, |g_O|, |g_MLP|) norms per component, and the squared pieces for the paper variant."""
    gen = torch.Generator().manual_seed(measures._derived_seed(seed, 1))
    paper = np.zeros(N_LAYERS * (N_HEADS + 1))
    reference = np.zeros_like(paper)
    for _ in range(n_batches):
        tokens, mask = make_sequence_batch("reverse", length, batch_size, gen)
        model.zero_grad()
        logits = model(tokens).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, 104), tokens[:, 1:].reshape(-1), reduction="none")
        m = mask[:, :-1].reshape(-1).float()
        ((losses * m).sum() / m.sum()).backward()
        i = 0
        for layer in model.gpt_neox.layers:
            g_qkv = layer.attention.query_key_value.weight.grad.view(N_HEADS, 3, D_HEAD, D_MODEL)
            g_out = layer.attention.dense.weight.grad  # [d_model, head * d_head]
            for h in range(N_HEADS):
                g_v = g_qkv[h, 2]
                g_o = g_out[:, h * D_HEAD : (h + 1) * D_HEAD]
                reference[i] += float(g_v.norm())
                paper[i] += math.sqrt(float(g_v.norm()) ** 2 + float(g_o.norm()) ** 2) / math.sqrt(2 * D_HEAD * D_MODEL)
                i += 1
            g_mlp = layer.mlp.dense_4h_to_h.weight.grad
            reference[i] += float(g_mlp.norm())
            paper[i] += float(g_mlp.norm()) / math.sqrt(D_FF * D_MODEL)
            i += 1
    model.zero_grad()
    return paper / n_batches, reference / n_batches


def test_gradient_magnitudes_match_autograd():
    model = random_hhg_model(1)
    paper = measures.gradient_magnitudes(model, "reverse", 8, n_batches=2, batch_size=8, seed=4, variant="paper")
    reference = measures.gradient_magnitudes(model, "reverse", 8, n_batches=2, batch_size=8, seed=4, variant="reference")
    want_paper, want_reference = _by_hand(model, 2, 4, 8, 8)
    np.testing.assert_allclose(paper, want_paper, rtol=1e-5)
    np.testing.assert_allclose(reference, want_reference, rtol=1e-5)
    assert paper.shape == (6,) and np.all(paper > 0)
    # the model is left as it was: no .grad fields written
    assert all(p.grad is None for p in model.parameters())


def test_paper_normalisation_is_norm_over_sqrt_count():
    weight = torch.zeros(4, 6)
    grads = {id(weight): torch.full((4, 6), 2.0)}
    pieces = {
        "L0H0": (measures.ParamSlice("w", weight, slice(0, 2), slice(None)), measures.ParamSlice("w", weight, slice(None), slice(0, 1))),
        "L0MLP": (measures.ParamSlice("w", weight, slice(None), slice(None)),),
    }
    raw = measures.block_norms(pieces, grads, ["L0H0", "L0MLP"], normalise=False)
    normalised = measures.block_norms(pieces, grads, ["L0H0", "L0MLP"], normalise=True)
    # L0H0: 12 + 4 entries of 2 -> sqrt(16 * 4) = 8; / sqrt(16) = 2. L0MLP: sqrt(24 * 4); / sqrt(24) = 2.
    np.testing.assert_allclose(raw, [8.0, math.sqrt(96.0)])
    np.testing.assert_allclose(normalised, [2.0, 2.0])


def test_gradients_refuse_a_bridge_wrapped_model(bridge):
    with pytest.raises(HeadLabError, match="plain Hugging Face"):
        measures.gradient_magnitudes(bridge.original_model, "reverse", 8, n_batches=1, batch_size=2)
    with pytest.raises(HeadLabError):
        measures.gradient_magnitudes(random_hhg_model(), "reverse", 8, variant="mine")


def test_model_without_mlps_is_heads_only():
    model = random_hhg_model(2)
    for layer in model.gpt_neox.layers:
        layer.mlp = torch.nn.Identity()
    blocks = measures.component_blocks(model)
    assert blocks.components == ("L0H0", "L0H1", "L1H0", "L1H1")
    assert not blocks.has_mlp and "reduced analysis" in blocks.notes[0]
    G = measures.gradient_magnitudes(model, "reverse", 8, n_batches=1, batch_size=4)
    assert G.shape == (4,)


# ----------------------------------------------------------------------------- causal importance


def _zeroed_accuracy(folder: Path, component: str, length: int, n: int, seed: int) -> float:
    """Accuracy of a fresh copy with the component's output weights zeroed (a zero ablation by surgery)."""
    model = load_hf(folder)
    layer, head = ares.parse_component(component)
    block = model.gpt_neox.layers[layer]
    with torch.no_grad():
        if head is None:
            block.mlp.dense_4h_to_h.weight.zero_()
            block.mlp.dense_4h_to_h.bias.zero_()
        else:
            block.attention.dense.weight[:, head * D_HEAD : (head + 1) * D_HEAD] = 0.0
    return exact_match_accuracy(lambda t: model(t).logits, "reverse", length, n, seed)


def test_zero_ablation_importance_equals_weight_surgery(trained_folder, bridge):
    n, seed = 200, 3
    clean_model = load_hf(trained_folder)
    clean = exact_match_accuracy(lambda t: clean_model(t).logits, "reverse", 1, n, seed)
    assert 0.2 < clean < 1.0  # the test can see a drop
    C = measures.causal_importance(bridge, "reverse", 1, n_examples=n, seed=seed, mode="zero")
    want = [clean - _zeroed_accuracy(trained_folder, c, 1, n, seed) for c in ares.component_order(N_LAYERS, N_HEADS)]
    np.testing.assert_allclose(C, want, atol=1e-6)  # one example is 1/200
    assert np.max(np.abs(C)) > 0.05  # some ablation matters


def test_one_pass_exact_match_equals_greedy_decoding(trained_folder, bridge):
    """The one-pass exact match gives the same per-example verdicts as step-by-step greedy decoding,
    clean and under a mean ablation (whose means cover every position)."""
    from core.ablation.engine import ablated_logits_fn
    from core.ablation.replacements import compute_replacements
    from core.tasks.sequences import exact_match_one_pass, exact_match_per_example

    model = load_hf(trained_folder)
    clean_fn = lambda t: model(t).logits  # noqa: E731
    for length in (1, 2):
        fast = exact_match_one_pass(clean_fn, "reverse", length, 120, 7, batch_size=50)
        slow = exact_match_per_example(clean_fn, "reverse", length, 120, 7)
        assert torch.equal(fast, slow)
        assert length == 2 or 0 < int(slow.sum()) < 120  # length 1: some right, some wrong
    ablation = measures._ablation_of(["L0H1", "L1MLP"], "mean")
    tokens, _ = make_sequence_batch("reverse", 1, 120, 7)
    fn = ablated_logits_fn(bridge, ablation, compute_replacements(bridge, tokens, ablation))
    fast = exact_match_one_pass(fn, "reverse", 1, 120, 7)
    slow = exact_match_per_example(fn, "reverse", 1, 120, 7)
    assert torch.equal(fast, slow) and int(slow.sum()) < int(exact_match_per_example(clean_fn, "reverse", 1, 120, 7).sum())


def test_mean_per_position_ablation_of_a_head_equals_a_hand_hook(trained_folder, bridge):
    """Mean-per-position ablation: the head's input slice to W_O replaced by its per-position mean over the scored
    sequences, done here with a plain forward pre-hook on the HF output projection."""
    n, seed, length, layer, head = 150, 5, 1, 0, 0
    model = load_hf(trained_folder)
    tokens, _ = make_sequence_batch("reverse", length, n, seed)  # [example, 2n+3]
    dense = model.gpt_neox.layers[layer].attention.dense
    seen = []
    handle = dense.register_forward_pre_hook(lambda mod, inp: seen.append(inp[0].detach()))
    with torch.no_grad():
        model(tokens)
    handle.remove()
    mean = seen[0].mean(dim=0)  # [pos, head * d_head]
    cols = slice(head * D_HEAD, (head + 1) * D_HEAD)

    def replace(mod, inp):
        z = inp[0].clone()
        z[:, :, cols] = mean[None, : z.shape[1], cols]
        return (z,)

    clean = exact_match_accuracy(lambda t: model(t).logits, "reverse", length, n, seed)
    handle = dense.register_forward_pre_hook(replace)
    ablated = exact_match_accuracy(lambda t: model(t).logits, "reverse", length, n, seed)
    handle.remove()
    C = measures.causal_importance(bridge, "reverse", length, n_examples=n, seed=seed, mode="mean-per-position",
                                   components=["L0H0"])
    assert abs(clean - ablated) > 0.05  # the hand hook really ablates something
    assert C[0] == pytest.approx(clean - ablated, abs=1e-6)  # one example is 1/150


# ----------------------------------------------------------------------------- statistics


def test_rank_differences_and_classes_extremes():
    G = np.arange(20, 0, -1, dtype=float)  # 20 .. 1
    C = np.arange(1, 21, dtype=float)  # 1 .. 20
    rank_g, rank_c, d = ares.rank_differences(G, C)
    np.testing.assert_array_equal(rank_g, G)
    np.testing.assert_array_equal(d, 21 - 2 * np.arange(1, 21))  # 19, 17, ..., -19
    classes = ares.classify_components(d, 6, "paper")
    # the largest gradients have the smallest effects: bloats; the reverse: heroes
    assert classes[:7] == ("bloat",) * 7 and classes[7:13] == ("aligned",) * 6 and classes[13:] == ("hero",) * 7
    assert ares.classify_components(d, 6, "reference") == classes  # no d is exactly 6
    rho, _ = spearman(G, C)
    assert rho == pytest.approx(-1.0)


def test_threshold_rules_at_exactly_six():
    G, C = [7, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7]
    _, _, d = ares.rank_differences(G, C)
    np.testing.assert_array_equal(d, [6, -1, -1, -1, -1, -1, -1])
    assert ares.classify_components(d, 6, "paper")[0] == "bloat"
    assert ares.classify_components(d, 6, "reference")[0] == "aligned"
    _, _, d = ares.rank_differences(C, G)  # small gradient, large effect
    assert d[0] == -6
    assert ares.classify_components(d, 6, "paper")[0] == "hero"
    assert ares.classify_components(d, 6, "reference")[0] == "aligned"
    with pytest.raises(HeadLabError):
        ares.classify_components(d, 6, "median")


def test_ranks_average_ties_and_rho_undefined_for_constants():
    rank_g, rank_c, d = ares.rank_differences([1.0, 1.0, 2.0], [0.0, 5.0, 1.0])
    np.testing.assert_array_equal(rank_g, [1.5, 1.5, 3.0])
    np.testing.assert_array_equal(d, [0.5, -1.5, 1.0])
    assert spearman([1, 2, 3], [0, 0, 0]) == (None, None)
    with pytest.raises(HeadLabError):
        ares.rank_differences([1, 2], [1, 2, 3])


def test_per_layer_summary_counts():
    rows = ares.per_layer_summary(
        ["L0H0", "L0H1", "L0MLP", "L1H0", "L1H1", "L1MLP"], ["bloat", "bloat", "aligned", "hero", "aligned", "hero"]
    )
    assert rows == (
        {"layer": 0, "heroes": 0, "bloats": 2, "aligned": 1},
        {"layer": 1, "heroes": 2, "bloats": 0, "aligned": 1},
    )


def test_superadditivity_paper_example_and_undefined_cases():
    ratio_mean, ratio_sum, reason = ares.superadditivity(0.438, [0.031, 0.031, 0.031])
    assert round(ratio_mean, 1) == 14.1 and reason == ""
    assert ratio_sum == pytest.approx(0.438 / 0.093)
    ratio_mean, ratio_sum, _ = ares.superadditivity(0.3, [0.1, 0.2])
    assert ratio_mean == pytest.approx(2.0) and ratio_sum == pytest.approx(1.0)
    for singles in ([0.05], [], [0.0, 0.0], [-0.02, 0.01]):
        ratio_mean, ratio_sum, reason = ares.superadditivity(0.4, singles)
        assert ratio_mean is None and ratio_sum is None and reason.startswith("undefined")
    none = ares.joint_ablation("bloats", [], [], None, 0.5)
    assert none.joint_damage is None and "no bloats" in none.reason


def _result(name: str, G, C, clean=0.5, joint=0.3, settings=None):
    components = ares.component_order(2, 2)
    settings = settings or ares.AttributionSettings(task="sort", threshold=2)
    return ares.assemble_result(name, "step1", components, G, C, clean, {8: 0.5, 9: 0.3}, 8, settings, lambda members: joint)


def test_assemble_result_joint_ablations_and_json_roundtrip():
    G = [6, 5, 4, 3, 2, 1]
    C = [0.01, 0.02, 0.1, 0.2, 0.3, 0.4]  # ranks 1..6; d = 5, 3, 1, -1, -3, -5
    calls = []
    result = ares.assemble_result(
        "m", None, ares.component_order(2, 2), G, C, 0.6, {8: 0.6}, 8,
        ares.AttributionSettings(task="reverse", threshold=3), lambda members: calls.append(tuple(members)) or 0.45,
    )
    assert result.classes == ("bloat", "bloat", "aligned", "aligned", "hero", "hero")
    assert calls == [("L0H0", "L0H1"), ("L1H1", "L1MLP")]
    assert result.joint_bloats.joint_damage == pytest.approx(0.45)
    assert result.joint_bloats.joint_accuracy == pytest.approx(0.15)
    assert result.joint_bloats.ratio_to_mean == pytest.approx(0.45 / 0.015)
    assert result.joint_heroes.ratio_to_sum == pytest.approx(0.45 / 0.7)
    np.testing.assert_allclose(result.ablated_accuracy, 0.6 - np.array(C))
    again = ares.AttributionResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result


def test_summary_over_seeds():
    C = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    results = [
        _result("s0", [1, 2, 3, 4, 5, 6], C),  # rho +1, no classes
        _result("s1", [6, 5, 4, 3, 2, 1], C),  # rho -1
        _result("s2", [1, 2, 3, 4, 6, 5], C),  # rho = 1 - 6*2/(6*35) = 0.942857
    ]
    summary = ares.summarize(results, skipped=[("s3", "no OOD length")])
    rhos = [1.0, -1.0, 1 - 6 * 2 / (6 * 35)]
    assert summary.rho_mean == pytest.approx(np.mean(rhos))
    assert summary.rho_std == pytest.approx(np.std(rhos))
    assert summary.rho_min == pytest.approx(-1.0) and summary.rho_max == pytest.approx(1.0)
    # s1: d = 5, 3, 1, -1, -3, -5 with threshold 2 -> bloats L0H0, L0H1; heroes L1H1, L1MLP
    assert summary.bloat_counts == (1, 1, 0, 0, 0, 0)
    assert summary.hero_counts == (0, 0, 0, 0, 1, 1)
    assert summary.counts("bloat") == {"L0H0": 1, "L0H1": 1, "L0MLP": 0, "L1H0": 0, "L1H1": 0, "L1MLP": 0}
    assert summary.per_layer == ({"layer": 0, "heroes": 0, "bloats": 2}, {"layer": 1, "heroes": 2, "bloats": 0})
    assert summary.joint["bloats"]["ratio_to_mean_mean"] == pytest.approx(0.3 / 0.05)
    assert summary.skipped == (("s3", "no OOD length"),)
    assert ares.AttributionSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary
    other = _result("s4", [1, 2, 3, 4, 5, 6], C, settings=ares.AttributionSettings(task="sort", threshold=3))
    with pytest.raises(HeadLabError):
        ares.summarize(results + [other])


# ----------------------------------------------------------------------------- bad input


def test_task_checks():
    model = random_hhg_model()
    measures.check_model_for_task(model, "reverse")
    with pytest.raises(HeadLabError, match="trained for 'sort'"):
        measures.check_model_for_task(model, "reverse", manifest_task="sort")
    with pytest.raises(HeadLabError):
        measures.check_model_for_task(model, "copy")
    from tests.tiny_models import tiny_model

    with pytest.raises(HeadLabError, match="260-token vocabulary"):
        measures.check_model_for_task(tiny_model("gpt_neox"), "reverse")


def test_zoo_model_trained_for_another_task(tmp_path, monkeypatch):
    from core.model.refs import ModelRef

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    folder = tmp_path / "zoo" / "sorter"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "sorter", "task": "sort", "checkpoints": []}))
    with pytest.raises(HeadLabError, match="trained for 'sort', not 'reverse'"):
        attr.analyze_ref(ModelRef("sorter", "zoo"), ares.AttributionSettings(task="reverse"))


def test_ood_lengths_without_valid_samples():
    for bad in (5, 0, 41, 8.5):
        with pytest.raises(HeadLabError):
            ares.check_ood_length(bad)
    with pytest.raises(HeadLabError):
        ares.AttributionSettings(task="reverse", ood_length=3)
    model = random_hhg_model()
    fn = lambda t: model(t).logits  # noqa: E731  a random model solves nothing
    with pytest.raises(measures.NoOODLengthError, match="solves none"):
        measures.pick_ood_length(fn, "reverse", 20, 0, ood_length=9)
    with pytest.raises(measures.NoOODLengthError, match="solves none of them; check that it was trained for reverse"):
        measures.pick_ood_length(fn, "reverse", 20, 0)


def test_mixture_of_experts_model_gets_a_heads_only_analysis(tmp_path):
    """A model without a single MLP output matrix (here a mixture of experts) is analysed end to end on
    its heads only, and the result says so."""
    from transformers import AutoModelForCausalLM, OlmoeConfig

    from core.model.loading import load_model
    from core.model.refs import ModelRef

    config = OlmoeConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, hidden_size=32, intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False,
        vocab_size=104, bos_token_id=100, eos_token_id=102, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):  # reversal of 1-2 numbers: enough for a non-zero accuracy at length 1
        tokens, mask = make_sequence_batch("reverse", [1, 2], 64, gen)
        loss = measures.answer_loss(model(tokens).logits, tokens, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(str(tmp_path))
    hf_model = AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    bridge = load_model(ModelRef.parse(str(tmp_path)))
    stages = []
    settings = ares.AttributionSettings(task="reverse", n_batches=1, batch_size=8, n_examples=80, ood_length=1, threshold=2)
    result = attr.analyze_model(hf_model, bridge, settings, "moe", None, progress=lambda s, d, t: stages.append(s))
    assert result.components == ("L0H0", "L0H1", "L1H0", "L1H1") and len(result.G) == len(result.C) == 4
    assert any(note.startswith("reduced analysis") for note in result.notes)
    assert result.clean_accuracy > 0 and result.per_layer[0]["layer"] == 0
    assert {"clean accuracy per OOD length", "gradients", "ablations"} <= set(stages)
    assert ares.AttributionResult.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_stored_results_grouped_by_settings(tmp_path, monkeypatch):
    """Stored per-model files are summarised per group analysed alike; skips of that group are named,
    results of a model retrained since are not counted, unreadable files are left out."""
    from core.workspace import atomic_write_json

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    folder = attr.attribution_dir() / "mean"  # every settings here mean-ablates
    (attr.attribution_dir() / "a.json").write_text("{}")  # a result from before the per-mode folders: not read
    C = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    for name, G in (("a", [1, 2, 3, 4, 5, 6]), ("b", [6, 5, 4, 3, 2, 1]), ("f", [6, 5, 4, 3, 2, 1])):
        atomic_write_json(folder / f"{name}.json", _result(name, G, C).to_json())
    atomic_write_json(folder / "0c.json", _result("c", [1, 2, 3, 4, 6, 5], C, settings=ares.AttributionSettings(task="sort", threshold=3)).to_json())
    atomic_write_json(folder / "d.json", _result("d", [1, 2, 3, 4, 6, 5], C, settings=ares.AttributionSettings(task="reverse")).to_json())
    sort_settings = ares.AttributionSettings(task="sort", threshold=2)
    atomic_write_json(folder / "e.skipped.json", {"model": "e", "revision": "step1", "reason": "no OOD length", "settings": sort_settings.to_json()})
    (folder / "broken.json").write_text("{not json")
    atomic_write_json(folder / "summary-paper-sort.json", {"not": "a result"})
    # a zoo model "b" whose final checkpoint is no longer the stored one
    (tmp_path / "zoo" / "b").mkdir(parents=True)
    (tmp_path / "zoo" / "b" / "manifest.json").write_text(json.dumps(
        {"name": "b", "task": "sort", "complete": True, "checkpoints": [{"revision": "step2", "step": 2, "tokens": 64}]}))
    sort = attr.stored_summaries("sort")
    assert [s.models for s in sort] == [("a", "f"), ("c",)]  # the larger group first ("0c.json" is read first)
    assert sort[0].settings == sort_settings and sort[0].rhos == (1.0, -1.0)
    skipped = dict(sort[0].skipped)
    assert skipped["e"] == "no OOD length" and "retrained" in skipped["b"] and len(skipped) == 2
    assert [s.models for s in attr.stored_summaries("reverse")] == [("d",)]
    assert len(attr.stored_summaries()) == 3
    assert attr.stored_result("a", sort_settings, "step1").model == "a"
    assert attr.stored_result("a", sort_settings, "step9") is None  # another checkpoint
    assert attr.stored_result("a", ares.AttributionSettings(task="sort"), "step1") is None  # other settings
    assert attr.sequence_zoo_models() == {"b": "sort"}


# ----------------------------------------------------------------------------- end to end, CLI


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_attribution_arguments(parser)
    args = parser.parse_args(["--task", "reverse"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_cli_one_model(trained_folder):
    out = cli.cli_attribution(_args(model=str(trained_folder), ood_length=1, n_batches=2, batch_size=8, n_examples=60))
    result = ares.AttributionResult.from_json(out)
    assert result.components == ares.component_order(N_LAYERS, N_HEADS)
    assert result.ood_length == 1 and set(result.accuracy_by_length) == {1, 8, 9, 10, 11}
    assert result.clean_accuracy == pytest.approx(result.accuracy_by_length[1])
    assert len(result.G) == 6 and all(g > 0 for g in result.G)
    assert result.settings.ood_length == 1 and result.provenance["versions"]["headlab"]


def test_preset_run_is_resumable(tmp_path, monkeypatch, trained_folder):
    import shutil

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    random_folder = tmp_path / "random"
    random_hhg_model(5).save_pretrained(str(random_folder))
    names = ["tiny-reverse-s0", "tiny-reverse-s1"]  # trained; random (solves nothing: skipped)
    for name, source in zip(names, (trained_folder, random_folder)):
        shutil.copytree(source, tmp_path / "zoo" / name / "checkpoints" / "step0000100")
        manifest = {"name": name, "task": "reverse", "complete": True,
                    "checkpoints": [{"revision": "step0000100", "step": 100, "tokens": 6400}]}
        (tmp_path / "zoo" / name / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(attr, "preset_models", lambda preset, task: names + ["tiny-reverse-s2"])
    args = _args(zoo_preset="tiny", ood_length=1, n_batches=1, batch_size=4, n_examples=40, no_progress=True)
    first = cli.cli_attribution(args)
    assert first["models"] == ["tiny-reverse-s0"] and first["n_models"] == 1
    skipped = dict(first["skipped"])
    assert skipped["tiny-reverse-s2"] == "not trained" and "solves none" in skipped["tiny-reverse-s1"]
    assert first["rhos"][0] == first["rho_mean"] and first["rho_std"] == 0.0
    stored = tmp_path / "reports" / "attribution" / "mean" / "tiny-reverse-s0.json"
    assert ares.AttributionResult.from_json(json.loads(stored.read_text())).revision == "step0000100"
    assert (tmp_path / "reports" / "attribution" / "mean" / "tiny-reverse-s1.skipped.json").is_file()

    def fail(*a, **k):
        raise AssertionError("a stored result was recomputed")

    real_analyze = attr.analyze_ref
    monkeypatch.setattr(attr, "analyze_ref", fail)
    second = cli.cli_attribution(args)  # everything comes from the stored files
    assert second["rhos"] == first["rhos"] and second["skipped"] == first["skipped"]
    with pytest.raises(AssertionError):  # other settings are not reused
        cli.cli_attribution(_args(zoo_preset="tiny", ood_length=1, n_batches=2, batch_size=4, n_examples=40, no_progress=True))
    # The same preset as executor tasks (one per model, what --backend ray sends) in a fresh home:
    # the same figures and skip reasons as the models run here one by one.
    monkeypatch.setattr(attr, "analyze_ref", real_analyze)
    fresh = tmp_path / "fresh"
    shutil.copytree(tmp_path / "zoo", fresh / "zoo")
    monkeypatch.setenv("HEADLAB_HOME", str(fresh))
    settings = ares.AttributionSettings(task="reverse", ood_length=1, n_batches=1, batch_size=4, n_examples=40)
    summary, paths = attr.run_preset("tiny", settings, progress=False, executor=SerialExecutor())
    assert summary.to_json()["rhos"] == first["rhos"] and summary.to_json()["skipped"] == first["skipped"]
    assert paths["tiny-reverse-s0"] == fresh / "reports" / "attribution" / "mean" / "tiny-reverse-s0.json"
