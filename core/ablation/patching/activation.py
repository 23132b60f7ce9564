"""Activation patching: one head (or one head at one position, or a group of heads) taken from the other run.

Denoising patches a head's clean hook_z into the corrupted run (is it sufficient to restore the
answer?); noising patches its corrupted z into the clean run (is it necessary?). Each condition
is one forward of the base run per chunk of examples; the score is the mean metric on the
normalized scale (clean 1, corrupted 0). A group is judged against random head sets patched the
same way (core/stats/controls.py) and against every head of its layers (the upper bound).
Each result carries the identity check: the base run patched with its own activations, whose
logits must not move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from core.ablation.patching.runs import (PatchSettings, Progress, check_pair_fits, checked_gap, identity_max_diff,
                                         patch_provenance, patched_run, run_chunks, z_patch_hooks)
from core.heads import HeadSet
from core.model.hooks import model_shape
from core.results import JsonResult
from core.stats.controls import ControlSets, check_selection, any_layer_random_controls, matched_random_controls, upper_bound
from core.stats.patching import against_controls, normalized_score
from core.tasks.counterfactual import PatchPair

Condition = tuple[HeadSet, "int | None"]  # heads patched, at every position (None) or at one


@dataclass(frozen=True, eq=False)
class HeadPatching(JsonResult):
    """Every head patched on its own (and, with per_position, at each position on its own).

    clean_value, corrupted_value: the runs' mean metric; scores: [layer, head] and position_scores:
    [layer, head, pos] on the normalized scale (clean 1, corrupted 0); identity_max_diff: the
    largest logit change when the base run is patched with itself (0 when the hooks are sound);
    exact: [layer, head] bool, the heads activation-patched (None: every head); the others' scores are
    attribution patching's estimates where a pipeline filled them in (with_estimates), NaN before.
    """

    direction: str
    metric: str
    clean_value: float
    corrupted_value: float
    scores: np.ndarray
    position_scores: np.ndarray | None
    identity_max_diff: float
    notes: tuple[str, ...]
    provenance: dict
    gap: dict = field(default_factory=dict)  # the per-example clean-corrupted gap (core.stats.patching.gap_stats)
    exact: np.ndarray | None = field(default=None, metadata={"dtype": "bool"})

    def exact_heads(self) -> list[tuple[int, int]]:
        """(layer, head) of every head activation-patched exactly."""
        if self.exact is None:
            return [(l, h) for l in range(self.scores.shape[0]) for h in range(self.scores.shape[1])]
        return [(int(l), int(h)) for l, h in zip(*np.nonzero(np.asarray(self.exact)))]


@dataclass(frozen=True, eq=False)
class GroupPatching(JsonResult):
    """A group of heads patched together, its random control groups, and every head of its layers.

    score, control_scores, upper_bound_score: normalized (clean 1, corrupted 0); stats: z, rank, p,
    control mean and std in the direction's sense (core.stats.patching.against_controls).
    """

    direction: str
    metric: str
    clean_value: float
    corrupted_value: float
    selection: HeadSet
    score: float
    control_sets: ControlSets
    control_scores: tuple[float, ...]
    upper_bound_score: float
    stats: dict
    identity_max_diff: float
    provenance: dict
    gap: dict = field(default_factory=dict)  # the per-example clean-corrupted gap (core.stats.patching.gap_stats)


@dataclass(frozen=True)
class _Measured:
    """Mean metrics of the clean and corrupted runs and of each condition, and the identity check."""

    clean: float
    corrupted: float
    conditions: np.ndarray  # [condition]
    identity_max_diff: float
    gap: dict

    def scores(self, values: np.ndarray | float) -> np.ndarray | float:
        return normalized_score(values, self.clean, self.corrupted)


def measure_conditions(model: Any, pair: PatchPair, settings: PatchSettings, conditions: Sequence[Condition],
                       progress: Progress | None = None, replay: bool = True) -> _Measured:
    """Run every condition on every chunk of pairs: the mean metric of each, and of the clean and corrupted runs.

    The clean-corrupted gap is checked first on its per-example spread (HeadLabError when reversed or
    under 2 standard errors, unless settings.allow_small_gap).

    A condition at one position that cannot reach any query is not run, it scores as the base run:
    a position after every query (attention is causal), or the last layer at a position no example
    queries (that layer's output at a position reaches only that position's logits). replay: False runs
    every condition as a full forward (run_chunks), the baseline of `bench patch`.
    """
    check_pair_fits(model, pair)
    n_layers = model_shape(model)[0]
    sums = np.zeros(len(conditions))
    clean_values, corrupted_values = [], []
    identity = 0.0
    total, done = len(conditions) * pair.n_examples, 0
    for runs in run_chunks(model, pair, settings, replay):
        clean_values.append(runs.clean_values)
        corrupted_values.append(runs.corrupted_values)
        identity = max(identity, identity_max_diff(model, runs))
        queried = set(runs.query.tolist())
        for i, (heads, position) in enumerate(conditions):
            unread = position is not None and (position > max(queried) or (
                heads.layers == (n_layers - 1,) and position not in queried))
            if unread:
                sums[i] += float(runs.base_values.double().sum())
            else:
                values, _ = patched_run(model, runs, z_patch_hooks(runs.source_z, heads, position), settings.metric,
                                        start=min(heads.layers))
                sums[i] += float(values.double().sum())
            done += runs.rows
            if progress is not None:
                progress(done, total)
    n = pair.n_examples
    gap = checked_gap(clean_values, corrupted_values, settings)
    clean = float(sum(float(v.double().sum()) for v in clean_values)) / n
    corrupted = float(sum(float(v.double().sum()) for v in corrupted_values)) / n
    return _Measured(clean, corrupted, sums / n, identity, gap)


def activation_patching(model: Any, pair: PatchPair, settings: PatchSettings = PatchSettings(),
                        progress: Progress | None = None, heads: Sequence[tuple[int, int]] | None = None,
                        replay: bool = True) -> HeadPatching:
    """Patch every head alone (per_position: also every head at every position alone); one score each.

    heads: only these (layer, head) (patch --top-k: the heads attribution ranks first); the others
    score NaN and `exact` marks which were run. progress(done, total) counts example-conditions. replay: see
    measure_conditions.
    """
    n_layers, n_heads, _ = model_shape(model)
    every = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    patched = every if heads is None else sorted({(int(l), int(h)) for l, h in heads})
    check_selection(HeadSet(tuple(patched)), n_layers, n_heads)
    conditions: list[Condition] = [(HeadSet((head,)), None) for head in patched]
    if settings.per_position:
        conditions += [(HeadSet((head,)), t) for head in patched for t in range(pair.seq_len)]
    measured = measure_conditions(model, pair, settings, conditions, progress, replay)
    scores = np.asarray(measured.scores(measured.conditions))
    index = tuple(np.array(patched).T)  # ([layer...], [head...])
    per_head = np.full((n_layers, n_heads), np.nan)
    per_head[index] = scores[: len(patched)]
    per_position = None
    if settings.per_position:
        per_position = np.full((n_layers, n_heads, pair.seq_len), np.nan)
        per_position[index] = scores[len(patched):].reshape(len(patched), pair.seq_len)
    exact = None
    if heads is not None:
        exact = np.zeros((n_layers, n_heads), dtype=bool)
        exact[index] = True
    notes = ("positions after every query, and the last layer at positions no example queries, were not run: "
             "they cannot reach a query, so they score as the base run.",) if settings.per_position else ()
    return HeadPatching(settings.direction, settings.metric, measured.clean, measured.corrupted, per_head, per_position,
                        measured.identity_max_diff, notes, patch_provenance(model, pair, settings, "activation patching"),
                        measured.gap, exact)


def control_sets(selection: HeadSet, n_layers: int, n_heads: int, settings: PatchSettings) -> ControlSets:
    """The random head sets a group is compared with (settings.controls: matched or any-layer)."""
    if settings.controls == "matched":
        return matched_random_controls(selection, n_layers, n_heads, settings.n_controls, settings.control_seed)
    return any_layer_random_controls(selection, n_layers, n_heads, settings.n_controls, settings.control_seed)


def group_patching(model: Any, pair: PatchPair, selection: HeadSet, settings: PatchSettings = PatchSettings(),
                   progress: Progress | None = None) -> GroupPatching:
    """Patch `selection` together, each of its random control groups, and every head of its layers."""
    n_layers, n_heads, _ = model_shape(model)
    selection = check_selection(selection, n_layers, n_heads)
    sets = control_sets(selection, n_layers, n_heads, settings)
    conditions = [(selection, None)] + [(s, None) for s in sets] + [(upper_bound(selection, n_heads), None)]
    measured = measure_conditions(model, pair, settings, conditions, progress)
    scores = np.asarray(measured.scores(measured.conditions))
    score, control_scores = float(scores[0]), tuple(float(s) for s in scores[1:-1])
    return GroupPatching(settings.direction, settings.metric, measured.clean, measured.corrupted, selection, score,
                         sets, control_scores, float(scores[-1]), against_controls(score, control_scores, settings.direction),
                         measured.identity_max_diff, patch_provenance(model, pair, settings, "group activation patching"),
                         measured.gap)
