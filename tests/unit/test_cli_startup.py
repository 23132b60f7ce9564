"""`python -m core --help` and a misspelt command answer without loading the heavy libraries.

The command modules import torch, transformers and TransformerLens (about 16 s of CPU, a minute on a
busy machine); core/__main__.py imports only the module of the command it runs. Checked on
`sys.modules` in a fresh interpreter rather than by timing, so the test cannot be flaky.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.__main__ import COMMANDS, build_parser, requested_command

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "transformer_lens", "scipy", "core.cli.recipe", "core.cli.known_run",
         "core.cli.models_run")


def _loaded_after(argv: list[str]) -> dict:
    """Run `main(argv)` in a fresh interpreter; which heavy modules it loaded, and its exit status."""
    script = (
        "import contextlib, io, json, sys\n"
        "from core.__main__ import main\n"
        f"argv = {argv!r}\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "    try:\n"
        "        code = main(argv)\n"
        "    except SystemExit as stop:\n"
        "        code = stop.code\n"
        f"print(json.dumps({{'code': code, 'heavy': [m for m in {HEAVY!r} if m in sys.modules], "
        "'text': out.getvalue()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], [], ["recipee"], ["--bogus"]])
def test_help_and_a_wrong_command_import_no_heavy_library(argv):
    result = _loaded_after(argv)
    assert result["heavy"] == []
    assert result["code"] in (0, 2)
    assert "COMMAND" in result["text"]  # the usage line, with the commands' list for --help
    if argv == ["--help"]:
        assert all(name in result["text"] for name in COMMANDS)


@pytest.mark.parametrize("argv, says", [(["known", "--help"], "--build"), (["known", "--bogus"], "unrecognized arguments"),
                                        (["models", "--help"], "with import: the .gguf file"),
                                        (["models", "a", "b", "c"], "unrecognized arguments: c")])
def test_a_command_whose_work_lives_apart_answers_help_and_a_wrong_flag_without_it(argv, says):
    """`known` and `models` keep their arguments in core/cli/NAME.py and their work in core/cli/NAME_run.py, loaded
    when the command runs."""
    result = _loaded_after(argv)
    assert result["heavy"] == []
    assert result["code"] in (0, 2)
    assert says in result["text"]


def test_the_command_named_is_the_only_one_wired():
    assert requested_command(["recipe", "--model", "x"]) == ["recipe"]
    assert requested_command(["--help"]) == [] and requested_command(["recipee"]) == []
    assert requested_command(["bench", "probe"]) == ["bench"]
    args = build_parser(["models"]).parse_args(["models"])
    assert args.run.__module__ == "core.cli.models"
    assert getattr(build_parser([]).parse_args(["models"]), "run", None) is None
