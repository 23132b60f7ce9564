"""`python -m core study MODEL --task induction|ioi [--quick] [--out DIR]`: a real model's circuit report.

Runs core/pipelines/study.py (every stage cached, so a rerun resumes), prints the headline figures, and writes
report.json, report.md (generated from that JSON alone, as docs/benchmark's report is) and the figures.

The arguments only: the work is in core/cli/study_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.choices import SKIPPABLE, STUDY_TASKS
from core.cli.probe import add_device_arguments, seed_arg


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name (e.g. smollm2-135m), local Hugging Face folder or hub name")
    parser.add_argument("--task", choices=STUDY_TASKS, required=True,
                        help="induction: both induction probes' screens and the candidate against matched-random "
                             "controls; ioi: logit difference, patching, EAP / EAP-IG edges, MIB faithfulness, roles")
    parser.add_argument("--quick", action="store_true", help="24 examples, 19 controls, 3 EAP-IG steps: minutes")
    parser.add_argument("--n", type=int, default=None, help="examples (default 24 with --quick, else 128)")
    parser.add_argument("--seed", type=seed_arg, default=42, help="probe / pair seed (default 42)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.json, report.md and the figures (default: only print, and --json)")
    parser.add_argument("--allow-small-gap", action="store_true",
                        help="keep (flagged) IOI pairs whose clean-corrupted gap is reversed or under 2 standard errors")
    parser.add_argument("--skip", default="", help=f"IOI stages to leave out, comma-separated ({', '.join(SKIPPABLE)}); "
                        "the report names them under 'Not measured', and a later run without --skip adds them")
    parser.add_argument("--no-figures", action="store_true", help="write report.json and report.md only")
    add_device_arguments(parser)


def cli_study(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/study_run.py)."""
    from core.cli import study_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return study_run.cli_study(args)
