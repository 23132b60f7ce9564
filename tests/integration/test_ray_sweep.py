"""Probe sweeps on a real local Ray instance (2 CPUs, started once for this module): the same cache
entries as the serial executor, a killed worker retried, an interrupted sweep resumed without
recomputing what finished."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from core.executor import RayExecutor, SerialExecutor, SweepFailed
from core.model.refs import ModelRef
from core.pipelines import sweep
from core.pipelines.sweep import SweepItem, checkpoint_items, probe_sweep
from core.store import load_entry
from core.tasks.induction import InductionProbeSpec
from core.workspace import zoo_dir
from tests.tiny_models import make_fake_zoo

pytestmark = pytest.mark.ray  # starts Ray: one such module at a time under xdist (tests/conftest.py)

SPEC = InductionProbeSpec(n_examples=6, seq_len=24, token_low=0, token_high=250, seed=3)
MODELS = {"tiny-neox": "gpt_neox", "tiny-llama": "llama"}


@pytest.fixture(scope="module", autouse=True)
def tasks_travel_by_value(ray_local):
    """This module's task functions are not importable by a Ray worker: send them by value."""
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield


def _zoo(home: Path, monkeypatch) -> list[SweepItem]:
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    for name, family in MODELS.items():
        make_fake_zoo(zoo_dir(), name, family, steps=(0, 10))
    return checkpoint_items([ModelRef.parse(name) for name in MODELS])


def _tensors(rows: list[dict]) -> list[dict[str, torch.Tensor]]:
    return [load_entry(row["key"])[0] for row in rows]


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def _dies_once_then_probes(marker: str, *args):
    """A sweep task whose worker process is killed (SIGKILL) the first time it runs."""
    if not os.path.exists(marker):
        Path(marker).write_text("killed once")
        os.kill(os.getpid(), signal.SIGKILL)
    return sweep.probe_checkpoint(*args)


def test_a_killed_worker_is_retried_and_the_sweep_equals_the_serial_one_bit_for_bit(tmp_path, monkeypatch):
    """A worker killed on its first task: the sweep completes, with the serial executor's cache entries (the same
    keys: they carry no path or backend; the same tensors). bench sweep's test compares all four checkpoints
    serial, on a local instance and on two nodes."""
    items = _zoo(tmp_path / "serial", monkeypatch)
    serial = probe_sweep(items[:2], SPEC, SerialExecutor(), threads=1)
    want = _tensors(serial)
    items = _zoo(tmp_path / "ray", monkeypatch)
    marker = str(tmp_path / "killed")
    real = sweep.probe_checkpoint
    monkeypatch.setattr(sweep, "probe_checkpoint", lambda *args: _dies_once_then_probes(marker, *args))
    rows = probe_sweep(items[:2], SPEC, RayExecutor(), threads=1)
    monkeypatch.setattr(sweep, "probe_checkpoint", real)
    assert Path(marker).exists()  # a worker really died
    assert [r["status"] for r in rows] == ["computed", "computed"]
    assert [r["key"] for r in rows] == [r["key"] for r in serial]
    assert _same(_tensors(rows), want)


def _fails_for(revision: str, ref, checkpoint, *args):
    if checkpoint.revision == revision:
        raise RuntimeError(f"checkpoint {revision} unreadable")
    return sweep.probe_checkpoint(ref, checkpoint, *args)


def test_an_interrupted_sweep_resumes_without_recomputing(tmp_path, monkeypatch):
    items = _zoo(tmp_path / "home", monkeypatch)
    real = sweep.probe_checkpoint
    monkeypatch.setattr(sweep, "probe_checkpoint", lambda *args: _fails_for("step000010", *args))
    with pytest.raises(SweepFailed, match=r"2 of 4 tasks failed .*probe tiny-neox@step000010.*checkpoint step000010 unreadable"):
        probe_sweep(items, SPEC, RayExecutor(), threads=1)
    monkeypatch.setattr(sweep, "probe_checkpoint", real)
    rows = probe_sweep(items, SPEC, RayExecutor(), threads=1)
    assert [(r["revision"], r["status"]) for r in rows] == [
        ("step000000", "cached"), ("step000010", "computed"), ("step000000", "cached"), ("step000010", "computed")]


@pytest.mark.parametrize("command", [
    ["coactivation", "tiny-neox", "--no-closure", "--drop-constant"],
    ["proposers", "tiny-neox", "--controls", "2"],
    ["export", "tiny-neox", "--figure", "spectral", "--formats", "png"],
])
def test_the_long_commands_run_their_screen_on_the_ray_backend(tmp_path, monkeypatch, command):
    """coactivation, proposers and export --backend ray: the screen's passes go out as one sweep on Ray
    (the running local instance); the sweep itself is the real one, watched here."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    make_fake_zoo(zoo_dir(), "tiny-neox", "gpt_neox", steps=(10, 100, 1000))  # a trajectory for the PR-integral
    seen = []

    def watched(items, spec, executor=None, **options):
        seen.append(executor.backend)
        return probe_sweep(items, spec, executor, **options)

    monkeypatch.setattr("core.pipelines.recipe.probe_sweep", watched)
    from core.__main__ import main

    out = ["--out", str(tmp_path / "figures")] if command[0] == "export" else []
    assert main(command + out + ["--n", "12", "--seq-len", "24", "--token-high", "250", "--backend", "ray"]) == 0
    assert seen and set(seen) == {"ray"}


def test_the_cross_seed_matrix_fans_out_one_task_per_target(tmp_path, monkeypatch):
    """cross_seed_matrix on Ray (one task per target model: matrix_column) gives the serial matrix cell for
    cell, at one thread each; the stored cells are reused by the next run."""
    from core.heads import HeadSet
    from core.pipelines.dynamics import cross_seed_matrix

    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    for seed, name in enumerate(("tiny-a", "tiny-b")):
        make_fake_zoo(zoo_dir(), name, "gpt_neox", steps=(10, 100), seed=seed)
    refs = [ModelRef.parse("tiny-a"), ModelRef.parse("tiny-b")]
    circuits = {"tiny-a": HeadSet(((1, 0),)), "tiny-b": HeadSet(((0, 1), (1, 2)))}
    torch.set_num_threads(1)  # the Ray tasks run one thread each: the same arithmetic
    serial = cross_seed_matrix(refs, SPEC, circuits, n_controls=3)
    spread = cross_seed_matrix(refs, SPEC, circuits, n_controls=3, executor=RayExecutor(), store_dir=tmp_path / "cells")
    assert spread.to_json() == serial.to_json()
    assert all(cell is not None for row in serial.cells for cell in row)
    again = cross_seed_matrix(refs, SPEC, circuits, n_controls=3, executor=RayExecutor(), store_dir=tmp_path / "cells")
    assert again.to_json() == serial.to_json() and len(list((tmp_path / "cells").glob("*.json"))) == 4
