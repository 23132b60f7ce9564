"""Counterfactual patching on clean/corrupted pairs (core.tasks.PatchPair): activation patching per head,
per head x position and per group with random controls (activation.py), attribution patching
(attribution.py), path patching between heads (paths.py); shared settings, metric and runs (runs.py).
Every score is on one scale: the clean run 1, the corrupted run 0 (core/stats/patching.py).
"""

from core.ablation.patching.activation import GroupPatching, HeadPatching, activation_patching, group_patching
from core.ablation.patching.attribution import HeadAttribution, attribution_patching
from core.ablation.patching.paths import COMPONENTS, PathPatching, check_components, path_patching
from core.ablation.patching.runs import GRADIENT_METRICS, PATCH_METRICS, PatchSettings, metric_values

__all__ = [
    "COMPONENTS",
    "GRADIENT_METRICS",
    "PATCH_METRICS",
    "GroupPatching",
    "HeadAttribution",
    "HeadPatching",
    "PatchSettings",
    "PathPatching",
    "activation_patching",
    "attribution_patching",
    "check_components",
    "group_patching",
    "metric_values",
    "path_patching",
]
