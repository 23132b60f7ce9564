"""Issue 40's "Checked by" commands on one imported real model, timed, into one compact JSON record.

    HEADLAB_THREADS=1 python scripts/real_checks.py smollm2-135m            # every step not yet done
    HEADLAB_THREADS=1 python scripts/real_checks.py gemma3-270m --only edges  # one step (again)
    python scripts/real_checks.py smollm2-135m --record-only                  # the record from what ran

Each step is the ordinary command line (`python -m core STEP ... --json`) run as a subprocess, so what is
timed is what a user runs: model load, probe, work and writing the result. Its full JSON and its log are kept
under $HEADLAB_HOME/reports/real-checks/<model>/; a step whose JSON is there is not run again (delete the file
to rerun it). The record (docs/measurements/real-checks-<model>.json by default) holds, per step, the exact
command, the wall time, the exit status and the few outputs a reader checks first.

Sizes are small on purpose (a shared 2-core CPU at one torch thread): the random-token steps use the
repeated-sequence induction probe (`--task induction-repeat`, N=8 sequences of T=32 tokens: a random 16-token
sequence and its repeat); patch and edges use the built-in IOI task (`--task ioi`, N=8 prompts, ABC counterfactual).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.model.loading import load_config  # noqa: E402  (after the path: the script runs from anywhere)
from core.model.refs import ModelRef  # noqa: E402
from core.workspace import atomic_write_json, headlab_home  # noqa: E402

STEPS = ("screen", "ablate", "patch", "coactivation", "proposers", "edges")
INDUCTION = ["--task", "induction-repeat", "--n", "8", "--seq-len", "32"]
IOI = ["--task", "ioi", "--n", "8"]


def step_args(step: str, model: str, done: dict) -> list[str]:
    """The command line of one step (ablate reads the heads screen proposed)."""
    if step == "screen":
        return ["screen", model, *INDUCTION]
    if step == "ablate":
        return ["ablate", model, "--heads", ",".join(one_head_per_layer(done["screen"]["candidate_circuit"])),
                "--controls", "5", *INDUCTION]
    if step == "patch":
        return ["patch", model, *IOI]
    if step == "coactivation":  # the pseudolikelihood fit needs at least as many examples as heads
        return ["coactivation", model, "--controls", "2", *INDUCTION[:-4], "--n", str(n_heads_total(model) + 8),
                "--seq-len", "24"]
    if step == "proposers":
        return ["proposers", model, "--controls", "2", *INDUCTION]
    if step == "edges":
        return ["edges", model, "--method", "eap-ig", "--controls", "5", *IOI]
    raise ValueError(step)


def one_head_per_layer(heads: list[str], k: int = 3) -> list[str]:
    """The first candidate head of each of the first k layers: matched controls (same layers, disjoint) then exist
    even on Gemma-3's 4 heads per layer."""
    picked: dict[str, str] = {}
    for head in heads:
        picked.setdefault(head.split("H")[0], head)
    return list(picked.values())[:k]


def n_heads_total(model: str) -> int:
    config = load_config(ModelRef.parse(model), "main")
    return config.num_hidden_layers * config.num_attention_heads


def key_outputs(step: str, out: dict) -> dict:
    """The outputs a reader checks first, from the command's own JSON (the whole JSON stays in the work folder)."""
    if step == "screen":
        return {k: out.get(k) for k in ("candidate_circuit", "previous_token_circuit", "top_k_spectral", "fractions")}
    if step == "ablate":
        summary = out["summary"]
        return {"selection": summary["selection"], "n_controls": summary["n_controls"],
                "metrics": {name: {k: stats.get(k) for k in ("clean", "candidate_delta", "control_mean", "control_std",
                                                             "rank", "p", "z")}
                            for name, stats in summary["metrics"].items()},
                "verdicts": {name: v.get("label") for name, v in summary.get("verdicts", {}).items()}}
    if step == "patch":
        act = out["activation"]
        return {"clean_logit_diff": act.get("clean_value"), "corrupted_logit_diff": act.get("corrupted_value"),
                "identity_max_diff": act.get("identity_max_diff"), "spearman_attribution_activation": out.get("spearman"),
                "top_heads": _top_heads(act["scores"], 5), "seconds": out.get("seconds"), "notes": out.get("notes")}
    if step == "proposers":
        return {"survivors": out.get("survivors"), "proposals": [
            {"method": d["proposal"]["method"], "n_heads": len(d["proposal"]["heads"]),
             "verdict_paper": d.get("verdict_paper"), "verdict_reference": d.get("verdict_reference"),
             "loss": {k: d.get("metrics", {}).get("loss", {}).get(k) for k in ("candidate_delta", "control_mean", "rank", "p")}}
            for d in out.get("disposals", [])]}
    if step == "edges":
        return {"n_discovered": len(out.get("discovered", ())), "discovered_top10": list(out.get("discovered", ()))[:10],
                "heads": len(out.get("heads", ())), "curve": _scalars(out.get("curve")),
                "controls": _scalars(out.get("controls")), "seconds": out.get("seconds"), "notes": out.get("notes")}
    if step == "coactivation":
        summary = out["summary"]
        return {"k": summary["k"], "candidate": summary["candidate"], "isolation": summary["isolation"],
                "purity": summary["purity"], "size_fallback": summary["size_fallback"], "notes": out.get("notes"),
                "closure": [{k: c.get(k) for k in ("kind", "delta", "z", "verdict_paper", "verdict_reference")}
                            for c in summary["closure"]]}
    return {k: _scalars(out.get(k)) for k in ("shape", "proposal", "closure", "notes") if k in out}


