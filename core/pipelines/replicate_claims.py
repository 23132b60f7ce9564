"""The papers' claims that `python -m core replicate` tests, written down before anything runs.

METHODS.md's last section lists the claims worth reproducing on small models. Each is a `Claim`
here: its statement, its pass criterion (as text and as a function of the measured values), and
the published figure. core/pipelines/replicate.py measures them on the zoo; the report writer
(core/cli/replicate_report.py) shows them.

Verdicts: "held", "did not hold", "needs the paper preset" (the quick preset has one seed per
model kind, no sorting models, no data-shift model and no long-trained induction seed), or "not run: <reason>" (a model not
trained yet, a statistic that is undefined on these models, a pipeline not in this version).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np

from core.choices import REPLICATE_PRESETS as PRESETS, REPLICATE_TARGETS as TARGETS
from core.errors import HeadLabError
from core.model.refs import read_manifest
from core.stats.dynamics import IDENTIFIABLE_BAND, Z_THRESHOLD
from core.zoo.evaluate import INDUCTION_LOSS_TARGET
from core.zoo.presets import ZOO_PRESETS, preset_models

# The [HHG] claims are measured under each mean-ablation variant, side by side (issue 18): the paper's one
# mean over examples and positions, HeadLab's earlier per-position mean, and the reference code's post-W_O
# slice overwrite (not a head ablation; it reproduces the published numbers).
ATTRIBUTION_VARIANTS = ("mean", "mean-per-position", "reference-slice")
HELD = "held"
NOT_HELD = "did not hold"
NEEDS_PAPER = "needs the paper preset"
NOT_RUN = "not run"

# Thresholds of the pass criteria (fixed here, before anything runs; quoted in each criterion's text)
CIRCUIT_MAX_FRACTION = 0.25  # "small": at most a quarter of the model's heads
CONTROL_TOP1_TOLERANCE = 0.10  # "controls barely hurt": mean control top-1 loss <= 10% of clean top-1
DESTROYED_FRACTION = 0.5  # "destroys induction": top-1 after ablation <= half the clean top-1
RHO_STRONG = 0.5  # "agree" on reversal: mean Spearman rho >= 0.5 (published 0.72)
# [SPC] identifiability can be tested only on a model whose induction forms (repeated-half loss first below
# INDUCTION_LOSS_TARGET) within the first few percent of its tokens: a circuit that forms at a quarter of
# training cannot be returned at 2% of it, by construction (issue 18 item 4)
IDENTIFIABLE_FORMATION_MAX = 0.05
HERO_COST = (0.364, 0.228)  # published mean +- sd of a hero's single ablation damage on reversal


# ---------------------------------------------------------------------------------------------
# zoo models per preset


def _shift_pairs(preset: str) -> list[tuple[str, str]]:
    return [(t.init_from, n) for n, _, t in ZOO_PRESETS[preset] if n in preset_models(preset, "shifted")]


def unformed_induction_seeds(preset: str) -> dict[str, float]:
    """Finished induction seeds of `preset` that never learned induction, with their final
    repeated-half loss: at or above the zoo's own formation target (core.zoo.evaluate.INDUCTION_LOSS_TARGET,
    1.0 nats). Claims about induction circuits cannot be tested on a model without one, so these
    seeds are left out of every induction claim and listed in the report (rule fixed before any run)."""
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


def _can_test_identifiability(preset: str) -> bool:
    """Whether `preset` has an induction model whose pure-repeat warm-up (where induction forms) ends
    within the first IDENTIFIABLE_FORMATION_MAX of its training: only such a model can show a circuit
    identified from 0.3-2% of the tokens. Decided from the recipes, before anything trains; the
    measurement then checks each model's actual formation step."""
    for name, _, train in ZOO_PRESETS[preset]:
        if name in preset_models(preset, "induction") and train.fixed_warmup_end <= IDENTIFIABLE_FORMATION_MAX * train.steps:
            return True
    return False


def _uses_distinct_seeds(preset: str) -> list[str]:
    """The formed induction seeds, one model per training seed: induction-neox-long continues seed 0's
    run (the same initial weights and data order), so a cross-seed claim leaves it out."""
    seen, out = set(), []
    trains = {name: train for name, _, train in ZOO_PRESETS[preset]}
    for name in _uses_induction(preset):
        if trains[name].seed not in seen:
            seen.add(trains[name].seed)
            out.append(name)
    return out


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
    variant: str = ""  # the [HHG] mean-ablation variant it was measured under ("" where a target has one setting)

    @property
    def key(self) -> str:
        """Its id with the variant it was measured under: unique within a report, and names its figures."""
        return f"{self.id}-{self.variant}" if self.variant else self.id

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
                "seconds": self.seconds, "reused": self.reused, "variant": self.variant}

    @classmethod
    def from_json(cls, data: dict) -> "Claim":
        """A claim from a report, with its criterion re-attached from the registry (by id)."""
        if data["id"] not in CLAIMS:
            raise HeadLabError(f"the report names an unknown claim {data['id']!r}; it was written by another HeadLab version.")
        return replace(CLAIMS[data["id"]], verdict=data["verdict"], measured=data.get("measured"),
                       measured_text=data.get("measured_text", ""), models=tuple(data.get("models", ())),
                       seeds=dict(data.get("seeds", {})), settings=dict(data.get("settings", {})),
                       figures=tuple(data.get("figures", ())), notes=tuple(data.get("notes", ())),
                       seconds=data.get("seconds"), reused=bool(data.get("reused", False)),
                       variant=str(data.get("variant", "")))


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
    testing = [x for x in m["per_model"] if x.get("can_test", True)]
    return bool(testing) and all(x["first_fraction"] is not None and x["first_fraction"] <= IDENTIFIABLE_BAND[1]
                                 for x in testing)


def _ident_text(m: dict) -> str:
    def one(x: dict) -> str:
        text = (f"{x['model']}: final circuit first returned at {_pct(x['first_fraction'])} of training tokens "
                f"(stable from {_pct(x['stable_fraction'])}; a superset of it, {x.get('superset_size')} heads, from "
                f"{_pct(x.get('superset_fraction'))}); earliest checkpoint at {_pct(x['resolution'])}")
        if "formation_fraction" not in x:
            return text
        if x["can_test"]:
            return f"{text}; induction forms at {_pct(x['formation_fraction'])}: tests the claim"
        return f"{text}; cannot test it: induction forms only at {_pct(x['formation_fraction'])} of training"
    return "; ".join(one(x) for x in m["per_model"])


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
              _uses_distinct_seeds, lambda preset: len(preset_models(preset, "induction")) >= 2),
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
              f"In every induction seed that can test it (induction forms, repeated-half loss first below "
              f"{INDUCTION_LOSS_TARGET:g} nat, within the first {IDENTIFIABLE_FORMATION_MAX:.0%} of its training tokens; "
              f"at least one such seed), the earliest checkpoint at which the recipe run on checkpoints up to t returns "
              f"the final circuit (Jaccard 1) lies at or below {IDENTIFIABLE_BAND[1]:.0%} of the training tokens.",
              _ident_ok, "the final circuit is already returned from 0.3-2% of the training tokens.", _ident_text,
              _uses_induction, _can_test_identifiability),
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
