"""Test-session setup: a temporary HEADLAB_HOME, and the quick zoo trained once per session.

Set HEADLAB_TEST_ZOO to a HEADLAB_HOME that already holds a trained quick zoo to reuse it
(its zoo folder is copied, never written); otherwise the quick zoo is trained (about 8 minutes).

Why the tests that need the zoo run last: the zoo trains meanwhile, in a subprocess at one torch
thread (`python -m core zoo --preset quick --threads-per-model 1`), while the other tests run at one
thread beside it, so the two cores both work. A small model at one thread is barely slowed by a
neighbour; at two threads beside one it is slowed about 3x. With nothing to overlap (only zoo tests
selected) the zoo trains in this process, as before, at the thread policy's count.
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

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="headlab-test-home-"))
os.environ["HEADLAB_HOME"] = str(_SESSION_HOME)
_TRAINING_LOG = _SESSION_HOME / "quick-zoo-training.log"
_trainer: subprocess.Popen | None = None  # the quick zoo's training, while the tests that do not need it run
_threads_before_training = torch.get_num_threads()


def _needs_zoo(item: pytest.Item) -> bool:
    return "quick_zoo" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    """Run the tests that need the quick zoo last, and start training it now if it must be trained and
    other tests can run meanwhile (at one torch thread each side; see the module docstring)."""
    global _trainer
    zoo_tests = [item for item in items if _needs_zoo(item)]
    others = [item for item in items if not _needs_zoo(item)]
    items[:] = others + zoo_tests
    if not zoo_tests or not others or os.environ.get("HEADLAB_TEST_ZOO"):
        return
    environment = {**os.environ, "HEADLAB_HOME": str(_SESSION_HOME), "HEADLAB_THREADS": "1"}
    with open(_TRAINING_LOG, "w") as log:
        _trainer = subprocess.Popen(
            [sys.executable, "-m", "core", "zoo", "--preset", "quick", "--threads-per-model", "1", "--no-progress"],
            cwd=REPO_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
    torch.set_num_threads(1)  # until the zoo is trained (quick_zoo restores the count)


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """Restore torch's thread count after every test. The CLI, the app and the benchmarks apply
    HeadLab's thread policy (core/threads.py), which sets the process-wide count from a load sample
    (1 beside bench load's busy loop); left in place it would slow every later test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def quick_zoo() -> Path:
    """The zoo folder holding the trained quick preset (trained here unless HEADLAB_TEST_ZOO is set)."""
    from core.zoo.presets import train_zoo
    from core.workspace import zoo_dir

    if _trainer is not None:
        if _trainer.wait() != 0:
            pytest.fail(f"training the quick zoo failed (exit {_trainer.returncode}):\n{_TRAINING_LOG.read_text()[-3000:]}")
        torch.set_num_threads(_threads_before_training)
    reuse = os.environ.get("HEADLAB_TEST_ZOO")
    target = zoo_dir()
    if reuse:
        source = Path(reuse) / "zoo"
        for model_dir in source.iterdir():
            if not (target / model_dir.name).exists():
                shutil.copytree(model_dir, target / model_dir.name)
    train_zoo("quick", progress=False)
    return target


def pytest_sessionfinish(session, exitstatus):
    if _trainer is not None and _trainer.poll() is None:  # the session stopped before any zoo test (-x, Ctrl-C)
        _trainer.kill()
        _trainer.wait()
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray instance on 2 CPUs for one test module (no dashboard); shut down after it.

    RayExecutor() (no address) then uses it instead of starting its own."""
    import ray  # only the Ray tests need it

    from core.executor import worker_environment

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": worker_environment()})
    try:
        yield ray
    finally:
        ray.shutdown()
