"""The gradient-vs-causal analysis [HHG] as numbers: settings, ranks and classes, results, summaries.

No model runs here: core/pipelines/attribution_measures.py measures G and C on a model, and
core/pipelines/attribution.py (its docstring states the method and its fixed choices) puts the
two together. Everything below is a pure function of measured vectors, testable on hand-made ones:
ascending ranks with ties averaged, d = rank_G - rank_C, classes by a threshold on d ("bloat":
large gradient, small effect; "hero": the reverse), Spearman rho, per-layer counts, the two
superadditivity ratios of a joint ablation, and the summary over seeds (population std, ddof=0).
Components are named "L1H3" (head 3 of layer 1) and "L1MLP", ordered layer by layer: the heads of
layer l, then its MLP.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import rankdata

from core.ablation.spec import SEQUENCE_MODES
from core.choices import ATTRIBUTION_THRESHOLD as DEFAULT_THRESHOLD, CLASS_RULES, GRADIENT_VARIANTS
from core.errors import HeadLabError
from core.results import JsonResult
from core.stats.inference import spearman
from core.tasks.sequences import MAX_SEQUENCE_LENGTH, OOD_LENGTHS, TRAIN_LENGTHS, check_task

CLASSES = ("hero", "aligned", "bloat")
_COMPONENT = re.compile(r"^L(\d+)(?:H(\d+)|MLP)$", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------


def component_name(layer: int, head: int | None = None) -> str:
    """"L1H3" for a head, "L1MLP" for the MLP of layer 1 (head None)."""
    return f"L{int(layer)}MLP" if head is None else f"L{int(layer)}H{int(head)}"


def parse_component(name: str) -> tuple[int, int | None]:
    """(layer, head) of "L1H3", (layer, None) of "L1MLP"; HeadLabError for anything else."""
    match = _COMPONENT.match(str(name).strip())
    if match is None:
        raise HeadLabError(f'cannot read component "{name}"; write heads as "L1H3" and MLPs as "L1MLP".')
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


def component_order(n_layers: int, n_heads: int, with_mlp: bool = True) -> tuple[str, ...]:
    """All components in HeadLab's order: per layer, its heads 0..H-1, then its MLP."""
    out: list[str] = []
    for layer in range(int(n_layers)):
        out += [component_name(layer, h) for h in range(int(n_heads))]
        if with_mlp:
            out.append(component_name(layer))
    return tuple(out)


def check_ood_length(length: int) -> int:
    """An OOD length must be an integer beyond the training lengths (3..7) with samples that fit."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise HeadLabError(f"OOD length {length!r} is not an integer; pass a length such as 8.")
    length = int(length)
    if length in TRAIN_LENGTHS or length < 1 or length > MAX_SEQUENCE_LENGTH:
        raise HeadLabError(
            f"OOD length {length} has no valid out-of-distribution samples; use a length outside the training "
            f"lengths {TRAIN_LENGTHS.start}..{TRAIN_LENGTHS.stop - 1}, at most {MAX_SEQUENCE_LENGTH} "
            f"(the paper uses {OOD_LENGTHS.start}..{OOD_LENGTHS.stop - 1})."
        )
    return length


# ----------------------------------------------------------------------------------------------
# Pure statistics
# ----------------------------------------------------------------------------------------------


def rank_differences(G: Sequence[float], C: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank_G, rank_C, d): ascending ranks (1 = smallest, ties averaged, scipy.stats.rankdata) and
    d = rank_G - rank_C, each [component]. d > 0: the gradient ranks the component higher than its effect."""
    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    if G.shape != C.shape or G.ndim != 1 or G.size == 0:
        raise HeadLabError("G and C need one value per component, the same components in the same order.")
    rank_g, rank_c = rankdata(G), rankdata(C)
    return rank_g, rank_c, rank_g - rank_c


