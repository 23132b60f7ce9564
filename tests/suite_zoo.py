"""The quick zoo the test suite trains, and how its training is shared between the suite's processes.

The suite trains the quick preset exactly as `python -m core zoo --preset quick` (what `make app` trains) does:
test_screen_zoo.py checks the README tour's circuits and verdict on its induction-neox, and the "Gradient vs causal"
tests need reverse-hhg's out-of-distribution accuracy, which a shorter run does not reach. Each model is trained
by the first process to take its lock, at the zoo's fixed thread count, into one folder that every test process
copies from.

`python -m tests.suite_zoo FOLDER` trains, one after the other, every model no other process has taken yet: the
two processes tests/conftest.py starts in the background at the session's start run it and share the four
models. `train_shared` also waits for the models others are training (what a test process does before its first
zoo test).
"""

from __future__ import annotations

import sys
from pathlib import Path

from filelock import FileLock, Timeout


def suite_zoo_entries() -> list[tuple]:
    """(name, ModelConfig, TrainConfig) of the quick preset, induction-neox first: the longest run, which every
    zoo test waits for."""
    from core.zoo.presets import preset_entries

    return sorted(preset_entries("quick"), key=lambda entry: entry[0] != "induction-neox")


def _trained(folder: Path, name: str) -> bool:
    """Model `name` is trained to its end in `folder` (its manifest says complete)."""
    from core.model.refs import model_is_complete

    return model_is_complete(folder / name)


def is_complete(folder: Path) -> bool:
    """Every model of the quick zoo is trained in `folder`."""
    return all(_trained(folder, name) for name, _, _ in suite_zoo_entries())


def _train_if_missing(folder: Path, name, model_cfg, train_cfg) -> None:
    """Train one model into folder/name at the zoo's fixed thread count (its weights do not follow the process's
    count), unless it is complete there (resuming one a stopped process left)."""
    from core.executor import run_task
    from core.zoo.presets import ZOO_THREADS_PER_MODEL
    from core.zoo.train import train_model

    if not _trained(folder, name):
        run_task(train_model, (name, model_cfg, train_cfg, folder / name), {"progress": False}, ZOO_THREADS_PER_MODEL)


def train_untaken(folder: Path) -> None:
    """Train each model of the quick zoo that no other process holds the lock of, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in suite_zoo_entries():
        lock = FileLock(folder / f"{entry[0]}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        try:
            _train_if_missing(folder, *entry)
        finally:
            lock.release()


def train_shared(folder: Path) -> None:
    """Train the models nobody has taken, then wait for the others (and resume any that a stopped process left
    unfinished): on return the whole quick zoo is in `folder`."""
    train_untaken(folder)
    for entry in suite_zoo_entries():
        with FileLock(folder / f"{entry[0]}.lock"):
            _train_if_missing(folder, *entry)


if __name__ == "__main__":
    train_untaken(Path(sys.argv[1]))
