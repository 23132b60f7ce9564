"""Patching on a tiny TransformerBridge (random GPT-NeoX): hooks sound on a real bridge, path patching against
TransformerLens's own direct-path patching, and `python -m core patch` / `bench patch` end to end on a fake zoo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.patching import get_act_patch_direct_path

from core.__main__ import main
from core.ablation.patching import PatchSettings, activation_patching, attribution_patching, path_patching
from core.bench.patch import bench_patch
from core.figures.patching import patching_bundles
from core.heads import HeadSet
from core.model.loading import byte_tokenizer
from core.pipelines.patching import PatchingReport
from core.tasks import InductionCounterfactualSpec, InductionProbeSpec
from core.tasks.probe_file import PADDING_SIDES, read_probe_file
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo, tiny_model

MODEL = "tiny-patch-neox"
EXAMPLE_PROBES = Path(__file__).resolve().parents[2] / "assets" / "probes" / "ioi_example.jsonl"


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    """The tiny 2-layer, 4-head parallel-residual GPT-NeoX of tests/tiny_models.py, booted as a bridge; its weight
    matrices scaled 25x (sharp attention), so one head's path moves the logits far above float rounding."""
    folder = tmp_path_factory.mktemp("neox")
    hf = tiny_model("gpt_neox", seed=0)
    with torch.no_grad():
        for param in hf.parameters():
            if param.ndim == 2:
                param.mul_(25.0)
    hf.save_pretrained(str(folder))
    return TransformerBridge.boot_transformers(str(folder), hf_model=hf, device="cpu").eval()


@pytest.fixture(scope="module")
def pair():
    return InductionCounterfactualSpec(InductionProbeSpec(8, 16, 0, 256, 0)).build()


def test_bridge_identity_check_and_attribution_shapes(bridge, pair):
    settings = PatchSettings(allow_small_gap=True, metric="target_logit", batch_size=4)
    act = activation_patching(bridge, pair, settings)
    assert act.identity_max_diff == 0.0 and act.scores.shape == (2, 4)
    att = attribution_patching(bridge, pair, settings)
    assert att.scores.shape == (2, 4) and att.position_scores.shape == (2, 4, 16)
    assert att.clean_value == pytest.approx(act.clean_value, rel=1e-5)
    assert att.corrupted_value == pytest.approx(act.corrupted_value, rel=1e-5)
    assert not bridge.cfg.use_split_qkv_input  # left as found


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_path_patching_matches_transformer_lens_direct_path(bridge, pair, component):
    """Parallel residual: layer 0's MLP does not read layer 0's attention, so sender -> receiver has one route,
    the one TransformerLens's get_act_patch_direct_path patches (there, with MLPs frozen)."""
    rows = torch.arange(pair.n_examples)

    def mean_target_logit(logits):
        return logits[rows, pair.clean.query_pos, pair.clean.target].mean()

    _, clean_cache = bridge.run_with_cache(pair.clean.tokens)
    _, corrupted_cache = bridge.run_with_cache(pair.corrupted_tokens)
    theirs = get_act_patch_direct_path(bridge, pair.corrupted_tokens, clean_cache, corrupted_cache, mean_target_logit,
                                       src_layer=0, src_head=2, component=component, verbose=False)
    settings = PatchSettings(allow_small_gap=True, metric="target_logit", batch_size=8, n_controls=1)
    effects = []
    for receiver in range(4):
        ours = path_patching(bridge, pair, HeadSet(((0, 2),)), HeadSet(((1, receiver),)), component, settings)
        effect = ours.score * (ours.clean_value - ours.corrupted_value)  # the mean target logit's change
        assert effect == pytest.approx(float(theirs[1, receiver]) - ours.corrupted_value, abs=2e-5)
        assert ours.identity_max_diff < 1e-4  # float rounding only: step 2 runs on split per-head inputs
        effects.append(abs(effect))
    assert max(effects) > 5e-3  # a real effect, not rounding


