"""`python -m core replicate spectral|closure|attribution`: the papers' claims, tested on the zoo.

Measures each claim (core/pipelines/replicate.py; the claims and their criteria are in
core/pipelines/replicate_claims.py) and writes the report (core/cli/replicate_report.py).

The arguments only: the work is in core/cli/replicate_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.choices import PR_RISE_MARGIN as DEFAULT_MARGIN, REPLICATE_PRESETS as PRESETS, REPLICATE_TARGETS as TARGETS
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_device_arguments, seed_arg


def add_replicate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=TARGETS, help="which paper's claims: spectral [SPC], closure [CVC], attribution [HHG]")
    parser.add_argument("--preset", choices=PRESETS, default="quick",
                        help="zoo preset (quick: one seed per kind, CI-sized; paper: seeds, sorting, data shift)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default $HEADLAB_HOME/reports/replicate-<target>-<preset>); reruns resume there")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=seed_arg, default=42, help="probe seed (default 42)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws per ablation (default 20)")
    parser.add_argument("--closure-controls", type=int, default=5,
                        help="random controls per closure test over training (default 5, as the reference)")
    parser.add_argument("--control-seed", type=seed_arg, default=123, help="seed of the control draws (default 123)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"PR-rise margin above the running minimum, PR units (default {DEFAULT_MARGIN})")
    parser.add_argument("--formats", default="png,svg", help="figure image formats (default png,svg; '' for none)")
    parser.add_argument("--force", action="store_true", help="measure every claim again instead of reusing stored ones")
    add_device_arguments(parser)
    add_backend_arguments(parser)


def cli_replicate(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/replicate_run.py)."""
    from core.cli import replicate_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return replicate_run.cli_replicate(args)
