"""Many independent pieces of work, run one after another here (`serial`) or spread over a Ray cluster (`ray`).

A researcher's sweeps are many independent tasks: every checkpoint of a model, every model of a
zoo, every matched-random ablation draw. Each is a `Task`: a module-level function and small
arguments (keys, specs, names: never a model), its resources, and the torch thread count it runs
with. Both backends run a task the same way (`run_task`: threads set, function called), so the same
tasks give bit-identical results on both. Results that matter go through the content-addressed
cache (core/store.py) inside the task, so an interrupted sweep resumes and a finished one is free.

Some work needs one large object for many small calls: chunks of ablation conditions on a loaded
model. A task would load the model every time; `Executor.workers` starts a `WorkerPool` instead:
n workers, each built once from small arguments (a module-level factory, e.g. a class whose
instance loads the model), and `map` hands the calls to whichever worker is idle, in order.

A task (or a call to a worker) that raises or whose worker dies is retried once; one that fails
twice is reported by name when the others have finished (`SweepFailed`), never dropped. Ray is
imported only by the `ray` backend's constructor users reach through `make_executor`, so the serial
path needs nothing new; the Ray package itself is pinned in requirements.txt.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

import torch
from tqdm import tqdm

from core.choices import BACKENDS
from core.errors import HeadLabError

RETRIES = 1  # a failed task runs once more before it is reported
# Environment a Ray worker needs to see the same caches and zoo as the driver.
_FORWARDED_ENV_PREFIXES = ("HEADLAB_", "HF_", "TRANSFORMERS_")
ProgressFn = Callable[[int, int, int], None]  # (done, total, failed)
Calls = Generator[tuple[int, Any], None, None]  # a worker pool's (item index, result) as each call finishes


@dataclass(frozen=True)
class Task:
    """One independent piece of work: `fn(*args, **kwargs)` with `threads` torch threads.

    fn must be importable by name (module-level) so a Ray worker can run it; args should be small
    (keys, specs): workers load what they need themselves.
    num_cpus / num_gpus: what the task reserves on a Ray cluster (fractions allowed for GPUs).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    threads: int = 1

    def __post_init__(self) -> None:
        if int(self.threads) < 1:
            raise HeadLabError(f"task {self.name!r}: threads must be at least 1, got {self.threads}.")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise HeadLabError(f"task {self.name!r}: num_cpus and num_gpus cannot be negative.")


class SweepFailed(HeadLabError):
    """Some tasks failed twice; `failures` maps task name -> the last error's text. Finished tasks' results stand."""

    def __init__(self, failures: dict[str, str], total: int, advice: str | None = None):
        self.failures = dict(failures)
        lines = "; ".join(f"{name}: {error.strip().splitlines()[-1] if error.strip() else 'failed'}"
                          for name, error in failures.items())
        if total == 1 and advice is None:  # no "others" to speak of
            super().__init__(f"the task failed, and again on its retry ({lines}); fix the cause and run the same "
                             "command again.")
            return
        advice = advice or ("The others finished and their results are cached: fix the cause and run the same "
                            "command again to do only these.")
        super().__init__(f"{len(failures)} of {total} tasks failed after a retry ({lines}). {advice}")


def run_task(fn: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], threads: int,
             env: Mapping[str, str] | None = None) -> Any:
    """Run one task with `threads` torch threads and the driver's HEADLAB_* variables `env` (where its
    caches and zoo are, read when the task was submitted); both are restored afterwards, since a
    worker process (or the serial backend's own process) runs many tasks."""
    before = torch.get_num_threads()
    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    torch.set_num_threads(int(threads))
    try:
        return fn(*args, **dict(kwargs))
    finally:
        torch.set_num_threads(before)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Executor:
    """Runs tasks; `results` yields (task index, result) as each finishes, `run` returns them in order."""

    backend = "base"

    def results(self, tasks: Sequence[Task], progress: ProgressFn | None = None) -> Iterator[tuple[int, Any]]:
        raise NotImplementedError

    def run(self, tasks: Sequence[Task], progress: ProgressFn | None = None) -> list[Any]:
        """Every task's result, in task order; SweepFailed (after all others finished) if any failed twice."""
        out: list[Any] = [None] * len(tasks)
        for index, result in self.results(tasks, progress):
            out[index] = result
        return out

    def describe(self) -> str:
        return self.backend

    def workers(self, factory: Callable[..., Any], args: tuple = (), n: int | None = None, num_cpus: float = 1.0,
                num_gpus: float = 0.0, threads: int = 1) -> "WorkerPool":
        """n workers, each `factory(*args)` built once (factory module-level, args small: keys, not models).

        n: None for one per CPU the backend has (the serial backend always has one, in this process);
        num_cpus / num_gpus: what each worker holds on a Ray cluster while it lives; threads: torch
        threads for building it and for each call.
        """
        raise NotImplementedError


