"""The --backend / --address flags every long command shares, and the executor they choose (core/executor.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from core.choices import BACKENDS

if TYPE_CHECKING:  # the annotation only: core.executor loads torch, and the flags must not
    from core.executor import Executor


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="serial",
                        help="serial: one task after another here (default); ray: spread tasks over a Ray cluster")
    parser.add_argument("--address", default=None,
                        help="with --backend ray: 'auto' (the cluster this machine joined with `ray start`) or HOST:PORT; "
                             "default: start a local Ray instance on this machine's cores")


def executor_from_args(args: argparse.Namespace) -> Executor:
    from core.executor import make_executor  # torch, loaded when a command runs (never for --help)

    return make_executor(args.backend, args.address)
