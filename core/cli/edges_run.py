"""`python -m core edges`: score every head-to-head edge (EAP, EAP-IG or ACDC) on clean/corrupted pairs, the
faithfulness curve of the top edges, and the discovered edge set against matched-random edge sets.

The work only: the arguments are in core/cli/edges.py, which imports this module when the command runs.
"""

from __future__ import annotations

import argparse

from core.ablation.edges import EdgeSettings, edge_graph_of_config
from core.cli.patch_run import gap_line
from core.cli.probe_run import built_in_pairs
from core.errors import HeadLabError
from core.executor import StageBars
from core.model.loading import load_config
from core.model.refs import ModelRef, resolve_checkpoint
from core.pipelines.edges import EdgePlan, EdgeReport, edges_model
from core.stats.inference import format_rank_z
from core.tasks.known import known_task
from core.tasks.probe_file import read_probe_file
from core.tasks.specs import PAIR_TASKS
from core.zoo.known import known_circuit


def cli_edges(args: argparse.Namespace) -> dict:
    if args.graph_only:
        ref = ModelRef.parse(args.model)
        revision = resolve_checkpoint(ref, args.revision).revision
        summary = {"model": ref.name, "revision": revision, **edge_graph_of_config(load_config(ref, revision)).summary()}
        into = ", ".join(f"{count} into {name}" for name, count in summary["edges_into"].items())
        print(f"{ref.name} {revision}: {summary['n_layers']} layers x {summary['n_heads']} heads"
              f"{' (parallel attention and MLP)' if summary['parallel_attn_mlp'] else ''}: {summary['nodes']} nodes, "
              f"{summary['senders']} senders, {summary['receivers']} receiver inputs, {summary['edges']} edges ({into})")
        return summary
    if args.known_task and args.probe_file is not None:
        raise HeadLabError("--known-task and --probe-file both name the pairs; give one of them.")
    if args.padding is not None and args.probe_file is None:
        source = ("--known-task's pairs come from the model's circuit.json, all of one length" if args.known_task
                  else f"the built-in {args.task} pairs are all of one length")
        raise HeadLabError(f"--padding pads the prompts of --probe-file; {source}, so leave --padding out.")
    if args.probe_file is None and args.task not in PAIR_TASKS and not args.known_task:
        raise HeadLabError("edges has built-in counterfactuals for the induction and ioi tasks only; use --task induction "
                           "or --task ioi, or give your own clean/corrupted pairs with --probe-file.")
    if args.threshold is not None and args.method != "acdc":
        raise HeadLabError(f"--threshold is ACDC's (the distance increase below which it removes an edge); "
                           f"{args.method} keeps the --top edges instead, so leave --threshold out or use --method acdc.")
    settings = EdgeSettings(metric=args.metric, replacement=args.replacement, batch_size=args.batch_size,
                            allow_small_gap=args.allow_small_gap)
    plan = EdgePlan(method=args.method, ig_steps=args.ig_steps, threshold=0.01 if args.threshold is None else args.threshold, top=args.top,
                    curve=not args.no_curve, n_controls=args.controls, control_seed=args.control_seed)
    if args.known_task:
        pairs = known_task(known_circuit(args.model, args.revision).task)
    elif args.probe_file is not None:
        pairs = read_probe_file(args.probe_file, padding=args.padding or "right")
    else:
        pairs = built_in_pairs(args)
    ref = ModelRef.parse(args.model)
    graph = edge_graph_of_config(load_config(ref, resolve_checkpoint(ref, args.revision).revision))
    print(plan.cost_line(graph.n_edges), flush=True)  # before the model loads: what --ig-steps and --controls cost
    with StageBars(lambda stage: f"edges: {stage}") as progress:
        report = edges_model(ref, args.revision, pairs, settings, plan, args.device, args.dtype, progress)
    for line in report_lines(report, args.top):
        print(line)
    return report.to_json()


def report_lines(report: EdgeReport, top: int = 20) -> list[str]:
    """The runs' metric, the graph's size, the top edges, the curve's areas, the controls' verdict."""
    s = report.scores
    lines = [f"{report.model} {report.revision}: {s.method}, {s.metric} clean {s.clean_value:.4g}, every edge patched "
             f"{s.corrupted_value:.4g}; {s.graph['edges']} edges ({s.graph['senders']} senders, "
             f"{s.graph['receivers']} receiver inputs)"]
    if s.gap:
        lines.append(gap_line(s.gap))
    if s.kept is not None:
        lines.append(f"ACDC at threshold {s.threshold}: {int(s.kept.sum())} of {len(s.edges)} edges kept")
    measure = ("distance increase when ACDC tested its removal" if s.method == "acdc"
               else "fraction of the gap lost when patched alone")
    lines.append(f"top edges ({measure}): "
                 + ", ".join(f"{edge} {value:.3f}" for edge, value in s.top(min(top, len(s.edges)))))
    if report.curve is not None:
        c = report.curve
        points = ", ".join(f"{k} edges {f:.3f}" for k, f in zip(c.n_edges_kept, c.faithfulness))
        lines.append(f"faithfulness of the top edges: {points}")
        lines.append(f"CPR {c.cpr:.4f} (area under faithfulness, higher is better), CMD {c.cmd:.4f} (area of |1 - f|, lower)")
    if report.controls is not None:
        e = report.controls
        lines.append(f"discovered set ({len(e.edges)} edges): faithfulness {e.faithfulness:.3f}; "
                     f"{format_rank_z(e.stats['rank'], e.stats['p'], e.stats['n_controls'], e.stats['z'])}; "
                     f"matched-random edge sets {e.stats['control_mean']:.3f} +- {e.stats['control_std']:.3f}: "
                     f"{e.verdict.label}")
    if report.heads:
        lines.append("heads of the discovered set: " + ",".join(f"L{l}H{h}" for l, h in report.heads))
    lines += [f"note: {note}" for note in report.notes]
    return lines
