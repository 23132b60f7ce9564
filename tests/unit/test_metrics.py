"""The one metric definition (core/ablation/spec.py `query_metrics`) on hand-made logits, ties included.

The instrumented pass (core/probe.py) and the ablation engine both score the query position with
it; before, the probe broke ties by index (argmax / topk) and the engine counted them as hits, so
logits [1, 1, 0] with target 1 scored top-1 = 0 in one and 1 in the other.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import core.ablation.engine
import core.probe
from core.ablation.spec import Ablation, ConditionMetrics
from core.stats.metrics import query_metrics
from core.heads import HeadSet


def test_clean_metrics_on_hand_made_logits():
    logits = torch.tensor([[0.0, math.log(3.0), 0.0, -1e9, -1e9, -1e9],  # p(target=1) = 3/5
                           [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])  # target 5 is ranked 6th
    target = torch.tensor([1, 5])
    m = query_metrics(logits, target)
    assert m["loss"].tolist() == pytest.approx([-math.log(0.6), math.log(sum(math.exp(v) for v in range(6)))])
    assert m["top1"].tolist() == [1.0, 0.0]
    assert m["top5"].tolist() == [1.0, 0.0]
    assert m["target_logit"].tolist() == pytest.approx([math.log(3.0), 0.0])


def test_tied_logits_score_the_expected_hit_under_random_tie_breaking():
    vocab = 8
    logits = torch.tensor([
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # target 1 tied with token 0 for first: top-1 1/2
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # target 0, the same tie read from the other side
        [0.0] * vocab,  # flat (a fully ablated model): chance, k / vocab
        [5.0, 4.0, 3.0, 2.0, 2.0, 2.0, 1.0, 0.0],  # target 4 in a 3-way tie for ranks 4-6: top-5 = 2/3
        [5.0, 4.0, 3.0, 3.0, 2.0, 1.0, 0.0, -1.0],  # target 3 tied for ranks 3-4: inside the top 5
        [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 4.0, 0.0],  # target 6 tied for ranks 6-7: outside the top 5
    ])
    target = torch.tensor([1, 0, 3, 4, 3, 6])
    m = query_metrics(logits, target)
    assert m["top1"].tolist() == pytest.approx([0.5, 0.5, 1 / vocab, 0.0, 0.0, 0.0])
    assert m["top5"].tolist() == pytest.approx([1.0, 1.0, 5 / vocab, 2 / 3, 1.0, 0.0])
    assert m["loss"][2].item() == pytest.approx(math.log(vocab))
    # the score does not depend on the order of the vocabulary
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    inverse = torch.argsort(perm)
    shuffled = query_metrics(logits[:, perm], inverse[target])
    for name in ("top1", "top5", "loss", "target_logit"):
        torch.testing.assert_close(shuffled[name], m[name])


def test_probe_and_engine_use_the_one_definition():
    """collect_head_stats and run_conditions score the clean run with the same function, so they agree on ties."""
    assert core.probe.query_metrics is query_metrics
    assert core.ablation.engine.query_metrics is query_metrics
    assert not hasattr(core.probe, "_clean_metrics")


def test_untied_logits_score_exactly_zero_or_one():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(200, 50, generator=gen)  # continuous: no ties
    target = torch.randint(0, 50, (200,), generator=gen)
    m = query_metrics(logits, target)
    rank = (logits > logits[torch.arange(200), target][:, None]).sum(dim=-1)  # [row], 0 = first
    assert torch.equal(m["top1"], (rank < 1).float())
    assert torch.equal(m["top5"], (rank < 5).float())
    assert set(m["top1"].tolist()) <= {0.0, 1.0}


def test_condition_metrics_and_ablation_json_keys():
    ablation = Ablation(HeadSet(((1, 2), (0, 1))), mlp_layers=(2, 2), mode="mean", label="c")
    data = json.loads(json.dumps(ablation.to_json()))
    assert data == {"heads": [[0, 1], [1, 2]], "mlp_layers": [2], "mode": "mean", "label": "c", "seed": 0}
    assert Ablation.from_json(data) == ablation
    assert Ablation.from_json({"heads": [[0, 0]]}) == Ablation(HeadSet(((0, 0),)))  # older files: defaults
    metrics = ConditionMetrics("c", ablation, [1.0, 2.0], [1.0, 0.5], [1.0, 1.0], [0.1, 0.2])
    data = json.loads(json.dumps(metrics.to_json()))
    assert list(data) == ["label", "ablation", "loss", "top1", "top5", "target_logit"]
    back = ConditionMetrics.from_json(data)
    assert back.ablation == ablation and back.label == "c"
    np.testing.assert_array_equal(back.top1, [1.0, 0.5])
    assert ConditionMetrics.from_json({**data, "ablation": None}).ablation is None
