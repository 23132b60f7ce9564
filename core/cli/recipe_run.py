"""`python -m core screen | ablate | recipe`: the spectral probe-circuit recipe [SPC] from the command line.

The work only: the arguments, and what the command does, are in core/cli/recipe.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse

from core.executor import ProgressBar
from core.ablation.compare import ablation_under_every_mode
from core.ablation.study import AblationSettings, summarize_ablation
from core.cli.backend import executor_from_args
from core.cli.probe_run import probe_from_args, say_probe_notes
from core.heads import parse_heads
from core.model.loading import bfloat16_hint, load_config, load_model
from core.model.refs import ModelRef, list_checkpoints, resolve_checkpoint, unfinished_training
from core.pipelines.recipe import ScreenSettings, ablate, run_recipe, screen
from core.probe import check_probe_fits, probe_batch_for
from core.stats.inference import format_rank_z


def cli_screen(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    settings = ScreenSettings(k=args.k, definition=args.pr, rule=args.rule, baseline=args.baseline,
                              class_threshold=args.class_threshold, induction_threshold=args.induction_threshold)
    bar = ProgressBar(total=len(list_checkpoints(ref)), unit="ckpt", desc=f"screen {ref.name}")

    def progress(done: int, total: int, revision: str) -> None:
        bar.set_postfix_str(revision)
        bar.update(1)

    try:
        report = screen(ref, probe_from_args(args), settings, device=args.device, progress=progress,
                        dtype=args.dtype, executor=executor_from_args(args))
    finally:
        bar.close()
    out = report.to_json()
    say_probe_notes(report.probe_spec)
    config = load_config(ref, list_checkpoints(ref)[-1].revision)
    hint = bfloat16_hint(args.dtype, args.device, config.num_hidden_layers * config.num_attention_heads,
                         getattr(config, "hidden_size", 0))
    if hint:
        print(f"note: {hint}")
    unfinished = unfinished_training(ref)
    if unfinished:
        print(f"note: {unfinished}.")
        out["unfinished"] = unfinished
    if report.spectral is None:
        print(report.spectral_note)
    else:
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
        figures = "  ".join(f"{k}={f'{v:.4g}'}" for k, v in stats.items()
                            if k not in ("z", "rank", "p", "n_controls") and isinstance(v, (int, float)))
        if stats.get("rank") is not None:  # rank and p lead; z with its controls and sd convention
            n = stats.get("n_controls", summary["n_controls"])
            figures = format_rank_z(stats["rank"], stats["p"], n, stats.get("z")) + "  " + figures
        print(f"  {metric:13s} {figures}")
    for name, verdict in summary["verdicts"].items():
        print(f"  verdict {name}: {verdict['label']}  ({verdict['rule']})")
        if verdict["label"] == "inconclusive":
            print("".join(f"    {reason}\n" for reason in verdict["reasons"]), end="")
    for note in summary["notes"]:
        print(f"  note: {note}")


def _progress_bar(desc: str):
    bar = ProgressBar(total=0, unit="cond", desc=desc)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return bar, progress


def cli_ablate(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    checkpoint = resolve_checkpoint(ref, args.revision)
    config = load_config(ref, checkpoint.revision)
    selection = parse_heads(args.heads, config.num_hidden_layers, config.num_attention_heads)
    if args.mode == "all":
        return _ablate_every_mode(ref, checkpoint.revision, config, selection, args)
    bar, progress = _progress_bar(f"ablate {ref.name}")
    try:
        settings = AblationSettings(n_controls=args.controls, controls=args.control_kind, mode=args.mode,
                                    seed=args.control_seed)
        result = ablate(ref, args.revision, selection, probe_from_args(args), settings, args.device, progress,
                        dtype=args.dtype, executor=executor_from_args(args))
    finally:
        bar.close()
    summary = summarize_ablation(result)
    say_probe_notes(result.provenance.get("batch", {}))
    _print_summary(f"ablating {', '.join(summary['selection'])} ({result.mode}) vs {summary['n_controls']} "
                   f"{args.control_kind} controls", summary)
    return {"summary": summary, "result": result.to_json()}


def _ablate_every_mode(ref: ModelRef, revision: str, config, selection, args: argparse.Namespace) -> dict:
    """`ablate --mode all`: the study under every probe mode, in this process (core/ablation/compare.py)."""
    spec = probe_from_args(args)
    check_probe_fits(spec, config)
    model = load_model(ref, revision, device=args.device, dtype=args.dtype)
    settings = AblationSettings(n_controls=args.controls, controls=args.control_kind, seed=args.control_seed)
    out = ablation_under_every_mode(model, probe_batch_for(spec, model), selection, settings, device=args.device,
                                    say=lambda text: print(f"... {text}"))
    for mode in out["modes"]:
        print(f"{mode:18s} " + "  ".join(f"{name}: {label}" for name, label in out["verdicts"][mode].items()))
    print(f"verdict the same under every type: {'yes' if out['same_verdict'] else 'no'}"
          + (f" (differs: {', '.join(out['verdict_flips'])})" if out["verdict_flips"] else ""))
    print(f"heads alone (damage z of {out['headline_metric']}, |z| > {settings.z_threshold:g} significant):")
    for head, by_mode in out["heads"].items():
        cells = "  ".join(f"{mode} {entry['conclusion']}"
                          + (f" ({entry['damage_z']:+.2f})" if entry["damage_z"] is not None else "")
                          for mode, entry in by_mode.items())
        print(f"  {head}{' FLIPS' if head in out['flipped_heads'] else ''}: {cells}")
    summaries = {mode: summarize_ablation(result) for mode, result in out.pop("results").items()}
    return {**out, "model": ref.name, "revision": revision, "summaries": summaries}


def cli_recipe(args: argparse.Namespace) -> dict:
    ref = ModelRef.parse(args.model)
    out = run_recipe(ref, probe_from_args(args), args.controls, args.mode, args.control_seed, args.device,
                     progress=lambda text: print(f"... {text}"), dtype=args.dtype, executor=executor_from_args(args))
    screen_out = out["screen"]
    say_probe_notes(screen_out["probe_spec"])
    if screen_out["spectral_note"]:
        print(screen_out["spectral_note"])
    print(f"candidate circuit: {', '.join(screen_out['candidate_circuit']) or 'none'}")
    if "candidate" in out:
        _print_summary("Step 3, candidate circuit:", out["candidate"]["summary"])
    if "composition" in out:
        _print_summary("previous-token circuit (composition):", out["composition"]["summary"])
    verdict = out.get("verdict") or {}
    print(f"recipe verdict: {verdict.get('label')}  ({verdict.get('rule')})")
    return out
