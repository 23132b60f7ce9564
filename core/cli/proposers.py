"""`python -m core proposers`: four circuit proposals on one checkpoint, each judged by the same closure test.

The arguments only: the work is in core/cli/proposers_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import PROBE_MODES, PROPOSER_CONTROLS as DEFAULT_CONTROLS, PROPOSER_SUMMARIES, mode_help
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_probe_spec_arguments, seed_arg


def add_proposers_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"{parser.description or ''} Proposers: "
                          + "; ".join(f"{name}: {summary}" for name, summary in PROPOSER_SUMMARIES.items()) + ".")
    parser.add_argument("model", help="zoo name, local Hugging Face folder, or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    add_probe_spec_arguments(parser)
    parser.add_argument("--size", type=int, default=None,
                        help="heads per spectral/gradient proposal (default: the pattern-screen circuit's size)")
    parser.add_argument("--controls", type=int, default=DEFAULT_CONTROLS, help="random control sets per proposal")
    parser.add_argument("--control-kind", choices=("any-layer", "matched"), default="any-layer")
    parser.add_argument("--mode", choices=PROBE_MODES, default="zero", help=mode_help(PROBE_MODES))
    parser.add_argument("--control-seed", type=seed_arg, default=123, help="control draw seed")
    add_backend_arguments(parser)


def cli_proposers(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/proposers_run.py)."""
    from core.cli import proposers_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return proposers_run.cli_proposers(args)
