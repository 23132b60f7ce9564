"""An ablation study over workers that hold the model, on a real local Ray instance (2 CPUs, started once
for this module): the same numbers as the serial study (`ablate --backend ray` too), a killed worker restarted
and its chunk rerun,
a chunk failing twice reported by name; and the streaming order (the candidate first, every condition once)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.ablation.study import AblationSettings, ablation_study, preview_result
from core.ablation.workers import AblationWorker, ablation_study_on, ablation_workers, condition_chunks
from core.executor import RayExecutor, SerialExecutor, SweepFailed, WorkerPool
from core.heads import HeadSet
from core.model.loading import load_model
from core.model.refs import ModelRef
from core.pipelines.recipe import ablate
from core.stats.inference import METRICS
from core.tasks.induction import InductionProbeSpec
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo

pytestmark = pytest.mark.ray  # starts Ray: one such module at a time under xdist (tests/conftest.py)

SPEC = InductionProbeSpec(n_examples=12, seq_len=24, token_low=0, token_high=250, seed=3)
MODEL = "tiny-neox"
REVISION = "step000000"
SELECTION = HeadSet(((1, 2),))
# any-layer controls: some start at layer 0, below the candidate, so the engine's own order would not put it first
SETTINGS = AblationSettings(n_controls=6, controls="any-layer", n_boot=100)


class _Fragile(AblationWorker):
    """An AblationWorker whose process is killed (SIGKILL) when it runs a chunk while the file `armed`
    exists (the first to see it removes it: one kill), and which refuses every `refuse` call."""

    def __init__(self, armed: str, device: str = "cpu"):
        super().__init__(device)
        self.armed = armed

    def run(self, job):
        try:
            os.remove(self.armed)
        except FileNotFoundError:
            return super().run(job)
        os.kill(os.getpid(), signal.SIGKILL)

    def refuse(self, item):
        raise RuntimeError(f"item {item} refused")


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """A fake zoo model with one tiny GPT-NeoX checkpoint, under a HEADLAB_HOME of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADLAB_HOME", str(tmp_path_factory.mktemp("home")))
        make_fake_zoo(zoo_dir(), MODEL, "gpt_neox", steps=(0,))
        yield ModelRef.parse(MODEL)


@pytest.fixture(scope="module")
def armed(tmp_path_factory) -> Path:
    """While this file exists, the next worker to run a chunk is killed (see _Fragile)."""
    return tmp_path_factory.mktemp("kill") / "armed"


@pytest.fixture(scope="module")
def ray_pool(ray_local, ref, armed):
    """Two Ray workers, one thread and one CPU each (the whole instance), kept for the module: starting
    one imports torch and TransformerLens, the slow part here. Test-module classes travel by value."""
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayExecutor().workers(_Fragile, (str(armed),), n=2)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def serial(ref):
    """The serial study at one torch thread (the workers' count): (result, [on_condition indexes])."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seen = []
        result = ablation_study(load_model(ref, REVISION), SPEC.build(), SELECTION, SETTINGS,
                                on_condition=lambda i, metrics, clean: seen.append(i))
    finally:
        torch.set_num_threads(before)
    return result, seen


def _assert_same(got, want) -> None:
    """Every per-example metric, statistic, verdict, note and provenance field equal, bit for bit."""
    pairs = [(got.clean, want.clean), (got.candidate, want.candidate), (got.upper_bound, want.upper_bound),
             *zip(got.controls, want.controls, strict=True)]
    for a, b in pairs:
        assert a.label == b.label and a.ablation == b.ablation
        for metric in METRICS:
            np.testing.assert_array_equal(a.values(metric), b.values(metric))
    assert got.stats == want.stats
    assert {k: v.to_json() for k, v in got.verdicts.items()} == {k: v.to_json() for k, v in want.verdicts.items()}
    assert got.notes == want.notes and got.provenance == want.provenance
    assert got.control_sets == want.control_sets and got.selection == want.selection


def test_ablate_on_ray_workers_equals_ablate_here(ray_local, ref):
    """`ablate --backend ray`: the pipeline starts workers that hold the checkpoint on the running instance and
    fans the conditions out over them; the same numbers as `ablate` in this process, at the workers' one thread.
    First in the module: `ray_pool`'s workers, once made, hold both of the instance's CPUs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = ablate(ref, None, SELECTION, SPEC, SETTINGS)
    finally:
        torch.set_num_threads(before)
    _assert_same(ablate(ref, None, SELECTION, SPEC, SETTINGS, executor=RayExecutor()), here)
    assert here.provenance["revision"] == REVISION


