"""The writer process of test_store.py's race: a module that imports only torch and the cache, so that each fresh
interpreter the race spawns starts in seconds (importing test_store.py itself loads TransformerLens)."""

from __future__ import annotations

import os

import torch

from core.store import load_entry, save_entry


def example_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3, 4, generator=gen), "b": torch.arange(5), "c": torch.rand(2, generator=gen).half()}


def race(home: str, keys: list[str], seed: int, barrier, results) -> None:
    """One process: for each key, save its own tensors at the same moment as the other process."""
    os.environ["HEADLAB_HOME"] = home  # read when the cache folder is first asked for, not at import
    for key in keys:
        tensors = example_tensors(seed)
        barrier.wait()
        save_entry(key, tensors, {"writer": seed})
        loaded = load_entry(key)
        results.put((key, None if loaded is None else loaded[1]["writer"]))
