"""The thread policy (core/threads.py) on hand-made CPU samples: free cores -> torch threads."""

from __future__ import annotations

import time

import pytest
import torch

from core import threads
from core.errors import HeadLabError
from core.threads import (THREADS_ENV, LoadMark, apply_thread_policy, choose_threads, load_between, thread_ceiling,
                          thread_policy)


@pytest.mark.parametrize("busy, expected", [
    ((0.03, 0.05), 2),   # idle: both cores
    ((0.2, 0.05), 2),    # light background work (a browser) still leaves two cores
    ((1.0, 0.02), 1),    # one busy loop on one CPU: one thread
    ((0.5, 0.52), 1),    # the same busy loop moved between CPUs by the scheduler
    ((1.0, 1.0), 1),     # everything taken: never fewer than one
])
def test_two_cpus(busy, expected):
    choice = choose_threads(busy, ceiling=2)
    assert choice.threads == expected and choice.reason == "load"


def test_own_work_is_not_competition():
    # the app training in one session (both cores busy with this process) while another session starts
    assert choose_threads((1.0, 1.0), ceiling=2, own=2.0).threads == 2
    assert choose_threads((1.0, 1.0), ceiling=2, own=1.0).threads == 1  # one core's worth is someone else's


def test_free_cores_are_counted_and_capped():
    sixteen = (1.0,) + (0.0,) * 15
    assert choose_threads(sixteen, ceiling=16).threads == 15
    assert choose_threads(sixteen, ceiling=8).threads == 8
    assert choose_threads((0.0,) * 4, ceiling=1).threads == 1


def test_override_wins_over_the_sample_and_the_ceiling():
    choice = choose_threads((1.0, 1.0), ceiling=2, override="3")
    assert (choice.threads, choice.reason) == (3, "override")
    assert choose_threads((0.0, 0.0), ceiling=2, override=" 1 ").threads == 1
    assert choose_threads((1.0, 0.0), ceiling=2, override="").reason == "load"  # empty: not set


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_bad_override_says_what_to_set(bad):
    with pytest.raises(HeadLabError, match=f"{THREADS_ENV}=.*set {THREADS_ENV} to"):
        choose_threads((0.0, 0.0), ceiling=2, override=bad)


def test_no_sample_and_no_override_is_refused():
    with pytest.raises(HeadLabError, match=THREADS_ENV):
        choose_threads((), ceiling=2)


@pytest.mark.parametrize("cpus, physical, env, expected", [
    (2, 2, {}, 2),
    (16, 8, {}, 8),                              # one thread per physical core
    (4, None, {}, 4),                            # physical count unknown
    (2, 2, {"OMP_NUM_THREADS": "1"}, 1),         # a user-set OMP_NUM_THREADS is a ceiling
    (8, 8, {"OMP_NUM_THREADS": "4,2"}, 4),       # nested levels: the outer one
    (2, 2, {"OMP_NUM_THREADS": "lots"}, 2),      # malformed: ignored, as OpenMP does
])
def test_ceiling(cpus, physical, env, expected):
    assert thread_ceiling(cpus, physical, env) == expected


def test_policy_with_override_takes_no_sample():
    choice = thread_policy(env={THREADS_ENV: "1"})
    assert (choice.threads, choice.busy, choice.reason) == (1, (), "override")


def test_idle_choice_is_the_override_or_the_ceiling_and_takes_no_sample(monkeypatch):
    monkeypatch.setattr(threads, "sample_load", lambda *a, **k: pytest.fail("the idle choice sampled the load"))
    override = threads.idle_thread_choice({THREADS_ENV: "1"})
    assert (override.threads, override.reason) == (1, "override")
    idle = threads.idle_thread_choice({"OMP_NUM_THREADS": "1"})
    assert (idle.threads, idle.ceiling, idle.busy, idle.reason) == (1, 1, (), "idle")
    assert threads.idle_thread_choice({}).threads == threads.thread_ceiling(len(threads._usable_cpus()),
                                                                            threads.psutil.cpu_count(logical=False), {})


