"""The closure test [CVC] of a proposed head set: ablated against random controls of each kind, judged per split.

METHODS.md, "Step 3 and closure". One ablation run per control kind (same-layer "matched" and
"any-layer"), every metric, both closure rules ("paper" and "reference"); with a stratum mask the
same run is also judged on and off the stratum (deltas within the split, as the reference's
route-conditioned closure test computes them). A kind with too few possible control sets, or controls
that do not vary, is "inconclusive" (core.stats.inference.closure_verdict). Used by the co-activation pipeline
and the Co-activation page.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from core.ablation.spec import ConditionMetrics
from core.ablation.study import AblationResult, AblationSettings, ablation_study, condition_stats
from core.choices import CLOSURE_CONTROLS as DEFAULT_N_CONTROLS, CLOSURE_CONTROL_SEED as DEFAULT_CONTROL_SEED
from core.errors import HeadLabError
from core.heads import HeadSet
from core.results import JsonResult
from core.stats.inference import METRICS, Verdict, closure_verdict

CLOSURE_KINDS = ("matched", "any-layer")
SPLITS = ("all", "on", "off")  # all examples; on / off the stratum (route-conditional only)
CLOSURE_ABLATION = AblationSettings(n_controls=DEFAULT_N_CONTROLS, seed=DEFAULT_CONTROL_SEED, include_upper_bound=True)


@dataclass(frozen=True)
class ClosureSplit(JsonResult):
    """One control kind on one set of examples: per-metric statistics and both closure verdicts."""

    kind: str                    # "matched" (same layers) or "any-layer"
    split: str                   # "all", or "on" / "off" the discovery stratum
    n_examples: int
    stats: dict                  # metric -> candidate_delta, control_deltas, control_mean/std, z, rank, p, ...
    verdicts: dict[str, Verdict]  # "paper" / "reference" -> Verdict

    def z(self, metric: str) -> float | None:
        return self.stats[metric].get("z")


def _subset(c: ConditionMetrics, index: np.ndarray) -> ConditionMetrics:
    return ConditionMetrics(c.label, c.ablation, *(c.values(m)[index] for m in METRICS))


def split_closure(result: AblationResult, index: Any = None, split: str = "all", *, headline: str = "logit",
                  z_threshold: float = 1.8, n_boot: int = 2000, boot_seed: int = 0) -> ClosureSplit:
    """Statistics and verdicts of one ablation run restricted to the examples `index` (None: all).

    Deltas are taken within the split (candidate, controls and clean on the same examples), as the
    reference's route-conditioned closure test does.
    """
    n = result.clean.n_examples
    idx = np.arange(n) if index is None else np.asarray(index)
    if idx.dtype == bool:
        idx = np.flatnonzero(idx)
    if idx.size == 0:
        raise HeadLabError(f"the '{split}' split holds no examples; use fewer strata or more examples.")
    clean, cand = _subset(result.clean, idx), _subset(result.candidate, idx)
    controls = [_subset(c, idx) for c in result.controls]
    upper = None if result.upper_bound is None else _subset(result.upper_bound, idx)
    stats = condition_stats(clean, cand, controls, upper, METRICS, n_boot, boot_seed)
    cand_d = {m: stats[m]["candidate_delta"] for m in METRICS}
    ctrl_d = {m: stats[m]["control_deltas"] for m in METRICS}
    verdicts = {rule: closure_verdict(cand_d, ctrl_d, rule, headline, z_threshold) for rule in ("paper", "reference")}
    return ClosureSplit(kind=result.control_sets.kind, split=split, n_examples=int(idx.size), stats=stats,
                        verdicts=verdicts)


@dataclass(frozen=True, eq=False)
class ClosureTest(JsonResult):
    """The candidate against random controls of each kind; one ablation run per kind, split by examples."""

    selection: HeadSet
    n_controls: int
    control_seed: int
    mode: str
    headline: str
    z_threshold: float
    results: dict[str, AblationResult]   # kind -> AblationResult
    splits: tuple[ClosureSplit, ...]
    skipped: dict                        # kind -> why it could not run (e.g. no disjoint matched control exists)

    def split(self, kind: str, split: str = "all") -> ClosureSplit | None:
        return next((s for s in self.splits if s.kind == kind and s.split == split), None)


def closure_test(model: Any, batch: Any, selection: HeadSet, ablation: AblationSettings = CLOSURE_ABLATION, *,
                 kinds: Sequence[str] = CLOSURE_KINDS, headline: str = "logit", on_stratum: Any = None,
                 device: str | None = None, progress: Optional[Callable[[int, int], None]] = None) -> ClosureTest:
    """Ablate `selection` against ablation.n_controls controls of each kind (plus the upper bound) on `batch`.

    ablation: n_controls, seed (of the controls), mode and z_threshold (its `controls` is replaced by
    each of `kinds`). on_stratum: bool [example] marking the discovery stratum; then every kind is
    also reported on and off it. A kind that cannot be drawn (the candidate holds more than half of
    a layer, or of the model) is recorded in `skipped` with the reason; if no kind runs, HeadLabError.
    """
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    results, splits, skipped = {}, [], {}
    mask = None if on_stratum is None else np.asarray(on_stratum, dtype=bool)
    if mask is not None and mask.shape != (batch.tokens.shape[0],):
        raise HeadLabError(f"the stratum mask must mark each of the {batch.tokens.shape[0]} probe examples.")
    parts = [(None, "all")] if mask is None else [(None, "all"), (mask, "on"), (~mask, "off")]
    for kind in kinds:
        try:
            result = ablation_study(model, batch, selection, replace(ablation, controls=kind), device=device,
                                    progress=progress)
        except HeadLabError as exc:
            skipped[kind] = str(exc)
            continue
        results[kind] = result
        for index, split in parts:
            splits.append(split_closure(result, index, split, headline=headline, z_threshold=ablation.z_threshold))
    if not results:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise HeadLabError(f"no control could be drawn for {selection} ({reasons}); pick a smaller community.")
    return ClosureTest(selection=selection, n_controls=ablation.n_controls, control_seed=ablation.seed,
                       mode=ablation.mode, headline=headline, z_threshold=ablation.z_threshold, results=results,
                       splits=tuple(splits), skipped=skipped)