def classify_components(d: Sequence[float], threshold: float = DEFAULT_THRESHOLD, rule: str = "paper") -> tuple[str, ...]:
    """"bloat" (large gradient, small effect) when d >= threshold, "hero" when d <= -threshold
    (rule "paper"); strict > and < for rule "reference"; else "aligned"."""
    if rule not in CLASS_RULES:
        raise HeadLabError(f"classification rule {rule!r} is unknown; use 'paper' (>=) or 'reference' (>).")
    out = []
    for value in np.asarray(d, dtype=np.float64):
        if rule == "paper":
            out.append("bloat" if value >= threshold else "hero" if value <= -threshold else "aligned")
        else:
            out.append("bloat" if value > threshold else "hero" if value < -threshold else "aligned")
    return tuple(out)


def per_layer_summary(components: Sequence[str], classes: Sequence[str]) -> tuple[dict, ...]:
    """Per layer: how many heroes, bloats and aligned components ({"layer", "heroes", "bloats", "aligned"})."""
    layers = sorted({parse_component(c)[0] for c in components})
    rows = {layer: {"layer": layer, "heroes": 0, "bloats": 0, "aligned": 0} for layer in layers}
    for name, kind in zip(components, classes):
        rows[parse_component(name)[0]][{"hero": "heroes", "bloat": "bloats", "aligned": "aligned"}[kind]] += 1
    return tuple(rows[layer] for layer in layers)


def superadditivity(joint_damage: float, single_damages: Sequence[float]) -> tuple[float | None, float | None, str]:
    """(joint / mean single, joint / sum of singles, reason): the ratios, or None with the reason why
    they are undefined (fewer than 2 components; single damages summing to <= 0).

    joint / sum > 1 means superadditive. Paper: 43.8% joint / 3.1% mean single = 14.1x.
    """
    singles = np.asarray(single_damages, dtype=np.float64)
    if singles.size < 2:
        return None, None, f"undefined: superadditivity needs at least 2 components, got {singles.size}."
    total = float(singles.sum())
    if total <= 0.0:
        return None, None, (
            f"undefined: the single damages sum to {total:.4g} (not positive), so no ratio to them has a meaning."
        )
    return float(joint_damage) / (total / singles.size), float(joint_damage) / total, ""


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttributionSettings(JsonResult):
    """Everything that determines an AttributionResult besides the model (compared on resume)."""

    task: str
    gradient_variant: str = "paper"
    n_batches: int = 50
    batch_size: int = 64
    ablation_mode: str = "mean"
    n_examples: int = 500
    seed: int = 0
    threshold: float = DEFAULT_THRESHOLD
    rule: str = "paper"
    ood_length: int | None = None  # None: chosen by the reference rule

    def __post_init__(self) -> None:
        check_task(self.task)
        for name in ("n_batches", "batch_size", "n_examples", "seed"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "threshold", float(self.threshold))
        if self.gradient_variant not in GRADIENT_VARIANTS:
            raise HeadLabError(f"gradient variant {self.gradient_variant!r} is unknown; use 'paper' or 'reference'.")
        if self.ablation_mode not in SEQUENCE_MODES:
            raise HeadLabError(f"ablation mode {self.ablation_mode!r} is unknown; use one of {', '.join(SEQUENCE_MODES)}.")
        if self.rule not in CLASS_RULES:
            raise HeadLabError(f"classification rule {self.rule!r} is unknown; use 'paper' or 'reference'.")
        if min(int(self.n_batches), int(self.batch_size), int(self.n_examples)) < 1:
            raise HeadLabError("n_batches, batch_size and n_examples must be at least 1.")
        if self.ood_length is not None:
            check_ood_length(self.ood_length)


@dataclass(frozen=True)
class JointAblation(JsonResult):
    """All bloats (or all heroes) ablated together, their single damages and the superadditivity ratios."""

    kind: str  # "bloats" | "heroes"
    components: tuple[str, ...]
    joint_accuracy: float | None  # None: nothing to ablate
    joint_damage: float | None  # clean accuracy - joint_accuracy
    single_damages: tuple[float, ...]
    ratio_to_mean: float | None  # joint damage / mean single damage
    ratio_to_sum: float | None  # joint damage / sum of single damages (> 1: superadditive)
    reason: str = ""  # why the ratios are undefined; "" when defined


