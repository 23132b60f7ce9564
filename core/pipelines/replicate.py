"""`python -m core replicate spectral|closure|attribution`: the papers' claims, tested on the zoo.

METHODS.md's last section lists the claims worth reproducing on small models. Each is a `Claim`
below, written down before anything runs: its statement, its pass criterion (as text and as a
function of the measured values), and the published figure. A run measures each claim on the
preset's zoo models, judges it by its criterion, and writes a self-contained report: Markdown and
HTML with the figures, every number in report.json, each figure's data as CSV/JSON, and the
figures as PNG/SVG (through kaleido and Debian's chromium; when no browser is available the report
says so and keeps the figures as plotly JSON and as interactive plots in report.html).

Verdicts: "held", "did not hold", "needs the paper preset" (the quick preset has one seed per
model kind, no sorting models and no data-shift model), or "not run: <reason>" (a model not
trained yet, a statistic that is undefined on these models, a pipeline not in this version).

Resuming: each claim's measurement is stored under <out>/measurements/<claim>.json with the
settings and model fingerprints it was made with, and reused on a rerun with the same settings;
the cross-seed matrix stores every cell, the attribution analysis every model, and HeadStats live
in the content-addressed cache. An interrupted run therefore resumes where it stopped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from core.pipelines.dynamics import DEFAULT_MARGIN, IDENTIFIABLE_BAND, Z_THRESHOLD
from core.errors import HeadLabError

TARGETS = ("spectral", "closure", "attribution")
PRESETS = ("quick", "paper")
HELD = "held"
NOT_HELD = "did not hold"
NEEDS_PAPER = "needs the paper preset"
NOT_RUN = "not run"
MEASUREMENT_VERSION = "replicate-1"  # bump when what a measurement holds changes: stored ones then miss

# Thresholds of the pass criteria (fixed here, before anything runs; quoted in each criterion's text)
CIRCUIT_MAX_FRACTION = 0.25  # "small": at most a quarter of the model's heads
CONTROL_TOP1_TOLERANCE = 0.10  # "controls barely hurt": mean control top-1 loss <= 10% of clean top-1
DESTROYED_FRACTION = 0.5  # "destroys induction": top-1 after ablation <= half the clean top-1
RHO_STRONG = 0.5  # "agree" on reversal: mean Spearman rho >= 0.5 (published 0.72)
HERO_COST = (0.364, 0.228)  # published mean +- sd of a hero's single ablation damage on reversal


class NotRun(Exception):
    """A claim that cannot be measured here; the message is the reason shown in the report."""


# ---------------------------------------------------------------------------------------------
# zoo models per preset


def preset_models(preset: str, kind: str) -> list[str]:
    """Zoo model names of `preset` of one kind: "induction" (dense GPT-NeoX seeds, not continued),
    "shifted" (continued on another distribution), "moe", "reverse", "sort"."""
    from core.zoo.train import ZOO_PRESETS

    if preset not in ZOO_PRESETS:
        raise HeadLabError(f"unknown zoo preset {preset!r}; choose one of {', '.join(sorted(ZOO_PRESETS))}.")
    out = []
    for name, model_cfg, train_cfg in ZOO_PRESETS[preset]:
        if kind == "induction":
            keep = train_cfg.task == "induction" and model_cfg.family == "gpt_neox" and not train_cfg.init_from
        elif kind == "shifted":
            keep = train_cfg.task == "shifted" and bool(train_cfg.init_from)
        elif kind == "moe":
            keep = model_cfg.family == "olmoe"
        elif kind in ("reverse", "sort"):
            keep = train_cfg.task == kind
        else:
            raise HeadLabError(f"unknown model kind {kind!r}.")
        if keep:
            out.append(name)
    return out


def _shift_pairs(preset: str) -> list[tuple[str, str]]:
    from core.zoo.train import ZOO_PRESETS

    return [(t.init_from, n) for n, _, t in ZOO_PRESETS[preset] if n in preset_models(preset, "shifted")]


def unformed_induction_seeds(preset: str) -> dict[str, float]:
    """Finished induction seeds of `preset` that never learned induction, with their final
    repeated-half loss: at or above the zoo's own formation target (core.zoo.train.INDUCTION_LOSS_TARGET,
    1.0 nats). Claims about induction circuits cannot be tested on a model without one, so these
    seeds are left out of every induction claim and listed in the report (rule fixed before any run)."""
    from core.model.loading import read_manifest
    from core.zoo.train import INDUCTION_LOSS_TARGET

    out = {}
    for name in preset_models(preset, "induction"):
        try:
            manifest = read_manifest(name)
        except HeadLabError:
            continue  # not trained: run_claim says so
        loss = (manifest.get("final") or {}).get("induction_loss")
        if manifest.get("complete") and loss is not None and loss >= INDUCTION_LOSS_TARGET:
            out[name] = round(float(loss), 3)
    return out


def _uses_induction(preset: str) -> list[str]:
    unformed = unformed_induction_seeds(preset)
    return [name for name in preset_models(preset, "induction") if name not in unformed]


def _uses_shift(preset: str) -> list[str]:
    return [name for pair in _shift_pairs(preset) for name in pair]


def _uses_hhg(preset: str) -> list[str]:
    return preset_models(preset, "reverse") + preset_models(preset, "sort")


# ---------------------------------------------------------------------------------------------
# claims: statements and pass criteria, fixed before anything runs


@dataclass(frozen=True)
class Claim:
    """One published claim, its pass criterion (text + function of the measured values) and, after a
    run, what was measured and the verdict.

    criterion(measured) -> bool decides "held" / "did not hold"; a measurement carrying
    "undefined": reason gets "not run: <reason>". uses(preset) names the zoo models it needs;
    testable(preset) says whether that preset can test it at all (default: it has models for it).
    """

    id: str
    target: str
    paper: str
    statement: str
    criterion_text: str
    criterion: Callable[[dict], bool] = field(repr=False, compare=False)
    published: str = ""
    describe: Callable[[dict], str] = field(default=lambda m: "", repr=False, compare=False)
    uses: Callable[[str], list[str]] = field(default=lambda preset: [], repr=False, compare=False)
    testable: Optional[Callable[[str], bool]] = field(default=None, repr=False, compare=False)
    # filled by a run
    verdict: str = f"{NOT_RUN}: not measured yet"
    measured: Optional[dict] = None
    measured_text: str = ""
    models: tuple[str, ...] = ()
    seeds: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    figures: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: Optional[float] = None
    reused: bool = False

    def testable_on(self, preset: str) -> bool:
        return self.testable(preset) if self.testable is not None else bool(self.uses(preset))

    def judge(self, measured: dict) -> str:
        """The verdict the criterion gives on `measured`."""
        if measured.get("undefined"):
            return f"{NOT_RUN}: {measured['undefined']}"
        return HELD if self.criterion(measured) else NOT_HELD

    def to_json(self) -> dict:
        return {"id": self.id, "target": self.target, "paper": self.paper, "statement": self.statement,
                "criterion": self.criterion_text, "published": self.published, "verdict": self.verdict,
                "measured": self.measured, "measured_text": self.measured_text, "models": list(self.models),
                "seeds": self.seeds, "settings": self.settings, "figures": list(self.figures), "notes": list(self.notes),
                "seconds": self.seconds, "reused": self.reused}

    @classmethod
    def from_json(cls, data: dict) -> "Claim":
        """A claim from a report, with its criterion re-attached from the registry (by id)."""
        if data["id"] not in CLAIMS:
            raise HeadLabError(f"the report names an unknown claim {data['id']!r}; it was written by another HeadLab version.")
        return replace(CLAIMS[data["id"]], verdict=data["verdict"], measured=data.get("measured"),
                       measured_text=data.get("measured_text", ""), models=tuple(data.get("models", ())),
                       seeds=dict(data.get("seeds", {})), settings=dict(data.get("settings", {})),
                       figures=tuple(data.get("figures", ())), notes=tuple(data.get("notes", ())),
                       seconds=data.get("seconds"), reused=bool(data.get("reused", False)))


def _num(value: Any, fmt: str = ".3g") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


# --- [SPC] criteria and descriptions


def _causal_ok(m: dict) -> bool:
    per = m["per_model"]
    return bool(per) and all(
        x["recipe_verdict"] == "causal" and x["circuit_fraction"] <= CIRCUIT_MAX_FRACTION
        and -x["control_top1_delta_mean"] <= CONTROL_TOP1_TOLERANCE * x["clean_top1"] for x in per)


def _causal_text(m: dict) -> str:
    parts = []
    for x in m["per_model"]:
        parts.append(f"{x['model']}: {x['circuit'] or 'no circuit'} ({x['circuit_size']}/{x['n_heads']} heads) "
                     f"{x['recipe_verdict']}; Δloss {_num(x.get('candidate_loss_delta'), '+.3g')} vs controls "
                     f"{_num(x.get('control_loss_delta_mean'), '+.3g')} ± {_num(x.get('control_loss_delta_std'), '.2g')} "
                     f"(z {_num(x.get('z_loss'), '.3g')}); top-1 {_num(x['clean_top1'], '.2f')} → "
                     f"{_num(x['clean_top1'] + x['candidate_top1_delta'], '.2f')}, controls "
                     f"{_num(x['control_top1_delta_mean'], '+.3f')}")
    return "; ".join(parts)


def _seed_ok(m: dict) -> bool:
    diag, off = m["diagonal_z"], m["off_diagonal_z"]
    return (m["n_models"] >= 2 and len(diag) == m["n_models"] and all(z > Z_THRESHOLD for z in diag)
            and bool(off) and m["median_off_diagonal_z"] <= Z_THRESHOLD)


def _seed_text(m: dict) -> str:
    return (f"{m['n_models']} seeds: own-model z(Δloss) median {_num(m['median_diagonal_z'], '.3g')} "
            f"(min {_num(min(m['diagonal_z']) if m['diagonal_z'] else None, '.3g')}), other-model median "
            f"{_num(m['median_off_diagonal_z'], '.3g')} over {len(m['off_diagonal_z'])} cells; median Δloss own "
            f"{_num(m['median_diagonal_delta'], '+.3g')} vs other {_num(m['median_off_diagonal_delta'], '+.3g')}")


def _timing_ok(m: dict) -> bool:
    per = m["per_model"]
    return bool(per) and all(x["heads"] and all(h["rise_first"] for h in x["heads"]) for x in per)


def _timing_text(m: dict) -> str:
    parts = []
    for x in m["per_model"]:
        first = sum(h["rise_first"] for h in x["heads"])
        leads = [h["lead_decades"] for h in x["heads"] if h["lead_decades"] is not None]
        parts.append(f"{x['model']}: PR rises first in {first}/{len(x['heads'])} circuit heads, median lead "
                     f"{_num(float(np.median(leads)) if leads else None, '+.2f')} decades of tokens ("
                     f"{x.get('other_heads_rising_before_first_crossing', 'n/a')}/{x.get('other_heads', 'n/a')} other heads "
                     "also rise before the first crossing)")
    return "; ".join(parts)


def _ident_ok(m: dict) -> bool:
    per = m["per_model"]
    return bool(per) and all(x["first_fraction"] is not None and x["first_fraction"] <= IDENTIFIABLE_BAND[1] for x in per)


def _ident_text(m: dict) -> str:
    return "; ".join(f"{x['model']}: final circuit first returned at {_pct(x['first_fraction'])} of training tokens "
                     f"(stable from {_pct(x['stable_fraction'])}; a superset of it, {x.get('superset_size')} heads, from "
                     f"{_pct(x.get('superset_fraction'))}); earliest checkpoint at {_pct(x['resolution'])}"
                     for x in m["per_model"])


def _pct(value: Optional[float]) -> str:
    return "never" if value is None else f"{100 * value:.3g}%"


def _shift_ok(m: dict) -> bool:
    return bool(m["pairs"]) and all(p["jaccard"] >= 1.0 for p in m["pairs"])


def _shift_text(m: dict) -> str:
    return "; ".join(f"{p['base']} → {p['shifted']}: Jaccard {p['jaccard']:.2f} ({p['base_circuit'] or 'none'} vs "
                     f"{p['shifted_circuit'] or 'none'})" for p in m["pairs"])


def _composition_ok(m: dict) -> bool:
    per = [x for x in m["per_model"] if x["heads"]]
    return bool(per) and all(x["loss_rank"] == 1 and x["top1_after"] <= DESTROYED_FRACTION * x["clean_top1"] for x in per)


def _composition_text(m: dict) -> str:
    parts = []
    for x in m["per_model"]:
        if not x["heads"]:
            parts.append(f"{x['model']}: no previous-token circuit")
            continue
        parts.append(f"{x['model']}: ablating {x['heads']} ({x['control_kind']} controls): Δloss "
                     f"{_num(x['loss_delta'], '+.3g')} (z {_num(x['z_loss'], '.3g')}, rank {x['loss_rank']}), "
                     f"top-1 {x['clean_top1']:.2f} → {x['top1_after']:.2f}")
    return "; ".join(parts)


# --- [CVC] criteria and descriptions


def _closure_pass_ok(m: dict) -> bool:
    per = m["per_model"]
    return bool(per) and all(x["verdict"] == "pass" for x in per)


def _closure_text(m: dict) -> str:
    return "; ".join(f"{x['model']}: candidate {x['candidate']} closure {x['verdict']} (z loss {_num(x.get('z_loss'), '+.2f')}, "
                     f"top-1 {_num(x.get('z_top1'), '+.2f')}, logit {_num(x.get('z_target_logit'), '+.2f')})"
                     for x in m["per_model"])


def _moe_ok(m: dict) -> bool:
    per = m["per_model"]
    return bool(per) and all(x["null_z"] is not None and x["null_z"] >= Z_THRESHOLD
                             and x["verdict"] == "fails in the wrong direction" for x in per)


def _moe_text(m: dict) -> str:
    return "; ".join(f"{x['model']}: route-conditional statistic z {_num(x['null_z'], '+.2f')} vs random partitions; "
                     f"closure on the discovery stratum: {x['verdict']} (z loss {_num(x.get('z_loss'), '+.2f')})"
                     for x in m["per_model"])


def _form_function_ok(m: dict) -> bool:
    counts = m["counts"]
    return counts["function without form"] >= 1 and counts["form without function"] >= 1


def _form_function_text(m: dict) -> str:
    c = m["counts"]
    return (f"over {m['n_checkpoints']} checkpoints of {', '.join(m['models'])}: function without form "
            f"{c['function without form']}, form without function {c['form without function']}, both "
            f"{c['form and function']}, neither {c['neither']}")


# --- [HHG] criteria and descriptions


def _rho_reverse_ok(m: dict) -> bool:
    return m["rho_mean"] is not None and m["rho_mean"] >= RHO_STRONG


def _rho_text(m: dict) -> str:
    return (f"mean rho {_num(m['rho_mean'], '+.2f')} ± {_num(m['rho_std'], '.2f')} over {m['n']} "
            f"{m['task']} model(s) ({', '.join(_num(r, '+.2f') for r in m['rhos'])})")


def _rho_sort_ok(m: dict) -> bool:
    return m["sort_rho_mean"] is not None and m["reverse_rho_mean"] is not None and m["sort_rho_mean"] < m["reverse_rho_mean"]


def _rho_sort_text(m: dict) -> str:
    return (f"sorting mean rho {_num(m['sort_rho_mean'], '+.2f')} ({m['n_sort']} seeds) vs reversal "
            f"{_num(m['reverse_rho_mean'], '+.2f')} ({m['n_reverse']} seeds)")


def _spread_ok(m: dict) -> bool:
    return m["rho_min"] is not None and m["rho_min"] <= 0.0


def _spread_text(m: dict) -> str:
    return f"single-seed rho from {_num(m['rho_min'], '+.2f')} to {_num(m['rho_max'], '+.2f')} over {m['n']} models"


def _layers_ok(m: dict) -> bool:
    bloats = {int(k): v for k, v in m["bloats_per_layer"].items()}
    heroes = {int(k): v for k, v in m["heroes_per_layer"].items()}

    def strict_argmax(counts: dict, layer: int) -> bool:
        best = counts.get(layer, 0)
        return best > 0 and all(v < best for k, v in counts.items() if k != layer)

    return strict_argmax(bloats, 1) and strict_argmax(heroes, 3)


def _layers_text(m: dict) -> str:
    fmt = lambda d: ", ".join(f"L{k}: {v}" for k, v in sorted(d.items(), key=lambda kv: int(kv[0])))
    return f"bloats per layer {fmt(m['bloats_per_layer'])}; heroes per layer {fmt(m['heroes_per_layer'])} ({m['n']} models)"


def _l3h3_ok(m: dict) -> bool:
    return m["n"] > 0 and m["hero_count"] >= m["n"] / 2


def _l3h3_text(m: dict) -> str:
    return f"L3H3 is a hero in {m['hero_count']} of {m['n']} sorting models"


def _l1_bloats_ok(m: dict) -> bool:
    return m["n"] > 0 and all(count >= m["n"] / 2 for count in m["bloat_counts"].values())


def _l1_bloats_text(m: dict) -> str:
    return ", ".join(f"{c} a bloat in {n} of {m['n']}" for c, n in m["bloat_counts"].items()) + " sorting models"


def _superadditive_ok(m: dict) -> bool:
    return m["ratio_to_sum_mean"] is not None and m["ratio_to_sum_mean"] > 1.0


def _superadditive_text(m: dict) -> str:
    return (f"bloats alone {_pct(m['mean_single_damage'])} each, jointly {_pct(m['joint_damage_mean'])}: joint/mean "
            f"{_num(m['ratio_to_mean_mean'], '.3g')}x, joint/sum {_num(m['ratio_to_sum_mean'], '.3g')} "
            f"over {m['n_with_ratio']} model(s)")


def _hero_cost_ok(m: dict) -> bool:
    mean, sd = HERO_COST
    return m["mean"] is not None and mean - sd <= m["mean"] <= mean + sd


def _hero_cost_text(m: dict) -> str:
    return (f"{m['n_heroes']} heroes over {m['n_models']} reversal model(s) cost {_pct(m['mean'])} ± {_pct(m['std'])} "
            "OOD accuracy each")


def _claims() -> dict[str, Claim]:
    z = f"{Z_THRESHOLD:g}"
    hero_lo, hero_hi = HERO_COST[0] - HERO_COST[1], HERO_COST[0] + HERO_COST[1]
    items = [
        Claim("spc-causal", "spectral", "SPC",
              "A small induction circuit is causally necessary; matched-random controls barely hurt.",
              f"In every induction seed: the recipe verdict on the screened circuit is 'causal' (worse than every one of "
              f">= 19 matched-random draws on loss and top-1, clean top-1 >= 0.2, the upper bound removes >= 90% of clean "
              f"top-1); the circuit holds at most {CIRCUIT_MAX_FRACTION:.0%} of the model's heads; and the mean "
              f"matched-random control costs at most {CONTROL_TOP1_TOLERANCE:.0%} of the clean top-1.",
              _causal_ok, "OLMo-1B (reference prev_token_circuit/olmo_ablation.json): ablating the 3-head induction "
              "circuit L2H11, L4H12, L12H8 raises the synthetic-probe loss 9.48 -> 10.50 nats (top-5 0.024 -> 0.007); "
              "a matched-random same-layer head set changes it by -0.20.", _causal_text, _uses_induction),
        Claim("spc-seed-specific", "spectral", "SPC",
              "Circuits are seed-specific: the circuit found in seed A, ablated in seed B, does little.",
              f"Over the induction seeds (at least 2): every circuit ablated in its own model has z(Δloss) > {z} against "
              f"matched-random controls there, and the median z(Δloss) of circuits ablated in the other seeds is <= {z} "
              "(no better than matched-random heads of that model).",
              _seed_ok, "the circuit of seed A ablated in seed B is indistinguishable from random heads.", _seed_text,
              _uses_induction, lambda preset: len(preset_models(preset, "induction")) >= 2),
        Claim("spc-timing", "spectral", "SPC",
              "The spectral signal rises before the induction selectivity crosses its threshold (predictive timing).",
              "In every induction seed, for every head of the final circuit: its PR rise (the first checkpoint where PR "
              "exceeds its running minimum by the margin) comes at a strictly earlier checkpoint than its threshold "
              "crossing (the first checkpoint with membership selectivity at or above the 50x threshold, scaled to the "
              "probe length).",
              _timing_ok, "PR of the induction heads rises before their selectivity crosses 50x.", _timing_text,
              _uses_induction),
        Claim("spc-identifiable", "spectral", "SPC",
              "The circuit is identifiable from 0.3-2% of the training tokens.",
              f"In every induction seed, the earliest checkpoint at which the recipe run on checkpoints up to t returns "
              f"the final circuit (Jaccard 1) lies at or below {IDENTIFIABLE_BAND[1]:.0%} of the training tokens.",
              _ident_ok, "the final circuit is already returned from 0.3-2% of the training tokens.", _ident_text,
              _uses_induction),
        Claim("spc-data-shift", "spectral", "SPC",
              "Circuit membership is stable under a data shift (continued training on another corpus).",
              "For every base/continued pair, the Jaccard of the final circuits is 1 (identical membership).",
              _shift_ok, "Jaccard 1.00 between the circuits before and after the shift.", _shift_text, _uses_shift,
              lambda preset: bool(_shift_pairs(preset))),
        Claim("spc-composition", "spectral", "SPC",
              "Ablating the previous-token circuit destroys induction (composition).",
              f"In every induction seed with a previous-token circuit (previous-token selectivity at the induction circuit's "
              f"membership threshold, uniform baseline): ablating it is worse on loss than "
              f"every control draw (matched-random, any-layer where a layer has too few free heads), and leaves at most "
              f"{DESTROYED_FRACTION:.0%} of the clean top-1 induction accuracy.",
              _composition_ok, "OLMo-1B (reference prev_token_circuit/olmo_ablation.json): ablating the 9-head "
              "previous-token circuit raises the loss 9.48 -> 11.01 nats and drops top-5 0.024 -> 0.001, more than "
              "the induction circuit itself (10.50).", _composition_text, _uses_induction),
        Claim("cvc-dense-closure", "closure", "CVC",
              "Dense models: co-activation communities pass closure.",
              f"In every dense induction model, the co-activation candidate community passes the closure test (paper "
              f"rule: every metric's delta is damage and z(target logit) < -{z}) against same-size random controls (5 unless "
              f"--closure-controls says otherwise) "
              f"from the same layers (the reference's controls for a synthetic probe; any-layer controls when no "
              f"same-layer set exists), on all probe examples.",
              _closure_pass_ok, "OLMo-1B natural text z 36.44 / -50.59 / -50.93; synthetic 1.83 / -1.97 / -2.68 "
              "(loss / top-1 / logit).", _closure_text, _uses_induction),
        Claim("cvc-moe-wrong-direction", "closure", "CVC",
              "MoE: a route-conditional community can be statistically real and still fail closure in the wrong direction.",
              f"In the MoE model: the route-conditional statistic lies >= {z} null standard deviations above random "
              f"partitions of the same sizes, and the community's closure test on its discovery stratum (same-layer "
              f"controls, any-layer when none exist) is 'fails in the wrong direction' (ablation lowers the loss, "
              f"z_loss < -{z}).",
              _moe_ok, "OLMoE: z = 3.05 (ARI 0.191) vs random partitions; closure z_loss -5.64, z_top1 -0.22, "
              "z_logit -2.97.", _moe_text, lambda preset: preset_models(preset, "moe")),
        Claim("cvc-form-function", "closure", "CVC",
              "Form and function decouple both ways over training (function before form; form without function).",
              "Over the checkpoints of the induction seeds, following each final circuit: at least one checkpoint has "
              "function without form (closure passes, paper rule, while the circuit's mean membership selectivity is "
              "below the threshold) and at least one has form without function (selectivity at or above the threshold, "
              "closure does not pass).",
              _form_function_ok, "both directions observed across 10 closure tests on Pythia/OLMo/OLMoE checkpoints.",
              _form_function_text, _uses_induction),
        Claim("hhg-rho-reverse", "attribution", "HHG",
              "Gradient magnitude and causal importance agree on sequence reversal (rho = 0.72).",
              f"The mean Spearman rho(G, C) over the reversal models is at least {RHO_STRONG:g}.",
              _rho_reverse_ok, "rho = 0.72 (reversal).", _rho_text, lambda preset: preset_models(preset, "reverse")),
        Claim("hhg-rho-sort", "attribution", "HHG",
              "Gradient magnitude agrees less with causal importance on sorting (rho = 0.27) than on reversal.",
              "The mean rho over the sorting models is below the mean rho over the reversal models.",
              _rho_sort_ok, "rho = 0.27 (sorting) vs 0.72 (reversal).", _rho_sort_text, _uses_hhg,
              lambda preset: bool(preset_models(preset, "sort")) and bool(preset_models(preset, "reverse"))),
        Claim("hhg-rho-spread", "attribution", "HHG",
              "Single seeds vary widely, down to rho = -0.18.",
              "The lowest single-model rho over all reversal and sorting seeds is at most 0.",
              _spread_ok, "single seeds down to rho = -0.18.", _spread_text, _uses_hhg,
              lambda preset: len(_uses_hhg(preset)) >= 3),
        Claim("hhg-layers", "attribution", "HHG",
              "Gradient bloats concentrate in layer 1, hidden heroes in layer 3.",
              "Summed over every analysed model, layer 1 holds strictly more bloats than any other layer and layer 3 "
              "strictly more heroes than any other layer (layers counted from 0, as HeadLab names them).",
              _layers_ok, "bloats in layer 1, heroes in layer 3.", _layers_text, _uses_hhg),
        Claim("hhg-l3h3-hero", "attribution", "HHG",
              "L3H3 is a hidden hero in 7 of 10 sorting seeds.",
              "L3H3 is a hero in at least half of the sorting models.",
              _l3h3_ok, "L3H3 a hero in 7/10 sorting seeds.", _l3h3_text, lambda preset: preset_models(preset, "sort"),
              lambda preset: len(preset_models(preset, "sort")) >= 2),
        Claim("hhg-l1-bloats", "attribution", "HHG",
              "L1H1 and L1H3 are gradient bloats in 6 of 10 sorting seeds.",
              "Each of L1H1 and L1H3 is a bloat in at least half of the sorting models.",
              _l1_bloats_ok, "L1H1 and L1H3 bloats in 6/10 seeds.", _l1_bloats_text,
              lambda preset: preset_models(preset, "sort"), lambda preset: len(preset_models(preset, "sort")) >= 2),
        Claim("hhg-superadditive", "attribution", "HHG",
              "Bloats are redundant: 3.1% each alone but 43.8% jointly (14x, superadditive).",
              "The mean over models (with at least 2 bloats) of joint bloat damage / sum of single bloat damages is "
              "above 1.",
              _superadditive_ok, "3.1% alone, 43.8% jointly: 14x the mean single damage.", _superadditive_text, _uses_hhg),
        Claim("hhg-hero-cost", "attribution", "HHG",
              "Hidden heroes cost 36.4% ± 22.8% OOD accuracy on reversal.",
              f"The mean single-ablation damage of the reversal heroes (pooled over models) lies within the published "
              f"mean ± sd: [{hero_lo:.1%}, {hero_hi:.1%}].",
              _hero_cost_ok, "36.4% ± 22.8% (reversal heroes).", _hero_cost_text,
              lambda preset: preset_models(preset, "reverse")),
    ]
    return {c.id: c for c in items}


CLAIMS: dict[str, Claim] = _claims()


def claims_of(target: str) -> list[Claim]:
    if target not in TARGETS:
        raise HeadLabError(f"unknown replication target {target!r}; choose one of {', '.join(TARGETS)}.")
    return [c for c in CLAIMS.values() if c.target == target]


# ---------------------------------------------------------------------------------------------
# the run context: settings, memoised analyses


@dataclass
class Measurement:
    measured: dict
    artifacts: dict
    models: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass
class Context:
    """Settings of one replicate run and the analyses claims share (memoised per run)."""

    target: str
    preset: str
    out: Path
    spec: Any
    n_controls: int = 20
    closure_controls: int = 5
    control_seed: int = 123
    margin: float = DEFAULT_MARGIN
    definition: str = "entropy"
    device: str = "cpu"
    say: Callable[[str], None] = print
    force: bool = False  # measure again instead of reusing stored cells, models and claims
    memo: dict = field(default_factory=dict)

    def settings(self) -> dict:
        out = {"preset": self.preset, "probe_spec": dict(self.spec.to_json()), "n_controls": self.n_controls,
               "control_seed": self.control_seed, "ablation_mode": "zero", "pr_definition": self.definition,
               "pr_rise_margin": self.margin, "membership_threshold": "50x at T = 256, scaled to the probe length "
               "(uniform baseline)", "device": self.device}
        if self.target in ("spectral", "closure"):
            out["excluded_induction_seeds"] = unformed_induction_seeds(self.preset)
        if self.target == "closure":
            out["closure_controls"] = self.closure_controls
        if self.target == "attribution":
            from core.pipelines.attribution import AttributionSettings

            out["attribution"] = {k: v for k, v in AttributionSettings(task="reverse").to_json().items() if k != "task"}
        return out

    def ref(self, name: str):
        from core.model.loading import ModelRef

        return ModelRef(name, "zoo")

    def memoised(self, key: tuple, compute: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def trajectories(self, name: str):
        from core.pipelines.dynamics import training_trajectories

        return self.memoised(("trajectories", name), lambda: training_trajectories(
            self.ref(name), self.spec, self.definition, device=self.device))

    def recipe(self, name: str) -> dict:
        from core.pipelines.recipe import run_recipe

        def compute() -> dict:
            self.say(f"recipe on {name} ({self.n_controls} matched-random controls)")
            return run_recipe(self.ref(name), self.spec, self.n_controls, "zero", self.control_seed, self.device)

        return self.memoised(("recipe", name), compute)

    def attribution(self, task: str):
        """(AttributionSummary, [AttributionResult]) of the preset's models for `task` (resumable per model)."""
        from core.pipelines.attribution import AttributionResult, AttributionSettings, run_preset

        def compute():
            self.say(f"attribution on the {self.preset} {task} models")
            summary, paths = run_preset(self.preset, AttributionSettings(task=task), self.device, progress=False,
                                        force=self.force)
            results = [AttributionResult.from_json(json.loads(Path(p).read_text()))
                       for name, p in paths.items() if name != "summary"]
            return summary, results

        return self.memoised(("attribution", task), compute)