def test_cli_patch_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    out = tmp_path / "patch.json"
    argv = ["patch", MODEL, "--n", "8", "--seq-len", "16", "--metric", "target_logit", "--heads", "L1H0,L1H2",
            "--controls", "3", "--senders", "L0H1", "--receivers", "L1H0,L1H2", "--component", "q,k", "--json", str(out)]
    assert main(argv) == 2 and not out.exists()  # a random model: its clean-corrupted gap is noise, refused
    assert "more pairs, another metric" in capsys.readouterr().err
    assert main(argv + ["--allow-small-gap"]) == 0
    printed = capsys.readouterr().out
    assert "identity check" in printed and "max logit change 0.00e+00" in printed and "Spearman" in printed
    assert "clean-corrupted gap" in printed and "WARNING forced" in printed and "per-example sd" in printed
    assert "rank " in printed and "1 control, population sd (ddof=0)" in printed and "z unreliable" in printed
    report = PatchingReport.from_json(json.loads(out.read_text()))
    assert report.model == MODEL and report.revision == "step000000"
    assert report.activation.scores.shape == (2, 4) and report.attribution is not None
    assert report.group.selection == HeadSet(((1, 0), (1, 2))) and len(report.group.control_scores) == 1  # C(2, 2)
    assert report.path.components == ("q", "k") and report.plan.senders == HeadSet(((0, 1),))
    assert report.provenance["pair_spec"]["task"] == "induction-counterfactual"
    assert report.provenance["versions"]["transformer-lens"]
    assert main(["patch", MODEL, "--n", "8", "--seq-len", "16", "--senders", "L0H1"]) == 2
    assert "both senders and receivers" in capsys.readouterr().err
    assert main(["patch", MODEL, "--task", "text"]) == 2
    assert main(["patch", MODEL, "--heads", "L5H0"]) == 2
    assert "outside this model" in capsys.readouterr().err


def test_bench_patch_reports_speedup_and_agreement(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    result = bench_patch(MODEL, n_examples=8, seq_len=16)
    assert result["n_heads_total"] == 8 and result["identity_max_diff"] == 0.0
    assert np.isfinite(result["speedup_attribution_vs_activation"]) and result["speedup_attribution_vs_activation"] > 0
    assert result["spearman"] is None or -1.0 <= result["spearman"] <= 1.0


def test_probe_file_padding_is_masked_on_the_bridge(bridge):
    """Left- and right-padded batches of the same pairs score alike (the mask hides the padding, and left-padded
    rows keep their positions); unmasked left padding would not."""
    lines = [{"prompt": "the cat sat on the mat, the c", "target": "a", "corrupted_prompt": "the dog sat on the mat, the c"},
             {"prompt": "a bee and a bird, a b", "target": "e", "corrupted_prompt": "a cow and a bird, a b"}]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    scores = {}
    for side in PADDING_SIDES:
        pair = read_probe_file(data, padding=side).build(byte_tokenizer(add_bos=True), 64)
        assert int(pair.attention_mask.sum()) == 30 + 22 and pair.seq_len == 30
        result = activation_patching(bridge, pair, PatchSettings(allow_small_gap=True, metric="target_logit"))
        assert result.identity_max_diff == 0.0
        scores[side] = result.scores
    np.testing.assert_allclose(scores["left"], scores["right"], atol=1e-4)


def test_cli_patch_on_the_example_probe_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    out = tmp_path / "patch.json"
    assert main(["patch", MODEL, "--probe-file", str(EXAMPLE_PROBES), "--no-attribution", "--allow-small-gap",
                 "--json", str(out)]) == 0
    assert "8 of 8 targets have several tokens" in capsys.readouterr().out
    report = PatchingReport.from_json(json.loads(out.read_text()))
    pair_spec = report.provenance["pair_spec"]
    assert pair_spec["task"] == "probe-file" and pair_spec["name"] == "ioi_example.jsonl" and len(pair_spec["sha256"]) == 64
    bundles = patching_bundles(report)  # no attribution, group or path asked: the head heatmap alone
    assert [b.name for b in bundles] == ["patching-heads"] and len(bundles[0].rows) == 8
    assert bundles[0].provenance["patching"]["pairs"]["sha256"] == pair_spec["sha256"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "When Mary met John", "target": "M", "corrupted_prompt": "When Mary met Jo"}\n')
    assert main(["patch", MODEL, "--probe-file", str(bad)]) == 2
    assert "line 1: the prompt is 19 tokens but the corrupted_prompt 17" in capsys.readouterr().err
