"""Ray instances started by the code under test: the sweep benchmark on tiny models (serial, a local
instance and a simulated two-node ray.cluster_utils.Cluster give the same cache entries, tensor for
tensor). `ablate` on Ray workers is checked on the suite's shared instance (test_ablation_ray.py)."""

from __future__ import annotations

import pytest
import ray

from core.bench.sweep import bench_sweep
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo

pytestmark = pytest.mark.ray  # starts Ray: one such module at a time under xdist (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def no_ray_running(ray_lock):
    """The code under test starts and stops its own instances: stop one a module before left for the next
    (tests/conftest.py's `ray_local` starts it again when asked)."""
    ray.shutdown()


def test_bench_sweep_serial_local_and_two_nodes_agree(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), "tiny-neox", "gpt_neox", steps=(0, 10))
    make_fake_zoo(zoo_dir(), "tiny-llama", "llama", steps=(0, 10))
    result = bench_sweep(["tiny-neox", "tiny-llama"], cpus=1, with_cluster=True)  # 1: one Ray worker less to start
    assert not ray.is_initialized()  # the bench leaves no Ray running
    assert result["checkpoints"] == 4 and result["cluster_nodes"] == 2
    assert result["identical"] is True and result["cluster_identical"] is True
    for field in ("serial_s", "serial_own_threads_s", "ray_s", "cluster_s", "ray_startup_s"):
        assert result[field] > 0
    assert result["speedup_ray_vs_serial"] == result["serial_s"] / result["ray_s"]
    assert list((tmp_path / "home").glob("cache/headstats/*")) == []  # every run used its own cold cache
