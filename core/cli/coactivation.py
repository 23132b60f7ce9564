"""`python -m core coactivation`: Ising co-activation communities and their closure test [CVC].

The flags map one to one onto core.pipelines.coactivation.CoactivationSettings; the summary
printed here is the report's own `summary()`.

The arguments only: the work is in core/cli/coactivation_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import (CLOSURE_CONTROL_SEED as DEFAULT_CONTROL_SEED, CLOSURE_CONTROLS as DEFAULT_N_CONTROLS,
                          COACTIVATION_NULL as DEFAULT_N_NULL, COACTIVATION_STRATA as DEFAULT_STRATA, ISING_C as DEFAULT_C,
                          PROBE_MODES, mode_help)
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_probe_spec_arguments, seed_arg


def add_coactivation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    add_probe_spec_arguments(parser)
    parser.add_argument("--route-conditional", action="store_true",
                        help="MoE models: strata from the router weights at q, one Ising fit per stratum, the "
                             "random-partition null, closure on and off the discovery stratum")
    parser.add_argument("--top-k", type=float, default=None,
                        help="labelled top-K PR-integral heads: a count or a fraction (default max(round(0.18 n), min(n, 16)))")
    parser.add_argument("--ks", type=int, nargs="+", default=None,
                        help="numbers of clusters to score by ARI (default 4 6 8 10 12 up to half the heads)")
    parser.add_argument("--k", type=int, default=None, help="fix k (default: the best-ARI k)")
    parser.add_argument("--n-init", type=int, default=1, help="k-means restarts of the candidate clustering (reference 1)")
    parser.add_argument("--min-size", type=int, default=None, help="smallest candidate (default min(4, max(2, n/8)))")
    parser.add_argument("--max-size", type=int, default=None,
                        help="largest candidate (default: up to min(12, n/2), leaving 5 any-layer control sets)")
    parser.add_argument("--C", type=float, default=DEFAULT_C, help="inverse L2 strength of the fit (reference 1000)")
    parser.add_argument("--drop-constant", action="store_true",
                        help="leave heads whose spin never changes out of the fit instead of stopping")
    parser.add_argument("--strata", type=int, default=DEFAULT_STRATA, help="routing strata K (reference 4)")
    parser.add_argument("--null", type=int, default=DEFAULT_N_NULL, help="random partitions of the null (reference 10)")
    parser.add_argument("--null-partition", choices=("matched", "reference"), default="matched",
                        help="matched: exact stratum sizes (default); reference: uniform labels")
    parser.add_argument("--controls", type=int, default=DEFAULT_N_CONTROLS, help="random controls per kind (default 5)")
    parser.add_argument("--control-seed", type=seed_arg, default=DEFAULT_CONTROL_SEED)
    parser.add_argument("--mode", choices=PROBE_MODES, default="zero", help=mode_help(PROBE_MODES))
    parser.add_argument("--no-closure", action="store_true", help="stop after the proposal (no ablation)")
    parser.add_argument("--allow-unconverged", action="store_true",
                        help="cluster an Ising fit that did not converge (refused by default: its J is not the optimum)")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="also export the figures (PNG/SVG/PDF + CSV/JSON) into DIR")
    add_backend_arguments(parser)


def cli_coactivation(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/coactivation_run.py)."""
    from core.cli import coactivation_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return coactivation_run.cli_coactivation(args)
