"""The content-addressed cache: keys, round trips, corruption, races, atomicity; HeadStats through it, and `python -m core probe`."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import warnings

import pytest
import torch

import core.probe
from core import store
from core.cli.probe import add_probe_arguments, cli_probe
from core.errors import HeadLabError
from core.model.refs import ModelRef, list_checkpoints, weights_fingerprint
from core.probe import HEADSTATS_KIND, HEADSTATS_VERSION, HeadStats, head_stats, head_stats_key
from core.store import CorruptCacheEntryWarning, cache_key, canonical_json, entry_path, get_or_compute, load_entry, save_entry
from core.tasks.specs import probe_spec
from core.workspace import zoo_dir
from tests.integration.store_racer import example_tensors, race
from tests.tiny_models import make_fake_zoo, save_tiny_model


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Each test gets its own HEADLAB_HOME, so caches never leak between tests."""
    monkeypatch.setenv("HEADLAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _key(revision="step1", **extra):
    return cache_key("test", "model-a", revision, {"task": "induction", "n": 4}, "v1", extra)


def _leftovers(key):
    """Temporary or trashed folders next to the entry (there should be none)."""
    parent = entry_path(key).parent
    return [p.name for p in parent.iterdir() if p.name.startswith(".")] if parent.exists() else []


# ------------------------------------------------------------------------------ keys


def test_cache_key_is_canonical_and_sensitive():
    a = cache_key("headstats", "m", "r1", {"n": 4, "task": "induction"}, "v1", {"x": 1, "y": [1, 2]})
    b = cache_key("headstats", "m", "r1", {"task": "induction", "n": 4}, "v1", {"y": [1, 2], "x": 1})
    assert a == b  # key order does not matter
    kind, _, digest = a.partition(":")
    assert kind == "headstats" and len(digest) == 64 and int(digest, 16) >= 0
    others = [
        cache_key("headstats", "m2", "r1", {"n": 4, "task": "induction"}, "v1", {"x": 1, "y": [1, 2]}),
        cache_key("headstats", "m", "r2", {"n": 4, "task": "induction"}, "v1", {"x": 1, "y": [1, 2]}),
        cache_key("headstats", "m", "r1", {"n": 5, "task": "induction"}, "v1", {"x": 1, "y": [1, 2]}),
        cache_key("headstats", "m", "r1", {"n": 4, "task": "induction"}, "v2", {"x": 1, "y": [1, 2]}),
        cache_key("headstats", "m", "r1", {"n": 4, "task": "induction"}, "v1", {"x": 2, "y": [1, 2]}),
        cache_key("other", "m", "r1", {"n": 4, "task": "induction"}, "v1", {"x": 1, "y": [1, 2]}),
    ]
    assert len({a, *others}) == 7


def test_entry_layout(home):
    key = _key()
    digest = key.split(":")[1]
    assert entry_path(key) == home / "cache" / "test" / digest[:2] / digest
    with pytest.raises(HeadLabError, match="not a cache key"):
        entry_path("nonsense")
    with pytest.raises(HeadLabError, match="cache kind"):
        cache_key("Bad Kind/..", "m", None, {}, "v1")
    with pytest.raises(HeadLabError, match="code version"):
        cache_key("test", "m", None, {}, "")


# ------------------------------------------------------------------------------ entries


def test_round_trip():
    key = _key()
    assert load_entry(key) is None
    folder = save_entry(key, example_tensors(), {"model": "model-a", "n": [1, 2]})
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "tensors.safetensors"]
    tensors, meta = load_entry(key)
    assert meta == {"model": "model-a", "n": [1, 2]}
    for name, value in example_tensors().items():
        assert tensors[name].dtype == value.dtype and torch.equal(tensors[name], value)
    assert _leftovers(key) == []


def test_existing_entry_is_kept():
    key = _key()
    save_entry(key, example_tensors(0), {"who": "first"})
    save_entry(key, example_tensors(1), {"who": "second"})
    tensors, meta = load_entry(key)
    assert meta["who"] == "first" and torch.equal(tensors["a"], example_tensors(0)["a"])
    assert _leftovers(key) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage-meta", "missing-tensors", "wrong-key"])
