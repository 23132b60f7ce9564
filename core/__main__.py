"""HeadLab's command line: `python -m core <command> ...`.

Each command lives in the module that owns its computation, as a pair
`add_<name>_arguments(parser)` / `cli_<name>(args) -> dict`. This file only wires them up, writes
`--json PATH` when asked, and turns a HeadLabError into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from core.errors import HeadLabError

# command name -> (module, function suffix, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "models": ("core.model.loading", "models", "list zoo models and their checkpoints"),
    "train": ("core.zoo.train", "train", "train one model from flags, with checkpoints"),
    "zoo": ("core.zoo.train", "zoo", "train the model zoo (quick or paper preset); no-op when trained"),
    "probe": ("core.store", "probe", "run the instrumented pass and fill the cache"),
    "screen": ("core.pipelines.recipe", "screen", "Steps 1-2: PR trajectories, PR-integral, pattern screen"),
    "ablate": ("core.pipelines.recipe", "ablate", "group ablation with matched-random controls"),
    "recipe": ("core.pipelines.recipe", "recipe", "the full three-step recipe with its verdict"),
    "attribution": ("core.pipelines.attribution", "attribution", "gradient attribution vs causal importance [HHG]"),
    "proposers": ("core.pipelines.proposers", "proposers", "proposers vs disposer: four circuit proposals, one closure test"),
    "export": ("core.cli.export", "export", "paper figures headless: spectral, screen, ablation, attribution (PNG/SVG/PDF + CSV/JSON)"),
    "coactivation": ("core.pipelines.coactivation", "coactivation", "Ising co-activation communities and their closure test [CVC]"),
    "replicate": ("core.pipelines.replicate", "replicate", "the papers' claims on the zoo: a report with verdicts and figures"),
}

# bench target -> (module, function suffix)
BENCHES: dict[str, tuple[str, str, str]] = {
    "probe": ("core.probe", "bench_probe", "instrumented pass vs bare forward vs three passes"),
    "ablation": ("core.ablation.engine", "bench_ablation", "ablation engine vs naive per-condition loop"),
    "ising": ("core.stats.ising", "bench_ising", "joint pseudolikelihood fit vs per-spin scikit-learn"),
}


def _add_json_flag(parser: argparse.ArgumentParser) -> None:
    if not any("--json" in action.option_strings for action in parser._actions):
        parser.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, suffix, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        _wire(cmd, module_name, suffix, name)
    bench = sub.add_parser("bench", help="benchmarks that print ratios against a baseline run in the same process")
    bench_sub = bench.add_subparsers(dest="bench", metavar="TARGET")
    bench_sub.required = True
    for name, (module_name, suffix, help_text) in BENCHES.items():
        cmd = bench_sub.add_parser(name, help=help_text, description=help_text)
        _wire(cmd, module_name, suffix, f"bench {name}")
    return parser


def _wire(cmd: argparse.ArgumentParser, module_name: str, suffix: str, name: str) -> None:
    """Give `cmd` its module's arguments and runner, or mark it unavailable."""
    module = _import(module_name)
    add = getattr(module, f"add_{suffix}_arguments", None)
    run = getattr(module, f"cli_{suffix}", None)
    if add is not None and run is not None:
        add(cmd)
        cmd.set_defaults(run=run)
    else:
        cmd.set_defaults(run=_unavailable(name))
    _add_json_flag(cmd)


def _import(module_name: str):
    """Import a command's module; a module not written yet leaves its command unavailable."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def _unavailable(name: str):
    def run(args: argparse.Namespace) -> dict:
        raise HeadLabError(f"'{name}' is not available in this version of HeadLab.")

    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.run(args)
        if args.json is not None and result is not None:
            from core.workspace import atomic_write_json

            atomic_write_json(args.json, result)
            print(f"wrote {args.json}")
    except HeadLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished work is kept and a rerun resumes from it.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
