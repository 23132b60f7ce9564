"""HeadLab's command line: `python -m core <command> ...`.

Each command is a module of core/cli/ (the benchmarks: core/cli/bench.py) with a pair
`add_<name>_arguments(parser)` / `cli_<name>(args) -> dict`. This file only wires them up, writes
`--json PATH` when asked, and turns a HeadLabError into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from types import ModuleType

from core.cli import attribution, bench, benchmark, coactivation, edges, export, known, models, patch, probe, proposers, recipe, replicate, zoo
from core.errors import HeadLabError
from core.threads import apply_thread_policy
from core.workspace import atomic_write_json, check_output_file

# command name -> (module, function suffix, one-line help)
COMMANDS: dict[str, tuple[ModuleType, str, str]] = {
    "models": (models, "models", "list zoo models and their checkpoints"),
    "train": (zoo, "train", "train one model from flags, with checkpoints"),
    "zoo": (zoo, "zoo", "train the model zoo (quick or paper preset); no-op when trained"),
    "probe": (probe, "probe", "run the instrumented pass and fill the cache"),
    "screen": (recipe, "screen", "Steps 1-2: PR trajectories, PR-integral, pattern screen"),
    "ablate": (recipe, "ablate", "group ablation with matched-random controls"),
    "recipe": (recipe, "recipe", "the full three-step recipe with its verdict"),
    "attribution": (attribution, "attribution", "gradient attribution vs causal importance [HHG]"),
    "proposers": (proposers, "proposers", "proposers vs disposer: four circuit proposals, one closure test"),
    "export": (export, "export", "paper figures headless: spectral, screen, ablation, attribution (PNG/SVG/PDF + CSV/JSON)"),
    "coactivation": (coactivation, "coactivation", "Ising co-activation communities and their closure test [CVC]"),
    "replicate": (replicate, "replicate", "the papers' claims on the zoo: a report with verdicts and figures"),
    "patch": (patch, "patch", "activation, attribution and path patching on clean/corrupted pairs"),
    "known": (known, "known", "models whose circuit is known (hand-wired, planted): list, --build"),
    "benchmark": (benchmark, "benchmark", "every proposer, patching and edge method scored against the known circuits"),
    "edges": (edges, "edges", "edge-level discovery (EAP, EAP-IG, ACDC) with faithfulness curves and random edge sets"),
}



# the errors of a write that the machine, not the command, refused
WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _add_json_flag(parser: argparse.ArgumentParser) -> None:
    if not any("--json" in action.option_strings for action in parser._actions):
        parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, suffix, help_text) in COMMANDS.items():
        _wire(sub.add_parser(name, help=help_text, description=help_text), module, suffix)
    bench_parser = sub.add_parser("bench", help="benchmarks that print ratios against a baseline run in the same process")
    bench_sub = bench_parser.add_subparsers(dest="bench", metavar="TARGET")
    bench_sub.required = True
    for name, (add_arguments, run, help_text) in bench.BENCHES.items():
        cmd = bench_sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(cmd)
        cmd.set_defaults(run=bench.with_machine(run))
        _add_json_flag(cmd)
    all_help = "every benchmark at its defaults, one JSON each (bench-<name>.json) in --out"
    _wire(bench_sub.add_parser("all", help=all_help, description=all_help), bench, "bench_all")
    return parser


def _wire(cmd: argparse.ArgumentParser, module: ModuleType, suffix: str) -> None:
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
    args = build_parser().parse_args(argv)
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
