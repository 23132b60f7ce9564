"""`python -m core edges`: score every head-to-head edge (EAP, EAP-IG or ACDC) on clean/corrupted pairs, the
faithfulness curve of the top edges, and the discovered edge set against matched-random edge sets.

The arguments only: the work is in core/cli/edges_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import EDGE_ALGORITHMS as METHODS, EDGE_METRICS, EDGE_REPLACEMENTS as REPLACEMENTS
from core.cli.probe import add_corruption_argument, add_probe_file_arguments, add_probe_spec_arguments, seed_arg


def add_edges_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--method", choices=METHODS, default="eap",
                        help="eap: gradient x activation difference, one forward and backward per batch (default); "
                             "eap-ig: the gradient integrated over --ig-steps interpolations; acdc: greedy pruning")
    parser.add_argument("--ig-steps", type=whole_number, default=5,
                        help="EAP-IG interpolation steps (default 5; each is a forward and backward pass; at most 1000)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="ACDC: the distance increase below which an edge is removed (default 0.01; >= 0)")
    parser.add_argument("--metric", choices=EDGE_METRICS, default="logit_diff",
                        help="logit_diff (default), a HeadLab metric, or kl (KL of the clean output to the run's)")
    parser.add_argument("--replacement", choices=REPLACEMENTS, default="resample",
                        help="what a patched edge carries: the corrupted run's sender output (default) or its mean")
    parser.add_argument("--top", type=int, default=20, help="edges listed, and the set tested for EAP / EAP-IG (default 20)")
    parser.add_argument("--controls", type=whole_number, default=20,
                        help="matched-random edge sets (default 20; 0: none; each is a forward pass; at most 1000)")
    parser.add_argument("--control-seed", type=seed_arg, default=123)
    parser.add_argument("--no-curve", action="store_true", help="skip the faithfulness curve")
    parser.add_argument("--known-task", action="store_true",
                        help="use the clean/corrupted pairs of the model's own circuit.json (a model with a known circuit; "
                             "python -m core known lists them)")
    parser.add_argument("--graph-only", action="store_true",
                        help="print the model's edge graph (nodes, senders, receiver inputs, edges) from its config and stop")
    parser.add_argument("--corrupt-seed", type=int, default=0,
                        help="seed of the corrupted earlier A, or of ioi's ABC names (default 0)")
    add_corruption_argument(parser)
    parser.add_argument("--batch-size", type=int, default=None, help="pairs per forward (default: as many as fit)")
    parser.add_argument("--allow-small-gap", action="store_true",
                        help="keep (flagged) pairs whose clean-corrupted gap is reversed or under 2 standard errors")
    add_probe_file_arguments(parser, "prompt, target, corrupted_prompt, optional corrupted_target, query_pos")
    parser.set_defaults(padding=None)  # None: left out, so a --padding that pads nothing can be named (right when read)
    add_probe_spec_arguments(parser)


def whole_number(text: str) -> int:
    """argparse type of a count: "200" or "1e8" (so an absurd count reaches its bound's message), never "2.5"."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def cli_edges(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/edges_run.py)."""
    from core.cli import edges_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return edges_run.cli_edges(args)
