"""One group under every ablation type: does the conclusion depend on what an ablated head is replaced by?

`python -m core ablate --mode all` runs the same study (the group, the same matched-random controls,
the upper bound) under each probe mode (spec.PROBE_MODES), and each head of the group alone against
its own matched-random controls. Papers show that conclusions can flip with the ablation type; this
says where they do. Definitions, fixed here:

- the group's verdict flips when any verdict (recipe, closure paper, closure reference) has
  different labels under two types;
- a head's conclusion is the sign and significance of its single-head damage z, the headline
  metric's z against its controls signed so that positive is damage (target logit when measured,
  else loss): "damaging" (damage z > z_threshold), "helping" (< -z_threshold) or "no effect";
  a head flips when its conclusion differs between two types. A head that cannot be judged (no
  matched control exists, or z undefined) is "n/a" and flips nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

from core.ablation.spec import PROBE_MODES
from core.ablation.study import AblationResult, AblationSettings, ablation_study
from core.errors import HeadLabError
from core.heads import HeadSet, head_name
from core.stats.inference import DAMAGE_SIGN

NOT_JUDGED = "n/a"


def headline_metric(metrics: tuple[str, ...]) -> str:
    """The metric a head's damage z is read from: the target logit when measured, else the loss."""
    return "target_logit" if "target_logit" in metrics else "loss"


def head_conclusion(damage_z: float | None, z_threshold: float) -> str:
    """'damaging', 'helping' or 'no effect' from a damage z (positive = damage); 'n/a' when undefined."""
    if damage_z is None or not math.isfinite(damage_z):
        return NOT_JUDGED
    if damage_z > z_threshold:
        return "damaging"
    return "helping" if damage_z < -z_threshold else "no effect"


def damage_z(result: AblationResult, metric: str) -> float | None:
    """The candidate's z against its controls on `metric`, signed so that positive is damage."""
    z = result.stats.get(metric, {}).get("z")
    return None if z is None else DAMAGE_SIGN[metric] * float(z)


def compare_modes(group: Mapping[str, Mapping[str, str]], heads: Mapping[str, Mapping[str, float | None]],
                  z_threshold: float) -> dict:
    """Agreement across ablation types from measured numbers.

    group: mode -> {verdict name: label}; heads: head name -> {mode: damage z (None: not judged)}.
    Returns {"same_verdict", "verdict_flips" (verdict names whose label differs), "heads" (head ->
    mode -> {"damage_z", "conclusion"}), "flipped_heads"}.
    """
    names = sorted({name for verdicts in group.values() for name in verdicts})
    flips = [name for name in names if len({verdicts.get(name) for verdicts in group.values()}) > 1]
    per_head, flipped = {}, []
    for head, by_mode in heads.items():
        per_head[head] = {mode: {"damage_z": z, "conclusion": head_conclusion(z, z_threshold)} for mode, z in by_mode.items()}
        judged = {entry["conclusion"] for entry in per_head[head].values()} - {NOT_JUDGED}
        if len(judged) > 1:
            flipped.append(head)
    return {"same_verdict": not flips, "verdict_flips": flips, "heads": per_head, "flipped_heads": flipped}


def ablation_under_every_mode(model: Any, batch: Any, selection: HeadSet, settings: AblationSettings,
                              device: str | None = None, say: Callable[[str], None] | None = None) -> dict:
    """The group study and each head's single-head study under every probe mode, and their agreement.

    Returns {"modes", "results" (mode -> AblationResult of the group), "verdicts" (mode -> {name: label}),
    "head_notes" (why a head was not judged), **compare_modes(...)}. settings.mode is ignored.
    """
    say = say or (lambda text: None)
    metric = headline_metric(settings.metrics)
    results, verdicts, heads, head_notes = {}, {}, {}, {}
    single = replace(settings, include_upper_bound=False)
    for mode in PROBE_MODES:
        say(f"{mode} ablation: the group and its controls")
        results[mode] = ablation_study(model, batch, selection, replace(settings, mode=mode), device=device)
        verdicts[mode] = {name: v.label for name, v in results[mode].verdicts.items()}
        for head in selection:
            name = head_name(head)
            try:
                alone = ablation_study(model, batch, HeadSet((head,)), replace(single, mode=mode), device=device)
                heads.setdefault(name, {})[mode] = damage_z(alone, metric)
            except HeadLabError as exc:  # e.g. a one-head layer: no matched control
                heads.setdefault(name, {})[mode] = None
                head_notes[name] = str(exc)
    out = {"modes": list(PROBE_MODES), "headline_metric": metric, "results": results, "verdicts": verdicts,
           "head_notes": head_notes}
    out.update(compare_modes(verdicts, heads, settings.z_threshold))
    return out
