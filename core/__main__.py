"""HeadLab's command line: `python -m core <command> ...`.

Each command is a module of core/cli/ (the benchmarks: core/cli/bench.py) with a pair
`add_<name>_arguments(parser)` / `cli_<name>(args) -> dict`. This file only wires them up, writes
`--json PATH` when asked, and turns a HeadLabError into one line on stderr and exit status 2.

A command's work imports torch, transformers and TransformerLens (about 16 s of CPU, a minute on a
busy machine). `main` imports only the module of the command it runs, which holds its arguments alone
(the work is in core/cli/NAME_run.py, imported when it runs): `--help`, a misspelt command or flag and
the list of commands answer at once.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
from pathlib import Path
from typing import Iterable

from core.errors import HeadLabError
from core.threads import apply_thread_policy
from core.workspace import atomic_write_json, check_output_file

# command name -> (module of core/cli/, function suffix, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "models": ("core.cli.models", "models", "list zoo models and their checkpoints"),
    "train": ("core.cli.zoo", "train", "train one model from flags, with checkpoints"),
    "zoo": ("core.cli.zoo", "zoo", "train the model zoo (quick or paper preset); no-op when trained"),
    "probe": ("core.cli.probe", "probe", "run the instrumented pass and fill the cache"),
    "screen": ("core.cli.recipe", "screen", "Steps 1-2: PR trajectories, PR-integral, pattern screen"),
    "ablate": ("core.cli.recipe", "ablate", "group ablation with matched-random controls"),
    "recipe": ("core.cli.recipe", "recipe", "the full three-step recipe with its verdict"),
    "attribution": ("core.cli.attribution", "attribution", "gradient attribution vs causal importance [HHG]"),
    "proposers": ("core.cli.proposers", "proposers", "proposers vs disposer: four circuit proposals, one closure test"),
    "export": ("core.cli.export", "export", "paper figures headless: spectral, screen, ablation, attribution (PNG/SVG/PDF + CSV/JSON)"),
    "coactivation": ("core.cli.coactivation", "coactivation", "Ising co-activation communities and their closure test [CVC]"),
    "replicate": ("core.cli.replicate", "replicate", "the papers' claims on the zoo: a report with verdicts and figures"),
    "patch": ("core.cli.patch", "patch", "activation, attribution and path patching on clean/corrupted pairs"),
    "known": ("core.cli.known", "known", "models whose circuit is known (hand-wired, planted): list, --build"),
    "benchmark": ("core.cli.benchmark", "benchmark", "every proposer, patching and edge method scored against the known circuits"),
    "edges": ("core.cli.edges", "edges", "edge-level discovery (EAP, EAP-IG, ACDC) with faithfulness curves and random edge sets"),
    "study": ("core.cli.study", "study", "a real model's circuit report (induction or IOI): JSON, Markdown and figures"),
}
BENCH_MODULE = "core.cli.bench"
BENCH_HELP = "benchmarks that print ratios against a baseline run in the same process"



# the errors of a write that the machine, not the command, refused
WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _add_json_flag(parser: argparse.ArgumentParser) -> None:
    if not any("--json" in action.option_strings for action in parser._actions):
        parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser, every command listed; the arguments (and so the imports) only of `commands`
    (None: every command, "bench" included). A command left unwired parses to no `run`."""
    wired = set(COMMANDS) | {"bench"} if commands is None else set(commands)
    parser = argparse.ArgumentParser(prog="python -m core", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, suffix, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if name in wired:
            _wire(cmd, importlib.import_module(module), suffix)
    bench_parser = sub.add_parser("bench", help=BENCH_HELP, description=BENCH_HELP)
    if "bench" in wired:
        _wire_benches(bench_parser, importlib.import_module(BENCH_MODULE))
    return parser


def _wire_benches(bench_parser: argparse.ArgumentParser, bench) -> None:
    bench_sub = bench_parser.add_subparsers(dest="bench", metavar="TARGET")
    bench_sub.required = True
    for name, (add_arguments, run, help_text) in bench.BENCHES.items():
        cmd = bench_sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(cmd)
        cmd.set_defaults(run=bench.with_machine(run))
        _add_json_flag(cmd)
    all_help = "every benchmark at its defaults, one JSON each (bench-<name>.json) in --out"
    _wire(bench_sub.add_parser("all", help=all_help, description=all_help), bench, "bench_all")


def requested_command(argv: list[str]) -> list[str]:
    """The command `argv` names (its first word that is not an option), as a list of at most one:
    none for `--help`, no word or a misspelt command, which argparse then answers."""
    for word in argv:
        if not word.startswith("-"):
            return [word] if word in COMMANDS or word == "bench" else []
    return []


def _wire(cmd: argparse.ArgumentParser, module, suffix: str) -> None:
    """Give `cmd` its module's arguments, its runner and the --json flag."""
    getattr(module, f"add_{suffix}_arguments")(cmd)
    cmd.set_defaults(run=getattr(module, f"cli_{suffix}"))
    _add_json_flag(cmd)


def _write_json(path: Path, result: object) -> None:
    try:
        atomic_write_json(path, result)
    except OSError as exc:  # a full disk or a folder made read-only while the command ran
        raise HeadLabError(f"cannot write --json {path} ({exc.strerror}); the result above was computed, "
                           "so free some space or choose another path and rerun (cached work is reused).") from None


def _missing_folder(path: Path) -> Path | None:
    """The outermost folder above `path` that does not exist yet (the write makes it), or None."""
    missing = None
    for parent in Path(path).parents:
        if parent.exists():
            break
        missing = parent
    return missing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(requested_command(argv)).parse_args(argv)
    try:
        if args.json is not None:
            check_output_file(args.json, "--json")  # before the work, not after it
            made = _missing_folder(args.json)  # the write creates it: said on the line that reports the file
        apply_thread_policy()  # torch's threads from the CPUs' load now (core/threads.py)
        result = args.run(args)
        if args.json is not None and result is not None:
            _write_json(args.json, result)
            print(f"wrote {args.json}" + (f" (created the folder {made})" if made else ""))
    except HeadLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished work is kept and a rerun resumes from it.", file=sys.stderr)
        return 130
    except OSError as exc:  # the disk filled or turned read-only mid-run (a write HeadLab did not wrap itself)
        if exc.errno not in WRITE_FAILURES:
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror}{where}; free some space or choose a writable place, and rerun: every file "
              "is written whole or not at all, and finished work is reused.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