def joint_ablation(kind: str, components: Sequence[str], damages: Sequence[float], joint_damage: float | None, clean: float) -> JointAblation:
    """Assemble a JointAblation from measured damages (each component alone, and all together)."""
    components, singles = tuple(components), tuple(float(v) for v in damages)
    if not components:
        return JointAblation(kind, (), None, None, (), None, None, f"undefined: there are no {kind}.")
    ratio_mean, ratio_sum, reason = superadditivity(float(joint_damage), singles)
    return JointAblation(kind, components, clean - float(joint_damage), float(joint_damage), singles, ratio_mean, ratio_sum, reason)


def _floats(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1))


@dataclass(frozen=True)
class AttributionResult(JsonResult):
    """One model's gradient-vs-causal analysis. Arrays are per component, in `components` order."""

    model: str
    revision: str | None
    components: tuple[str, ...]
    G: tuple[float, ...]
    C: tuple[float, ...]
    rank_G: tuple[float, ...]
    rank_C: tuple[float, ...]
    d: tuple[float, ...]
    classes: tuple[str, ...]
    rho: float | None
    rho_p: float | None
    ood_length: int
    clean_accuracy: float
    accuracy_by_length: dict[int, float]
    ablated_accuracy: tuple[float, ...]
    joint_bloats: JointAblation
    joint_heroes: JointAblation
    per_layer: tuple[dict, ...]
    settings: AttributionSettings
    notes: tuple[str, ...] = ()
    provenance: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.settings.task

    def members(self, kind: str) -> tuple[str, ...]:
        """Components of one class ("hero", "bloat", "aligned")."""
        return tuple(c for c, k in zip(self.components, self.classes) if k == kind)

    def to_json(self) -> dict:
        """The fields, with the task named after the revision (readers of stored results look for it)."""
        data = super().to_json()
        return {"model": data["model"], "revision": data["revision"], "task": self.task, **data}


def assemble_result(
    model: str, revision: str | None, components: Sequence[str], G: Sequence[float], C: Sequence[float],
    clean_accuracy: float, accuracy_by_length: dict[int, float], ood_length: int, settings: AttributionSettings,
    joint_damage: Callable[[Sequence[str]], float],
) -> AttributionResult:
    """Ranks, classes, rho, per-layer counts and joint ablations from measured G and C.

    joint_damage(components) measures the damage of ablating them together (called once for the
    bloats and once for the heroes when there are at least 2; a single one reuses its C). The caller
    adds its own notes and provenance (`dataclasses.replace`).
    """
    components = tuple(components)
    G, C = np.asarray(G, dtype=np.float64), np.asarray(C, dtype=np.float64)
    rank_g, rank_c, d = rank_differences(G, C)
    classes = classify_components(d, settings.threshold, settings.rule)
    rho, rho_p = spearman(G, C)
    notes = () if rho is not None else ("Spearman rho is undefined: G or C is the same for every component.",)
    joints = []
    for kind, label in (("bloat", "bloats"), ("hero", "heroes")):
        idx = [i for i, k in enumerate(classes) if k == kind]
        members = [components[i] for i in idx]
        singles = [float(C[i]) for i in idx]
        joint = None if not idx else singles[0] if len(idx) == 1 else float(joint_damage(members))
        joints.append(joint_ablation(label, members, singles, joint, float(clean_accuracy)))
    return AttributionResult(
        model=str(model), revision=revision, components=components, G=_floats(G), C=_floats(C),
        rank_G=_floats(rank_g), rank_C=_floats(rank_c), d=_floats(d), classes=classes, rho=rho, rho_p=rho_p,
        ood_length=int(ood_length), clean_accuracy=float(clean_accuracy),
        accuracy_by_length={int(k): float(v) for k, v in accuracy_by_length.items()},
        ablated_accuracy=_floats(float(clean_accuracy) - C), joint_bloats=joints[0], joint_heroes=joints[1],
        per_layer=per_layer_summary(components, classes), settings=settings, notes=notes,
    )


