"""`python -m core screen | ablate | recipe`: the spectral probe-circuit recipe [SPC] from the command line.

Each command parses its flags, runs core.pipelines.recipe with a tqdm progress bar, prints the
figures a reader wants first, and returns the full result (the CLI writes it with --json).

The arguments only: the work is in core/cli/recipe_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import (CLASS_THRESHOLD, PR_DEFINITION as DEFAULT_DEFINITION, PR_RULE as DEFAULT_RULE, PROBE_MODES,
                          mode_help)
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_probe_file_arguments, add_probe_spec_arguments, seed_arg


def add_screen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    add_probe_spec_arguments(parser)
    add_probe_file_arguments(parser)
    add_backend_arguments(parser)
    parser.add_argument("--k", type=k_arg, default=0.18, help="top-K: a whole count (>= 1) or a fraction below 1 (default 0.18)")
    parser.add_argument("--pr", choices=("entropy", "classic"), default=DEFAULT_DEFINITION,
                        help="PR definition (default: entropy effective rank, the reference code's)")
    parser.add_argument("--rule", choices=("trapezoid", "paper_sum"), default=DEFAULT_RULE,
                        help="PR-integral rule (default trapezoid on log tokens)")
    parser.add_argument("--baseline", choices=("random", "uniform"), default="random")
    parser.add_argument("--class-threshold", type=float, default=CLASS_THRESHOLD)
    parser.add_argument("--induction-threshold", type=float, default=None,
                        help="membership threshold (uniform baseline); default 50x at T=256, scaled to the "
                             "probe length (12.5x at T=64: the same 19.5%% attention share)")


def k_arg(text: str) -> int | float:
    """argparse type of --k: a whole count of heads (>= 1) or a fraction in (0, 1); 1.5 is neither (never rounded)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and (value < 1 or value.is_integer())):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole count of heads (1, 2, ...) nor a fraction below "
                                         "1 (e.g. 0.18, the default).")
    return int(value) if value >= 1 else value


def add_ablate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", required=True, help='heads to ablate, e.g. "L1H3,L1H5" or "L1H*"')
    parser.add_argument("--controls", type=int, default=20, help="random control draws (default 20)")
    parser.add_argument("--control-kind", choices=("matched", "any-layer"), default="matched",
                        help="matched: same layers and counts (default); any-layer: same size anywhere")
    parser.add_argument("--mode", choices=PROBE_MODES + ("all",), default="zero",
                        help=mode_help(PROBE_MODES) + "; all: every one of them, with whether the verdict "
                        "is the same under each and the heads whose single-head conclusion flips")
    parser.add_argument("--control-seed", type=seed_arg, default=123, help="control draws and resample's derangement")
    add_probe_spec_arguments(parser)
    add_probe_file_arguments(parser)
    add_backend_arguments(parser)


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws (default 20)")
    parser.add_argument("--mode", choices=PROBE_MODES, default="zero", help=mode_help(PROBE_MODES))
    parser.add_argument("--control-seed", type=seed_arg, default=123)
    add_probe_spec_arguments(parser)
    add_probe_file_arguments(parser)
    add_backend_arguments(parser)


def cli_screen(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/recipe_run.py)."""
    from core.cli import recipe_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return recipe_run.cli_screen(args)


def cli_ablate(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/recipe_run.py)."""
    from core.cli import recipe_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return recipe_run.cli_ablate(args)


def cli_recipe(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/recipe_run.py)."""
    from core.cli import recipe_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return recipe_run.cli_recipe(args)
