"""`python -m core attribution`: gradient attribution vs causal importance [HHG] on one model or a zoo preset.

The arguments only: the work is in core/cli/attribution_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import (ATTRIBUTION_THRESHOLD as DEFAULT_THRESHOLD, CLASS_RULES, GRADIENT_VARIANTS, SEQUENCE_MODES,
                          mode_help)
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_device_arguments


def add_attribution_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, help="zoo name, local Hugging Face folder or hub name (omit with --zoo-preset)")
    parser.add_argument("--task", required=True, choices=("reverse", "sort"), help="the task the model was trained on")
    parser.add_argument("--zoo-preset", default=None, help="analyse every model of this zoo preset trained on --task (e.g. paper)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the last one)")
    parser.add_argument("--ood-length", type=int, default=None, help="OOD length (default: first of 8..11 with accuracy in [0.20, 0.75])")
    parser.add_argument("--gradient-variant", choices=GRADIENT_VARIANTS, default="paper", help="paper (W_V+W_O / sqrt(n), default) or reference (W_V rows, raw)")
    parser.add_argument("--ablation", choices=SEQUENCE_MODES, default="mean",
                        help=mode_help(SEQUENCE_MODES, "mean"))
    parser.add_argument("--n-batches", type=int, default=50, help="OOD batches for the gradient (default 50)")
    parser.add_argument("--batch-size", type=int, default=64, help="gradient batch size (default 64)")
    parser.add_argument("--n-examples", type=int, default=500, help="evaluation examples per accuracy (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation examples and gradient batches")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="rank-difference threshold (default 6)")
    parser.add_argument("--rule", choices=CLASS_RULES, default="paper", help="paper: d >= threshold; reference: d > threshold")
    add_device_arguments(parser)
    add_backend_arguments(parser)  # with --zoo-preset: one task per model
    parser.add_argument("--force", action="store_true", help="recompute stored per-model results (--zoo-preset)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def cli_attribution(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/attribution_run.py)."""
    from core.cli import attribution_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return attribution_run.cli_attribution(args)
