"""`python -m core bench load` end to end at tiny settings, the competitor it starts always stops, and the
CLI refuses a malformed HEADLAB_THREADS."""

from __future__ import annotations

import json

import psutil
import pytest

from core.__main__ import main
from core.bench.load import competing_process


def test_bench_load_writes_its_fields(tmp_path):
    out = tmp_path / "load.json"
    assert main(["bench", "load", "--steps", "1", "--repeats", "1", "--n", "8", "--seq-len", "32", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for key in ("slowdown_training", "slowdown_probe", "training_alone_s", "training_loaded_s", "probe_alone_s",
                "probe_loaded_s", "fixed_threads_slowdown_training", "fixed_threads_slowdown_probe"):
        assert result[key] > 0, key
    assert result["slowdown_training"] == pytest.approx(result["training_loaded_s"] / result["training_alone_s"])
    assert result["threads_alone"] >= 1 and result["threads_loaded"] >= 1 and result["fixed_threads"] == 2
    assert result["cpu_count"] >= 1 and result["torch_version"] and result["steps"] == 1


def test_competitor_stops_even_when_interrupted():
    with pytest.raises(KeyboardInterrupt):
        with competing_process() as proc:
            pid = proc.pid
            assert psutil.Process(pid).is_running()
            raise KeyboardInterrupt
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_cli_refuses_a_bad_thread_override(monkeypatch, capsys):
    monkeypatch.setenv("HEADLAB_THREADS", "all")
    assert main(["models"]) == 2
    assert "HEADLAB_THREADS" in capsys.readouterr().err
