"""`study` end to end on a tiny random Llama with grouped-query attention and a word-level tokenizer (no real model):
every stage runs, a rerun reuses every stage from the cache, and the Markdown is generated from the JSON alone."""

import json

import numpy as np
import pytest
import torch

from core.cli.study_run import report_markdown, write_report
from core.model.loading import load_hf_model, load_model
from core.model.refs import ModelRef
from core.pipelines.study import StudySettings, run_study
from core.pipelines.study_circuit import gradient_vs_causal
from core.pipelines.study_roles import ioi_head_roles, logit_differences, name_positions
from core.tasks.ioi import IoiCounterfactualSpec, ioi_spec
from tests.tiny_models import save_tiny_model
from tests.unit.test_real_tokenizer_tasks import _tiny_tokenizer

TINY = dict(n=6, n_controls=2, top_k_heads=4, top_edges=10, ig_steps=2, resamples=2, allow_small_gap=True)


@pytest.fixture(scope="module")
def tiny_word_model(tmp_path_factory):
    folder = save_tiny_model("llama_gqa", tmp_path_factory.mktemp("tiny") / "tiny-gqa-words", tokenizer=False)
    _tiny_tokenizer().save_pretrained(str(folder))
    return folder


def test_ioi_study_runs_resumes_and_writes_its_report(tiny_word_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    ref = ModelRef.parse(str(tiny_word_model))
    settings = StudySettings(task="ioi", quick=True, **TINY)
    first = run_study(ref, settings)
    ioi = first["ioi"]
    assert not any(record["cached"] for record in ioi.values() if isinstance(record, dict) and "cached" in record)
    assert ioi["edges_eap"]["curve"]["fractions"][0] == 0.001 and ioi["edges_eap"]["curve"]["fractions"][-1] == 1.0
    assert ioi["edges_eap"]["curve"]["faithfulness"][-1] == pytest.approx(1.0, abs=1e-4)  # every edge kept: the model
    assert 0.0 <= ioi["stability"]["mean_pairwise_jaccard"] <= 1.0
    n_layers, n_heads = first["shape"]["n_layers"], first["shape"]["n_heads"]
    assert np.asarray(ioi["roles"]["direct_effect"]).shape == (n_layers, n_heads)
    for method in ("eap", "eap-ig"):  # more than half the heads: no disjoint random group exists, so not tested
        record = ioi[f"disposer_{method}"]
        assert ("not_tested" in record) == (2 * len(record["heads"]) > n_layers * n_heads)
        if "patching" in record:
            stats = record["patching"]["stats"]
            assert stats["n_controls"] == TINY["n_controls"] and 0 < stats["p"] <= 1
            assert record["ablation"]["summary"]["n_controls"] == TINY["n_controls"]
    assert {row["component"] for row in ioi["paths"]["rows"]} == {"q", "k", "v"}
    assert [row["method"] for row in ioi["proposers"]["rows"]] == ["spectral", "pattern screen", "co-activation", "gradient"]
    assert ioi["gradient_vs_causal"]["n_heads"] == n_layers * n_heads
    assert ioi["acdc_cost"]["n_edges"] == ioi["edges_eap"]["n_edges"]
    again = run_study(ref, settings)  # resumable: every stage now comes from core's store
    assert all(record["cached"] for record in again["ioi"].values() if isinstance(record, dict) and "cached" in record)
    assert again["ioi"]["logit_diff"] == {**ioi["logit_diff"], "cached": True}
    written = write_report(first, tmp_path / "report", figures=False)
    assert [p.name for p in written] == ["report.json", "report.md"]
    stored = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report_markdown(stored) == (tmp_path / "report" / "report.md").read_text()
    assert f"{ioi['logit_diff']['clean_mean']:.3f}" in report_markdown(stored)


def test_logit_differences_and_positions_match_a_direct_forward(tiny_word_model):
    model = load_model(ModelRef.parse(str(tiny_word_model)), None)
    spec = IoiCounterfactualSpec(ioi_spec(_tiny_tokenizer(), 6, 3), "abc", 0)
    pair = spec.build()
    out = logit_differences(model, pair)
    clean = pair.clean
    with torch.no_grad():  # one example at a time, unpadded: an independent computation
        for i in range(6):
            n = int(clean.query_pos[i]) + 1
            logits = model(clean.tokens[i:i + 1, :n])[0, -1]
            expected = float(logits[clean.target[i]] - logits[pair.corrupted_target[i]])
            assert out["per_pair"][i] == pytest.approx(expected, abs=1e-4)
    pos = name_positions(spec)
    assert torch.equal(clean.tokens[torch.arange(6), torch.from_numpy(pos["io"])], clean.target)
    assert torch.equal(clean.tokens[torch.arange(6), torch.from_numpy(pos["s1"])], pair.corrupted_target)
    assert torch.equal(clean.tokens[torch.arange(6), torch.from_numpy(pos["s2"])], pair.corrupted_target)


def test_role_measures_match_a_direct_computation(tiny_word_model):
    """Each role measure of ioi_head_roles, padded and batched, against a per-example unpadded computation from the
    Hugging Face model's own weights: attention END -> IO / S2, each head's direct effect (and their sum against
    the attention blocks' actual outputs), and the OV copy score through block 0 (torch.topk, not argpartition)."""
    ref = ModelRef.parse(str(tiny_word_model))
    model, hf = load_model(ref, None), load_hf_model(ref, None)
    spec = IoiCounterfactualSpec(ioi_spec(_tiny_tokenizer(), 6, 3), "abc", 0)
    pair = spec.build()
    roles = ioi_head_roles(model, spec, pair, 1.0)
    clean, pos = pair.clean, name_positions(spec)
    cfg = hf.config
    n_layers, n_heads, n_kv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    d_head = cfg.hidden_size // n_heads
    w_u, w_norm = hf.lm_head.weight.detach(), hf.model.norm.weight.detach()
    attn_io, attn_s2 = np.zeros((n_layers, n_heads)), np.zeros((n_layers, n_heads))
    effect, vectors, ids = np.zeros((n_layers, n_heads)), [], []
    attn_sum = 0.0
    with torch.no_grad():
        for i in range(6):
            end = int(clean.query_pos[i])
            tokens = clean.tokens[i:i + 1, :end + 1]
            heads_in: dict = {}
            hooks = [hf.model.layers[l].self_attn.o_proj.register_forward_pre_hook(
                lambda module, args, l=l: heads_in.__setitem__(l, args[0][0, end])) for l in range(n_layers)]
            out = hf(tokens, output_attentions=True, output_hidden_states=True)
            for h in hooks:
                h.remove()
            final = out.hidden_states[-1][0, end]  # after the final norm
            resid = hf.model.layers[-1](out.hidden_states[-2], position_embeddings=hf.model.rotary_emb(
                out.hidden_states[-2], torch.arange(end + 1)[None]))
            resid = resid[0] if isinstance(resid, tuple) else resid
            resid = resid[0, end]  # the residual entering the final norm
            scale = float(final[0] / (resid[0] * w_norm[0]))  # the norm's frozen scale, read off the model
            direction = w_u[clean.target[i]] - w_u[pair.corrupted_target[i]]
            for l in range(n_layers):
                attn_io[l] += out.attentions[l][0, :, end, pos["io"][i]].numpy() / 6
                attn_s2[l] += out.attentions[l][0, :, end, pos["s2"][i]].numpy() / 6
                w_o = hf.model.layers[l].self_attn.o_proj.weight.detach()  # [d_model, heads * d_head]
                for h in range(n_heads):
                    write = w_o[:, h * d_head:(h + 1) * d_head] @ heads_in[l][h * d_head:(h + 1) * d_head]
                    effect[l, h] += float((write * scale * w_norm) @ direction) / 6
                attn_sum += float((w_o @ heads_in[l]) * scale * w_norm @ direction) / 6
            for key, token in (("io", clean.target[i]), ("s1", pair.corrupted_target[i]), ("s2", pair.corrupted_target[i])):
                vectors.append(out.hidden_states[1][0, pos[key][i]])
                ids.append(int(token))
        copy, neg_copy = np.zeros((n_layers, n_heads)), np.zeros((n_layers, n_heads))
        x0 = torch.stack(vectors)  # [name, d_model]
        for l in range(n_layers):
            layer = hf.model.layers[l]
            v_all = layer.self_attn.v_proj(layer.input_layernorm(x0))  # [name, kv * d_head]
            w_o = layer.self_attn.o_proj.weight.detach()
            for h in range(n_heads):
                g = h // (n_heads // n_kv)
                logits = (v_all[:, g * d_head:(g + 1) * d_head] @ w_o[:, h * d_head:(h + 1) * d_head].T * w_norm) @ w_u.T
                for grid, sign in ((copy, 1), (neg_copy, -1)):
                    top = torch.topk(sign * logits, 5, dim=1).indices
                    grid[l, h] = np.mean([ids[n] in top[n].tolist() for n in range(len(ids))])
    np.testing.assert_allclose(roles["attention"]["io"], attn_io, atol=1e-5)
    np.testing.assert_allclose(roles["attention"]["s2"], attn_s2, atol=1e-5)
    np.testing.assert_allclose(roles["direct_effect"], effect, atol=1e-4)
    assert float(np.sum(roles["direct_effect"])) == pytest.approx(attn_sum, abs=1e-4)
    np.testing.assert_allclose(roles["copy_score"], copy)
    np.testing.assert_allclose(roles["neg_copy_score"], neg_copy)


def test_gradient_vs_causal_on_hand_made_ranks():
    """[HHG]'s classes on a known case: G ranks heads 0..9 one way, C the reverse for the first and last."""
    gradient = np.arange(10.0).reshape(2, 5)  # rank G 1..10
    damage = np.arange(10.0).reshape(2, 5).copy()
    damage[0, 0], damage[1, 4] = 9.0, 0.0  # head L0H0: smallest G, largest C (a hero); L1H4 the reverse (a bloat)
    out = gradient_vs_causal(gradient, damage, threshold=6)
    assert out["n_heroes"] == 1 and out["heroes"][0][0] == "L0H0" and out["heroes"][0][1] == -9
    assert out["n_bloats"] == 1 and out["bloats"][0][0] == "L1H4" and out["bloats"][0][1] == 9
    assert out["spearman"] == pytest.approx(1 - 6 * (81 + 81) / (10 * 99))
