"""`python -m core patch`: activation, attribution, group and path patching on the induction probe's counterfactual
or on the pairs of a probe file (--probe-file, core/tasks/probe_file.py).

The work only: the arguments are in core/cli/patch.py, which imports this module when the command runs.
"""

from __future__ import annotations

import argparse

import numpy as np

from core.executor import StageBars
from core.ablation.patching import GRADIENT_METRICS, PatchSettings
from core.cli.probe_run import built_in_pairs
from core.errors import HeadLabError
from core.heads import HeadSet, head_name, parse_heads
from core.model.loading import load_config
from core.model.refs import ModelRef, resolve_checkpoint
from core.pipelines.patching import DEFAULT_TOP_K, PatchingReport, PatchPlan, check_top_k, patch_model
from core.stats.inference import format_rank_z
from core.tasks.probe_file import read_probe_file
from core.tasks.specs import PAIR_TASKS


def _heads(text: str | None, n_layers: int, n_heads: int) -> HeadSet | None:
    return None if text is None else parse_heads(text, n_layers, n_heads)


def top_k_from_args(text: str | None, n_heads_total: int, attribution: bool, metric: str) -> int | None:
    """--top-k as PatchPlan.top_k: the default when not given, None for 'all', else a whole number of heads."""
    if text is None:
        return DEFAULT_TOP_K
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise HeadLabError(f"--top-k {text!r} is not a whole number; give how many heads to activation-patch "
                           f"(e.g. --top-k 40), or --top-k all.") from None
    value = check_top_k(value, n_heads_total)
    if value < n_heads_total and not (attribution and metric in GRADIENT_METRICS):
        raise HeadLabError("--top-k ranks heads by attribution patching, which needs attribution (drop --no-attribution) "
                           f"and a metric with a gradient ({', '.join(GRADIENT_METRICS)}); or use --top-k all.")
    return value


def cli_patch(args: argparse.Namespace) -> dict:
    if args.probe_file is None and args.task not in PAIR_TASKS:
        raise HeadLabError("patch has built-in counterfactuals for the induction and ioi tasks only; use --task induction "
                           "or --task ioi, or give your own pairs with --probe-file.")
    ref = ModelRef.parse(args.model)
    config = load_config(ref, resolve_checkpoint(ref, args.revision).revision)
    shape = (config.num_hidden_layers, config.num_attention_heads)
    settings = PatchSettings(direction=args.direction, metric=args.metric, per_position=args.per_position,
                             n_controls=args.controls, controls=args.control_kind, control_seed=args.control_seed,
                             batch_size=args.batch_size, allow_small_gap=args.allow_small_gap)
    top_k = top_k_from_args(args.top_k, shape[0] * shape[1], not args.no_attribution, settings.metric)
    plan = PatchPlan(attribution=not args.no_attribution, group=_heads(args.heads, *shape),
                     senders=_heads(args.senders, *shape), receivers=_heads(args.receivers, *shape), components=args.component,
                     top_k=top_k)
    if args.probe_file is not None:
        pairs = read_probe_file(args.probe_file, padding=args.padding)
    else:
        pairs = built_in_pairs(args)
    with StageBars(lambda stage: f"{stage} patching", unit="example") as progress:
        report = patch_model(ref, args.revision, pairs, settings, plan, args.device, args.dtype, progress)
    for line in report_lines(report):
        print(line)
    return report.to_json()


def report_lines(report: PatchingReport, top: int = 8) -> list[str]:
    """What a reader wants first: the runs' metric, the identity check, the top heads, agreement, group, path."""
    act = report.activation
    scale = "clean = 1, corrupted = 0"
    lines = [f"{report.model} {report.revision}: {act.direction} patching, {act.metric} clean {act.clean_value:.4g}, "
             f"corrupted {act.corrupted_value:.4g} ({scale})",
             f"identity check (base run patched with itself): max logit change {act.identity_max_diff:.2e}"]
    if act.gap:
        lines.append(gap_line(act.gap))
    n_heads = act.scores.shape[1]
    effect = act.scores if act.direction == "denoise" else 1.0 - act.scores
    order = np.argsort(-effect, axis=None, kind="stable")[:top]
    exact = np.ones(act.scores.shape, dtype=bool) if act.exact is None else np.asarray(act.exact, dtype=bool)
    lines.append("top heads: " + ", ".join(f"{head_name(divmod(int(i), n_heads))} {act.scores.flat[i]:.3f}"
                                          + ("" if exact.flat[i] else " (estimate)") for i in order))
    if act.exact is not None:
        patched = ",".join(head_name(head) for head in act.exact_heads())
        lines.append(f"patched exactly ({int(exact.sum())} of {exact.size} heads, the top by attribution): {patched}; "
                     f"the other {exact.size - int(exact.sum())} heads are attribution estimates only")
    if report.attribution is not None:
        rho = "undefined" if report.spearman is None else f"{report.spearman:.3f}"
        over = "every head" if act.exact is None else "the heads patched exactly"
        lines.append(f"attribution vs activation patching over {over}: Spearman {rho}")
    if report.group is not None:
        g = report.group
        lines.append(f"group {g.selection}: score {g.score:.3f}; {_against(g.stats, g.control_scores)}; "
                     f"{g.control_sets.kind} controls {g.stats['control_mean']:.3f} +- {g.stats['control_std']:.3f}; "
                     f"every head of its layers {g.upper_bound_score:.3f}")
    lines += [f"note: {note}" for note in report.notes]
    if report.path is not None:
        p = report.path
        lines.append(f"path {p.senders} -> {p.receivers} ({','.join(p.components)}): score {p.score:.3f}; "
                     f"{_against(p.stats, p.control_scores)}; random senders "
                     f"{p.stats['control_mean']:.3f} +- {p.stats['control_std']:.3f}")
    return lines


def gap_line(gap: dict) -> str:
    """The clean-corrupted gap and its per-example spread, flagged when the user forced a gap the rule refuses."""
    sd = "n/a (one example)" if gap["gap_sd"] is None else f"{gap['gap_sd']:.4g}"
    se = "n/a" if gap["gap_se"] is None else f"{gap['gap_se']:.4g}"
    line = (f"clean-corrupted gap {gap['gap_mean']:+.4g} over {gap['n_examples']} examples "
            f"(per-example sd {sd}, se {se}; the rule asks for a positive gap of at least 2 se)")
    return line + (f"; WARNING {gap['gap_note']}" if gap.get("gap_note") else "")


def _against(stats: dict, control_scores: tuple) -> str:
    """Rank and p first, z with its controls and sd convention (older results lack n_controls: counted here)."""
    return format_rank_z(stats["rank"], stats["p"], stats.get("n_controls", len(control_scores)), stats["z"])
