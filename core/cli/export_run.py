"""`python -m core export MODEL --figure spectral|screen|ablation|attribution --out DIR`: the app's figures, headless.

The work only: the arguments, and what the command does, are in core/cli/export.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from core.executor import ProgressBar
from core.ablation.study import AblationSettings, ablation_study
from core.choices import PROBE_FIGURES, SEQUENCE_FIGURES
from core.cli.backend import executor_from_args
from core.cli.probe_run import probe_spec_from_args
from core.errors import HeadLabError
from core.figures.ablation import ablation_bundles
from core.figures.attribution import attribution_bundles
from core.figures.bundle import IMAGE_FORMATS, export_bundle
from core.figures.screen import screen_bundles
from core.figures.spectral import spectral_bundles
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import load_model
from core.model.refs import ModelRef, list_checkpoints, resolve_checkpoint
from core.pipelines.attribution import analyze_ref, manifest_task, stored_result, stored_summaries
from core.pipelines.attribution_results import AttributionSettings
from core.pipelines.recipe import ScreenSettings, screen, screen_checkpoint
from core.probe import head_stats
from core.tasks.sequences import TASKS as SEQUENCE_TASKS
from core.workspace import check_output_folder


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip().lower() for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in IMAGE_FORMATS]
    if bad:
        raise HeadLabError(f"unknown image format(s) {', '.join(bad)}; use some of {', '.join(IMAGE_FORMATS)}.")
    return formats


def cli_export(args: argparse.Namespace) -> dict:
    """Write the chosen figures for MODEL into --out; returns the files written."""
    check_output_folder(args.out, "--out")  # before any model runs
    formats = _formats(args.formats)
    ref = ModelRef.parse(args.model)
    sequence_model = manifest_task(ref) in SEQUENCE_TASKS
    if "all" in args.figure:
        wanted = SEQUENCE_FIGURES if sequence_model else PROBE_FIGURES
    else:
        wanted = tuple(dict.fromkeys(args.figure))
    if sequence_model and set(wanted) & set(PROBE_FIGURES):
        raise HeadLabError(f"{ref.name} is a reversal/sorting model: export --figure attribution (the probe figures "
                           "need an induction or text model).")
    if sequence_model:
        return _export_attribution(ref, args, formats)
    spec = probe_spec_from_args(args)
    k = args.k
    checkpoint = resolve_checkpoint(ref, args.revision)
    report = None
    if "spectral" in wanted or "screen" in wanted or not args.heads:  # an ablation of given heads needs no screen
        bar = ProgressBar(total=len(list_checkpoints(ref)), unit="ckpt", desc=f"screen {ref.name}"[-40:])
        try:
            settings = ScreenSettings(k=k, definition=args.pr,
                                      n_null_draws=500 if args.task == "induction" else 0)  # the null is an induction statistic
            report = screen(ref, spec, settings, device=args.device,
                            progress=lambda done, total, revision: bar.update(1), dtype=args.dtype,
                            executor=executor_from_args(args))
        finally:
            bar.close()
        index = [c.revision for c in report.checkpoints].index(checkpoint.revision)
    stem = Path(str(ref.name)).name
    out_dir = Path(args.out)
    written: list[Path] = []
    if "spectral" in wanted and report.spectral is None:
        print(f"{report.spectral_note} No spectral figures are written.")
    elif "spectral" in wanted:
        for bundle in spectral_bundles(report):
            written += export_bundle(bundle, out_dir, f"{stem}-", formats)
    here = None  # Step 2 at the chosen checkpoint: membership and null floor
    if report is not None:
        here = report.final if index == len(report.checkpoints) - 1 else _checkpoint_screen(ref, checkpoint, spec, args)
    if "screen" in wanted:
        patterns = args.pattern or list(report.final.patterns)
        unknown = [p for p in patterns if p not in report.final.patterns]
        if unknown:
            raise HeadLabError(f"unknown pattern(s) {', '.join(unknown)}; use some of {', '.join(report.final.patterns)}.")
        for bundle in screen_bundles(report, index, patterns, here):
            written += export_bundle(bundle, out_dir, f"{stem}-", formats)
    ablation = None
    if "ablation" in wanted:
        ablation = _run_ablation(args, ref, checkpoint, report, here, spec)
        for bundle in ablation_bundles(ablation["result"], ref.name, checkpoint.revision):
            written += export_bundle(bundle, out_dir, f"{stem}-", formats)
    for path in written:
        print(path)
    out = {"model": ref.name, "figures": list(wanted), "revision": checkpoint.revision,
           "probe_spec": spec.to_json(), "files": [str(p) for p in written]}
    if ablation is not None:
        out["ablation"] = {"heads": str(ablation["result"].selection), "seconds": ablation["seconds"],
                           "verdicts": {k: v.to_json() for k, v in ablation["result"].verdicts.items()}}
    return out


def _export_attribution(ref: ModelRef, args: argparse.Namespace, formats: tuple[str, ...]) -> dict:
    """[HHG] figures of one reversal/sorting model (its stored preset result when there is one, else a
    fresh analysis with default settings), plus the seed-level figures of the stored results of its task."""
    settings = AttributionSettings(task=manifest_task(ref))
    revision = resolve_checkpoint(ref, args.revision).revision
    result = stored_result(ref.name, settings, revision, args.dtype) if ref.kind == "zoo" else None
    if result is None:
        result = analyze_ref(ref, settings, revision, device=args.device, dtype=args.dtype)
    written: list[Path] = []
    for bundle in attribution_bundles(result, stored_summaries(settings.task)):
        written += export_bundle(bundle, Path(args.out), "", formats)  # names carry the model or the task
    for path in written:
        print(path)
    return {"model": ref.name, "figures": ["attribution"], "revision": revision, "files": [str(p) for p in written]}


def _checkpoint_screen(ref: ModelRef, checkpoint, spec, args: argparse.Namespace):
    """Step 2 at one (non-final) checkpoint, from the HeadStats cache the screen just filled."""
    stats = head_stats(ref, checkpoint, spec, device=args.device, dtype=args.dtype)
    return screen_checkpoint(stats, n_null_draws=500 if args.task == "induction" else 0)


def _run_ablation(args: argparse.Namespace, ref: ModelRef, checkpoint, report, here, spec) -> dict:
    """Group ablation of --heads (default: the screened circuit at the chosen checkpoint, else top-K)."""
    model = load_model(ref, checkpoint.revision, device=args.device, dtype=args.dtype)
    if args.heads:
        heads = parse_heads(args.heads, int(model.cfg.n_layers), int(model.cfg.n_heads))
    else:
        heads = here.induction_heads
        if len(heads) == 0 and report.spectral is None:
            raise HeadLabError(f"no head reaches the membership threshold ({here.induction_threshold:.3g}x) at "
                               f"{checkpoint.revision}, and there is no top-K to ablate instead. {report.spectral_note} "
                               "Give the heads to ablate with --heads.")
        if len(heads) == 0:
            heads = HeadSet(tuple(report.spectral.top_heads))
            print(f"no head reaches the membership threshold ({here.induction_threshold:.3g}x) at "
                  f"{checkpoint.revision}; ablating the top-K spectral heads instead.")
    start = time.perf_counter()
    settings = AblationSettings(n_controls=args.controls, controls=args.control_kind, mode=args.mode,
                                seed=args.control_seed)
    result = ablation_study(model, spec.build(), heads, settings, device=args.device)
    seconds = time.perf_counter() - start
    for name, verdict in result.verdicts.items():
        print(f"{name}: {verdict.label} ({verdict.rule})")
    print(f"ablated {', '.join(head_name(h) for h in heads)} with {len(result.controls)} controls in {seconds:.1f}s")
    return {"result": result, "seconds": seconds}