def _top_heads(scores: list, k: int) -> list:
    """The k heads of largest patching score, [name, score]."""
    flat = [(value, f"L{layer}H{head}") for layer, row in enumerate(scores) for head, value in enumerate(row)]
    return [[name, round(value, 4)] for value, name in sorted(flat, reverse=True)[:k]]


def _scalars(value, depth: int = 2):
    """A JSON value with its bulk left out: numbers, strings and short lists kept, dicts to `depth` levels."""
    if isinstance(value, dict):
        if depth == 0:
            return None
        kept = {k: _scalars(v, depth - 1) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None}
    if isinstance(value, list):
        return value if len(value) <= 12 and all(not isinstance(v, (dict, list)) for v in value) else None
    return value


def run_step(step: str, model: str, work: Path, done: dict) -> dict:
    args = [*step_args(step, model, done), "--json", str(work / f"{step}.json")]
    env = dict(os.environ, HEADLAB_THREADS=os.environ.get("HEADLAB_THREADS", "1"))
    start = time.perf_counter()
    with open(work / f"{step}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "core", *args], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - start
    record = {"command": "python -m core " + " ".join(args[:-2]) + " --json", "wall_s": round(seconds, 1),
              "exit_status": rc, "load_average_after": [round(x, 2) for x in os.getloadavg()], "commit": _commit()}
    (work / f"{step}.time.json").write_text(json.dumps(record))
    return record


def _commit() -> str:
    """HEAD, with "+changes" when tracked files differ from it (others may be editing the same tree)."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout
    return head + ("+changes" if dirty.strip() else "")


def machine() -> dict:
    """Where and when the record was written (the subprocesses' own threads: HEADLAB_THREADS)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    commit = _commit()
    return {"cpu_model": cpu, "cpu_count": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="zoo name of an imported real model (smollm2-135m, gemma3-270m)")
    parser.add_argument("--only", nargs="+", choices=STEPS, default=None, help="run these steps (again)")
    parser.add_argument("--record-only", action="store_true", help="run nothing: write the record from the work folder")
    parser.add_argument("--out", type=Path, default=None, help="record (default docs/measurements/real-checks-MODEL.json)")
    args = parser.parse_args()
    work = headlab_home() / "reports" / "real-checks" / args.model
    work.mkdir(parents=True, exist_ok=True)
    done: dict = {}
    for step in STEPS:
        result, timing = work / f"{step}.json", work / f"{step}.time.json"
        if args.only is not None and step in args.only and not args.record_only:
            result.unlink(missing_ok=True)
        if not args.record_only and (args.only is None or step in args.only) and not result.exists():
            print(f"{args.model}: {step} ...", flush=True)
            print(f"  {run_step(step, args.model, work, done)}", flush=True)
        if result.exists():
            done[step] = json.loads(result.read_text())
    steps = {}
    for step in STEPS:
        timing = work / f"{step}.time.json"
        if timing.exists():
            steps[step] = json.loads(timing.read_text())
            if step in done:
                steps[step]["outputs"] = key_outputs(step, done[step])
            elif steps[step]["exit_status"] != 0:  # the one line the command printed to say why
                errors = [line for line in (work / f"{step}.log").read_text().splitlines() if line.startswith("error:")]
                steps[step]["error"] = errors[-1] if errors else None
    record = {"model": args.model, "threads": int(os.environ.get("HEADLAB_THREADS", "1")), "steps": steps,
              "machine": machine()}
    out = args.out or REPO / "docs" / "measurements" / f"real-checks-{args.model}.json"
    atomic_write_json(out, record)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
