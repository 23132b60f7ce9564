"""The benchmarks' command line (core/cli/bench.py): the machine record and `bench all` on a stand-in bench."""

from __future__ import annotations

import argparse
import json

import pytest

import core.cli.bench as bench
from core.__main__ import main
from core.errors import HeadLabError


def test_machine_record_names_the_machine_and_the_commit():
    record = bench.machine_record()
    assert record["cpu_count"] >= 1 and record["torch_threads"] >= 1
    assert len(record["load_average_at_start"]) == 3
    assert record["date_utc"].endswith("+00:00")
    assert record["commit"] is None or len(record["commit"]) == 40


def _stand_in(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=3)


def test_bench_all_writes_one_json_per_bench_with_its_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "BENCHES", {"square": (_stand_in, lambda args: {"n": args.n, "square": args.n ** 2}, "x")})
    out = tmp_path / "measurements"
    assert main(["bench", "all", "--out", str(out)]) == 0
    written = json.loads((out / "bench-square.json").read_text())
    assert (written["n"], written["square"]) == (3, 9)  # the bench ran at its defaults
    assert written["machine"]["cpu_count"] >= 1 and written["bench_wall_s"] >= 0


def test_bench_all_refuses_to_run_nothing(tmp_path):
    args = argparse.Namespace(out=tmp_path, only=["ising"], skip=["ising"])
    with pytest.raises(HeadLabError, match="no benchmark"):
        bench.cli_bench_all(args)
