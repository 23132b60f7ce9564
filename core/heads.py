"""HeadSet: one vocabulary for heads everywhere.

`(layer, head)` tuples in code, `L{layer}H{head}` in text, masks indexed `[layer, head]`.
`parse_heads` is the one place user text becomes heads, with one clear error message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from core.errors import HeadLabError

Head = tuple[int, int]

_TOKEN = re.compile(r"^L(\d+)H(\d+|\*)$", re.IGNORECASE)
_HELP = 'write heads as "L1H3, L2H0" (layer and head from 0) or "L2H*" for every head of layer 2'


@dataclass(frozen=True)
class HeadSet:
    """An ordered, duplicate-free set of heads, sorted by (layer, head)."""

    heads: tuple[Head, ...] = ()

    def __post_init__(self) -> None:
        clean = tuple(sorted({(int(layer), int(head)) for layer, head in self.heads}))
        object.__setattr__(self, "heads", clean)

    @classmethod
    def of(cls, heads: Iterable[Head]) -> "HeadSet":
        return cls(tuple(heads))

    @classmethod
    def from_mask(cls, mask: np.ndarray) -> "HeadSet":
        """Heads where a boolean [layer, head] mask is true."""
        layers, heads = np.nonzero(np.asarray(mask, dtype=bool))
        return cls(tuple(zip(layers.tolist(), heads.tolist())))

    def __iter__(self) -> Iterator[Head]:
        return iter(self.heads)

    def __len__(self) -> int:
        return len(self.heads)

    def __contains__(self, head: object) -> bool:
        return head in self.heads

    def __str__(self) -> str:
        return ",".join(head_name(h) for h in self.heads)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.heads}))

    def count_per_layer(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for layer, _ in self.heads:
            counts[layer] = counts.get(layer, 0) + 1
        return counts

    def mask(self, n_layers: int, n_heads: int) -> np.ndarray:
        """Boolean [layer, head] mask; validates against the shape first."""
        self.validate(n_layers, n_heads)
        out = np.zeros((n_layers, n_heads), dtype=bool)
        for layer, head in self.heads:
            out[layer, head] = True
        return out

    def validate(self, n_layers: int, n_heads: int) -> "HeadSet":
        for layer, head in self.heads:
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise HeadLabError(
                    f"head {head_name((layer, head))} is outside this model "
                    f"({n_layers} layers x {n_heads} heads: L0H0 .. L{n_layers - 1}H{n_heads - 1})."
                )
        return self

    def union(self, other: Iterable[Head]) -> "HeadSet":
        return HeadSet(self.heads + tuple(other))

    def toggled(self, heads: Iterable[Head]) -> "HeadSet":
        """Each of `heads` added when absent and removed when present (a click on a head grid)."""
        flip = set(HeadSet(tuple(heads)).heads)
        return HeadSet(tuple(set(self.heads) ^ flip))

    def to_json(self) -> list[list[int]]:
        return [[layer, head] for layer, head in self.heads]

    @classmethod
    def from_json(cls, data: list) -> "HeadSet":
        if isinstance(data, str):
            data = json.loads(data)
        return cls(tuple((int(layer), int(head)) for layer, head in data))


def head_name(head: Head) -> str:
    return f"L{head[0]}H{head[1]}"


def parse_heads(text: str, n_layers: int | None = None, n_heads: int | None = None) -> HeadSet:
    """Parse "L1H3, L2H0" or "L2H*" (needs n_heads) into a HeadSet, validated when shape given.

    Raises HeadLabError naming the first bad token.
    """
    if text is None or not str(text).strip():
        raise HeadLabError(f"no heads given; {_HELP}.")
    heads: list[Head] = []
    for raw in re.split(r"[,\s;]+", str(text).strip()):
        if not raw:
            continue
        match = _TOKEN.match(raw)
        if match is None:
            raise HeadLabError(f'cannot read head "{raw}"; {_HELP}.')
        layer = int(match.group(1))
        if match.group(2) == "*":
            if n_heads is None:
                raise HeadLabError(f'"{raw}" needs the model shape to expand; pick a model first.')
            heads.extend((layer, h) for h in range(n_heads))
        else:
            heads.append((layer, int(match.group(2))))
    head_set = HeadSet(tuple(heads))
    if n_layers is not None and n_heads is not None:
        head_set.validate(n_layers, n_heads)
    return head_set
