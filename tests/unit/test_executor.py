"""The serial executor on hand-made tasks: order, threads, retry once, failures reported by name."""

from __future__ import annotations

import io
import os

import pytest
import torch

from core.errors import HeadLabError
from core.executor import SerialExecutor, StageBars, SweepFailed, Task, make_executor, run_task, worker_environment

_ATTEMPTS: dict[str, int] = {}


def _square(x: int) -> int:
    return x * x


def _threads_seen() -> int:
    return torch.get_num_threads()


def _fails_first_time(name: str) -> str:
    _ATTEMPTS[name] = _ATTEMPTS.get(name, 0) + 1
    if _ATTEMPTS[name] == 1:
        raise RuntimeError("transient")
    return name


def _always_fails(name: str) -> str:
    _ATTEMPTS[name] = _ATTEMPTS.get(name, 0) + 1
    raise ValueError(f"{name} is broken")


def test_results_in_task_order_with_progress():
    seen = []
    out = SerialExecutor().run([Task(f"t{i}", _square, (i,)) for i in range(4)],
                               progress=lambda done, total, failed: seen.append((done, total, failed)))
    assert out == [0, 1, 4, 9]
    assert seen == [(1, 4, 0), (2, 4, 0), (3, 4, 0), (4, 4, 0)]


def test_task_threads_set_and_restored():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    assert SerialExecutor().run([Task("t", _threads_seen, threads=target)]) == [target]
    assert torch.get_num_threads() == before


def test_a_failed_task_is_retried_once():
    _ATTEMPTS.clear()
    assert SerialExecutor().run([Task("flaky", _fails_first_time, ("flaky",))]) == ["flaky"]
    assert _ATTEMPTS["flaky"] == 2


def test_a_task_failing_twice_is_reported_by_name_after_the_others():
    _ATTEMPTS.clear()
    got = []
    tasks = [Task("broken one", _always_fails, ("b",)), Task("fine", _square, (3,))]
    with pytest.raises(SweepFailed, match="1 of 2 tasks failed.*broken one: ValueError: b is broken") as caught:
        for index, result in SerialExecutor().results(tasks):
            got.append((index, result))
    assert got == [(1, 9)]  # the other task still ran and yielded its result
    assert _ATTEMPTS["b"] == 2
    assert set(caught.value.failures) == {"broken one"}
    assert isinstance(caught.value, HeadLabError)


def test_task_environment_applied_and_restored(monkeypatch):
    monkeypatch.setenv("HEADLAB_HOME", "/driver/home")
    assert run_task(os.environ.get, ("HEADLAB_HOME",), {}, 1, {"HEADLAB_HOME": "/task/home"}) == "/task/home"
    assert os.environ["HEADLAB_HOME"] == "/driver/home"


def test_worker_environment_forwards_caches_and_this_checkout():
    env = worker_environment({"HEADLAB_HOME": "/h", "HF_HOME": "/hf", "HF_HUB_OFFLINE": "1", "HOME": "/root",
                              "PYTHONPATH": "/extra"})
    assert env["HEADLAB_HOME"] == "/h" and env["HF_HOME"] == "/hf" and env["HF_HUB_OFFLINE"] == "1"
    assert "HOME" not in env
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert os.path.isdir(os.path.join(paths[0], "core")) and paths[1] == "/extra"


def test_bad_backend_and_task_arguments_are_clear_errors():
    with pytest.raises(HeadLabError, match="unknown backend 'dask'; choose one of serial, ray"):
        make_executor("dask")
    with pytest.raises(HeadLabError, match="--address needs --backend ray"):
        make_executor("serial", "auto")
    with pytest.raises(HeadLabError, match="threads must be at least 1"):
        Task("t", _square, (1,), threads=0)


def test_stage_bars_give_each_stage_one_bar_and_close_the_last():
    stream = io.StringIO()
    with StageBars(lambda stage: f"run: {stage}", file=stream) as progress:
        progress("a", 1, 4)
        progress("a", 4, 4)
        first = progress.bar
        progress("b", 1, 2)
        assert first.disable and progress.bar is not first  # a's bar closed when b began
        progress("b", 3, 3)  # a stage that learns its size as it goes
        assert progress.bar.total == 3
    assert progress.bar is None  # leaving the block closed b's bar
    lines = stream.getvalue().split("\n")
    assert any("run: a" in line and "4/4" in line for line in lines)
    assert any("run: b" in line and "3/3" in line for line in lines)