def test_corrupt_entry_is_reported_removed_and_recomputed(damage):
    key = _key()
    folder = save_entry(key, example_tensors(), {"ok": True})
    tensors_file, meta_file = folder / "tensors.safetensors", folder / "meta.json"
    if damage == "truncate":
        tensors_file.write_bytes(tensors_file.read_bytes()[:40])
    elif damage == "flip":
        data = bytearray(tensors_file.read_bytes())
        data[-1] ^= 0xFF
        tensors_file.write_bytes(bytes(data))
    elif damage == "garbage-meta":
        meta_file.write_text("{not json")
    elif damage == "missing-tensors":
        tensors_file.unlink()
    else:
        record = json.loads(meta_file.read_text())
        record["key"] = _key("other-revision")
        meta_file.write_text(json.dumps(record))
    with pytest.warns(CorruptCacheEntryWarning, match="corrupt"):
        assert load_entry(key) is None
    assert not folder.exists() and _leftovers(key) == []

    # the next request recomputes and stores a good entry again
    save_entry(key, example_tensors(), {"ok": True})
    calls = []
    tensors_file.write_bytes(b"x")  # corrupt again
    with pytest.warns(CorruptCacheEntryWarning):
        tensors, meta = get_or_compute(key, lambda: (calls.append(1), (example_tensors(), {"ok": "recomputed"}))[1])
    assert calls == [1] and meta == {"ok": "recomputed"} and torch.equal(tensors["a"], example_tensors()["a"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # now clean: no warning
        assert load_entry(key)[1] == {"ok": "recomputed"}


def test_get_or_compute_computes_once():
    key = _key()
    calls = []

    def compute():
        calls.append(1)
        return example_tensors(), {"n": len(calls)}

    first = get_or_compute(key, compute)
    second = get_or_compute(key, compute)
    assert calls == [1] and first[1] == second[1] == {"n": 1}


def test_exception_in_compute_leaves_nothing():
    key = _key()

    def boom():
        raise RuntimeError("compute failed")

    with pytest.raises(RuntimeError, match="compute failed"):
        get_or_compute(key, boom)
    assert not entry_path(key).exists() and _leftovers(key) == []


def test_exception_while_saving_leaves_nothing():
    key = _key()
    with pytest.raises(Exception):
        save_entry(key, {"a": torch.zeros(2), "bad": "not a tensor"}, {})
    assert not entry_path(key).exists() and _leftovers(key) == []
    with pytest.raises(TypeError):
        save_entry(key, {"a": torch.zeros(2)}, {"not json": object()})
    assert not entry_path(key).exists() and _leftovers(key) == []


def test_losing_the_race_keeps_the_winner(monkeypatch):
    """Another process renames its entry into place between our write and our rename: theirs stays."""
    key = _key()
    real_fsync_dir = store._fsync_dir
    state = {"raced": False}

    def fsync_then_competitor_finishes(path):
        real_fsync_dir(path)
        if not state["raced"] and path.name.endswith(".tmp"):
            state["raced"] = True
            save_entry(key, example_tensors(7), {"who": "winner"})  # the competitor completes first

    monkeypatch.setattr(store, "_fsync_dir", fsync_then_competitor_finishes)
    save_entry(key, example_tensors(0), {"who": "loser"})
    assert state["raced"]
    tensors, meta = load_entry(key)
    assert meta == {"who": "winner"} and torch.equal(tensors["a"], example_tensors(7)["a"])
    assert _leftovers(key) == []


def test_concurrent_writers_do_not_corrupt(home):
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no state shared with this one
    keys = [_key(f"race{i}") for i in range(4)]
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=race, args=(str(home), keys, seed, barrier, results)) for seed in (1, 2)]
    for p in procs:
        p.start()
    seen: dict[str, set] = {key: set() for key in keys}
    for _ in range(2 * len(keys)):
        key, writer = results.get(timeout=120)
        seen[key].add(writer)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for key in keys:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a corrupt entry would warn
            tensors, meta = load_entry(key)
        assert seen[key] == {meta["writer"]}  # both processes read the single winner
        assert torch.equal(tensors["a"], example_tensors(meta["writer"])["a"])
        assert _leftovers(key) == []


# ------------------------------------------------------------------------------ HeadStats and the CLI


def _tiny_stats(model_name="tiny", revision="r"):
    n, L, H, d, T = 3, 2, 2, 4, 8
    gen = torch.Generator().manual_seed(0)
    return HeadStats(
        z_query=torch.randn(n, L, H, d, generator=gen), attn_query=torch.rand(n, L, H, T, generator=gen),
        attn_patterns=torch.rand(6, n, L, H, generator=gen), attn_baseline=torch.rand(n, L, H, generator=gen),
        attn_max=torch.rand(n, L, H, generator=gen), router_query=None,
        loss=torch.rand(n, generator=gen), top1=torch.ones(n), top5=torch.ones(n), target_logit=torch.zeros(n),
        query_pos=torch.full((n,), 7), target=torch.arange(n), induction_pos=torch.full((n,), 3),
        duplicate_pos=torch.full((n,), 2), model=model_name, revision=revision, tokens=100, family="gpt_neox",
        probe_spec={"task": "induction"}, code_version=HEADSTATS_VERSION, n_layers=L, n_heads=H, d_head=d,
    )


def test_head_stats_entry_round_trip():
    """A HeadStats through a cache entry (safetensors + meta.json) comes back whole."""
    key = head_stats_key("tiny", "r", {"task": "induction"})
    stats = _tiny_stats()
    save_entry(key, stats.to_tensors(), stats.to_json())
    back = HeadStats.from_tensors(*load_entry(key))
    for name, tensor in stats.to_tensors().items():
        assert torch.equal(back.to_tensors()[name], tensor)
    assert back.attn_query is not None and back.router_query is None
    assert (back.model, back.revision, back.tokens, back.n_heads) == ("tiny", "r", 100, 2)