class SerialExecutor(Executor):
    """One task after another in this process: what the app, CI and a laptop use."""

    backend = "serial"

    def results(self, tasks: Sequence[Task], progress: ProgressFn | None = None) -> Iterator[tuple[int, Any]]:
        failures: dict[str, str] = {}
        done = 0
        for index, task in enumerate(tasks):
            for attempt in range(RETRIES + 1):
                try:
                    result = run_task(task.fn, task.args, task.kwargs, task.threads)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except HeadLabError as error:  # a user-fixable error is deterministic: no retry
                    if len(tasks) == 1:
                        raise  # shown as itself, not as "1 of 1 tasks failed"
                    failures[task.name] = str(error)
                    if progress:
                        progress(done, len(tasks), len(failures))
                    break
                except Exception:  # noqa: BLE001 - any failure is retried once, then reported by name
                    if attempt == RETRIES:
                        failures[task.name] = traceback.format_exc()
                    continue
                done += 1
                if progress:
                    progress(done, len(tasks), len(failures))
                yield index, result
                break
            else:
                if progress:
                    progress(done, len(tasks), len(failures))
        if failures:
            raise SweepFailed(failures, len(tasks))

    def workers(self, factory: Callable[..., Any], args: tuple = (), n: int | None = None, num_cpus: float = 1.0,
                num_gpus: float = 0.0, threads: int = 1) -> "WorkerPool":
        return SerialPool(factory, args, threads)


class WorkerPool:
    """Workers that keep what they built between calls; `map` spreads calls over them."""

    size = 0  # how many workers

    def map(self, method: str, items: Sequence[Any], names: Sequence[str] | None = None) -> Calls:
        """(item index, `worker.method(item)`) as each call finishes; the next item goes to the first idle worker.

        A call that fails is retried once, then reported by its name (default "method #index") in
        SweepFailed when the others have finished. close() the generator to stop early: calls already
        running finish on their workers.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Stop the workers (the pool cannot be used afterwards)."""


def _call_names(method: str, items: Sequence[Any], names: Sequence[str] | None) -> list[str]:
    names = [f"{method} #{i}" for i in range(len(items))] if names is None else list(names)
    if len(names) != len(items):
        raise HeadLabError(f"{len(names)} names for {len(items)} items; give one name per item.")
    return names


class SerialPool(WorkerPool):
    """One worker in this process; calls run one after another, in item order."""

    size = 1

    def __init__(self, factory: Callable[..., Any], args: tuple, threads: int = 1):
        self.threads = int(threads)
        self.worker = run_task(factory, tuple(args), {}, self.threads)

    def map(self, method: str, items: Sequence[Any], names: Sequence[str] | None = None) -> Calls:
        call = getattr(self.worker, method)
        tasks = [Task(name, call, (item,), threads=self.threads)
                 for name, item in zip(_call_names(method, items, names), items)]
        return SerialExecutor().results(tasks)


class _RayWorker:
    """A Ray actor's body: the worker, built and called with the driver's thread count and HEADLAB_*
    variables (run_task), so a call gives what the same call gives on the serial pool."""

    def __init__(self, factory: Callable[..., Any], args: tuple, threads: int, env: Mapping[str, str]):
        self.threads, self.env = int(threads), dict(env)
        self.worker = run_task(factory, tuple(args), {}, self.threads, self.env)

    def call(self, method: str, item: Any) -> Any:
        return run_task(getattr(self.worker, method), (item,), {}, self.threads, self.env)


