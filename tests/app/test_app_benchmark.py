"""The Benchmark page (AppTest): it draws the committed report's tables and curves, hands a proposal to the
ablation lab on its model, and says what is wrong with a missing or corrupt report instead of failing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamlit.testing.v1 import AppTest

from core.heads import HeadSet, parse_heads
from core.workspace import zoo_dir
from core.zoo.known import KNOWN_MODELS
from core.pipelines.benchmark_report import HEAD_TO_HEAD
from pages.benchmark import REPORTS
from tests.app.test_app import APP, chart, errors

FULL = json.loads(REPORTS["full (committed)"].read_text())
MODEL = "known-induction-neox"  # hand-wired: built in well under a second


def benchmark_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("pages/benchmark.py")
    at.run()
    assert not at.exception, at.exception
    return at


def test_page_draws_the_committed_report():
    at = benchmark_page()
    assert errors(at) == []
    head = at.dataframe[0].value
    expected = {(r["method"], r["task"]) for r in FULL["table"] if r["level"] == "head"}
    assert set(zip(head["method"], head["task"])) == expected
    row = next(r for r in FULL["table"] if r["level"] == "head" and r["measure"] == "roc_auc"
               and r["method"] == "activation patching (denoise)" and r["task"] == "planted-induction-neox")
    shown = head[(head["method"] == row["method"]) & (head["task"] == row["task"])].iloc[0]
    assert shown["ROC AUC"].startswith(f"{row['mean']:.3f} [{row['low']:.2f}, {row['high']:.2f}]")
    assert shown["ROC AUC random"] == row["baseline_mean"]
    edge = at.dataframe[1].value
    assert set(edge["method"]) == {m["name"] for m in FULL["edge_methods"]}
    between = at.dataframe[2].value  # the same methods on the edges between heads
    row = next(r for r in FULL["table"] if r["level"] == HEAD_TO_HEAD and r["measure"] == "average_precision"
               and r["method"] == "EAP" and r["task"] == "hard-ioi")
    shown = between[(between["method"] == "EAP") & (between["task"] == "hard-ioi")].iloc[0]
    assert shown["PR AUC"].startswith(f"{row['mean']:.3f} [{row['low']:.2f}, {row['high']:.2f}]")
    published = at.dataframe[3].value
    assert list(published["value"]) == [p["value"] for p in FULL["published"]["rows"]]
    verdicts = at.dataframe[4].value
    assert list(verdicts["accuracy"].fillna(-1)) == [v["rate"] if v["rate"] is not None else -1
                                                     for v in FULL["verdicts"].values()]
    heat = chart(at, "bench_heat_head")["data"][0]
    assert len(heat["y"]) == len(FULL["methods"]) + len(FULL["published"]["rows"])
    first = FULL["results"][0]
    curves = [t for t in chart(at, "bench_roc")["data"] if t.get("showlegend", True) and t["name"]]
    assert {t["name"] for t in curves} == {m["method"] for m in first["methods"] if m.get("scores") is not None}


def test_open_sends_the_proposal_and_its_model_to_the_lab():
    if not (zoo_dir() / MODEL).is_dir():
        KNOWN_MODELS[MODEL](progress=False)
    result = next(r for r in FULL["results"] if r["case"]["name"] == MODEL)
    entry = next(m for m in result["methods"] if m["method"] == "activation patching (denoise)")
    at = benchmark_page()
    at.selectbox(key="bench_send").set_value(f"{entry['method']} · {MODEL}").run()
    assert not at.button(key="bench_open").disabled
    at.button(key="bench_open").click().run()
    assert not at.exception, at.exception
    heads = str(HeadSet(parse_heads(", ".join(entry["proposal"])).heads))
    assert at.session_state["model"] == MODEL
    assert at.session_state["ablation_heads_model"] == MODEL
    assert at.session_state["heads_text"] == heads
    assert at.session_state["ablation_mode"] == result["case"]["mode"]
    assert at.text_input(key="heads_text").value == heads  # the lab drew its head box with the proposal
    assert errors(at) == []  # the probe was switched to one the model reads (an induction probe over 0..23)


def test_missing_and_corrupt_reports_are_errors_not_tracebacks(tmp_path):
    at = benchmark_page()
    at.radio(key="bench_report").set_value("another report.json").run()
    at.text_input(key="bench_path").set_value(str(tmp_path / "absent.json")).run()
    assert not at.exception, at.exception
    assert any("no benchmark report at" in e for e in errors(at))
    bad = tmp_path / "report.json"
    bad.write_text("{not json")
    at.text_input(key="bench_path").set_value(str(bad)).run()
    assert not at.exception, at.exception
    assert any("cannot read the benchmark report" in e for e in errors(at))
    bad.write_text(json.dumps({"table": [], "results": [{"case": {}}], "methods": [], "verdicts": {}}))
    at.text_input(key="bench_path").set_value(str(tmp_path / "report.json ")).run()
    assert not at.exception, at.exception
    assert any("does not read as a benchmark report" in e for e in errors(at))


def test_run_button_writes_a_report_the_page_then_shows(monkeypatch):
    """The Run button on one hand-wired model, one method, few controls (the button's path, not the full quick run)."""
    import core.pipelines.benchmark as bench

    if not (zoo_dir() / MODEL).is_dir():
        KNOWN_MODELS[MODEL](progress=False)
    small = dict(methods=("pattern screen",), n_controls=2, n_random_groups=1, n_draws=50, n_boot=50,
                 disposer_boot=10, max_examples=16)
    monkeypatch.setattr(bench, "QUICK", small)
    monkeypatch.setattr(bench, "known_cases", lambda **kwargs: ([bench.known_case(MODEL)], []))
    at = benchmark_page()
    at.button(key="bench_run").click().run()
    assert not at.exception, at.exception
    assert errors(at) == []
    assert at.radio(key="bench_report").value == "quick (run here)"
    written = json.loads((Path(os.environ["HEADLAB_HOME"]) / "reports" / "benchmark-quick" / "report.json").read_text())
    assert written["quick"] is True and [m["name"] for m in written["methods"]] == ["pattern screen"]
    head = at.dataframe[0].value
    assert list(head["task"]) == [MODEL] and list(head["method"]) == ["pattern screen"]
