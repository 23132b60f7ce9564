"""`python -m core train` (one model from flags) and `python -m core zoo` (a preset, resumably).

The work only: the arguments, and what the command does, are in core/cli/zoo.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import replace

import torch

from core.choices import DEFAULT_PRESET, HUB_FIXTURE_MODEL, REAL_PRESET
from core.cli.backend import executor_from_args
from core.errors import HeadLabError
from core.model.refs import zoo_model_dir
from core.tasks.sequences import SEQ_VOCAB_SIZE
from core.tasks.vocab import BYTE_VOCAB_SIZE
from core.zoo.config import SEQUENCE_TASKS
from core.zoo.hub_cache import write_hub_cache
from core.zoo.presets import check_threads_per_model, estimate_zoo, task_recipe, train_zoo, zoo_record
from core.zoo.real import install_real_preset
from core.zoo.train import train_model

HUB_NAME_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")  # the hub's rule for ORG and NAME


def cli_train(args: argparse.Namespace) -> dict:
    """Train one model from flags into zoo_dir()/<name>; returns its zoo record."""
    out_dir = zoo_model_dir(args.name)  # one folder name inside the zoo, never a path
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    base_model, base_train = task_recipe(args.task)
    # a flag left out takes the task's default; a given 0 goes to the configs, which refuse it
    d_model = chosen(args.d_model, base_model.d_model)
    model_cfg = replace(
        base_model, family=args.family, n_layers=chosen(args.layers, base_model.n_layers),
        n_heads=chosen(args.heads, base_model.n_heads), d_model=d_model, d_ff=chosen(args.d_ff, 4 * d_model),
        vocab_size=SEQ_VOCAB_SIZE if args.task in SEQUENCE_TASKS else BYTE_VOCAB_SIZE,
    )
    train_cfg = replace(base_train, seed=args.seed, steps=chosen(args.steps, base_train.steps), init_from=args.init_from,
                        hhg_format=args.hhg_format)
    manifest = train_model(args.name, model_cfg, train_cfg, out_dir, progress=not args.no_progress)
    return zoo_record(manifest)


def chosen(value: int | None, default: int) -> int:
    """A flag's value, or the default when the flag was left out (0 is a value, not "left out")."""
    return default if value is None else value


def cli_zoo(args: argparse.Namespace) -> dict | list:
    """Train the preset (no-op for trained models) and return one record per model."""
    check_zoo_flags(args)
    preset = args.preset or DEFAULT_PRESET
    if preset == REAL_PRESET:
        return cli_zoo_real(args)
    if getattr(args, "estimate", False):
        return estimate_zoo(preset, args.only, hhg_format=args.hhg_format)
    if args.as_hub is not None:
        record = write_hub_cache(args.model or HUB_FIXTURE_MODEL, check_hub_name(args.as_hub),
                                 style=args.revision_names or "pythia")
        print(f"{record['model']} -> hub model {record['repo_id']} in {record['repo_folder']}: "
              + ", ".join(c["revision"] for c in record["checkpoints"]) + " (main = the last)")
        return record
    check_threads_per_model(args.threads_per_model)  # before a Ray cluster starts
    executor = executor_from_args(args)  # also refuses --address without --backend ray
    # serial: train_zoo's own loop (a bar per model; the thread policy's count unless --threads-per-model)
    records = train_zoo(preset, progress=not args.no_progress, only=args.only,
                        executor=None if executor.backend == "serial" else executor,
                        threads_per_model=args.threads_per_model, hhg_format=args.hhg_format)
    for r in records:
        figures = {k: r[k] for k in ("induction_loss", "train_accuracy", "marker_accuracy") if k in r}
        print(f"{r['name']}: {r['family']} {r['n_layers']}x{r['n_heads']}, {r['checkpoints']} checkpoints, "
              f"{r['train_seconds']:.0f} s, {figures}")
    return records


def training_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags given that only steer training (--estimate, --threads-per-model, a non-default --hhg-format or
    --backend): refused where nothing is trained."""
    return [flag for flag, value in (("--estimate", args.estimate or None),
                                     ("--threads-per-model", args.threads_per_model),
                                     ("--hhg-format", None if args.hhg_format == "headlab" else args.hhg_format),
                                     ("--backend", None if args.backend == "serial" else args.backend))
            if value is not None]


def cli_zoo_real(args: argparse.Namespace) -> dict:
    """`zoo --preset real`: fetch, check and import the pretrained models; the result records each import's time."""
    training = training_flags_given(args)
    if training:
        raise HeadLabError(f"--preset {REAL_PRESET} trains nothing (it downloads and imports), so "
                           f"{' and '.join(training)} mean nothing with it; drop {'it' if len(training) == 1 else 'them'}.")
    started, load = time.monotonic(), os.getloadavg()[0]
    records = install_real_preset(args.only)
    # the machine's state beside the times: an import on a busy machine takes several times longer
    return {"preset": REAL_PRESET, "models": records, "seconds": round(time.monotonic() - started, 1),
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_1min_at_start": round(load, 2),
            "load_1min_at_end": round(os.getloadavg()[0], 2)}


def check_zoo_flags(args: argparse.Namespace) -> None:
    """Refuse, before any work, a flag that means nothing with the others: --as-hub trains nothing,
    and --model / --revision-names only say what --as-hub writes (without it the whole preset would train)."""
    if args.as_hub is None:
        alone = [flag for flag, value in (("--model", args.model), ("--revision-names", args.revision_names))
                 if value is not None]
        if alone:
            raise HeadLabError(f"{' and '.join(alone)} only {'means' if len(alone) == 1 else 'mean'} something with "
                               "--as-hub ORG/NAME (which writes a "
                               "trained zoo model into the Hugging Face cache); add --as-hub, or use --only MODEL to "
                               "train one model of the preset.")
        return
    training = [flag for flag, value in (("--preset", args.preset), ("--only", args.only)) if value is not None]
    training += training_flags_given(args)
    if training:
        raise HeadLabError(f"--as-hub trains nothing, so {' and '.join(training)} mean nothing with it; drop "
                           f"{'it' if len(training) == 1 else 'them'}, or train first (zoo --only MODEL) and then "
                           "write it with --as-hub ORG/NAME --model MODEL.")


def check_hub_name(name: str) -> str:
    """A hub model name ORG/NAME, checked before anything is written: it becomes one folder name inside the
    hub cache (models--ORG--NAME), so a path (.., /, an absolute path) must never reach the file system."""
    parts = name.split("/")
    if len(parts) != 2 or not all(HUB_NAME_PART.fullmatch(p) for p in parts) or ".." in name or "--" in name:
        raise HeadLabError(f"--as-hub {name!r} is not a hub name: give ORG/NAME, two parts of letters, digits, '-', "
                           "'_' and '.' (no path, no '..' or '--', each part 1 to 96 characters), e.g. "
                           f"headlab/pythia-{HUB_FIXTURE_MODEL}.")
    return name
