"""`--task ioi` and the real-tokenizer induction probes through the command line, on a tiny random model that
carries the tiny word-level tokenizer of tests/unit/test_real_tokenizer_tasks.py (no real model is loaded)."""

import json

import pytest

from core.__main__ import main
from tests.tiny_models import save_tiny_model
from tests.unit.test_real_tokenizer_tasks import N_VOCAB, TOK


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    folder = save_tiny_model("gpt_neox", tmp_path_factory.mktemp("word") / "m", tokenizer=False)
    TOK.save_pretrained(str(folder))
    return folder


def test_patch_ioi_builds_pairs_from_the_models_tokenizer(word_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "patch.json"
    main(["patch", str(word_model), "--task", "ioi", "--n", "8", "--corruption", "swap", "--no-attribution",
          "--allow-small-gap", "--json", str(out)])
    printed = capsys.readouterr().out
    # the paper's names the tiny vocabulary holds (Mary John Paul Mark Lisa Sara); the 3 templates without unknown words
    assert "probe: ioi task for tokenizer" in printed and "6 one-token names, 2 places, 2 objects, 3 templates" in printed
    report = json.loads(out.read_text())
    pair = report["provenance"]["pair_spec"] if "pair_spec" in report["provenance"] else report["provenance"]
    text = json.dumps(pair)
    assert '"ioi-counterfactual"' in text and '"swap"' in text


def test_probe_induction_draws_the_ordinary_tokens(word_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    out = tmp_path / "probe.json"
    main(["probe", str(word_model), "--task", "induction-repeat", "--n", "4", "--seq-len", "16", "--json", str(out)])
    assert f"[3, {N_VOCAB})" in capsys.readouterr().out
    spec = json.loads(out.read_text())["probe_spec"]
    assert spec["vocab"] == [[3, N_VOCAB]] and spec["task"] == "induction-repeat"
