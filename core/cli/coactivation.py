"""`python -m core coactivation`: Ising co-activation communities and their closure test [CVC].

The flags map one to one onto core.pipelines.coactivation.CoactivationSettings; the summary
printed here is the report's own `summary()`.
"""

from __future__ import annotations

import argparse
from typing import Any

from core.ablation.spec import PROBE_MODES, mode_help
from core.cli.backend import add_backend_arguments, executor_from_args
from core.cli.probe import add_probe_spec_arguments, probe_spec_from_args, seed_arg
from core.figures.bundle import export_bundle
from core.figures.coactivation import coactivation_bundles
from core.model.refs import ModelRef
from core.pipelines.closure import DEFAULT_CONTROL_SEED, DEFAULT_N_CONTROLS
from core.pipelines.coactivation import (DEFAULT_N_NULL, DEFAULT_STRATA, CoactivationReport, CoactivationSettings,
                                         coactivation)
from core.stats.inference import METRICS
from core.stats.ising import DEFAULT_C


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


def settings_from_args(args: argparse.Namespace) -> CoactivationSettings:
    """The settings the flags describe (--top-k: a count when >= 1, else a fraction)."""
    top_k = None if args.top_k is None else (int(args.top_k) if args.top_k >= 1 else float(args.top_k))
    return CoactivationSettings(route_conditional=args.route_conditional, top_k=top_k, ks=args.ks, k=args.k,
                                n_init=args.n_init, min_size=args.min_size, max_size=args.max_size, C=args.C,
                                drop_constant=args.drop_constant, n_strata=args.strata, n_null=args.null,
                                partition=args.null_partition, run_closure=not args.no_closure,
                                n_controls=args.controls, control_seed=args.control_seed, mode=args.mode,
                                allow_unconverged=args.allow_unconverged)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.3g}" if abs(value) < 1e4 else f"{value:+.2e}"
    return str(value)


def print_summary(report: CoactivationReport) -> None:
    s = report.summary()
    print(f"co-activation: {report.model} @ {report.revision}, {report.probe_spec.get('task')} probe, "
          f"N = {report.provenance.get('n_examples')}, {report.shape[0]} x {report.shape[1]} heads; "
          f"{len(report.labels)} labelled heads (top-K PR integral)")
    if report.route is not None:
        r = s["route"]
        print(f"route strata (K = {report.route.n_strata}): sizes {r['sizes']}, best ARI per stratum "
              + ", ".join(f"{a:.3f}" for a in r["per_stratum_ari"])
              + f"; statistic {r['max_ari']:.3f} vs null {r['null_mean']:.3f} +- {r['null_std']:.3f} -> z = {_fmt(r['z'])}; "
              f"discovery stratum {r['discovery_stratum']}")
    fit = report.proposal.fit
    print(f"Ising fit ({fit.method}): " + (f"converged in {fit.n_iter} iterations" if fit.converged else
          f"WARNING did NOT converge in {fit.n_iter} iterations (clustered anyway: --allow-unconverged)"))
    print("ARI by k: " + ", ".join(f"k={k}: {v:.3f}" for k, v in s["ari_at_k"].items())
          + f"  -> k = {s['k']} ({s['k_rule']})")
    print(f"candidate community {s['candidate_cluster']}: {', '.join(s['candidate'])} "
          f"(purity {s['purity']:.3f}, isolation {s['isolation']:.3f}, score {s['combined_score']:.3f})")
    if report.closure is not None:
        print(f"closure test ({report.closure.n_controls} controls per kind, {report.closure.mode} ablation, "
              f"headline {report.closure.headline}):")
        print(f"  {'controls':10s}{'split':6s}{'n':>5s}" + "".join(f"{'d ' + m:>15s}{'z':>11s}" for m in METRICS)
              + "   paper / reference")
        for row in s["closure"]:
            cells = "".join(f"{row['delta'][m]:>+15.4g}{_fmt(row['z'][m]):>11s}" for m in METRICS)
            print(f"  {row['kind']:10s}{row['split']:6s}{row['n']:>5d}{cells}   {row['verdict_paper']} / "
                  f"{row['verdict_reference']}")
    for note in report.notes:
        print(f"note: {note}")


def cli_coactivation(args: argparse.Namespace) -> dict:
    report = coactivation(ModelRef.parse(args.model), args.revision, probe_spec_from_args(args),
                          settings_from_args(args), device=args.device, say=lambda text: print(f"... {text}"),
                          dtype=args.dtype, executor=executor_from_args(args))
    print_summary(report)
    if args.figures:
        for bundle in coactivation_bundles(report):
            export_bundle(bundle, args.figures)
        print(f"figures written to {args.figures}")
    return report.to_json()
