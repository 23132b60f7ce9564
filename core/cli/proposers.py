"""`python -m core proposers`: four circuit proposals on one checkpoint, each judged by the same closure test."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from core.ablation.spec import PROBE_MODES, mode_help
from core.cli.backend import add_backend_arguments, executor_from_args
from core.cli.probe import add_probe_spec_arguments, probe_spec_from_args, seed_arg
from core.model.refs import ModelRef
from core.pipelines.proposers import DEFAULT_CONTROLS, DISPOSER, PROPOSERS, proposers_vs_disposer


def add_proposers_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"{parser.description or ''} Proposers: "
                          + "; ".join(f"{p.name}: {p.summary}" for p in PROPOSERS) + ".")
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
