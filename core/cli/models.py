"""`python -m core models [MODEL]`: list the zoo, or one model's checkpoints with their token counts.

`python -m core models import FILE.gguf [--name NAME]` imports a GGUF file (llama.cpp's quantized
format) into the zoo once, dequantized to float32 (core/model/gguf.py).

The arguments and their checks only: the work is in core/cli/models_run.py, imported when the command runs, so
`models --help` and a misplaced flag answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.errors import HeadLabError

IMPORT_WORD = "import"  # `models import FILE`: the first word picks the import (a zoo model named "import" is shadowed)


def add_models_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m core models [MODEL]`, or `models import FILE.gguf [--name NAME]`."""
    parser.add_argument("model", nargs="?", default=None,
                        help="a zoo name, a local Hugging Face folder or a hub name; omit to list the zoo; "
                             "'import' to import the GGUF file that follows")
    parser.add_argument("file", nargs="?", default=None, help="with import: the .gguf file")
    parser.add_argument("--name", default=None, help="with import: the zoo name (default: from the file's name)")


def cli_models(args: argparse.Namespace) -> dict:
    """Print the zoo (no model given), the model's checkpoints, or import a GGUF file (`import FILE`)."""
    if args.model == IMPORT_WORD:
        if args.file is None:
            raise HeadLabError("models import needs a file: python -m core models import FILE.gguf [--name NAME].")
        from core.cli.models_run import import_gguf  # torch and the importer, loaded only when the command runs

        return import_gguf(args)
    if args.file is not None or args.name is not None:
        extra = args.file if args.file is not None else f"--name {args.name}"
        raise HeadLabError(f"{extra!r} only means something after `models import`; give one model to list its "
                           "checkpoints, or: python -m core models import FILE.gguf [--name NAME].")
    from core.cli.models_run import run_models  # torch and the zoo's readers, loaded only when the command runs

    return run_models(args)
