"""`python -m core --help`, every command's `--help` and a mistyped flag answer without loading the heavy libraries.

The work of each command (torch, transformers and TransformerLens: about 16 s of CPU, a minute on a busy machine)
is in core/cli/NAME_run.py, imported when the command runs; core/cli/NAME.py holds its arguments, built from
core/choices.py. Checked on `sys.modules` in a fresh interpreter rather than by timing, so the test cannot be flaky.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from core.__main__ import COMMANDS, build_parser, requested_command

REPO = Path(__file__).resolve().parents[2]
RUN_MODULES = tuple(f"core.cli.{path.stem}" for path in sorted((REPO / "core" / "cli").glob("*_run.py")))
HEAVY = ("torch", "transformers", "transformer_lens", "scipy", "numpy") + RUN_MODULES


def _loaded_after(argvs: list[list[str]]) -> dict:
    """Build the parser of every command, then run `main(argv)` for each argv, in one fresh interpreter: which heavy
    modules that loaded, and each argv's exit status and printed text."""
    script = (
        "import contextlib, io, json, sys\n"
        "from core.__main__ import build_parser, main\n"
        "build_parser(None)  # every command and bench target wired\n"
        "runs = []\n"
        f"for argv in {argvs!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as stop:\n"
        "            code = stop.code\n"
        "    runs.append({'argv': argv, 'code': code, 'text': out.getvalue()})\n"
        f"print(json.dumps({{'runs': runs, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_and_a_wrong_command_import_no_heavy_library():
    result = _loaded_after([["--help"], [], ["recipee"], ["--bogus"]])
    assert result["heavy"] == []
    assert [run["code"] for run in result["runs"]] == [0, 2, 2, 2]
    assert all("COMMAND" in run["text"] for run in result["runs"])  # the usage line, with the commands' list for --help
    assert all(name in result["runs"][0]["text"] for name in COMMANDS)


def test_every_command_answers_help_and_a_wrong_flag_without_its_work():
    """Each command's and bench target's --help (exit 0) and argument errors (exit 2: an unknown flag after valid
    arguments, whose defaults are then converted, a bad choice, a missing argument) load none of the heavy modules."""
    from core.cli.bench import BENCHES

    targets = [*BENCHES, "all"]
    helps = [[name, "--help"] for name in COMMANDS] + [["bench", "--help"]] + [["bench", t, "--help"] for t in targets]
    wrong = ([[name, "--bogus"] for name in COMMANDS] + [["bench", t, "--bogus"] for t in targets]
             + [["screen", "m", "--bogus"], ["zoo", "--bogus"], ["edges", "m", "--method", "nope"], ["patch", "m", "--seed", "-1"],
                ["models", "a", "b", "c"], ["bench", "nope"], ["bench", "probe", "--device", "tpu"]])
    result = _loaded_after(helps + wrong)
    assert result["heavy"] == []
    runs = result["runs"]
    assert [run["code"] for run in runs] == [0] * len(helps) + [2] * len(wrong)
    assert all("usage:" in run["text"] for run in runs)
    assert all("error:" in run["text"] for run in runs[len(helps):])
    said = {" ".join(run["argv"]): run["text"] for run in runs}
    assert "--build" in said["known --help"] and "with import: the .gguf file" in said["models --help"]
    assert "unrecognized arguments: --bogus" in said["screen m --bogus"]
    assert "invalid choice: 'nope'" in said["edges m --method nope"]
    assert "unknown device 'tpu'" in said["bench probe --device tpu"]


def test_the_light_copies_of_registry_names_match_their_registries():
    """core/choices.py copies the names of registries that hold heavy objects; each copy is the registry's own."""
    from core import choices
    from core.pipelines.benchmark import EDGE_METHOD_NAMES, HEAD_METHOD_NAMES
    from core.pipelines.proposers import PROPOSERS
    from core.zoo.presets import ZOO_PRESETS
    from core.zoo.real import REAL_MODELS

    assert choices.BENCHMARK_HEAD_METHODS == HEAD_METHOD_NAMES
    assert choices.BENCHMARK_EDGE_METHODS == EDGE_METHOD_NAMES
    assert choices.ZOO_PRESET_NAMES == tuple(ZOO_PRESETS)
    assert choices.REAL_MODEL_NAMES == tuple(REAL_MODELS)
    assert tuple(choices.PROPOSER_SUMMARIES) == tuple(p.name for p in PROPOSERS)


def test_the_command_named_is_the_only_one_wired():
    assert requested_command(["recipe", "--model", "x"]) == ["recipe"]
    assert requested_command(["--help"]) == [] and requested_command(["recipee"]) == []
    assert requested_command(["bench", "probe"]) == ["bench"]
    args = build_parser(["models"]).parse_args(["models"])
    assert args.run.__module__ == "core.cli.models"
    assert getattr(build_parser([]).parse_args(["models"]), "run", None) is None
