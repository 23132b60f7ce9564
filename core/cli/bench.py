"""`python -m core bench ...`: the benchmarks' command-line wiring (what they measure lives in core/bench/).

Each benchmark is a pair `add_bench_<name>_arguments(parser)` / `cli_bench_<name>(args) -> dict` (in bench_run.py),
listed in `BENCHES`. Every result carries a `machine` record (CPU model, cores, torch threads, load average at the
start, date, commit), so a committed JSON says where and when its numbers were measured.
`python -m core bench all --out docs/measurements/` runs every benchmark at its defaults and writes
one `bench-<name>.json` each; the docs quote only figures found in those files.

The arguments, the machine record and `bench all` only: each benchmark's run is in core/cli/bench_run.py, imported
when it runs, so `bench --help`, `bench TARGET --help` and a mistyped flag answer without loading torch.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Callable

from core.choices import DEFAULT_DTYPE, DTYPE_NAMES, PYTHIA_SIZES, REAL_MODEL_NAMES, SWEEP_MODELS
from core.cli.probe import add_device_arguments
from core.errors import HeadLabError
from core.workspace import atomic_write_json, check_output_file

REPO_ROOT = Path(__file__).resolve().parents[2]


def machine_record() -> dict:
    """Where and when a benchmark ran: CPU model, cores, torch threads, load average, date, commit."""
    import torch  # its threads and GPU; loaded when a benchmark runs (never for --help)

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "cpu_model": cpu_model, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "uncommitted_changes": dirty, "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def add_bench_ablation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-examples", type=int, default=64, help="probe examples N (default 64)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random controls (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and batch")
    parser.add_argument("--chunk-size", type=int, default=None, help="conditions stacked per forward (default 1 on CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: HeadLab's choice for the CPUs' load, as every command makes it)")
    add_device_arguments(parser)


def add_bench_ising_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-spins", type=int, default=256, help="spins N (default 256)")
    parser.add_argument("--n-samples", type=int, default=2000, help="Gibbs samples M (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the planted model and the sampler")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the joint fit; the median is reported")
    parser.add_argument("--lbfgs", action="store_true", help="also time one torch L-BFGS over the summed objective")
    parser.add_argument("--coupling", type=float, nargs=2, default=(0.1, 0.3), metavar=("LOW", "HIGH"),
                        help="range of the planted within-community |J| (default 0.1 0.3; 0.1 0.4 is a harder, partly ordered regime)")


def add_bench_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", default="L1H1,L1H3,L1H6", help="the heads ablated (default L1H1,L1H3,L1H6)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random controls (default 20)")
    parser.add_argument("--n-examples", type=int, default=256, help="probe examples N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=4, help="timed repeats; medians are reported (default 4)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the lab's choice at a click)")
    add_device_arguments(parser)


def add_bench_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=40, help="training steps per measurement (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the whole sequence; medians are reported (default 3)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256, the app's default)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")


def add_bench_patch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--n-examples", type=int, default=256, help="pairs N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats; medians are reported (default 1)")
    add_device_arguments(parser)


def add_bench_edges_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--n-examples", type=int, default=32, help="pairs N (default 32)")
    parser.add_argument("--seq-len", type=int, default=32, help="sequence length T (default 32)")
    parser.add_argument("--ig-steps", type=int, nargs="+", default=[5, 20],
                        help="EAP-IG interpolation steps, one run each (default 5 20; the first is timed and also run "
                             "by MIB's rule)")
    parser.add_argument("--task", choices=["induction", "ioi"], default="induction",
                        help="the pairs: the induction counterfactual (default) or IOI's ABC pairs (a real tokenizer)")
    parser.add_argument("--sample-edges", type=int, default=None,
                        help="patch this many random edges, plus each method's top --sample-top (default: every edge)")
    parser.add_argument("--sample-top", type=int, default=20, help="with --sample-edges: each method's top edges patched too")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the random edge sample (default 0)")
    parser.add_argument("--no-curves", action="store_true", help="skip the faithfulness curves at MIB's edge fractions")
    parser.add_argument("--shape", choices=sorted(PYTHIA_SIZES), default="pythia-160m",
                        help="published architecture for the memory run, random weights (default pythia-160m)")
    parser.add_argument("--no-shape", action="store_true", help="skip the run at the published shape")
    add_device_arguments(parser)


def add_bench_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox",
                        help="zoo name, local Hugging Face folder or hub name (default: the quick zoo induction model)")
    parser.add_argument("--revision", default=None, help="checkpoint revision (default: the final one)")
    parser.add_argument("--n", type=int, default=256, help="probe sequences (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; medians are reported (default 5)")
    parser.add_argument("--chunk-size", type=int, default=64, help="examples per forward (default 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on shared CPUs more threads make the ratios noisy)")
    add_device_arguments(parser)


def add_bench_dtype_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(REAL_MODEL_NAMES),
                        help="zoo models, each loaded in float32 and bfloat16 (default: the two real models)")
    parser.add_argument("--n-examples", type=int, default=16, help="probe examples N (default 16)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward repeats; medians are reported (default 3)")
    parser.add_argument("--controls", type=int, default=5, help="matched-random controls of the ablation study (default 5)")
    parser.add_argument("--pairs", type=int, default=8, help="IOI pairs activation-patched over every head (default 8)")
    parser.add_argument("--skip-patching", action="store_true", help="leave out the patching comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")


def add_bench_scale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=None,
                        help="probe sequences, the first N of the reference batch (default: 2000 on CUDA, 16 on the CPU)")
    parser.add_argument("--shape", choices=sorted(PYTHIA_SIZES), default="pythia-160m", help="published architecture")
    parser.add_argument("--model", default=None,
                        help="a zoo model's real weights instead of the random shape (e.g. smollm2-135m)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats; medians are reported (default 1)")
    parser.add_argument("--chunk-size", type=int, default=16, help="probe examples per forward (default 16)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws (default 20)")
    parser.add_argument("--edge-pairs", type=int, default=8,
                        help="pairs for EAP / EAP-IG over every edge vs a forward + backward (default 8; 0 skips)")
    parser.add_argument("--ig-steps", type=int, default=5, help="EAP-IG interpolation steps (default 5)")
    add_device_arguments(parser)


def add_bench_screen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="induction-neox", help="zoo model (default induction-neox)")
    parser.add_argument("--revision", default=None, help="checkpoint (default: the final one)")
    parser.add_argument("--heads", default="L1H1,L1H3,L1H6", help="the heads ablated (default L1H1,L1H3,L1H6)")
    parser.add_argument("--clicks", type=int, default=8, help="clicks, each a fresh study (default 8)")
    parser.add_argument("--n-examples", type=int, default=256, help="probe examples N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=DEFAULT_DTYPE,
                        help="the precision the app loads the model in (the sidebar's, default float32)")
    parser.add_argument("--url", default=None,
                        help="time the clicks in the app already running at this address (e.g. http://127.0.0.1:8501, "
                             "serving the same HEADLAB_HOME) instead of serving one")


def add_bench_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(SWEEP_MODELS), help="zoo models whose checkpoints are swept")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the simulated two-node cluster")


def _when_run(name: str) -> Callable[[argparse.Namespace], dict]:
    """The runner of `bench NAME`: core/cli/bench_run.py's cli_bench_NAME, imported when the benchmark runs."""
    def run(args: argparse.Namespace) -> dict:
        from core.cli import bench_run  # torch and the benchmarks, loaded when one runs (never for --help)

        return getattr(bench_run, f"cli_bench_{name}")(args)
    return run


