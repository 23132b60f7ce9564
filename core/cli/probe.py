"""`python -m core probe`: fill the HeadStats cache for one or every checkpoint of one or more models (serial or
on Ray), and the probe flags every command shares."""

from __future__ import annotations

import argparse

from core.errors import HeadLabError
from core.cli.backend import add_backend_arguments, executor_from_args
from core.executor import ProgressBar, tqdm_progress
from core.model.loading import DEFAULT_DTYPE, DTYPES, check_device, load_model
from core.model.memory import check_probe_batch_fits
from core.model.refs import ModelRef, checkpoint_path, list_checkpoints, resolve_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import HEADSTATS_VERSION, pattern_batch_for
from core.tasks.induction import describe_token_source
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.ioi import CORRUPTIONS, IoiCounterfactualSpec, IoiSpec, describe_ioi
from core.tasks.probe_batch import MAX_SEED, ProbeBatch, check_seed
from core.tasks.probe_file import PADDING_SIDES, ProbeFile, read_probe_file
from core.tasks.specs import PAIR_TASKS, TASKS, TOKENIZER_TASKS, ProbeSpec, built_in_counterfactual, probe_spec
from core.tasks.tokens import tokenizer_of_folder

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
    """argparse type of --device: checked once as the flags are read (core.model.loading.check_device), before
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


def say_probe_notes(spec: dict) -> None:
    """Print the notes a probe file's batch carries (e.g. targets of several tokens), before the figures."""
    for note in spec.get("notes", ()):
        print(f"note: {note}")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype: where and in which precision every command that loads a model runs it."""
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=DEFAULT_DTYPE,
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


def needs_tokenizer(args: argparse.Namespace) -> bool:
    """True when the probe is built from the model's own tokens: ioi, or a random-token task without a token range."""
    if args.task in TOKENIZER_TASKS:
        return True
    unset = getattr(args, "token_low", None) is None and getattr(args, "token_high", None) is None
    return args.task in ("induction", "induction-repeat") and unset


def model_tokenizer(name: str, revision: str | None = None):
    """The tokenizer of a model the user named (its final checkpoint by default), None for a byte-level zoo model."""
    ref = ModelRef.parse(name)
    revision = resolve_checkpoint(ref, revision).revision
    return tokenizer_of_folder(checkpoint_path(ref, revision), local=ref.kind != "hub", revision=revision)


def describe_probe(spec: ProbeSpec) -> str | None:
    """One line saying what a built-in probe drew its tokens from (None for the byte text probe)."""
    if isinstance(spec, IoiSpec):
        return describe_ioi(spec)
    return describe_token_source(spec) if hasattr(spec, "vocab") else None


def probe_spec_from_args(args: argparse.Namespace, model: str | None = None) -> ProbeSpec:
    """The probe spec the flags describe, for `model` (default: the command's first model): ioi and the random-token
    tasks without a token range read that model's tokenizer (core/tasks/tokens.py) and the line printed says what
    they drew from. Refused before anything is built when its batch cannot fit in memory."""
    tokenizer = None
    if needs_tokenizer(args):
        name = model if model is not None else (args.model[0] if isinstance(args.model, list) else args.model)
        tokenizer = model_tokenizer(name, getattr(args, "revision", None))
    spec = probe_spec(args.task, args.n, args.seq_len, args.seed, getattr(args, "token_low", None),
                      getattr(args, "token_high", None), tokenizer)
    check_probe_batch_fits(spec.n_examples, spec.seq_len)
    line = describe_probe(spec) if tokenizer is not None else None
    if line:
        print(f"probe: {line}")
    return spec


def add_corruption_argument(parser: argparse.ArgumentParser) -> None:
    """--corruption: which counterfactual of the ioi task (patch, edges)."""
    parser.add_argument("--corruption", choices=CORRUPTIONS, default="abc",
                        help="with --task ioi: abc (default: the three names replaced by three other names) or swap "
                             "(the subject's second mention replaced by the indirect object, so the answer flips)")


def built_in_pairs(args: argparse.Namespace) -> InductionCounterfactualSpec | IoiCounterfactualSpec:
    """The clean/corrupted pairs of a built-in task (patch, edges): the induction probe with its earlier A
    corrupted, or the ioi prompts with their ABC or swapped-subject twins."""
    spec = probe_spec_from_args(args)
    if not isinstance(spec, IoiSpec) and args.corruption != "abc":
        raise HeadLabError("--corruption chooses the ioi task's counterfactual; leave it out with --task induction.")
    return built_in_counterfactual(spec, args.corrupt_seed, args.corruption)


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
    elif needs_tokenizer(args) and len(refs) > 1:  # built from each model's own tokens: one sweep per probe spec
        by_spec: dict[str, tuple[ProbeSpec, list[SweepItem]]] = {}
        for name, ref in dict(zip(args.model, refs)).items():
            spec = probe if ref == refs[0] else probe_spec_from_args(args, name)
            if ref in items:
                by_spec.setdefault(repr(spec.to_json()), (spec, []))[1].extend(items.pop(ref))
        sweeps = list(by_spec.values())
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
