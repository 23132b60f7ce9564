"""`python -m core known`: the models whose circuit is known (hand-wired and planted), built or not;
`--build [NAME ...]` builds them (every hand-wired one when no name is given; a planted one only by name).

The arguments only: the work is in core/cli/known_run.py, imported when the command runs, so `known --help` and a
mistyped flag answer without loading torch and the zoo."""

from __future__ import annotations

import argparse


def add_known_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m core known [--build [NAME ...]]`."""
    parser.add_argument("--build", nargs="*", default=None, metavar="NAME",
                        help="build these known models into the zoo (no name: every hand-wired one, in well under a "
                             "minute; a planted one trains, so it is built only when named)")


def cli_known(args: argparse.Namespace) -> dict:
    """Build what was asked, then list every known model (name, kind, heads, built or not)."""
    from core.cli.known_run import run_known  # torch and the zoo, loaded when the command runs (never for --help)

    return run_known(args)
