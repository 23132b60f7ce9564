"""`python -m core benchmark`: every proposer, patching and edge method scored against the known circuits.

Runs core.pipelines.benchmark on the known models (core.zoo.known; default all of them, `--quick`
the hand-wired ones with fewer controls and pairs), prints the score table and the disposer's
verdict accuracy, and with `--out FOLDER` writes report.json, report.md (generated here from
report.json) and the figures. `--from-report report.json --out FOLDER` redraws report.md and the
figures from a finished report without running anything. Finished items are cached, so an
interrupted run resumes where it stopped.

The arguments only: the work is in core/cli/benchmark_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.choices import (BENCHMARK_EDGE_METHODS as EDGE_METHOD_NAMES, BENCHMARK_HEAD_METHODS as HEAD_METHOD_NAMES,
                          BENCHMARK_QUICK as QUICK)
from core.cli.probe import add_device_arguments


def add_benchmark_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", help="known models (zoo names or folders with a circuit.json); "
                        "default: every registered known model (--quick: the hand-wired ones)")
    parser.add_argument("--quick", action="store_true",
                        help=f"hand-wired models only, fewer pairs and controls ({', '.join(f'{k}={v}' for k, v in QUICK.items())})")
    parser.add_argument("--build", action="store_true", help="train registered planted models that are not built yet")
    parser.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                        help=f"methods to score (default all): {', '.join(HEAD_METHOD_NAMES + EDGE_METHOD_NAMES)}")
    parser.add_argument("--controls", type=int, default=None, help="random controls per disposed group (default 20; quick 10)")
    parser.add_argument("--random-groups", type=int, default=None,
                        help="random non-circuit groups disposed of per model (default 10; quick 3)")
    parser.add_argument("--draws", type=int, default=None, help="permutation draws of each baseline (default 1000)")
    parser.add_argument("--max-examples", type=int, default=None, help="pairs per model (default all; quick 48)")
    parser.add_argument("--out", type=Path, default=None, help="write report.json, report.md and figures here")
    parser.add_argument("--from-report", type=Path, default=None,
                        help="redraw report.md and the figures in --out from this report.json; runs nothing")
    parser.add_argument("--no-figures", action="store_true", help="with --out: write report.json and report.md only")
    add_device_arguments(parser)


def cli_benchmark(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/benchmark_run.py)."""
    from core.cli import benchmark_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return benchmark_run.cli_benchmark(args)
