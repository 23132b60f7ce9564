"""How many threads torch uses: chosen from how busy the CPUs are right now.

Why: torch's CPU kernels split each operation over OpenMP threads that wait for each other at
the end of it. When another process holds one of the cores, the thread that lands behind it
holds up all the others at every operation: on 2 shared cores, 150 zoo training steps took 19 s
alone and 54 s beside one busy loop at 2 threads, but 29 s and 28 s at 1 thread. So HeadLab
counts the cores that other work leaves free (a short sample of the per-CPU busy fractions)
and runs that many threads. A short sample rather than os.getloadavg(): the load average trails
by a minute, counts HeadLab's own work just done, and reports a competitor started seconds ago
as still absent.

Threads that wait sleep rather than spin (OMP_WAIT_POLICY=PASSIVE, set in core/__init__.py), so
a competitor that arrives after the choice costs far less. The choice is made when heavy work
starts (the CLI, each app session, each zoo model trained, each Run in the ablation lab), not during
it: a count changed in the middle of a training run would change its float sums. The lab measures
the load from its page's last run to the click (`load_mark`), since a sample taken after a click
counts the browser drawing the response as competition.

`HEADLAB_THREADS=N` fixes the count (N >= 1); an `OMP_NUM_THREADS` the user set is a ceiling.
Statistics agree across counts to float rounding; trained weights are bit-identical only at the
same count, so the zoo records the count a model was trained with and a resume reuses it
(core/zoo/train.py).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import psutil

from core.errors import HeadLabError

THREADS_ENV = "HEADLAB_THREADS"
SAMPLE_SECONDS = 0.1  # /proc/stat counts in 1/100 s: 10 ticks per CPU are enough to tell busy from idle
# Other work may use this much of a core before it no longer counts as free: a thread sharing a
# core loses far more at the barriers (3x on training) than one thread fewer costs (1.5x).
TOLERATED_LOAD = 0.3
# A load window (load_mark -> now) shorter than this is not trusted (a click right after the page drew): sample instead.
MIN_WINDOW_SECONDS = 1.0


@dataclass(frozen=True)
class ThreadChoice:
    """What the policy decided and from what: threads, per-CPU busy fractions [cpu], the ceiling, why."""

    threads: int
    busy: tuple[float, ...]
    own: float  # cores' worth of this process's own work during the sample (not competition)
    ceiling: int
    reason: str  # "override" (HEADLAB_THREADS), "load" (the sample), "idle" (idle_thread_choice: no sample)

    def to_json(self) -> dict:
        return {"threads": self.threads, "busy": [round(b, 3) for b in self.busy], "own": round(self.own, 3),
                "ceiling": self.ceiling, "reason": self.reason}


def _positive_int(text: str, name: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise HeadLabError(f"{name}={text!r} is not a whole number >= 1; set {name} to {what}, or unset it.")
    return value


def thread_ceiling(usable_cpus: int, physical_cores: int | None, env: Mapping[str, str]) -> int:
    """The most threads worth running: the CPUs this process may use, at most one per physical core
    (hyper-threads share a core's arithmetic), at most a user-set OMP_NUM_THREADS."""
    ceiling = max(1, int(usable_cpus))
    if physical_cores:
        ceiling = min(ceiling, int(physical_cores))
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # "4,2" sets nested levels: the outer one counts
    if first.isdigit() and int(first) >= 1:  # OpenMP ignores a malformed value, so HeadLab does too
        ceiling = min(ceiling, int(first))
    return ceiling


def choose_threads(busy: Sequence[float], ceiling: int, override: str | None = None, own: float = 0.0) -> ThreadChoice:
    """The thread count for per-CPU busy fractions `busy` [cpu] (each 0..1), `own` of which (in cores)
    was this process's own work (e.g. the app training in another session).

    Free cores = CPUs - (total busy - own) (a competitor the scheduler moves between CPUs shows as
    a fraction on each, so the sum counts it once); a core that others use up to TOLERATED_LOAD
    still counts. `override` (HEADLAB_THREADS) wins over the sample.
    """
    shown = tuple(float(b) for b in busy)
    if override is not None and override.strip():
        return ThreadChoice(_positive_int(override, THREADS_ENV, "the number of torch threads (e.g. 1)"), shown,
                            float(own), int(ceiling), "override")
    if not shown:
        raise HeadLabError("no CPU load sample to choose torch's threads from; set HEADLAB_THREADS to a thread count.")
    others = max(0.0, sum(min(1.0, max(0.0, b)) for b in shown) - float(own))
    free = math.floor(len(shown) - others + TOLERATED_LOAD + 1e-9)
    return ThreadChoice(max(1, min(int(ceiling), free)), shown, float(own), int(ceiling), "load")


def _usable_cpus() -> list[int]:
    """The CPU numbers this process may run on (all of them where affinity is unknown)."""
    try:
        return sorted(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error, OSError):
        return list(range(psutil.cpu_count() or 1))


@dataclass(frozen=True)
class LoadMark:
    """Where a load window starts: when (perf_counter), each usable CPU's busy and total seconds so far [cpu], and
    this process's CPU seconds so far."""

    at: float
    busy_seconds: tuple[float, ...]
    total_seconds: tuple[float, ...]
    own_seconds: float


def load_mark() -> LoadMark:
    """The CPUs' counters now (no waiting): `thread_policy(since=mark)` later measures the load in between."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy, total = [], []
    for i in _usable_cpus():
        if i < len(per_cpu):
            times = per_cpu[i]
            # guest time is counted in user time as well; idle waiting on I/O is idle
            all_seconds = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
            busy.append(all_seconds - times.idle - getattr(times, "iowait", 0.0))
            total.append(all_seconds)
    own = psutil.Process().cpu_times()
    return LoadMark(time.perf_counter(), tuple(busy), tuple(total), own.user + own.system)


def load_between(start: LoadMark, end: LoadMark) -> tuple[tuple[float, ...], float]:
    """Between two marks: each CPU's busy fraction [cpu] (0..1), and this process's own CPU use in cores."""
    busy = tuple(min(1.0, max(0.0, (b1 - b0) / (t1 - t0))) if t1 > t0 else 0.0
                 for b0, b1, t0, t1 in zip(start.busy_seconds, end.busy_seconds, start.total_seconds, end.total_seconds))
    seconds = end.at - start.at
    return busy, (end.own_seconds - start.own_seconds) / seconds if seconds > 0 else 0.0


def sample_load(seconds: float = SAMPLE_SECONDS) -> tuple[tuple[float, ...], float]:
    """Over the next `seconds` (blocks that long): the busy fraction of each CPU this process may use
    [cpu], and this process's own CPU use in cores."""
    start = load_mark()
    time.sleep(seconds)
    return load_between(start, load_mark())


def thread_policy(ceiling: int | None = None, env: Mapping[str, str] | None = None,
                  since: LoadMark | None = None) -> ThreadChoice:
    """Measure the CPUs (unless HEADLAB_THREADS is set) and choose; `ceiling` caps the count further.

    since: measure from that mark to now instead of sampling the next SAMPLE_SECONDS, when the window is at least
    MIN_WINDOW_SECONDS. The app marks each run of the lab and measures from there when Run is pressed: a sample
    taken at the click counted the browser's own reaction to it (most of a core for a quarter second) as
    competition and ran SmolLM2's study at one thread of two, 1.3x slower."""
    env = os.environ if env is None else env
    cap = thread_ceiling(len(_usable_cpus()), psutil.cpu_count(logical=False), env)
    if ceiling is not None:
        cap = min(cap, max(1, int(ceiling)))
    override = env.get(THREADS_ENV)
    if override and override.strip():
        busy, own = (), 0.0
    elif since is not None and time.perf_counter() - since.at >= MIN_WINDOW_SECONDS:
        busy, own = load_between(since, load_mark())
    else:
        busy, own = sample_load()
    return choose_threads(busy, cap, override, own)


def idle_thread_choice(env: Mapping[str, str] | None = None) -> ThreadChoice:
    """The threads a study gets here when nothing else runs: HEADLAB_THREADS if set, else the ceiling. What the lab's
    time estimates are timed at: a sample taken as the page opens counts the browser drawing it as competition."""
    env = os.environ if env is None else env
    cap = thread_ceiling(len(_usable_cpus()), psutil.cpu_count(logical=False), env)
    override = env.get(THREADS_ENV)
    if override and override.strip():
        return choose_threads((), cap, override)
    return ThreadChoice(cap, (), 0.0, cap, "idle")


def apply_thread_policy(ceiling: int | None = None, choice: ThreadChoice | None = None) -> ThreadChoice:
    """Choose torch's intra-op thread count for the CPUs' load right now and set it; or set `choice`, one made a
    moment before (the lab's, when Run was pressed, from the load since its page last ran)."""
    import torch  # heavy (seconds): here, not at the top, so that `python -m core --help` never loads it

    choice = thread_policy(ceiling) if choice is None else choice
    torch.set_num_threads(choice.threads)
    return choice
