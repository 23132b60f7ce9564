"""`python -m core probe`: fill the HeadStats cache for one or every checkpoint of one or more models (serial or
on Ray), and the probe flags every command shares."""

from __future__ import annotations

import argparse

from core.errors import HeadLabError
from core.cli.backend import add_backend_arguments, executor_from_args
from core.executor import ProgressBar, tqdm_progress
from core.model.loading import DEFAULT_DTYPE, DTYPES, load_model
from core.model.memory import check_probe_batch_fits
from core.model.refs import ModelRef, list_checkpoints, resolve_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import HEADSTATS_VERSION, pattern_batch_for
from core.tasks.probe_batch import MAX_SEED, ProbeBatch, check_seed
from core.tasks.probe_file import PADDING_SIDES, ProbeFile, read_probe_file
from core.tasks.specs import TASKS, ProbeSpec, probe_spec


def seed_arg(text: str) -> int:
    """argparse type of every seed flag: a seed numpy cannot take is refused as the flags are read, before any work."""
    try:
        return check_seed(int(text), "the seed")
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a seed from 0 to {MAX_SEED}.") from None
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


def say_probe_notes(spec: dict) -> None:
    """Print the notes a probe file's batch carries (e.g. targets of several tokens), before the figures."""
    for note in spec.get("notes", ()):
        print(f"note: {note}")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype: where and in which precision every command that loads a model runs it."""
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=DEFAULT_DTYPE,
                        help="precision of the model's forward pass: float32 (default), bfloat16, or float16 (the "
                             "reference probe's, on a GPU); statistics are accumulated in float32 either way")


def add_probe_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe batch flags every command that runs a probe shares (and --device, --dtype)."""
    parser.add_argument("--task", choices=TASKS, default="induction", help="probe task (default induction)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=seed_arg, default=42, help="probe seed (default 42)")
    parser.add_argument("--token-low", type=int, default=0, help="induction tokens from (default 0)")
    parser.add_argument("--token-high", type=int, default=256, help="induction tokens below (default 256: bytes)")
    add_device_arguments(parser)


def probe_spec_from_args(args: argparse.Namespace) -> ProbeSpec:
    """The probe spec the flags describe; refused before anything is built when its batch cannot fit in memory."""
    spec = probe_spec(args.task, args.n, args.seq_len, args.seed, args.token_low, args.token_high)
    check_probe_batch_fits(spec.n_examples, spec.seq_len)
    return spec


def add_probe_file_arguments(parser: argparse.ArgumentParser,
                             records: str = "prompt, target, optional query_pos; --task, --n and --seq-len are then not read"
                             ) -> None:
    """--probe-file and --padding; records: what one line of the file holds, for the help."""
    parser.add_argument("--probe-file", default=None,
                        help=f"JSONL of your own prompts instead of the built-in probe (one record per line: {records})")
    parser.add_argument("--padding", choices=PADDING_SIDES, default="right",
                        help="with --probe-file: the side shorter prompts are padded on (default right; probe, "
                             "screen and recipe read key positions and take right padding only)")


def probe_from_args(args: argparse.Namespace) -> ProbeSpec | ProbeFile:
    """The probe a command runs on: the user's probe file when given, else the built-in probe the flags describe."""
    if args.probe_file is not None:
        return read_probe_file(args.probe_file, padding=args.padding)
    return probe_spec_from_args(args)


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
    """Fill the HeadStats cache for one or all checkpoints of each model, one task per checkpoint not
    cached yet (on --backend), with a progress bar over tasks; returns what each checkpoint did."""
    refs = [ModelRef.parse(name) for name in args.model]
    items: dict[ModelRef, list[SweepItem]] = {}
    for ref in refs:
        checkpoints = list_checkpoints(ref) if args.all_checkpoints else [resolve_checkpoint(ref, args.revision)]
        if not checkpoints:
            raise HeadLabError(f"model {ref} lists no checkpoints; train it or pick another model.")
        items[ref] = [SweepItem(ref, checkpoint) for checkpoint in checkpoints]
    probe = probe_from_args(args)
    if isinstance(probe, ProbeFile):  # tokenized by each model's own tokenizer: one sweep per model
        sweeps = [(pattern_batch_for(probe, load_model(ref, found[-1].checkpoint.revision, args.device, args.dtype)),
                   found) for ref, found in items.items()]
        for batch, _ in sweeps:
            say_probe_notes(batch.spec)
    else:
        sweeps = [(probe, [item for found in items.values() for item in found])]
    executor = executor_from_args(args)
    rows = []
    for batch_or_spec, found in sweeps:
        with ProgressBar(total=len(found), unit="checkpoint", desc=f"probe ({executor.describe()})") as bar:
            rows += probe_sweep(found, batch_or_spec, executor, device=args.device, dtype=args.dtype,
                                chunk_size=args.chunk_size, progress=tqdm_progress(bar))
    for row in rows:
        ProgressBar.write(f"{row['model']} {row['revision']}: {row['status']}")
    first = sweeps[0][0]
    batch_spec = dict((first if isinstance(first, ProbeBatch) else first.build()).spec)
    return {"model": str(refs[0]), "models": [str(ref) for ref in refs], "task": batch_spec["task"],
            "probe_spec": batch_spec, "code_version": HEADSTATS_VERSION, "dtype": args.dtype,
            "backend": args.backend, "checkpoints": rows}
