"""`study` end to end on a tiny random Llama with grouped-query attention and a word-level tokenizer (no real model):
every stage runs, a rerun reuses every stage from the cache, and the Markdown is generated from the JSON alone."""

import json

import numpy as np
import pytest
import torch

from core.cli.study import report_markdown, write_report
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.pipelines.study import StudySettings, run_study
from core.pipelines.study_roles import logit_differences, name_positions
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
