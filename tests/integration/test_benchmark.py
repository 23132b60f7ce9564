"""`python -m core benchmark --quick`: the report, resume equal to an uninterrupted run, nothing half-written
after an interruption, and the bad inputs (a folder without circuit.json, a circuit naming a head the model lacks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import core.pipelines.benchmark as bench
from core.__main__ import main
from core.heads import HeadSet, parse_heads
from core.pipelines.benchmark import judge, random_groups, report_fingerprint
from core.zoo.known import HANDWIRED, KnownCircuit, write_circuit
from tests.tiny_models import save_tiny_model

TASK = {"task": "known-induction", "n_examples": 24, "seq_len": 16, "token_low": 0, "token_high": 256, "seed": 0}


def known_folder(root: Path, name: str = "tiny-known", heads: str = "L0H1, L1H2",
                 edges: tuple[str, ...] = ("L0H1->L1H2.k", "L1H2->logits")) -> Path:
    """A tiny GPT-NeoX folder with a circuit.json (a stand-in truth: the test checks the machinery, not the model)."""
    folder = save_tiny_model("gpt_neox", root / name, seed=3)
    circuit = KnownCircuit(name=name, kind="handwired", heads=parse_heads(heads), roles={},
                           edges=edges, distractors=parse_heads("L0H3, L1H0"),
                           ablation="zero", task=dict(TASK))
    write_circuit(folder, circuit)
    return folder


def _run(home: Path, monkeypatch, *args: str) -> int:
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    return main(["benchmark", *args])


def test_quick_report_resume_equals_uninterrupted(tmp_path, monkeypatch, capsys):
    # both runs at one thread: the thread policy follows the machine's load, and the reports must match bit for bit
    monkeypatch.setenv("HEADLAB_THREADS", "1")
    folder = known_folder(tmp_path)
    out = tmp_path / "out"
    assert _run(tmp_path / "home-a", monkeypatch, str(folder), "--quick", "--out", str(out), "--no-figures") == 0
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# Known-circuit benchmark (quick subset)")
    (result,) = report["results"]
    methods = {m["method"]: m for m in result["methods"]}
    assert set(methods) == set(bench.HEAD_METHOD_NAMES)
    assert methods["spectral"]["not_applicable"].startswith("PR-integral left out")  # one checkpoint
    for name in ("pattern screen", "gradient", "activation patching (denoise)", "attribution patching (noise)"):
        auc = methods[name]["recovery"]["roc_auc"]
        assert 0.0 <= auc["value"] <= 1.0 and auc["n_draws"] == 1000 and auc["n_true"] == 2
        assert np.asarray(methods[name]["scores"]).shape == (2, 4)
    assert {m["method"] for m in result["edge_methods"]} == {"EAP", "EAP-IG", "ACDC", "ACDC (threshold sweep)"}
    assert all(m["recovery"]["roc_auc"]["n_true"] == 2 for m in result["edge_methods"])
    sweep = next(m for m in result["edge_methods"] if m["method"] == "ACDC (threshold sweep)")
    assert [p["threshold"] for p in sweep["sweep_roc"]["points"]] == list(bench.ACDC_SWEEP)
    assert 0.0 <= sweep["sweep_roc"]["auc"] <= 1.0 and report["acdc_sweep"]["table"][0]["n_scored"] == 1
    assert isinstance(report["separations"], list) and report["true_head_ranks"]
    kinds = [d["kind"] for d in result["disposals"]]
    assert kinds.count("truth") == 1 and kinds.count("random") == 3 and kinds.count("distractor") == 3
    tested = [d for d in result["disposals"] if d["verdict_paper"] != "not tested"]
    # n_controls: the distinct control sets measured (a small model may have fewer than the 10 asked for)
    assert all(d["n_controls_requested"] == 10 and d["n_controls"] == d["metrics"]["loss"]["n_controls"] <= 10
               for d in tested)
    assert all(1 <= d["metrics"]["target_logit"]["rank"] <= d["n_controls"] + 1 for d in tested)
    random_heads = [set(d["heads"]) for d in result["disposals"] if d["kind"] == "random"]
    assert all(not (h & {"L0H1", "L1H2"}) for h in random_heads)  # drawn outside the circuit
    assert report["verdicts"]["random"]["n"] == 3
    assert [r["value"] for r in report["published"]["rows"]][:3] == [1.0, 0.692, 0.656]
    levels = {(r["level"], r["method"]) for r in report["table"]}
    assert ("edge", "ACDC") in levels and ("head", "gradient") in levels

    # interrupted at the third disposal: finished items stay, nothing is half-written, the rerun resumes
    calls = {"n": 0}
    real = bench.dispose

    def interrupting(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(bench, "dispose", interrupting)
    home_b = tmp_path / "home-b"
    assert _run(home_b, monkeypatch, str(folder), "--quick", "--json", str(tmp_path / "b.json")) == 130
    assert not (tmp_path / "b.json").exists()
    cached = sorted((home_b / "cache" / "benchmark").iterdir())
    assert not [p for p in cached if p.name.startswith(".")]  # no temporary file left
    records = [json.loads(p.read_text()) for p in cached]  # every entry is whole JSON
    assert len(records) == len(bench.HEAD_METHODS) + len(bench.EDGE_METHODS) + 2
    monkeypatch.setattr(bench, "dispose", real)
    capsys.readouterr()
    assert _run(home_b, monkeypatch, str(folder), "--quick", "--json", str(tmp_path / "b.json")) == 0
    resumed = json.loads((tmp_path / "b.json").read_text())
    assert report_fingerprint(resumed) == report_fingerprint(report)
    assert {k: v for k, v in resumed.items() if k != "runtime"} == {k: v for k, v in report.items() if k != "runtime"}

    # a measured edge joins the truth (KnownCircuit.measured_edges): every item is read from the cache (their keys
    # hold no true edges), and the edges are scored against the longer truth
    circuit = json.loads((folder / "circuit.json").read_text())
    (folder / "circuit.json").write_text(json.dumps({**circuit, "measured_edges": ["L0H3->L1H2.v"]}))
    before = sorted(p.name for p in (home_b / "cache" / "benchmark").iterdir())
    assert _run(home_b, monkeypatch, str(folder), "--quick", "--json", str(tmp_path / "c.json")) == 0
    assert sorted(p.name for p in (home_b / "cache" / "benchmark").iterdir()) == before
    measured = json.loads((tmp_path / "c.json").read_text())
    assert measured["models"][0]["measured_edges"] == ["L0H3->L1H2.v"]
    assert all(m["recovery"]["roc_auc"]["n_true"] == 3 for m in measured["results"][0]["edge_methods"])


def test_bad_inputs(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    bare = save_tiny_model("gpt_neox", tmp_path / "no-circuit", seed=1)
    assert _run(home, monkeypatch, str(bare), "--quick") == 2
    assert "has no circuit.json" in capsys.readouterr().err
    wrong = known_folder(tmp_path, "wrong-heads", heads="L0H1, L3H0", edges=())  # a 2-layer model has no L3H0
    assert _run(home, monkeypatch, str(wrong), "--quick") == 2
    err = capsys.readouterr().err
    assert "L3H0" in err and "lacks" in err
    assert not (home / "cache" / "benchmark").exists() or not list((home / "cache" / "benchmark").iterdir())
    assert _run(home, monkeypatch, str(bare), "--methods", "magic") == 2
    assert "unknown benchmark method" in capsys.readouterr().err
    assert _run(home, monkeypatch, "--from-report", str(tmp_path / "none.json")) == 2
    assert "--out" in capsys.readouterr().err


def test_random_groups_and_judging():
    truth = HeadSet.of([(0, 1), (1, 2)])
    groups = random_groups(truth, 2, 4, 5, seed=7)
    assert len(groups) == 5 and len(set(groups)) == 5
    assert all(len(g) == 2 and not set(g) & set(truth) for g in groups)
    assert random_groups(truth, 2, 4, 5, seed=7) == groups
    assert len(random_groups(HeadSet.of([(0, 0), (0, 1)]), 1, 3, 5, seed=0)) == 0  # no disjoint group of 2 in 1 head
    assert judge("truth", "pass") is True and judge("truth", "inconclusive") is False
    assert judge("random", "pass") is False and judge("distractor", "fail") is True
    assert judge("proposal", "pass") is None


@pytest.mark.skipif(not HANDWIRED, reason="no hand-wired known models are registered yet")
def test_quick_on_the_handwired_models(tmp_path, monkeypatch):
    """--quick on every registered hand-wired model (built into the tmp HEADLAB_HOME): activation patching finds the
    circuit and the disposer calls the true circuit causal."""
    out = tmp_path / "out"
    assert _run(tmp_path / "home", monkeypatch, "--quick", "--methods", "activation patching (denoise)",
                "activation patching (noise)", "--controls", "3", "--random-groups", "1", "--no-figures",
                "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert {r["case"]["name"] for r in report["results"]} == set(HANDWIRED)
    for result in report["results"]:
        best = max(m["recovery"]["roc_auc"]["value"] for m in result["methods"])
        assert best >= 0.99, result["case"]["name"]


REPORT = Path(__file__).resolve().parents[2] / "docs" / "benchmark"


@pytest.mark.skipif(not (REPORT / "report.json").is_file(), reason="no committed benchmark report")
def test_committed_report_md_is_generated_from_report_json():
    """docs/benchmark/report.md is report_markdown(report.json): every number in it comes from the JSON."""
    from core.cli.benchmark_run import figure_links, report_figures, report_markdown

    report = json.loads((REPORT / "report.json").read_text())
    links = figure_links(report_figures(report))
    assert (REPORT / "report.md").read_text() == report_markdown(report, links)
    assert all((REPORT / name).is_file() for name in links.values())