def _trained(name: str) -> tuple[bool, str]:
    from core.model.loading import read_manifest

    try:
        manifest = read_manifest(name)
    except HeadLabError:
        return False, "not trained"
    if not manifest.get("complete", True):
        return False, "still training"
    return True, ""


def model_key(name: str) -> list:
    """What identifies a trained zoo model for resuming: name, final revision, checkpoint count, weights hash."""
    from core.model.loading import ModelRef, list_checkpoints
    from core.store import weights_fingerprint

    ref = ModelRef(name, "zoo")
    checkpoints = list_checkpoints(ref)
    return [name, checkpoints[-1].revision, len(checkpoints), weights_fingerprint(ref, checkpoints[-1].revision)]


def _seed_of(name: str) -> Optional[int]:
    from core.model.loading import read_manifest

    try:
        return int(read_manifest(name)["config"]["train"]["seed"])
    except (HeadLabError, KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# runners: measure one claim


def _require_trained(names: Sequence[str], preset: str) -> None:
    missing = [f"{n} ({why})" for n in names for ok, why in [_trained(n)] if not ok]
    if missing:
        raise NotRun(f"waiting for {', '.join(missing)}; run python -m core zoo --preset {preset}")


def _run_causal(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        out = ctx.recipe(name)
        shape = out["screen"]["shape"]
        n_heads = int(shape[0]) * int(shape[1])
        entry = {"model": name, "n_heads": n_heads, "circuit": ",".join(out["screen"]["candidate_circuit"]),
                 "circuit_size": len(out["screen"]["candidate_circuit"])}
        entry["circuit_fraction"] = entry["circuit_size"] / n_heads
        if "candidate" not in out:
            entry.update(recipe_verdict="no candidate", clean_top1=0.0, candidate_top1_delta=0.0, control_top1_delta_mean=0.0)
        else:
            s = out["candidate"]["summary"]
            loss, top1 = s["metrics"]["loss"], s["metrics"]["top1"]
            entry.update(recipe_verdict=s["verdicts"]["recipe"]["label"], n_controls=s["n_controls"],
                         clean_top1=top1["clean"], candidate_top1_delta=top1["candidate_delta"],
                         control_top1_delta_mean=top1["control_mean"], candidate_loss_delta=loss["candidate_delta"],
                         control_loss_delta_mean=loss["control_mean"], control_loss_delta_std=loss["control_std"],
                         z_loss=loss["z"], z_top1=top1["z"], upper_bound_top1_delta=top1["upper_bound_delta"])
            artifacts[name] = out["candidate"]["result"]
        per.append(entry)
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _run_composition(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts, notes = [], {}, []
    for name in names:
        out = ctx.recipe(name)
        prev = out["screen"]["previous_token_circuit"]
        if "composition" not in out:
            per.append({"model": name, "heads": ""})
            continue
        s = out["composition"]["summary"]
        loss, top1 = s["metrics"]["loss"], s["metrics"]["top1"]
        kind = out["composition"]["result"]["control_sets"]["kind"]
        per.append({"model": name, "heads": ",".join(prev), "control_kind": kind, "n_controls": s["n_controls"],
                    "loss_delta": loss["candidate_delta"], "z_loss": loss["z"], "loss_rank": loss["rank"],
                    "loss_p": loss["p"], "clean_top1": top1["clean"], "top1_after": top1["clean"] + top1["candidate_delta"],
                    "z_top1": top1["z"]})
        artifacts[name] = out["composition"]["result"]
        if out.get("composition_note"):
            notes.append(f"{name}: {out['composition_note']}")
    measured: dict = {"per_model": per}
    if not any(x["heads"] for x in per):
        measured["undefined"] = "the screen found no previous-token circuit (membership threshold) in any seed"
    return Measurement(measured, artifacts, tuple(names), tuple(notes))


def _run_timing(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        traj = ctx.trajectories(name)
        timings = traj.timing(margin=ctx.margin)
        # how specific the signal is: other heads whose PR also rises before the circuit's first crossing
        crossings = [t.crossing.index for t in timings if t.crossing.index is not None]
        n_layers, n_heads = traj.shape
        others = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in traj.final_circuit]
        early = [t for t in traj.timing(others, ctx.margin)
                 if crossings and t.rise.index is not None and t.rise.index < min(crossings)]
        per.append({"model": name, "circuit": str(traj.final_circuit), "margin": ctx.margin,
                    "threshold": traj.induction_threshold, "heads": [t.to_json() for t in timings],
                    "other_heads": len(others), "other_heads_rising_before_first_crossing": len(early)})
        artifacts[name] = traj.to_json()
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _run_identifiable(ctx: Context, names: list[str]) -> Measurement:
    per, artifacts = [], {}
    for name in names:
        traj = ctx.trajectories(name)
        ident = traj.identification()
        tokens = np.asarray(traj.tokens, dtype=np.float64)
        positive = tokens[tokens > 0]
        # context, not part of the criterion: from when the recipe's circuit already contains the final one
        final = set(ident.final_circuit)
        superset = next((i for i, c in enumerate(traj.circuits) if final and final <= set(c)), None)
        per.append({"model": name, "final_circuit": str(ident.final_circuit), "first_fraction": ident.first_fraction,
                    "stable_fraction": ident.stable_fraction, "first_tokens": ident.first.tokens,
                    "final_tokens": float(tokens[-1]),
                    "resolution": float(positive[0] / tokens[-1]) if positive.size and tokens[-1] > 0 else None,
                    "superset_fraction": None if superset is None or tokens[-1] <= 0 else float(tokens[superset] / tokens[-1]),
                    "superset_size": None if superset is None else len(traj.circuits[superset])})
        artifacts[name] = ident.to_json()
    return Measurement({"per_model": per}, artifacts, tuple(names))


def _run_seed(ctx: Context, names: list[str]) -> Measurement:
    from core.pipelines.dynamics import cross_seed_matrix

    circuits = {n: ctx.trajectories(n).final_circuit for n in names}
    ctx.say(f"cross-seed ablation: {len(names)} x {len(names)} cells, {ctx.n_controls} matched-random controls each")
    matrix = cross_seed_matrix([ctx.ref(n) for n in names], ctx.spec, circuits, ctx.n_controls, ctx.control_seed,
                               device=ctx.device, store_dir=ctx.out / "measurements" / "cross-seed", force=ctx.force,
                               progress=lambda done, total, what: ctx.say(f"  cell {done}/{total}: {what}"))
    spec = matrix.specificity("loss")
    measured = {"n_models": len(names), **{k: v for k, v in spec.items() if k != "metric"},
                "circuits": dict(zip(matrix.models, matrix.circuits))}
    notes = tuple(f"{matrix.models[a]} in {matrix.models[b]}: {matrix.reasons[a][b]}"
                  for a in range(len(names)) for b in range(len(names)) if matrix.reasons[a][b])
    return Measurement(measured, {"matrix": matrix.to_json()}, tuple(names), notes)


def _run_shift(ctx: Context, names: list[str]) -> Measurement:
    from core.pipelines.dynamics import data_shift_jaccard

    pairs, artifacts = [], {}
    for base, shifted in _shift_pairs(ctx.preset):
        shift = data_shift_jaccard(ctx.trajectories(base), ctx.trajectories(shifted))
        pairs.append({"base": base, "shifted": shifted, "jaccard": shift.jaccard, "base_circuit": str(shift.base_circuit),
                      "shifted_circuit": str(shift.shifted_circuit)})
        artifacts[f"{base}>{shifted}"] = shift.to_json()
    return Measurement({"pairs": pairs}, artifacts, tuple(names))


def _run_form_function(ctx: Context, names: list[str]) -> Measurement:
    from core.pipelines.dynamics import FORM_FUNCTION_LABELS, FormFunction, form_vs_function
    from core.workspace import atomic_write_json

    counts = {label: 0 for label in FORM_FUNCTION_LABELS}
    artifacts, per, n_checkpoints, notes = {}, [], 0, []
    for name in names:
        traj = ctx.trajectories(name)
        circuit = traj.final_circuit
        if len(circuit) == 0:
            notes.append(f"{name}: no final circuit to follow")
            continue
        # one stored result per model, so a long paper-preset run resumes between models
        path = ctx.out / "measurements" / "form-function" / f"{name}.json"
        key = {**ctx.settings(), "version": MEASUREMENT_VERSION, "model": model_key(name), "circuit": str(circuit)}
        stored = None if ctx.force else _load_stored(path, key)
        if stored is not None:
            ff = FormFunction.from_json(stored["result"])
        else:
            ctx.say(f"form vs function on {name}: closure of {circuit} at {len(traj.revisions)} checkpoints")
            ff = form_vs_function(ctx.ref(name), circuit, ctx.spec, traj, ctx.closure_controls, ctx.control_seed,
                                  device=ctx.device)
            atomic_write_json(path, {"settings": key, "result": ff.to_json()})
        for label, n in ff.counts().items():
            counts[label] += n
        n_checkpoints += len(ff.revisions)
        per.append({"model": name, "circuit": str(circuit), "counts": ff.counts(),
                    "function_without_form": [r for r, l in zip(ff.revisions, ff.labels) if l == "function without form"],
                    "form_without_function": [r for r, l in zip(ff.revisions, ff.labels) if l == "form without function"]})
        artifacts[name] = ff.to_json()
    measured: dict = {"counts": counts, "n_checkpoints": n_checkpoints, "models": [p["model"] for p in per], "per_model": per}
    if not per:
        measured["undefined"] = "no induction seed has a final circuit to follow"
    return Measurement(measured, artifacts, tuple(names), tuple(notes))


def _coactivation():
    """core.pipelines.coactivation when it is part of this HeadLab, else None."""
    if importlib.util.find_spec("core.pipelines.coactivation") is None:
        return None
    import core.pipelines.coactivation as module

    return module


def _synthetic_split(closure: Any, split: str = "all") -> Any:
    """The closure split the reference judges a synthetic probe by: same-layer ("matched") controls,
    any-layer ones when no same-layer control set exists."""
    return closure.split("matched", split) or closure.split("any-layer", split)


def _closure_entry(name: str, report: Any, split: str) -> dict:
    chosen = _synthetic_split(report.closure, split)
    entry = {"model": name, "candidate": str(report.candidate), "k": report.proposal.k, "kind": chosen.kind,
             "split": split, "n_examples": chosen.n_examples, "verdict": chosen.verdicts["paper"].label,
             "verdict_reference": chosen.verdicts["reference"].label,
             "skipped_kinds": dict(report.closure.skipped)}
    for metric in ("loss", "top1", "top5", "target_logit"):
        entry[f"delta_{metric}"] = chosen.stats[metric]["candidate_delta"]
        entry[f"z_{metric}"] = chosen.z(metric)
    return entry


def _run_dense_closure(ctx: Context, names: list[str]) -> Measurement:
    module = _coactivation_module()
    per, artifacts, notes = [], {}, []
    for name in names:
        ctx.say(f"co-activation communities of {name} and the candidate's closure test")
        report = module.coactivation(ctx.ref(name), None, ctx.spec, run_closure=True, n_controls=ctx.closure_controls,
                                     control_seed=ctx.control_seed, device=ctx.device)
        per.append(_closure_entry(name, report, "all"))
        artifacts[name] = report.summary()
        notes += [f"{name}: {note}" for note in report.notes]
    return Measurement({"per_model": per}, artifacts, tuple(names), tuple(notes))


def _run_moe_closure(ctx: Context, names: list[str]) -> Measurement:
    module = _coactivation_module()
    per, artifacts, notes = [], {}, []
    for name in names:
        ctx.say(f"route-conditional co-activation of {name}, its null, and closure on the discovery stratum")
        report = module.coactivation(ctx.ref(name), None, ctx.spec, route_conditional=True, run_closure=True,
                                     n_controls=ctx.closure_controls, control_seed=ctx.control_seed, device=ctx.device)
        entry = _closure_entry(name, report, "on")
        entry.update(null_z=report.route.null.z_max, max_ari=report.route.statistic.max_ari,
                     null_mean=report.route.null.null_max_mean, null_std=report.route.null.null_max_std,
                     discovery_stratum=report.route.discovery_stratum, strata_sizes=list(report.route.sizes))
        per.append(entry)
        artifacts[name] = report.summary()
        notes += [f"{name}: {note}" for note in report.notes]
    return Measurement({"per_model": per}, artifacts, tuple(names), tuple(notes))


def _coactivation_module():
    module = _coactivation()
    if module is None or not hasattr(module, "coactivation"):
        raise NotRun("co-activation pipeline unavailable (core/coactivation.py is not in this version of HeadLab)")
    return module


def _attribution_tasks(ctx: Context, tasks: Sequence[str]) -> dict:
    """{task: (summary, results)} for the tasks the preset has models for."""
    return {task: ctx.attribution(task) for task in tasks if preset_models(ctx.preset, task)}


def _run_rho_reverse(ctx: Context, names: list[str]) -> Measurement:
    summary, results = ctx.attribution("reverse")
    measured = {"task": "reverse", "rhos": list(summary.rhos), "rho_mean": summary.rho_mean, "rho_std": summary.rho_std,
                "n": summary.n_models, "skipped": [list(s) for s in summary.skipped]}
    return Measurement(measured, {"summaries": {"reverse": summary.to_json()},
                                  "results": [r.to_json() for r in results[:1]]}, summary.models, _skip_notes(summary))


def _skip_notes(summary) -> tuple[str, ...]:
    return tuple(f"{name} skipped: {why}" for name, why in summary.skipped)


def _run_rho_sort(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    rev, srt = by_task["reverse"][0], by_task["sort"][0]
    measured = {"reverse_rho_mean": rev.rho_mean, "sort_rho_mean": srt.rho_mean, "n_reverse": rev.n_models,
                "n_sort": srt.n_models, "sort_rhos": list(srt.rhos), "reverse_rhos": list(rev.rhos)}
    return Measurement(measured, {"summaries": {t: s.to_json() for t, (s, _) in by_task.items()}},
                       rev.models + srt.models, _skip_notes(rev) + _skip_notes(srt))


def _run_spread(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    rhos = [r for summary, _ in by_task.values() for r in summary.rhos if r is not None]
    measured = {"rho_min": min(rhos) if rhos else None, "rho_max": max(rhos) if rhos else None, "n": len(rhos),
                "rhos": {t: list(s.rhos) for t, (s, _) in by_task.items()}}
    if not rhos:
        measured["undefined"] = "rho is undefined for every analysed model"
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    return Measurement(measured, {"summaries": {t: s.to_json() for t, (s, _) in by_task.items()}}, models)


def _run_layers(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    heroes: dict[str, int] = {}
    bloats: dict[str, int] = {}
    n = 0
    for summary, _ in by_task.values():
        n += summary.n_models
        for row in summary.per_layer:
            heroes[str(row["layer"])] = heroes.get(str(row["layer"]), 0) + int(row["heroes"])
            bloats[str(row["layer"])] = bloats.get(str(row["layer"]), 0) + int(row["bloats"])
    measured = {"heroes_per_layer": heroes, "bloats_per_layer": bloats, "n": n, "tasks": sorted(by_task)}
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    first = next(iter(by_task.values()))[1][:1]
    return Measurement(measured, {"per_layer": [{"layer": int(k), "heroes": heroes[k], "bloats": bloats.get(k, 0)}
                                                for k in sorted(heroes, key=int)],
                                  "results": [r.to_json() for r in first]}, models)


def _run_l3h3(ctx: Context, names: list[str]) -> Measurement:
    summary, _ = ctx.attribution("sort")
    counts = summary.counts("hero")
    return Measurement({"hero_count": counts.get("L3H3", 0), "n": summary.n_models, "hero_counts": counts},
                       {"summaries": {"sort": summary.to_json()}}, summary.models, _skip_notes(summary))


def _run_l1_bloats(ctx: Context, names: list[str]) -> Measurement:
    summary, _ = ctx.attribution("sort")
    counts = summary.counts("bloat")
    return Measurement({"bloat_counts": {c: counts.get(c, 0) for c in ("L1H1", "L1H3")}, "n": summary.n_models,
                        "all_bloat_counts": counts}, {"summaries": {"sort": summary.to_json()}}, summary.models,
                       _skip_notes(summary))


def _run_superadditive(ctx: Context, names: list[str]) -> Measurement:
    by_task = _attribution_tasks(ctx, ("reverse", "sort"))
    parts = [r.joint_bloats for _, results in by_task.values() for r in results]
    defined = [p for p in parts if p.ratio_to_sum is not None]
    singles = [d for p in parts for d in p.single_damages]
    measured = {"n_models": len(parts), "n_with_ratio": len(defined),
                "ratio_to_sum_mean": float(np.mean([p.ratio_to_sum for p in defined])) if defined else None,
                "ratio_to_mean_mean": float(np.mean([p.ratio_to_mean for p in defined])) if defined else None,
                "joint_damage_mean": float(np.mean([p.joint_damage for p in defined])) if defined else None,
                "mean_single_damage": float(np.mean(singles)) if singles else None,
                "reasons": sorted({p.reason for p in parts if p.reason})}
    if not defined:
        measured["undefined"] = ("the joint/sum ratio is undefined for every model (" + "; ".join(measured["reasons"])
                                 + ")" if measured["reasons"] else "no model was analysed")
    models = tuple(m for summary, _ in by_task.values() for m in summary.models)
    return Measurement(measured, {"joints": [p.to_json() for p in parts]}, models)


def _run_hero_cost(ctx: Context, names: list[str]) -> Measurement:
    summary, results = ctx.attribution("reverse")
    damages = [d for r in results for d in r.joint_heroes.single_damages]
    measured = {"n_models": len(results), "n_heroes": len(damages), "damages": damages,
                "mean": float(np.mean(damages)) if damages else None,
                "std": float(np.std(damages, ddof=0)) if damages else None}
    if not damages:
        measured["undefined"] = "no reversal model has a hidden hero"
    return Measurement(measured, {"results": [r.to_json() for r in results[:1]]}, summary.models, _skip_notes(summary))


RUNNERS: dict[str, Callable[[Context, list[str]], Measurement]] = {
    "spc-causal": _run_causal, "spc-seed-specific": _run_seed, "spc-timing": _run_timing,
    "spc-identifiable": _run_identifiable, "spc-data-shift": _run_shift, "spc-composition": _run_composition,
    "cvc-dense-closure": _run_dense_closure, "cvc-moe-wrong-direction": _run_moe_closure,
    "cvc-form-function": _run_form_function,
    "hhg-rho-reverse": _run_rho_reverse, "hhg-rho-sort": _run_rho_sort, "hhg-rho-spread": _run_spread,
    "hhg-layers": _run_layers, "hhg-l3h3-hero": _run_l3h3, "hhg-l1-bloats": _run_l1_bloats,
    "hhg-superadditive": _run_superadditive, "hhg-hero-cost": _run_hero_cost,
}


# ---------------------------------------------------------------------------------------------
# figures of each claim, from its stored measurement


def _figures(claim_id: str, measured: dict, artifacts: dict) -> list:
    from core.figures import dynamics as fd

    if claim_id in ("spc-causal", "spc-composition") and artifacts:
        from core.ablation.engine import AblationResult
        from core.figures.bundle import ablation_strip

        name = next(iter(artifacts))
        result = AblationResult.from_json(artifacts[name])
        bundle = ablation_strip(result, name, str(result.provenance.get("revision", "")))
        return [replace(bundle, caption=f"{name}: " + bundle.caption)]
    if claim_id == "spc-timing" and artifacts:
        from core.pipelines.dynamics import Trajectories

        name = next(iter(artifacts))
        margin = measured["per_model"][0]["margin"]
        return [fd.timing_figure(Trajectories.from_json(artifacts[name]), margin=margin)]
    if claim_id == "spc-identifiable" and artifacts:
        from core.pipelines.dynamics import Identification

        return [fd.identification_figure([(name, Identification.from_json(data)) for name, data in artifacts.items()])]
    if claim_id == "spc-seed-specific":
        from core.pipelines.dynamics import CrossSeedMatrix

        return [fd.cross_seed_figure(CrossSeedMatrix.from_json(artifacts["matrix"]))]
    if claim_id == "spc-data-shift" and artifacts:
        from core.pipelines.dynamics import DataShift

        return [fd.data_shift_figure(DataShift.from_json(data)) for data in artifacts.values()]
    if claim_id in ("cvc-dense-closure", "cvc-moe-wrong-direction") and artifacts:
        name = next(iter(artifacts))
        return [fd.closure_splits_figure(name, artifacts[name])]
    if claim_id == "cvc-form-function" and artifacts:
        from core.pipelines.dynamics import FormFunction

        return [fd.form_function_figure(FormFunction.from_json(next(iter(artifacts.values()))))]
    if claim_id in ("hhg-rho-reverse", "hhg-hero-cost") and artifacts.get("results"):
        from core.pipelines.attribution import AttributionResult

        return [fd.attribution_ranks_figure(AttributionResult.from_json(artifacts["results"][0]))]
    if claim_id in ("hhg-rho-sort", "hhg-rho-spread") and artifacts.get("summaries"):
        rhos = {task: s["rhos"] for task, s in artifacts["summaries"].items()}
        return [fd.rho_figure(rhos, {"reverse": 0.72, "sort": 0.27})]
    if claim_id == "hhg-layers" and artifacts.get("per_layer"):
        return [fd.attribution_layers_figure(artifacts["per_layer"], ", ".join(measured["tasks"]))]
    return []


# ---------------------------------------------------------------------------------------------
# running claims, resumably


def _store_path(out: Path, claim_id: str) -> Path:
    return out / "measurements" / f"{claim_id}.json"


def _load_stored(path: Path, settings: dict) -> Optional[dict]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # unreadable: measure again
    return data if data.get("settings") == settings else None


def run_claim(claim: Claim, ctx: Context, force: bool = False) -> tuple[Claim, list]:
    """Measure (or reuse) one claim and judge it; returns the claim with its result and its figure bundles."""
    from core.workspace import atomic_write_json

    if not claim.testable_on(ctx.preset):
        verdict = NEEDS_PAPER if ctx.preset != "paper" else f"{NOT_RUN}: the paper preset has no models for it"
        return replace(claim, verdict=verdict, measured=None, measured_text=verdict), []
    names = claim.uses(ctx.preset)
    started = time.perf_counter()
    try:
        _require_trained(names, ctx.preset)
        settings = {**ctx.settings(), "version": MEASUREMENT_VERSION, "models": [model_key(n) for n in names]}
        path = _store_path(ctx.out, claim.id)
        stored = None if (force or ctx.force) else _load_stored(path, settings)
        if stored is not None:
            measurement = Measurement(stored["measured"], stored["artifacts"], tuple(stored["models"]),
                                      tuple(stored.get("notes", ())))
            seconds, reused = stored.get("seconds"), True
        else:
            ctx.say(f"measuring {claim.id}")
            measurement = RUNNERS[claim.id](ctx, list(names))
            seconds, reused = round(time.perf_counter() - started, 2), False
            atomic_write_json(path, {"settings": settings, "measured": measurement.measured,
                                     "artifacts": measurement.artifacts, "models": list(measurement.models),
                                     "notes": list(measurement.notes), "seconds": seconds})
    except (NotRun, HeadLabError) as exc:  # a model not trained, or a problem on these models: said in the report
        verdict = f"{NOT_RUN}: {exc}"
        return replace(claim, verdict=verdict, measured=None, measured_text=verdict, settings=ctx.settings(),
                       seconds=round(time.perf_counter() - started, 2)), []
    measured = measurement.measured
    verdict = claim.judge(measured)
    text = verdict if measured.get("undefined") else claim.describe(measured)
    result = replace(claim, verdict=verdict, measured=measured, measured_text=text, models=measurement.models,
                     seeds={n: _seed_of(n) for n in measurement.models}, settings=settings, notes=measurement.notes,
                     seconds=seconds, reused=reused)
    return result, _figures(claim.id, measured, measurement.artifacts)


@dataclass(frozen=True)
class ReplicationReport:
    """A finished replicate run: its claims (with verdicts) and where the report was written."""

    target: str
    preset: str
    claims: tuple[Claim, ...]
    out: Path
    seconds: float
    settings: dict
    figure_note: str = ""
    files: tuple[str, ...] = ()

    def to_json(self) -> dict:
        from core.figures.bundle import package_versions

        return {"report": "HeadLab replication", "target": self.target, "preset": self.preset,
                "command": f"python -m core replicate {self.target} --preset {self.preset} --out {self.out}",
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "seconds": round(self.seconds, 2), "settings": self.settings,
                "figures": {"note": self.figure_note, "files": list(self.files)},
                "verdict_counts": _counts([c.verdict for c in self.claims]),
                "claims": [c.to_json() for c in self.claims], "versions": package_versions()}


def _counts(verdicts: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in verdicts:
        key = NOT_RUN if v.startswith(NOT_RUN) else v
        out[key] = out.get(key, 0) + 1
    return out


def replicate(target: str, preset: str = "quick", out: Optional[Path] = None, n_examples: int = 256, seq_len: int = 64,
              probe_seed: int = 42, n_controls: int = 20, closure_controls: int = 5, control_seed: int = 123,
              margin: float = DEFAULT_MARGIN, formats: Sequence[str] = ("png", "svg"), force: bool = False,
              device: str = "cpu", say: Callable[[str], None] = print) -> ReplicationReport:
    """Measure every claim of `target` on the preset's zoo and write the report under `out`."""
    from core.pipelines.recipe import probe_spec
    from core.workspace import reports_dir

    claims = claims_of(target)
    if preset not in PRESETS:
        raise HeadLabError(f"unknown preset {preset!r}; choose quick or paper.")
    if not float(margin) > 0:
        raise HeadLabError(f"the PR-rise margin must be positive, got {margin}.")
    out = Path(out) if out is not None else reports_dir() / f"replicate-{target}-{preset}"
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(target, preset, out, probe_spec("induction", n_examples, seq_len, probe_seed), n_controls,
                  closure_controls, control_seed, margin, device=device, say=say, force=force)
    started = time.perf_counter()
    results, bundles = [], {}
    for claim in claims:
        result, figs = run_claim(claim, ctx, force)
        say(f"{claim.id}: {result.verdict}")
        results.append(result)
        bundles[claim.id] = figs
    writer = FigureWriter(out / "figures", formats)
    final = []
    for claim in results:
        files = [f for bundle in bundles[claim.id] for f in writer.write(bundle, f"{claim.id}-{bundle.name}")]
        final.append(replace(claim, figures=tuple(files)))
    report = ReplicationReport(target, preset, tuple(final), out, time.perf_counter() - started, ctx.settings(),
                               writer.note, tuple(writer.files))
    write_report(report, writer)
    return report


# ---------------------------------------------------------------------------------------------
# the report: figures, Markdown, HTML, JSON


class FigureWriter:
    """Writes each figure as data (CSV, JSON with provenance), plotly JSON, and PNG/SVG when a browser
    is available; remembers why images are missing."""

    def __init__(self, folder: Path, formats: Sequence[str] = ("png", "svg")):
        from core.figures.bundle import IMAGE_FORMATS

        bad = [f for f in formats if f not in IMAGE_FORMATS]
        if bad:
            raise HeadLabError(f"unknown image format(s) {', '.join(bad)}; use some of {', '.join(IMAGE_FORMATS)}.")
        self.folder = Path(folder)
        self.formats = tuple(formats)
        self.images_ok = bool(self.formats)
        self.note = "" if self.formats else "no image formats were asked for."
        self.files: list[str] = []
        self.bundles: dict[str, Any] = {}  # stem -> FigureBundle (for the HTML)

    def write(self, bundle: Any, stem: str) -> list[str]:
        from core.figures.bundle import export_figure
        from core.workspace import atomic_write_bytes

        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / stem
        written = [p for p in export_figure(bundle.figure, path, bundle.rows, bundle.provenance, formats=())]
        plotly_path = self.folder / f"{stem}.plotly.json"
        atomic_write_bytes(plotly_path, bundle.figure.to_json().encode())
        written.append(plotly_path)
        if self.images_ok:
            for fmt in self.formats:
                try:
                    data = bundle.image_bytes(fmt)
                except HeadLabError as exc:
                    self.images_ok = False
                    self.note = f"PNG/SVG not written: {exc}"
                    break
                image = self.folder / f"{stem}.{fmt}"
                atomic_write_bytes(image, data)
                written.append(image)
        self.bundles[stem] = bundle
        rel = [str(p.relative_to(self.folder.parent)) for p in written]
        self.files += rel
        return rel


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _figure_stems(claim: Claim) -> list[str]:
    return sorted({Path(f).name.split(".")[0] for f in claim.figures if f.endswith(".plotly.json")})


def report_markdown(report: ReplicationReport, writer: Optional[FigureWriter] = None) -> str:
    """The report as Markdown; figure lines are `![caption](figures/<stem>.svg|png)` or a note."""
    lines = [f"# HeadLab replication report: {report.target} ({report.preset} preset)", "",
             f"Command: `python -m core replicate {report.target} --preset {report.preset} --out {report.out}`. "
             f"Wall time {report.seconds:.1f} s "
             f"({sum(c.reused for c in report.claims)} of {len(report.claims)} claims reused from a previous run). "
             "Every number is in `report.json`; each figure's data is in `figures/*.csv` and `figures/*.json`.", ""]
    probe = report.settings.get("probe_spec", {})
    if report.target == "attribution":
        a = report.settings.get("attribution", {})
        setup = (f"Attribution settings [HHG]: gradient variant {a.get('gradient_variant')}, {a.get('n_batches')} OOD "
                 f"batches of {a.get('batch_size')}, {a.get('ablation_mode')} ablation, {a.get('n_examples')} evaluation "
                 f"examples, seed {a.get('seed')}, rank-difference threshold {a.get('threshold')} ({a.get('rule')} rule); "
                 "components and layers are counted from 0.")
    else:
        setup = (f"Probe: synthetic induction batch, N = {probe.get('n_examples')}, T = {probe.get('seq_len')}, seed "
                 f"{probe.get('seed')}. Controls: {report.settings.get('n_controls')} matched-random draws per ablation"
                 + (f", {report.settings.get('closure_controls')} per closure test" if report.target == "closure" else "")
                 + f" (seed {report.settings.get('control_seed')}), zero ablation at hook_z.")
    lines += [setup + " Criteria were fixed in `core/replicate.py` before the run.", ""]
    excluded = report.settings.get("excluded_induction_seeds") or {}
    if excluded:
        listed = ", ".join(f"{name} (repeated-half loss {loss:g} nats)" for name, loss in excluded.items())
        lines += [f"Left out of every induction claim: {listed}. These seeds never learned induction (final "
                  "repeated-half loss at or above the zoo's 1.0-nat formation target), so they have no induction "
                  "circuit to test; the rule is fixed in `unformed_induction_seeds` before any run.", ""]
    if report.figure_note:
        lines += [f"Figures: {report.figure_note} Each figure is kept as plotly JSON (`figures/*.plotly.json`) and "
                  "drawn interactively in `report.html`.", ""]
    lines += ["| claim | paper | verdict | measured | published |", "|---|---|---|---|---|"]
    for c in report.claims:
        lines.append(f"| {c.id} | {c.paper} | **{_cell(c.verdict)}** | {_cell(c.measured_text)} | {_cell(c.published)} |")
    lines.append("")
    for c in report.claims:
        lines += [f"## {c.id}: {c.statement}", "",
                  f"- **Paper:** [{c.paper}]",
                  f"- **Pass criterion (fixed before running):** {c.criterion_text}",
                  f"- **Published:** {c.published}",
                  f"- **Measured:** {c.measured_text or '—'}",
                  f"- **Verdict:** **{c.verdict}**"]
        if c.models:
            seeds = ", ".join(f"{m} (seed {c.seeds.get(m)})" for m in c.models)
            lines.append(f"- **Models / seeds:** {seeds}")
        if c.seconds is not None:
            lines.append(f"- **Time:** {c.seconds:.1f} s" + (" (reused from a previous run)" if c.reused else ""))
        for note in c.notes:
            lines.append(f"- **Note:** {note}")
        lines.append("")
        for stem in _figure_stems(c):
            bundle = writer.bundles.get(stem) if writer else None
            caption = (bundle.caption if bundle is not None else stem).replace("[", "(").replace("]", ")")
            image = next((f for f in c.figures if Path(f).name.startswith(stem + ".") and f.endswith((".svg", ".png"))), None)
            if image:
                lines.append(f"![{caption}]({image})")
            else:
                lines.append(f"Figure `{stem}`: {caption} (image not written; plotly JSON `figures/{stem}.plotly.json`, "
                             f"data `figures/{stem}.csv`).")
            lines.append("")
    return "\n".join(lines)


_FIG_LINE = re.compile(r"^(?:!\[.*\]\((figures/[^)]+)\)|Figure `([^`]+)`: .*)$")


def report_html(markdown_text: str, writer: FigureWriter) -> str:
    """The Markdown rendered to one self-contained HTML page; figures inline (SVG, else interactive plotly)."""
    import plotly.io as pio
    from markdown_it import MarkdownIt

    figures: dict[str, str] = {}
    out_lines = []
    plotly_js_included = False
    for line in markdown_text.splitlines():
        match = _FIG_LINE.match(line)
        if not match:
            out_lines.append(line)
            continue
        stem = Path(match.group(1)).name.split(".")[0] if match.group(1) else match.group(2)
        token = f"HEADLABFIGURE{len(figures)}"
        bundle = writer.bundles.get(stem)
        svg = writer.folder / f"{stem}.svg"
        if svg.is_file():
            body = re.sub(r"^<\?xml[^>]*>\s*", "", svg.read_text())
        elif bundle is not None:
            body = pio.to_html(bundle.figure, full_html=False, include_plotlyjs=not plotly_js_included,
                               config={"displaylogo": False})
            plotly_js_included = True
        else:
            body = f"<p>figure {stem} is missing</p>"
        caption = "" if bundle is None else f"<figcaption>{_escape(bundle.caption)}</figcaption>"
        figures[token] = f"<figure>{body}{caption}</figure>"
        out_lines.append(token)
    html = MarkdownIt("commonmark").enable("table").render("\n".join(out_lines))
    for token, body in figures.items():
        html = html.replace(f"<p>{token}</p>", body)
    style = ("body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;font-size:13px}"
             "figure{margin:1em 0}figcaption{font-size:12px;color:#555}code{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>HeadLab replication report</title>"
            f"<style>{style}</style></head><body>{html}</body></html>")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_report(report: ReplicationReport, writer: FigureWriter) -> dict[str, Path]:
    """report.md, report.html and report.json under report.out, each written atomically."""
    from core.workspace import atomic_write_bytes, atomic_write_json

    markdown_text = report_markdown(report, writer)
    paths = {"markdown": report.out / "report.md", "html": report.out / "report.html", "json": report.out / "report.json"}
    atomic_write_bytes(paths["markdown"], markdown_text.encode())
    atomic_write_bytes(paths["html"], report_html(markdown_text, writer).encode())
    atomic_write_json(paths["json"], report.to_json())
    return paths


# ---------------------------------------------------------------------------------------------
# command line


def add_replicate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=TARGETS, help="which paper's claims: spectral [SPC], closure [CVC], attribution [HHG]")
    parser.add_argument("--preset", choices=PRESETS, default="quick",
                        help="zoo preset (quick: one seed per kind, CI-sized; paper: seeds, sorting, data shift)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default $HEADLAB_HOME/reports/replicate-<target>-<preset>); reruns resume there")
    parser.add_argument("--n", type=int, default=256, help="probe sequences N (default 256)")
    parser.add_argument("--seq-len", type=int, default=64, help="probe length T (default 64)")
    parser.add_argument("--seed", type=int, default=42, help="probe seed (default 42)")
    parser.add_argument("--controls", type=int, default=20, help="matched-random draws per ablation (default 20)")
    parser.add_argument("--closure-controls", type=int, default=5,
                        help="random controls per closure test over training (default 5, as the reference)")
    parser.add_argument("--control-seed", type=int, default=123, help="seed of the control draws (default 123)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"PR-rise margin above the running minimum, PR units (default {DEFAULT_MARGIN})")
    parser.add_argument("--formats", default="png,svg", help="figure image formats (default png,svg; '' for none)")
    parser.add_argument("--force", action="store_true", help="measure every claim again instead of reusing stored ones")
    parser.add_argument("--device", default="cpu")


def cli_replicate(args: argparse.Namespace) -> dict:
    formats = tuple(f.strip().lower() for f in str(args.formats).split(",") if f.strip())
    report = replicate(args.target, args.preset, args.out, args.n, args.seq_len, args.seed, args.controls,
                       args.closure_controls, args.control_seed, args.margin, formats, args.force, args.device,
                       say=lambda text: print(f"... {text}"))
    width = max(len(c.id) for c in report.claims)
    for c in report.claims:
        print(f"{c.id:{width}s}  {c.verdict}")
    if report.figure_note:
        print(f"note: {report.figure_note}")
    print(f"report: {report.out / 'report.md'} (and report.html, report.json); {report.seconds:.1f} s")
    return {"target": report.target, "preset": report.preset, "out": str(report.out), "seconds": report.seconds,
            "claims": [{"id": c.id, "verdict": c.verdict, "measured": c.measured_text} for c in report.claims]}
