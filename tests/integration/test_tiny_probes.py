"""Tiny probes (issue 33): `ablate --n 1`, a one-record probe file and `--controls 2` print "inconclusive",
with the minimum the verdict rule needs, instead of a full verdict; z is flagged below 10 controls."""

from __future__ import annotations

import json

from core.__main__ import main
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo

MODEL = "tiny-small-probe-neox"


def _verdicts(path) -> dict:
    return json.loads(path.read_text())["result"]["verdicts"]


def test_ablate_on_one_example_is_inconclusive(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    out = tmp_path / "one.json"
    assert main(["ablate", MODEL, "--heads", "L1H0", "--n", "1", "--seq-len", "16", "--controls", "20",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    verdicts = _verdicts(out)
    assert verdicts and all(v["label"] == "inconclusive" for v in verdicts.values())
    assert all(v["reasons"][0].startswith("only 1 example: a verdict needs at least 10") for v in verdicts.values())
    assert "only 1 example" in printed and "rank " in printed and "population sd (ddof=0)" in printed


def test_a_one_record_probe_file_and_two_controls_are_inconclusive(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
    probe = tmp_path / "one.jsonl"
    probe.write_text('{"prompt": "When Mary met John, John gave it to", "target": " Mary"}\n')
    out = tmp_path / "file.json"
    assert main(["ablate", MODEL, "--heads", "L1H0", "--probe-file", str(probe), "--controls", "2",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert all(v["label"] == "inconclusive" for v in _verdicts(out).values())
    assert "z unreliable: fewer than 10 controls" in printed
    assert "2 controls cannot reach p < 0.05" in printed and "use at least 19" in printed