class RayPool(WorkerPool):
    """n Ray actors. An actor that dies is restarted once (its worker built again) and the call it was
    running is retried; a call that raises is retried once on the same actor."""

    def __init__(self, ray: Any, factory: Callable[..., Any], args: tuple, n: int, num_cpus: float = 1.0,
                 num_gpus: float = 0.0, threads: int = 1):
        if int(n) < 1:
            raise HeadLabError(f"a worker pool needs at least one worker, got n={n}.")
        self.ray = ray
        actor = ray.remote(_RayWorker).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=RETRIES,
                                               max_task_retries=RETRIES)
        self.actors = [actor.remote(factory, tuple(args), threads, headlab_environment()) for _ in range(int(n))]
        self.size = len(self.actors)

    def map(self, method: str, items: Sequence[Any], names: Sequence[str] | None = None) -> Calls:
        ray = self.ray
        names = _call_names(method, items, names)
        waiting = list(range(len(items)))  # item indexes not sent yet, in order
        idle = list(self.actors)
        running: dict[Any, tuple[int, Any]] = {}  # object ref -> (item index, actor)
        failures: dict[int, str] = {}  # item index -> the last error's text
        while waiting or running:
            while waiting and idle:
                index, actor = waiting.pop(0), idle.pop(0)
                ref = actor.call.options(retry_exceptions=True).remote(method, items[index])
                running[ref] = (index, actor)
            if not running:  # every actor died twice: nothing left to run the rest
                failures.update({i: "no worker left: every worker died twice" for i in waiting})
                break
            ready, _ = ray.wait(list(running), num_returns=1)
            index, actor = running.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as error:  # its actor died twice: gone for good
                failures[index] = str(error)
                continue
            except ray.exceptions.RayError as error:  # the call raised twice; its actor lives on
                failures[index] = str(error)
                idle.append(actor)
                continue
            idle.append(actor)
            yield index, result
        if failures:
            raise SweepFailed({names[i]: failures[i] for i in sorted(failures)}, len(items))

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.size = [], 0


def _project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def headlab_environment() -> dict[str, str]:
    """The driver's HEADLAB_* variables now (HEADLAB_HOME: where caches and the zoo live), sent with every Ray task."""
    return {key: value for key, value in os.environ.items() if key.startswith("HEADLAB_")}


def worker_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a Ray worker process starts with: HEADLAB_*, HF_* and TRANSFORMERS_* variables (the Hugging
    Face libraries read theirs once, at import) and this checkout on PYTHONPATH."""
    env = os.environ if env is None else env
    out = {key: value for key, value in env.items() if key.startswith(_FORWARDED_ENV_PREFIXES)}
    paths = [_project_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return out


class RayExecutor(Executor):
    """Tasks spread over a Ray cluster: a local one started here (address None), or an existing one
    (`auto` for the cluster this machine belongs to, or HOST:PORT)."""

    backend = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        try:
            import ray  # only the ray backend needs it (the package is pinned in requirements.txt)
        except ImportError as error:  # pragma: no cover - ray is a pinned dependency
            raise HeadLabError("the ray backend needs Ray: pip install -r requirements.txt.") from error
        self.ray = ray
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                       "runtime_env": {"env_vars": worker_environment()}}
            if address:
                options["address"] = address
            elif num_cpus is not None:
                options["num_cpus"] = int(num_cpus)
            try:
                ray.init(**options)
            except ConnectionError as error:
                raise HeadLabError(f"could not reach a Ray cluster at {address!r}: start one with `ray start --head` "
                                   "or drop --address to run a local one.") from error
        self._remote = ray.remote(run_task)

    def describe(self) -> str:
        cpus = self.ray.cluster_resources().get("CPU", 0)
        nodes = len([n for n in self.ray.nodes() if n.get("Alive")])
        return f"ray ({nodes} node{'s' if nodes != 1 else ''}, {cpus:g} CPUs)"

    def workers(self, factory: Callable[..., Any], args: tuple = (), n: int | None = None, num_cpus: float = 1.0,
                num_gpus: float = 0.0, threads: int = 1) -> WorkerPool:
        if n is None:
            n = max(1, int(self.ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1.0)))
        return RayPool(self.ray, factory, args, n, num_cpus, num_gpus, threads)

    def _submit(self, task: Task):
        return self._remote.options(
            name=task.name, num_cpus=task.num_cpus, num_gpus=task.num_gpus,
            max_retries=RETRIES, retry_exceptions=True,
        ).remote(task.fn, task.args, dict(task.kwargs), task.threads, headlab_environment())

    def results(self, tasks: Sequence[Task], progress: ProgressFn | None = None) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        pending = {self._submit(task): index for index, task in enumerate(tasks)}
        failures: dict[str, str] = {}
        done = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayError as error:  # raised twice (Ray retried once), or its worker died twice
                failures[tasks[index].name] = str(error)
                if progress:
                    progress(done, len(tasks), len(failures))
                continue
            done += 1
            if progress:
                progress(done, len(tasks), len(failures))
            yield index, result
        if failures:
            raise SweepFailed(failures, len(tasks))


def make_executor(backend: str = "serial", address: str | None = None) -> Executor:
    """The executor for --backend / the app's setting; `address` only with ray."""
    if backend not in BACKENDS:
        raise HeadLabError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    if backend == "serial":
        if address:
            raise HeadLabError("--address needs --backend ray (the serial backend runs here).")
        return SerialExecutor()
    return RayExecutor(address)


