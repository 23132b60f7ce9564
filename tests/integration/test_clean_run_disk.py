"""The ablation lab's clean run kept on disk (core/ablation/clean_run.py): a run written by one keeper
serves a fresh keeper (another session or server process) with the same numbers and no clean forward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from transformer_lens.model_bridge import TransformerBridge

from core.ablation.clean_run import CleanRuns, clean_run_key
from core.ablation.engine import run_conditions
from core.ablation.spec import Ablation
from core.heads import HeadSet
from core.store import entry_path
from tests.tiny_models import save_tiny_model


@dataclass
class StandInBatch:
    tokens: torch.Tensor  # [example, pos]
    query_pos: torch.Tensor  # [example]
    target: torch.Tensor  # [example]
    spec: dict
    attention_mask: torch.Tensor | None = None


def _batch(seed: int, n: int = 6, seq_len: int = 16) -> StandInBatch:
    gen = torch.Generator().manual_seed(seed)
    return StandInBatch(torch.randint(0, 256, (n, seq_len), generator=gen), torch.randint(4, seq_len, (n,), generator=gen),
                        torch.randint(0, 256, (n,), generator=gen), {"task": "stand-in", "seed": seed})


@pytest.mark.parametrize("family", ["llama_gqa", "gpt_neox"])
def test_a_clean_run_on_disk_serves_a_new_keeper(family, tmp_path):
    save_tiny_model(family, tmp_path)
    model = TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    batch, other = _batch(1), _batch(2)
    key = clean_run_key(str(tmp_path), None, {**batch.spec, "family": family})
    assert clean_run_key(str(tmp_path), None, {**other.spec, "family": family}) != key
    conditions = [Ablation(HeadSet(((1, 0), (1, 2)))), Ablation(HeadSet(((1, 1),)))]
    first = CleanRuns(disk_key=key)
    want_clean, want = run_conditions(model, batch, conditions, clean_runs=first)
    assert first.source == "recorded" and entry_path(key).is_dir()

    forwards = []
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        fresh = CleanRuns(disk_key=key)  # another session or process: nothing in memory
        got_clean, got = run_conditions(model, batch, conditions, clean_runs=fresh)
        assert fresh.source == "disk"
        assert not forwards  # no clean forward: block 0 never ran (the conditions replay layer 1 on from the record)
        assert CleanRuns(disk_key=key).find(model, other) is None  # a record of another batch serves nobody
    finally:
        handle.remove()
    for g, w in zip([got_clean, *got], [want_clean, *want]):
        for metric in ("loss", "target_logit", "top1", "top5"):
            np.testing.assert_array_equal(g.values(metric), w.values(metric))
