"""Zoo training on an executor: Ray gives the serial executor's weights bit for bit at the same
thread count, a model continued from another one waits for it, and a finished zoo dispatches nothing."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import core.zoo.presets as presets
from core.cli.zoo import add_zoo_arguments, cli_zoo
from core.errors import HeadLabError
from core.executor import RayExecutor, SerialExecutor, SweepFailed
from core.model.refs import read_manifest
from core.zoo.config import ModelConfig, TrainConfig
from core.zoo.presets import ZOO_PRESETS, train_zoo

pytestmark = pytest.mark.ray  # starts Ray: one such module at a time under xdist (tests/conftest.py)

PRESET = "tiny-executor"
TINY = ModelConfig(family="gpt_neox", n_layers=2, n_heads=4, d_model=32, d_ff=64, max_seq_len=32)
TINY_TRAIN = TrainConfig(task="induction", steps=20, batch_size=4, seq_len=32, repeat_warmup_steps=8, eval_every=10,
                         eval_examples=8, final_examples=8, state_every=10, n_log_checkpoints=4)
# Two independent seeds, and a third model continued from the first (it must wait for it).
ENTRIES = [
    ("tiny-a", TINY, TINY_TRAIN),
    ("tiny-b", TINY, replace(TINY_TRAIN, seed=1)),
    ("tiny-c", TINY, replace(TINY_TRAIN, task="shifted", repeat_warmup_steps=0, init_from="tiny-a")),
]


class RecordingExecutor(SerialExecutor):
    """The serial executor, keeping every task it was handed."""

    def __init__(self):
        self.seen = []

    def results(self, tasks, progress=None):
        self.seen += list(tasks)
        return super().results(tasks, progress)


@pytest.fixture(scope="module")
def serial_home(tmp_path_factory) -> Path:
    """The tiny preset trained with the serial executor at 1 thread per model: its HEADLAB_HOME."""
    home = tmp_path_factory.mktemp("serial-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ZOO_PRESETS, PRESET, ENTRIES)
        patch.setenv("HEADLAB_HOME", str(home))
        train_zoo(PRESET, progress=False, executor=SerialExecutor(), threads_per_model=1)
    return home


def _checkpoints(home: Path, name: str) -> list[tuple[str, float | None]]:
    manifest = read_manifest(home / "zoo" / name)
    assert manifest["complete"] and manifest["threads"] == 1
    return [(c["revision"], c["loss"]) for c in manifest["checkpoints"]]


def test_ray_trains_the_serial_executors_weights_bit_for_bit(serial_home, ray_local, tmp_path, monkeypatch):
    monkeypatch.setitem(ZOO_PRESETS, PRESET, ENTRIES)
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))  # travels to the Ray workers with every task
    records = train_zoo(PRESET, progress=False, executor=RayExecutor(), threads_per_model=1)
    assert [r["name"] for r in records] == ["tiny-a", "tiny-b", "tiny-c"] and all(r["complete"] for r in records)
    compared = 0
    for name, _, _ in ENTRIES:
        revisions = _checkpoints(serial_home, name)
        assert _checkpoints(tmp_path, name) == revisions and len(revisions) >= 3
        for revision, _ in revisions:
            serial = load_file(str(serial_home / "zoo" / name / "checkpoints" / revision / "model.safetensors"))
            ray = load_file(str(tmp_path / "zoo" / name / "checkpoints" / revision / "model.safetensors"))
            assert serial.keys() == ray.keys()
            assert all(torch.equal(serial[key], ray[key]) for key in serial), (name, revision)
            compared += 1
    seeds = [load_file(str(tmp_path / "zoo" / n / "checkpoints" / "step0000020" / "model.safetensors")) for n in ("tiny-a", "tiny-b")]
    assert not all(torch.equal(seeds[0][key], seeds[1][key]) for key in seeds[0])  # the comparison can tell models apart
    assert compared >= 9


def test_a_finished_zoo_dispatches_nothing(serial_home, monkeypatch):
    monkeypatch.setitem(ZOO_PRESETS, PRESET, ENTRIES)
    monkeypatch.setenv("HEADLAB_HOME", str(serial_home))

    def no_training(*args, **kwargs):
        raise AssertionError("a finished model was trained again")

    monkeypatch.setattr(presets, "train_model", no_training)
    executor = RecordingExecutor()
    records = train_zoo(PRESET, progress=False, executor=executor, threads_per_model=1)
    assert executor.seen == []
    assert [r["name"] for r in records] == ["tiny-a", "tiny-b", "tiny-c"] and all(r["complete"] for r in records)
    assert records == train_zoo(PRESET, progress=False)  # the serial loop without an executor agrees


def test_a_failed_parent_stops_its_continuation_and_both_are_reported(tmp_path, monkeypatch):
    monkeypatch.setitem(ZOO_PRESETS, PRESET, ENTRIES)
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path))
    started = []

    def fake_entry(name, model_cfg, train_cfg):
        started.append(name)
        if name == "tiny-a":
            raise RuntimeError("out of memory")
        return {"name": name}

    monkeypatch.setattr(presets, "train_entry", fake_entry)
    with pytest.raises(SweepFailed) as failed:
        train_zoo(PRESET, progress=False, executor=SerialExecutor())
    assert set(failed.value.failures) == {"tiny-a", "tiny-c"} and "tiny-a" in failed.value.failures["tiny-c"]
    assert started == ["tiny-a", "tiny-a", "tiny-b"]  # tried twice; tiny-c never started


def test_continued_models_train_in_a_later_wave_than_their_parent():
    waves = presets._waves(ZOO_PRESETS["paper"])
    wave_of = {name: i for i, wave in enumerate(waves) for name, _, _ in wave}
    assert len(waves) == 2 and [name for name, _, _ in waves[1]] == ["induction-neox-shifted"]
    assert wave_of["induction-neox-s0"] == 0
    with pytest.raises(HeadLabError, match="circle"):
        presets._waves([("x", TINY, replace(TINY_TRAIN, init_from="y")), ("y", TINY, replace(TINY_TRAIN, init_from="x"))])


def test_cli_refuses_fewer_than_one_thread_per_model():
    parser = argparse.ArgumentParser()
    add_zoo_arguments(parser)
    with pytest.raises(HeadLabError, match="--threads-per-model 1 or more"):
        cli_zoo(parser.parse_args(["--preset", "quick", "--backend", "ray", "--threads-per-model", "0"]))
