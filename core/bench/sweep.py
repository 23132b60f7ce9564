"""Benchmark: one probe sweep, serial vs Ray on this machine, and on a simulated two-node Ray cluster.

`python -m core bench sweep --json PATH` runs the probe over every checkpoint of two zoo models
(default induction-neox and induction-olmoe, 30 checkpoints each, the app's default probe), each
time with a cold cache (a fresh HEADLAB_HOME that links the zoo):
- serial, one torch thread per task (the same per-task threads as Ray, so results can be compared
  bit for bit), and serial at the process's own thread count (what a user gets without Ray);
- Ray on this machine (one worker per core, one thread each);
- Ray on a simulated two-node cluster (`ray.cluster_utils.Cluster`: two raylets of one CPU each).
Ray's start-up (the instance and its workers importing torch and HeadLab, once per cluster) is
timed apart (`ray_startup_s`): the sweep is timed on started workers, as on a cluster that has
already run a sweep. `speedup_ray_vs_serial` = serial seconds at 1 thread / Ray seconds;
`identical`: every cache entry equal, tensor for tensor, to the serial run's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

import torch

from core.choices import SWEEP_MODELS as DEFAULT_MODELS
from core.executor import Executor, RayExecutor, SerialExecutor, Task, worker_environment
from core.model.refs import ModelRef
from core.pipelines.sweep import checkpoint_items, probe_sweep
from core.store import load_entry
from core.tasks.induction import default_zoo_probe_spec
from core.workspace import zoo_dir



@contextlib.contextmanager
def cold_home(zoo: Path, label: str) -> Iterator[Path]:
    """A fresh HEADLAB_HOME (empty cache) whose zoo is a link to `zoo`; removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix=f"headlab-bench-sweep-{label}-"))
    (home / "zoo").symlink_to(zoo, target_is_directory=True)
    saved = os.environ.get("HEADLAB_HOME")
    os.environ["HEADLAB_HOME"] = str(home)
    try:
        yield home
    finally:
        if saved is None:
            os.environ.pop("HEADLAB_HOME", None)
        else:
            os.environ["HEADLAB_HOME"] = saved
        shutil.rmtree(home, ignore_errors=True)


def _timed_sweep(items, spec, executor: Executor, threads: int | None) -> tuple[float, list[dict[str, torch.Tensor]]]:
    """Seconds for the sweep, and every entry's tensors (read after the clock stops)."""
    start = time.perf_counter()
    rows = probe_sweep(items, spec, executor, threads=threads)
    seconds = time.perf_counter() - start
    return seconds, [load_entry(row["key"])[0] for row in rows]


def _same(a: Sequence[dict[str, torch.Tensor]], b: Sequence[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def warm_worker() -> int:
    """A task that makes a Ray worker import what a probe task needs; returns the worker's pid."""
    import core.pipelines.sweep  # noqa: F401 - the import is the point: torch, transformers, TransformerLens

    time.sleep(0.5)  # long enough that every worker gets one of the warm-up tasks
    return os.getpid()


def _start_ray(ray, executor_cpus: int, address: str | None = None) -> tuple[RayExecutor, float]:
    """Connect (or start a local instance), then warm every worker; seconds for both."""
    start = time.perf_counter()
    options = {"include_dashboard": False, "log_to_driver": False, "runtime_env": {"env_vars": worker_environment()}}
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(num_cpus=executor_cpus, **options)
    executor = RayExecutor()
    executor.run([Task(f"warm {i}", warm_worker) for i in range(2 * executor_cpus)])
    return executor, time.perf_counter() - start


def bench_sweep(models: Sequence[str] = DEFAULT_MODELS, cpus: int = 2, with_cluster: bool = True) -> dict:
    """Serial vs Ray (local, and a simulated two-node cluster) on one cold-cache probe sweep."""
    import ray  # only this bench and the ray backend need Ray
    from ray.cluster_utils import Cluster  # likewise

    if ray.is_initialized():
        ray.shutdown()
    zoo = zoo_dir()
    items = checkpoint_items([ModelRef.parse(name) for name in models])
    spec = default_zoo_probe_spec()
    out: dict = {"models": list(models), "checkpoints": len(items), "probe_spec": spec.to_json(), "cpus": cpus,
                 "process_threads": torch.get_num_threads()}
    with cold_home(zoo, "serial"):
        out["serial_s"], reference = _timed_sweep(items, spec, SerialExecutor(), threads=1)
    with cold_home(zoo, "serial-own-threads"):
        out["serial_own_threads_s"], _ = _timed_sweep(items, spec, SerialExecutor(), threads=None)

    executor, out["ray_startup_s"] = _start_ray(ray, cpus)
    try:
        with cold_home(zoo, "ray"):
            out["ray_s"], tensors = _timed_sweep(items, spec, executor, threads=1)
        out["identical"] = _same(tensors, reference)
    finally:
        ray.shutdown()
    out["speedup_ray_vs_serial"] = out["serial_s"] / out["ray_s"]
    out["speedup_ray_vs_serial_own_threads"] = out["serial_own_threads_s"] / out["ray_s"]

    if with_cluster:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        try:
            executor, out["cluster_startup_s"] = _start_ray(ray, 2, address=cluster.address)
            out["cluster_nodes"] = len([n for n in ray.nodes() if n.get("Alive")])
            with cold_home(zoo, "cluster"):
                out["cluster_s"], tensors = _timed_sweep(items, spec, executor, threads=1)
            out["cluster_identical"] = _same(tensors, reference)
            out["speedup_cluster_vs_serial"] = out["serial_s"] / out["cluster_s"]
        finally:
            ray.shutdown()
            cluster.shutdown()
    return out
