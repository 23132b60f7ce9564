"""`python -m core proposers`: four circuit proposals on one checkpoint, each judged by the same closure test.

The work only: the arguments are in core/cli/proposers.py, which imports this module when the command runs.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from core.cli.backend import executor_from_args
from core.cli.probe_run import probe_spec_from_args
from core.model.refs import ModelRef
from core.pipelines.proposers import DISPOSER, proposers_vs_disposer


def cli_proposers(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    disposer = replace(DISPOSER, n_controls=args.controls, controls=args.control_kind, mode=args.mode,
                       seed=args.control_seed)
    report = proposers_vs_disposer(ref, args.revision, probe_spec_from_args(args), args.size, disposer, args.device,
                                   progress=print, dtype=args.dtype, executor=executor_from_args(args))
    for row in report.rows():
        z = {k[2:]: v for k, v in row.items() if k.startswith("z ") and v is not None}
        z_text = "  ".join(f"z_{m}={v:+.2f}" for m, v in z.items() if not math.isnan(v))
        print(f"{row['method']:15s} [{row['heads'] or '-'}]  {row['verdict (paper)']}  {z_text}")
    print(f"survive closure (paper rule): {', '.join(report.survivors()) or 'none'}")
    return report.to_json()
