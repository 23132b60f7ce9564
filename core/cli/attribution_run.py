"""`python -m core attribution`: gradient attribution vs causal importance [HHG] on one model or a zoo preset.

The work only: the arguments are in core/cli/attribution.py, which imports this module when the command runs.
"""

from __future__ import annotations

import argparse

from core.executor import ProgressBar
from core.cli.backend import executor_from_args
from core.ablation.spec import mode_label
from core.errors import HeadLabError
from core.model.refs import ModelRef
from core.pipelines.attribution import analyze_ref, attribution_dir, postfix_progress, run_preset
from core.pipelines.attribution_results import AttributionResult, AttributionSettings, AttributionSummary


def cli_attribution(args: argparse.Namespace) -> dict:
    """One model (MODEL) -> its AttributionResult JSON; --zoo-preset -> the AttributionSummary JSON."""
    settings = AttributionSettings(
        task=args.task, gradient_variant=args.gradient_variant, n_batches=args.n_batches, batch_size=args.batch_size,
        ablation_mode=args.ablation, n_examples=args.n_examples, seed=args.seed, threshold=args.threshold,
        rule=args.rule, ood_length=args.ood_length,
    )
    if args.zoo_preset is not None:
        if args.model is not None:
            raise HeadLabError("give either MODEL or --zoo-preset, not both.")
        executor = executor_from_args(args)  # serial: models here one by one, each with its stages in the bar
        summary, paths = run_preset(args.zoo_preset, settings, args.device, not args.no_progress, args.force, args.dtype,
                                    executor=None if executor.backend == "serial" else executor)
        print(_summary_line(summary))
        print(f"per-model results in {attribution_dir()}")
        out = summary.to_json()
        out["paths"] = {k: str(v) for k, v in paths.items()}
        return out
    if args.model is None:
        raise HeadLabError("give a MODEL (zoo name or folder) or --zoo-preset paper.")
    ref = ModelRef.parse(args.model)
    with ProgressBar(total=None, desc=f"attribution {ref.name[-40:]}", bar_format="{desc}{postfix}", disable=args.no_progress) as bar:
        result = analyze_ref(ref, settings, args.revision, args.device, None if args.no_progress else postfix_progress(bar, ""),
                             args.dtype)
    print(_result_line(result))
    return result.to_json()


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "undefined" if value is None else format(value, fmt)


def _result_line(r: AttributionResult) -> str:
    ratio = r.joint_bloats.ratio_to_mean
    return (
        f"{r.model} ({mode_label(r.settings.ablation_mode)} ablation): OOD length {r.ood_length} "
        f"(clean {r.clean_accuracy:.2f}), rho {_num(r.rho)}, "
        f"heroes {', '.join(r.members('hero')) or 'none'}, bloats {', '.join(r.members('bloat')) or 'none'}, "
        f"bloat joint/mean-single {_num(ratio, '.1f')}" + ("" if ratio is not None else f" ({r.joint_bloats.reason})")
    )


def _summary_line(s: AttributionSummary) -> str:
    return (
        f"{s.task} ({mode_label(s.settings.ablation_mode)} ablation): {s.n_models} models, "
        f"rho {_num(s.rho_mean)} +- {_num(s.rho_std)} "
        f"(min {_num(s.rho_min)}, max {_num(s.rho_max)}), skipped {len(s.skipped)}"
    )