def test_apply_sets_torch_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "1")
    try:
        assert apply_thread_policy().threads == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv(THREADS_ENV, "2")
        assert apply_thread_policy().threads == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _train_tiny_zoo(home, monkeypatch, torch_threads: int, env_threads: str) -> dict:
    """Train a tiny preset (one model, 3 steps) into `home` after the CLI's thread policy chose
    `torch_threads` (HEADLAB_THREADS=env_threads); (manifest threads, final weights)."""
    from safetensors.torch import load_file

    from core.model.refs import read_manifest
    from core.zoo import presets
    from core.zoo.config import ModelConfig, TrainConfig

    model = ModelConfig(family="gpt_neox", n_layers=2, n_heads=4, d_model=64, d_ff=256, vocab_size=260,
                        max_seq_len=64, rotary_pct=1.0, use_parallel_residual=True)
    train = TrainConfig(task="duplicate", steps=3, batch_size=16, seq_len=64, repeat_warmup_steps=0,
                        stop_accuracy=None, eval_every=100, eval_examples=4, final_examples=4, n_log_checkpoints=2)
    monkeypatch.setitem(presets.ZOO_PRESETS, "tiny", [("tiny", model, train)])
    monkeypatch.setenv("HEADLAB_HOME", str(home))
    monkeypatch.setenv(THREADS_ENV, env_threads)
    torch.set_num_threads(torch_threads)
    presets.train_zoo("tiny", progress=False)
    folder = home / "zoo" / "tiny"
    last = sorted((folder / "checkpoints").iterdir())[-1]
    return read_manifest(folder)["threads"], load_file(last / "model.safetensors")


def test_zoo_weights_do_not_follow_the_machines_load(tmp_path, monkeypatch):
    """The zoo trains each model at ZOO_THREADS_PER_MODEL threads whatever count the thread policy chose
    for the load (2 free cores, or 1 busy one): the same weights bit for bit, the count in the manifest."""
    from core.zoo.presets import ZOO_THREADS_PER_MODEL

    idle = _train_tiny_zoo(tmp_path / "idle", monkeypatch, torch_threads=2, env_threads="2")
    busy = _train_tiny_zoo(tmp_path / "busy", monkeypatch, torch_threads=1, env_threads="1")
    assert idle[0] == busy[0] == ZOO_THREADS_PER_MODEL
    assert idle[1].keys() == busy[1].keys()
    assert all(torch.equal(idle[1][k], busy[1][k]) for k in idle[1])


def test_the_load_between_two_marks():
    start = LoadMark(at=10.0, busy_seconds=(5.0, 7.0), total_seconds=(20.0, 30.0), own_seconds=1.0)
    end = LoadMark(at=12.0, busy_seconds=(7.0, 7.5), total_seconds=(22.0, 32.0), own_seconds=3.0)
    busy, own = load_between(start, end)
    assert busy == pytest.approx((1.0, 0.25)) and own == pytest.approx(1.0)  # 2 of 2 s busy, 0.5 of 2; 2 CPU-s in 2 s
    first = threads.load_mark()  # this machine's counters: one busy fraction per usable CPU, each within 0..1
    sum(i * i for i in range(200_000))
    busy, own = load_between(first, threads.load_mark())
    assert len(busy) == len(threads._usable_cpus()) and all(0.0 <= b <= 1.0 for b in busy) and own >= 0.0


def test_a_policy_since_a_mark_measures_the_window_not_a_sample(monkeypatch):
    """The lab's click: the load since the page last ran (a competitor on one core) decides, not a sample taken
    after the click; a window shorter than MIN_WINDOW_SECONDS falls back to the sample."""
    now = time.perf_counter()
    monkeypatch.setattr(threads, "load_mark", lambda: LoadMark(now, (4.0, 0.2), (4.0, 4.0), 0.0))
    monkeypatch.setattr(threads, "sample_load", lambda: ((0.0, 0.0), 0.0))
    monkeypatch.setattr(threads, "_usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads.psutil, "cpu_count", lambda logical=True: 2)
    long_ago = LoadMark(now - 4.0, (0.0, 0.0), (0.0, 0.0), 0.0)
    choice = thread_policy(env={}, since=long_ago)
    assert choice.threads == 1 and choice.busy == pytest.approx((1.0, 0.05))
    just_now = LoadMark(now - threads.MIN_WINDOW_SECONDS / 2, (0.0, 0.0), (0.0, 0.0), 0.0)
    assert thread_policy(env={}, since=just_now).threads == 2  # the (idle) sample
    assert thread_policy(env={}).threads == 2
