"""Benchmark: HeadLab beside a competing process, with the thread policy and with the old fixed setting.

`python -m core bench load --json PATH` times two workloads, each alone and beside a CPU-bound
process the bench starts and always stops (a pure-Python busy loop: one core's worth of work):
- `--steps` training steps of the quick induction model (the zoo's recipe, a fresh model, no files);
- one probe pass (collect_head_stats) on a random model of the same shape with the app's default
  induction probe (N = 256, T = 64, tokens 0-255).
The thread policy (core/threads.py) is applied right before each measurement, so beside the
competitor it sees the competitor. For comparison, the same cases run again in a child process
with HeadLab's old setting: 2 threads and OpenMP's default wait policy (spin, then sleep; HeadLab
now sets OMP_WAIT_POLICY=PASSIVE, see core/__init__.py). `slowdown_*` = loaded seconds / alone
seconds (medians); the `fixed_threads_*` fields are the old setting's.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import psutil
import torch

from core.bench.ablation import random_bridge
from core.errors import HeadLabError
from core.probe import collect_head_stats
from core.tasks.specs import probe_spec
from core.threads import THREADS_ENV, apply_thread_policy
from core.zoo.presets import task_recipe
from core.zoo.train import batch_at, build_hf_config, build_model, training_loss

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXED_THREADS = 2  # what train_zoo/cli_train set before the thread policy (min(2, torch's default))

# The competitor: says "ready" once it runs, then spins; it also stops by itself if the bench dies.
_BUSY_LOOP = """
import os, sys
parent = int(sys.argv[1])
print("ready", flush=True)
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def competing_process() -> Iterator[subprocess.Popen]:
    """A CPU-bound child process for the duration of the block; stopped on the way out (Ctrl-C included)."""
    proc = subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise HeadLabError("the competing busy-loop process did not start; check that this Python can run subprocesses.")
        time.sleep(0.2)  # let the scheduler see it as a running task before anything samples the load
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def training_seconds(n_steps: int, seed: int = 0) -> float:
    """Wall time of `n_steps` training steps of the quick induction model (fresh, seeded; one untimed warm-up step)."""
    model_cfg, train_cfg = task_recipe("induction")  # the quick zoo's induction-neox recipe
    model = build_model(model_cfg, seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, betas=train_cfg.betas,
                                  eps=train_cfg.adam_eps, weight_decay=train_cfg.weight_decay, foreach=False)

    def step(index: int) -> None:
        tokens, mask = batch_at(train_cfg, index)  # tokens [batch, seq]
        loss = training_loss(model, model_cfg, tokens, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step(0)
    start = time.perf_counter()
    for index in range(1, int(n_steps) + 1):
        step(index)
    return time.perf_counter() - start


def _probe_runner(n_examples: int, seq_len: int) -> Callable[[], float]:
    """A function timing one instrumented probe pass on a random model of the quick induction shape."""
    model = random_bridge(build_hf_config(task_recipe("induction")[0]), seed=0)
    batch = probe_spec("induction", n_examples, seq_len, seed=42).build()  # the app's default probe at N, T
    collect_head_stats(model, batch)  # warm-up

    def run() -> float:
        start = time.perf_counter()
        collect_head_stats(model, batch)
        return time.perf_counter() - start

    return run


def _measure(steps: int, probe: Callable[[], float], threads: int | None) -> dict:
    """Training and probe seconds at `threads` (None: the policy chooses now, and the other work it saw is kept)."""
    others = None
    if threads is None:
        choice = apply_thread_policy()
        threads, others = choice.threads, round(max(0.0, sum(choice.busy) - choice.own), 2)
    else:
        torch.set_num_threads(threads)
    return {"threads": threads, "others": others, "training_s": training_seconds(steps), "probe_s": probe()}


def run_cases(steps: int, repeats: int, n_examples: int, seq_len: int, threads: int | None = None) -> dict:
    """Alone and loaded seconds of both workloads at `threads` (None: the policy), medians over `repeats`."""
    previous = torch.get_num_threads()
    probe = _probe_runner(n_examples, seq_len)
    runs: dict[str, list[dict]] = {"alone": [], "loaded": []}
    try:
        for _ in range(int(repeats)):
            runs["alone"].append(_measure(steps, probe, threads))
            with competing_process():
                runs["loaded"].append(_measure(steps, probe, threads))
    finally:
        torch.set_num_threads(previous)
    out = {f"{work}_{case}_s": statistics.median(r[f"{work}_s"] for r in rs)
           for case, rs in runs.items() for work in ("training", "probe")}
    for case, rs in runs.items():
        out[f"threads_{case}"] = Counter(r["threads"] for r in rs).most_common(1)[0][0]
        out[f"threads_{case}_per_repeat"] = [r["threads"] for r in rs]
        out[f"other_work_cpus_{case}_per_repeat"] = [r["others"] for r in rs]  # what the policy saw (None: fixed)
        out[f"training_{case}_per_repeat_s"] = [r["training_s"] for r in rs]
    return out


# HeadLab before the policy, in a child process: 2 threads and OpenMP's default wait policy (spin,
# then sleep). torch is imported before core, so OpenMP starts before HeadLab's package sets PASSIVE.
_OLD_SETTING = """
import json, sys
import torch
from core.bench.load import FIXED_THREADS, run_cases
print(json.dumps(run_cases(*json.loads(sys.argv[1]), threads=FIXED_THREADS)))
"""


def old_setting_cases(steps: int, repeats: int, n_examples: int, seq_len: int) -> dict:
    """run_cases at FIXED_THREADS with OpenMP's default wait policy, in a child process (it is fixed at torch's import)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _OLD_SETTING, json.dumps([steps, repeats, n_examples, seq_len])],
                          env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-2:])
        raise HeadLabError(f"the old-setting measurement (a child process) failed: {tail}; rerun the bench.")
    return json.loads(lines[-1])


def bench_load(steps: int = 40, repeats: int = 3, n_examples: int = 256, seq_len: int = 64) -> dict:
    """The policy's alone/loaded timings (this process) and the old setting's (a child process)."""
    if steps < 1 or repeats < 1:
        raise HeadLabError("--steps and --repeats must be at least 1.")
    load_before = os.getloadavg()
    new = run_cases(steps, repeats, n_examples, seq_len)
    old = old_setting_cases(steps, repeats, n_examples, seq_len)
    result = {
        "slowdown_training": new["training_loaded_s"] / new["training_alone_s"],
        "slowdown_probe": new["probe_loaded_s"] / new["probe_alone_s"],
        **new,
        "fixed_threads": FIXED_THREADS, "fixed_threads_wait_policy": "OpenMP default",
        "fixed_threads_slowdown_training": old["training_loaded_s"] / old["training_alone_s"],
        "fixed_threads_slowdown_probe": old["probe_loaded_s"] / old["probe_alone_s"],
        **{f"fixed_threads_{k}": v for k, v in old.items() if k.endswith("_s") and not k.startswith("threads")},
        "policy_speedup_loaded_training": old["training_loaded_s"] / new["training_loaded_s"],
        "policy_speedup_loaded_probe": old["probe_loaded_s"] / new["probe_loaded_s"],
        "steps": int(steps), "repeats": int(repeats), "probe_n_examples": int(n_examples), "probe_seq_len": int(seq_len),
        "model": "quick induction shape: GPT-NeoX 3 layers x 12 heads, d_model 96 (training: fresh seeded; probe: random)",
        "cpu_count": psutil.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
        "torch_version": torch.__version__, "load_average_before": [round(x, 2) for x in load_before],
        "env": {k: os.environ.get(k) for k in (THREADS_ENV, "OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
    }
    return result