# bench target -> (add arguments, run, one-line help)
BENCHES: dict[str, tuple[Callable, Callable, str]] = {
    "probe": (add_bench_probe_arguments, _when_run("probe"), "instrumented pass vs bare forward vs three passes"),
    "ablation": (add_bench_ablation_arguments, _when_run("ablation"), "ablation engine vs naive per-condition loop"),
    "ising": (add_bench_ising_arguments, _when_run("ising"), "joint pseudolikelihood fit vs per-spin scikit-learn"),
    "load": (add_bench_load_arguments, _when_run("load"),
             "training steps and a probe pass, alone and beside a competing process"),
    "scale": (add_bench_scale_arguments, _when_run("scale"),
              "Pythia-160m shape, reference batch: instrumented pass, peak memory, ablation engine"),
    "sweep": (add_bench_sweep_arguments, _when_run("sweep"),
              "probe over every checkpoint of two zoo models: serial vs Ray, one and two nodes"),
    "patch": (add_bench_patch_arguments, _when_run("patch"), "attribution vs activation patching over every head of a zoo model"),
    "edges": (add_bench_edges_arguments, _when_run("edges"),
              "EAP vs brute-force edge patching, EAP-IG vs EAP, EAP's memory at Pythia-160m's shape"),
    "dtype": (add_bench_dtype_arguments, _when_run("dtype"),
              "bfloat16 vs float32 on the real models: forward time and every statistic's error"),
    "live": (add_bench_live_arguments, _when_run("live"),
             "the ablation lab's click: recording its own clean run vs from the kept one"),
    "screen": (add_bench_screen_arguments, _when_run("screen"),
               "the ablation lab's click in a real browser: candidate and verdict on screen"),
}


def with_machine(run: Callable[[argparse.Namespace], dict]) -> Callable[[argparse.Namespace], dict]:
    """`run`, with the machine record taken before it starts added to its result."""
    def run_with_machine(args: argparse.Namespace) -> dict:
        machine = machine_record()
        result = run(args)
        return {**result, "machine": machine}
    return run_with_machine


def add_bench_all_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for bench-<name>.json (e.g. docs/measurements/)")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), default=None, help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=sorted(BENCHES), default=(), help="leave these benchmarks out")


def cli_bench_all(args: argparse.Namespace) -> dict:
    """Every benchmark at its defaults, one after another (never side by side: they share the cores)."""
    names = [name for name in (args.only or BENCHES) if name not in set(args.skip)]
    if not names:
        raise HeadLabError("--only and --skip leave no benchmark to run; name at least one that --skip does not.")
    paths = {name: args.out / f"bench-{name}.json" for name in names}
    for path in paths.values():
        check_output_file(path, "--out")  # before an hour of work, not after it
    written = {}
    for name in names:
        add_arguments, run, _ = BENCHES[name]
        parser = argparse.ArgumentParser(prog=f"bench {name}")
        add_arguments(parser)
        started = time.perf_counter()
        result = with_machine(run)(parser.parse_args([]))
        result["bench_wall_s"] = round(time.perf_counter() - started, 2)
        atomic_write_json(paths[name], result)
        print(f"wrote {paths[name]} ({result['bench_wall_s']:.0f} s)")
        written[name] = str(paths[name])
    return {"written": written}
