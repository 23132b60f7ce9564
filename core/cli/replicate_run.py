"""`python -m core replicate spectral|closure|attribution`: the papers' claims, tested on the zoo.

The work only: the arguments, and what the command does, are in core/cli/replicate.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from core.cli.backend import executor_from_args
from core.executor import Executor
from core.model.memory import check_probe_batch_fits
from core.cli.replicate_report import FigureWriter, ReplicationReport, claim_figures, write_report
from core.pipelines.replicate import ReplicateSettings, run_claim
from core.pipelines.replicate_claims import ATTRIBUTION_VARIANTS, claims_of
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
