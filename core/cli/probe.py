"""`python -m core probe`: fill the HeadStats cache for one or every checkpoint of one or more models (serial or
on Ray), and the probe flags every command shares.

The arguments only: the work (building probes, the sweep) is in core/cli/probe_run.py, imported when a command runs,
so `--help` and a mistyped flag of any command answer without loading torch.
"""

from __future__ import annotations

import argparse

from core.choices import (CORRUPTIONS, DEFAULT_DTYPE, DTYPE_NAMES, MAX_SEED, PADDING_SIDES, PROBE_TASKS as TASKS,
                          check_device, check_seed)
from core.cli.backend import add_backend_arguments
from core.errors import HeadLabError


TASK_HELP = ("probe task (default induction): induction (the [SPC] one-shot A B ... A), induction-repeat (a random "
             "sequence and its exact repeat, scored on the repeat), text (held-out byte text, byte-level models), "
             "ioi (indirect object identification, models with a word-level tokenizer; --seq-len is not read)")


def seed_arg(text: str) -> int:
    """argparse type of every seed flag: a seed numpy cannot take is refused as the flags are read, before any work."""
    try:
        return check_seed(int(text), "the seed")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a seed from 0 to {MAX_SEED}.") from None
    except HeadLabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def device_arg(text: str) -> str:
    """argparse type of --device: checked once as the flags are read (core.choices.check_device), before
    any memory estimate, cache read or work."""
    try:
        return check_device(text)
    except HeadLabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """argparse type of a count flag that must be >= 1 (e.g. --chunk-size): refused with the other flags, before any work."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a count of 1 or more.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count of 1 or more; give 1 or more (or leave the flag out "
                                         "for the default).")
    return value


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype: where and in which precision every command that loads a model runs it."""
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=DEFAULT_DTYPE,
                        help="precision of the model's forward pass: float32 (default), bfloat16, or float16 (the "
                             "reference probe's, on a GPU); statistics are accumulated in float32 either way")


def add_probe_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe batch flags every command that runs a probe shares (and --device, --dtype)."""
    parser.add_argument("--task", choices=TASKS, default="induction", help=TASK_HELP)
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=seed_arg, default=42, help="probe seed (default 42)")
    parser.add_argument("--token-low", type=int, default=None,
                        help="induction tokens from (default: the model's ordinary tokens, bytes 0-255 on a byte-level "
                             "zoo model, else every token of its tokenizer but special, added and byte-fallback ones)")
    parser.add_argument("--token-high", type=int, default=None, help="induction tokens below (default: as --token-low)")
    add_device_arguments(parser)


def add_corruption_argument(parser: argparse.ArgumentParser) -> None:
    """--corruption: which counterfactual of the ioi task (patch, edges)."""
    parser.add_argument("--corruption", choices=CORRUPTIONS, default="abc",
                        help="with --task ioi: abc (default: the three names replaced by three other names) or swap "
                             "(the subject's second mention replaced by the indirect object, so the answer flips)")


def add_probe_file_arguments(parser: argparse.ArgumentParser,
                             records: str = "prompt, target, optional query_pos; --task, --n and --seq-len are then not read"
                             ) -> None:
    """--probe-file and --padding; records: what one line of the file holds, for the help."""
    parser.add_argument("--probe-file", default=None,
                        help=f"JSONL of your own prompts instead of the built-in probe (one record per line: {records})")
    parser.add_argument("--padding", choices=PADDING_SIDES, default="right",
                        help="with --probe-file: the side shorter prompts are padded on (default right; probe, "
                             "screen and recipe read key positions and take right padding only)")


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="+", help="zoo name, local Hugging Face folder or hub name (several: one sweep)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--revision", default=None, help="one checkpoint (default: the final one)")
    which.add_argument("--all-checkpoints", action="store_true", help="every checkpoint of each model")
    add_probe_spec_arguments(parser)
    add_probe_file_arguments(parser)
    parser.add_argument("--chunk-size", type=positive_int, default=None,
                        help="examples per forward (default: as many as fit in the free memory)")
    add_backend_arguments(parser)


def cli_probe(args: argparse.Namespace) -> dict:
    """Run the command (core/cli/probe_run.py)."""
    from core.cli import probe_run  # torch and the pipelines, loaded when the command runs (never for --help)

    return probe_run.cli_probe(args)
