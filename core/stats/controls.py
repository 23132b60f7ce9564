"""Control head sets for group ablation: matched-random, any-layer random, and the upper bound.

A causal claim about a head set is only as honest as its controls [SPC, CVC]: the same number of
heads in each of the same layers (matched), or the same size anywhere (any-layer, when the
selection holds more than half of a layer), all disjoint from the selection, distinct and seeded.
Pure index arithmetic over (layer, head) pairs: no model, no torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from core.choices import CONTROL_KINDS
from core.errors import HeadLabError
from core.heads import HeadSet
from core.results import JsonResult
from core.tasks.probe_batch import check_seed



@dataclass(frozen=True)
class ControlSets(JsonResult):
    """Control head sets of one kind, with how they were drawn; iterates like a list of HeadSets."""

    kind: str
    sets: tuple[HeadSet, ...]
    seed: int
    n_requested: int
    n_possible: int
    note: str = ""

    def __iter__(self):
        return iter(self.sets)

    def __len__(self) -> int:
        return len(self.sets)

    def __getitem__(self, index):
        return self.sets[index]


def check_selection(selection: HeadSet, n_layers: int, n_heads: int) -> HeadSet:
    """The selection as a HeadSet, refused when empty or outside an n_layers x n_heads model."""
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    if len(selection) == 0:
        raise HeadLabError("the selection is empty; pick at least one head to ablate.")
    return selection.validate(n_layers, n_heads)


def count_matched_sets(selection: HeadSet, n_heads: int) -> int:
    """How many distinct matched control sets exist: product over layers of C(n_heads - k_l, k_l)."""
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    total = 1
    for _, k in sorted(selection.count_per_layer().items()):
        total *= math.comb(n_heads - k, k)
    return total


def count_any_layer_sets(selection: HeadSet, n_layers: int, n_heads: int) -> int:
    """How many distinct same-size control sets exist anywhere in the model, disjoint from the selection."""
    k = len(selection)
    return math.comb(n_layers * n_heads - k, k)


def _draws_note(kind: str, n_possible: int, n_draws: int) -> str:
    if n_possible == 1:
        return f"only 1 distinct {kind} control set exists for this selection; it is used instead of the {n_draws} requested."
    return (
        f"only {n_possible} distinct {kind} control sets exist for this selection; "
        f"all {n_possible} are used instead of the {n_draws} requested."
    )


def _distinct_draws(draw: Callable[[], tuple], n_draws: int) -> list[tuple]:
    seen: set[tuple] = set()
    out: list[tuple] = []
    while len(out) < n_draws:
        heads = draw()
        key = tuple(sorted(heads))
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def matched_random_controls(selection: HeadSet, n_layers: int, n_heads: int, n_draws: int, seed: int = 123) -> ControlSets:
    """Matched-random controls: the same count in each of the same layers, disjoint, distinct, seeded.

    Each draw takes, layer by layer in order, `RandomState(seed).choice(free heads, k, replace=False)`;
    a repeated set is drawn again. When n_draws >= the number of distinct sets, all are returned.
    """
    selection = check_selection(selection, n_layers, n_heads)
    seed = check_seed(seed, "the control seed")
    counts = selection.count_per_layer()
    for layer, k in sorted(counts.items()):
        if k > n_heads - k:
            raise HeadLabError(
                f"the selection holds {k} of the {n_heads} heads of layer {layer}, more than half, so no disjoint "
                "matched control exists; ask for any-layer controls instead."
            )
    if n_draws < 1:
        raise HeadLabError("ask for at least one control draw.")
    free = {layer: [h for h in range(n_heads) if (layer, h) not in selection] for layer in counts}
    n_possible = count_matched_sets(selection, n_heads)
    if n_draws >= n_possible:
        per_layer = [[tuple((layer, h) for h in combo) for combo in itertools.combinations(free[layer], k)] for layer, k in sorted(counts.items())]
        sets = tuple(HeadSet(tuple(itertools.chain.from_iterable(parts))) for parts in itertools.product(*per_layer))
        note = _draws_note("matched", n_possible, n_draws) if n_draws > n_possible else ""
        return ControlSets("matched", sets, int(seed), int(n_draws), n_possible, note)
    rng = np.random.RandomState(seed)

    def draw() -> tuple:
        heads = []
        for layer, k in sorted(counts.items()):
            heads += [(layer, int(h)) for h in rng.choice(free[layer], size=k, replace=False)]
        return tuple(heads)

    sets = tuple(HeadSet(d) for d in _distinct_draws(draw, n_draws))
    return ControlSets("matched", sets, int(seed), int(n_draws), n_possible)


def any_layer_random_controls(selection: HeadSet, n_layers: int, n_heads: int, n_draws: int, seed: int = 0) -> ControlSets:
    """Same-size random controls from any layer, disjoint from the selection, distinct, seeded.

    Each draw is `RandomState(seed).choice(len(free), k, replace=False)` over the free heads in
    (layer, head) order, as the reference natural-text closure script does.
    """
    selection = check_selection(selection, n_layers, n_heads)
    seed = check_seed(seed, "the control seed")
    if n_draws < 1:
        raise HeadLabError("ask for at least one control draw.")
    free = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in selection]
    k = len(selection)
    if k > len(free):
        raise HeadLabError("the selection holds more than half of the model's heads, so no disjoint control exists; select fewer heads.")
    n_possible = count_any_layer_sets(selection, n_layers, n_heads)
    if n_draws >= n_possible:
        sets = tuple(HeadSet(combo) for combo in itertools.combinations(free, k))
        note = _draws_note("any-layer", n_possible, n_draws) if n_draws > n_possible else ""
        return ControlSets("any-layer", sets, int(seed), int(n_draws), n_possible, note)
    rng = np.random.RandomState(seed)

    def draw() -> tuple:
        return tuple(free[int(i)] for i in rng.choice(len(free), size=k, replace=False))

    sets = tuple(HeadSet(d) for d in _distinct_draws(draw, n_draws))
    return ControlSets("any-layer", sets, int(seed), int(n_draws), n_possible)


def upper_bound(selection: HeadSet, n_heads: int) -> HeadSet:
    """Every head in the selected layers."""
    selection = selection if isinstance(selection, HeadSet) else HeadSet(tuple(selection))
    if len(selection) == 0:
        raise HeadLabError("the selection is empty; pick at least one head to ablate.")
    return HeadSet(tuple((layer, h) for layer in selection.layers for h in range(n_heads)))
