"""Zoo training records its torch thread count, and a resume runs at it (same float sums, same weights)."""

from __future__ import annotations

import json

import pytest
import torch

from core.zoo.config import ModelConfig, TrainConfig
from core.zoo.train import train_model

TINY = ModelConfig(family="gpt_neox", n_layers=2, n_heads=4, d_model=32, d_ff=64, max_seq_len=32)
TINY_TRAIN = TrainConfig(task="induction", steps=10, batch_size=4, seq_len=32, repeat_warmup_steps=4, eval_every=10,
                         eval_examples=8, final_examples=8, state_every=5, n_log_checkpoints=3)


class Interrupt(Exception):
    pass


def _crash_at_7(step, total, loss):
    if step == 7:  # the last saved state is step 5
        raise Interrupt


def _interrupt_then_resume(folder, edit_state=None) -> tuple[dict, set[int]]:
    """Train at 1 thread until step 7, then resume with torch set to 2: (manifest, thread counts seen in the resume)."""
    before, seen = torch.get_num_threads(), set()
    try:
        torch.set_num_threads(1)
        with pytest.raises(Interrupt):
            train_model("t", TINY, TINY_TRAIN, folder, progress=_crash_at_7)
        if edit_state is not None:
            path = folder / "state" / "state.json"
            path.write_text(json.dumps(edit_state(json.loads(path.read_text()))))
        torch.set_num_threads(2)
        manifest = train_model("t", TINY, TINY_TRAIN, folder, progress=lambda *_: seen.add(torch.get_num_threads()))
    finally:
        torch.set_num_threads(before)
    return manifest, seen


def test_resume_runs_at_the_recorded_thread_count(tmp_path):
    manifest, seen = _interrupt_then_resume(tmp_path / "t")
    assert manifest["complete"] and manifest["threads"] == 1 and seen == {1}


def test_a_state_from_before_the_record_still_resumes(tmp_path):
    manifest, seen = _interrupt_then_resume(tmp_path / "t", lambda state: {k: v for k, v in state.items() if k != "threads"})
    assert manifest["complete"] and manifest["threads"] is None and seen == {2}
