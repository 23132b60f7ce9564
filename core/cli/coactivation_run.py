"""`python -m core coactivation`: Ising co-activation communities and their closure test [CVC].

The work only: the arguments, and what the command does, are in core/cli/coactivation.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from core.cli.backend import executor_from_args
from core.cli.probe_run import probe_spec_from_args
from core.figures.bundle import export_bundle
from core.figures.coactivation import coactivation_bundles
from core.model.refs import ModelRef
from core.pipelines.coactivation import CoactivationReport, CoactivationSettings, coactivation
from core.stats.inference import METRICS


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
