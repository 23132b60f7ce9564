"""What to ablate and what was measured: `Ablation` and `ConditionMetrics`.

The metrics themselves are computed by `core.stats.metrics.query_metrics`, the one definition that
the instrumented pass (core/probe.py) and the ablation engine both call, so a clean run scores the
same in either. Metric names and their direction of damage are in core/stats/inference.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.choices import MODE_HELP, MODES, NOT_A_HEAD_ABLATION, PROBE_MODES, SEQUENCE_MODES, mode_help
from core.errors import HeadLabError
from core.heads import HeadSet
from core.results import JsonResult
from core.stats.inference import METRICS, canonical_metric

def mode_label(mode: str) -> str:
    """How results name an ablation mode: reference-slice always carries its warning."""
    return f"{mode} ({NOT_A_HEAD_ABLATION})" if mode == "reference-slice" else mode


@dataclass(frozen=True)
class Ablation(JsonResult):
    """Heads (replaced at hook_z, before W_O, at every position) and MLP outputs (the MLP output hook).

    mode: one of MODES (MODE_HELP says what each writes; the values come from the clean run of the
    probe examples, core/ablation/replacements.py). The same rule holds for MLP outputs, except
    "reference-slice", whose MLPs get the all-position mean as in the reference code. seed: the
    derangement of "resample" (ignored by the other modes).
    """

    heads: HeadSet = field(default_factory=HeadSet)
    mlp_layers: tuple[int, ...] = ()
    mode: str = "zero"
    label: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        heads = self.heads if isinstance(self.heads, HeadSet) else HeadSet(tuple(self.heads))
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "mlp_layers", tuple(sorted({int(layer) for layer in self.mlp_layers})))
        object.__setattr__(self, "seed", int(self.seed))
        if self.mode not in MODES:
            raise HeadLabError(f"ablation mode {self.mode!r} is unknown; use one of {', '.join(MODES)}.")

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
        return (",".join(parts) or "nothing") + f" ({mode_label(self.mode)})"


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
