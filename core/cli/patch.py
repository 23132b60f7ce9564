"""`python -m core patch`: activation, attribution, group and path patching on the induction probe's counterfactual
or on the pairs of a probe file (--probe-file, core/tasks/probe_file.py).

The arguments only: the work is in core/cli/patch_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import CONTROL_KINDS, PATCH_DIRECTIONS as DIRECTIONS, PATCH_METRICS, PATCH_TOP_K as DEFAULT_TOP_K
from core.cli.probe import add_corruption_argument, add_probe_file_arguments, add_probe_spec_arguments


def add_patch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="denoise",
                        help="denoise: clean activations into the corrupted run (default); noise: corrupted into clean")
    parser.add_argument("--metric", choices=PATCH_METRICS, default="logit_diff",
                        help="logit_diff (default: target logit, minus the corrupted target's when there is one) or a HeadLab metric")
    parser.add_argument("--per-position", action="store_true",
                        help="also patch every head at every position: one forward per head and position, slow on "
                             "a CPU (fewer examples with --n)")
    parser.add_argument("--heads", default=None, help='a group patched together against random controls, e.g. "L1H2,L1H3"')
    parser.add_argument("--controls", type=int, default=20, help="random control groups (default 20)")
    parser.add_argument("--control-kind", choices=CONTROL_KINDS, default="matched",
                        help="matched: same layers and counts (default); any-layer: same size anywhere (path "
                             "patching always draws matched senders)")
    parser.add_argument("--control-seed", type=int, default=123)
    parser.add_argument("--senders", default=None, help='path patching: sender heads, e.g. "L0H1,L0H8"')
    parser.add_argument("--receivers", default=None, help='path patching: receiver heads, e.g. "L1H2,L1H3"')
    parser.add_argument("--component", default="k", help="receivers' inputs the path enters: q, k, v or a list like q,k (default k)")
    parser.add_argument("--no-attribution", action="store_true", help="skip attribution patching")
    parser.add_argument("--top-k", default=None,
                        help=f"activation-patch only the K heads attribution patching ranks largest, the rest keep "
                             f"attribution's estimate (default {DEFAULT_TOP_K}, on a model with more heads); 'all' "
                             f"patches every head")
    parser.add_argument("--corrupt-seed", type=int, default=0,
                        help="seed of the corrupted earlier A, or of ioi's ABC names (default 0)")
    add_corruption_argument(parser)
    parser.add_argument("--batch-size", type=int, default=None, help="examples per forward (default: as many as fit)")
    parser.add_argument("--allow-small-gap", action="store_true",
                        help="keep (flagged) a result whose clean-corrupted gap is reversed or under 2 standard errors "
                             "of the per-example gaps (refused by default: the scores would divide by noise)")
    add_probe_file_arguments(parser, "prompt, target, corrupted_prompt, optional corrupted_target, query_pos")
    add_probe_spec_arguments(parser)


def cli_patch(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/patch_run.py)."""
    from core.cli import patch_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return patch_run.cli_patch(args)