def tqdm_progress(bar: Any) -> ProgressFn:
    """A progress function drawing the sweep on a tqdm bar: tasks done / total, failures in the postfix."""

    def update(done: int, total: int, failed: int) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix(failed=failed, refresh=False)
        bar.refresh()

    return update


LOG_PARTS = 10  # outside a terminal a bar with a total prints a line per tenth of it (at most 12 lines)
LOG_SECONDS = 60.0  # ... and one without a total a line a minute


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressBar(tqdm):
    """A tqdm bar that stays a bar in a terminal, and in a log file or a pipe prints a few whole lines.

    tqdm outside a terminal writes every update (and every set_postfix) as another '\r'-joined line; a
    zoo training wrote thousands. Here, without a terminal, a line is printed at the start, each time
    another tenth of the total is done (a minute without a total), and at the close: at most 12 per bar.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._log_mode = not _is_terminal(kwargs.get("file") or sys.stderr)
        self._logged_n: float | None = None
        self._logged_t = 0.0
        super().__init__(*args, **kwargs)

    def _due(self) -> bool:
        if self._logged_n is None:
            return True
        if self.total:
            return self.n - self._logged_n >= max(1.0, self.total / LOG_PARTS) or (
                self.n >= self.total and self._logged_n < self.total)
        return time.monotonic() - self._logged_t >= LOG_SECONDS

    def _log_line(self) -> None:
        self._logged_n, self._logged_t = self.n, time.monotonic()
        self.fp.write(self.__str__() + "\n")
        self.fp.flush()

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._log_mode:
            return super().display(msg, pos)
        if msg is None and self._due():
            self._log_line()
        return True

    def close(self) -> None:
        if not self._log_mode or self.disable:
            return super().close()
        if self._logged_n != self.n:
            self._log_line()  # the final count, once
        self.disable = True
        self._decr_instances(self)


class StageBars:
    """`progress(stage, done, total)` for a run made of named stages (patching, edges, a study): one ProgressBar per
    stage, the previous one closed when the next starts. A context manager: leaving it closes the last bar."""

    def __init__(self, describe: Callable[[str], str], **bar_options: Any) -> None:
        self.describe, self.bar_options = describe, bar_options
        self.stage: str | None = None
        self.bar: ProgressBar | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bar is None or self.stage != stage:
            self.close()
            self.stage, self.bar = stage, ProgressBar(total=total, desc=self.describe(stage), **self.bar_options)
        self.bar.total = total  # a stage may learn its size as it goes
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "StageBars":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
