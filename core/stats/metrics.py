"""The one definition of the metrics at the query position, from logits: loss, top-1, top-5, target logit.

The instrumented pass (core/probe.py), the ablation engine and patching all score a run with
`query_metrics`, so a clean run scores the same in each. It sits here, below both, because the
probe and the engine are siblings; the metric names and their direction of damage are in
core/stats/inference.py.
"""

from __future__ import annotations

import torch


def _top_k(n_greater: torch.Tensor, n_tied: torch.Tensor, k: int) -> torch.Tensor:
    """Expected top-k hit under uniform random tie-breaking: clip((k - n_greater) / n_tied, 0, 1).

    n_greater, n_tied: [row] counts of logits strictly above / equal to the target's (target included).
    Untied logits give exactly 0 or 1; a flat row over V tokens gives k / V (chance).
    """
    return ((k - n_greater).float() / n_tied.clamp(min=1).float()).clamp(0.0, 1.0)


def query_metrics(logits_q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics from logits at the query position. logits_q: [row, vocab], target: [row] -> each [row] float32.

    loss = logsumexp - target logit; top-k counts ties by expectation, so the score does not depend
    on the order of the vocabulary (a fully ablated model with flat logits scores chance, not 1).
    """
    logits_q = logits_q.float()
    target_logit = logits_q.gather(1, target[:, None]).squeeze(1)  # [row]
    loss = torch.logsumexp(logits_q, dim=-1) - target_logit
    n_greater = (logits_q > target_logit[:, None]).sum(dim=-1)  # [row]
    n_tied = (logits_q == target_logit[:, None]).sum(dim=-1)  # [row], the target itself included
    return {"loss": loss, "top1": _top_k(n_greater, n_tied, 1), "top5": _top_k(n_greater, n_tied, 5),
            "target_logit": target_logit}
