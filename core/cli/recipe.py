"""`python -m core screen | ablate | recipe`: the spectral probe-circuit recipe [SPC] from the command line.

Each command parses its flags, runs core.pipelines.recipe with a tqdm progress bar, prints the
figures a reader wants first, and returns the full result (the CLI writes it with --json).
"""

from __future__ import annotations

import argparse

from tqdm import tqdm

from core.ablation.study import AblationSettings, summarize_ablation
from core.cli.backend import add_backend_arguments, executor_from_args
from core.cli.probe import add_probe_spec_arguments, probe_spec_from_args, seed_arg
from core.heads import parse_heads
from core.model.loading import load_config
from core.model.refs import ModelRef, list_checkpoints, resolve_checkpoint
from core.pipelines.recipe import ScreenSettings, ablate, run_recipe, screen
from core.stats.selectivity import CLASS_THRESHOLD
from core.stats.spectral import DEFAULT_DEFINITION, DEFAULT_RULE


def add_screen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    add_probe_spec_arguments(parser)
    add_backend_arguments(parser)
    parser.add_argument("--k", type=float, default=0.18, help="top-K: a count (>= 1) or a fraction (default 0.18)")
    parser.add_argument("--pr", choices=("entropy", "classic"), default=DEFAULT_DEFINITION,
                        help="PR definition (default: entropy effective rank, the reference code's)")
    parser.add_argument("--rule", choices=("trapezoid", "paper_sum"), default=DEFAULT_RULE,
                        help="PR-integral rule (default trapezoid on log tokens)")
    parser.add_argument("--baseline", choices=("random", "uniform"), default="random")
    parser.add_argument("--class-threshold", type=float, default=CLASS_THRESHOLD)
    parser.add_argument("--induction-threshold", type=float, default=None,
                        help="membership threshold (uniform baseline); default 50x at T=256, scaled to the "
                             "probe length (12.5x at T=64: the same 19.5%% attention share)")


def _k_from_arg(k: float) -> int | float:
    return int(k) if k >= 1 else float(k)


def cli_screen(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    settings = ScreenSettings(k=_k_from_arg(args.k), definition=args.pr, rule=args.rule, baseline=args.baseline,
                              class_threshold=args.class_threshold, induction_threshold=args.induction_threshold)
    bar = tqdm(total=len(list_checkpoints(ref)), unit="ckpt", desc=f"screen {ref.name}")

    def progress(done: int, total: int, revision: str) -> None:
        bar.set_postfix_str(revision)
        bar.update(1)

    try:
        report = screen(ref, probe_spec_from_args(args), settings, device=args.device, progress=progress,
                        dtype=args.dtype, executor=executor_from_args(args))
    finally:
        bar.close()
    out = report.to_json()
    print(f"top-K spectral ({len(report.spectral.top_heads)}): {', '.join(out['top_k_spectral'])}")
    print(f"candidate induction circuit (>= {report.final.induction_threshold:.3g}x, uniform baseline): "
          f"{', '.join(out['candidate_circuit']) or 'none'}")
    print(f"previous-token circuit (same threshold, uniform baseline): {', '.join(out['previous_token_circuit']) or 'none'}")
    for name, value in out["fractions"].items():
        print(f"{name}: {value if value is None else round(value, 4)}")
    return out


def _print_summary(title: str, summary: dict) -> None:
    print(title)
    for metric, stats in summary["metrics"].items():
        figures = "  ".join(f"{k}={v:.4g}" for k, v in stats.items() if isinstance(v, (int, float)))
        print(f"  {metric:13s} {figures}")
    for name, verdict in summary["verdicts"].items():
        print(f"  verdict {name}: {verdict['label']}  ({verdict['rule']})")
    for note in summary["notes"]:
        print(f"  note: {note}")


def _progress_bar(desc: str):
    bar = tqdm(total=0, unit="cond", desc=desc)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, progress


def add_ablate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", required=True, help='heads to ablate, e.g. "L1H3,L1H5" or "L1H*"')
    parser.add_argument("--controls", type=int, default=20, help="random control draws (default 20)")
    parser.add_argument("--control-kind", choices=("matched", "any-layer"), default="matched",
                        help="matched: same layers and counts (default); any-layer: same size anywhere")
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--control-seed", type=seed_arg, default=123)
    add_probe_spec_arguments(parser)
    add_backend_arguments(parser)


def cli_ablate(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    config = load_config(ref, resolve_checkpoint(ref, args.revision).revision)
    selection = parse_heads(args.heads, config.num_hidden_layers, config.num_attention_heads)
    bar, progress = _progress_bar(f"ablate {ref.name}")
    try:
        settings = AblationSettings(n_controls=args.controls, controls=args.control_kind, mode=args.mode,
                                    seed=args.control_seed)
        result = ablate(ref, args.revision, selection, probe_spec_from_args(args), settings, args.device, progress,
                        dtype=args.dtype, executor=executor_from_args(args))
    finally:
        bar.close()
    summary = summarize_ablation(result)
    _print_summary(f"ablating {', '.join(summary['selection'])} ({result.mode}) vs {summary['n_controls']} "
                   f"{args.control_kind} controls", summary)
    return {"summary": summary, "result": result.to_json()}


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws (default 20)")
    parser.add_argument("--mode", choices=("zero", "mean"), default="zero")
    parser.add_argument("--control-seed", type=seed_arg, default=123)
    add_probe_spec_arguments(parser)
    add_backend_arguments(parser)


def cli_recipe(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    out = run_recipe(ref, probe_spec_from_args(args), args.controls, args.mode, args.control_seed, args.device,
                     progress=lambda text: print(f"... {text}"), dtype=args.dtype, executor=executor_from_args(args))
    screen_out = out["screen"]
    print(f"candidate circuit: {', '.join(screen_out['candidate_circuit']) or 'none'}")
    if "candidate" in out:
        _print_summary("Step 3, candidate circuit:", out["candidate"]["summary"])
    if "composition" in out:
        _print_summary("previous-token circuit (composition):", out["composition"]["summary"])
    verdict = out.get("verdict") or {}
    print(f"recipe verdict: {verdict.get('label')}  ({verdict.get('rule')})")
    return out
