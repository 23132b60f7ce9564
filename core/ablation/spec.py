"""What to ablate and what is measured: `Ablation`, `ConditionMetrics` and `query_metrics`.

`query_metrics` is the one definition of the clean and ablated metrics at the query position; the
instrumented pass (core/probe.py) and the ablation engine both call it, so a clean run scores the
same in either. Metric names and their direction of damage are in core/stats/inference.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from core.errors import HeadLabError
from core.heads import HeadSet
from core.results import JsonResult
from core.stats.inference import METRICS, canonical_metric

MODES = ("zero", "mean")


@dataclass(frozen=True)
class Ablation(JsonResult):
    """Heads (zeroed or mean-replaced at hook_z, before W_O, at every position) and MLP outputs.

    mode "zero": replace by 0; "mean": replace by its per-position mean over the probe examples
    (computed once from the clean run).
    """

    heads: HeadSet = field(default_factory=HeadSet)
    mlp_layers: tuple[int, ...] = ()
    mode: str = "zero"
    label: str = ""

    def __post_init__(self) -> None:
        heads = self.heads if isinstance(self.heads, HeadSet) else HeadSet(tuple(self.heads))
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "mlp_layers", tuple(sorted({int(layer) for layer in self.mlp_layers})))
        if self.mode not in MODES:
            raise HeadLabError(f"ablation mode {self.mode!r} is unknown; use 'zero' or 'mean'.")

    @property
    def is_empty(self) -> bool:
        return len(self.heads) == 0 and len(self.mlp_layers) == 0

    @property
    def layers(self) -> tuple[int, ...]:
        """Every layer this ablation touches (heads or MLP)."""
        return tuple(sorted(set(self.heads.layers) | set(self.mlp_layers)))

    def start_layer(self, n_layers: int) -> int:
        """The first block whose computation changes; n_layers when nothing is ablated."""
        return self.layers[0] if self.layers else n_layers

    def validate(self, n_layers: int, n_heads: int) -> "Ablation":
        self.heads.validate(n_layers, n_heads)
        for layer in self.mlp_layers:
            if not 0 <= layer < n_layers:
                raise HeadLabError(
                    f"MLP layer {layer} is outside this model (layers 0 .. {n_layers - 1}); pick an existing layer."
                )
        return self

    def describe(self) -> str:
        parts = [str(self.heads)] if len(self.heads) else []
        parts += [f"MLP{layer}" for layer in self.mlp_layers]
        return (",".join(parts) or "nothing") + f" ({self.mode})"


def _array(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class ConditionMetrics(JsonResult):
    """Per-example metrics at the query position for one condition (clean or ablated).

    loss, top1, top5, target_logit: [example] float64 (top1/top5 in [0, 1]: 0/1 unless logits tie).
    """

    label: str
    ablation: Ablation | None
    loss: np.ndarray
    top1: np.ndarray
    top5: np.ndarray
    target_logit: np.ndarray

    def __post_init__(self) -> None:
        for name in METRICS:
            object.__setattr__(self, name, _array(getattr(self, name)))
        if len({getattr(self, name).shape for name in METRICS}) != 1:
            raise HeadLabError("ConditionMetrics arrays must all have one value per example.")

    @property
    def n_examples(self) -> int:
        return int(self.loss.shape[0])

    def values(self, metric: str) -> np.ndarray:
        return getattr(self, canonical_metric(metric))

    def mean(self, metric: str) -> float:
        return float(self.values(metric).mean())

    def delta(self, clean: "ConditionMetrics", metric: str) -> np.ndarray:
        """Per-example delta from the clean run (paired): [example]."""
        return self.values(metric) - clean.values(metric)

    def summary(self) -> dict[str, float]:
        return {name: self.mean(name) for name in METRICS}


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
