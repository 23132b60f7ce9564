"""Test-session setup: a temporary HEADLAB_HOME, and the quick zoo trained once per session.

Set HEADLAB_TEST_ZOO to a HEADLAB_HOME that already holds a trained quick zoo to reuse it
(its zoo folder is copied, never written); otherwise the quick zoo is trained (about 5 minutes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "reference"

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="headlab-test-home-"))
os.environ["HEADLAB_HOME"] = str(_SESSION_HOME)


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