# ----------------------------------------------------------------------------------------------
# Over seeds
# ----------------------------------------------------------------------------------------------


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, population std, count) over the defined values; (None, None, 0) when none are."""
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not clean:
        return None, None, 0
    return float(np.mean(clean)), float(np.std(clean, ddof=0)), len(clean)


@dataclass(frozen=True)
class AttributionSummary(JsonResult):
    """One task's results over seeds: rho's mean and spread, hero/bloat counts per component."""

    task: str
    models: tuple[str, ...]
    rhos: tuple[float | None, ...]
    rho_mean: float | None
    rho_std: float | None  # population std (ddof=0) over the defined rhos
    rho_min: float | None
    rho_max: float | None
    components: tuple[str, ...]
    hero_counts: tuple[int, ...]  # [component]: in how many models it is a hero
    bloat_counts: tuple[int, ...]
    per_layer: tuple[dict, ...]  # heroes and bloats per layer, summed over models
    joint: dict  # per kind: mean/std of joint damage, mean single damage, ratios (over defined ones)
    skipped: tuple[tuple[str, str], ...]  # (model, reason) not analysed
    settings: AttributionSettings

    @property
    def n_models(self) -> int:
        return len(self.models)

    def counts(self, kind: str) -> dict[str, int]:
        """{component: in how many models it is a `kind` ("hero" or "bloat")}."""
        values = {"hero": self.hero_counts, "bloat": self.bloat_counts}[kind]
        return dict(zip(self.components, values))

    def to_json(self) -> dict:
        """The fields, with the model count after the models."""
        data = super().to_json()
        return {"task": data["task"], "models": data["models"], "n_models": self.n_models, **data}


def summarize(results: Sequence[AttributionResult], skipped: Sequence[tuple[str, str]] = ()) -> AttributionSummary:
    """Aggregate per-seed results of one task (same components and settings) into an AttributionSummary."""
    if not results:
        raise HeadLabError("no analysed models to summarise; run the analysis on at least one model first.")
    first = results[0]
    for r in results[1:]:
        if r.components != first.components or r.settings != first.settings:
            raise HeadLabError(
                f"{r.model} was analysed with other components or settings than {first.model}; rerun them with the same settings."
            )
    rhos = tuple(r.rho for r in results)
    defined = [v for v in rhos if v is not None]
    rho_mean, rho_std, _ = _mean_std(rhos)
    hero = tuple(sum(r.classes[i] == "hero" for r in results) for i in range(len(first.components)))
    bloat = tuple(sum(r.classes[i] == "bloat" for r in results) for i in range(len(first.components)))
    layers = {row["layer"]: {"layer": row["layer"], "heroes": 0, "bloats": 0} for row in first.per_layer}
    for r in results:
        for row in r.per_layer:
            layers[row["layer"]]["heroes"] += row["heroes"]
            layers[row["layer"]]["bloats"] += row["bloats"]
    joint = {}
    for kind in ("bloats", "heroes"):
        parts = [getattr(r, f"joint_{kind}") for r in results]
        damage_mean, damage_std, n_damage = _mean_std([p.joint_damage for p in parts])
        single_mean, _, _ = _mean_std([float(np.mean(p.single_damages)) if p.single_damages else None for p in parts])
        ratio_mean, ratio_mean_std, n_ratio = _mean_std([p.ratio_to_mean for p in parts])
        ratio_sum, ratio_sum_std, _ = _mean_std([p.ratio_to_sum for p in parts])
        joint[kind] = {
            "joint_damage_mean": damage_mean, "joint_damage_std": damage_std, "models_with_any": n_damage,
            "mean_single_damage": single_mean, "ratio_to_mean_mean": ratio_mean, "ratio_to_mean_std": ratio_mean_std,
            "ratio_to_sum_mean": ratio_sum, "ratio_to_sum_std": ratio_sum_std, "models_with_ratio": n_ratio,
        }
    return AttributionSummary(
        task=first.task, models=tuple(r.model for r in results), rhos=rhos, rho_mean=rho_mean, rho_std=rho_std,
        rho_min=min(defined) if defined else None, rho_max=max(defined) if defined else None,
        components=first.components, hero_counts=hero, bloat_counts=bloat,
        per_layer=tuple(layers[k] for k in sorted(layers)), joint=joint,
        skipped=tuple((str(a), str(b)) for a, b in skipped), settings=first.settings,
    )