def test_head_stats_key_keeps_its_digest():
    """The store's keys are stable (the digest store.py made at b043c0d for headstats-1), and a new
    HeadStats version gives new keys, so entries of the old definition are never served."""
    old = cache_key(HEADSTATS_KIND, canonical_json("tiny"), "r", {"task": "induction"}, "headstats-1",
                    {"weights": weights_fingerprint("tiny", "r")})
    assert old == "headstats:d0ca04933445d5a9c706878bd96a647e60d9dbc4f01ab17e42f906c0cf079531"
    assert HEADSTATS_VERSION == "headstats-2"
    assert head_stats_key("tiny", "r", {"task": "induction"}) != old


def test_head_stats_computes_once_then_serves_the_cache(fake_zoo, monkeypatch):
    ref = ModelRef.parse(fake_zoo)
    ckpt = list_checkpoints(ref)[-1]
    spec = probe_spec("induction", 4, 16)
    loads, status = [], []
    real_load = core.probe.load_model

    def counting_load(*args, **kwargs):
        loads.append(args)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(core.probe, "load_model", counting_load)
    first = head_stats(ref, ckpt, spec, on_status=status.append)
    second = head_stats(ref, ckpt, spec.build(), on_status=status.append)  # a spec or its batch: one key
    assert status == ["computed", "cached"] and len(loads) == 1
    for name, tensor in first.to_tensors().items():
        assert torch.equal(second.to_tensors()[name], tensor)
    assert (second.model, second.revision, second.tokens) == (ref.name, ckpt.revision, ckpt.tokens)
    assert second.probe_spec == dict(spec.build().spec) and second.code_version == HEADSTATS_VERSION


def _probe_args(model, **overrides):
    parser = argparse.ArgumentParser()
    add_probe_arguments(parser)
    argv = [str(model), "--n", "6", "--seq-len", "24", "--chunk-size", "4"]
    for flag, value in overrides.items():
        flag = "--" + flag.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return parser.parse_args(argv)


@pytest.fixture
def fake_zoo(home):
    make_fake_zoo(zoo_dir(), "tiny-neox", "gpt_neox", steps=(0, 10))
    return "tiny-neox"


def _cached_entries(home):
    root = home / "cache" / "headstats"
    return sorted(p for p in root.glob("*/*") if not p.name.startswith(".")) if root.exists() else []


def test_cli_probe_fills_then_serves_from_cache(fake_zoo, home, capsys):
    result = cli_probe(_probe_args(fake_zoo, all_checkpoints=True))
    assert [r["status"] for r in result["checkpoints"]] == ["computed", "computed"]
    assert [r["revision"] for r in result["checkpoints"]] == ["step000000", "step000010"]
    assert len(_cached_entries(home)) == 2
    again = cli_probe(_probe_args(fake_zoo, all_checkpoints=True))
    assert [r["status"] for r in again["checkpoints"]] == ["cached", "cached"]
    assert "step000010: cached" in capsys.readouterr().out
    text = cli_probe(_probe_args(fake_zoo, task="text", seq_len=32))  # final checkpoint only
    assert [r["revision"] for r in text["checkpoints"]] == ["step000010"] and len(_cached_entries(home)) == 3
    # the cached stats carry their provenance
    tensors, meta = load_entry(again["checkpoints"][1]["key"])
    stats = HeadStats.from_tensors(tensors, meta)
    assert (stats.revision, stats.tokens, stats.family) == ("step000010", 20480, "gpt_neox")
    assert stats.z_query.shape == (6, 2, 4, 8)


@pytest.mark.parametrize("overrides, message", [
    ({"seq_len": 100}, "longer than the model's context"),
    ({"revision": "step999999"}, "no checkpoint"),
    ({"token_high": 300}, "vocabulary"),
    ({"task": "text", "seq_len": 100}, "longer than the model's context"),
])
def test_cli_probe_bad_input_caches_nothing(fake_zoo, home, overrides, message):
    with pytest.raises(HeadLabError, match=message):
        cli_probe(_probe_args(fake_zoo, **overrides))
    assert _cached_entries(home) == []


def test_cli_probe_empty_checkpoint_list(fake_zoo, home):
    manifest = zoo_dir() / fake_zoo / "manifest.json"
    data = json.loads(manifest.read_text())
    data["checkpoints"] = []
    manifest.write_text(json.dumps(data))
    with pytest.raises(HeadLabError, match="checkpoints"):
        cli_probe(_probe_args(fake_zoo, all_checkpoints=True))
    assert _cached_entries(home) == []


def test_retrained_model_misses_the_cache(fake_zoo, home):
    ref = ModelRef.parse(fake_zoo)
    before = head_stats_key(ref, "step000010", {"task": "induction"})
    save_tiny_model("gpt_neox", zoo_dir() / fake_zoo / "checkpoints" / "step000010", seed=99)
    assert head_stats_key(ref, "step000010", {"task": "induction"}) != before
