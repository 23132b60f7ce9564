"""`python -m core probe`'s work (its arguments: core/cli/probe.py): fill the HeadStats cache for one or every
checkpoint of one or more models (serial or on Ray), and the probes every command builds from the shared flags."""

from __future__ import annotations

import argparse

from core.errors import HeadLabError
from core.cli.backend import executor_from_args
from core.executor import ProgressBar, tqdm_progress
from core.model.loading import load_model
from core.model.memory import check_probe_batch_fits
from core.model.refs import ModelRef, checkpoint_path, list_checkpoints, resolve_checkpoint
from core.pipelines.sweep import SweepItem, probe_sweep
from core.probe import HEADSTATS_VERSION, pattern_batch_for
from core.tasks.induction import describe_token_source
from core.tasks.counterfactual import InductionCounterfactualSpec
from core.tasks.ioi import IoiCounterfactualSpec, IoiSpec, describe_ioi
from core.tasks.probe_batch import ProbeBatch
from core.tasks.probe_file import ProbeFile, read_probe_file
from core.tasks.specs import TOKENIZER_TASKS, ProbeSpec, built_in_counterfactual, probe_spec
from core.tasks.tokens import tokenizer_of_folder


def say_probe_notes(spec: dict) -> None:
    """Print the notes a probe file's batch carries (e.g. targets of several tokens), before the figures."""
    for note in spec.get("notes", ()):
        print(f"note: {note}")


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


def built_in_pairs(args: argparse.Namespace) -> InductionCounterfactualSpec | IoiCounterfactualSpec:
    """The clean/corrupted pairs of a built-in task (patch, edges): the induction probe with its earlier A
    corrupted, or the ioi prompts with their ABC or swapped-subject twins."""
    spec = probe_spec_from_args(args)
    if not isinstance(spec, IoiSpec) and args.corruption != "abc":
        raise HeadLabError("--corruption chooses the ioi task's counterfactual; leave it out with --task induction.")
    return built_in_counterfactual(spec, args.corrupt_seed, args.corruption)


def probe_from_args(args: argparse.Namespace) -> ProbeSpec | ProbeFile:
    """The probe a command runs on: the user's probe file when given, else the built-in probe the flags describe."""
    if args.probe_file is not None:
        return read_probe_file(args.probe_file, padding=args.padding)
    return probe_spec_from_args(args)


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