def test_a_study_over_ray_workers_equals_the_serial_study_bit_for_bit(ray_pool, ref, serial):
    want, _ = serial
    seen = []
    got = ablation_study_on(ray_pool, ref, REVISION, SPEC, SELECTION, SETTINGS,
                            on_condition=lambda i, metrics, clean: seen.append((i, metrics.label)))
    _assert_same(got, want)
    n = 2 + len(want.controls)
    assert seen[0] == (0, "candidate") and sorted(i for i, _ in seen) == list(range(n))  # each condition once
    assert len(condition_chunks(n, ray_pool.size)) == 3  # the candidate, then one chunk per worker


def test_a_killed_worker_is_restarted_and_the_study_completes_with_the_same_numbers(ray_pool, ref, serial, armed):
    armed.write_text("kill the next worker that runs a chunk")
    got = ablation_study_on(ray_pool, ref, REVISION, SPEC, SELECTION, SETTINGS)
    assert not armed.exists()  # a worker process really died mid-study
    _assert_same(got, serial[0])


def test_a_call_failing_twice_is_reported_by_name(ray_pool):
    with pytest.raises(SweepFailed, match=r"2 of 2 tasks failed.*refuse #0: .*item a refused.*refuse #1: .*item b"):
        for _ in ray_pool.map("refuse", ["a", "b"]):
            raise AssertionError("no call can succeed")


class _CandidateLast(WorkerPool):
    """The serial pool, but the candidate's chunk comes back last (as when its worker is slow)."""

    size = 2

    def __init__(self):
        self.inner = ablation_workers(SerialExecutor(), threads=1)

    def map(self, method, items, names=None):
        out = list(self.inner.map(method, items, names))
        yield from out[1:] + out[:1] if method == "run" else out


def test_a_pooled_study_hands_out_the_candidate_first_even_when_it_comes_back_last(ref, serial):
    seen = []
    got = ablation_study_on(_CandidateLast(), ref, REVISION, SPEC, SELECTION, SETTINGS,
                            on_condition=lambda i, metrics, clean: seen.append(i))
    _assert_same(got, serial[0])  # the serial pool too: the same numbers as the serial study
    assert seen[0] == 0 and sorted(seen) == list(range(2 + len(got.controls)))


def test_the_serial_study_streams_the_candidate_first_and_every_condition_once(serial):
    result, seen = serial
    assert seen[0] == 0 and sorted(seen) == list(range(2 + len(result.controls)))
    assert seen != sorted(seen)  # after the candidate's group, the engine's order (by start layer), not the index order


def test_a_preview_draws_what_has_arrived_without_z_or_verdicts(serial):
    result, _ = serial
    settings = SETTINGS
    first = preview_result(settings, result.clean, {0: result.candidate})
    assert first.controls == () and first.upper_bound is None and first.verdicts == {}
    for metric in settings.metrics:
        assert first.stats[metric]["candidate_delta"] == result.stats[metric]["candidate_delta"]
        assert first.stats[metric]["candidate_ci"] == result.stats[metric]["candidate_ci"]
        assert first.stats[metric]["z"] is None
    upper_index = 1 + len(result.controls)
    later = preview_result(settings, result.clean, {0: result.candidate, 2: result.controls[1],
                                                    upper_index: result.upper_bound})
    assert later.controls == (result.controls[1],) and later.upper_bound is result.upper_bound
    assert later.stats["loss"]["control_deltas"] == [result.stats["loss"]["control_deltas"][1]]
