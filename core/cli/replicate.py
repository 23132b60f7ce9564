"""`python -m core replicate spectral|closure|attribution`: the papers' claims, tested on the zoo.

Measures each claim (core/pipelines/replicate.py; the claims and their criteria are in
core/pipelines/replicate_claims.py) and writes the report (core/cli/replicate_report.py).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from core.cli.backend import add_backend_arguments, executor_from_args
from core.cli.probe import add_device_arguments, seed_arg
from core.executor import Executor
from core.model.memory import check_probe_batch_fits
from core.cli.replicate_report import FigureWriter, ReplicationReport, claim_figures, write_report
from core.pipelines.replicate import ReplicateSettings, run_claim
from core.pipelines.replicate_claims import ATTRIBUTION_VARIANTS, PRESETS, TARGETS, claims_of
from core.stats.dynamics import DEFAULT_MARGIN
from core.workspace import check_output_folder, reports_dir


def replicate(target: str, settings: ReplicateSettings = ReplicateSettings(), out: Optional[Path] = None,
              formats: Sequence[str] = ("png", "svg"), force: bool = False,
              say: Callable[[str], None] = print, executor: Optional[Executor] = None) -> ReplicationReport:
    """Measure every claim of `target` on the preset's zoo and write the report under `out`.

    executor: where the probe passes over every checkpoint run (a Ray cluster spreads them)."""
    claims = claims_of(target)
    out = Path(out) if out is not None else reports_dir() / f"replicate-{target}-{settings.preset}"
    out.mkdir(parents=True, exist_ok=True)
    variants = ATTRIBUTION_VARIANTS if target == "attribution" else ("mean",)  # one pass per [HHG] mean variant
    contexts = [settings.context(target, out, force=force, say=say, executor=executor, ablation_mode=variant)
                for variant in variants]
    started = time.perf_counter()
    results, bundles = [], {}
    for ctx in contexts:
        for claim in claims:
            result, artifacts = run_claim(claim, ctx, force)
            say(f"{result.key}: {result.verdict}")
            results.append(result)
            bundles[result.key] = claim_figures(claim.id, result.measured, artifacts)
    writer = FigureWriter(out / "figures", formats)
    final = []
    for claim in results:
        files = [f for bundle in bundles[claim.key] for f in writer.write(bundle, f"{claim.key}-{bundle.name}")]
        final.append(replace(claim, figures=tuple(files)))
    run_settings = contexts[0].settings()
    if target == "attribution":
        run_settings["attribution_variants"] = list(variants)
        run_settings["attribution"].pop("ablation_mode")
    report = ReplicationReport(target, settings.preset, tuple(final), out, time.perf_counter() - started, run_settings,
                               writer.note, tuple(writer.files))
    write_report(report, writer)
    return report


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
    formats = tuple(f.strip().lower() for f in str(args.formats).split(",") if f.strip())
    check_probe_batch_fits(args.n, args.seq_len)
    if args.out is not None:
        check_output_folder(args.out, "--out")
    settings = ReplicateSettings(preset=args.preset, n_examples=args.n, seq_len=args.seq_len, probe_seed=args.seed,
                                 n_controls=args.controls, closure_controls=args.closure_controls,
                                 control_seed=args.control_seed, margin=args.margin, device=args.device,
                                 dtype=args.dtype)
    report = replicate(args.target, settings, args.out, formats, args.force, say=lambda text: print(f"... {text}"),
                       executor=executor_from_args(args))
    width = max(len(c.key) for c in report.claims)
    for c in report.claims:
        print(f"{c.key:{width}s}  {c.verdict}")
    if report.figure_note:
        print(f"note: {report.figure_note}")
    print(f"report: {report.out / 'report.md'} (and report.html, report.json); {report.seconds:.1f} s")
    return {"target": report.target, "preset": report.preset, "out": str(report.out), "seconds": report.seconds,
            "claims": [{"id": c.id, "variant": c.variant, "verdict": c.verdict, "measured": c.measured_text}
                       for c in report.claims]}
