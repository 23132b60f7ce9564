"""Speed of the per-head participation ratio (core.stats.spectral.pr_per_head) for both PR definitions.

Speed checks live here, not in the tests.
"""

from __future__ import annotations

import time

import torch

from core.stats.spectral import PR_DEFINITIONS, pr_per_head


def bench_pr_per_head(n_examples: int = 500, n_layers: int = 4, n_heads: int = 8, d_head: int = 64, seed: int = 0) -> dict:
    """Seconds for both PR definitions on random head outputs z: [example, layer, head, d_head]."""
    z = torch.randn(n_examples, n_layers, n_heads, d_head, generator=torch.Generator().manual_seed(seed))
    out = {}
    for name in PR_DEFINITIONS:
        start = time.perf_counter()
        pr_per_head(z, name)
        out[f"{name}_s"] = time.perf_counter() - start
    return out
