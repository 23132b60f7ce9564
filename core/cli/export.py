"""`python -m core export MODEL --figure spectral|screen|ablation|attribution --out DIR`: the app's figures, headless.

The same builders the pages draw (core/figures/), written in the paper theme as PNG (high
resolution), SVG and PDF, with each figure's data as CSV and JSON carrying its provenance.

The arguments only: the work is in core/cli/export_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.choices import EXPORT_FIGURES as FIGURES, IMAGE_FORMATS, PROBE_MODES, mode_help
from core.cli.backend import add_backend_arguments
from core.cli.probe import add_probe_spec_arguments, seed_arg
from core.cli.recipe import k_arg


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo name, local Hugging Face folder or hub name")
    parser.add_argument("--figure", action="append", choices=FIGURES + ("all",), required=True,
                        help="which figures: spectral, screen, ablation, attribution (reverse/sort models) or all "
                             "(every figure that applies to the model; repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the figures into")
    parser.add_argument("--pr", choices=("entropy", "classic"), default="entropy", help="PR definition (default entropy)")
    parser.add_argument("--k", type=k_arg, default=0.18, help="top-K: a whole count (>= 1) or a fraction below 1 (default 0.18)")
    parser.add_argument("--revision", default=None, help="checkpoint for screen and ablation (default: the final one)")
    parser.add_argument("--pattern", action="append", default=None,
                        help="screen pattern(s) to draw (default: every pattern)")
    parser.add_argument("--heads", default=None,
                        help='heads to ablate, e.g. "L1H3,L1H7" (default: the screened induction circuit, else top-K spectral)')
    parser.add_argument("--controls", type=int, default=20, help="matched-random control draws (default 20)")
    parser.add_argument("--control-kind", choices=("matched", "any-layer"), default="matched")
    parser.add_argument("--mode", choices=PROBE_MODES, default="zero", help=mode_help(PROBE_MODES))
    parser.add_argument("--control-seed", type=seed_arg, default=123, help="seed of the control draws (default 123)")
    parser.add_argument("--formats", default=",".join(IMAGE_FORMATS),
                        help="image formats, comma-separated (default png,svg,pdf); CSV and JSON are always written")
    add_probe_spec_arguments(parser)
    add_backend_arguments(parser)


def cli_export(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/export_run.py)."""
    from core.cli import export_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return export_run.cli_export(args)
