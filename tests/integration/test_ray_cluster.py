"""Ray instances started by the code under test: the sweep benchmark on tiny models (serial, a local
instance and a simulated two-node ray.cluster_utils.Cluster give the same cache entries, tensor for
tensor), and `ablate` on Ray workers (the same numbers as the study in this process)."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from core.ablation.study import AblationSettings
from core.bench.sweep import bench_sweep
from core.executor import RayExecutor
from core.heads import HeadSet
from core.model.refs import ModelRef
from core.pipelines.recipe import ablate
from core.tasks.induction import InductionProbeSpec
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
    result = bench_sweep(["tiny-neox", "tiny-llama"], cpus=2, with_cluster=True)
    assert not ray.is_initialized()  # the bench leaves no Ray running
    assert result["checkpoints"] == 4 and result["cluster_nodes"] == 2
    assert result["identical"] is True and result["cluster_identical"] is True
    for field in ("serial_s", "serial_own_threads_s", "ray_s", "cluster_s", "ray_startup_s"):
        assert result[field] > 0
    assert result["speedup_ray_vs_serial"] == result["serial_s"] / result["ray_s"]
    assert list((tmp_path / "home").glob("cache/headstats/*")) == []  # every run used its own cold cache


def _conditions(result):
    return [result.clean, result.candidate, *result.controls, result.upper_bound]


def test_ablate_on_ray_workers_equals_the_study_here(tmp_path, monkeypatch):
    """`ablate --backend ray`: the conditions fan out over workers that hold the checkpoint; same numbers."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), "tiny-neox", "gpt_neox", steps=(0,))
    ref, spec = ModelRef.parse("tiny-neox"), InductionProbeSpec(n_examples=12, seq_len=24, token_low=0, token_high=250, seed=3)
    settings = AblationSettings(n_controls=4, controls="any-layer", n_boot=100)
    torch.set_num_threads(1)  # the workers run one thread each: the same arithmetic
    here = ablate(ref, None, HeadSet(((1, 2),)), spec, settings)
    try:
        spread = ablate(ref, None, HeadSet(((1, 2),)), spec, settings, executor=RayExecutor(num_cpus=2))
    finally:
        ray.shutdown()
    assert [c.label for c in _conditions(spread)] == [c.label for c in _conditions(here)]
    for a, b in zip(_conditions(spread), _conditions(here)):
        assert all(np.array_equal(getattr(a, m), getattr(b, m)) for m in ("loss", "top1", "top5", "target_logit"))
    assert spread.verdicts == here.verdicts
    assert spread.provenance["revision"] == here.provenance["revision"] == "step000000"
